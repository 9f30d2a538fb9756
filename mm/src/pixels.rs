//! 8-bit RGB → the model's float tensor in one pass: rescale and normalise through a per-channel
//! lookup table, written straight to each value's place in the output layout.

/// `value[c][v]` = what HF's `rescale` then `normalize` make of channel `c`'s byte `v`: the
/// rescale in f64 cast to f32 (`image_transforms.rescale`), the normalisation in f32
/// (`(x - mean) / std` with both cast to the image's f32 dtype), so the floats are HF's bit for bit.
#[derive(Debug, Clone)]
pub(crate) struct PixelMap {
    value: [[f32; 256]; 3],
}

impl PixelMap {
    pub(crate) fn new(rescale: Option<f64>, normalize: Option<([f64; 3], [f64; 3])>) -> Self {
        let mut value = [[0f32; 256]; 3];
        for (c, table) in value.iter_mut().enumerate() {
            for (v, out) in table.iter_mut().enumerate() {
                let mut x = match rescale {
                    Some(factor) => (v as f64 * factor) as f32,
                    None => v as f32,
                };
                if let Some((mean, std)) = normalize {
                    x = (x - mean[c] as f32) / std[c] as f32;
                }
                *out = x;
            }
        }
        PixelMap { value }
    }
}

/// Where each pixel's values go in the flat output: pixel (y, x) channel c copy t lands at
/// `row_offset[y] + col_offset[x] + c * channel_stride + t * copy_stride`. Both supported layouts
/// are separable in y and x this way (channels-first; Qwen2-VL's merged patches).
pub(crate) struct Layout {
    pub row_offset: Vec<usize>,
    pub col_offset: Vec<usize>,
    pub channel_stride: usize,
    pub copies: usize,
    pub copy_stride: usize,
    pub len: usize,
}

impl Layout {
    /// `[3, height, width]`.
    pub(crate) fn channels_first(width: usize, height: usize) -> Self {
        Layout {
            row_offset: (0..height).map(|y| y * width).collect(),
            col_offset: (0..width).collect(),
            channel_stride: width * height,
            copies: 1,
            copy_stride: 0,
            len: 3 * width * height,
        }
    }

    /// Writes `rgb` (`width`×`height` packed RGB bytes matching the layout's size) through `map`.
    pub(crate) fn fill(&self, rgb: &[u8], map: &PixelMap) -> Vec<f32> {
        let mut out = vec![0f32; self.len];
        let width = self.col_offset.len();
        for (&row_at, line) in self.row_offset.iter().zip(rgb.chunks_exact(width * 3)) {
            for (&col_at, px) in self.col_offset.iter().zip(line.chunks_exact(3)) {
                let at = row_at + col_at;
                for (c, (table, &byte)) in map.value.iter().zip(px).enumerate() {
                    let v = table[usize::from(byte)];
                    let base = at + c * self.channel_stride;
                    for t in 0..self.copies {
                        out[base + t * self.copy_stride] = v;
                    }
                }
            }
        }
        out
    }
}

/// Qwen2-VL's `[grid_h * grid_w, 3 * temporal * patch * patch]` (one frame, `grid_t` = 1): HF
/// reshapes the `[temporal, 3, H, W]` stack to `(t, tp, c, gh/m, m, ph, gw/m, m, pw)` and permutes
/// to `(t, gh/m, gw/m, m, m, c, tp, ph, pw)`. So rows walk merge blocks in raster order and, inside
/// a block, its `m`×`m` patches in raster order; a row holds channel, then the temporal copy, then
/// the patch's pixels in raster order.
pub(crate) fn merged_patches(
    width: usize,
    height: usize,
    patch: usize,
    merge: usize,
    temporal: usize,
) -> Layout {
    let row_len = 3 * temporal * patch * patch;
    let blocks_across = width / patch / merge;
    Layout {
        row_offset: (0..height)
            .map(|y| {
                let (grid_y, in_patch) = (y / patch, y % patch);
                let (block, in_block) = (grid_y / merge, grid_y % merge);
                (block * blocks_across * merge * merge + in_block * merge) * row_len
                    + in_patch * patch
            })
            .collect(),
        col_offset: (0..width)
            .map(|x| {
                let (grid_x, in_patch) = (x / patch, x % patch);
                let (block, in_block) = (grid_x / merge, grid_x % merge);
                (block * merge * merge + in_block) * row_len + in_patch
            })
            .collect(),
        channel_stride: temporal * patch * patch,
        copies: temporal,
        copy_stride: patch * patch,
        len: 3 * width * height * temporal,
    }
}
