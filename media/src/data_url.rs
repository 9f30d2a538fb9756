//! Inline media: `data:` URLs (OpenAI `image_url`) and bare base64 (Anthropic `image` blocks
//! with `source.type = "base64"`). The size limit is checked on the encoded text before any
//! decoding, so an oversized payload costs a length scan, not an allocation.

use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use bytes::Bytes;

use crate::{Media, MediaError};

/// Standard alphabet, padding optional: clients disagree on padding, never on the alphabet.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes `data:[<mime>][;base64],<payload>`. The payload is percent-decoded (both forms, as
/// the Fetch standard does) and, with `;base64`, then base64-decoded with ASCII whitespace
/// ignored. `content_type` is the media type as written (parameters kept), `None` when absent.
pub fn decode_data_url(url: &str, max_bytes: usize) -> Result<Media, MediaError> {
    let rest = url
        .get(..5)
        .filter(|scheme| scheme.eq_ignore_ascii_case("data:"))
        .map(|_| &url[5..])
        .ok_or_else(|| MediaError::BadData("not a data: URL".into()))?;
    let (meta, payload) = rest
        .split_once(',')
        .ok_or_else(|| MediaError::BadData("a data: URL needs a ',' before its payload".into()))?;
    let meta = meta.trim();
    let (mime, base64) = match meta.len().checked_sub(7) {
        Some(at) if meta.is_char_boundary(at) && meta[at..].eq_ignore_ascii_case(";base64") => {
            (meta[..at].trim(), true)
        }
        _ => (meta, false),
    };
    let content_type = (!mime.is_empty()).then(|| mime.to_owned());
    // Percent-decoding shrinks text at most threefold: a payload longer than three times the
    // limit is too large whatever it holds.
    if payload.len() / 3 > max_bytes {
        return Err(MediaError::TooLarge { limit: max_bytes });
    }
    let bytes = if base64 {
        if payload.contains('%') {
            let decoded = percent_decode(payload.as_bytes());
            let text = std::str::from_utf8(&decoded)
                .map_err(|_| MediaError::BadData("base64 payload is not text".into()))?;
            decode_base64(text, max_bytes)?
        } else {
            decode_base64(payload, max_bytes)?
        }
    } else {
        let decoded = percent_decode(payload.as_bytes());
        if decoded.len() > max_bytes {
            return Err(MediaError::TooLarge { limit: max_bytes });
        }
        Bytes::from(decoded)
    };
    Ok(Media {
        bytes,
        content_type,
    })
}

/// Decodes standard-alphabet base64 (padding optional, ASCII whitespace ignored), refusing
/// before decoding when the decoded size would exceed `max_bytes`.
pub fn decode_base64(s: &str, max_bytes: usize) -> Result<Bytes, MediaError> {
    let significant = s
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .count();
    // Every 4 base64 characters carry 3 bytes; a trailing 2 or 3 carry 1 or 2.
    if significant / 4 * 3 + (significant % 4).saturating_sub(1) > max_bytes {
        return Err(MediaError::TooLarge { limit: max_bytes });
    }
    let decoded = if s.bytes().any(|b| b.is_ascii_whitespace()) {
        let compact: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        BASE64.decode(compact)
    } else {
        BASE64.decode(s)
    };
    decoded
        .map(Bytes::from)
        .map_err(|e| MediaError::BadData(format!("invalid base64: {e}")))
}

/// `%XX` → the byte; a `%` not followed by two hex digits stays as it is (the Fetch standard's
/// percent-decode).
pub(crate) fn percent_decode(input: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(input.len());
    let mut i = 0;
    while i < input.len() {
        let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
        if input[i] == b'%' && i + 2 < input.len() {
            if let (Some(hi), Some(lo)) = (hex(input[i + 1]), hex(input[i + 2])) {
                out.push(hi << 4 | lo);
                i += 3;
                continue;
            }
        }
        out.push(input[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 1×1 transparent PNG.
    const PNG_BASE64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

    #[test]
    fn base64_png_data_url_decodes_to_the_png_bytes() {
        let media = decode_data_url(&format!("data:image/png;base64,{PNG_BASE64}"), 1024).unwrap();
        assert_eq!(media.content_type.as_deref(), Some("image/png"));
        assert_eq!(&media.bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert_eq!(media.bytes.len(), 70);
        let upper = decode_data_url(&format!("DATA:image/png;BASE64,{PNG_BASE64}"), 1024).unwrap();
        assert_eq!(upper.bytes, media.bytes);
    }

    #[test]
    fn base64_with_whitespace_percent_escapes_or_no_padding_decodes() {
        let wrapped = format!("{}\n{}", &PNG_BASE64[..40], &PNG_BASE64[40..]);
        let png = decode_base64(PNG_BASE64, 1024).unwrap();
        assert_eq!(decode_base64(&wrapped, 1024).unwrap(), png);
        assert_eq!(
            decode_base64(PNG_BASE64.trim_end_matches('='), 1024).unwrap(),
            png
        );
        assert_eq!(
            decode_data_url("data:;base64,aGk%3D", 10).unwrap().bytes,
            &b"hi"[..]
        );
    }

    #[test]
    fn percent_encoded_text_data_url_decodes() {
        let media = decode_data_url("data:text/plain;charset=utf-8,a%20b%2Cc%zz%", 100).unwrap();
        assert_eq!(media.bytes, &b"a b,c%zz%"[..]);
        assert_eq!(
            media.content_type.as_deref(),
            Some("text/plain;charset=utf-8")
        );
        let bare = decode_data_url("data:,hello", 100).unwrap();
        assert_eq!(
            (bare.bytes, bare.content_type),
            (Bytes::from("hello"), None)
        );
    }

    #[test]
    fn data_url_without_a_comma_is_bad_data() {
        assert!(matches!(
            decode_data_url("data:image/png;base64", 100),
            Err(MediaError::BadData(_))
        ));
        assert!(matches!(
            decode_data_url("http://media.test/", 100),
            Err(MediaError::BadData(_))
        ));
        assert!(matches!(
            decode_data_url("data:image/png;base64,!!!!", 100),
            Err(MediaError::BadData(_))
        ));
    }

    #[test]
    fn oversized_payloads_are_refused_at_the_limit() {
        // 70 bytes decoded: 69 is one too few, 70 is exactly enough.
        let url = format!("data:image/png;base64,{PNG_BASE64}");
        assert_eq!(
            decode_data_url(&url, 69).unwrap_err(),
            MediaError::TooLarge { limit: 69 }
        );
        assert!(decode_data_url(&url, 70).is_ok());
        assert_eq!(
            decode_base64("aGk", 1).unwrap_err(),
            MediaError::TooLarge { limit: 1 }
        );
        assert_eq!(decode_base64("aGk", 2).unwrap(), &b"hi"[..]);
        assert_eq!(
            decode_data_url("data:,abc", 2).unwrap_err(),
            MediaError::TooLarge { limit: 2 }
        );
        assert_eq!(
            decode_data_url(&format!("data:,{}", "%41".repeat(10)), 9).unwrap_err(),
            MediaError::TooLarge { limit: 9 }
        );
    }

    #[test]
    fn a_huge_payload_is_refused_without_decoding() {
        let huge = format!("data:image/png;base64,{}", "A".repeat(4_000_000));
        assert_eq!(
            decode_data_url(&huge, 1000).unwrap_err(),
            MediaError::TooLarge { limit: 1000 }
        );
    }
}
