//! Shared by the fuzz targets: the fixture model (written once per process), the input layout
//! (a few control bytes, then token ids as little-endian u16s) and the reference stop cut.

use std::sync::{Arc, OnceLock};

use pdgate_tokenize::{fixture, Tokenizer};

/// The byte-level ChatML fixture, loaded once.
pub fn chatml() -> Arc<Tokenizer> {
    static MODEL: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let dir =
                std::env::temp_dir().join(format!("pdgate-tokenize-fuzz-{}", std::process::id()));
            fixture::write_model_dir(&dir).expect("write the fixture");
            let t = Tokenizer::from_dir(&dir).expect("load the fixture");
            let _ = std::fs::remove_dir_all(&dir);
            Arc::new(t)
        })
        .clone()
}

/// Token ids from pairs of bytes, each reduced into the fixture's vocabulary.
pub fn token_ids(data: &[u8]) -> Vec<u32> {
    data.chunks(2)
        .map(|c| {
            let raw = u32::from(c[0]) | (u32::from(*c.get(1).unwrap_or(&0)) << 8);
            raw % fixture::VOCAB_SIZE as u32
        })
        .collect()
}

/// The first stop to end in `text` (the longest of those ending there); the text cut before it
/// (hidden) or after it (visible), and the stop.
pub fn reference_cut(text: &str, stops: &[String], visible: bool) -> (String, Option<String>) {
    for end in (1..=text.len()).filter(|&e| text.is_char_boundary(e)) {
        let best = stops
            .iter()
            .filter(|s| !s.is_empty() && text[..end].ends_with(s.as_str()))
            .max_by_key(|s| s.len());
        if let Some(s) = best {
            let cut = if visible { end } else { end - s.len() };
            return (text[..cut].to_owned(), Some(s.clone()));
        }
    }
    (text.to_owned(), None)
}
