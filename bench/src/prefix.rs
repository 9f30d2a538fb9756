//! A shared-prefix workload for the routing policies: `systems` system prompts shared by
//! `conversations` multi-turn chats. Each round sends the next turn of every conversation (its
//! whole history plus a new user message), so a prefill that served turn t already holds the
//! prefix of turn t+1. The prefix hit rate is what the engines report: `cached_tokens` over
//! `prompt_tokens` in the responses' `usage` (the decode relays the prefill's count).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::control;
use crate::http1::{Conn, Keep, RawRequest};
use crate::load::round3;
use crate::report::cell;
use crate::workload::{chat, words};

pub struct PrefixSpec {
    pub addr: SocketAddr,
    pub label: String,
    pub systems: usize,
    pub conversations: usize,
    pub turns: usize,
    pub system_bytes: usize,
    pub turn_bytes: usize,
    pub concurrency: usize,
    /// Prefill engines' API URLs: their request counts show where the policy sent the traffic.
    pub engines: Vec<SocketAddr>,
}

#[derive(Default, Clone, Copy)]
struct Tokens {
    requests: u64,
    errors: u64,
    prompt: u64,
    cached: u64,
}

impl Tokens {
    fn add(&mut self, o: Tokens) {
        self.requests += o.requests;
        self.errors += o.errors;
        self.prompt += o.prompt;
        self.cached += o.cached;
    }
    fn hit_rate(&self) -> Value {
        if self.prompt == 0 {
            Value::Null
        } else {
            json!(round3(self.cached as f64 / self.prompt as f64))
        }
    }
}

fn history(spec: &PrefixSpec, conv: usize, upto_turn: usize) -> Vec<Value> {
    let mut msgs = vec![json!({
        "role": "system",
        "content": words(1_000 + (conv % spec.systems) as u64, spec.system_bytes),
    })];
    for t in 0..=upto_turn {
        let seed = 1_000_000 + (conv * 1_000 + t) as u64;
        msgs.push(json!({"role": "user", "content": words(seed, spec.turn_bytes)}));
        if t < upto_turn {
            msgs.push(
                json!({"role": "assistant", "content": words(seed + 500, spec.turn_bytes / 4)}),
            );
        }
    }
    msgs
}

/// The order conversations are sent in round `turn`: shuffled per round, so a counter-based
/// policy (round_robin) does not send a conversation to the same worker every round by accident
/// of the conversation count dividing the worker count.
fn round_order(conversations: usize, turn: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..conversations).collect();
    let mut state =
        0x2545_F491_4F6C_DD1D_u64 ^ (turn as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for i in (1..order.len()).rev() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        order.swap(i, (state % (i as u64 + 1)) as usize);
    }
    order
}

fn usage_tokens(body: &[u8]) -> Option<(u64, u64)> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let usage = v.get("usage")?;
    let prompt = usage.get("prompt_tokens")?.as_u64()?;
    let cached = usage
        .pointer("/prompt_tokens_details/cached_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Some((prompt, cached))
}

/// Sends `bodies` one after the other, each on a fresh connection: what is measured here is
/// routing, and a keep-alive connection the gateway closes under a request would lose it (and
/// with it that turn's cache warm-up) for reasons that have nothing to do with the policy.
async fn send_all(addr: SocketAddr, bodies: Vec<Vec<u8>>) -> Tokens {
    let mut t = Tokens::default();
    let close = ["Connection: close".to_string()];
    for body in bodies {
        let req = RawRequest::post_json(&addr.to_string(), "/v1/chat/completions", &body, &close);
        let Ok(mut conn) = Conn::connect(addr).await else {
            t.errors += 1;
            continue;
        };
        match conn
            .send(&req, Keep { body: true }, Duration::from_secs(60))
            .await
        {
            Ok(r) if (200..300).contains(&r.status) => match usage_tokens(&r.body) {
                Some((p, cached)) => {
                    t.requests += 1;
                    t.prompt += p;
                    t.cached += cached;
                }
                None => t.errors += 1,
            },
            Ok(_) | Err(_) => t.errors += 1,
        }
    }
    t
}

