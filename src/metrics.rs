//! Every metric pdgate exports, in one place. Names and labels are SMG's (spec "Monitoring"),
//! so dashboards and PromQL written for SMG work unchanged.
//!
//! Label values that come from clients are bounded: `model` is a registered model id or
//! `"other"` (see [`model_label`]), so a client cannot mint unbounded series.

use std::sync::LazyLock;

use crate::labelled::{Labelled, LabelledCounters, LabelledHistogram};

use pingora_prometheus::prometheus::{
    self, register_gauge_vec, register_histogram, register_histogram_vec, register_int_counter,
    register_int_counter_vec, register_int_gauge, register_int_gauge_vec, GaugeVec, Histogram,
    HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
};

/// Buckets for every `*_duration_seconds` and `*_ttft_seconds` histogram: from a millisecond
/// TTFT to hour-long streams (SMG's defaults).
pub const DURATION_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0,
    90.0, 120.0, 180.0, 240.0, 300.0, 480.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0, 5400.0, 7200.0,
];

/// `backend_type` label value of the PD series.
pub const BACKEND_PD: &str = "pd";
/// The `model` label when a request or worker names none.
pub const UNKNOWN_MODEL: &str = "unknown";
/// `router_type` / `connection_mode` label value of this gateway's HTTP path.
pub const HTTP: &str = "http";
/// `router_type` / `connection_mode` label value of its gRPC path.
pub const GRPC: &str = "grpc";

pub struct Metrics {
    pub router_requests: LabelledCounters,
    pub router_request_duration: LabelledHistogram,
    pub router_request_errors: LabelledCounters,
    pub router_ttft: LabelledHistogram,
    pub router_tpot: LabelledHistogram,
    pub router_generation_duration: LabelledHistogram,
    pub router_tokens: LabelledCounters,
    pub pd_ttft: LabelledHistogram,
    pub pd_prefill_duration: LabelledHistogram,
    pub pd_kv_transfer_duration: HistogramVec,
    pub pd_kv_connector_mode: IntCounterVec,
    pub pd_kv_transfer_failures: IntCounter,
    pub pd_bootstrap_failures: IntCounter,
    pub pd_admission_waits: IntCounter,
    pub pd_admission_sheds: IntCounter,
    pub pd_links_open: IntGauge,
    pub pd_link_open: IntGaugeVec,
    pub pd_canaries: IntCounterVec,
    pub pd_capacity_pressure: GaugeVec,
    pub pd_link_trips: IntCounter,
    pub pd_handoff_outcome: LabelledCounters,
    pub pd_recomputed_prompt_tokens: IntCounterVec,
    pub admission_inflight: IntGauge,
    pub admission_queue_depth: IntGauge,
    pub admission_queue_rejected: IntCounterVec,
    pub admission_queue_wait: Histogram,
    pub http_rate_limit: IntCounterVec,
    pub worker_selection: LabelledCounters,
    pub worker_requests_active: IntGaugeVec,
    pub worker_health: IntGaugeVec,
    pub worker_health_checks: IntCounterVec,
    pub worker_cb_state: IntGaugeVec,
    pub worker_cb_transitions: IntCounterVec,
    pub worker_cb_health_readmissions: IntCounterVec,
    pub worker_cb_outcomes: IntCounterVec,
    pub worker_cb_consecutive_failures: IntGaugeVec,
    pub worker_cb_consecutive_successes: IntGaugeVec,
    pub worker_retries: IntCounterVec,
    pub worker_retries_exhausted: IntCounterVec,
    pub worker_retry_backoff: HistogramVec,
    pub worker_overload_shed: IntCounterVec,
    pub workers_overloaded: IntGaugeVec,
    pub worker_errors: IntCounterVec,
    pub http_responses: LabelledCounters,
    pub http_requests: LabelledCounters,
    pub http_request_duration: LabelledHistogram,
    pub worker_pool_size: IntGaugeVec,
    pub worker_routing_keys_active: IntGaugeVec,
    pub config_reloads: IntCounterVec,
    pub handoffs_open: IntGauge,
    pub handoffs_abnormal: IntCounter,
    pub trace_spans_exported: IntCounter,
    pub trace_spans_dropped: IntCounterVec,
    pub engine_pd_kv_transfer_latency_ms: GaugeVec,
    pub engine_pd_kv_transfer_speed_gb_s: GaugeVec,
    pub engine_pd_prefill_queue_reqs: GaugeVec,
    pub engine_pd_decode_queue_reqs: GaugeVec,
}

