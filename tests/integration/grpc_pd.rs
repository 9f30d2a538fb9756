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
pub(crate) fn model_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("grpc-model");
        fixture::write_model_dir(&dir).expect("write the fixture model");
        dir
    })
    .clone()
}

/// The ids the mocks emit: the fixture's merged tokens (readable text), EOS `<|im_end|>`.
pub(crate) fn vocab() -> OutputVocab {
    OutputVocab::range(256..256 + fixture::MERGES as u32, [fixture::IM_END_ID])
}

async fn grpc_engine(engine: EngineKind, role: Role, ip: [u8; 4]) -> MockEngine {
    let cfg = MockEngineConfig::grpc_test(engine, role, ip).with_vocab(vocab());
    MockEngine::spawn(cfg).await.expect("spawn a gRPC mock")
}

fn spec(e: &MockEngine) -> Value {
    e.worker_spec()
}

async fn gateway(p: &MockEngine, d: &MockEngine) -> Gateway {
    let extra = format!("  model_path: {}\n", model_dir().display());
    let mut gw = Gateway::start(&[spec(p), spec(d)], &extra).await;
    gw.wait_ready().await;
    gw
}

/// What a single worker answers to `messages` (chat template + the fixture tokenizer).
fn reference_text(e: &MockEngine, messages: &Value, max_tokens: usize) -> String {
    let spec = mock_engine::fake_model::SamplingSpec {
        max_new_tokens: max_tokens,
        ..e.sampling_spec()
    };
    decode_ids(&e.reference(&chat_ids(messages), &spec, None).token_ids)
}

fn chat(max_tokens: usize, stream: bool) -> Value {
    json!({"model": "mock-model", "max_tokens": max_tokens, "stream": stream,
        "messages": [{"role": "user", "content": "Say something about the weather."}]})
}

pub(crate) fn sse_text(body: &str) -> String {
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
    gateway_metrics_are_the_grpc_paths(&gw, engine).await;
    eprintln!("{engine:?}: {want:?}");
}

