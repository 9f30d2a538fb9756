//! Prompt placeholder expansion: the chat template writes one image token per image; the engine
//! wants as many as the image's feature count.

use crate::MmError;

/// Where one image's expanded placeholder run sits in the expanded token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlaceholderRange {
    pub offset: u32,
    pub length: u32,
}

/// Replaces the i-th occurrence of `token` in `ids` by `counts[i]` copies of it, and returns the
/// new ids with each run's range. Errors when the prompt's placeholders and the images disagree
/// in number (the client sent an image the template dropped, or wrote the token by hand).
pub fn expand_placeholders(
    ids: &[u32],
    token: u32,
    counts: &[u32],
) -> Result<(Vec<u32>, Vec<PlaceholderRange>), MmError> {
    let occurrences = ids.iter().filter(|&&id| id == token).count();
    if occurrences != counts.len() {
        return Err(MmError::Placeholders(format!(
            "the prompt has {occurrences} image placeholder token(s) (id {token}) but {} image(s) were given",
            counts.len()
        )));
    }
    let added: usize = counts.iter().map(|&c| c as usize).sum();
    let mut expanded = Vec::with_capacity(ids.len() - occurrences + added);
    let mut ranges = Vec::with_capacity(counts.len());
    let mut next_image = counts.iter();
    for &id in ids {
        if id != token {
            expanded.push(id);
            continue;
        }
        // The count above guarantees one count per occurrence.
        let &count = next_image.next().expect("one count per placeholder");
        let offset = u32::try_from(expanded.len())
            .map_err(|_| MmError::Placeholders("expanded prompt exceeds 2^32 tokens".into()))?;
        expanded.extend(std::iter::repeat_n(token, count as usize));
        ranges.push(PlaceholderRange {
            offset,
            length: count,
        });
    }
    Ok((expanded, ranges))
}
