//! `grpc://` workers outside the request legs: registered from every source (the worker API by
//! URL alone, the YAML list, `pdgate launch`, reload), their runtime and facts read from the
//! servicer, shown in `GET /workers`, health-checked through `HealthCheck`, load-polled through
//! `GetLoads`, and never paired with an HTTP leg. Engines run on 127.0.20.x–127.0.28.x, IPs no
//! other test uses, so a killed engine's port stays free for its replacement.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mock_engine::{EngineKind, Fault, LoadReport, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

use crate::harness::{error_code, free_port, metric_value, pdgate_bin, Gateway, KillOnDrop};

async fn grpc_engine(engine: EngineKind, role: Role, ip: [u8; 4]) -> MockEngine {
    MockEngine::spawn(MockEngineConfig::grpc_test(engine, role, ip))
        .await
        .expect("gRPC mock engine")
}

fn grpc_url(e: &MockEngine) -> String {
    e.grpc_url().expect("a gRPC engine")
}

/// A `POST /workers` body with nothing but the URL and the role.
fn by_url(url: &str, worker_type: &str) -> Value {
    json!({"url": url, "worker_type": worker_type})
}

/// `GET /workers` from `base` (a gateway's URL), as a list.
async fn workers_at(base: &str) -> Vec<Value> {
    mock_engine::client::get(&format!("{base}/workers"))
        .await
        .map(|r| r.json()["workers"].as_array().cloned().unwrap_or_default())
        .unwrap_or_default()
}

