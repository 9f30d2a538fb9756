//! `RequestCtx`: what the phases of one request share. Filled in one direction — route and id
//! in `request_filter`, pair and room by the legs, outcome by whoever answered — and read once
//! by `logging`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::workers::select::Pair;
use crate::workers::{InFlight, Worker};

use super::cors::CorsHeaders;
use super::routes::Endpoint;
use crate::limiter::Admitted;

pub struct RequestCtx {
    pub started: Instant,
    pub endpoint: Option<Endpoint>,
    /// The request id every response carries (the client's, or one we generated).
    pub request_id: String,
    /// Where the id the engines are sent starts in `request_id`: 0 for the client's id, the
    /// route prefix's length for one we minted (see [`RequestCtx::engine_request_id`]).
    pub engine_request_id_from: usize,
    /// Final status sent to the client (0 until one was sent).
    pub status: u16,
    /// The gateway error code, when the answer was one of ours.
    pub error_code: Option<&'static str>,
    pub model_label: Option<Arc<str>>,
    pub streaming: bool,
    /// The pair of the last attempt.
    pub pair: Option<Pair>,
    /// The (first) bootstrap room of the last attempt.
    pub room: Option<u64>,
    /// The transfer id the gateway minted for the last attempt (Mooncake, MoRI-IO).
    pub transfer_id: Option<String>,
    /// How the last attempt handed the KV over (`bootstrap` for SGLang rooms; the vLLM
    /// connector mode otherwise).
    pub connector: Option<&'static str>,
    /// Attempts made (1 = no retry).
    pub attempts: u32,
    /// Prefill dispatch → first decode byte written to the client.
    pub ttft: Option<Duration>,
    /// Whether a response head went to the client (after that, no retry and no error reply).
    pub response_started: bool,
    /// The client went away before the response ended.
    pub client_gone: bool,
    /// Single-leg routes proxied by Pingora itself (e.g. count_tokens): the chosen worker.
    pub single_leg: Option<(Arc<Worker>, InFlight)>,
    /// Request body bytes seen on the single-leg path (payload cap).
    pub single_leg_body_bytes: usize,
    /// What the decode engine of the last attempt reported about the prompt's KV.
    pub kv_verdict: crate::legs::handoff::KvVerdict,
    /// The CORS headers of this request's responses (`None`: CORS off).
    pub cors: Option<CorsHeaders>,
    /// The request's place under the admission limits, given back when the context drops
    /// (after the response has ended).
    pub admission: Option<Admitted>,
    /// The root span of a traced PD request (`--enable-trace`); its legs' spans are children.
    pub trace: Option<crate::trace::RequestTrace>,
}

impl RequestCtx {
    /// The `X-Request-Id` the legs send: the client's id as it sent it, or ours without its
    /// route prefix. vLLM's OpenAI server prefixes the header's id itself (`chatcmpl-{id}`), as
    /// SGLang does for messages and responses (`msg_{id}`), so sending `chatcmpl-…` answered
    /// the client `chatcmpl-chatcmpl-…`; both legs still share one id (NIXL pairs them by it).
    pub fn engine_request_id(&self) -> &str {
        self.request_id
            .get(self.engine_request_id_from..)
            .unwrap_or(&self.request_id)
    }

    pub fn new() -> RequestCtx {
        RequestCtx {
            started: Instant::now(),
            endpoint: None,
            request_id: String::new(),
            engine_request_id_from: 0,
            status: 0,
            error_code: None,
            model_label: None,
            streaming: false,
            pair: None,
            room: None,
            transfer_id: None,
            connector: None,
            attempts: 0,
            ttft: None,
            response_started: false,
            client_gone: false,
            single_leg: None,
            single_leg_body_bytes: 0,
            kv_verdict: Default::default(),
            cors: None,
            admission: None,
            trace: None,
        }
    }
}

impl Default for RequestCtx {
    fn default() -> Self {
        Self::new()
    }
}
