//! Helpers of the gRPC mock tests: engines with a small output vocabulary, clients, and a
//! reader that collects a `Generate` stream.

use std::time::Duration;

use mock_engine::{EngineKind, MockEngine, MockEngineConfig, OutputVocab, Role};
use tonic::transport::Channel;
use tonic::{Response, Status, Streaming};

pub use pdgate_proto::{sglang, tokenspeed, vllm};

/// The ids the test models emit: 1000..1100, EOS 7.
pub fn vocab() -> OutputVocab {
    OutputVocab::range(1000..1100, [7])
}

pub fn grpc_config(engine: EngineKind, role: Role, ip: [u8; 4]) -> MockEngineConfig {
    MockEngineConfig::grpc_test(engine, role, ip).with_vocab(vocab())
}

pub async fn grpc_engine(engine: EngineKind, role: Role, ip: [u8; 4]) -> MockEngine {
    MockEngine::spawn(grpc_config(engine, role, ip))
        .await
        .expect("spawn gRPC mock engine")
}

pub async fn channel(e: &MockEngine) -> Channel {
    Channel::from_shared(e.api_url())
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect to the mock engine")
}

pub async fn sglang_client(
    e: &MockEngine,
) -> sglang::sglang_scheduler_client::SglangSchedulerClient<Channel> {
    sglang::sglang_scheduler_client::SglangSchedulerClient::new(channel(e).await)
}

pub async fn vllm_client(e: &MockEngine) -> vllm::vllm_engine_client::VllmEngineClient<Channel> {
    vllm::vllm_engine_client::VllmEngineClient::new(channel(e).await)
}

pub async fn tokenspeed_client(
    e: &MockEngine,
) -> tokenspeed::token_speed_scheduler_client::TokenSpeedSchedulerClient<Channel> {
    tokenspeed::token_speed_scheduler_client::TokenSpeedSchedulerClient::new(channel(e).await)
}

/// Every message of a call, or the status it ended with (the call's own or a stream item's).
pub async fn collect<T>(
    call: impl std::future::Future<Output = Result<Response<Streaming<T>>, Status>>,
) -> Result<Vec<T>, Status> {
    let mut stream = call.await?.into_inner();
    let mut out = Vec::new();
    while let Some(m) = stream.message().await? {
        out.push(m);
    }
    Ok(out)
}

/// A SGLang request with the explicit sampling defaults a gateway sends.
pub fn sglang_request(
    rid: &str,
    prompt: &[u32],
    max_new_tokens: u32,
    stream: bool,
) -> sglang::GenerateRequest {
    sglang::GenerateRequest {
        request_id: rid.into(),
        tokenized: Some(sglang::TokenizedInput {
            original_text: String::new(),
            input_ids: prompt.to_vec(),
        }),
        sampling_params: Some(sglang::SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            repetition_penalty: 1.0,
            max_new_tokens: Some(max_new_tokens),
            skip_special_tokens: true,
            ..Default::default()
        }),
        logprob_start_len: -1,
        stream,
        ..Default::default()
    }
}

pub fn sglang_pd(req: &mut sglang::GenerateRequest, p: &MockEngine, room: i32) {
    req.disaggregated_params = Some(sglang::DisaggregatedParams {
        bootstrap_host: p.host(),
        bootstrap_port: p.bootstrap_port().expect("prefill bootstrap port") as i32,
        bootstrap_room: room,
    });
}

pub fn tokenspeed_request(
    rid: &str,
    prompt: &[u32],
    max_new_tokens: u32,
    stream: bool,
) -> tokenspeed::GenerateRequest {
    tokenspeed::GenerateRequest {
        request_id: rid.into(),
        tokenized: Some(tokenspeed::TokenizedInput {
            input_ids: prompt.to_vec(),
            original_text: String::new(),
        }),
        sampling_params: Some(tokenspeed::SamplingParams {
            temperature: Some(1.0),
            top_p: Some(1.0),
            top_k: Some(-1),
            max_new_tokens: Some(max_new_tokens),
            skip_special_tokens: true,
            ..Default::default()
        }),
        stream,
        ..Default::default()
    }
}

pub fn tokenspeed_pd(req: &mut tokenspeed::GenerateRequest, p: &MockEngine, room: i64) {
    req.kv_bootstrap_info = Some(tokenspeed::KvBootstrapInfo {
        bootstrap_host: p.host(),
        bootstrap_port: p.bootstrap_port().expect("prefill bootstrap port") as i32,
        bootstrap_room: room,
    });
}

pub fn vllm_request(
    rid: &str,
    prompt: &[u32],
    max_tokens: u32,
    stream: bool,
) -> vllm::GenerateRequest {
    vllm::GenerateRequest {
        request_id: rid.into(),
        input: Some(vllm::generate_request::Input::Tokenized(
            vllm::TokenizedInput {
                original_text: String::new(),
                input_ids: prompt.to_vec(),
            },
        )),
        sampling_params: Some(vllm::SamplingParams {
            temperature: Some(1.0),
            top_p: 1.0,
            repetition_penalty: 1.0,
            max_tokens: Some(max_tokens),
            skip_special_tokens: true,
            ..Default::default()
        }),
        stream,
        ..Default::default()
    }
}

/// A positive int32 room (what a gateway mints for SGLang).
pub fn room32() -> i32 {
    (rand::random::<u32>() & 0x7fff_fffe) as i32
}

/// A 63-bit room (TokenSpeed).
pub fn room63() -> i64 {
    (rand::random::<u64>() & (i64::MAX as u64)) as i64
}

/// `fn $name(messages) -> (chunks, completes)` for one engine's proto module.
macro_rules! split_messages {
    ($name:ident, $proto:ident) => {
        /// Splits a call's messages into its chunks and its completes.
        pub fn $name(
            msgs: Vec<$proto::GenerateResponse>,
        ) -> (
            Vec<$proto::GenerateStreamChunk>,
            Vec<$proto::GenerateComplete>,
        ) {
            use $proto::generate_response::Response;
            let mut chunks = Vec::new();
            let mut completes = Vec::new();
            for m in msgs {
                match m.response {
                    Some(Response::Chunk(c)) => chunks.push(c),
                    Some(Response::Complete(c)) => completes.push(c),
                    None => panic!("a message without a response"),
                }
            }
            (chunks, completes)
        }
    };
}

split_messages!(sglang_parts, sglang);
split_messages!(tokenspeed_parts, tokenspeed);
split_messages!(vllm_parts, vllm);
