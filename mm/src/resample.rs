//! Pillow's `Image.resize` for 8-bit RGB, reproduced to the bit: Hugging Face's slow image
//! processors resize through PIL, so the tensors the model was trained on carry PIL's exact
//! rounding. Same filter (bicubic a = -0.5, support widened by the scale factor on downscale:
//! antialiasing), same taps (`precompute_coeffs`), same 22-bit fixed-point weights
//! (`normalize_coeffs_8bpc`), same order (horizontal pass into an 8-bit image, then vertical),
//! same skipped pass when an axis keeps its size. Source: Pillow `src/libImaging/Resample.c`.
//!
//! Only an output window is computed (the centre crop that follows a CLIP resize), which gives the
//! same pixels as resizing everything and cropping; window pixels outside the resized image are
//! 0, as HF's `center_crop` pads.

use image::RgbImage;

/// PIL's resampling filters this crate implements (HF `resample`: 2 = bilinear, 3 = bicubic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filter {
    Bilinear,
    Bicubic,
}

impl Filter {
    pub(crate) fn from_pil(code: u64) -> Option<Filter> {
        match code {
            2 => Some(Filter::Bilinear),
            3 => Some(Filter::Bicubic),
            _ => None,
        }
    }

    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Filter::Bilinear => {
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Filter::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

const PRECISION_BITS: u32 = 32 - 8 - 2;
const HALF: i32 = 1 << (PRECISION_BITS - 1);

#[inline]
fn clip8(acc: i32) -> u8 {
    (acc >> PRECISION_BITS).clamp(0, 255) as u8
}

/// The taps of one axis for a run of output coordinates: output `i` reads `len[i]` inputs from
/// `first[i]` with weights `weights[i * ksize ..]`.
struct AxisTaps {
    first: Vec<usize>,
    len: Vec<usize>,
    ksize: usize,
    weights: Vec<i32>,
}

impl AxisTaps {
    fn new(
        in_size: usize,
        out_size: usize,
        outputs: std::ops::Range<usize>,
        filter: Filter,
    ) -> Self {
        let scale = in_size as f64 / out_size as f64;
        let filter_scale = scale.max(1.0);
        let support = filter.support() * filter_scale;
        let ksize = support.ceil() as usize * 2 + 1;
        let count = outputs.len();
        let mut taps = AxisTaps {
            first: Vec::with_capacity(count),
            len: Vec::with_capacity(count),
            ksize,
            weights: vec![0; count * ksize],
        };
        let mut raw = vec![0f64; ksize];
        for (slot, out) in outputs.enumerate() {
            let center = (out as f64 + 0.5) * scale;
            // Truncation toward zero, as C's (int) cast.
            let min = ((center - support + 0.5) as i64).max(0) as usize;
            let max = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let n = max.saturating_sub(min);
            let mut total = 0.0;
            for (x, w) in raw[..n].iter_mut().enumerate() {
                *w = filter.weight((x as f64 + min as f64 - center + 0.5) / filter_scale);
                total += *w;
            }
            let fixed = &mut taps.weights[slot * ksize..slot * ksize + n];
            for (k, &w) in fixed.iter_mut().zip(&raw[..n]) {
                let w = if total != 0.0 { w / total } else { w };
                let scaled = w * f64::from(1u32 << PRECISION_BITS);
                *k = if w < 0.0 {
                    (scaled - 0.5) as i32
                } else {
                    (scaled + 0.5) as i32
                };
            }
            taps.first.push(min);
            taps.len.push(n);
        }
        taps
    }

    fn weights(&self, slot: usize) -> &[i32] {
        &self.weights[slot * self.ksize..slot * self.ksize + self.len[slot]]
    }
}

/// Which part of the resized image to produce: `width`×`height` pixels starting at (`left`,
/// `top`) in resized coordinates (negative or overhanging: padded with 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub left: i64,
    pub top: i64,
    pub width: usize,
    pub height: usize,
}

impl Window {
    pub(crate) fn full(width: usize, height: usize) -> Self {
        Window {
            left: 0,
            top: 0,
            width,
            height,
        }
    }
}

/// Resizes `src` to `out_w`×`out_h` as PIL does and returns the `window` of the result as packed
/// RGB bytes (`window.width * window.height * 3`).
pub(crate) fn resize_window(
    src: &RgbImage,
    out_w: usize,
    out_h: usize,
    window: Window,
    filter: Filter,
) -> Vec<u8> {
    let (in_w, in_h) = (src.width() as usize, src.height() as usize);
    let mut out = vec![0u8; window.width * window.height * 3];
    // The part of the window inside the resized image; the rest stays 0 (padding).
    let clip = |start: i64, len: usize, size: usize| {
        let lo = start.clamp(0, size as i64) as usize;
        let hi = (start + len as i64).clamp(0, size as i64) as usize;
        lo..hi.max(lo)
    };
    let xs = clip(window.left, window.width, out_w);
    let ys = clip(window.top, window.height, out_h);
    if xs.is_empty() || ys.is_empty() {
        return out;
    }
    let out_x0 = (xs.start as i64 - window.left) as usize;
    let out_y0 = (ys.start as i64 - window.top) as usize;
    let nx = xs.len();
    let row_bytes = nx * 3;
    let out_stride = window.width * 3;

    let vertical = (out_h != in_h).then(|| AxisTaps::new(in_h, out_h, ys.clone(), filter));
    // Input rows the vertical pass reads (or copies, when the height is unchanged).
    let rows = match &vertical {
        Some(taps) => taps.first[0]..taps.first[ys.len() - 1] + taps.len[ys.len() - 1],
        None => ys.clone(),
    };

    // Horizontal pass over just those rows and the window's columns, into 8 bits as PIL does.
    let src_raw = src.as_raw();
    let horizontal_pass;
    let (rows_buf, rows_stride, rows_x0): (&[u8], usize, usize) = if out_w != in_w {
        let taps = AxisTaps::new(in_w, out_w, xs.clone(), filter);
        let mut buf = vec![0u8; rows.len() * row_bytes];
        for (dst, y) in buf.chunks_exact_mut(row_bytes).zip(rows.clone()) {
            let line = &src_raw[y * in_w * 3..(y + 1) * in_w * 3];
            for (slot, px) in dst.chunks_exact_mut(3).enumerate() {
                let start = taps.first[slot] * 3;
                let (mut r, mut g, mut b) = (HALF, HALF, HALF);
                for (k, tap) in taps.weights(slot).iter().zip(line[start..].chunks_exact(3)) {
                    r += i32::from(tap[0]) * k;
                    g += i32::from(tap[1]) * k;
                    b += i32::from(tap[2]) * k;
                }
                px[0] = clip8(r);
                px[1] = clip8(g);
                px[2] = clip8(b);
            }
        }
        horizontal_pass = buf;
        (&horizontal_pass[..], row_bytes, 0)
    } else {
        (&src_raw[rows.start * in_w * 3..], in_w * 3, xs.start * 3)
    };
    let row = |y: usize| {
        let at = (y - rows.start) * rows_stride + rows_x0;
        &rows_buf[at..at + row_bytes]
    };

    match &vertical {
        Some(taps) => {
            // Taps outer, pixels inner: the accumulation runs over contiguous bytes and
            // vectorises.
            let mut acc = vec![0i32; row_bytes];
            for (slot, oy) in (out_y0..out_y0 + ys.len()).enumerate() {
                acc.fill(HALF);
                for (i, &k) in taps.weights(slot).iter().enumerate() {
                    for (a, &v) in acc.iter_mut().zip(row(taps.first[slot] + i)) {
                        *a += i32::from(v) * k;
                    }
                }
                let dst = &mut out[oy * out_stride + out_x0 * 3..][..row_bytes];
                for (d, &a) in dst.iter_mut().zip(&acc) {
                    *d = clip8(a);
                }
            }
        }
        None => {
            for (oy, y) in (out_y0..).zip(ys.clone()) {
                out[oy * out_stride + out_x0 * 3..][..row_bytes].copy_from_slice(row(y));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{imageops, Rgb};

    fn resize(src: &RgbImage, w: usize, h: usize) -> Vec<u8> {
        resize_window(src, w, h, Window::full(w, h), Filter::Bicubic)
    }

    #[test]
    fn bicubic_halving_matches_the_hand_computed_antialiased_taps() {
        // 4×1 → 2×1: scale 2 widens the bicubic support to 4 input pixels. Output 0 is centred at
        // 1.0 and reads inputs 0..4 at distances (x - 0.5) / 2 = -0.25, 0.25, 0.75, 1.25:
        // weights 0.8671875, 0.8671875, 0.2265625, -0.0703125 (sum 1.890625), normalised.
        let src = RgbImage::from_fn(4, 1, |x, _| Rgb([[0, 100, 200, 255][x as usize]; 3]));
        let raw = [0.8671875, 0.8671875, 0.2265625, -0.0703125];
        let total: f64 = raw.iter().sum();
        let exact: f64 = [0.0, 100.0, 200.0, 255.0]
            .iter()
            .zip(raw)
            .map(|(v, w)| v * w / total)
            .sum();
        let out = resize(&src, 2, 1);
        assert_eq!(out[0], exact.round() as u8, "exact {exact}");
        assert_eq!(out[0], 60);
    }

    #[test]
    fn a_solid_colour_survives_any_resize_exactly() {
        let src = RgbImage::from_pixel(37, 23, Rgb([200, 100, 50]));
        for (w, h) in [(336, 448), (5, 3), (37, 100), (14, 23), (1, 1)] {
            let out = resize(&src, w, h);
            assert!(
                out.chunks_exact(3).all(|px| px == [200, 100, 50]),
                "{w}x{h}"
            );
        }
    }

    #[test]
    fn an_unchanged_size_is_a_copy() {
        let src = RgbImage::from_fn(9, 7, |x, y| Rgb([x as u8 * 20, y as u8 * 30, 7]));
        assert_eq!(resize(&src, 9, 7), src.as_raw().clone());
    }

    #[test]
    fn a_window_is_the_same_pixels_as_resizing_then_cropping() {
        let src = RgbImage::from_fn(50, 40, |x, y| {
            Rgb([(x * 5) as u8, (y * 6) as u8, (x * y) as u8])
        });
        let full = resize(&src, 33, 29);
        let window = Window {
            left: 4,
            top: 7,
            width: 20,
            height: 11,
        };
        let part = resize_window(&src, 33, 29, window, Filter::Bicubic);
        for y in 0..11 {
            let from = ((y + 7) * 33 + 4) * 3;
            assert_eq!(part[y * 60..(y + 1) * 60], full[from..from + 60], "row {y}");
        }
    }

    #[test]
    fn a_window_overhanging_the_image_is_padded_with_zero() {
        let src = RgbImage::from_pixel(4, 4, Rgb([9, 9, 9]));
        let window = Window {
            left: -1,
            top: 0,
            width: 6,
            height: 4,
        };
        let out = resize_window(&src, 4, 4, window, Filter::Bicubic);
        assert_eq!(&out[..3], &[0, 0, 0]);
        assert_eq!(&out[3..6], &[9, 9, 9]);
        assert_eq!(&out[15..18], &[0, 0, 0]);
    }

    /// The `image` crate's Catmull-Rom is the same kernel (a = -0.5) with the same antialiasing,
    /// computed in f32 vertical-first without PIL's 8-bit intermediate: an independent
    /// implementation that must land within a couple of levels of ours on smooth content.
    #[test]
    fn agrees_with_the_image_crate_catmull_rom_within_two_levels() {
        let src = RgbImage::from_fn(640, 480, |x, y| {
            Rgb([
                (x * 255 / 639) as u8,
                (y * 255 / 479) as u8,
                ((x + y) / 5 % 256) as u8,
            ])
        });
        for (w, h) in [(448, 336), (644, 476), (1000, 700)] {
            let ours = resize(&src, w, h);
            let theirs =
                imageops::resize(&src, w as u32, h as u32, imageops::FilterType::CatmullRom);
            let worst = ours
                .iter()
                .zip(theirs.as_raw())
                .map(|(a, b)| a.abs_diff(*b))
                .max()
                .unwrap();
            assert!(worst <= 2, "{w}x{h}: max difference {worst}");
        }
    }
}
