//! gRPC PD through the real binary: `grpc://` SGLang, TokenSpeed and vLLM mock engines, the
//! gateway tokenizing with a generated model directory, legs handed off through the engines'
//! servicers, and the answer equal to what a single worker generates.

use std::path::PathBuf;
use std::time::Duration;

use mock_engine::{EngineKind, MockEngine, MockEngineConfig, OutputVocab, Role};
use pdgate_tokenize::fixture;
use pdgate_tokenize::Tokenizer;
use serde_json::{json, Value};

use crate::harness::Gateway;

/// The fixture model's directory (written once per test binary).
fn model_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("grpc-model");
        fixture::write_model_dir(&dir).expect("write the fixture model");
        dir
    })
    .clone()
}

/// The ids the mocks emit: the fixture's merged tokens (readable text), EOS `<|im_end|>`.
fn vocab() -> OutputVocab {
    OutputVocab::range(256..256 + fixture::MERGES as u32, [fixture::IM_END_ID])
}

async fn grpc_engine(engine: EngineKind, role: Role, ip: [u8; 4]) -> MockEngine {
    let cfg = MockEngineConfig::grpc_test(engine, role, ip).with_vocab(vocab());
    MockEngine::spawn(cfg).await.expect("spawn a gRPC mock")
}

fn spec(e: &MockEngine) -> Value {
    let mut s = e.worker_spec();
    s["health"] = json!({"disable_health_check": true});
    s
}

async fn gateway(p: &MockEngine, d: &MockEngine) -> Gateway {
    let extra = format!("  model_path: {}\n", model_dir().display());
    let mut gw = Gateway::start(&[spec(p), spec(d)], &extra).await;
    gw.wait_ready().await;
    gw
}

/// What a single worker answers to `messages` (chat template + the fixture tokenizer).
fn reference_text(e: &MockEngine, messages: &Value, max_tokens: usize) -> String {
    let tok = Tokenizer::from_dir(model_dir()).unwrap();
    let text = tok
        .render_chat(&pdgate_tokenize::ChatInput {
            messages: messages.as_array().unwrap(),
            tools: None,
            documents: None,
            add_generation_prompt: true,
            continue_final_message: false,
            template_kwargs: None,
        })
        .unwrap();
    let ids = tok.encode(&text, false).unwrap();
    let spec = mock_engine::fake_model::SamplingSpec {
        max_new_tokens: max_tokens,
        ..e.sampling_spec()
    };
    let out = e.reference(&ids, &spec, None);
    tok.decode(&out.token_ids, true).unwrap()
}

fn chat(max_tokens: usize, stream: bool) -> Value {
    json!({"model": "mock-model", "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": "Say something about the weather."}]})
}

fn sse_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

async fn pd_chat_matches_the_reference(engine: EngineKind, ips: ([u8; 4], [u8; 4])) {
    let p = grpc_engine(engine, Role::Prefill, ips.0).await;
    let d = grpc_engine(engine, Role::Decode, ips.1).await;
    let gw = gateway(&p, &d).await;
    let want = reference_text(&d, &chat(8, false)["messages"], 8);
    assert!(!want.is_empty());
    let r = gw.post("/v1/chat/completions", &chat(8, false)).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
    let r = gw.post("/v1/chat/completions", &chat(8, true)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(sse_text(&r.text()), want);
    assert!(r.text().trim_end().ends_with("data: [DONE]"));
    for e in [&p, &d] {
        assert!(e.wait_idle(Duration::from_secs(5)).await, "{:?}", e.rooms());
        let records = e.records();
        assert_eq!(records.len(), 2, "{records:?}");
        assert!(records.iter().all(|r| r.grpc.is_some()));
    }
    eprintln!("{engine:?}: {want:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_grpc_chat_equals_a_single_worker() {
    pd_chat_matches_the_reference(EngineKind::Sglang, ([127, 0, 30, 1], [127, 0, 30, 2])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenspeed_grpc_chat_equals_a_single_worker() {
    pd_chat_matches_the_reference(EngineKind::TokenSpeed, ([127, 0, 30, 3], [127, 0, 30, 4])).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_grpc_chat_equals_a_single_worker() {
    pd_chat_matches_the_reference(EngineKind::Vllm, ([127, 0, 30, 5], [127, 0, 30, 6])).await;
}
