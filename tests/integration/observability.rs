//! Observability through the real binary (issue 7; spec "Monitoring", http-pd-spec §7): after
//! mixed traffic — an SGLang pair (parallel dispatch) and vLLM prefills with and without a KV
//! connector (sequential dispatch), streamed and not, errors, retries, a breaker trip and an
//! overload shed — every spec series is exported with its type and labels, `promtool` accepts the
//! exposition, the spec's PromQL answers from a real Prometheus server, every Grafana panel
//! queries exported series, request ids and W3C trace context reach both legs, and the logs obey
//! `RUST_LOG` with one access line per request.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use mock_engine::client::{self, Response};
use mock_engine::{
    Connector, EngineKind, Fault, FaultMatch, LoadReport, MockEngine, MockEngineConfig,
    RequestRecord, Role,
};
use serde_json::{json, Value};

use crate::harness::{free_port, metric_value, Gateway};

// ---- the fleet and the traffic ---------------------------------------------------------------

/// An SGLang pair, and two vLLM prefills (NIXL, and one registered without a connector, so its
/// dispatches run passthrough) sharing a NIXL decode; all serve `mock-model`. Lenient pairing keeps
/// the runtimes apart, and round robin over the three prefills reaches every pair.
struct MixedFleet {
    sglang_prefill: MockEngine,
    sglang_decode: MockEngine,
    vllm_prefill: MockEngine,
    vllm_passthrough: MockEngine,
    vllm_decode: MockEngine,
}

const MODEL: &str = "mock-model";

/// Gateway keys of the observed gateway: two attempts per request, a breaker that opens after two
/// failures and recovers after a second, and overload protection fed every second.
const OBSERVED: &str = "  retry_max_retries: 2\n  retry_initial_backoff_ms: 1\n  \
                        retry_max_backoff_ms: 5\n  cb_failure_threshold: 2\n  \
                        cb_success_threshold: 1\n  cb_timeout_duration_secs: 1\n  \
                        worker_overload_waiting_requests: 4\n  load_monitor_interval: 1\n";

impl MixedFleet {
    async fn start() -> MixedFleet {
        MixedFleet {
            sglang_prefill: mock(EngineKind::Sglang, Role::Prefill, 2).await,
            sglang_decode: mock(EngineKind::Sglang, Role::Decode, 3).await,
            vllm_prefill: mock(EngineKind::Vllm, Role::Prefill, 5).await,
            vllm_passthrough: mock(EngineKind::Vllm, Role::Prefill, 6).await,
            vllm_decode: mock(EngineKind::Vllm, Role::Decode, 7).await,
        }
    }

    fn workers(&self) -> Vec<Value> {
        let mut passthrough = self.vllm_passthrough.worker_spec();
        passthrough
            .as_object_mut()
            .expect("a worker spec is an object")
            .remove("kv_connector");
        if let Some(labels) = passthrough["labels"].as_object_mut() {
            labels.remove("kv_connector");
        }
        vec![
            self.sglang_prefill.worker_spec(),
            self.vllm_prefill.worker_spec(),
            passthrough,
            self.sglang_decode.worker_spec(),
            self.vllm_decode.worker_spec(),
        ]
    }

    fn prefills(&self) -> [&MockEngine; 3] {
        [
            &self.sglang_prefill,
            &self.vllm_prefill,
            &self.vllm_passthrough,
        ]
    }

    fn decodes(&self) -> [&MockEngine; 2] {
        [&self.sglang_decode, &self.vllm_decode]
    }

    /// A gateway over the whole fleet, returned once every worker is ready (so round robin
    /// reaches all three prefills).
    async fn gateway(&self, extra: &str, env: &[(&str, &str)]) -> Gateway {
        let gw = Gateway::start_with_env(&self.workers(), extra, env).await;
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            let w = gw.get("/workers").await.json();
            let all = w["workers"].as_array().cloned().unwrap_or_default();
            if all.len() == 5 && all.iter().all(|w| w["status"] == "ready") {
                return gw;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "workers never all became ready: {}\n{}",
            gw.get("/workers").await.text(),
            gw.log()
        );
    }

    /// The prefill and decode legs that carry `x-request-id: id` (a retry adds more).
    fn legs_of(&self, id: &str) -> (Vec<Leg>, Vec<Leg>) {
        let with_id = |engines: &[&MockEngine]| -> Vec<Leg> {
            engines
                .iter()
                .flat_map(|e| {
                    let url = e.api_url();
                    e.records().into_iter().map(move |record| Leg {
                        url: url.clone(),
                        record,
                    })
                })
                .filter(|l| l.record.x_request_id.as_deref() == Some(id))
                .collect()
        };
        (with_id(&self.prefills()), with_id(&self.decodes()))
    }
}

/// A mock engine on `127.0.0.<octet>` (vLLM ones with NIXL, SGLang ones with Mooncake).
async fn mock(engine: EngineKind, role: Role, octet: u8) -> MockEngine {
    MockEngine::spawn(MockEngineConfig::test(engine, role, [127, 0, 0, octet]))
        .await
        .unwrap_or_else(|e| panic!("{engine:?} {role:?} mock on 127.0.0.{octet}: {e}"))
}

/// One leg as an engine recorded it, and that engine's URL (its worker URL at the gateway).
#[derive(Debug)]
struct Leg {
    url: String,
    record: RequestRecord,
}

impl Leg {
    fn header(&self, name: &str) -> Option<&str> {
        self.record.header(name)
    }

    fn is_sglang(&self) -> bool {
        self.record.handoff.protocol.starts_with("sglang")
    }
}

fn chat(content: &str, stream: bool) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4, "stream": stream})
}

/// The routes both runtimes serve, streamed or not.
fn routes(stream: bool) -> [(&'static str, Value); 3] {
    [
        (
            "/v1/chat/completions",
            chat("Tell me about KV caches", stream),
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "Disaggregated serving is", "max_tokens": 4, "stream": stream}),
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "Why split prefill and decode?", "max_output_tokens": 4, "stream": stream}),
        ),
    ]
}

