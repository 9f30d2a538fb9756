//! `StopDecoder` over arbitrary token ids and stop strings, fed one token at a time and in
//! batches.
//!
//! Input: c0 (bit0 no_stop_trim, bit1 skip_special_tokens, bit2 ignore_eos), c1 (number of stop
//! strings, mod 4), c2 (batch size, mod 8, 0 = 1); then, per stop string, a length byte (mod 6)
//! and that many bytes (lossy UTF-8); then token ids as little-endian u16 pairs.
//!
//! Properties: one-at-a-time and batched feeding give the same text and the same stop; the text
//! equals the reference — the full decode of the ids before the first stop token (through it
//! when visible) cut at the first stop string to end — and never contains a hidden stop string;
//! once stopped, the decoder emits nothing more.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_tokenize::{fixture, MatchedStop, StopConfig, StopDecoder};
use pdgate_tokenize_fuzz::{chatml, reference_cut, token_ids};

fn run(config: &StopConfig, ids: &[u32], batch: usize) -> (String, Option<MatchedStop>) {
    let mut d = StopDecoder::new(chatml(), config);
    let mut out = String::new();
    for chunk in ids.chunks(batch) {
        d.push_all(chunk, &mut out).unwrap();
    }
    d.flush(&mut out).unwrap();
    if d.is_stopped() {
        let mut more = String::new();
        d.push(u32::from(b'x'), &mut more).unwrap();
        d.flush(&mut more).unwrap();
        assert!(more.is_empty(), "emitted after stopping");
    }
    (out, d.stopped().cloned())
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let (c0, n_stops, batch) = (
        data[0],
        usize::from(data[1] % 4),
        usize::from(data[2] % 8).max(1),
    );
    let mut rest = &data[3..];
    let mut stops = Vec::new();
    for _ in 0..n_stops {
        let Some((&len, tail)) = rest.split_first() else {
            break;
        };
        let len = usize::from(len % 6).min(tail.len());
        stops.push(String::from_utf8_lossy(&tail[..len]).into_owned());
        rest = &tail[len..];
    }
    let config = StopConfig {
        stop: stops.clone(),
        stop_token_ids: Vec::new(),
        ignore_eos: c0 & 4 != 0,
        no_stop_trim: c0 & 1 != 0,
        skip_special_tokens: c0 & 2 != 0,
    };
    let ids = token_ids(rest);
    let one = run(&config, &ids, 1);
    let batched = run(&config, &ids, batch);
    assert_eq!(one, batched, "batching changed the output");

    let t = chatml();
    let eos = t.eos_token_ids();
    let first_eos = if config.ignore_eos {
        None
    } else {
        ids.iter().position(|i| eos.contains(i))
    };
    let upto = match first_eos {
        Some(p) if config.no_stop_trim => p + 1,
        Some(p) => p,
        None => ids.len(),
    };
    let full = t.decode(&ids[..upto], config.skip_special_tokens).unwrap();
    let (want, matched) = reference_cut(&full, &stops, config.no_stop_trim);
    assert_eq!(one.0, want, "ids {ids:?} stops {stops:?}");
    match (matched, first_eos) {
        (Some(m), _) => assert_eq!(one.1, Some(MatchedStop::Text(m))),
        (None, Some(p)) => assert_eq!(one.1, Some(MatchedStop::TokenId(ids[p]))),
        (None, None) => assert_eq!(one.1, None),
    }
    if !config.no_stop_trim {
        for s in stops.iter().filter(|s| !s.is_empty()) {
            assert!(
                !one.0.contains(s.as_str()),
                "hidden stop {s:?} shows in {:?}",
                one.0
            );
        }
    }
    let _ = fixture::IM_END_ID;
});
