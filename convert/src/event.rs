//! What the gateway feeds a response writer, per choice: text deltas (already detokenized and
//! stop-filtered by `pdgate-tokenize`) with the token ids and logprob rows they cover, then one
//! finish with the choice's final counts. Deltas borrow: building one allocates nothing.

use pdgate_filters::errors::ErrorCode;

/// New output of one choice.
#[derive(Clone, Copy, Debug, Default)]
pub struct Delta<'a> {
    /// The choice index the client sees (completions: [`choice_index`]).
    pub index: u32,
    /// Text to show, possibly empty (a token whose text is still held back).
    pub text: &'a str,
    /// The engine token ids this delta covers (`/generate` reports them as `output_ids`).
    pub token_ids: &'a [u32],
    /// One row per token, when the client asked for logprobs.
    pub logprobs: &'a [TokenLogprob],
    /// The engine's running totals, when its chunks report them (SGLang, TokenSpeed);
    /// `/generate` frames show them.
    pub usage: Option<ChoiceUsage>,
}

/// The end of one choice.
#[derive(Clone, Copy, Debug)]
pub struct Finish<'a> {
    pub index: u32,
    pub reason: FinishReason<'a>,
    /// The stop token id or stop string that ended the choice, when one did.
    pub matched: Option<MatchedStop<'a>>,
    /// The choice's final counts (from the decode leg's `complete`).
    pub usage: ChoiceUsage,
    /// Seconds since the request arrived; `/generate` reports it as `meta_info.e2e_latency`.
    pub e2e_latency: Option<f64>,
}

/// Why a choice ended, as the engines name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason<'a> {
    /// EOS, a stop token or a stop string.
    Stop,
    /// The output cap (or the context window) was reached.
    Length,
    /// The engine aborted the request; its message when it gave one.
    Abort(Option<&'a str>),
}

impl FinishReason<'_> {
    /// The OpenAI-style `finish_reason` string (SGLang passes `abort` through).
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort(_) => "abort",
        }
    }
}

/// What stopped a choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchedStop<'a> {
    TokenId(u32),
    Text(&'a str),
}

/// Token counts of one choice. Engines report `prompt_tokens` and `cached_tokens` per choice
/// (the same prompt for every sample of it); [`crate::UsageTotals`] aggregates them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChoiceUsage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub reasoning_tokens: u32,
}

/// One generated token's logprob row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenLogprob {
    pub token_id: u32,
    /// The token decoded alone.
    pub token: String,
    /// The token's raw bytes when `token` is not exactly them (a token that splits a UTF-8
    /// character decodes to U+FFFD); `None` means `token.as_bytes()`.
    pub bytes: Option<Vec<u8>>,
    pub logprob: f32,
    /// The most likely alternatives, most likely first.
    pub top: Vec<TopLogprob>,
}

/// One alternative of a logprob row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopLogprob {
    pub token_id: u32,
    pub token: String,
    /// As [`TokenLogprob::bytes`].
    pub bytes: Option<Vec<u8>>,
    pub logprob: f32,
}

/// One prompt token's logprob row (`/generate` `input_token_logprobs`; SGLang reports them
/// from the prefill leg). The first prompt token has no logprob.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromptTokenLogprob {
    pub token_id: u32,
    pub token: String,
    pub logprob: Option<f32>,
    pub top: Vec<TopLogprob>,
}

/// An error after the response head went out: the stream ends with an error event.
#[derive(Clone, Copy, Debug)]
pub struct StreamFailure<'a> {
    pub code: ErrorCode,
    /// The HTTP status the error stands for (the code's own unless an upstream one is passed
    /// through).
    pub status: u16,
    pub message: &'a str,
}

impl<'a> StreamFailure<'a> {
    /// A failure with the code's default status.
    pub fn new(code: ErrorCode, message: &'a str) -> Self {
        StreamFailure {
            code,
            status: code.status(),
            message,
        }
    }
}

/// The client-visible choice index of sample `sample` of prompt `prompt` when every prompt
/// has `n` samples: `prompt * n + sample` (OpenAI completions and SGLang batches).
pub fn choice_index(prompt: u32, sample: u32, n: u32) -> u32 {
    prompt.saturating_mul(n).saturating_add(sample)
}

impl TokenLogprob {
    /// The bytes OpenAI reports for the token.
    pub fn raw_bytes(&self) -> &[u8] {
        self.bytes.as_deref().unwrap_or(self.token.as_bytes())
    }
}

impl TopLogprob {
    /// The bytes OpenAI reports for the alternative.
    pub fn raw_bytes(&self) -> &[u8] {
        self.bytes.as_deref().unwrap_or(self.token.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_indices_are_prompt_major() {
        assert_eq!(choice_index(0, 0, 3), 0);
        assert_eq!(choice_index(0, 2, 3), 2);
        assert_eq!(choice_index(1, 0, 3), 3);
        assert_eq!(choice_index(2, 1, 3), 7);
        assert_eq!(choice_index(u32::MAX, 1, 2), u32::MAX);
    }

    #[test]
    fn raw_bytes_default_to_the_token_text() {
        let t = TokenLogprob {
            token: "hé".into(),
            ..Default::default()
        };
        assert_eq!(t.raw_bytes(), "hé".as_bytes());
        let t = TokenLogprob {
            token: "\u{fffd}".into(),
            bytes: Some(vec![0xe2, 0x82]),
            ..Default::default()
        };
        assert_eq!(t.raw_bytes(), [0xe2, 0x82]);
    }

    #[test]
    fn failures_default_to_the_codes_status() {
        let f = StreamFailure::new(ErrorCode::InternalError, "boom");
        assert_eq!(f.status, 500);
    }
}