async fn post_with(gw: &Gateway, path: &str, headers: &[(&str, &str)], body: Bytes) -> Response {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    client::request("POST", &gw.url(path), &all, Some(body))
        .await
        .unwrap_or_else(|e| panic!("POST {path}: {e}\n{}", gw.log()))
}

async fn post_json_with(
    gw: &Gateway,
    path: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Response {
    post_with(gw, path, headers, Bytes::from(body.to_string())).await
}

/// Sends the chat request `body` until `done` holds for an answer, within `deadline`.
async fn chat_until(
    gw: &Gateway,
    what: &str,
    deadline: Duration,
    body: &Value,
    mut done: impl FnMut(&Response) -> bool,
) {
    let end = Instant::now() + deadline;
    let mut statuses = Vec::new();
    while Instant::now() < end {
        let r = gw.post("/v1/chat/completions", body).await;
        statuses.push(r.status);
        if done(&r) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "{what}: not seen within {deadline:?} (statuses {statuses:?})\n{}",
        gw.log()
    );
}

/// Sends the chat request `body` (answered 200 or 503) until the exposition satisfies `ready`.
async fn chat_until_exposition(
    gw: &Gateway,
    what: &str,
    body: &Value,
    ready: impl Fn(&str) -> bool,
) {
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let r = gw.post("/v1/chat/completions", body).await;
        assert!(r.status == 200 || r.status == 503, "{what}: {}", r.text());
        let m = gw.metrics().await;
        if ready(&m) {
            return;
        }
        assert!(Instant::now() < end, "{what}: not seen within 15 s\n{m}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn fail_status(status: u16, count: u32, matcher: FaultMatch) -> Fault {
    Fault::FailStatus {
        status,
        body: None,
        count: Some(count),
        matcher,
    }
}

/// Real traffic through every path the spec's series describe; returns the exposition after it.
async fn drive_traffic(fleet: &MixedFleet, gw: &Gateway) -> String {
    // Both runtimes, every shared route, streamed and not; two rounds over three prefills.
    for stream in [false, true] {
        for _ in 0..2 {
            for (path, body) in routes(stream) {
                let r = post_json_with(gw, path, &[("x-smg-routing-key", "tenant-a")], &body).await;
                assert_eq!(r.status, 200, "{path} stream={stream}: {}", r.text());
            }
        }
    }

    // Errors: a body that is not JSON (ours, 400) and a decode that refuses (the engine's, 400).
    let r = post_with(
        gw,
        "/v1/chat/completions",
        &[],
        Bytes::from_static(b"{not json"),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
    let refusing = FaultMatch {
        route: None,
        role: Some(Role::Decode),
    };
    for d in fleet.decodes() {
        d.inject(fail_status(400, 1, refusing.clone())).await;
    }
    let mut refused = 0;
    chat_until(
        gw,
        "both decodes answering 400",
        Duration::from_secs(10),
        &chat("refuse me", false),
        |r| {
            refused += usize::from(r.status == 400);
            refused == 2
        },
    )
    .await;

    // Retries: every prefill fails once with 503. Round robin gives the first request two failing
    // attempts (exhausted) and the next one a failure then a success (a retry).
    for p in fleet.prefills() {
        p.inject(fail_status(503, 1, FaultMatch::default())).await;
    }
    chat_until_exposition(
        gw,
        "a retry and an exhausted retry",
        &chat("retry me", false),
        |m| {
            metric_value(m, "smg_worker_retries_total", &[("worker_type", "prefill")]).is_some()
                && metric_value(
                    m,
                    "smg_worker_retries_exhausted_total",
                    &[("worker_type", "prefill")],
                )
                .is_some()
        },
    )
    .await;

    // A breaker trip: the SGLang decode fails twice (each retried on a vLLM pair), its breaker
    // opens, half-opens after a second and closes on the next success.
    fleet
        .sglang_decode
        .inject(fail_status(503, 2, FaultMatch::default()))
        .await;
    let decode = fleet.sglang_decode.api_url();
    let what = "the SGLang decode breaker opening and closing again";
    chat_until_exposition(gw, what, &chat("trip the breaker", false), |m| {
        let opened = [("worker", decode.as_str()), ("to", "open")];
        metric_value(m, "smg_worker_cb_transitions_total", &opened).is_some()
            && metric_value(m, "smg_worker_cb_state", &[("worker", &decode)]) == Some(0.0)
    })
    .await;

    // An overload shed: both decodes report a long queue until the gateway sheds, then recover.
    let busy = LoadReport {
        waiting: 8,
        running: 1,
        token_usage: 0.5,
    };
    for d in fleet.decodes() {
        d.report_load(Some(busy));
    }
    chat_until(
        gw,
        "an overload shed",
        Duration::from_secs(10),
        &chat("shed me", false),
        |r| r.status == 503 && r.json()["error"]["code"] == "worker_overload_protection_shed",
    )
    .await;
    for d in fleet.decodes() {
        d.report_load(None);
    }
    chat_until(
        gw,
        "service after the shed",
        Duration::from_secs(10),
        &chat("back", true),
        |r| r.status == 200,
    )
    .await;
    gw.metrics().await
}

/// A fleet and its gateway, after [`drive_traffic`].
async fn observed() -> (MixedFleet, Gateway, String) {
    let fleet = MixedFleet::start().await;
    let gw = fleet.gateway(OBSERVED, &[]).await;
    let exposition = drive_traffic(&fleet, &gw).await;
    (fleet, gw, exposition)
}

// ---- the exposition ---------------------------------------------------------------------------

/// One metric family of a text exposition.
#[derive(Debug, Default)]
struct Family {
    kind: String,
    /// Label names of each sample (`le` and `quantile` excluded).
    label_sets: BTreeSet<Vec<String>>,
    samples: usize,
}

/// Families by name, from `# TYPE` lines and the samples under them.
fn families(exposition: &str) -> BTreeMap<String, Family> {
    let mut out: BTreeMap<String, Family> = BTreeMap::new();
    let mut current = String::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            current = it.next().unwrap_or_default().to_string();
            out.entry(current.clone()).or_default().kind =
                it.next().unwrap_or_default().to_string();
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (name, labels) = parse_sample(line);
        let family = out.entry(current.clone()).or_default();
        assert!(
            name.starts_with(current.as_str()),
            "sample {name} sits under # TYPE {current}"
        );
        family.samples += 1;
        family.label_sets.insert(
            labels
                .into_keys()
                .filter(|k| k != "le" && k != "quantile")
                .collect(),
        );
    }
    out
}

/// A sample line's name and labels (values unescaped).
fn parse_sample(line: &str) -> (String, BTreeMap<String, String>) {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    if line[name_end..].starts_with('{') {
        let mut chars = line[name_end + 1..].chars().peekable();
        loop {
            let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
            if key.is_empty() {
                break;
            }
            assert_eq!(chars.next(), Some('"'), "label {key} of {line}");
            let mut value = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.push(match chars.next() {
                        Some('n') => '\n',
                        Some(other) => other,
                        None => break,
                    }),
                    '"' => break,
                    c => value.push(c),
                }
            }
            labels.insert(key.trim_start_matches(',').to_string(), value);
            if chars.peek() == Some(&',') {
                chars.next();
            }
            if chars.peek() == Some(&'}') {
                break;
            }
        }
    }
    (name, labels)
}

