//! Request bodies: OpenAI chat requests with prompts of an exact size, made of pseudo-words so
//! the engines' tokenizers see word-sized tokens (≈ 6 bytes each) and no JSON escaping is needed.

use serde_json::{json, Value};

/// The model name every mock engine serves by default.
pub const MODEL: &str = "mock-model";

/// `bytes` of lowercase pseudo-words separated by spaces, deterministic in `seed`.
pub fn words(seed: u64, bytes: usize) -> String {
    const SYLLABLES: [&str; 16] = [
        "ka", "lo", "mi", "nu", "ra", "se", "ti", "vo", "ba", "de", "fi", "go", "hu", "ze", "po",
        "wa",
    ];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        // xorshift64*: fast, and deterministic across platforms.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    };
    let mut out = String::with_capacity(bytes + 16);
    while out.len() < bytes {
        if !out.is_empty() {
            out.push(' ');
        }
        let r = next();
        for k in 0..(2 + (r % 3)) {
            out.push_str(SYLLABLES[((r >> (8 + 4 * k)) & 15) as usize]);
        }
    }
    out.truncate(bytes);
    // A trailing space would merge into the next message's first token; keep words whole.
    while out.ends_with(' ') {
        out.pop();
        out.push('x');
    }
    out
}

/// A chat request whose serialized body is `prompt_bytes` long (± a few bytes of JSON framing
/// when the prompt is tiny).
pub fn chat_body(prompt_bytes: usize, max_tokens: u32, stream: bool) -> Vec<u8> {
    let frame = chat(vec![], max_tokens, stream);
    let overhead = serde_json::to_vec(&frame).map_or(0, |v| v.len()) + 40;
    let prompt = words(7, prompt_bytes.saturating_sub(overhead).max(8));
    let body = chat(
        vec![json!({"role": "user", "content": prompt})],
        max_tokens,
        stream,
    );
    serde_json::to_vec(&body).expect("a JSON value serializes")
}

/// A chat request with these messages.
pub fn chat(messages: Vec<Value>, max_tokens: u32, stream: bool) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
    });
    if stream {
        body["stream"] = json!(true);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_have_the_exact_size_and_are_deterministic() {
        for n in [1, 10, 1000, 4096] {
            let w = words(3, n);
            assert_eq!(w.len(), n);
            assert_eq!(w, words(3, n));
            assert!(!w.ends_with(' '));
        }
        assert_ne!(words(3, 100), words(4, 100));
    }

    #[test]
    fn chat_body_is_close_to_the_requested_size() {
        for n in [1024, 32 * 1024, 256 * 1024] {
            let b = chat_body(n, 16, true);
            assert!(b.len().abs_diff(n) < 64, "{} vs {n}", b.len());
            let v: Value = serde_json::from_slice(&b).unwrap();
            assert_eq!(v["stream"], true);
        }
    }
}
