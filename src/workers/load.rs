//! The load monitor: polls each worker's own load report every `load_monitor_interval`
//! (HTTP: SGLang `GET /v1/loads`, vLLM `GET /metrics`; gRPC: the servicer's `GetLoads` with
//! SMG's sections), keeps the latest report on the worker for the load-aware policies, and flags
//! a worker overloaded at or above the configured thresholds (waiting requests summed over DP
//! ranks, mean KV usage). A gRPC report with disaggregation statistics also feeds the
//! `smg_engine_pd_*` gauges. Runs as a Pingora background service.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde_json::Value;

use std::collections::HashMap;

use super::grpc::ControlChannels;
use super::intake;
use super::worker::{Status, Worker};
use crate::config::{OverloadOverrides, OverloadSettings, RuntimeType};
use crate::gateway::Gateway;
use crate::legs::client::LegClient;
use crate::metrics::METRICS;
use crate::policy::EngineLoad;

/// The thresholds that apply to one worker: its own `overload` overrides, else the global ones.
pub fn thresholds(
    global: &OverloadSettings,
    o: Option<&OverloadOverrides>,
) -> (Option<u64>, Option<f64>) {
    match o {
        Some(o) if o.waiting_requests.is_some() || o.token_usage.is_some() => {
            (o.waiting_requests.map(|v| v as u64), o.token_usage)
        }
        _ => (
            global.waiting_requests.map(|v| v as u64),
            global.token_usage,
        ),
    }
}

/// Whether a report crosses the thresholds.
pub fn is_overloaded(load: &EngineLoad, t: (Option<u64>, Option<f64>)) -> bool {
    t.0.is_some_and(|w| load.waiting_requests >= w) || t.1.is_some_and(|u| load.token_usage >= u)
}

/// SGLang `/v1/loads`: the aggregate, else the per-rank rows summed (usage averaged).
pub fn parse_sglang_loads(v: &Value) -> Option<EngineLoad> {
    let agg = &v["aggregate"];
    let rows = v["loads"].as_array();
    let sum =
        |key: &str| -> Option<f64> { rows.map(|r| r.iter().filter_map(|x| x[key].as_f64()).sum()) };
    let waiting = agg["total_waiting_reqs"]
        .as_f64()
        .or_else(|| sum("num_waiting_reqs"))?;
    let running = agg["total_running_reqs"]
        .as_f64()
        .or_else(|| sum("num_running_reqs"))
        .unwrap_or(0.0);
    let usage = agg["avg_token_usage"].as_f64().or_else(|| {
        let r = rows?;
        let vals: Vec<f64> = r.iter().filter_map(|x| x["token_usage"].as_f64()).collect();
        (!vals.is_empty()).then(|| vals.iter().sum::<f64>() / vals.len() as f64)
    });
    Some(EngineLoad {
        waiting_requests: waiting as u64,
        running_requests: running as u64,
        token_usage: usage.unwrap_or(0.0),
        waiting_uncached_tokens: sum("num_waiting_uncached_tokens")
            .filter(|t| *t > 0.0)
            .map(|t| t as u64),
        gen_throughput: sum("gen_throughput").filter(|t| *t > 0.0),
    })
}

/// vLLM `/metrics` (Prometheus text): waiting and running requests summed over label sets, KV
/// usage averaged (`vllm:kv_cache_usage_perc`, or the older `vllm:gpu_cache_usage_perc`).
pub fn parse_vllm_metrics(text: &str) -> Option<EngineLoad> {
    let values = |name: &str| -> Vec<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .collect()
    };
    let waiting = values("vllm:num_requests_waiting");
    if waiting.is_empty() {
        return None;
    }
    let mut usage = values("vllm:kv_cache_usage_perc");
    if usage.is_empty() {
        usage = values("vllm:gpu_cache_usage_perc");
    }
    Some(EngineLoad {
        waiting_requests: waiting.iter().sum::<f64>() as u64,
        running_requests: values("vllm:num_requests_running").iter().sum::<f64>() as u64,
        token_usage: if usage.is_empty() {
            0.0
        } else {
            usage.iter().sum::<f64>() / usage.len() as f64
        },
        waiting_uncached_tokens: None,
        gen_throughput: None,
    })
}