/// Every sample name of an exposition (`x_bucket`, `x_sum`, `x_count` for a histogram `x`).
fn sample_names(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| parse_sample(l).0)
        .collect()
}

const PD_LABELS: &[&str] = &["backend_type", "model", "runtime"];
const ROUTER_LABELS: &[&str] = &[
    "router_type",
    "backend_type",
    "connection_mode",
    "model",
    "endpoint",
];

/// The spec's "PD Metrics" table, its "Related series", and the series http-pd-spec §7 says the
/// HTTP path records that pdgate exports: (name, type, label names).
const SPEC_SERIES: &[(&str, &str, &[&str])] = &[
    ("smg_pd_ttft_seconds", "histogram", PD_LABELS),
    ("smg_pd_prefill_duration_seconds", "histogram", PD_LABELS),
    // `smg_pd_kv_transfer_duration_seconds` is recorded on gRPC vLLM pairs only (the spec's
    // table); this HTTP traffic must leave it empty (below, and grpc_pd for gRPC).
    ("smg_pd_kv_connector_mode_total", "counter", &["mode"]),
    ("smg_pd_kv_transfer_failures_total", "counter", &[]),
    ("smg_pd_bootstrap_failures_total", "counter", &[]),
    ("smg_pd_admission_waits_total", "counter", &[]),
    ("smg_pd_admission_sheds_total", "counter", &[]),
    (
        "smg_worker_selection_total",
        "counter",
        &["worker_type", "connection_mode", "model", "policy"],
    ),
    ("smg_worker_requests_active", "gauge", &["worker"]),
    (
        "smg_router_requests_total",
        "counter",
        &[
            "router_type",
            "backend_type",
            "connection_mode",
            "model",
            "endpoint",
            "streaming",
        ],
    ),
    (
        "smg_router_request_duration_seconds",
        "histogram",
        ROUTER_LABELS,
    ),
    (
        "smg_router_request_errors_total",
        "counter",
        &[
            "router_type",
            "backend_type",
            "connection_mode",
            "model",
            "endpoint",
            "error_type",
        ],
    ),
    (
        "smg_worker_retries_total",
        "counter",
        &["worker_type", "endpoint"],
    ),
    (
        "smg_worker_retries_exhausted_total",
        "counter",
        &["worker_type", "endpoint"],
    ),
    ("smg_worker_cb_state", "gauge", &["worker"]),
    (
        "smg_worker_cb_transitions_total",
        "counter",
        &["worker", "from", "to"],
    ),
    (
        "smg_worker_cb_outcomes_total",
        "counter",
        &["worker", "outcome"],
    ),
    ("smg_worker_cb_consecutive_failures", "gauge", &["worker"]),
    ("smg_worker_cb_consecutive_successes", "gauge", &["worker"]),
    ("smg_worker_health", "gauge", &["worker"]),
    ("smg_worker_overload_shed_total", "counter", &["stage"]),
    ("smg_workers_overloaded", "gauge", &["model"]),
    (
        "smg_http_responses_total",
        "counter",
        &["path", "status_code", "error_code"],
    ),
];

/// More series http-pd-spec §7 lists as recorded on the HTTP path.
const SPEC_SERIES_MISSING: &[(&str, &str, &[&str])] = &[
    (
        "smg_worker_errors_total",
        "counter",
        &["worker_type", "connection_mode", "error_type"],
    ),
    (
        "smg_worker_health_checks_total",
        "counter",
        &["worker_type", "result"],
    ),
    ("smg_worker_routing_keys_active", "gauge", &["worker"]),
    (
        "smg_worker_pool_size",
        "gauge",
        &["worker_type", "connection_mode", "model"],
    ),
    ("smg_http_requests_total", "counter", &["method", "path"]),
    (
        "smg_http_request_duration_seconds",
        "histogram",
        &["method", "path"],
    ),
    // SMG exports this one as a summary ("Other histograms ... are exported as summaries"); the
    // Rust prometheus crate has no summary type, so pdgate exports a histogram: a
    // histogram_quantile() query replaces a quantile-label query. Documented in docs/.
    (
        "smg_worker_retry_backoff_seconds",
        "histogram",
        &["attempt"],
    ),
];

