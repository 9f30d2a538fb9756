//! Turning a validated [`WorkerSpec`] into a live [`Worker`]: the URL split for legs and the
//! bootstrap host, the address resolved once (never on the hot path: Pingora's peer resolves
//! hostnames with a blocking call), and the runtime resolved.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;

use crate::config::{RuntimeType, WorkerSpec};

use super::worker::{Discovered, Origin, Worker, WorkerAddress, WorkerDefaults};
use crate::legs::client::{LegClient, LegRequest};

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
    found
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
    let mut headers = Vec::new();
    if let Some(key) = &w.spec.api_key {
        if let Ok(v) = http::HeaderValue::from_str(&format!("Bearer {key}")) {
            headers.push((http::header::AUTHORIZATION, v));
        }
    }
    let full = w.address.path_for(path);
    let req = LegRequest {
        method: "GET",
        path: &full,
        host: &w.address.authority,
        headers: &headers,
        body: Bytes::new(),
    };
    let exchange = async {
        let mut leg = client.open(&w.peer, &req, timeout).await.ok()?;
        let ok = leg.is_success();
        let body = leg.read_to_end(4 << 20).await.ok()?;
        client.release(leg, &w.peer).await;
        Some((ok, body))
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
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
