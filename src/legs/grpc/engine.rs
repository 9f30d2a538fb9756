//! The three engines' `Generate` and `Abort` RPCs behind one shape: a request built for one
//! engine, a response stream read as engine-neutral [`Message`]s, and an abort by request id.
//!
//! What differs per engine stays here (digest §1.3–1.5, §1.7): vLLM's response has no request
//! id and its `Abort` takes a list; its chunk counters are per message, SGLang's and
//! TokenSpeed's are running totals. In stream mode a `complete` repeats only the last delta in
//! `output_ids` (the servicers' code), so the stream's tokens come from the chunks.

use bytes::Bytes;
use http::uri::PathAndQuery;
use pdgate_proto::{sglang, tokenspeed, vllm};
use tonic::{Status, Streaming};

use super::channel::LegChannel;
use super::prompt_wire::{LegCodec, Outgoing};

use crate::config::RuntimeType;

/// An engine with a PD protocol over gRPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Sglang,
    Vllm,
    TokenSpeed,
}

impl Engine {
    /// The engine of a runtime; `None` for runtimes without a PD protocol.
    pub fn of(runtime: RuntimeType) -> Option<Engine> {
        match runtime {
            RuntimeType::Sglang => Some(Engine::Sglang),
            RuntimeType::Vllm => Some(Engine::Vllm),
            RuntimeType::Tokenspeed => Some(Engine::TokenSpeed),
            _ => None,
        }
    }

    /// Whether chunk counters are running totals (else per message).
    fn cumulative_counts(self) -> bool {
        self != Engine::Vllm
    }

    /// Whether this engine's prefill request finishes only after its KV was sent (SGLang's
    /// finishes once the transfer succeeded). Then a decode whose prefill answered has no
    /// transfer left to cut. TokenSpeed's is not known to; vLLM's legs are sequential.
    pub fn prefill_ends_after_kv_sent(self) -> bool {
        self == Engine::Sglang
    }
}

/// A `GenerateRequest` for one engine: its message without the prompt field, and that field
/// encoded once per request ([`super::prompt_wire`]; empty when the message has its own input).
pub struct GenerateRequest {
    pub msg: EngineRequest,
    pub prompt: Bytes,
}

/// One engine's `GenerateRequest` message.
pub enum EngineRequest {
    Sglang(Box<sglang::GenerateRequest>),
    Vllm(Box<vllm::GenerateRequest>),
    TokenSpeed(Box<tokenspeed::GenerateRequest>),
}

/// Logprobs of output tokens, as the engines report them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OutputLogprobs {
    pub token_logprobs: Vec<f32>,
    pub token_ids: Vec<u32>,
    /// Per position: (logprobs, token ids) of the alternatives.
    pub top: Vec<(Vec<f32>, Vec<u32>)>,
}

/// The stop an engine reports having matched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineStop {
    TokenId(u32),
    Text(String),
}

/// New tokens of one choice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chunk {
    pub index: u32,
    pub token_ids: Vec<u32>,
    pub prompt_tokens: u32,
    /// Running total (converted for vLLM, whose chunks count per message).
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub logprobs: Option<OutputLogprobs>,
}

/// The end of one choice.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Complete {
    pub index: u32,
    /// All output ids in a non-streamed call; in a stream only the last delta (ignored there).
    pub output_ids: Vec<u32>,
    pub finish_reason: String,
    pub matched: Option<EngineStop>,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub logprobs: Option<OutputLogprobs>,
    /// vLLM: the handoff a prefill returns (`None` when absent or empty).
    pub kv_transfer_params_json: Option<String>,
    /// vLLM: what a prefill learned processing the request's media itself (worker-side
    /// multimodal processing), for the decode.
    pub media_identity: Option<Box<pdgate_proto::vllm::MediaIdentity>>,
}

/// One response message. The `Complete` (once a stream, and the larger variant: its strings
/// and its ids besides a `Chunk`'s fields) is boxed: every message is moved up through the
/// stream, the leg and the relay, and each move copies the enum whole.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Chunk(Chunk),
    Complete(Box<Complete>),
}