/// Problems of `exposition` against `spec`: a family missing, of another type, or with other
/// label names than the spec's.
fn spec_mismatches(exposition: &str, spec: &[(&str, &str, &[&str])]) -> Vec<String> {
    let found = families(exposition);
    let mut problems = Vec::new();
    for (name, kind, labels) in spec {
        let want: Vec<String> = {
            let mut v: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
            v.sort();
            v
        };
        match found.get(*name) {
            None => problems.push(format!("{name}: not exported")),
            Some(f) if f.kind != *kind => {
                problems.push(format!("{name}: # TYPE {}, the spec says {kind}", f.kind))
            }
            Some(f) if f.samples == 0 => problems.push(format!("{name}: no samples")),
            Some(f) => {
                for set in &f.label_sets {
                    if *set != want {
                        problems.push(format!("{name}: labels {set:?}, the spec says {want:?}"));
                    }
                }
            }
        }
    }
    problems
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_spec_series_is_exported_with_its_type_and_labels() {
    let (_fleet, gw, m) = observed().await;
    let problems = spec_mismatches(&m, SPEC_SERIES);
    assert!(problems.is_empty(), "{problems:#?}\n{m}");

    // And they mean what the spec says, for this traffic.
    for runtime in ["sglang", "vllm"] {
        let labels = [
            ("backend_type", "pd"),
            ("model", MODEL),
            ("runtime", runtime),
        ];
        for h in [
            "smg_pd_ttft_seconds_count",
            "smg_pd_prefill_duration_seconds_count",
        ] {
            assert!(
                metric_value(&m, h, &labels).unwrap_or(0.0) >= 1.0,
                "{h} for {runtime}\n{m}"
            );
        }
    }
    assert_eq!(
        metric_value(&m, "smg_pd_kv_transfer_duration_seconds_count", &[]),
        None,
        "recorded for gRPC vLLM only\n{m}"
    );
    for mode in ["nixl", "passthrough"] {
        assert!(
            metric_value(&m, "smg_pd_kv_connector_mode_total", &[("mode", mode)]).unwrap_or(0.0)
                >= 1.0,
            "mode={mode}\n{m}"
        );
    }
    for counter in [
        "smg_pd_admission_waits_total",
        "smg_pd_admission_sheds_total",
    ] {
        assert_eq!(
            metric_value(&m, counter, &[]),
            Some(0.0),
            "{counter} is gRPC only"
        );
    }
    let http_pd = [
        ("router_type", "http"),
        ("backend_type", "pd"),
        ("connection_mode", "http"),
        ("model", MODEL),
    ];
    for endpoint in ["chat", "completions", "responses"] {
        for streaming in ["true", "false"] {
            let mut l = http_pd.to_vec();
            l.extend([("endpoint", endpoint), ("streaming", streaming)]);
            assert!(
                metric_value(&m, "smg_router_requests_total", &l).unwrap_or(0.0) >= 2.0,
                "{endpoint} streaming={streaming}\n{m}"
            );
        }
        let mut l = http_pd.to_vec();
        l.push(("endpoint", endpoint));
        assert!(
            metric_value(&m, "smg_router_request_duration_seconds_count", &l).is_some(),
            "{endpoint}\n{m}"
        );
    }
    assert!(
        metric_value(
            &m,
            "smg_router_request_errors_total",
            &[("endpoint", "chat"), ("error_type", "validation_error")]
        )
        .is_some(),
        "{m}"
    );
    for leg in ["prefill", "decode"] {
        let l = [
            ("worker_type", leg),
            ("connection_mode", "http"),
            ("model", MODEL),
            ("policy", "round_robin"),
        ];
        assert!(
            metric_value(&m, "smg_worker_selection_total", &l).is_some(),
            "{leg}\n{m}"
        );
        assert!(
            metric_value(
                &m,
                "smg_worker_retries_total",
                &[("worker_type", leg), ("endpoint", "chat")]
            )
            .is_some(),
            "{leg}\n{m}"
        );
    }
    assert!(
        metric_value(
            &m,
            "smg_worker_overload_shed_total",
            &[("stage", "selection")]
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{m}"
    );
    let urls: Vec<String> = gw.get("/workers").await.json()["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .map(|w| w["url"].as_str().expect("url").to_string())
        .collect();
    for url in &urls {
        assert_eq!(
            metric_value(&m, "smg_worker_health", &[("worker", url)]),
            Some(1.0),
            "{url}\n{m}"
        );
    }
    // Every worker served, and its in-flight gauge returns to 0 once the traffic ended (legs
    // drained in the background included).
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let m = gw.metrics().await;
        let active: Vec<Option<f64>> = urls
            .iter()
            .map(|u| metric_value(&m, "smg_worker_requests_active", &[("worker", u)]))
            .collect();
        if active.iter().all(|a| *a == Some(0.0)) {
            break;
        }
        assert!(
            Instant::now() < end,
            "in-flight gauges after the traffic: {urls:?} {active:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_http_path_records_in_smg_is_exported() {
    let (_fleet, _gw, m) = observed().await;
    let problems = spec_mismatches(&m, SPEC_SERIES_MISSING);
    assert!(problems.is_empty(), "{problems:#?}");
}

// ---- promtool -----------------------------------------------------------------------------------

/// `name` on PATH; panics naming the fix when it is not (CI runs `scripts/setup.sh` first).
fn required_tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on PATH: run scripts/setup.sh (it installs Debian's `prometheus` \
                 package, which provides promtool and prometheus)"
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_check_metrics_accepts_the_exposition() {
    let promtool = required_tool("promtool");
    let (_fleet, _gw, m) = observed().await;
    let mut child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("promtool stdin");
        stdin.write_all(m.as_bytes()).expect("feed promtool");
    }
    let out = child.wait_with_output().expect("promtool output");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("promtool check metrics: {} {report}", out.status);
    assert!(
        out.status.success(),
        "promtool check metrics: {report}\n{m}"
    );
    assert!(report.trim().is_empty(), "promtool lint findings: {report}");
}

// ---- a real Prometheus server --------------------------------------------------------------------

/// A Prometheus server on loopback scraping one gateway every second; killed (and its data
/// removed) on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    async fn scraping(gw: &Gateway) -> Prometheus {
        let bin = required_tool("prometheus");
        let port = free_port();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("prometheus-{port}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("create the Prometheus dir");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: pdgate\n    static_configs:\n      \
                 - targets: ['127.0.0.1:{}']\n",
                gw.prometheus_port
            ),
        )
        .expect("write the Prometheus config");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("Prometheus log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::from(log.try_clone().expect("clone the log handle")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start prometheus");
        let mut p = Prometheus { child, port, dir };
        let end = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("prometheus exited ({status})\n{}", p.log());
            }
            if matches!(client::get(&p.url("/-/ready")).await, Ok(r) if r.status == 200) {
                return p;
            }
            assert!(
                Instant::now() < end,
                "prometheus never got ready\n{}",
                p.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/query?query=...`: the JSON answer.
    async fn query(&self, promql: &str) -> Value {
        let url = self.url(&format!("/api/v1/query?query={}", form_encode(promql)));
        let r = client::get(&url)
            .await
            .unwrap_or_else(|e| panic!("query {promql}: {e}"));
        serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("query {promql}: {e}: {}", r.text()))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
fn form_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The spec's "PromQL Queries", verbatim (comment lines included: PromQL accepts them).
const SPEC_PROMQL: &[&str] = &[
    "# p95 PD time to first token by model\n\
     histogram_quantile(0.95,\n  sum by (le, model) (rate(smg_pd_ttft_seconds_bucket[5m])))",
    "# Share of vLLM PD dispatches running passthrough\n\
     sum(rate(smg_pd_kv_connector_mode_total{mode=\"passthrough\"}[5m]))\n  \
     / sum(rate(smg_pd_kv_connector_mode_total[5m]))",
    "# gRPC PD dispatches shed at the decode window\nrate(smg_pd_admission_sheds_total[5m])",
    "# In-flight requests per worker\nsmg_worker_requests_active",
];

/// The samples of an instant-vector answer: (labels, value).
fn vector(answer: &Value) -> Vec<(Value, f64)> {
    answer["data"]["result"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    let v = r["value"][1]
                        .as_str()
                        .and_then(|s| s.parse::<f64>().ok())
                        .unwrap_or(f64::NAN);
                    (r["metric"].clone(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Keeps chat and completion requests flowing (both runtimes, streamed and not) until dropped.
struct BackgroundTraffic {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<usize>,
}

impl BackgroundTraffic {
    fn start(gw: &Gateway) -> BackgroundTraffic {
        let stop = Arc::new(AtomicBool::new(false));
        let url = gw.url("");
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut sent = 0usize;
            while !flag.load(Ordering::Relaxed) {
                for (path, body) in routes(sent % 2 == 1) {
                    let _ = client::post_json(format!("{url}{path}"), &body).await;
                    sent += 1;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            sent
        });
        BackgroundTraffic { stop, task }
    }

    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or(0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spec_promql_queries_return_data_from_a_real_prometheus() {
    required_tool("prometheus");
    let (_fleet, gw, _) = observed().await;
    let prometheus = Prometheus::scraping(&gw).await;
    let traffic = BackgroundTraffic::start(&gw);

    let end = Instant::now() + Duration::from_secs(30);
    let mut answers: BTreeMap<&str, Vec<(Value, f64)>> = BTreeMap::new();
    loop {
        answers.clear();
        for q in SPEC_PROMQL {
            let a = prometheus.query(q).await;
            assert_eq!(a["status"], "success", "{q}: {a}");
            answers.insert(q, vector(&a));
        }
        let all_data = answers
            .values()
            .all(|rows| !rows.is_empty() && rows.iter().all(|(_, v)| v.is_finite()));
        if all_data {
            break;
        }
        assert!(
            Instant::now() < end,
            "the spec's PromQL returned no data within 30 s: {answers:#?}\n{}",
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let sent = traffic.stop().await;
    for (q, rows) in &answers {
        eprintln!("PromQL {q}\n  => {rows:?}");
    }
    assert!(sent > 0);

    let ttft = &answers[SPEC_PROMQL[0]];
    assert!(
        ttft.iter().any(|(l, v)| l["model"] == MODEL && *v > 0.0),
        "p95 TTFT by model: {ttft:?}"
    );
    let share = answers[SPEC_PROMQL[1]][0].1;
    assert!(share > 0.0 && share < 1.0, "passthrough share {share}");
    assert_eq!(
        answers[SPEC_PROMQL[2]][0].1, 0.0,
        "admission sheds are gRPC only"
    );
    let active: BTreeSet<String> = answers[SPEC_PROMQL[3]]
        .iter()
        .filter_map(|(l, _)| l["worker"].as_str().map(str::to_string))
        .collect();
    assert!(
        active.len() >= 5,
        "active requests for every worker: {active:?}"
    );

    // Every dashboard query is valid PromQL to the real parser (with Grafana's variables set).
    for (panel, expr) in dashboard_queries() {
        let q = expr
            .replace("$__rate_interval", "1m")
            .replace("$__interval", "15s")
            .replace("$__range", "5m")
            .replace("${model}", ".*")
            .replace("$model", ".*");
        let a = prometheus.query(&q).await;
        assert_eq!(a["status"], "success", "panel {panel:?}: {q}: {a}");
    }
}

// ---- the Grafana dashboard -----------------------------------------------------------------------

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn dashboard() -> Value {
    let path = repo("conf/grafana-dashboard.json");
    let text = std::fs::read_to_string(&path).expect("conf/grafana-dashboard.json");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every panel (rows' nested panels included) of the dashboard.
fn panels(d: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().cloned().unwrap_or_default() {
        out.extend(p["panels"].as_array().cloned().unwrap_or_default());
        out.push(p);
    }
    out
}

/// (panel title, PromQL) of every query: panel targets and query variables.
fn dashboard_queries() -> Vec<(String, String)> {
    let d = dashboard();
    let mut out = Vec::new();
    for p in panels(&d) {
        for t in p["targets"].as_array().cloned().unwrap_or_default() {
            let expr = t["expr"].as_str().expect("every target has an expr");
            out.push((
                p["title"].as_str().unwrap_or("?").to_string(),
                expr.to_string(),
            ));
        }
    }
    for v in d["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or(v["query"].as_str())
                .unwrap_or("");
            // label_values(metric, label) is Grafana's; its metric is what must exist.
            let metric = q
                .strip_prefix("label_values(")
                .and_then(|r| r.split(',').next())
                .unwrap_or(q);
            out.push((format!("variable {}", v["name"]), metric.trim().to_string()));
        }
    }
    out
}

/// The `smg_*` and `pdgate_*` metric names a PromQL expression references.
fn referenced_metrics(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        if starts_word && (expr[i..].starts_with("smg_") || expr[i..].starts_with("pdgate_")) {
            let end = expr[i..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(expr.len(), |e| i + e);
            out.insert(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn the_dashboard_is_a_grafana_model_on_a_prometheus_datasource_variable() {
    let d = dashboard();
    assert!(
        d["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    assert!(d["title"].is_string() && d["uid"].is_string());
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "a `datasource` variable of type prometheus"
    );
    let mut ids = BTreeSet::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        assert!(
            ids.insert(p["id"].as_u64().expect("numeric panel id")),
            "duplicate id: {title}"
        );
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${datasource}", "{title}");
            assert!(t["refId"].is_string(), "{title}: refId");
        }
    }
    let titles: String = panels(&d)
        .iter()
        .filter_map(|p| p["title"].as_str().map(str::to_lowercase))
        .collect::<Vec<_>>()
        .join("|");
    let queries: String = dashboard_queries()
        .into_iter()
        .map(|(_, q)| q)
        .collect::<Vec<_>>()
        .join("\n");
    for (what, needle) in [
        (
            "TTFT p50",
            "histogram_quantile(0.50, sum by (le, model) (rate(smg_pd_ttft_seconds_bucket",
        ),
        (
            "TTFT p95",
            "histogram_quantile(0.95, sum by (le, model) (rate(smg_pd_ttft_seconds_bucket",
        ),
        (
            "passthrough share",
            "smg_pd_kv_connector_mode_total{mode=\"passthrough\"}",
        ),
        ("overload sheds", "smg_worker_overload_shed_total"),
        ("admission sheds", "smg_pd_admission_sheds_total"),
        ("KV transfer failures", "smg_pd_kv_transfer_failures_total"),
        ("active requests", "smg_worker_requests_active"),
        ("breaker states", "smg_worker_cb_state"),
        ("worker health", "smg_worker_health"),
        ("request rate", "smg_router_requests_total"),
        ("errors", "smg_router_request_errors_total"),
        ("duration", "smg_router_request_duration_seconds_bucket"),
        ("retries", "smg_worker_retries_total"),
    ] {
        assert!(queries.contains(needle), "no {what} panel ({needle})");
    }
    assert!(titles.contains("circuit breaker state"), "{titles}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_references_an_exported_metric() {
    let (_fleet, _gw, m) = observed().await;
    let exported = sample_names(&m);
    let mut missing = Vec::new();
    for (panel, expr) in dashboard_queries() {
        let names = referenced_metrics(&expr);
        assert!(
            !names.is_empty(),
            "panel {panel:?} queries no smg_ or pdgate_ series: {expr}"
        );
        for name in names {
            // Recorded on gRPC vLLM pairs only (the spec's "PD Metrics" table); this traffic
            // is HTTP, and grpc_pd checks the series on its own path.
            const GRPC_ONLY: &[&str] = &["smg_pd_kv_transfer_duration_seconds_bucket"];
            if !exported.contains(&name) && !GRPC_ONLY.contains(&name.as_str()) {
                missing.push(format!("{panel}: {name}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "dashboard queries on series pdgate does not export: {missing:#?}"
    );
}

// ---- request ids and trace context --------------------------------------------------------------

fn is_generated(id: &str, prefix: &str) -> bool {
    id.strip_prefix(prefix)
        .is_some_and(|rest| rest.len() == 24 && rest.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The one prefill and one decode leg of a request that was not retried.
fn one_pair(fleet: &MixedFleet, id: &str) -> (Leg, Leg) {
    let (mut p, mut d) = fleet.legs_of(id);
    assert_eq!(
        (p.len(), d.len()),
        (1, 1),
        "legs with x-request-id {id}: {p:#?} {d:#?}"
    );
    (p.remove(0), d.remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_response_carries_x_request_id_and_both_legs_get_the_same_one() {
    let fleet = MixedFleet::start().await;
    let gw = fleet.gateway("", &[]).await;
    let mut runtimes = BTreeSet::new();

    // The client's id, from each of SMG's request-id headers, streamed and not.
    let mut n = 0;
    for header in [
        "x-request-id",
        "x-correlation-id",
        "x-trace-id",
        "request-id",
    ] {
        for stream in [false, true] {
            n += 1;
            let id = format!("client-{header}-{n}");
            let r = post_json_with(
                &gw,
                "/v1/chat/completions",
                &[(header, &id)],
                &chat("ids", stream),
            )
            .await;
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.header("x-request-id"), Some(id.as_str()), "{header}");
            let (p, d) = one_pair(&fleet, &id);
            runtimes.insert(p.record.handoff.protocol.clone());
            if header == "x-correlation-id" {
                assert_eq!(p.header("x-correlation-id"), Some(id.as_str()));
                assert_eq!(d.header("x-correlation-id"), Some(id.as_str()));
            }
        }
    }
    // x-request-id comes first in the lookup order.
    let r = post_json_with(
        &gw,
        "/v1/completions",
        &[("x-correlation-id", "second"), ("x-request-id", "first")],
        &routes(false)[1].1,
    )
    .await;
    assert_eq!(r.header("x-request-id"), Some("first"));
    one_pair(&fleet, "first");
    // An unfit value (a space in it, or empty) is passed over for the next header in the order.
    for (unfit, next) in [("has space", "third-1"), ("", "third-2")] {
        let r = post_json_with(
            &gw,
            "/v1/chat/completions",
            &[("x-trace-id", next), ("x-request-id", unfit)],
            &chat("ids", false),
        )
        .await;
        assert_eq!(r.header("x-request-id"), Some(next), "{unfit:?}");
        one_pair(&fleet, next);
    }

    // A generated id carries the route's prefix; both legs get it without the prefix, which
    // the engines add themselves (vLLM answered `chatcmpl-chatcmpl-…` when it was sent whole).
    for _ in 0..2 {
        for ((path, body), prefix) in routes(false)
            .into_iter()
            .zip(["chatcmpl-", "cmpl-", "resp-"])
        {
            let r = gw.post(path, &body).await;
            assert_eq!(r.status, 200, "{path}: {}", r.text());
            let id = r.header("x-request-id").expect("x-request-id").to_string();
            assert!(is_generated(&id, prefix), "{path}: {id}");
            let (p, _) = one_pair(&fleet, &id[prefix.len()..]);
            runtimes.insert(p.record.handoff.protocol.clone());
            let answer_id = r.json()["id"].as_str().unwrap_or_default().to_string();
            assert!(
                !answer_id.contains(&format!("{prefix}{prefix}"))
                    && !answer_id.contains("resp_resp"),
                "{path}: the engine's id doubled a prefix: {answer_id}"
            );
        }
    }
    let s = gw
        .stream("/v1/chat/completions", &chat("stream", true))
        .await;
    let id = s
        .header("x-request-id")
        .expect("x-request-id on a stream")
        .to_string();
    assert!(is_generated(&id, "chatcmpl-"), "{id}");
    drop(s.collect().await);
    assert!(
        runtimes.len() >= 2,
        "both dispatch modes were exercised: {runtimes:?}"
    );

    // Answers the gateway writes itself carry one too: refusals before any leg, local routes.
    for (path, prefix) in [
        ("/generate", "gnt-"),
        ("/v1/messages", "msg_"),
        ("/v1/rerank", "req-"),
    ] {
        let r = post_with(&gw, path, &[], Bytes::from_static(b"{not json")).await;
        assert_eq!(r.status, 400, "{path}");
        let id = r.header("x-request-id").unwrap_or_default();
        assert!(is_generated(id, prefix), "{path}: {id:?}");
    }
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", "bad-body")],
        Bytes::from_static(b"{"),
    )
    .await;
    assert_eq!(
        (r.status, r.header("x-request-id")),
        (400, Some("bad-body"))
    );
    for path in ["/health", "/readiness", "/workers", "/no/such/route"] {
        let r = gw.get(path).await;
        let id = r.header("x-request-id").unwrap_or_default();
        assert!(is_generated(id, "req-"), "{path}: {id:?}");
    }
    // A path no route serves is counted under SMG 1.13.0's `other`, never its raw path.
    let m = gw
        .metrics_when(|m| {
            metric_value(
                m,
                "smg_http_requests_total",
                &[("method", "GET"), ("path", "other")],
            )
            .is_some()
        })
        .await;
    assert!(
        metric_value(
            &m,
            "smg_http_requests_total",
            &[("method", "GET"), ("path", "other")]
        )
        .is_some(),
        "{m}"
    );
    assert!(!m.contains("/no/such/route"), "{m}");
    let r = client::request(
        "GET",
        &gw.url("/health"),
        &[("x-trace-id", "probe-1")],
        None,
    )
    .await
    .expect("GET /health");
    assert_eq!(r.header("x-request-id"), Some("probe-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_request_id_headers_replace_the_default_list() {
    let gw = Gateway::start(&[], "  request_id_headers: [X-Tenant-Request]\n").await;
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-tenant-request", "tenant-7")],
        Bytes::from_static(b"{"),
    )
    .await;
    assert_eq!(r.header("x-request-id"), Some("tenant-7"));
    let r = post_with(
        &gw,
        "/v1/chat/completions",
        &[("x-request-id", "not-looked-up")],
        Bytes::from_static(b"{"),
    )
    .await;
    let id = r.header("x-request-id").unwrap_or_default();
    assert!(is_generated(id, "chatcmpl-"), "{id:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w3c_trace_context_reaches_both_legs_unchanged() {
    let fleet = MixedFleet::start().await;
    let gw = fleet.gateway("", &[]).await;
    let mut protocols = BTreeSet::new();
    for i in 0..6u32 {
        let id = format!("trace-{i}");
        let traceparent = format!("00-4bf92f3577b34da6a3ce929d0e0e{i:04x}-00f067aa0ba902b7-01");
        let tracestate = format!("pdgate=t{i},congo=t61rcWkgMzE");
        let r = post_json_with(
            &gw,
            "/v1/chat/completions",
            &[
                ("x-request-id", &id),
                ("traceparent", &traceparent),
                ("tracestate", &tracestate),
            ],
            &chat("trace me", i % 2 == 1),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let (p, d) = one_pair(&fleet, &id);
        protocols.insert(p.record.handoff.protocol.clone());
        for leg in [&p, &d] {
            assert_eq!(
                leg.header("traceparent"),
                Some(traceparent.as_str()),
                "{} {id}",
                leg.url
            );
            assert_eq!(
                leg.header("tracestate"),
                Some(tracestate.as_str()),
                "{} {id}",
                leg.url
            );
        }
    }
    assert!(
        protocols.len() >= 2,
        "both dispatch modes were exercised: {protocols:?}"
    );
}

// ---- logs -------------------------------------------------------------------------------------------

/// One line of env_logger's format: `[<time> <LEVEL> <target>] <message>`.
struct LogLine<'a> {
    level: &'a str,
    target: &'a str,
    message: &'a str,
}

fn log_lines(log: &str) -> Vec<LogLine<'_>> {
    log.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix('[')?;
            let (head, message) = rest.split_once("] ")?;
            let mut it = head.split_whitespace();
            let _time = it.next()?;
            Some(LogLine {
                level: it.next()?,
                target: it.next()?,
                message,
            })
        })
        .collect()
}

/// `key=value` of an access-log message (`value` up to the next space).
fn field<'a>(message: &'a str, key: &str) -> Option<&'a str> {
    message
        .split(' ')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// The access-log lines of each request id, once every one has its line.
async fn access_lines(gw: &Gateway, ids: &[String]) -> BTreeMap<String, Vec<String>> {
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let log = gw.log();
        let mut by_id: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for l in log_lines(&log)
            .iter()
            .filter(|l| l.target == "pdgate::access")
        {
            assert_eq!(l.level, "INFO", "access lines are info: {}", l.message);
            if let Some(id) = field(l.message, "request_id") {
                by_id
                    .entry(id.to_string())
                    .or_default()
                    .push(l.message.to_string());
            }
        }
        if ids.iter().all(|id| by_id.contains_key(id)) {
            return by_id;
        }
        assert!(
            Instant::now() < end,
            "access lines missing for some of {ids:?}\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

const BODY_MARKER: &str = "PROMPT-SECRET-4f1c9b";

/// Sends `n` chat requests with ids `<prefix>-<i>` and the body marker; returns the ids.
async fn logged_requests(gw: &Gateway, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        let body = chat(&format!("{BODY_MARKER} {i}"), i % 2 == 1);
        let r = post_json_with(gw, "/v1/chat/completions", &[("x-request-id", &id)], &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
        ids.push(id);
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_log_filters_and_the_access_log_has_one_line_per_request() {
    let fleet = MixedFleet::start().await;
    let gw = fleet
        .gateway("", &[("RUST_LOG", "pdgate=info,pdgate::legs=debug")])
        .await;
    let ids = logged_requests(&gw, "log", 6).await;
    let by_id = access_lines(&gw, &ids).await;
    let log = gw.log();
    let lines = log_lines(&log);

    for id in &ids {
        let access = &by_id[id];
        assert_eq!(access.len(), 1, "one access line per request: {access:#?}");
        let a = &access[0];
        let (p, d) = one_pair(&fleet, id);
        let (prefill_url, decode_url) = (&p.url, &d.url);
        assert_eq!(field(a, "path"), Some("/v1/chat/completions"), "{a}");
        assert_eq!(field(a, "model"), Some(MODEL), "{a}");
        assert_eq!(field(a, "status"), Some("200"), "{a}");
        assert_eq!(field(a, "prefill"), Some(prefill_url.as_str()), "{a}");
        assert_eq!(field(a, "decode"), Some(decode_url.as_str()), "{a}");
        assert_eq!(field(a, "attempts"), Some("1"), "{a}");
        for ms in ["ttft_ms", "duration_ms"] {
            assert!(
                field(a, ms)
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(|v| v >= 0.0),
                "{ms}: {a}"
            );
        }
        if p.is_sglang() {
            let room = d.record.body["bootstrap_room"]
                .as_u64()
                .expect("a room on the decode leg");
            assert_eq!(field(a, "room"), Some(room.to_string().as_str()), "{a}");
        } else {
            // Sequential dispatch: the debug line names the pair and the relay.
            let relayed = d.record.body.get("kv_transfer_params").is_some();
            let debug: Vec<&LogLine> = lines
                .iter()
                .filter(|l| l.level == "DEBUG" && l.message.contains(id.as_str()))
                .collect();
            assert!(
                debug
                    .iter()
                    .any(|l| l.message.contains(prefill_url.as_str())
                        && l.message.contains(decode_url.as_str())
                        && l.message.contains(if relayed {
                            "kv_transfer_params relayed"
                        } else {
                            "kv_transfer_params absent"
                        })),
                "no debug line with the pair and the relay for {id}: {:#?}",
                debug.iter().map(|l| l.message).collect::<Vec<_>>()
            );
        }
    }
    for l in &lines {
        if l.level == "DEBUG" || l.level == "TRACE" {
            assert!(
                l.target.starts_with("pdgate::legs"),
                "RUST_LOG let a {} line of {} through: {}",
                l.level,
                l.target,
                l.message
            );
        } else {
            assert!(
                !l.message.contains(BODY_MARKER),
                "the request body was logged at {}: {}",
                l.level,
                l.message
            );
        }
    }
    assert!(
        lines.iter().any(|l| l.level == "DEBUG"),
        "no debug line at pdgate::legs=debug\n{log}"
    );

    // pdgate=info alone: the access lines, no debug, never the body.
    let gw = fleet.gateway("", &[("RUST_LOG", "pdgate=info")]).await;
    let ids = logged_requests(&gw, "info", 3).await;
    access_lines(&gw, &ids).await;
    let log = gw.log();
    assert!(
        !log.contains(BODY_MARKER),
        "the request body was logged at info\n{log}"
    );
    assert!(
        log_lines(&log)
            .iter()
            .all(|l| l.level != "DEBUG" && l.level != "TRACE"),
        "debug lines at pdgate=info\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_log_names_the_connector_and_transfer_id_and_debug_names_every_pair() {
    let fleet = MixedFleet::start().await;
    let gw = fleet
        .gateway("", &[("RUST_LOG", "pdgate=info,pdgate::legs=debug")])
        .await;
    let ids = logged_requests(&gw, "conn", 6).await;
    let by_id = access_lines(&gw, &ids).await;
    let log = gw.log();
    let mut problems = Vec::new();
    for id in &ids {
        let a = &by_id[id][0];
        let (p, d) = one_pair(&fleet, id);
        let mode = if p.is_sglang() {
            let debug = log_lines(&log).iter().any(|l| {
                l.level == "DEBUG"
                    && l.message.contains(id.as_str())
                    && l.message.contains(p.url.as_str())
                    && l.message.contains(d.url.as_str())
            });
            if !debug {
                problems.push(format!("{id}: no debug line naming its SGLang pair"));
            }
            continue;
        } else if p.record.body.get("kv_transfer_params").is_some() {
            "nixl"
        } else {
            "passthrough"
        };
        if field(a, "connector") != Some(mode) {
            problems.push(format!("{id}: no connector={mode}: {a}"));
        }
    }

    // Mooncake: the transfer id the gateway minted is on the access line.
    let spawn = |role, ip: [u8; 4]| {
        MockEngine::spawn(
            MockEngineConfig::test(EngineKind::Vllm, role, ip).with_connector(Connector::Mooncake),
        )
    };
    let p = spawn(Role::Prefill, [127, 0, 0, 8])
        .await
        .expect("Mooncake prefill");
    let d = spawn(Role::Decode, [127, 0, 0, 9])
        .await
        .expect("Mooncake decode");
    let mut gw = Gateway::start(&[p.worker_spec(), d.worker_spec()], "").await;
    gw.wait_ready().await;
    let ids = logged_requests(&gw, "mooncake", 1).await;
    let a = access_lines(&gw, &ids).await[&ids[0]][0].clone();
    let minted = p.records()[0].body["kv_transfer_params"]["transfer_id"]
        .as_str()
        .expect("a transfer id on the prefill leg")
        .to_string();
    if field(&a, "connector") != Some("mooncake") {
        problems.push(format!("mooncake: no connector=mooncake: {a}"));
    }
    if field(&a, "transfer_id") != Some(minted.as_str()) {
        problems.push(format!("mooncake: no transfer_id={minted}: {a}"));
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