/// One DP rank of a gRPC `GetLoads` answer, whatever the engine.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RankLoad {
    pub dp_rank: i32,
    pub waiting: u64,
    pub running: u64,
    /// KV usage, 0..1 (TokenSpeed: its non-evictable share when it reports one).
    pub token_usage: f64,
    pub waiting_uncached_tokens: u64,
    pub gen_throughput: f64,
    /// The `disagg` section (SGLang), when the rank reported one.
    pub disagg: Option<DisaggLoad>,
}

/// A rank's disaggregation statistics, as the `smg_engine_pd_*` gauges show them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DisaggLoad {
    /// The engine-reported role: `prefill`, `decode` or `null`.
    pub mode: String,
    /// Requests waiting for a decode to bootstrap plus those transferring (prefill side).
    pub prefill_queue: u64,
    /// Requests pre-allocating, transferring or retracted (decode side).
    pub decode_queue: u64,
    pub kv_transfer_speed_gb_s: f64,
    pub kv_transfer_latency_ms: f64,
}

/// A gRPC load report as the policies and overload protection read it: the same shape as the
/// HTTP SGLang parser's (waiting and running requests summed over the DP ranks, KV usage
/// averaged); vLLM reports one rank. `None` for an empty report (a TokenSpeed encode worker).
pub fn engine_load_from_ranks(rows: &[RankLoad]) -> Option<EngineLoad> {
    if rows.is_empty() {
        return None;
    }
    let uncached: u64 = rows.iter().map(|r| r.waiting_uncached_tokens).sum();
    let throughput: f64 = rows.iter().map(|r| r.gen_throughput).sum();
    Some(EngineLoad {
        waiting_requests: rows.iter().map(|r| r.waiting).sum(),
        running_requests: rows.iter().map(|r| r.running).sum(),
        token_usage: rows.iter().map(|r| r.token_usage).sum::<f64>() / rows.len() as f64,
        waiting_uncached_tokens: (uncached > 0).then_some(uncached),
        gen_throughput: (throughput > 0.0).then_some(throughput),
    })
}

/// One engine's load now, as rows of SMG's `GET /get_loads` (one per DP rank, without the
/// `worker` and `worker_type` the caller adds): an SGLang HTTP engine's own `/v1/loads` rows as
/// it sent them, a gRPC servicer's `GetLoads` ranks, a vLLM HTTP engine's `/metrics` as one row.
/// `Err`: why the engine gave no report.
pub async fn rows_now(
    client: &LegClient,
    control: &ControlChannels,
    w: &Worker,
    timeout: Duration,
) -> Result<Vec<serde_json::Map<String, Value>>, String> {
    let row = |dp_rank: i64, running: u64, waiting: u64, usage: f64, uncached: u64, tps: f64| {
        let v = serde_json::json!({
            "dp_rank": dp_rank,
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_waiting_uncached_tokens": uncached,
            "num_total_reqs": running + waiting,
            "token_usage": usage,
            "gen_throughput": tps,
        });
        match v {
            Value::Object(m) => m,
            _ => unreachable!("a JSON object literal"),
        }
    };
    if w.is_grpc() {
        let ranks = control
            .loads(w, timeout)
            .await
            .ok_or("GetLoads gave no report")?;
        return Ok(ranks
            .iter()
            .map(|r| {
                row(
                    i64::from(r.dp_rank),
                    r.running,
                    r.waiting,
                    r.token_usage,
                    r.waiting_uncached_tokens,
                    r.gen_throughput,
                )
            })
            .collect());
    }
    let vllm = w.runtime() == RuntimeType::Vllm;
    let path = if vllm {
        "/metrics"
    } else {
        "/v1/loads?include=core,disagg,queues,memory"
    };
    let (ok, body) = intake::worker_get(client, w, path, timeout)
        .await
        .ok_or_else(|| format!("{path}: no answer"))?;
    if !ok {
        return Err(format!("{path}: not a success"));
    }
    if vllm {
        let l = parse_vllm_metrics(&String::from_utf8_lossy(&body))
            .ok_or("/metrics has no vllm:num_requests_waiting")?;
        return Ok(vec![row(
            0,
            l.running_requests,
            l.waiting_requests,
            l.token_usage,
            0,
            0.0,
        )]);
    }
    let v: Value = serde_json::from_slice(&body).map_err(|e| format!("{path}: {e}"))?;
    if let Some(rows) = v["loads"].as_array() {
        return Ok(rows.iter().filter_map(|r| r.as_object().cloned()).collect());
    }
    let l = parse_sglang_loads(&v).ok_or_else(|| format!("{path}: no load report"))?;
    Ok(vec![row(
        0,
        l.running_requests,
        l.waiting_requests,
        l.token_usage,
        l.waiting_uncached_tokens.unwrap_or(0),
        l.gen_throughput.unwrap_or(0.0),
    )])
}

