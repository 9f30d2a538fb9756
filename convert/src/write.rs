//! Writing JSON values and SSE frames straight into the caller's buffer: no `serde_json::Value`,
//! no intermediate `String` per token. Strings are escaped by `pdgate_filters::json` (the one
//! home of escaping); numbers by `serde_json`'s own formatter (ryu for floats).

use pdgate_filters::json;

/// The SSE terminator of the OpenAI-style and `/generate` streams.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// What a logprob that is not a finite number is written as. OpenAI and vLLM clamp `-inf`
/// (a token the sampler masked) to -9999.0; JSON has no infinity.
pub const LOGPROB_FLOOR: f32 = -9999.0;

/// `"s"`, escaped.
pub fn string(out: &mut Vec<u8>, s: &str) {
    json::push_string(out, s);
}

/// The escaped contents of `s`, without quotes: pieces of one growing string can be written
/// one by one.
pub fn string_contents(out: &mut Vec<u8>, s: &str) {
    json::push_string_contents(out, s);
}

/// `"s"` or `null`.
pub fn opt_string(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        Some(s) => string(out, s),
        None => out.extend_from_slice(b"null"),
    }
}

/// A trusted key (ASCII, nothing to escape) with its colon: `"key":`.
pub fn key(out: &mut Vec<u8>, key: &str) {
    out.push(b'"');
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\":");
}

/// `,"key":` — a key that follows another member.
pub fn next_key(out: &mut Vec<u8>, k: &str) {
    out.push(b',');
    key(out, k);
}

pub fn u64(out: &mut Vec<u8>, n: u64) {
    json::push_u64(out, n);
}

/// A logprob: shortest round-trip decimal of the `f32` the engine sent (so `-0.1` stays
/// `-0.1`, not `-0.10000000149011612`); non-finite values as [`LOGPROB_FLOOR`].
pub fn logprob(out: &mut Vec<u8>, lp: f32) {
    let lp = if lp.is_finite() { lp } else { LOGPROB_FLOOR };
    // Writing a finite float into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, &lp);
}

/// A finite `f64` (non-finite as 0).
pub fn f64(out: &mut Vec<u8>, x: f64) {
    let x = if x.is_finite() { x } else { 0.0 };
    let _ = serde_json::to_writer(&mut *out, &x);
}

/// `[b0,b1,…]`: a token's UTF-8 bytes as OpenAI's `bytes` list.
pub fn byte_list(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'[');
    for (i, &b) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        u64(out, u64::from(b));
    }
    out.push(b']');
}

/// Starts an unnamed SSE event: `data: `.
pub fn data_start(out: &mut Vec<u8>) {
    out.extend_from_slice(b"data: ");
}

/// Starts a named SSE event: `event: <name>\ndata: `.
pub fn event_start(out: &mut Vec<u8>, name: &str) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
}

/// Ends an SSE event. The JSON written between start and end never holds a raw newline
/// (strings are escaped), so every event is exactly one `data:` line.
pub fn event_end(out: &mut Vec<u8>) {
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut out = Vec::new();
        f(&mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn logprobs_keep_the_engines_f32_digits() {
        assert_eq!(text(|o| logprob(o, -0.1)), "-0.1");
        assert_eq!(text(|o| logprob(o, -1.234)), "-1.234");
        assert_eq!(text(|o| logprob(o, 0.0)), "0.0");
        assert_eq!(text(|o| logprob(o, f32::NEG_INFINITY)), "-9999.0");
        assert_eq!(text(|o| logprob(o, f32::NAN)), "-9999.0");
    }

    #[test]
    fn byte_lists_and_keys() {
        assert_eq!(text(|o| byte_list(o, "hé".as_bytes())), "[104,195,169]");
        assert_eq!(text(|o| byte_list(o, b"")), "[]");
        assert_eq!(text(|o| next_key(o, "a")), ",\"a\":");
        assert_eq!(text(|o| opt_string(o, None)), "null");
    }

    #[test]
    fn floats_are_finite_json() {
        assert_eq!(text(|o| f64(o, 0.25)), "0.25");
        assert_eq!(text(|o| f64(o, f64::INFINITY)), "0.0");
    }
}
