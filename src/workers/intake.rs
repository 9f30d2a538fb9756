//! Turning a validated [`WorkerSpec`] into a live [`Worker`]: the URL split for legs and the
//! bootstrap host, the address resolved once (never on the hot path: Pingora's peer resolves
//! hostnames with a blocking call), and the runtime resolved.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use crate::config::{label, RuntimeType, WorkerSpec, WorkerType};

use super::worker::{Discovered, Origin, Worker, WorkerAddress, WorkerDefaults};
use crate::legs::client::{AnswerHeaders, LegClient, LegRequest};

/// Resolves `host:port` (blocking; for startup, or inside `spawn_blocking`).
pub fn resolve(address: &WorkerAddress) -> Result<SocketAddr, String> {
    (address.resolve_host(), address.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", address.authority))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", address.authority))
}

/// A worker from the startup configuration (`pending` until its first probe succeeds).
pub fn startup_worker(
    spec: &WorkerSpec,
    defaults: &WorkerDefaults,
    origin: Origin,
) -> Result<Arc<Worker>, String> {
    let address = WorkerAddress::parse(&spec.url)?;
    let addr = resolve(&address)?;
    Ok(Worker::new(
        uuid::Uuid::new_v4().to_string(),
        spec.clone(),
        address,
        addr,
        defaults,
        origin,
    ))
}

/// Asks the engine what it is, as SMG's registration does: `GET /v1/models` (`owned_by`
/// `sglang`/`nvidia` → SGLang, `vllm` → vLLM; the ids are the served models), else `/version`
/// (answers only on vLLM) and `/server_info` (SGLang). Failures leave the runtime unknown.
///
/// A decode is also asked its running window, the size of its admission window
/// (`workers::admission`): see [`discover_window`].
pub async fn discover(client: &LegClient, w: &Worker, timeout: Duration) -> Discovered {
    let mut found = Discovered::default();
    if let Some(body) = get_json(client, w, "/v1/models", timeout).await {
        if let Some(list) = body["data"].as_array() {
            found.models = list
                .iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect();
            found.runtime = match list.first().and_then(|m| m["owned_by"].as_str()) {
                Some("vllm") => RuntimeType::Vllm,
                Some("sglang") | Some("nvidia") => RuntimeType::Sglang,
                Some(_) => RuntimeType::Generic,
                None => RuntimeType::Unspecified,
            };
        }
    }
    if found.runtime == RuntimeType::Unspecified {
        if get_json(client, w, "/version", timeout).await.is_some() {
            found.runtime = RuntimeType::Vllm;
        } else if get_json(client, w, "/server_info", timeout).await.is_some() {
            found.runtime = RuntimeType::Sglang;
        }
    }
    if w.role() == WorkerType::Decode {
        let runtime = w.known_runtime().unwrap_or(found.runtime);
        if let Some((key, window)) = discover_window(client, w, runtime, timeout).await {
            found.labels.insert(key.to_string(), window.to_string());
        }
    }
    found
}

/// The running window an HTTP engine reports, as the label it goes under:
/// * SGLang: `GET /get_server_info` → `max_running_requests` (its `--max-running-requests`,
///   `null` when the flag is unset), else the value its schedulers resolved
///   (`internal_states[0].max_running_requests`, the resolved server args).
/// * vLLM: its OpenAI server reports `max_num_seqs` only on the development endpoint
///   `GET /server_info?config_format=json` (`vllm_config.scheduler_config.max_num_seqs`), which
///   exists only with `VLLM_SERVER_DEV_MODE=1`; a production server answers 404 and its decodes
///   are not gated unless registered with a `max_running_requests` label.
///
/// `None` when the engine reports none (the worker is then not gated).
async fn discover_window(
    client: &LegClient,
    w: &Worker,
    runtime: RuntimeType,
    timeout: Duration,
) -> Option<(&'static str, u32)> {
    match runtime {
        RuntimeType::Vllm => {
            let info = get_json(client, w, "/server_info?config_format=json", timeout).await?;
            vllm_window(&info).map(|n| (label::MAX_NUM_SEQS, n))
        }
        RuntimeType::Sglang | RuntimeType::Unspecified => {
            let info = match get_json(client, w, "/get_server_info", timeout).await {
                Some(v) => v,
                None => get_json(client, w, "/server_info", timeout).await?,
            };
            sglang_window(&info).map(|n| (label::MAX_RUNNING_REQUESTS, n))
        }
        _ => None,
    }
}

fn positive(v: &Value) -> Option<u32> {
    v.as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
}

/// SGLang's running window in a `/get_server_info` answer.
fn sglang_window(info: &Value) -> Option<u32> {
    positive(&info["max_running_requests"])
        .or_else(|| positive(&info["internal_states"][0]["max_running_requests"]))
}

/// vLLM's `max_num_seqs` in a development `/server_info?config_format=json` answer (the config
/// as JSON, or as a JSON string of it).
fn vllm_window(info: &Value) -> Option<u32> {
    let config = &info["vllm_config"];
    let parsed;
    let config = match config.as_str() {
        Some(text) => {
            parsed = serde_json::from_str::<Value>(text).ok()?;
            &parsed
        }
        None => config,
    };
    positive(&config["scheduler_config"]["max_num_seqs"])
}