/// The `smg_engine_pd_*` series a worker published last round, by its URL: (role, dp_rank).
type PublishedPd = HashMap<String, Vec<(String, String)>>;

/// Sets the `smg_engine_pd_*` gauges of one worker's report (a DP rank's logical worker shows
/// only its own rank) and records the series it wrote.
fn publish_pd_gauges(w: &Worker, rows: &[RankLoad], published: &mut PublishedPd) {
    let mut series = Vec::new();
    for row in rows {
        if w.address
            .dp_rank
            .is_some_and(|r| i64::from(r) != i64::from(row.dp_rank))
        {
            continue;
        }
        let Some(d) = &row.disagg else { continue };
        let role = if d.mode.is_empty() {
            "null"
        } else {
            d.mode.as_str()
        };
        let rank = row.dp_rank.to_string();
        let labels = [w.url(), role, rank.as_str()];
        let m = &METRICS;
        m.engine_pd_kv_transfer_latency_ms
            .with_label_values(&labels)
            .set(d.kv_transfer_latency_ms);
        m.engine_pd_kv_transfer_speed_gb_s
            .with_label_values(&labels)
            .set(d.kv_transfer_speed_gb_s);
        m.engine_pd_prefill_queue_reqs
            .with_label_values(&labels)
            .set(d.prefill_queue as f64);
        m.engine_pd_decode_queue_reqs
            .with_label_values(&labels)
            .set(d.decode_queue as f64);
        series.push((role.to_string(), rank));
    }
    let before = published.insert(w.url().to_string(), series);
    let now = &published[w.url()];
    for stale in before.into_iter().flatten().filter(|s| !now.contains(s)) {
        retire_pd_series(w.url(), &stale);
    }
}

/// SMG's convention for a worker that left Ready or was removed: its gauges read -1.
fn retire_pd_series(url: &str, (role, rank): &(String, String)) {
    let labels = [url, role.as_str(), rank.as_str()];
    let m = &METRICS;
    for g in [
        &m.engine_pd_kv_transfer_latency_ms,
        &m.engine_pd_kv_transfer_speed_gb_s,
        &m.engine_pd_prefill_queue_reqs,
        &m.engine_pd_decode_queue_reqs,
    ] {
        g.with_label_values(&labels).set(-1.0);
    }
}

/// Polls load reports. Reads the gateway's settings every round (reload applies at once).
pub struct LoadMonitor {
    pub gw: Arc<Gateway>,
}

impl LoadMonitor {
    async fn poll(
        client: &LegClient,
        control: &ControlChannels,
        w: &Worker,
        timeout: Duration,
    ) -> (Option<EngineLoad>, Option<Vec<RankLoad>>) {
        if w.is_grpc() {
            let rows = control.loads(w, timeout).await;
            let load = rows.as_deref().and_then(engine_load_from_ranks);
            return (load, rows);
        }
        (Self::poll_http(client, w, timeout).await, None)
    }

    async fn poll_http(client: &LegClient, w: &Worker, timeout: Duration) -> Option<EngineLoad> {
        let path = match w.runtime() {
            RuntimeType::Vllm => "/metrics",
            _ => "/v1/loads?include=core,disagg,queues,memory",
        };
        let (ok, body) = intake::worker_get(client, w, path, timeout).await?;
        if !ok {
            return None;
        }
        match w.runtime() {
            RuntimeType::Vllm => parse_vllm_metrics(&String::from_utf8_lossy(&body)),
            _ => parse_sglang_loads(&serde_json::from_slice(&body).ok()?),
        }
    }
}