fn histogram(name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    register_histogram_vec!(name, help, labels, DURATION_BUCKETS.to_vec())
        .expect("metric names are unique and valid")
}

/// A histogram vector updated on every request: each thread remembers its handles.
fn remembered_histogram(name: &str, help: &str, labels: &[&str]) -> LabelledHistogram {
    Labelled::new(histogram(name, help, labels))
}

/// A counter vector updated on every request: each thread remembers its handles.
fn remembered_counters(name: &str, help: &str, labels: &[&str]) -> LabelledCounters {
    Labelled::new(counter_vec(name, help, labels))
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register_int_counter_vec!(name, help, labels).expect("metric names are unique and valid")
}

fn counter(name: &str, help: &str) -> IntCounter {
    register_int_counter!(name, help).expect("metric names are unique and valid")
}

fn gauge_vec(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register_int_gauge_vec!(name, help, labels).expect("metric names are unique and valid")
}

fn gauge(name: &str, help: &str) -> IntGauge {
    register_int_gauge!(name, help).expect("metric names are unique and valid")
}

fn float_gauge_vec(name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    register_gauge_vec!(name, help, labels).expect("metric names are unique and valid")
}

/// Labels of the engine-reported PD gauges (gRPC load reports with disaggregation statistics).
const ENGINE_PD_LABELS: &[&str] = &["worker", "role", "dp_rank"];

const PD_LABELS: &[&str] = &["backend_type", "model", "runtime"];
const ROUTER_LABELS: &[&str] = &[
    "router_type",
    "backend_type",
    "connection_mode",
    "model",
    "endpoint",
];

/// Labels of SMG's router inference series (`smg_router_ttft_seconds` and its siblings), which
/// SMG records on its gRPC path only.
const ROUTER_INFERENCE_LABELS: &[&str] = &["router_type", "backend_type", "model", "endpoint"];