/// After one non-streamed and one streamed chat: the series SMG's gRPC PD router records, with
/// its labels, and only on the pairs the spec's "PD Metrics" table names.
async fn gateway_metrics_are_the_grpc_paths(gw: &Gateway, engine: EngineKind) {
    use crate::harness::metric_value;
    let requests = |m: &str, streaming: &str| {
        metric_value(
            m,
            "smg_router_requests_total",
            &[
                ("router_type", "grpc"),
                ("backend_type", "pd"),
                ("connection_mode", "grpc"),
                ("endpoint", "chat"),
                ("streaming", streaming),
            ],
        )
    };
    // The request series are recorded once the answer has gone out.
    let counted = |m: &str| requests(m, "true") == Some(1.0) && requests(m, "false") == Some(1.0);
    let m = gw.metrics_when(counted).await;
    assert!(counted(&m), "{engine:?}: smg_router_requests_total\n{m}");
    let pd = [("backend_type", "pd")];
    let count = |name: &str| metric_value(&m, name, &pd);
    let parallel = engine != EngineKind::Vllm;
    // TTFT for streamed requests on SGLang and TokenSpeed pairs; prefill duration and the KV
    // window for vLLM.
    assert_eq!(
        count("smg_pd_ttft_seconds_count"),
        parallel.then_some(1.0),
        "{engine:?}\n{m}"
    );
    assert_eq!(
        count("smg_pd_prefill_duration_seconds_count"),
        (!parallel).then_some(2.0),
        "{engine:?}\n{m}"
    );
    assert_eq!(
        count("smg_pd_kv_transfer_duration_seconds_count"),
        (!parallel).then_some(2.0),
        "{engine:?}\n{m}"
    );
    // The router inference series: the streamed request only.
    let inference = [
        ("router_type", "grpc"),
        ("backend_type", "pd"),
        ("endpoint", "chat"),
    ];
    for h in [
        "smg_router_ttft_seconds_count",
        "smg_router_tpot_seconds_count",
        "smg_router_generation_duration_seconds_count",
    ] {
        assert_eq!(
            metric_value(&m, h, &inference),
            Some(1.0),
            "{engine:?} {h}\n{m}"
        );
    }
    for token_type in ["input", "output"] {
        let mut labels = inference.to_vec();
        labels.push(("token_type", token_type));
        let n = metric_value(&m, "smg_router_tokens_total", &labels).unwrap_or(0.0);
        assert!(n > 1.0, "{engine:?} {token_type} tokens: {n}\n{m}");
    }
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

/// The prompt ids a single worker sees for a completions / `/generate` text prompt.
fn prompt_ids(text: &str) -> Vec<u32> {
    Tokenizer::from_dir(model_dir())
        .unwrap()
        .encode(text, true)
        .unwrap()
}

fn decode_ids(ids: &[u32]) -> String {
    Tokenizer::from_dir(model_dir())
        .unwrap()
        .decode(ids, true)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_in_its_own_shape_over_grpc() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 30, 11]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 30, 12]).await;
    let gw = gateway(&p, &d).await;
    let spec = |n| mock_engine::fake_model::SamplingSpec {
        max_new_tokens: n,
        ..d.sampling_spec()
    };

    // Completions: text, usage.
    let want = d.reference(&prompt_ids("Once upon a time"), &spec(6), None);
    let r = gw
        .post(
            "/v1/completions",
            &json!({"model": "mock-model", "prompt": "Once upon a time", "max_tokens": 6}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(
        v["choices"][0]["text"],
        decode_ids(&want.token_ids).as_str()
    );
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64(),
        Some(want.token_ids.len() as u64)
    );
    assert_eq!(
        v["usage"]["prompt_tokens"].as_u64(),
        Some(prompt_ids("Once upon a time").len() as u64)
    );

    // /generate: SGLang's native shape, output ids.
    let r = gw
        .post(
            "/generate",
            &json!({"text": "Once upon a time", "sampling_params": {"max_new_tokens": 6}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["text"], decode_ids(&want.token_ids).as_str());
    assert_eq!(
        v["output_ids"],
        json!(want.token_ids),
        "the engine's ids are passed on"
    );
    assert_eq!(v["meta_info"]["finish_reason"]["type"], "length");

    // /generate with input ids.
    let ids = prompt_ids("Once upon a time");
    let r = gw
        .post(
            "/generate",
            &json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 6}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["output_ids"], json!(want.token_ids));

    // Anthropic messages.
    let messages = json!([{"role": "user", "content": "Say something about the weather."}]);
    let want_chat = reference_text(&d, &messages, 5);
    let r = gw
        .post(
            "/v1/messages",
            &json!({"model": "mock-model", "max_tokens": 5, "messages": messages}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], want_chat.as_str());
    assert_eq!(v["stop_reason"], "max_tokens");
    let r = gw
        .post(
            "/v1/messages",
            &json!({"model": "mock-model", "max_tokens": 5, "messages": messages, "stream": true}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(text.contains("event: message_start"), "{text}");
    assert!(text.contains("event: message_stop"), "{text}");

    // Responses (not stored).
    let r = gw
        .post(
            "/v1/responses",
            &json!({"model": "mock-model", "max_output_tokens": 5, "input": "Say something about the weather.", "store": false}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["object"], "response");
}

fn error_code(r: &mock_engine::client::Response) -> String {
    r.json()["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Makes `e` refuse its next `Generate` with `code` (and `message`, else the mock's text).
pub(crate) async fn refuse_next_generate(
    e: &MockEngine,
    code: mock_engine::GrpcCode,
    message: Option<&str>,
) {
    refuse_generate(e, code, message, Some(1)).await;
}

/// Makes `e` refuse `count` `Generate` calls (`None`: every one until `reset()`) with `code`.
pub(crate) async fn refuse_generate(
    e: &MockEngine,
    code: mock_engine::GrpcCode,
    message: Option<&str>,
    count: Option<u32>,
) {
    e.inject(mock_engine::Fault::GrpcStatus {
        code,
        message: message.map(str::to_string),
        count,
        matcher: Default::default(),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_decode_answers_at_once_and_the_prefill_is_aborted() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 30, 21]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 30, 22]).await;
    let gw = gateway(&p, &d).await;
    refuse_next_generate(
        &d,
        mock_engine::GrpcCode::InvalidArgument,
        Some("bad sampling"),
    )
    .await;
    let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), "decode_worker_failed_to_start");
    assert!(r.text().contains("bad sampling"), "{}", r.text());
    // The prefill was still waiting for its decode: the gateway told it to stop. Both legs carry
    // one request id; the decode's call reached its engine (it answered), the prefill's may have
    // been dropped before it was sent, and is aborted all the same.
    let id = d.records()[0].grpc.as_ref().unwrap().request_id.clone();
    let aborted = p
        .wait_for(Duration::from_secs(5), |e| {
            e.aborts().iter().any(|a| a.request_ids.contains(&id))
        })
        .await;
    assert!(aborted, "no Abort for {id}: {:?}", p.aborts());
    assert!(p.wait_idle(Duration::from_secs(5)).await, "{:?}", p.rooms());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_out_of_room_is_retried() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 30, 27]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 30, 28]).await;
    let gw = gateway(&p, &d).await;
    refuse_next_generate(
        &d,
        mock_engine::GrpcCode::ResourceExhausted,
        Some("no free KV slots"),
    )
    .await;
    let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let calls = d.records().iter().filter(|r| r.grpc.is_some()).count();
    assert_eq!(
        calls,
        2,
        "the refused call and its retry: {:?}",
        d.records()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_prefill_answers_at_once_and_the_waiting_decode_is_not_cut() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 30, 23]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 30, 24]).await;
    let gw = gateway(&p, &d).await;
    refuse_next_generate(
        &p,
        mock_engine::GrpcCode::InvalidArgument,
        Some("prompt too long"),
    )
    .await;
    let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(error_code(&r), "prefill_worker_failed_to_start");
    // The decode was waiting for KV that never comes: the gateway kept its call open until the
    // engine ended it (aborting a decode mid-transfer can crash or leak on the engine).
    let ended = d
        .wait_for(Duration::from_secs(10), |e| {
            e.records()
                .first()
                .is_some_and(|r| r.outcome.grpc_code.is_some() || r.outcome.cancelled)
        })
        .await;
    assert!(ended, "{:?}", d.records());
    let rec = &d.records()[0];
    assert!(
        !rec.outcome.cancelled,
        "the decode was cut while waiting for its KV: {:?}",
        rec.outcome
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_mid_stream_aborts_the_decode() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 30, 25]).await;
    let mut dc = MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Decode, [127, 0, 30, 26])
        .with_vocab(vocab());
    dc.itl_ms = 50;
    let d = MockEngine::spawn(dc).await.unwrap();
    let gw = gateway(&p, &d).await;
    let mut s = gw.stream("/v1/chat/completions", &chat(200, true)).await;
    assert_eq!(s.status, 200);
    let first = s
        .next_chunk()
        .await
        .expect("a first chunk")
        .expect("readable");
    assert!(!first.data.is_empty());
    drop(s);
    let aborted = d
        .wait_for(Duration::from_secs(5), |e| !e.aborts().is_empty())
        .await;
    assert!(aborted, "the decode was not aborted: {:?}", d.records());
    let id = d.records()[0].grpc.as_ref().unwrap().request_id.clone();
    assert!(d.aborts()[0].request_ids.contains(&id));
    assert!(d.wait_idle(Duration::from_secs(5)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_a_non_streamed_request_aborts_the_decode() {
    use tokio::io::AsyncWriteExt;
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 30, 29]).await;
    let mut dc = MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Decode, [127, 0, 30, 30])
        .with_vocab(vocab());
    dc.itl_ms = 50;
    let d = MockEngine::spawn(dc).await.unwrap();
    let gw = gateway(&p, &d).await;
    let body = chat(400, false).to_string();
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", gw.port))
        .await
        .unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: pdgate\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(body.as_bytes()).await.unwrap();
    // The prefill has handed off its KV (it answered) and the decode is generating (400
    // tokens, 50 ms apart: 20 s); the client leaves.
    let handed_off = p
        .wait_for(Duration::from_secs(10), |e| {
            e.records()
                .first()
                .is_some_and(|r| r.outcome.done_at_ms.is_some())
        })
        .await;
    assert!(handed_off, "the prefill never answered: {:?}", p.records());
    // …and the gateway has taken the prefill's answer in (its breaker counted the success).
    let counted = |m: &str| {
        m.lines().any(|l| {
            l.starts_with("smg_worker_cb_outcomes_total")
                && l.contains("127.0.30.29")
                && l.contains("success")
                && l.ends_with(" 1")
        })
    };
    let m = gw.metrics_when(counted).await;
    assert!(counted(&m), "{m}");
    assert!(!d.records().is_empty(), "the decode never got its leg");
    drop(conn);
    let aborted = d
        .wait_for(Duration::from_secs(5), |e| {
            e.records()
                .first()
                .is_some_and(|r| r.outcome.cancelled || r.outcome.grpc_code.is_some())
                || !e.aborts().is_empty()
        })
        .await;
    assert!(
        aborted,
        "the decode still runs 5 s after its client left: {:?}\n{}",
        d.records(),
        gw.log()
    );
    assert!(d.wait_idle(Duration::from_secs(5)).await);
}

