//! Usage accounting over the choices of one response (research spec §2.16, SMG's rules): the
//! `n` samples of a prompt share it, so its prompt and cached counts are taken once (the
//! maximum the samples report); completion and reasoning counts are summed over every choice.
//! With several prompts (a completions or `/generate` batch), each prompt counts once.

use std::collections::BTreeMap;

use crate::event::ChoiceUsage;
use crate::write;

/// The usage of a whole response, built from each choice's final counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageTotals {
    /// Samples per prompt: choice `i` belongs to prompt `i / n`.
    n: u32,
    /// Per prompt: the largest prompt and cached counts its samples reported.
    prompts: BTreeMap<u32, (u32, u32)>,
    completion: u64,
    reasoning: u64,
    choices: u64,
}

impl UsageTotals {
    /// Totals for a response whose prompts have `n` samples each (`n` 0 counts as 1).
    pub fn new(n: u32) -> Self {
        UsageTotals {
            n: n.max(1),
            prompts: BTreeMap::new(),
            completion: 0,
            reasoning: 0,
            choices: 0,
        }
    }

    /// Adds the final counts of choice `index`. Call once per choice.
    pub fn record(&mut self, index: u32, usage: &ChoiceUsage) {
        let (prompt, cached) = self.prompts.entry(index / self.n).or_default();
        *prompt = (*prompt).max(usage.prompt_tokens);
        *cached = (*cached).max(usage.cached_tokens);
        self.completion += u64::from(usage.completion_tokens);
        self.reasoning += u64::from(usage.reasoning_tokens);
        self.choices += 1;
    }

    /// Prompt tokens: each prompt once.
    pub fn prompt_tokens(&self) -> u64 {
        self.prompts.values().map(|&(p, _)| u64::from(p)).sum()
    }

    /// Prompt tokens served from the prefix cache, each prompt once.
    pub fn cached_tokens(&self) -> u64 {
        self.prompts.values().map(|&(_, c)| u64::from(c)).sum()
    }

    /// Generated tokens over every choice.
    pub fn completion_tokens(&self) -> u64 {
        self.completion
    }

    /// Reasoning tokens over every choice.
    pub fn reasoning_tokens(&self) -> u64 {
        self.reasoning
    }

    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens() + self.completion
    }

    /// How many choices have reported their counts.
    pub fn choices(&self) -> u64 {
        self.choices
    }

    /// The OpenAI `usage` object:
    /// `{"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details"}` where the
    /// details are `null` without cache hits (SGLang) and `{"cached_tokens":n}` with them, plus
    /// `"completion_tokens_details":{"reasoning_tokens":n}` when some were counted (SMG).
    pub fn write_openai(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        write::key(out, "prompt_tokens");
        write::u64(out, self.prompt_tokens());
        write::next_key(out, "completion_tokens");
        write::u64(out, self.completion);
        write::next_key(out, "total_tokens");
        write::u64(out, self.total_tokens());
        write::next_key(out, "prompt_tokens_details");
        match self.cached_tokens() {
            0 => out.extend_from_slice(b"null"),
            cached => {
                out.push(b'{');
                write::key(out, "cached_tokens");
                write::u64(out, cached);
                out.push(b'}');
            }
        }
        if self.reasoning > 0 {
            write::next_key(out, "completion_tokens_details");
            out.push(b'{');
            write::key(out, "reasoning_tokens");
            write::u64(out, self.reasoning);
            out.push(b'}');
        }
        out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn usage(prompt: u32, completion: u32, cached: u32, reasoning: u32) -> ChoiceUsage {
        ChoiceUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            cached_tokens: cached,
            reasoning_tokens: reasoning,
        }
    }

    fn openai(t: &UsageTotals) -> Value {
        let mut out = Vec::new();
        t.write_openai(&mut out);
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn samples_of_one_prompt_count_it_once_and_sum_completions() {
        let mut t = UsageTotals::new(3);
        t.record(0, &usage(10, 4, 6, 0));
        t.record(2, &usage(10, 5, 8, 1));
        t.record(1, &usage(9, 6, 0, 2));
        assert_eq!(t.prompt_tokens(), 10);
        assert_eq!(t.cached_tokens(), 8);
        assert_eq!(t.completion_tokens(), 15);
        assert_eq!(t.reasoning_tokens(), 3);
        assert_eq!(t.total_tokens(), 25);
        assert_eq!(t.choices(), 3);
        assert_eq!(
            openai(&t),
            json!({"prompt_tokens":10,"completion_tokens":15,"total_tokens":25,
                "prompt_tokens_details":{"cached_tokens":8},
                "completion_tokens_details":{"reasoning_tokens":3}})
        );
    }

    #[test]
    fn a_batch_counts_each_prompt_once() {
        // Two prompts, two samples each: choices 0,1 → prompt 0; 2,3 → prompt 1.
        let mut t = UsageTotals::new(2);
        t.record(0, &usage(7, 1, 0, 0));
        t.record(1, &usage(7, 2, 0, 0));
        t.record(2, &usage(5, 3, 5, 0));
        t.record(3, &usage(5, 4, 5, 0));
        assert_eq!(t.prompt_tokens(), 12);
        assert_eq!(t.cached_tokens(), 5);
        assert_eq!(t.completion_tokens(), 10);
    }

    #[test]
    fn no_cache_hits_and_no_reasoning_write_null_details_only() {
        let mut t = UsageTotals::new(1);
        t.record(0, &usage(3, 2, 0, 0));
        let mut out = Vec::new();
        t.write_openai(&mut out);
        assert_eq!(
            out,
            br#"{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5,"prompt_tokens_details":null}"#
        );
    }

    #[test]
    fn empty_totals_are_zero_and_n_zero_counts_as_one() {
        let t = UsageTotals::new(0);
        assert_eq!((t.prompt_tokens(), t.completion_tokens()), (0, 0));
        let mut t = UsageTotals::new(0);
        t.record(5, &usage(1, 1, 0, 0));
        assert_eq!(t.prompt_tokens(), 1);
    }

    #[test]
    fn counts_do_not_overflow_u32() {
        let mut t = UsageTotals::new(1);
        t.record(0, &usage(u32::MAX, u32::MAX, 0, 0));
        t.record(1, &usage(u32::MAX, u32::MAX, 0, 0));
        assert_eq!(t.completion_tokens(), 2 * u64::from(u32::MAX));
        assert_eq!(t.total_tokens(), 4 * u64::from(u32::MAX));
    }
}
