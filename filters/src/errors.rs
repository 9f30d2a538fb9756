//! The error catalogue: every error code pdgate answers with, its default HTTP status, the
//! gateway error body, the upstream-status → code mappings of the PD paths, and the message
//! extraction from engine error bodies. Codes and statuses have no other home.

use std::borrow::Cow;

use crate::body::{is_valid_json, scan_object};
use crate::json;
use crate::value;

/// Response header naming the error code (set when the code is a valid header value).
pub const ERROR_CODE_HEADER: &str = "x-smg-error-code";

/// Longest upstream-derived message put into a gateway error body.
pub const MAX_UPSTREAM_MESSAGE: usize = 4096;

macro_rules! catalogue {
    ($($(#[$doc:meta])* $variant:ident = $code:literal, $status:literal;)*) => {
        /// An error code of the gateway's error body (`error.code`) and `X-SMG-Error-Code`.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorCode {
            /// Every code, for tables and tests.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)*];

            /// The code as it appears on the wire.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The default status. Codes documented as passing an upstream status through use
            /// this only when there is none.
            pub const fn status(self) -> u16 {
                match self {
                    $(ErrorCode::$variant => $status,)*
                }
            }
        }
    };
}

catalogue! {
    /// A leg has no available worker (unhealthy or circuit open); the message names the leg.
    NoAvailableWorkers = "no_available_workers", 503;
    /// No prefill shares a KV transfer protocol with any decode.
    NoCompatiblePdPair = "no_compatible_pd_pair", 503;
    /// Overload protection vetoed a leg; sent with `Retry-After`.
    WorkerOverloadProtectionShed = "worker_overload_protection_shed", 503;
    /// The admission queue (`--queue-size`) is full, or queuing is off and no place is free;
    /// sent with `Retry-After`.
    AdmissionQueueFull = "admission_queue_full", 429;
    /// A request waited `--queue-timeout-secs` in the admission queue; sent with `Retry-After`.
    AdmissionQueueTimeout = "admission_queue_timeout", 503;
    /// vLLM prefill answered non-2xx; its status is passed through.
    PrefillUpstreamError = "prefill_upstream_error", 502;
    /// vLLM (and MoRI-IO concurrent) decode transport error.
    DecodeRequestFailed = "decode_request_failed", 502;
    /// vLLM prefill transport error.
    PrefillRequestFailed = "prefill_request_failed", 502;
    /// vLLM prefill body could not be read.
    PrefillReadFailed = "prefill_read_failed", 502;
    DecodeBadRequest = "decode_bad_request", 400;
    DecodeNotFound = "decode_not_found", 404;
    DecodeInternalError = "decode_internal_error", 500;
    DecodeUnavailable = "decode_unavailable", 503;
    DecodeBadGateway = "decode_bad_gateway", 502;
    /// Decode answered another non-2xx status; pdgate passes that status through.
    DecodeError = "decode_error", 500;
    /// The decode error body could not be read while mapping it.
    DecodeReadFailed = "decode_read_failed", 500;
    PrefillBadRequest = "prefill_bad_request", 400;
    PrefillNotFound = "prefill_not_found", 404;
    PrefillInternalError = "prefill_internal_error", 500;
    PrefillUnavailable = "prefill_unavailable", 503;
    PrefillBadGateway = "prefill_bad_gateway", 502;
    /// Parallel-path prefill answered another non-2xx status; pdgate passes it through.
    PrefillError = "prefill_error", 500;
    /// Parallel dispatch transport error. SMG's literal (not snake_case) code, kept for drop-in
    /// compatibility with clients that match on it.
    PdRequestFailed = "PD disaggregation request failed", 502;
    /// The decode body could not be read on the success path.
    ReadResponseFailed = "read_response_failed", 500;
    /// The leg body could not be built (body not a JSON object).
    SerializationFailed = "serialization_failed", 500;
    HealthGenerateFailed = "health_generate_failed", 503;
    NoHealthyWorkerPair = "no_healthy_worker_pair", 503;
    MoriioPairMisconfigured = "moriio_pair_misconfigured", 503;
    MoriioFanoutUnsupported = "moriio_fanout_unsupported", 400;
    MoriioRequestIdReserved = "moriio_request_id_reserved", 400;
    MoriioRouteUnsupported = "moriio_route_unsupported", 501;
    MoriioHandoffInvalid = "moriio_handoff_invalid", 502;
    /// The body is not valid JSON.
    JsonParseError = "json_parse_error", 400;
    /// The body is JSON but a field has the wrong type or range, a required one is missing (see
    /// `shape`), or it is not an object.
    InvalidRequest = "invalid_request", 400;
    /// `/generate` without a model where one is required.
    MissingModel = "missing_model", 400;
    /// `GET /v1/models/{id}` for a model no registered worker serves (SMG 1.13.0's code).
    ModelNotFound = "model_not_found", 404;
    /// The body exceeds the configured maximum size.
    /// SMG 1.13.0's code.
    PayloadTooLarge = "request_body_too_large", 413;
    /// A path no route serves (SMG 1.13.0's code and message: `Invalid URL (GET /x)`).
    UnknownUrl = "unknown_url", 404;
    MethodNotAllowed = "method_not_allowed", 405;
    /// A route the PD router does not serve (embeddings, classify).
    NotImplemented = "not_implemented", 501;
    /// A route that needs the API key, without it (SMG 1.13.0's code).
    Unauthorized = "invalid_api_key", 401;
    /// A mutating admin call from a peer that is not trusted (no API key configured).
    Forbidden = "forbidden", 403;
    /// The client did not send its body in time.
    RequestTimeout = "request_timeout", 408;
    /// A leg missed its deadline.
    Timeout = "timeout", 504;
    /// A gateway bug surfaced as an error value.
    InternalError = "internal_error", 500;
    /// `/get_server_info`, `/get_model_info`: no prefill worker registered.
    NoPrefillServers = "no_prefill_servers", 503;
    ServerBadRequest = "server_bad_request", 400;
    ServerNotFound = "server_not_found", 404;
    ServerInternalError = "server_internal_error", 500;
    ServerUnavailable = "server_unavailable", 503;
    ServerBadGateway = "server_bad_gateway", 502;
    ServerError = "server_error", 500;
    ProxyRequestFailed = "proxy_request_failed", 500;
    /// Worker admin API (`{"error":…,"code":…}` body, see [`render_admin_error`]).
    BadRequest = "BAD_REQUEST", 400;
    WorkerAlreadyExists = "WORKER_ALREADY_EXISTS", 409;
    WorkerNotFound = "WORKER_NOT_FOUND", 404;
    InternalServerError = "INTERNAL_SERVER_ERROR", 500;
    /// gRPC path: request fields that are valid one by one but cannot go together (two output
    /// constraints, …). SMG's code for the same refusal.
    InvalidRequestParameters = "invalid_request_parameters", 400;
    /// gRPC path: media the gateway cannot serve (audio, video, files; images for a model with
    /// no image processor or no vision worker; EPD with `--mm-processing worker`). SMG's code.
    MultimodalNotSupported = "multimodal_not_supported", 400;
    /// gRPC path: an image URL was refused by the media policy (scheme, private or loopback
    /// address, domain not allowed) or could not be fetched (status, size, time).
    MediaFetchFailed = "media_fetch_failed", 400;
    /// gRPC path: an image could not be decoded (not PNG, JPEG, WebP or GIF, corrupt, too
    /// many pixels) or the chat template placed a different number of image placeholders.
    InvalidMedia = "invalid_media", 400;
    /// gRPC path: more images than `--mm-per-request-image-limit` (SMG's code).
    TooManyImages = "too_many_images", 400;
    /// A language-model-only vLLM decode pool cannot take an M-RoPE model's grid tensors.
    PdDecodeLanguageModelOnlyMrope = "pd_decode_language_model_only_mrope", 400;
    /// A language-model-only vLLM decode pool cannot expand worker-side media references.
    PdDecodeLanguageModelOnlyMediaRefs = "pd_decode_language_model_only_media_refs", 400;
    /// A language-model-only vLLM decode pool cannot recompute a multimodal prompt (`n>1`).
    PdDecodeLanguageModelOnlyNSamples = "pd_decode_language_model_only_n_samples", 400;
    /// EPD: an encode worker refused an item's `Encode` (its gRPC status mapped to HTTP); the
    /// request's prefill and decode legs are dropped at once instead of waiting for the
    /// prefill's embedding timeout.
    EncodeWorkerFailedToStart = "encode_worker_failed_to_start", 503;
    /// gRPC path: a request feature the gateway-side conversion does not implement yet (tool
    /// calling, beam search, stored responses, …); the message names the field.
    FeatureNotSupported = "feature_not_supported", 400;
    /// gRPC path: the engine refused the prefill leg; its gRPC status mapped to HTTP
    /// ([`grpc_status_to_http`]) is sent with this code.
    PrefillWorkerFailedToStart = "prefill_worker_failed_to_start", 503;
    /// gRPC path: the engine refused the decode leg (status as for the prefill).
    DecodeWorkerFailedToStart = "decode_worker_failed_to_start", 503;
    /// gRPC path: the prefill stream failed after it started (vLLM: before its handoff came).
    PrefillStreamError = "prefill_stream_error", 502;
    /// gRPC path: the decode stream failed before anything reached the client.
    WorkerStreamFailed = "worker_stream_failed", 502;
    /// gRPC path: the selected runtime has no PD protocol (TensorRT-LLM, MLX, unknown).
    RuntimePdNotSupported = "runtime_pd_not_supported", 400;
    /// gRPC path: MoRI-IO PD is served only by the HTTP PD router.
    MoriioGrpcPdUnsupported = "moriio_grpc_pd_unsupported", 501;
    /// gRPC path: the prompt exceeds the smaller context window of the two legs.
    ContextLengthExceeded = "context_length_exceeded", 400;
    /// gRPC path: no tokenizer could be loaded for the request's model (`--model-path`,
    /// `--tokenizer-path`, or the worker's reported tokenizer path on this host).
    TokenizerUnavailable = "tokenizer_unavailable", 503;
}

/// HTTP status for a gRPC status code (the engines' servicers: INVALID_ARGUMENT for bad input,
/// INTERNAL for the rest), SMG's table: client-class codes are 4xx, UNAVAILABLE 503,
/// DEADLINE_EXCEEDED 504, UNIMPLEMENTED 501, anything else 500.
pub const fn grpc_status_to_http(code: i32) -> u16 {
    match code {
        // INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE, CANCELLED
        3 | 9 | 11 | 1 => 400,
        16 => 401,     // UNAUTHENTICATED
        7 => 403,      // PERMISSION_DENIED
        5 => 404,      // NOT_FOUND
        6 | 10 => 409, // ALREADY_EXISTS, ABORTED
        8 => 429,      // RESOURCE_EXHAUSTED
        14 => 503,     // UNAVAILABLE
        4 => 504,      // DEADLINE_EXCEEDED
        12 => 501,     // UNIMPLEMENTED
        _ => 500,
    }
}

impl ErrorCode {
    /// The code of a wire string (`None`: not one of ours).
    pub fn from_code(code: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.iter().copied().find(|c| c.as_str() == code)
    }

    /// Whether the code says a leg failed after its pair was chosen — a prefill or decode
    /// server error, a transport failure, a timeout, an unusable MoRI-IO handoff — as opposed
    /// to a refusal before any leg (selection, admission, overload) or a client error. With a
    /// 5xx status these are the handoff failures of link health.
    pub const fn is_leg_failure(self) -> bool {
        use ErrorCode::*;
        matches!(
            self,
            DecodeInternalError
                | DecodeUnavailable
                | DecodeBadGateway
                | DecodeError
                | DecodeRequestFailed
                | DecodeReadFailed
                | PrefillInternalError
                | PrefillUnavailable
                | PrefillBadGateway
                | PrefillError
                | PrefillRequestFailed
                | PrefillReadFailed
                | PrefillUpstreamError
                | PdRequestFailed
                | MoriioHandoffInvalid
                | Timeout
        )
    }

    /// Whether the answer carries `Retry-After` (overload sheds, admission refusals, and a leg
    /// without an available worker).
    pub const fn sends_retry_after(self) -> bool {
        matches!(
            self,
            ErrorCode::WorkerOverloadProtectionShed
                | ErrorCode::AdmissionQueueFull
                | ErrorCode::AdmissionQueueTimeout
                | ErrorCode::NoAvailableWorkers
        )
    }

    /// The `Retry-After` seconds a code carries whatever the configuration: 1 for
    /// `no_available_workers`, SMG 1.13.0's header on that refusal (measured side by side). The
    /// other codes that send one take it from the configuration (the load monitor's interval,
    /// the admission queue's), set where they are answered.
    pub const fn fixed_retry_after_secs(self) -> Option<u64> {
        match self {
            ErrorCode::NoAvailableWorkers => Some(1),
            _ => None,
        }
    }

    /// Whether the code can be sent as the `X-SMG-Error-Code` header value (visible ASCII).
    pub fn is_header_safe(self) -> bool {
        self.as_str().bytes().all(|b| (0x20..0x7f).contains(&b))
    }
}

/// The `Retry-After` seconds of an overload shed: the load-monitor interval, at least 1.
pub fn retry_after_secs(load_monitor_interval_secs: u64) -> u64 {
    load_monitor_interval_secs.max(1)
}

/// HTTP reason phrase for a status ("Service Unavailable", …); "Unknown" for unlisted codes.
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Payload Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        422 => "Unprocessable Entity",
        423 => "Locked",
        424 => "Failed Dependency",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        508 => "Loop Detected",
        511 => "Network Authentication Required",
        _ => "Unknown",
    }
}

