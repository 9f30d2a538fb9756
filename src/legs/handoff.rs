//! What one PD attempt says about its handoff, accounted once the attempt has ended: the
//! handoff outcome metrics and the prefill → decode link's breaker (`workers::links`).
//!
//! An attempt's handoff is
//! * `failed` when a leg failed with a server error, a transport failure or a timeout after the
//!   pair was chosen (see [`is_handoff_failure`]);
//! * `recomputed` / `transferred` when the answer went out and the decode engine's report said
//!   which (see [`crate::legs::relay`]'s cached-token reading and `docs/architecture.md`,
//!   "Handoff health");
//! * `unknown` when the answer went out and nothing said; the link counts it as a success.

use pdgate_filters::errors::ErrorCode;

use super::dispatch::Attempt;
use crate::gateway::Settings;
use crate::metrics::METRICS;
use crate::proxy::ctx::RequestCtx;
use crate::workers::links::LinkOutcome;
use crate::workers::select::Pair;

/// What the decode engine reported about the prompt's KV, as the relay read it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvVerdict {
    /// Nothing to go by (no cached-token report, or a connector that reports none).
    #[default]
    Unknown,
    /// The decode reported the prompt's tokens as cached: it received the KV.
    Transferred,
    /// The decode computed `tokens` prompt tokens itself (0: not yet known).
    Recomputed { tokens: u64 },
    /// The decode's cached-token count is not its own (vLLM ≥ 0.31 relays the prefill's as
    /// `remote_prefill_cached_tokens`): reports say nothing.
    Opaque,
}

impl KvVerdict {
    /// The verdict of an SGLang or TokenSpeed decode that answered: those engines never
    /// recompute a prompt silently (a transfer that fails aborts the request), so an answer
    /// means the KV arrived — unless the transfer backend is `fake`, which decodes without KV.
    /// Their `cached_tokens` are the prefill's prefix hits and say nothing about the transfer.
    pub fn of_bootstrap_decode(decode: &crate::workers::Worker) -> KvVerdict {
        if decode.fake_kv_transfer() {
            KvVerdict::Unknown
        } else {
            KvVerdict::Transferred
        }
    }

    /// Folds in a vLLM decode's cached-token report (`cached`: `None` when it sent none). A
    /// verdict the gateway already knew (a fallback it dispatched: recomputed) only gains its
    /// count.
    pub fn with_report(self, prompt_tokens: u64, cached: Option<u64>) -> KvVerdict {
        match (self, cached) {
            (KvVerdict::Recomputed { .. }, c) => KvVerdict::Recomputed {
                tokens: prompt_tokens.saturating_sub(c.unwrap_or(0)),
            },
            (v @ KvVerdict::Opaque, _) | (v, None) => v,
            (_, Some(cached)) => KvVerdict::from_report(prompt_tokens, cached),
        }
    }

    /// The decision rule for vLLM: its `cached_tokens` count the prompt tokens the KV
    /// connector loaded plus local prefix hits, and a local hit never covers the last token.
    /// From v0.20 a transfer reports the whole prompt (NIXL, Mooncake, MoRI-IO WRITE); MoRI-IO
    /// READ and v0.10–0.19 leave the last token to compute. So `cached ≥ prompt − 1` is a
    /// transfer and anything less a recompute of what was not cached. A one-token prompt says
    /// nothing. (Limits: docs/architecture.md, "Handoff health".)
    pub fn from_report(prompt_tokens: u64, cached: u64) -> KvVerdict {
        if prompt_tokens <= 1 {
            KvVerdict::Unknown
        } else if cached + 1 >= prompt_tokens {
            KvVerdict::Transferred
        } else {
            KvVerdict::Recomputed {
                tokens: prompt_tokens - cached,
            }
        }
    }
}

