//! The prompt-cache report of an engine's OpenAI-shaped answer: `usage.prompt_tokens` and
//! `usage.prompt_tokens_details.cached_tokens` (vLLM sends the details only when started with
//! `--enable-prompt-tokens-details`; they are `null` otherwise).

use crate::body::scan_object;
use crate::value;

/// What an answer says about its prompt: the prompt's token count, and how many of them the
/// engine did not compute itself (`None`: no cached-token report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptCacheReport {
    pub prompt_tokens: u64,
    pub cached_tokens: Option<u64>,
}

/// Reads the report of a whole (non-streamed) answer body; `None` without a `usage` object.
pub fn prompt_cache_report(body: &[u8]) -> Option<PromptCacheReport> {
    let top = scan_object(body).ok()?;
    let usage = top.get_non_null(body, "usage")?;
    let u = scan_object(usage).ok()?;
    let prompt_tokens = u.get(usage, "prompt_tokens").and_then(value::as_u64)?;
    let cached_tokens = u
        .get_non_null(usage, "prompt_tokens_details")
        .and_then(|d| {
            let details = scan_object(d).ok()?;
            details.get(d, "cached_tokens").and_then(value::as_u64)
        });
    Some(PromptCacheReport {
        prompt_tokens,
        cached_tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_prompt_and_cached_tokens() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":12,"completion_tokens":3,
            "prompt_tokens_details":{"cached_tokens":11}}}"#;
        assert_eq!(
            prompt_cache_report(body),
            Some(PromptCacheReport {
                prompt_tokens: 12,
                cached_tokens: Some(11)
            })
        );
    }

    #[test]
    fn null_details_are_no_report_and_hostile_bodies_are_none() {
        let body = br#"{"usage":{"prompt_tokens":12,"prompt_tokens_details":null}}"#;
        assert_eq!(prompt_cache_report(body).unwrap().cached_tokens, None);
        for bad in [
            &b""[..],
            b"[]",
            b"{\"usage\":7}",
            b"{\"usage\":{}}",
            b"{\"usage\":{\"prompt_tokens\":-1}}",
        ] {
            assert_eq!(prompt_cache_report(bad), None);
        }
    }
}