/// The gateway error body:
/// `{"error":{"type":"<error type>","code":"<code>","message":"<msg>","param":null}}`.
pub fn render_error(status: u16, code: &str, message: &str) -> Vec<u8> {
    let kind = error_type(status);
    let mut out = Vec::with_capacity(64 + kind.len() + code.len() + message.len());
    out.extend_from_slice(b"{\"error\":{\"type\":");
    json::push_string(&mut out, kind);
    out.extend_from_slice(b",\"code\":");
    json::push_string(&mut out, code);
    out.extend_from_slice(b",\"message\":");
    json::push_string(&mut out, message);
    out.extend_from_slice(b",\"param\":null}}");
    out
}

/// The error body's `type`, OpenAI's kinds as SMG 1.13.0 writes them: `rate_limit_error` for a
/// 429, `invalid_request_error` for another 4xx, `server_error` otherwise. (SMG's earlier
/// releases, and the research digest's snapshot, wrote the status's reason phrase.)
pub fn error_type(status: u16) -> &'static str {
    match status {
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "server_error",
    }
}

/// Anthropic's error body, which SMG 1.13.0 answers on the Messages API routes
/// (`/v1/messages`, `/v1/messages/count_tokens`) and Anthropic's SDKs read:
/// `{"type":"error","error":{"type":…,"message":…},"request_id":…}`.
pub fn render_anthropic_error(status: u16, message: &str, request_id: &str) -> Vec<u8> {
    let kind = anthropic_error_type(status);
    let mut out = Vec::with_capacity(80 + kind.len() + message.len() + request_id.len());
    out.extend_from_slice(b"{\"type\":\"error\",\"error\":{\"type\":");
    json::push_string(&mut out, kind);
    out.extend_from_slice(b",\"message\":");
    json::push_string(&mut out, message);
    out.extend_from_slice(b"},\"request_id\":");
    json::push_string(&mut out, request_id);
    out.push(b'}');
    out
}