/// A `Generate` response stream.
pub struct ResponseStream {
    engine: Engine,
    inner: Inner,
    /// vLLM: completion tokens so far per choice (its chunks count per message).
    totals: Vec<u32>,
}

enum Inner {
    Sglang(Streaming<sglang::GenerateResponse>),
    Vllm(Streaming<vllm::GenerateResponse>),
    TokenSpeed(Streaming<tokenspeed::GenerateResponse>),
}

/// W3C trace context a traced leg sends as gRPC metadata: `traceparent`, and `tracestate` when
/// there is one.
pub type TraceMetadata = Option<(http::HeaderValue, Option<http::HeaderValue>)>;

/// `msg` as a `tonic::Request`, with the leg's trace context in its metadata.
fn with_trace<T>(msg: T, trace: &TraceMetadata) -> tonic::Request<T> {
    let mut request = tonic::Request::new(msg);
    if let Some((parent, state)) = trace {
        let md = request.metadata_mut();
        let ascii = |v: &http::HeaderValue| {
            v.to_str()
                .ok()
                .and_then(|s| s.parse::<tonic::metadata::AsciiMetadataValue>().ok())
        };
        if let Some(v) = ascii(parent) {
            md.insert("traceparent", v);
        }
        if let Some(v) = state.as_ref().and_then(ascii) {
            md.insert("tracestate", v);
        }
    }
    request
}

/// Starts `Generate` on `channel`. Resolves when the server's response headers arrive — with
/// the Python grpc.aio servicers, together with the first message (or the error). `trace`: the
/// leg's trace context, when it is traced.
pub async fn generate(
    channel: LegChannel,
    req: GenerateRequest,
    trace: TraceMetadata,
) -> Result<ResponseStream, Status> {
    // The generated clients' `generate`, with the codec that appends the shared prompt. The
    // message stays in its box down to the encoder (prost encodes a `Box<M>` as the `M`): moved
    // out, it was copied whole at each step (~1.8 KB an SGLang leg).
    async fn call<M, R>(
        channel: LegChannel,
        path: &'static str,
        msg: M,
        prompt: Bytes,
        trace: &TraceMetadata,
    ) -> Result<Streaming<R>, Status>
    where
        M: prost::Message + Send + 'static,
        R: prost::Message + Default + Send + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| Status::unknown(format!("Service was not ready: {e}")))?;
        let request = with_trace(Outgoing { msg, prompt }, trace);
        let response = grpc
            .server_streaming(
                request,
                PathAndQuery::from_static(path),
                LegCodec::<M, R>::default(),
            )
            .await?;
        Ok(response.into_inner())
    }
    let GenerateRequest { msg, prompt } = req;
    let (engine, inner) = match msg {
        EngineRequest::Sglang(r) => (
            Engine::Sglang,
            Inner::Sglang(
                call(
                    channel,
                    "/sglang.grpc.scheduler.SglangScheduler/Generate",
                    r,
                    prompt,
                    &trace,
                )
                .await?,
            ),
        ),
        EngineRequest::Vllm(r) => (
            Engine::Vllm,
            Inner::Vllm(
                call(
                    channel,
                    "/vllm.grpc.engine.VllmEngine/Generate",
                    r,
                    prompt,
                    &trace,
                )
                .await?,
            ),
        ),
        EngineRequest::TokenSpeed(r) => (
            Engine::TokenSpeed,
            Inner::TokenSpeed(
                call(
                    channel,
                    "/tokenspeed.grpc.scheduler.TokenSpeedScheduler/Generate",
                    r,
                    prompt,
                    &trace,
                )
                .await?,
            ),
        ),
    };
    Ok(ResponseStream {
        engine,
        inner,
        totals: Vec::new(),
    })
}