/// Polls `GET /workers` until the worker at `url` satisfies `done`; returns it.
async fn wait_worker_at(base: &str, url: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let end = Instant::now() + Duration::from_secs(20);
    let mut last = Value::Null;
    while Instant::now() < end {
        if let Some(w) = workers_at(base).await.into_iter().find(|w| w["url"] == url) {
            if done(&w) {
                return w;
            }
            last = w;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("worker {url} never became {what}: {last}");
}

async fn wait_worker(gw: &Gateway, url: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    wait_worker_at(&gw.url(""), url, what, done).await
}

async fn wait_ready(gw: &Gateway, url: &str) -> Value {
    wait_worker(gw, url, "ready", |w| w["status"] == "ready").await
}

async fn register(gw: &Gateway, body: &Value) {
    let r = gw.post("/workers", body).await;
    assert_eq!(r.status, 202, "{}", r.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_grpc_engine_registered_by_url_alone_reports_its_runtime_and_facts() {
    let sglang = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 20, 1]).await;
    let vllm_p = grpc_engine(EngineKind::Vllm, Role::Prefill, [127, 0, 20, 2]).await;
    let vllm_d = grpc_engine(EngineKind::Vllm, Role::Decode, [127, 0, 20, 3]).await;
    let tokenspeed = grpc_engine(EngineKind::TokenSpeed, Role::Decode, [127, 0, 20, 4]).await;
    let gw = Gateway::start(&[], "").await;
    for (bad, why) in [
        (
            "grpcs://127.0.20.9:1",
            "grpcs:// (TLS) workers are not supported",
        ),
        ("grpc://127.0.20.9", "needs the servicer's port"),
    ] {
        let r = gw.post("/workers", &by_url(bad, "decode")).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains(why), "{bad}: {}", r.text());
    }
    for (e, role) in [
        (&sglang, "prefill"),
        (&vllm_p, "prefill"),
        (&vllm_d, "decode"),
        (&tokenspeed, "decode"),
    ] {
        register(&gw, &by_url(&grpc_url(e), role)).await;
    }

    let w = wait_ready(&gw, &grpc_url(&sglang)).await;
    assert_eq!(w["runtime_type"], "sglang", "{w}");
    assert_eq!(w["connection_mode"], "grpc", "{w}");
    assert_eq!(w["model_id"], "mock-model", "{w}");
    let labels = &w["labels"];
    assert_eq!(labels["max_context_length"], "32768", "{w}");
    assert_eq!(labels["disaggregation_transfer_backend"], "mooncake", "{w}");
    assert_eq!(labels["max_running_requests"], "256", "{w}");
    assert_eq!(labels["disaggregation_mode"], "prefill", "{w}");
    assert!(labels["version"].is_string(), "{w}");
    assert!(
        w["pd_pairing"]
            .as_str()
            .unwrap()
            .starts_with("sglang/mooncake/dtype=auto,page=1"),
        "{w}"
    );

    // A PATCH keeps what the engine reported, with the registered labels over it.
    let id = w["id"].as_str().unwrap();
    let patched = mock_engine::client::request(
        "PATCH",
        &gw.url(&format!("/workers/{id}")),
        &[("content-type", "application/json")],
        Some(
            json!({"labels": {"kv_cache_dtype": "fp8"}})
                .to_string()
                .into(),
        ),
    )
    .await
    .unwrap();
    assert_eq!(patched.status, 202, "{}", patched.text());
    let w = gw.get(&format!("/workers/{id}")).await.json();
    assert_eq!(w["labels"]["kv_cache_dtype"], "fp8", "{w}");
    assert_eq!(w["labels"]["max_context_length"], "32768", "{w}");
    assert_eq!(
        (&w["runtime_type"], &w["status"]),
        (&json!("sglang"), &json!("ready"))
    );
    assert!(
        w["pd_pairing"].as_str().unwrap().contains("dtype=fp8"),
        "{w}"
    );

    let w = wait_ready(&gw, &grpc_url(&vllm_p)).await;
    assert_eq!(w["runtime_type"], "vllm", "{w}");
    assert_eq!(w["kv_connector"], "NixlConnector", "{w}");
    assert_eq!(w["kv_role"], "kv_producer", "{w}");
    assert_eq!(w["kv_engine_id"], json!(vllm_p.engine_id()), "{w}");
    assert_eq!(w["labels"]["max_context_length"], "32768", "{w}");
    assert_eq!(w["labels"]["max_num_seqs"], "256", "{w}");
    assert!(
        w["labels"].get("kv_connector").is_none(),
        "kv_* are fields: {w}"
    );
    assert!(
        w["pd_pairing"]
            .as_str()
            .unwrap()
            .starts_with("vllm/nixl/dtype=auto,page="),
        "{w}"
    );
    let w = wait_ready(&gw, &grpc_url(&vllm_d)).await;
    assert_eq!(w["kv_role"], "kv_consumer", "{w}");

    let w = wait_ready(&gw, &grpc_url(&tokenspeed)).await;
    assert_eq!(w["runtime_type"], "tokenspeed", "{w}");
    assert_eq!(w["labels"]["max_num_seqs"], "256", "{w}");
    assert_eq!(
        w["labels"]["disaggregation_transfer_backend"], "mooncake",
        "{w}"
    );
    assert!(
        w["pd_pairing"]
            .as_str()
            .unwrap()
            .starts_with("tokenspeed/mooncake/"),
        "{w}"
    );

    // Registration asked each servicer for its facts (SMG's calls), and no leg went out.
    for e in [&sglang, &vllm_p, &vllm_d, &tokenspeed] {
        let calls = e.stats().rpc_calls;
        for rpc in ["HealthCheck", "GetModelInfo", "GetServerInfo"] {
            assert!(calls.get(rpc).is_some_and(|n| *n >= 1), "{rpc}: {calls:?}");
        }
        assert!(e.records().is_empty());
    }
    let m = gw.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "smg_worker_pool_size",
            &[("worker_type", "prefill"), ("connection_mode", "grpc")]
        ),
        Some(2.0),
        "{m}"
    );
}

