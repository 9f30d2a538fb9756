//! Measurements, not assertions (the numbers depend on the machine). Run in release:
//!
//! ```text
//! cargo test -p pdgate-tokenize --release --test suite -- speed:: --ignored --nocapture
//! ```

use crate::common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use pdgate_tokenize::{
    fixture, ChatInput, IncrementalDetokenizer, StopConfig, StopDecoder, Tokenizer,
};
use serde_json::json;

/// Mean time of `f` over enough runs to take about `budget`.
fn time<T>(budget: Duration, mut f: impl FnMut() -> T) -> Duration {
    black_box(f());
    let start = Instant::now();
    let mut runs = 0u32;
    while start.elapsed() < budget {
        black_box(f());
        runs += 1;
    }
    start.elapsed() / runs.max(1)
}

fn prompt_of(len: usize) -> String {
    let mut s = String::with_capacity(len + fixture::CORPUS.len());
    while s.len() < len {
        s.push_str(fixture::CORPUS);
    }
    let mut end = len;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}

#[test]
#[ignore = "measurement; run with --release -- --ignored --nocapture"]
fn speed() {
    let dir = common::TempDir::new("speed");
    fixture::write_model_dir(dir.path()).unwrap();
    let load = time(Duration::from_millis(500), || {
        Tokenizer::from_dir(dir.path()).unwrap()
    });
    println!("load fixture dir: {load:?}");
    let t = common::chatml();

    for (label, len) in [("1 KB", 1024), ("32 KB", 32 * 1024), ("256 KB", 256 * 1024)] {
        let p = prompt_of(len);
        let tokens = t.encode(&p, false).unwrap().len();
        let d = time(Duration::from_secs(1), || t.encode(&p, false).unwrap());
        let mbps = len as f64 / d.as_secs_f64() / 1e6;
        println!("encode {label}: {d:?} ({tokens} tokens, {mbps:.1} MB/s)");
    }

    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for i in 0..9 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": prompt_of(200)}));
    }
    let input = ChatInput {
        messages: &messages,
        add_generation_prompt: true,
        ..ChatInput::default()
    };
    let render = time(Duration::from_secs(1), || t.render_chat(&input).unwrap());
    let prompt = t.render_chat(&input).unwrap();
    let encode = time(Duration::from_secs(1), || t.encode(&prompt, false).unwrap());
    println!(
        "ChatML render, 10 messages ({} bytes): {render:?}; + encode: {encode:?}",
        prompt.len()
    );

    let ids = t.encode(&prompt_of(64 * 1024), false).unwrap();
    let n = ids.len() as u32;
    let detok = time(Duration::from_secs(1), || {
        let mut d = IncrementalDetokenizer::new(t.clone(), true);
        let mut out = String::new();
        for &id in &ids {
            d.push(id, &mut out).unwrap();
        }
        out
    }) / n;
    println!("detokenize: {detok:?} per token ({n} tokens)");
    let config = StopConfig {
        stop: vec!["</answer>".into(), "\n\nUser:".into()],
        skip_special_tokens: true,
        ..StopConfig::default()
    };
    let stop = time(Duration::from_secs(1), || {
        let mut d = StopDecoder::new(t.clone(), &config);
        let mut out = String::new();
        for &id in &ids {
            d.push(id, &mut out).unwrap();
        }
        out
    }) / n;
    println!("detokenize + 2 stop strings: {stop:?} per token");
    let full = time(Duration::from_secs(1), || t.decode(&ids, true).unwrap()) / n;
    println!("full decode, for comparison: {full:?} per token");

    // The window path (SentencePiece-style decoders).
    let sp = common::sentencepiece();
    let sp_ids = sp.encode(&prompt_of(64 * 1024), false).unwrap();
    let sp_n = sp_ids.len() as u32;
    let window = time(Duration::from_secs(1), || {
        let mut d = IncrementalDetokenizer::new(sp.clone(), true);
        let mut out = String::new();
        for &id in &sp_ids {
            d.push(id, &mut out).unwrap();
        }
        out
    }) / sp_n;
    println!("detokenize, SentencePiece window path: {window:?} per token ({sp_n} tokens)");
}