pub async fn run(spec: PrefixSpec) -> Value {
    let mut before = Vec::new();
    for e in &spec.engines {
        before.push(control::requests_total(*e).await);
    }
    let started = Instant::now();
    let mut first = Tokens::default();
    let mut later = Tokens::default();
    for turn in 0..spec.turns {
        // Spread this round's conversations over the connections; rounds are sequential so a
        // turn's history was served (and cached somewhere) before the next turn asks for it.
        let lanes = spec.concurrency.max(1);
        let mut per_lane: Vec<Vec<Vec<u8>>> = vec![Vec::new(); lanes];
        for (i, conv) in round_order(spec.conversations, turn)
            .into_iter()
            .enumerate()
        {
            let body = chat(history(&spec, conv, turn), 1, false);
            per_lane[i % lanes].push(serde_json::to_vec(&body).expect("JSON serializes"));
        }
        let tasks: Vec<_> = per_lane
            .into_iter()
            .map(|bodies| tokio::spawn(send_all(spec.addr, bodies)))
            .collect();
        for t in tasks {
            let got = t.await.unwrap_or(Tokens {
                errors: 1,
                ..Tokens::default()
            });
            if turn == 0 {
                first.add(got);
            } else {
                later.add(got);
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut spread = Vec::new();
    for (i, e) in spec.engines.iter().enumerate() {
        let after = control::requests_total(*e).await;
        spread.push(match (before[i], after) {
            (Some(b), Some(a)) => json!(a - b),
            _ => Value::Null,
        });
    }
    let mut all = first;
    all.add(later);
    json!({
        "target": spec.label,
        "requests": all.requests,
        "errors": all.errors,
        "prompt_tokens": all.prompt,
        "cached_tokens": all.cached,
        "hit_rate": all.hit_rate(),
        "hit_rate_first_turn": first.hit_rate(),
        "hit_rate_later_turns": later.hit_rate(),
        "requests_per_prefill": spread,
        "elapsed_s": round3(elapsed),
    })
}

pub fn table(rows: &[Value]) -> String {
    let mut out = String::from(
        "| run | requests | errors | prompt tokens | cached tokens | hit rate | first turn (system prompt only) | later turns (history) | requests per prefill |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        let f = |k: &str| cell(r, k);
        let spread = r["requests_per_prefill"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|v| v.to_string())
                    .collect::<Vec<_>>()
                    .join(" / ")
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r["target"].as_str().unwrap_or("?"),
            f("requests"),
            f("errors"),
            f("prompt_tokens"),
            f("cached_tokens"),
            f("hit_rate"),
            f("hit_rate_first_turn"),
            f("hit_rate_later_turns"),
            if spread.is_empty() {
                "–".into()
            } else {
                spread
            },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_turn_extends_the_previous_history() {
        let spec = PrefixSpec {
            addr: "127.0.0.1:1".parse().unwrap(),
            label: String::new(),
            systems: 2,
            conversations: 3,
            turns: 3,
            system_bytes: 100,
            turn_bytes: 40,
            concurrency: 1,
            engines: vec![],
        };
        let t1 = history(&spec, 1, 1);
        let t2 = history(&spec, 1, 2);
        assert_eq!(&t2[..t1.len()], &t1[..]);
        assert_eq!(t2.len(), t1.len() + 2);
        // Conversations 0 and 2 share their system prompt, 1 has the other one.
        assert_eq!(history(&spec, 0, 0)[0], history(&spec, 2, 0)[0]);
        assert_ne!(history(&spec, 0, 0)[0], history(&spec, 1, 0)[0]);
    }

    #[test]
    fn rounds_visit_every_conversation_in_a_new_order() {
        let a = round_order(64, 0);
        let b = round_order(64, 1);
        assert_ne!(a, b);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..64).collect::<Vec<_>>());
    }

    #[test]
    fn usage_without_details_counts_zero_cached() {
        let b = br#"{"usage":{"prompt_tokens":40,"prompt_tokens_details":null}}"#;
        assert_eq!(usage_tokens(b), Some((40, 0)));
        let b = br#"{"usage":{"prompt_tokens":40,"prompt_tokens_details":{"cached_tokens":32}}}"#;
        assert_eq!(usage_tokens(b), Some((40, 32)));
    }
}