/// The YAML list and `pdgate launch --prefill grpc://… PORT` register the same gRPC workers,
/// with the bootstrap port given; a reload adds another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_workers_come_from_yaml_launch_and_reload_with_their_bootstrap_port() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 21, 1]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 21, 2]).await;
    let d2 = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 21, 3]).await;
    let mut prefill = by_url(&grpc_url(&p), "prefill");
    prefill["bootstrap_port"] = json!(9000);
    let mut gw = Gateway::start(&[prefill, by_url(&grpc_url(&d), "decode")], "").await;
    gw.wait_ready().await;
    let w = wait_ready(&gw, &grpc_url(&p)).await;
    assert_eq!(w["bootstrap_port"], 9000, "{w}");
    assert_eq!(w["runtime_type"], "sglang", "{w}");

    // Reload: the file gains a gRPC decode (the worker list is the file's last section).
    let conf = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("gateways")
        .join(format!("pdgate-{}.yaml", gw.port));
    let mut yaml = std::fs::read_to_string(&conf).unwrap();
    yaml.push_str(&format!("    - {}\n", by_url(&grpc_url(&d2), "decode")));
    std::fs::write(&conf, yaml).unwrap();
    let r = gw.post("/reload", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["workers_added"],
        json!([grpc_url(&d2)]),
        "{}",
        r.text()
    );
    let w = wait_ready(&gw, &grpc_url(&d2)).await;
    assert_eq!(w["connection_mode"], "grpc", "{w}");

    // The same workers from SMG's flags.
    let port = free_port();
    let prom = free_port();
    let child = Command::new(pdgate_bin())
        .args(["launch", "--pd-disaggregation", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(["--prefill", &grpc_url(&p), "9000"])
        .args(["--decode", &grpc_url(&d)])
        .args(["--prometheus-host", "127.0.0.1"])
        .args(["--prometheus-port", &prom.to_string()])
        .args(["--worker-startup-check-interval", "1"])
        .args(["--shutdown-grace-period-secs", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start pdgate launch");
    let launched = KillOnDrop(child);
    let base = format!("http://127.0.0.1:{port}");
    let w = wait_worker_at(&base, &grpc_url(&p), "ready", |w| w["status"] == "ready").await;
    assert_eq!(w["bootstrap_port"], 9000, "{w}");
    assert_eq!(w["connection_mode"], "grpc", "{w}");
    let w = wait_worker_at(&base, &grpc_url(&d), "ready", |w| w["status"] == "ready").await;
    assert_eq!(w["worker_type"], "decode", "{w}");
    drop(launched);
}

/// A gRPC prefill never pairs with an HTTP decode, even with pairing off: alone it is answered
/// `no_compatible_pd_pair` before any engine is contacted, and next to an HTTP prefill it is
/// skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_prefill_never_pairs_with_an_http_decode() {
    let grpc_p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 22, 1]).await;
    let http_d = MockEngine::spawn(MockEngineConfig::test(
        EngineKind::Sglang,
        Role::Decode,
        [127, 0, 22, 2],
    ))
    .await
    .unwrap();
    let gw = Gateway::start(
        &[by_url(&grpc_url(&grpc_p), "prefill"), http_d.worker_spec()],
        "  pd_pairing_mode: off\n",
    )
    .await;
    wait_ready(&gw, &grpc_url(&grpc_p)).await;
    wait_ready(&gw, &http_d.api_url()).await;
    let body = json!({"text": "x", "sampling_params": {"max_new_tokens": 2}});
    let r = gw.post("/generate", &body).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(error_code(&r), "no_compatible_pd_pair", "{}", r.text());
    assert!(r.text().contains("connection_mode"), "{}", r.text());
    assert!(grpc_p.records().is_empty() && http_d.records().is_empty());

    let http_p = MockEngine::spawn(MockEngineConfig::test(
        EngineKind::Sglang,
        Role::Prefill,
        [127, 0, 22, 3],
    ))
    .await
    .unwrap();
    register(&gw, &http_p.worker_spec()).await;
    wait_ready(&gw, &http_p.api_url()).await;
    for _ in 0..3 {
        let r = gw.post("/generate", &body).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(http_p.records().len(), 3);
    assert!(grpc_p.records().is_empty(), "the gRPC prefill was paired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_grpc_engine_goes_not_ready_and_comes_back() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 23, 1]).await;
    let cfg = MockEngineConfig::grpc_test(EngineKind::Sglang, Role::Decode, [127, 0, 23, 2]);
    let d = MockEngine::spawn(cfg.clone()).await.unwrap();
    let url = grpc_url(&d);
    let extra = "  health_failure_threshold: 1\n  health_success_threshold: 1\n  health_check_timeout_secs: 1\n";
    let mut gw = Gateway::start(
        &[by_url(&grpc_url(&p), "prefill"), by_url(&url, "decode")],
        extra,
    )
    .await;
    gw.wait_ready().await;
    let port = d.port();
    d.kill();
    drop(d);
    let w = wait_worker(&gw, &url, "not_ready", |w| w["status"] == "not_ready").await;
    assert_eq!(w["is_healthy"], false);
    assert_eq!(gw.get("/readiness").await.status, 503);

    let back = MockEngine::spawn(MockEngineConfig { port, ..cfg })
        .await
        .unwrap();
    wait_ready(&gw, &url).await;
    gw.wait_ready().await;
    assert!(
        back.stats()
            .rpc_calls
            .get("HealthCheck")
            .is_some_and(|n| *n >= 1),
        "health is checked through the servicer's HealthCheck"
    );
    let m = gw.metrics().await;
    assert!(
        metric_value(
            &m,
            "smg_worker_health_checks_total",
            &[("worker_type", "decode"), ("result", "failure")]
        )
        .is_some_and(|n| n >= 1.0),
        "{m}"
    );
}

/// A restarted vLLM without a pinned engine id has a new one: the gateway reads it again when
/// the prefill recovers, before routing to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_vllm_prefill_is_re_read_when_it_recovers() {
    let p = grpc_engine(EngineKind::Vllm, Role::Prefill, [127, 0, 24, 1]).await;
    let d = grpc_engine(EngineKind::Vllm, Role::Decode, [127, 0, 24, 2]).await;
    let url = grpc_url(&p);
    let extra = "  health_failure_threshold: 1\n  health_success_threshold: 1\n  health_check_timeout_secs: 1\n";
    let gw = Gateway::start(
        &[by_url(&url, "prefill"), by_url(&grpc_url(&d), "decode")],
        extra,
    )
    .await;
    let first = p.engine_id();
    let w = wait_ready(&gw, &url).await;
    assert_eq!(w["kv_engine_id"], json!(first), "{w}");

    p.inject(Fault::Unhealthy).await;
    wait_worker(&gw, &url, "not_ready", |w| w["status"] == "not_ready").await;
    p.restart().await;
    let second = p.engine_id();
    assert_ne!(first, second, "the mock restarts with a new id");
    let before = p
        .stats()
        .rpc_calls
        .get("GetServerInfo")
        .copied()
        .unwrap_or(0);
    p.reset().await;
    let w = wait_ready(&gw, &url).await;
    assert_eq!(w["kv_engine_id"], json!(second), "{w}");
    assert!(
        p.stats()
            .rpc_calls
            .get("GetServerInfo")
            .copied()
            .unwrap_or(0)
            > before,
        "the engine id was not read again"
    );
    // The decode never left ready: its id is not re-read.
    assert_eq!(
        wait_ready(&gw, &grpc_url(&d)).await["kv_engine_id"],
        json!(d.engine_id())
    );
}

/// `GetLoads` feeds overload protection as `/v1/loads` does over HTTP, and its disaggregation
/// statistics become the `smg_engine_pd_*` gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_load_reports_feed_overload_protection_and_the_engine_pd_gauges() {
    let p = grpc_engine(EngineKind::Sglang, Role::Prefill, [127, 0, 25, 1]).await;
    let d = grpc_engine(EngineKind::Sglang, Role::Decode, [127, 0, 25, 2]).await;
    let extra = "  worker_overload_waiting_requests: 2\n  load_monitor_interval: 1\n";
    let mut gw = Gateway::start(
        &[
            by_url(&grpc_url(&p), "prefill"),
            by_url(&grpc_url(&d), "decode"),
        ],
        extra,
    )
    .await;
    gw.wait_ready().await;
    let decode = grpc_url(&d);
    let m = gw
        .metrics_when(|m| {
            metric_value(
                m,
                "smg_engine_pd_decode_queue_reqs",
                &[("worker", &decode), ("role", "decode"), ("dp_rank", "0")],
            )
            .is_some()
        })
        .await;
    assert_eq!(
        metric_value(
            &m,
            "smg_engine_pd_prefill_queue_reqs",
            &[
                ("worker", &grpc_url(&p)),
                ("role", "prefill"),
                ("dp_rank", "0")
            ]
        ),
        Some(0.0),
        "{m}"
    );

    d.report_load(Some(LoadReport {
        waiting: 5,
        running: 1,
        token_usage: 0.2,
    }));
    let overloaded =
        |m: &str| metric_value(m, "smg_workers_overloaded", &[("model", "all")]).unwrap_or(0.0);
    let m = gw.metrics_when(|m| overloaded(m) >= 1.0).await;
    assert_eq!(overloaded(&m), 1.0, "the decode's GetLoads was not read");
    // Shed at pair selection: no leg is sent (none of the gRPC legs exists before that point).
    let r = gw
        .post(
            "/generate",
            &json!({"text": "x", "sampling_params": {"max_new_tokens": 2}}),
        )
        .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        error_code(&r),
        "worker_overload_protection_shed",
        "{}",
        r.text()
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(p.records().is_empty() && d.records().is_empty());
    assert!(d.stats().rpc_calls.get("GetLoads").is_some_and(|n| *n >= 2));

    d.report_load(None);
    let m = gw.metrics_when(|m| overloaded(m) == 0.0).await;
    assert_eq!(
        overloaded(&m),
        0.0,
        "the decode never came back from overload"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dp_aware_splits_a_grpc_engine_by_the_dp_size_it_reports() {
    let spawn = |role, ip: [u8; 4]| {
        let mut c = MockEngineConfig::grpc_test(EngineKind::Sglang, role, ip);
        c.dp_size = 2;
        MockEngine::spawn(c)
    };
    let p = spawn(Role::Prefill, [127, 0, 27, 1]).await.unwrap();
    let d = spawn(Role::Decode, [127, 0, 27, 2]).await.unwrap();
    let gw = Gateway::start(
        &[
            by_url(&grpc_url(&p), "prefill"),
            by_url(&grpc_url(&d), "decode"),
        ],
        "  dp_aware: true\n",
    )
    .await;
    for e in [&p, &d] {
        for rank in 0..2 {
            let w = wait_ready(&gw, &format!("{}@{rank}", grpc_url(e))).await;
            assert_eq!(w["dp_rank"], rank, "{w}");
            assert_eq!(w["dp_size"], 2, "{w}");
            assert_eq!(w["connection_mode"], "grpc", "{w}");
        }
    }
    assert_eq!(gw.get("/workers").await.json()["total"], 4);
}

/// A servicer that answers none of SGLang's, vLLM's and TokenSpeed's services registers, with
/// the runtime it has (MLX, found through its own `HealthCheck`) or none it is known by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_servicers_without_a_pd_protocol_register_with_their_runtime() {
    let unknown = stand_in::serve([127, 0, 26, 1], stand_in::Kind::EncoderOnly).await;
    let mlx = stand_in::serve([127, 0, 26, 2], stand_in::Kind::Mlx).await;
    let gw = Gateway::start(&[], "").await;
    let (unknown_url, mlx_url) = (format!("grpc://{unknown}"), format!("grpc://{mlx}"));
    register(&gw, &by_url(&unknown_url, "prefill")).await;
    register(&gw, &by_url(&mlx_url, "decode")).await;
    let w = wait_ready(&gw, &unknown_url).await;
    assert_eq!(w["runtime_type"], "generic", "{w}");
    let w = wait_ready(&gw, &mlx_url).await;
    assert_eq!(w["runtime_type"], "mlx", "{w}");
    assert!(
        gw.log().contains("has no PD protocol"),
        "not logged:\n{}",
        gw.log()
    );
}

/// A PD request that lands on a pair without a PD protocol (two MLX servicers) is refused
/// with 400 `runtime_pd_not_supported` before any leg is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pd_request_on_a_runtime_without_a_pd_protocol_is_refused() {
    let p = stand_in::serve([127, 0, 26, 3], stand_in::Kind::Mlx).await;
    let d = stand_in::serve([127, 0, 26, 4], stand_in::Kind::Mlx).await;
    let gw = Gateway::start(&[], "").await;
    let (p_url, d_url) = (format!("grpc://{p}"), format!("grpc://{d}"));
    register(&gw, &by_url(&p_url, "prefill")).await;
    register(&gw, &by_url(&d_url, "decode")).await;
    wait_ready(&gw, &p_url).await;
    wait_ready(&gw, &d_url).await;
    let r = gw
        .post(
            "/v1/chat/completions",
            &json!({"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "runtime_pd_not_supported");
}

/// Stand-in gRPC servers for runtimes the mock engine does not model: one serving only
/// TokenSpeed's encoder service (no scheduler service at all), and one serving MLX's
/// `HealthCheck`, whose proto is not vendored (so the service is written by hand).
mod stand_in {
    use std::convert::Infallible;
    use std::net::{IpAddr, SocketAddr};
    use std::task::{Context, Poll};

    use pdgate_proto::tokenspeed_encoder::token_speed_encoder_server::{
        TokenSpeedEncoder, TokenSpeedEncoderServer,
    };
    use pdgate_proto::tokenspeed_encoder::{EncodeRequest, EncodeResponse};
    use tonic::codegen::{BoxFuture, Service};
    use tonic::server::NamedService;
    use tonic::{Request, Response, Status};

    pub enum Kind {
        EncoderOnly,
        Mlx,
    }

    struct Encoder;

    #[tonic::async_trait]
    impl TokenSpeedEncoder for Encoder {
        async fn encode(
            &self,
            _: Request<EncodeRequest>,
        ) -> Result<Response<EncodeResponse>, Status> {
            Ok(Response::new(EncodeResponse { accepted: true }))
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Empty {}

    #[derive(Clone, PartialEq, prost::Message)]
    struct Health {
        #[prost(bool, tag = "1")]
        healthy: bool,
        #[prost(string, tag = "2")]
        message: String,
    }

    struct HealthCheck;

    impl tonic::server::UnaryService<Empty> for HealthCheck {
        type Response = Health;
        type Future = std::future::Ready<Result<Response<Health>, Status>>;

        fn call(&mut self, _: Request<Empty>) -> Self::Future {
            std::future::ready(Ok(Response::new(Health {
                healthy: true,
                message: "ok".into(),
            })))
        }
    }

    /// `mlx.grpc.engine.MlxEngine` with only `HealthCheck`; every other path is UNIMPLEMENTED.
    #[derive(Clone)]
    struct Mlx;

    impl NamedService for Mlx {
        const NAME: &'static str = "mlx.grpc.engine.MlxEngine";
    }

    impl Service<http::Request<tonic::body::Body>> for Mlx {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = BoxFuture<Self::Response, Self::Error>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
            Box::pin(async move {
                if req.uri().path() == "/mlx.grpc.engine.MlxEngine/HealthCheck" {
                    let codec = tonic_prost::ProstCodec::<Health, Empty>::default();
                    return Ok(tonic::server::Grpc::new(codec)
                        .unary(HealthCheck, req)
                        .await);
                }
                Ok(Status::unimplemented("not served").into_http())
            })
        }
    }

    /// Serves `kind` on `ip` (an ephemeral port) until the test process ends.
    pub async fn serve(ip: [u8; 4], kind: Kind) -> SocketAddr {
        let probe = std::net::TcpListener::bind((IpAddr::from(ip), 0)).expect("bind");
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let server = tonic::transport::Server::builder();
        tokio::spawn(async move {
            let served = match kind {
                Kind::EncoderOnly => {
                    server
                        .serve(addr, TokenSpeedEncoderServer::new(Encoder))
                        .await
                }
                Kind::Mlx => server.serve(addr, Mlx).await,
            };
            served.expect("serve the stand-in");
        });
        let up = mock_engine::wait_until(std::time::Duration::from_secs(5), || {
            std::net::TcpStream::connect(addr).is_ok()
        })
        .await;
        assert!(up, "the stand-in did not listen on {addr}");
        addr
    }
}