#[async_trait]
impl BackgroundService for LoadMonitor {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let client = LegClient::new(64, Some(Duration::from_secs(30)));
        // This service's own gRPC channels (its runtime; see `workers::grpc`).
        let control = ControlChannels::new();
        let mut published = PublishedPd::new();
        loop {
            let settings = self.gw.settings();
            let overload = &settings.overload;
            let timeout = settings.health.timeout;
            let snap = self.gw.registry.snapshot();
            control.retain(&snap);
            let polled: Vec<&Arc<Worker>> = snap
                .all
                .iter()
                .filter(|w| w.status() == Status::Ready)
                .collect();
            let (client, control_ref) = (&client, &control);
            let reports = futures::future::join_all(
                polled
                    .iter()
                    .map(|w| Self::poll(client, control_ref, w, timeout)),
            )
            .await;
            // Workers that left Ready or the registry: their PD gauges read -1.
            published.retain(|url, series| {
                let live = polled.iter().any(|w| w.url() == url);
                if !live {
                    series.iter().for_each(|s| retire_pd_series(url, s));
                }
                live
            });
            let mut overloaded = 0;
            for (w, (report, rows)) in polled.iter().zip(reports) {
                if let Some(rows) = &rows {
                    publish_pd_gauges(w, rows, &mut published);
                }
                let t = thresholds(overload, w.spec.overload.as_ref());
                let over = report.as_ref().is_some_and(|r| is_overloaded(r, t));
                if over != w.is_overloaded() {
                    log::warn!(
                        "worker {} {} overloaded",
                        w.url(),
                        if over { "is" } else { "is no longer" }
                    );
                }
                overloaded += usize::from(over);
                w.set_load(report, over);
            }
            METRICS
                .workers_overloaded
                .with_label_values(&["all"])
                .set(overloaded as i64);
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(overload.load_monitor_interval) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_loads_sum_ranks_and_average_usage() {
        let v = json!({"loads": [
            {"num_waiting_reqs": 2, "num_running_reqs": 3, "token_usage": 0.5},
            {"num_waiting_reqs": 1, "num_running_reqs": 1, "token_usage": 0.1}]});
        let l = parse_sglang_loads(&v).unwrap();
        assert_eq!((l.waiting_requests, l.running_requests), (3, 4));
        assert!((l.token_usage - 0.3).abs() < 1e-9);
        let agg = json!({"aggregate": {"total_waiting_reqs": 7, "total_running_reqs": 1, "avg_token_usage": 0.9}});
        assert_eq!(parse_sglang_loads(&agg).unwrap().waiting_requests, 7);
    }

    #[test]
    fn vllm_metrics_are_read_from_prometheus_text() {
        let text = "# HELP x\nvllm:num_requests_waiting{model_name=\"m\"} 4\nvllm:num_requests_running{model_name=\"m\"} 2\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n";
        let l = parse_vllm_metrics(text).unwrap();
        assert_eq!((l.waiting_requests, l.running_requests), (4, 2));
        assert!((l.token_usage - 0.25).abs() < 1e-9);
        assert!(parse_vllm_metrics("other 1\n").is_none());
    }

    #[test]
    fn grpc_ranks_sum_like_the_http_report_and_an_empty_report_is_none() {
        let rows = [
            RankLoad {
                dp_rank: 0,
                waiting: 2,
                running: 3,
                token_usage: 0.5,
                waiting_uncached_tokens: 100,
                ..Default::default()
            },
            RankLoad {
                dp_rank: 1,
                waiting: 1,
                running: 1,
                token_usage: 0.1,
                ..Default::default()
            },
        ];
        let l = engine_load_from_ranks(&rows).unwrap();
        assert_eq!((l.waiting_requests, l.running_requests), (3, 4));
        assert!((l.token_usage - 0.3).abs() < 1e-9);
        assert_eq!(l.waiting_uncached_tokens, Some(100));
        assert_eq!(l.gen_throughput, None);
        assert!(engine_load_from_ranks(&[]).is_none());
    }

    #[test]
    fn thresholds_use_worker_overrides_first() {
        let global = OverloadSettings {
            waiting_requests: Some(10),
            token_usage: None,
            load_monitor_interval: Duration::from_secs(10),
            retry_after_secs: 10,
        };
        let load = EngineLoad {
            waiting_requests: 5,
            token_usage: 0.95,
            ..Default::default()
        };
        assert!(!is_overloaded(&load, thresholds(&global, None)));
        let o = OverloadOverrides {
            waiting_requests: None,
            token_usage: Some(0.9),
        };
        assert!(is_overloaded(&load, thresholds(&global, Some(&o))));
    }
}