/// Records the handoff of `pair` for the attempt that ended with `outcome`.
pub fn account(settings: &Settings, ctx: &RequestCtx, pair: &Pair, outcome: &Attempt) {
    let link = match outcome {
        Attempt::Answered | Attempt::EndedWithError(_) => match ctx.kv_verdict {
            KvVerdict::Recomputed { tokens } => {
                // The tokens first: a scrape that sees the outcome then sees its tokens too.
                METRICS
                    .pd_recomputed_prompt_tokens
                    .with_label_values(&[ctx.connector.unwrap_or("unknown")])
                    .inc_by(tokens);
                count("recomputed", ctx);
                LinkOutcome::Recomputed
            }
            KvVerdict::Transferred => {
                count("transferred", ctx);
                LinkOutcome::Transferred
            }
            KvVerdict::Unknown | KvVerdict::Opaque => {
                count("unknown", ctx);
                LinkOutcome::Transferred
            }
        },
        Attempt::Refused(reply) if is_handoff_failure(reply.error_code, reply.status) => {
            count("failed", ctx);
            LinkOutcome::Failed
        }
        // The client left, the prefill failed, or the decode broke after its answer began.
        _ => return,
    };
    pair.prefill.links.record(
        pair.prefill.url(),
        &pair.decode.id,
        pair.decode.url(),
        link,
        &settings.links,
        std::time::Instant::now(),
    );
}

fn count(outcome: &str, ctx: &RequestCtx) {
    METRICS
        .pd_handoff_outcome
        .with(&[outcome, ctx.connector.unwrap_or("unknown")], |m| m.inc());
}

/// A refusal that says a leg failed after the pair was chosen (`ErrorCode::is_leg_failure`) with
/// a server error. Either side counts: a broken link shows on whichever side notices first (an
/// SGLang prefill whose transfer session died, a decode whose KV never came). A leg failing with
/// every partner is its worker's breaker's business; its links then all fail alike, and
/// selection keeps using them when nothing else is left.
fn is_handoff_failure(code: Option<&'static str>, status: u16) -> bool {
    status >= 500
        && code
            .and_then(ErrorCode::from_code)
            .is_some_and(ErrorCode::is_leg_failure)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cached_token_rule() {
        use KvVerdict::*;
        assert_eq!(KvVerdict::from_report(100, 100), Transferred);
        assert_eq!(
            KvVerdict::from_report(100, 99),
            Transferred,
            "the last token recomputed"
        );
        assert_eq!(KvVerdict::from_report(100, 0), Recomputed { tokens: 100 });
        assert_eq!(
            KvVerdict::from_report(100, 96),
            Recomputed { tokens: 4 },
            "a local prefix hit is not a transfer"
        );
        assert_eq!(KvVerdict::from_report(5, 4), Transferred);
        assert_eq!(KvVerdict::from_report(5, 0), Recomputed { tokens: 5 });
        assert_eq!(KvVerdict::from_report(1, 0), Unknown);
        assert_eq!(Unknown.with_report(100, None), Unknown);
        assert_eq!(
            Recomputed { tokens: 0 }.with_report(100, None),
            Recomputed { tokens: 100 }
        );
    }

    #[test]
    fn leg_server_errors_are_handoff_failures_and_selection_refusals_are_not() {
        assert!(is_handoff_failure(Some("decode_internal_error"), 500));
        assert!(is_handoff_failure(Some("decode_request_failed"), 502));
        assert!(is_handoff_failure(Some("prefill_internal_error"), 500));
        assert!(is_handoff_failure(Some("moriio_handoff_invalid"), 502));
        assert!(is_handoff_failure(Some("timeout"), 504));
        assert!(!is_handoff_failure(Some("decode_bad_request"), 400));
        assert!(!is_handoff_failure(Some("decode_error"), 429));
        assert!(!is_handoff_failure(Some("no_available_workers"), 503));
        assert!(!is_handoff_failure(
            Some("worker_overload_protection_shed"),
            503
        ));
        assert!(!is_handoff_failure(None, 500));
    }
}