/// The Anthropic error `type` of a status (Anthropic's table; a 503 is `overloaded_error`, as
/// SMG 1.13.0 writes it).
pub fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// The worker admin API's error body: `{"error":"<msg>","code":"<code>"}`.
pub fn render_admin_error(code: ErrorCode, message: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + message.len());
    out.extend_from_slice(b"{\"error\":");
    json::push_string(&mut out, message);
    out.extend_from_slice(b",\"code\":");
    json::push_string(&mut out, code.as_str());
    out.push(b'}');
    out
}

/// The message to show for an upstream error body: `error.message` (a string), else a top-level
/// `message` string, else the raw text (lossy UTF-8); at most [`MAX_UPSTREAM_MESSAGE`] bytes.
pub fn upstream_error_message(body: &[u8]) -> String {
    let from_json = scan_object(body).ok().and_then(|top| {
        let nested = top.get(body, "error").and_then(|err| {
            let inner = scan_object(err).ok()?;
            inner.get(err, "message").and_then(value::as_str)
        });
        nested.or_else(|| top.get(body, "message").and_then(value::as_str))
    });
    let text = match from_json {
        Some(msg) => msg,
        None => String::from_utf8_lossy(body),
    };
    truncate(text, MAX_UPSTREAM_MESSAGE)
}