async fn vllm_pair(
    connector: mock_engine::Connector,
    ips: ([u8; 4], [u8; 4]),
) -> (MockEngine, MockEngine) {
    let cfg = |role, ip| {
        MockEngineConfig::grpc_test(EngineKind::Vllm, role, ip)
            .with_vocab(vocab())
            .with_connector(connector)
    };
    (
        MockEngine::spawn(cfg(Role::Prefill, ips.0)).await.unwrap(),
        MockEngine::spawn(cfg(Role::Decode, ips.1)).await.unwrap(),
    )
}

fn decode_params(d: &MockEngine) -> Value {
    let rec = d.records().last().cloned().expect("a decode record");
    let json = rec
        .grpc
        .unwrap()
        .kv_transfer_params_json
        .expect("params on the decode leg");
    serde_json::from_str(&json).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_nixl_relays_the_prefill_params_verbatim_and_the_decode_skips_the_prompt() {
    let (p, d) = vllm_pair(
        mock_engine::Connector::Nixl,
        ([127, 0, 31, 1], [127, 0, 31, 2]),
    )
    .await;
    let gw = gateway(&p, &d).await;
    let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let prefill = p.records()[0].grpc.clone().unwrap();
    assert_eq!(
        prefill.sampling.max_new_tokens,
        Some(1),
        "prefill capped at one token"
    );
    assert!(!prefill.stream);
    let tag: Value =
        serde_json::from_str(prefill.kv_transfer_params_json.as_deref().unwrap()).unwrap();
    assert_eq!(
        tag,
        json!({"do_remote_decode": true, "do_remote_prefill": false})
    );
    let params = decode_params(&d);
    assert_eq!(params["do_remote_prefill"], true);
    assert!(params["remote_block_ids"].is_array(), "{params}");
    assert_eq!(params["remote_engine_id"], p.engine_id().as_str());
    let usage = &r.json()["usage"];
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], usage["prompt_tokens"],
        "the decode received the KV: {usage}"
    );
    assert!(
        p.wait_for(Duration::from_secs(5), |e| e.stats().pinned_blocks == 0)
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_mooncake_mints_the_decode_params_from_the_prefill_engine_id() {
    let (p, d) = vllm_pair(
        mock_engine::Connector::Mooncake,
        ([127, 0, 31, 3], [127, 0, 31, 4]),
    )
    .await;
    let gw = gateway(&p, &d).await;
    let want = reference_text(&d, &chat(4, false)["messages"], 4);
    let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
    let tag: Value = serde_json::from_str(
        p.records()[0]
            .grpc
            .as_ref()
            .unwrap()
            .kv_transfer_params_json
            .as_deref()
            .unwrap(),
    )
    .unwrap();
    let tid = tag["transfer_id"]
        .as_str()
        .expect("a minted transfer id")
        .to_string();
    assert!(tid.starts_with("xfer-"));
    let params = decode_params(&d);
    assert_eq!(params["transfer_id"], tid.as_str());
    assert_eq!(params["remote_engine_id"], p.engine_id().as_str());
    assert_eq!(
        params["remote_bootstrap_addr"],
        format!("http://{}:{}", p.host(), p.bootstrap_port().unwrap()).as_str()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_mooncake_without_an_engine_id_sends_the_legacy_bootstrap_fields() {
    // Engines that report no KV engine id (an older servicer).
    let cfg = |role, ip| {
        let mut c = MockEngineConfig::grpc_test(EngineKind::Vllm, role, ip)
            .with_vocab(vocab())
            .with_connector(mock_engine::Connector::Mooncake);
        c.engine_id = Some(String::new());
        c
    };
    let p = MockEngine::spawn(cfg(Role::Prefill, [127, 0, 31, 5]))
        .await
        .unwrap();
    let d = MockEngine::spawn(cfg(Role::Decode, [127, 0, 31, 6]))
        .await
        .unwrap();
    let gw = gateway(&p, &d).await;
    let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let rec = d.records().last().cloned().unwrap().grpc.unwrap();
    assert!(rec.kv_transfer_params_json.is_none(), "{rec:?}");
    let legacy = rec.kv_transfer_params_legacy.expect("legacy typed params");
    assert_eq!(legacy.remote_host, p.host());
    assert_eq!(legacy.remote_port, u32::from(p.bootstrap_port().unwrap()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_is_answered_by_the_gateway_without_any_leg() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 31, 11]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 31, 12]).await;
    let gw = gateway(&p, &d).await;
    let messages = json!([{"role": "user", "content": "Say something about the weather."}]);
    let r = gw
        .post(
            "/v1/messages/count_tokens",
            &json!({"model": "mock-model", "messages": messages}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let tok = Tokenizer::from_dir(model_dir()).unwrap();
    let text = tok
        .render_chat(&pdgate_tokenize::ChatInput::conversation(
            messages.as_array().unwrap(),
        ))
        .unwrap();
    assert_eq!(
        r.json()["input_tokens"].as_u64(),
        Some(tok.encode(&text, false).unwrap().len() as u64)
    );
    assert!(p.records().is_empty() && d.records().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_stop_strings_are_enforced_by_the_gateway_not_sent_to_the_engine() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 31, 13]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 31, 14]).await;
    let gw = gateway(&p, &d).await;
    let full = reference_text(&d, &chat(16, false)["messages"], 16);
    // A stop string from the middle of what the model says (ASCII, so the cut is exact).
    let chars: Vec<char> = full.chars().collect();
    let start = (4..chars.len() - 3)
        .find(|&i| chars[i..i + 3].iter().all(|c| c.is_ascii_alphanumeric()))
        .expect("three ASCII letters in the reference");
    let stop: String = chars[start..start + 3].iter().collect();
    let cut = &full[..full.find(&stop).unwrap()];
    let mut body = chat(16, false);
    body["stop"] = json!([stop]);
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        v["choices"][0]["message"]["content"], cut,
        "stop {stop:?} in {full:?}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let rec = d.records()[0].grpc.clone().unwrap();
    assert!(
        rec.sampling.stop.is_empty(),
        "SGLang's gRPC worker refuses string stops"
    );
    // Streamed, the same text (the stop withheld until it could no longer match).
    body["stream"] = json!(true);
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(sse_text(&r.text()), cut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_leg_is_retried_with_a_new_room_and_request_id() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 31, 15]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 31, 16]).await;
    let gw = gateway(&p, &d).await;
    refuse_next_generate(&p, mock_engine::GrpcCode::Unavailable, None).await;
    let want = reference_text(&d, &chat(4, false)["messages"], 4);
    let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
    let ids: Vec<_> = p
        .records()
        .iter()
        .map(|r| r.grpc.clone().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "one refused attempt, one retry");
    assert_ne!(
        ids[0].request_id, ids[1].request_id,
        "a retry never reuses an engine id"
    );
    assert_ne!(
        ids[0].bootstrap.as_ref().map(|b| b.room),
        ids[1].bootstrap.as_ref().map(|b| b.room),
        "a retry mints a new room"
    );
    let base = r.json()["id"].as_str().unwrap().to_string();
    assert!(
        ids[1].request_id.starts_with(&format!("{base}-")),
        "{} vs {base}",
        ids[1].request_id
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_leaving_during_the_prefill_aborts_the_prefill_at_once() {
    use mock_engine::Fault;
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 31, 17]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 31, 18]).await;
    let gw = gateway(&p, &d).await;
    p.inject(Fault::Hang {
        count: Some(1),
        matcher: Default::default(),
    })
    .await;
    let r = gw
        .post_and_give_up(
            "/v1/chat/completions",
            &chat(4, false),
            Duration::from_millis(500),
        )
        .await;
    assert!(r.is_err(), "the client gave up first");
    let started = p
        .wait_for(Duration::from_secs(5), |e| !e.records().is_empty())
        .await;
    assert!(started);
    let id = p.records()[0].grpc.as_ref().unwrap().request_id.clone();
    let aborted = p
        .wait_for(Duration::from_secs(5), |e| {
            e.aborts().iter().any(|a| a.request_ids.contains(&id))
        })
        .await;
    assert!(
        aborted,
        "the hanging prefill was not aborted: {:?}",
        p.records()
    );
    assert!(p.wait_idle(Duration::from_secs(5)).await, "{:?}", p.rooms());
}