async fn get_json(client: &LegClient, w: &Worker, path: &str, timeout: Duration) -> Option<Value> {
    match worker_get(client, w, path, timeout).await {
        Some((true, body)) => serde_json::from_slice::<Value>(&body).ok(),
        _ => None,
    }
}

/// One control-plane `GET` to a worker (health probe, discovery, load report): the worker's
/// path prefix, its registered `api_key` as a bearer token, a deadline on the whole exchange.
/// Returns whether the status was 2xx and the body (at most 4 MiB); `None` on any failure.
pub async fn worker_get(
    client: &LegClient,
    w: &Worker,
    path: &str,
    timeout: Duration,
) -> Option<(bool, Bytes)> {
    let answer = worker_call(client, w, "GET", path, &[], timeout)
        .await
        .ok()?;
    Some((answer.is_success(), answer.body))
}

/// What a worker answered to [`worker_call`].
pub struct WorkerAnswer {
    pub status: u16,
    pub content_type: Option<http::HeaderValue>,
    pub body: Bytes,
}

impl WorkerAnswer {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// One control-plane request to a worker with an empty body: `headers` (the caller's), and the
/// worker's registered `api_key` as a bearer token unless `headers` carry an `authorization`;
/// a deadline on the whole exchange; the body read up to 4 MiB. `Err`: why there is no answer.
pub async fn worker_call(
    client: &LegClient,
    w: &Worker,
    method: &'static str,
    path: &str,
    headers: &[(http::HeaderName, http::HeaderValue)],
    timeout: Duration,
) -> Result<WorkerAnswer, String> {
    let mut all = headers.to_vec();
    if let Some(key) = &w.spec.api_key {
        if !all.iter().any(|(n, _)| n == http::header::AUTHORIZATION) {
            if let Ok(v) = http::HeaderValue::from_str(&format!("Bearer {key}")) {
                all.push((http::header::AUTHORIZATION, v));
            }
        }
    }
    let full = w.address.path_for(path);
    let req = LegRequest {
        answer_headers: AnswerHeaders::All,
        method,
        path: &full,
        host: &w.address.authority,
        headers: &all,
        body: Default::default(),
    };
    let exchange = async {
        let mut leg = client
            .open(&w.peer, &req, timeout)
            .await
            .map_err(|e| e.to_string())?;
        let status = leg.status();
        let content_type = leg.head().headers.get(http::header::CONTENT_TYPE).cloned();
        let body = leg.read_to_end(4 << 20).await.map_err(|e| e.to_string())?;
        client.release(leg, &w.peer).await;
        Ok(WorkerAnswer {
            status,
            content_type,
            body,
        })
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(answer) => answer,
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// `--dp-aware`: one logical worker per data-parallel rank, `url@rank`, each carrying its rank
/// and the DP size; legs still go to the base URL. Children start in the parent's state (and a
/// gRPC engine's ranks share its data-plane channel).
pub fn expand_dp(parent: &Worker, dp_size: u32, defaults: &WorkerDefaults) -> Vec<Arc<Worker>> {
    (0..dp_size)
        .filter_map(|rank| {
            let mut spec = parent.spec.clone();
            spec.url = format!("{}@{rank}", parent.address.base_url);
            spec.dp_rank = Some(rank);
            spec.dp_size = Some(dp_size);
            let address = WorkerAddress::parse(&spec.url).ok()?;
            Some(Worker::rank_of(parent, spec, address, defaults))
        })
        .collect()
}

/// The DP size an SGLang engine reports in `/server_info` (or `/get_server_info`).
pub async fn discover_dp_size(client: &LegClient, w: &Worker, timeout: Duration) -> Option<u32> {
    let info = match get_json(client, w, "/server_info", timeout).await {
        Some(v) => v,
        None => get_json(client, w, "/get_server_info", timeout).await?,
    };
    info["dp_size"].as_u64().and_then(|n| u32::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_reports_its_window_as_a_flag_or_resolved_by_its_schedulers() {
        assert_eq!(
            sglang_window(&json!({"max_running_requests": 48})),
            Some(48)
        );
        let resolved = json!({"max_running_requests": null,
            "internal_states": [{"max_running_requests": 1024}, {"max_running_requests": 1024}]});
        assert_eq!(sglang_window(&resolved), Some(1024));
        for none in [
            json!({}),
            json!({"max_running_requests": 0}),
            json!({"max_running_requests": "8"}),
            json!({"max_running_requests": -1, "internal_states": []}),
        ] {
            assert_eq!(sglang_window(&none), None, "{none}");
        }
    }

    #[test]
    fn vllm_reports_max_num_seqs_only_in_its_dev_server_info() {
        let info = json!({"vllm_config": {"scheduler_config": {"max_num_seqs": 128}}});
        assert_eq!(vllm_window(&info), Some(128));
        let as_text = json!({"vllm_config": "{\"scheduler_config\": {\"max_num_seqs\": 16}}"});
        assert_eq!(vllm_window(&as_text), Some(16));
        // The text format (the endpoint's default) is not JSON: no window.
        let text = json!({"vllm_config": "model='m', scheduler_config=SchedulerConfig(...)"});
        assert_eq!(vllm_window(&text), None);
        assert_eq!(vllm_window(&json!({"detail": "Not Found"})), None);
    }
}