pub static METRICS: LazyLock<Metrics> = LazyLock::new(|| {
    Metrics {
    router_requests: remembered_counters(
        "smg_router_requests_total",
        "Requests received by the router",
        &[
            "router_type",
            "backend_type",
            "connection_mode",
            "model",
            "endpoint",
            "streaming",
        ],
    ),
    router_request_duration: remembered_histogram(
        "smg_router_request_duration_seconds",
        "Duration of successful requests, from arrival to the end of the response",
        ROUTER_LABELS,
    ),
    router_request_errors: remembered_counters(
        "smg_router_request_errors_total",
        "Requests that ended with a non-retryable error",
        &[
            "router_type",
            "backend_type",
            "connection_mode",
            "model",
            "endpoint",
            "error_type",
        ],
    ),
    router_ttft: remembered_histogram(
        "smg_router_ttft_seconds",
        "Time to first token of a streamed gRPC request, from the decode stream's start (gRPC only)",
        ROUTER_INFERENCE_LABELS,
    ),
    router_tpot: remembered_histogram(
        "smg_router_tpot_seconds",
        "Time per output token after the first, of a streamed gRPC request (gRPC only)",
        ROUTER_INFERENCE_LABELS,
    ),
    router_generation_duration: remembered_histogram(
        "smg_router_generation_duration_seconds",
        "Generation time of a streamed gRPC request, from the decode stream's start (gRPC only)",
        ROUTER_INFERENCE_LABELS,
    ),
    router_tokens: remembered_counters(
        "smg_router_tokens_total",
        "Tokens of streamed gRPC requests, by token_type (input, output) (gRPC only)",
        &["router_type", "backend_type", "model", "endpoint", "token_type"],
    ),
    pd_ttft: remembered_histogram(
        "smg_pd_ttft_seconds",
        "PD time to first token: prefill dispatch to the first decode output the client receives",
        PD_LABELS,
    ),
    pd_prefill_duration: remembered_histogram(
        "smg_pd_prefill_duration_seconds",
        "Prefill-leg duration",
        PD_LABELS,
    ),
    pd_kv_transfer_duration: histogram(
        "smg_pd_kv_transfer_duration_seconds",
        "Prefill completion to decode dispatch",
        PD_LABELS,
    ),
    pd_kv_connector_mode: counter_vec(
        "smg_pd_kv_connector_mode_total",
        "vLLM PD dispatches by KV connector mode",
        &["mode"],
    ),
    pd_kv_transfer_failures: counter(
        "smg_pd_kv_transfer_failures_total",
        "KV handoffs that failed: a NIXL prefill returned no kv_transfer_params, or a MoRI-IO check failed",
    ),
    pd_bootstrap_failures: counter(
        "smg_pd_bootstrap_failures_total",
        "HTTP bootstrap injection failures",
    ),
    pd_admission_waits: counter(
        "smg_pd_admission_waits_total",
        "PD dispatches admitted after waiting for a decode slot",
    ),
    pd_admission_sheds: counter(
        "smg_pd_admission_sheds_total",
        "PD dispatches shed at the decode admission window",
    ),
    pd_links_open: gauge(
        "pdgate_pd_links_open",
        "Prefill -> decode links currently out of pair selection (link health)",
    ),
    pd_link_open: gauge_vec(
        "pdgate_pd_link_open",
        "A prefill -> decode link out of selection (1) or probing half-open (0); the series exists \
         only while the link is not closed, so its cardinality is the unhealthy links'",
        &["prefill", "decode"],
    ),
    pd_canaries: counter_vec(
        "pdgate_pd_canaries_total",
        "Link canaries sent, by result (passed: answered 2xx)",
        &["result"],
    ),
    pd_capacity_pressure: float_gauge_vec(
        "pdgate_pd_capacity_pressure",
        "Demand over capacity of each pool over the capacity window (>= 1: saturated; -1: unknown)",
        &["role"],
    ),
    pd_link_trips: counter(
        "pdgate_pd_link_trips_total",
        "Times a prefill -> decode link was taken out of pair selection",
    ),
    pd_handoff_outcome: remembered_counters(
        "pdgate_pd_handoff_outcome_total",
        "PD handoffs by outcome (transferred, recomputed, unknown, failed) and connector",
        &["outcome", "connector"],
    ),
    pd_recomputed_prompt_tokens: counter_vec(
        "pdgate_pd_recomputed_prompt_tokens_total",
        "Prompt tokens a decode engine recomputed instead of receiving their KV",
        &["connector"],
    ),
    admission_inflight: gauge(
        "smg_admission_inflight",
        "Requests currently holding an admission place (--max-concurrent-requests)",
    ),
    admission_queue_depth: gauge(
        "smg_admission_queue_depth",
        "Requests currently waiting in the admission queue",
    ),
    admission_queue_rejected: counter_vec(
        "smg_admission_queue_rejected_total",
        "Requests refused at admission by reason: full (queue full or queuing off), timeout \
         (waited --queue-timeout-secs), cancelled (the client left while queued)",
        &["reason"],
    ),
    admission_queue_wait: register_histogram!(
        "pdgate_admission_queue_wait_seconds",
        "Time admitted requests spent in the admission queue (requests that waited)",
        DURATION_BUCKETS.to_vec()
    )
    .expect("metric names are unique and valid"),
    http_rate_limit: counter_vec(
        "smg_http_rate_limit_total",
        "Admission decisions by result (allowed/rejected)",
        &["result"],
    ),
    worker_selection: remembered_counters(
        "smg_worker_selection_total",
        "Worker picks per leg",
        &["worker_type", "connection_mode", "model", "policy"],
    ),
    worker_requests_active: gauge_vec(
        "smg_worker_requests_active",
        "In-flight requests per worker",
        &["worker"],
    ),
    worker_health: gauge_vec(
        "smg_worker_health",
        "Worker health (1 ready, 0 not)",
        &["worker"],
    ),
    worker_health_checks: counter_vec(
        "smg_worker_health_checks_total",
        "Health probes by leg and result",
        &["worker_type", "result"],
    ),
    worker_cb_state: gauge_vec(
        "smg_worker_cb_state",
        "Circuit breaker state per worker (0 closed, 1 open, 2 half-open)",
        &["worker"],
    ),
    worker_cb_transitions: counter_vec(
        "smg_worker_cb_transitions_total",
        "Circuit breaker state changes",
        &["worker", "from", "to"],
    ),
    worker_cb_health_readmissions: counter_vec(
        "smg_worker_cb_health_readmissions_total",
        "Times a worker's open circuit breaker went half-open because the worker's health returned (its promotion to Ready) rather than at the breaker's timeout",
        &["worker"],
    ),
    worker_cb_outcomes: counter_vec(
        "smg_worker_cb_outcomes_total",
        "Outcomes recorded by circuit breakers",
        &["worker", "outcome"],
    ),
    worker_cb_consecutive_failures: gauge_vec(
        "smg_worker_cb_consecutive_failures",
        "Consecutive failures seen by a worker's breaker",
        &["worker"],
    ),
    worker_cb_consecutive_successes: gauge_vec(
        "smg_worker_cb_consecutive_successes",
        "Consecutive successes seen by a worker's breaker",
        &["worker"],
    ),
    worker_retries: counter_vec(
        "smg_worker_retries_total",
        "Retries (a new pair for a failed attempt), counted on both legs",
        &["worker_type", "endpoint"],
    ),
    worker_retries_exhausted: counter_vec(
        "smg_worker_retries_exhausted_total",
        "Requests whose retryable failure ran out of attempts",
        &["worker_type", "endpoint"],
    ),
    worker_retry_backoff: register_histogram_vec!(
        "smg_worker_retry_backoff_seconds",
        "Backoff slept before a retry",
        &["attempt"],
        vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]
    )
    .expect("metric names are unique and valid"),
    worker_overload_shed: counter_vec(
        "smg_worker_overload_shed_total",
        "Requests shed by overload protection",
        &["stage"],
    ),
    workers_overloaded: gauge_vec(
        "smg_workers_overloaded",
        "Workers currently flagged overloaded",
        &["model"],
    ),
    worker_errors: counter_vec(
        "smg_worker_errors_total",
        "Failed legs by worker type and error type",
        &["worker_type", "connection_mode", "error_type"],
    ),
    handoffs_open: register_int_gauge!(
        "pdgate_handoffs_open",
        "Rendezvous (rooms, transfer ids) minted by the gateway whose legs have not all ended"
    )
    .expect("metric names are unique and valid"),
    handoffs_abnormal: counter(
        "pdgate_handoffs_abnormal_total",
        "Rendezvous whose request ended abnormally (error, hang-up, timeout)",
    ),
    trace_spans_exported: counter(
        "pdgate_trace_spans_exported_total",
        "Trace spans the OTLP collector accepted (--enable-trace)",
    ),
    trace_spans_dropped: counter_vec(
        "pdgate_trace_spans_dropped_total",
        "Trace spans lost: queue_full (the exporter fell behind), export_failed (the collector refused or was unreachable), shutdown (the process exited first)",
        &["reason"],
    ),
    http_requests: remembered_counters(
        "smg_http_requests_total",
        "HTTP requests by method and route",
        &["method", "path"],
    ),
    http_request_duration: remembered_histogram(
        "smg_http_request_duration_seconds",
        "HTTP request duration by method and route",
        &["method", "path"],
    ),
    worker_pool_size: gauge_vec(
        "smg_worker_pool_size",
        "Registered workers by leg, connection mode and model",
        &["worker_type", "connection_mode", "model"],
    ),
    worker_routing_keys_active: gauge_vec(
        "smg_worker_routing_keys_active",
        "In-flight requests carrying a sticky routing key, per worker",
        &["worker"],
    ),
    config_reloads: counter_vec(
        "pdgate_config_reloads_total",
        "Config reloads (SIGHUP, POST /reload) by result",
        &["result"],
    ),
    http_responses: remembered_counters(
        "smg_http_responses_total",
        "Responses by path, status and gateway error code",
        &["path", "status_code", "error_code"],
    ),
    engine_pd_kv_transfer_latency_ms: float_gauge_vec(
        "smg_engine_pd_kv_transfer_latency_ms",
        "Engine-reported PD KV transfer latency (ms); -1 once the worker left Ready",
        ENGINE_PD_LABELS,
    ),
    engine_pd_kv_transfer_speed_gb_s: float_gauge_vec(
        "smg_engine_pd_kv_transfer_speed_gb_s",
        "Engine-reported PD KV transfer speed (GB/s); -1 once the worker left Ready",
        ENGINE_PD_LABELS,
    ),
    engine_pd_prefill_queue_reqs: float_gauge_vec(
        "smg_engine_pd_prefill_queue_reqs",
        "Engine-reported PD prefill queue depth (bootstrap + in flight); -1 once the worker left Ready",
        ENGINE_PD_LABELS,
    ),
    engine_pd_decode_queue_reqs: float_gauge_vec(
        "smg_engine_pd_decode_queue_reqs",
        "Engine-reported PD decode queue depth (pre-allocation + transfer + retracted); -1 once the worker left Ready",
        ENGINE_PD_LABELS,
    ),
}
});

/// Forces registration so every series family exists from the first scrape.
pub fn init() {
    LazyLock::force(&METRICS);
}

/// Text exposition of the default registry (what `/metrics` serves).
pub fn render() -> Vec<u8> {
    use prometheus::Encoder;
    let mut out = Vec::with_capacity(16 * 1024);
    let _ = prometheus::TextEncoder::new().encode(&prometheus::gather(), &mut out);
    out
}