/// The generated text of a response of `route` (JSON, or SSE when `stream`).
fn response_text(route: &str, stream: bool, body: &str) -> String {
    let pick = |v: &Value| -> Option<String> {
        match route {
            "/v1/chat/completions" => v["choices"][0][if stream { "delta" } else { "message" }]
                ["content"]
                .as_str()
                .map(str::to_string),
            "/v1/completions" => v["choices"][0]["text"].as_str().map(str::to_string),
            "/generate" => v["text"].as_str().map(str::to_string),
            "/v1/messages" => {
                if stream {
                    v["delta"]["text"].as_str().map(str::to_string)
                } else {
                    v["content"][0]["text"].as_str().map(str::to_string)
                }
            }
            "/v1/responses" => {
                if stream {
                    (v["type"] == "response.output_text.delta")
                        .then(|| v["delta"].as_str().map(str::to_string))
                        .flatten()
                } else {
                    v["output"][0]["content"][0]["text"]
                        .as_str()
                        .map(str::to_string)
                }
            }
            _ => None,
        }
    };
    if !stream {
        return serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| pick(&v))
            .unwrap_or_default();
    }
    let mut text = String::new();
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if let Ok(v) = serde_json::from_str::<Value>(data) {
            if let Some(t) = pick(&v) {
                if route == "/generate" {
                    text = t; // SGLang streams cumulative text
                } else {
                    text.push_str(&t);
                }
            }
        }
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_engine_every_route_streamed_or_not_equals_a_single_worker() {
    let messages = json!([{"role": "user", "content": "Tell me about the sea."}]);
    let prompt = "The sea is";
    for (i, engine) in [EngineKind::Sglang, EngineKind::Vllm, EngineKind::TokenSpeed]
        .into_iter()
        .enumerate()
    {
        let ip = |n: u8| [127, 0, 32, (i as u8) * 2 + n];
        let p = grpc_engine(engine, Role::Prefill, ip(1)).await;
        let d = grpc_engine(engine, Role::Decode, ip(2)).await;
        let gw = gateway(&p, &d).await;
        let spec = mock_engine::fake_model::SamplingSpec {
            max_new_tokens: 6,
            ..d.sampling_spec()
        };
        let from_prompt = decode_ids(&d.reference(&prompt_ids(prompt), &spec, None).token_ids);
        let from_chat = reference_text(&d, &messages, 6);
        let cases = [
            (
                "/v1/chat/completions",
                json!({"model": "mock-model", "messages": messages, "max_tokens": 6}),
                &from_chat,
            ),
            (
                "/v1/completions",
                json!({"model": "mock-model", "prompt": prompt, "max_tokens": 6}),
                &from_prompt,
            ),
            (
                "/generate",
                json!({"text": prompt, "sampling_params": {"max_new_tokens": 6}}),
                &from_prompt,
            ),
            (
                "/v1/messages",
                json!({"model": "mock-model", "messages": messages, "max_tokens": 6}),
                &from_chat,
            ),
            (
                "/v1/responses",
                json!({"model": "mock-model", "input": messages, "max_output_tokens": 6, "store": false}),
                &from_chat,
            ),
        ];
        for (route, body, want) in &cases {
            for stream in [false, true] {
                let mut body = body.clone();
                body["stream"] = json!(stream);
                let r = gw.post(route, &body).await;
                assert_eq!(
                    r.status,
                    200,
                    "{engine:?} {route} stream={stream}: {}",
                    r.text()
                );
                assert_eq!(
                    &response_text(route, stream, &r.text()),
                    *want,
                    "{engine:?} {route} stream={stream}: {}",
                    r.text()
                );
            }
        }
        for e in [&p, &d] {
            assert!(
                e.wait_idle(Duration::from_secs(5)).await,
                "{engine:?}: {:?}",
                e.rooms()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_ends_with_a_usage_chunk_when_asked() {
    let p = grpc_engine(EngineKind::TokenSpeed, Role::Prefill, [127, 0, 32, 21]).await;
    let d = grpc_engine(EngineKind::TokenSpeed, Role::Decode, [127, 0, 32, 22]).await;
    let gw = gateway(&p, &d).await;
    let mut body = chat(5, true);
    body["stream_options"] = json!({"include_usage": true});
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events: Vec<Value> = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let usage = events.last().expect("events")["usage"].clone();
    assert_eq!(usage["completion_tokens"], 5, "{usage}");
    assert!(usage["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + 5)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_come_back_with_the_token_texts() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 32, 23]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 32, 24]).await;
    let gw = gateway(&p, &d).await;
    let mut body = chat(4, false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let content = v["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap_or_else(|| panic!("no logprobs: {v}"))
        .clone();
    assert_eq!(content.len(), 4, "{v}");
    let text: String = content
        .iter()
        .map(|c| c["token"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        text,
        v["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert!(content
        .iter()
        .all(|c| c["logprob"].as_f64().unwrap() <= 0.0));
    assert!(content
        .iter()
        .all(|c| c["top_logprobs"].as_array().unwrap().len() == 2));
    let rec = d.records()[0].grpc.clone().unwrap();
    assert!(rec.return_logprob);
    assert_eq!(rec.top_logprobs_num, 2);
}

/// TokenSpeed places a request by `bootstrap_room % dp_size`: under `--dp-aware` every room the
/// gateway mints lands on the prefill rank it routed to (and the legs carry their ranks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenspeed_rooms_land_on_the_routed_prefill_rank() {
    let spawn = |role, ip: [u8; 4], dp| {
        let mut c =
            MockEngineConfig::grpc_test(EngineKind::TokenSpeed, role, ip).with_vocab(vocab());
        c.dp_size = dp;
        MockEngine::spawn(c)
    };
    let p = spawn(Role::Prefill, [127, 0, 32, 31], 4).await.unwrap();
    let d = spawn(Role::Decode, [127, 0, 32, 32], 2).await.unwrap();
    let extra = format!(
        "  model_path: {}\n  dp_aware: true\n",
        model_dir().display()
    );
    let gw = Gateway::start(&[spec(&p), spec(&d)], &extra).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let v = gw.get("/workers").await.json();
        let ready = v["workers"]
            .as_array()
            .is_some_and(|l| l.len() == 6 && l.iter().all(|w| w["status"] == "ready"));
        if ready {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the 6 DP-rank workers never became ready: {v}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    for _ in 0..12 {
        let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for rec in p.records() {
        let g = rec.grpc.unwrap();
        let room = g.bootstrap.as_ref().expect("a room").room;
        let rank = g
            .data_parallel_rank
            .expect("the prefill leg carries its rank");
        assert!(room >= 0, "a 63-bit room: {room}");
        assert_eq!(room % 4, i64::from(rank), "room {room} on rank {rank}");
    }
    let ranks: std::collections::BTreeSet<_> = p
        .records()
        .iter()
        .filter_map(|r| r.grpc.as_ref().and_then(|g| g.data_parallel_rank))
        .collect();
    assert!(ranks.len() > 1, "round robin spreads over ranks: {ranks:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moriio_over_grpc_is_refused_with_501() {
    let (p, d) = vllm_pair(
        mock_engine::Connector::Nixl,
        ([127, 0, 32, 41], [127, 0, 32, 42]),
    )
    .await;
    let mori = |e: &MockEngine| {
        let mut s = spec(e);
        s["kv_connector"] = json!("MoRIIOConnector");
        s["labels"]["kv_connector"] = json!("MoRIIOConnector");
        s["labels"]["moriio_mode"] = json!("read");
        s
    };
    let extra = format!("  model_path: {}\n", model_dir().display());
    let mut gw = Gateway::start(&[mori(&p), mori(&d)], &extra).await;
    gw.wait_ready().await;
    let r = gw.post("/v1/chat/completions", &chat(2, false)).await;
    assert_eq!(r.status, 501, "{}", r.text());
    assert_eq!(error_code(&r), "moriio_grpc_pd_unsupported");
    assert!(p.records().is_empty() && d.records().is_empty());
}

/// The prompt ids of `chat(..)`'s messages, as the gateway renders and tokenizes them.
fn chat_ids(messages: &Value) -> Vec<u32> {
    let tok = Tokenizer::from_dir(model_dir()).unwrap();
    let text = tok
        .render_chat(&pdgate_tokenize::ChatInput::conversation(
            messages.as_array().unwrap(),
        ))
        .unwrap();
    tok.encode(&text, false).unwrap()
}

/// Per-choice texts of a chat response (JSON, or SSE with indexed chunks).
fn choice_texts(body: &str, stream: bool, n: usize) -> Vec<String> {
    let mut texts = vec![String::new(); n];
    let mut add = |v: &Value| {
        for c in v["choices"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap() as usize;
            let t = if stream {
                c["delta"]["content"].as_str()
            } else {
                c["message"]["content"].as_str()
            };
            texts[i].push_str(t.unwrap_or_default());
        }
    };
    if stream {
        for d in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if let Ok(v) = serde_json::from_str::<Value>(d) {
                add(&v);
            }
        }
    } else {
        add(&serde_json::from_str(body).unwrap());
    }
    texts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_samples_fan_out_into_their_own_rooms_and_merge() {
    for (i, engine) in [EngineKind::Sglang, EngineKind::TokenSpeed]
        .into_iter()
        .enumerate()
    {
        let ip = |n: u8| [127, 0, 33, (i as u8) * 2 + n];
        let p = grpc_engine(engine, Role::Prefill, ip(1)).await;
        let d = grpc_engine(engine, Role::Decode, ip(2)).await;
        let gw = gateway(&p, &d).await;
        let messages = chat(5, false)["messages"].clone();
        let ids = chat_ids(&messages);
        // TokenSpeed: a pinned seed, offset by the sample index, makes the samples differ.
        let seed = (engine == EngineKind::TokenSpeed).then_some(7u64);
        let want: Vec<String> = (0..3)
            .map(|s| {
                let spec = mock_engine::fake_model::SamplingSpec {
                    max_new_tokens: 5,
                    seed: seed.map(|v| v + s),
                    ..d.sampling_spec()
                };
                decode_ids(&d.reference(&ids, &spec, None).token_ids)
            })
            .collect();
        for stream in [false, true] {
            let mut body = chat(5, stream);
            body["n"] = json!(3);
            if let Some(seed) = seed {
                body["seed"] = json!(seed);
            }
            let before = d.records().len();
            let r = gw.post("/v1/chat/completions", &body).await;
            assert_eq!(r.status, 200, "{engine:?}: {}", r.text());
            assert_eq!(
                choice_texts(&r.text(), stream, 3),
                want,
                "{engine:?} stream={stream}"
            );
            if !stream {
                assert_eq!(r.json()["usage"]["completion_tokens"], 15, "{}", r.text());
            }
            let recs: Vec<_> = d.records()[before..]
                .iter()
                .map(|r| r.grpc.clone().unwrap())
                .collect();
            assert_eq!(recs.len(), 3, "one decode leg per sample");
            let rooms: std::collections::BTreeSet<_> = recs
                .iter()
                .map(|g| g.bootstrap.as_ref().unwrap().room)
                .collect();
            assert_eq!(rooms.len(), 3, "each sample has its own room");
            assert!(recs.iter().all(|g| g.sampling.n == 1));
            let mut suffixes: Vec<_> = recs
                .iter()
                .map(|g| g.request_id.rsplit('-').next().unwrap().to_string())
                .collect();
            suffixes.sort();
            assert_eq!(suffixes, ["0", "1", "2"]);
        }
        assert!(d.wait_idle(Duration::from_secs(5)).await, "{:?}", d.rooms());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sample_failing_fails_the_request_and_drops_the_others() {
    use mock_engine::{Fault, GrpcCode};
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 33, 11]).await;
    let mut dc = MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Decode, [127, 0, 33, 12])
        .with_vocab(vocab());
    dc.itl_ms = 20;
    let d = MockEngine::spawn(dc).await.unwrap();
    // No retry: the failed attempt is the answer.
    let extra = format!(
        "  model_path: {}\n  retry_max_retries: 0\n",
        model_dir().display()
    );
    let mut gw = Gateway::start(&[spec(&p), spec(&d)], &extra).await;
    gw.wait_ready().await;
    d.inject(Fault::FailAfterTokens {
        tokens: 1,
        code: GrpcCode::Internal,
        message: Some("sample broke".into()),
        count: Some(1),
        matcher: Default::default(),
    })
    .await;
    // Streamed: every sample's decode has started generating when one of them breaks (a
    // non-streamed decode that produced nothing is left to finish: its KV may be arriving).
    let mut body = chat(200, true);
    body["n"] = json!(3);
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200);
    assert!(
        r.text().contains("sample broke"),
        "the stream ends with the error: {}",
        r.text()
    );
    assert!(r.text().trim_end().ends_with("data: [DONE]"));
    // The other samples' decodes were aborted (they were generating 200 tokens).
    let dropped = d
        .wait_for(Duration::from_secs(10), |e| {
            e.records()
                .iter()
                .filter(|r| r.outcome.aborted || r.outcome.cancelled)
                .count()
                >= 2
        })
        .await;
    assert!(
        dropped,
        "{:?}",
        d.records().iter().map(|r| &r.outcome).collect::<Vec<_>>()
    );
    assert!(d.wait_idle(Duration::from_secs(5)).await, "{:?}", d.rooms());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_n_samples_run_on_the_decode_without_a_handoff() {
    let (p, d) = vllm_pair(
        mock_engine::Connector::Nixl,
        ([127, 0, 33, 13], [127, 0, 33, 14]),
    )
    .await;
    let gw = gateway(&p, &d).await;
    let messages = chat(4, false)["messages"].clone();
    let ids = chat_ids(&messages);
    let spec = mock_engine::fake_model::SamplingSpec {
        max_new_tokens: 4,
        ..d.sampling_spec()
    };
    let want: Vec<String> = (0..2)
        .map(|s| decode_ids(&d.reference(&ids, &spec, Some(s)).token_ids))
        .collect();
    let mut body = chat(4, false);
    body["n"] = json!(2);
    let r = gw.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(choice_texts(&r.text(), false, 2), want);
    let prefill = p.records()[0].grpc.clone().unwrap();
    assert!(
        prefill.kv_transfer_params_json.is_none(),
        "untagged prefill"
    );
    let decode = d.records()[0].grpc.clone().unwrap();
    assert_eq!(decode.sampling.n, 2);
    assert!(
        decode.kv_transfer_params_json.is_none(),
        "no handoff for n > 1"
    );
    let m = gw.metrics().await;
    assert_eq!(
        crate::harness::metric_value(
            &m,
            "smg_pd_kv_connector_mode_total",
            &[("mode", "passthrough")]
        ),
        Some(1.0)
    );
}

/// `--tokenizer-cache-enable-l0/-l1`: a multi-turn chat whose system prompt and first turn come
/// back, the same chat again (whole-prompt hit) and a long one. The prefill receives exactly the
/// ids the tokenizer gives without caches, and the answers equal a single worker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenizer_caches_change_no_id() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 34, 1]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 34, 2]).await;
    let extra = format!(
        "  model_path: {}\n  tokenizer_cache_enable_l0: true\n  tokenizer_cache_enable_l1: true\n  \
         tokenizer_cache_l1_max_memory: 4096\n",
        model_dir().display()
    );
    let mut gw = Gateway::start(&[spec(&p), spec(&d)], &extra).await;
    gw.wait_ready().await;
    assert!(
        gw.log().contains("caches L0 10000 prompts, L1 4096 bytes"),
        "{}",
        gw.log()
    );
    let system = json!({"role": "system", "content": "You are terse. Answer in one line, please."});
    let turn = |text: &str| json!({"role": "user", "content": text});
    let reply = json!({"role": "assistant", "content": "It is sunny, with a light breeze."});
    let long = "the weather is fine and the sea is calm; ".repeat(60);
    let chats = [
        json!([system, turn("Say something about the weather.")]),
        json!([
            system,
            turn("Say something about the weather."),
            reply,
            turn("And tomorrow?")
        ]),
        json!([
            system,
            turn("Say something about the weather."),
            reply,
            turn("And tomorrow?")
        ]),
        // Longer than the L1 budget: served uncached, still right.
        json!([system, turn(&long)]),
        json!([
            turn("  leading spaces, trailing too  "),
            reply,
            turn("\n\nnewlines\n")
        ]),
    ];
    for (i, messages) in chats.iter().enumerate() {
        let body = json!({"model": "mock-model", "max_tokens": 6, "stream": i % 2 == 1,
            "messages": messages});
        let r = gw.post("/v1/chat/completions", &body).await;
        assert_eq!(r.status, 200, "{}\n{}", r.text(), gw.log());
        let want = reference_text(&d, messages, 6);
        let got = if i % 2 == 1 {
            sse_text(&r.text())
        } else {
            r.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(got, want, "chat {i}");
    }
    assert!(p.wait_idle(Duration::from_secs(5)).await);
    let sent: Vec<Vec<u32>> = p
        .records()
        .iter()
        .map(|r| r.grpc.as_ref().expect("a gRPC record").input_ids.clone())
        .collect();
    let want: Vec<Vec<u32>> = chats.iter().map(chat_ids).collect();
    assert_eq!(sent, want);
}

/// The legs' HTTP/2 connection to a worker that went away and came back on the same address is
/// made again: once the engine is back, requests succeed without restarting the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_comes_back_is_reconnected() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 34, 3]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 34, 4]).await;
    let gw = gateway(&p, &d).await;
    let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let port = d.port();
    d.kill();
    // The killed engine's listener closes asynchronously: bind again until the port is free.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let back = loop {
        let cfg = MockEngineConfig {
            port,
            ..MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Decode, [127, 0, 34, 4])
                .with_vocab(vocab())
        };
        match MockEngine::spawn(cfg).await {
            Ok(e) => break e,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("not yet: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("the decode could not come back on port {port}: {e}"),
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let answered = loop {
        let r = gw.post("/v1/chat/completions", &chat(4, false)).await;
        if r.status == 200 {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        answered,
        "no answer after the decode came back\n{}",
        gw.log()
    );
    assert!(back.wait_idle(Duration::from_secs(5)).await);
    assert!(
        !back.records().is_empty(),
        "the new decode served the request"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_loads_reads_each_servicer_s_get_loads() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 30, 31]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 30, 32]).await;
    let gw = gateway(&p, &d).await;
    let r = gw.get("/get_loads").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let body = r.json();
    let mut rows: Vec<(String, i64)> = body["loads"]
        .as_array()
        .expect("loads")
        .iter()
        .map(|l| {
            assert!(l["num_waiting_reqs"].is_u64(), "{body}");
            (
                l["worker_type"].as_str().unwrap().to_string(),
                l["dp_rank"].as_i64().unwrap(),
            )
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        vec![("decode".to_string(), 0), ("prefill".to_string(), 0)],
        "{body}"
    );
    assert_eq!(body["aggregate"]["avg_utilization"].to_string(), "0.0");
}

/// A gateway on `p` and `d` with `prefill_head_timeout_secs: 1`, whose prefill takes every call
/// and never answers (a wedged engine, or one waiting for a decode that never takes its KV):
/// a request, streamed or not, is answered 504 `timeout` naming the bound, and each given-up
/// prefill is aborted. The gateway is returned so the caller can check the decode before it
/// stops.
async fn a_silent_prefill_times_out(p: &MockEngine, d: &MockEngine) -> Gateway {
    use mock_engine::Fault;
    let extra = format!(
        "  model_path: {}\n  retry_max_retries: 0\n  prefill_head_timeout_secs: 1\n",
        model_dir().display()
    );
    let mut gw = Gateway::start(&[spec(p), spec(d)], &extra).await;
    gw.wait_ready().await;
    p.inject(Fault::Hang {
        count: None,
        matcher: Default::default(),
    })
    .await;
    for stream in [false, true] {
        let r = gw.post("/v1/chat/completions", &chat(4, stream)).await;
        assert_eq!(r.status, 504, "stream {stream}: {}", r.text());
        assert_eq!(error_code(&r), "timeout", "{}", r.text());
        assert!(
            r.text().contains("prefill_head_timeout_secs"),
            "{}",
            r.text()
        );
    }
    assert!(
        p.wait_for(Duration::from_secs(5), |e| e.aborts().len() >= 2)
            .await,
        "{:?}",
        p.aborts()
    );
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_prefill_is_given_up_at_prefill_head_timeout() {
    // The decode gives up on its KV after 6 s (so without the bound the answer would be its
    // 500, not the gateway's 504 at 1 s; without the bound the request waited for the
    // engine's own bootstrap timeout, or request_timeout_secs).
    let spawn = |role, ip, wait| {
        let mut c = MockEngineConfig::grpc_test(EngineKind::Sglang, role, ip).with_vocab(vocab());
        c.bootstrap_timeout = Duration::from_secs(wait);
        MockEngine::spawn(c)
    };
    let p = spawn(Role::Prefill, [127, 0, 30, 33], 60).await.unwrap();
    let d = spawn(Role::Decode, [127, 0, 30, 34], 6).await.unwrap();
    let _gw = a_silent_prefill_times_out(&p, &d).await;
    // The decode, which never got its KV, ended too.
    assert!(
        d.wait_idle(Duration::from_secs(35)).await,
        "{:?}",
        d.rooms()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_vllm_prefill_is_given_up_at_prefill_head_timeout() {
    // vLLM's legs are sequential: the decode is not sent until the prefill answers, so the
    // bound is the only thing that ends a prefill that never does.
    let p = grpc_engine(EngineKind::Vllm, Role::Prefill, [127, 0, 30, 35]).await;
    let d = grpc_engine(EngineKind::Vllm, Role::Decode, [127, 0, 30, 36]).await;
    let _gw = a_silent_prefill_times_out(&p, &d).await;
    // The decode was never asked.
    assert!(d.aborts().is_empty(), "{:?}", d.aborts());
}