fn truncate(text: Cow<'_, str>, max: usize) -> String {
    if text.len() <= max {
        return text.into_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

/// `Prefill server error (<status> <reason>): <raw body>` — the parallel path's prefill message.
pub fn prefill_server_error_message(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = truncate(text, MAX_UPSTREAM_MESSAGE);
    format!(
        "Prefill server error ({status} {}): {text}",
        reason_phrase(status)
    )
}

/// Maps an upstream non-2xx status: 400/404/500/503/502 keep their status with their own code;
/// any other status passes through unchanged with `other`.
fn map_upstream(status: u16, codes: [ErrorCode; 5], other: ErrorCode) -> (u16, ErrorCode) {
    let code = match status {
        400 => codes[0],
        404 => codes[1],
        500 => codes[2],
        503 => codes[3],
        502 => codes[4],
        _ => other,
    };
    (status, code)
}

/// Non-streaming decode non-2xx → (status to client, code).
///
/// 400/404/500/503/502 → same status with `decode_bad_request`/`decode_not_found`/
/// `decode_internal_error`/`decode_unavailable`/`decode_bad_gateway`. Any other status is
/// passed through unchanged with `decode_error`. SMG answers 500 there, which turns a decode
/// 429 or 401 into a retried 500; pdgate keeps e.g. 429 so clients can back off.
pub fn decode_error(status: u16) -> (u16, ErrorCode) {
    use ErrorCode::*;
    map_upstream(
        status,
        [
            DecodeBadRequest,
            DecodeNotFound,
            DecodeInternalError,
            DecodeUnavailable,
            DecodeBadGateway,
        ],
        DecodeError,
    )
}

/// Parallel-path prefill non-2xx → (status to client, code); as [`decode_error`] with the
/// `prefill_*` codes, other statuses passed through with `prefill_error`.
pub fn prefill_error(status: u16) -> (u16, ErrorCode) {
    use ErrorCode::*;
    map_upstream(
        status,
        [
            PrefillBadRequest,
            PrefillNotFound,
            PrefillInternalError,
            PrefillUnavailable,
            PrefillBadGateway,
        ],
        PrefillError,
    )
}

/// `/get_server_info` / `/get_model_info` upstream non-2xx → (status, code); other statuses
/// passed through with `server_error`.
pub fn server_error(status: u16) -> (u16, ErrorCode) {
    use ErrorCode::*;
    map_upstream(
        status,
        [
            ServerBadRequest,
            ServerNotFound,
            ServerInternalError,
            ServerUnavailable,
            ServerBadGateway,
        ],
        ServerError,
    )
}

/// The streaming decode error: exactly one SSE event
/// `data: {"error":{"message":<body>,"status":<int>}}\n\n`, where `<body>` is the upstream body
/// when it is valid JSON, else the body as a JSON string (lossy UTF-8).
pub fn sse_error_event(status: u16, upstream_body: &[u8]) -> Vec<u8> {
    let trimmed = upstream_body.trim_ascii();
    let mut out = Vec::with_capacity(48 + upstream_body.len() * 2);
    out.extend_from_slice(b"data: {\"error\":{\"message\":");
    if !trimmed.is_empty() && is_valid_json(trimmed) {
        // Raw CR/LF can only be whitespace between JSON tokens; turn it into spaces so the event
        // stays one `data:` line.
        out.extend(
            trimmed
                .iter()
                .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
        );
    } else {
        json::push_string(&mut out, &String::from_utf8_lossy(upstream_body));
    }
    out.extend_from_slice(b",\"status\":");
    json::push_u64(&mut out, u64::from(status));
    out.extend_from_slice(b"}}\n\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn codes_are_unique() {
        let mut seen: Vec<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        seen.sort();
        let n = seen.len();
        seen.dedup();
        assert_eq!(seen.len(), n);
    }

    #[test]
    fn spec_table_codes_and_statuses() {
        use ErrorCode::*;
        let table = [
            (NoAvailableWorkers, "no_available_workers", 503),
            (NoCompatiblePdPair, "no_compatible_pd_pair", 503),
            (
                WorkerOverloadProtectionShed,
                "worker_overload_protection_shed",
                503,
            ),
            (AdmissionQueueFull, "admission_queue_full", 429),
            (AdmissionQueueTimeout, "admission_queue_timeout", 503),
            (MoriioPairMisconfigured, "moriio_pair_misconfigured", 503),
            (MoriioFanoutUnsupported, "moriio_fanout_unsupported", 400),
            (MoriioRequestIdReserved, "moriio_request_id_reserved", 400),
            (MoriioRouteUnsupported, "moriio_route_unsupported", 501),
            (MoriioHandoffInvalid, "moriio_handoff_invalid", 502),
            (PdRequestFailed, "PD disaggregation request failed", 502),
            (PrefillRequestFailed, "prefill_request_failed", 502),
            (PrefillReadFailed, "prefill_read_failed", 502),
            (DecodeRequestFailed, "decode_request_failed", 502),
            (ReadResponseFailed, "read_response_failed", 500),
            (SerializationFailed, "serialization_failed", 500),
            (HealthGenerateFailed, "health_generate_failed", 503),
            (NoHealthyWorkerPair, "no_healthy_worker_pair", 503),
            (JsonParseError, "json_parse_error", 400),
            (PayloadTooLarge, "request_body_too_large", 413),
            (InvalidRequestParameters, "invalid_request_parameters", 400),
            (MultimodalNotSupported, "multimodal_not_supported", 400),
            (FeatureNotSupported, "feature_not_supported", 400),
            (RuntimePdNotSupported, "runtime_pd_not_supported", 400),
            (MoriioGrpcPdUnsupported, "moriio_grpc_pd_unsupported", 501),
            (ContextLengthExceeded, "context_length_exceeded", 400),
            (
                PrefillWorkerFailedToStart,
                "prefill_worker_failed_to_start",
                503,
            ),
            (
                DecodeWorkerFailedToStart,
                "decode_worker_failed_to_start",
                503,
            ),
        ];
        for (code, s, status) in table {
            assert_eq!(code.as_str(), s);
            assert_eq!(code.status(), status, "{s}");
        }
    }

    #[test]
    fn grpc_statuses_map_to_smgs_http_table() {
        let table = [
            (3, 400),
            (9, 400),
            (11, 400),
            (1, 400),
            (16, 401),
            (7, 403),
            (5, 404),
            (6, 409),
            (10, 409),
            (8, 429),
            (14, 503),
            (4, 504),
            (12, 501),
            (13, 500),
            (2, 500),
            (15, 500),
        ];
        for (code, status) in table {
            assert_eq!(grpc_status_to_http(code), status, "gRPC code {code}");
        }
    }

    #[test]
    fn the_anthropic_error_body_is_anthropics_shape() {
        let body = render_anthropic_error(503, "No \"prefill\" workers", "msg_1");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "error", "error": {"type": "overloaded_error",
                "message": "No \"prefill\" workers"}, "request_id": "msg_1"})
        );
        assert_eq!(anthropic_error_type(400), "invalid_request_error");
        assert_eq!(anthropic_error_type(422), "invalid_request_error");
        assert_eq!(anthropic_error_type(404), "not_found_error");
        assert_eq!(anthropic_error_type(500), "api_error");
        assert_eq!(anthropic_error_type(502), "api_error");
    }

    #[test]
    fn only_refusals_a_retry_can_clear_send_retry_after() {
        let with: Vec<_> = ErrorCode::ALL
            .iter()
            .filter(|c| c.sends_retry_after())
            .collect();
        assert_eq!(
            with,
            [
                &ErrorCode::NoAvailableWorkers,
                &ErrorCode::WorkerOverloadProtectionShed,
                &ErrorCode::AdmissionQueueFull,
                &ErrorCode::AdmissionQueueTimeout
            ]
        );
        for c in ErrorCode::ALL {
            if c.fixed_retry_after_secs().is_some() {
                assert!(c.sends_retry_after(), "{c:?}");
            }
        }
        assert_eq!(
            ErrorCode::NoAvailableWorkers.fixed_retry_after_secs(),
            Some(1)
        );
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(10), 10);
    }

    #[test]
    fn every_code_is_header_safe_and_statuses_are_errors() {
        for c in ErrorCode::ALL {
            assert!(c.is_header_safe(), "{c:?}");
            assert!((400..600).contains(&c.status()), "{c:?}");
            assert_ne!(reason_phrase(c.status()), "Unknown", "{c:?}");
        }
    }

    #[test]
    fn reason_phrases() {
        assert_eq!(reason_phrase(503), "Service Unavailable");
        assert_eq!(reason_phrase(429), "Too Many Requests");
        assert_eq!(reason_phrase(599), "Unknown");
    }

    #[test]
    fn render_error_is_the_gateway_shape_and_escapes() {
        let body = render_error(503, "no_available_workers", "no \"decode\"\nworkers");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"error":{"type":"server_error","code":"no_available_workers",
                "message":"no \"decode\"\nworkers","param":null}})
        );
    }

    #[test]
    fn render_admin_error_shape() {
        let v: Value =
            serde_json::from_slice(&render_admin_error(ErrorCode::WorkerNotFound, "gone")).unwrap();
        assert_eq!(v, json!({"error":"gone","code":"WORKER_NOT_FOUND"}));
    }

    #[test]
    fn upstream_message_prefers_error_message_then_message_then_raw() {
        assert_eq!(
            upstream_error_message(br#"{"error":{"message":"bad"},"message":"x"}"#),
            "bad"
        );
        assert_eq!(
            upstream_error_message(br#"{"object":"error","message":"flat"}"#),
            "flat"
        );
        assert_eq!(
            upstream_error_message(br#"{"error":"boom"}"#),
            r#"{"error":"boom"}"#
        );
        assert_eq!(
            upstream_error_message(br#"{"error":{"message":5}}"#),
            r#"{"error":{"message":5}}"#
        );
        assert_eq!(upstream_error_message(b"plain text"), "plain text");
        assert_eq!(upstream_error_message(b"\xff ok"), "\u{fffd} ok");
    }

    #[test]
    fn upstream_message_is_truncated_on_a_char_boundary() {
        let long = "é".repeat(5000);
        let msg = upstream_error_message(long.as_bytes());
        assert!(msg.len() <= MAX_UPSTREAM_MESSAGE && msg.len() >= MAX_UPSTREAM_MESSAGE - 1);
        assert!(msg.chars().all(|c| c == 'é'));
    }

    #[test]
    fn prefill_server_error_message_names_status_line() {
        let m = prefill_server_error_message(400, b"nope");
        assert_eq!(m, "Prefill server error (400 Bad Request): nope");
    }

    #[test]
    fn decode_errors_map_known_statuses() {
        use ErrorCode::*;
        assert_eq!(decode_error(400), (400, DecodeBadRequest));
        assert_eq!(decode_error(404), (404, DecodeNotFound));
        assert_eq!(decode_error(500), (500, DecodeInternalError));
        assert_eq!(decode_error(503), (503, DecodeUnavailable));
        assert_eq!(decode_error(502), (502, DecodeBadGateway));
    }

    #[test]
    fn decode_other_statuses_pass_through_with_decode_error() {
        for s in [401, 408, 422, 429, 504] {
            assert_eq!(decode_error(s), (s, ErrorCode::DecodeError));
        }
    }

    #[test]
    fn prefill_and_server_errors_map_like_decode() {
        use ErrorCode::*;
        assert_eq!(prefill_error(400), (400, PrefillBadRequest));
        assert_eq!(prefill_error(404), (404, PrefillNotFound));
        assert_eq!(prefill_error(500), (500, PrefillInternalError));
        assert_eq!(prefill_error(503), (503, PrefillUnavailable));
        assert_eq!(prefill_error(502), (502, PrefillBadGateway));
        assert_eq!(prefill_error(429), (429, PrefillError));
        assert_eq!(server_error(503), (503, ServerUnavailable));
        assert_eq!(server_error(418), (418, ServerError));
    }

    #[test]
    fn sse_error_event_embeds_json_bodies() {
        let ev = sse_error_event(500, br#"{"error":"boom"}"#);
        assert!(ev.starts_with(b"data: ") && ev.ends_with(b"\n\n"));
        let v: Value = serde_json::from_slice(&ev[6..ev.len() - 2]).unwrap();
        assert_eq!(
            v,
            json!({"error":{"message":{"error":"boom"},"status":500}})
        );
    }

    #[test]
    fn sse_error_event_quotes_non_json_bodies() {
        let ev = sse_error_event(429, b"slow down\n");
        let v: Value = serde_json::from_slice(&ev[6..ev.len() - 2]).unwrap();
        assert_eq!(v, json!({"error":{"message":"slow down\n","status":429}}));
        let ev = sse_error_event(502, b"");
        let v: Value = serde_json::from_slice(&ev[6..ev.len() - 2]).unwrap();
        assert_eq!(v, json!({"error":{"message":"","status":502}}));
    }

    #[test]
    fn sse_error_event_is_one_line_for_pretty_json() {
        let ev = sse_error_event(500, b"{\n  \"a\": 1\r\n}\n");
        assert_eq!(ev.iter().filter(|&&b| b == b'\n').count(), 2);
        let v: Value = serde_json::from_slice(&ev[6..ev.len() - 2]).unwrap();
        assert_eq!(v, json!({"error":{"message":{"a":1},"status":500}}));
    }
}