/// Asks the engine to abort `request_id` (SGLang and TokenSpeed take a reason, vLLM a list).
pub async fn abort(
    channel: LegChannel,
    engine: Engine,
    request_id: String,
    reason: &str,
) -> Result<(), Status> {
    match engine {
        Engine::Sglang => {
            sglang::sglang_scheduler_client::SglangSchedulerClient::new(channel)
                .abort(sglang::AbortRequest {
                    request_id,
                    reason: reason.to_string(),
                })
                .await?;
        }
        Engine::Vllm => {
            vllm::vllm_engine_client::VllmEngineClient::new(channel)
                .abort(vllm::AbortRequest {
                    request_ids: vec![request_id],
                })
                .await?;
        }
        Engine::TokenSpeed => {
            tokenspeed::token_speed_scheduler_client::TokenSpeedSchedulerClient::new(channel)
                .abort(tokenspeed::AbortRequest {
                    request_id,
                    reason: reason.to_string(),
                })
                .await?;
        }
    }
    Ok(())
}

impl ResponseStream {
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// The next message; `None` when the stream ended normally.
    pub async fn next(&mut self) -> Result<Option<Message>, Status> {
        let msg = match &mut self.inner {
            Inner::Sglang(s) => s.message().await?.and_then(|r| r.response).map(sglang_msg),
            Inner::Vllm(s) => s.message().await?.and_then(|r| r.response).map(vllm_msg),
            Inner::TokenSpeed(s) => s
                .message()
                .await?
                .and_then(|r| r.response)
                .map(tokenspeed_msg),
        };
        let Some(mut msg) = msg else {
            return Ok(None);
        };
        if !self.engine.cumulative_counts() {
            if let Message::Chunk(c) = &mut msg {
                let i = c.index as usize;
                if self.totals.len() <= i {
                    self.totals.resize(i + 1, 0);
                }
                self.totals[i] += c.token_ids.len() as u32;
                c.completion_tokens = self.totals[i];
            }
        }
        Ok(Some(msg))
    }
}

macro_rules! logprobs_of {
    ($lp:expr) => {
        $lp.map(|lp| OutputLogprobs {
            token_logprobs: lp.token_logprobs,
            token_ids: lp.token_ids,
            top: lp
                .top_logprobs
                .into_iter()
                .map(|t| (t.values, t.token_ids))
                .collect(),
        })
    };
}

/// One engine's response message → [`Message`]. The engines' types differ only in module and
/// in where vLLM's handoff lives, so one body serves all three.
macro_rules! engine_msg {
    ($name:ident, $m:ident, |$c:ident| $kv:expr, $identity:expr) => {
        fn $name(r: $m::generate_response::Response) -> Message {
            use $m::generate_complete::MatchedStop;
            use $m::generate_response::Response;
            match r {
                Response::Chunk(c) => Message::Chunk(Chunk {
                    index: c.index,
                    token_ids: c.token_ids,
                    prompt_tokens: c.prompt_tokens,
                    completion_tokens: c.completion_tokens,
                    cached_tokens: c.cached_tokens,
                    logprobs: logprobs_of!(c.output_logprobs),
                }),
                Response::Complete($c) => Message::Complete(Box::new(Complete {
                    index: $c.index,
                    kv_transfer_params_json: $kv,
                    media_identity: $identity,
                    output_ids: $c.output_ids,
                    finish_reason: $c.finish_reason,
                    matched: $c.matched_stop.map(|m| match m {
                        MatchedStop::MatchedTokenId(t) => EngineStop::TokenId(t),
                        MatchedStop::MatchedStopStr(s) => EngineStop::Text(s),
                    }),
                    prompt_tokens: $c.prompt_tokens,
                    completion_tokens: $c.completion_tokens,
                    cached_tokens: $c.cached_tokens,
                    logprobs: logprobs_of!($c.output_logprobs),
                })),
            }
        }
    };
}

engine_msg!(sglang_msg, sglang, |c| None, None);
engine_msg!(tokenspeed_msg, tokenspeed, |c| None, None);
// vLLM returns the prefill's handoff (an empty string counts as absent, digest §1.4) and, with
// worker-side media processing, the media identity.
engine_msg!(
    vllm_msg,
    vllm,
    |c| c.kv_transfer_params_json.filter(|j| !j.trim().is_empty()),
    c.media_identity.map(Box::new)
);
