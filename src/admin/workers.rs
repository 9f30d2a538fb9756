//! The worker API (`/workers`, `/workers/{id}`), SMG's shapes. The registered `api_key` of a
//! worker is never echoed.

use pdgate_filters::errors::ErrorCode;
use pingora::proxy::Session;
use serde_json::{json, Map, Value};

use crate::config::WorkerType;
use crate::gateway::Gateway;
use crate::proxy::routes::Endpoint;
use crate::reply::Reply;
use crate::workers::Worker;

pub async fn handle(gw: &Gateway, session: &mut Session, endpoint: &Endpoint) -> Reply {
    let method = session.req_header().method.clone();
    match (endpoint, method) {
        (Endpoint::Workers, http::Method::GET) => {
            let model = query_param(session.req_header().uri.query(), "model");
            list(gw, model.as_deref())
        }
        (Endpoint::Worker(id), http::Method::GET) => get(gw, id),
        _ => Reply::error(
            ErrorCode::NotImplemented,
            "worker registration changes are not available yet",
        ),
    }
}

fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

/// One worker as `GET /workers` shows it (optional keys omitted when empty).
pub fn worker_json(w: &Worker) -> Value {
    let spec = &w.spec;
    let mut m = Map::new();
    m.insert("id".into(), json!(w.id));
    m.insert(
        "model_id".into(),
        json!(w.models().first().map_or("unknown", String::as_str)),
    );
    m.insert("url".into(), json!(spec.url));
    m.insert("worker_type".into(), json!(spec.worker_type.as_str()));
    m.insert("connection_mode".into(), json!("http"));
    m.insert("runtime_type".into(), json!(w.runtime().as_str()));
    if !spec.labels.is_empty() {
        m.insert("labels".into(), json!(spec.labels));
    }
    m.insert("priority".into(), json!(spec.priority));
    m.insert("cost".into(), json!(spec.cost));
    if let Some(p) = spec.bootstrap_port {
        m.insert("bootstrap_port".into(), json!(p));
    }
    if let Some(c) = &spec.kv_connector {
        m.insert("kv_connector".into(), json!(c));
    }
    if let Some(e) = &spec.kv_engine_id {
        m.insert("kv_engine_id".into(), json!(e));
    }
    if let Some(r) = w.address.dp_rank {
        m.insert("dp_rank".into(), json!(r));
    }
    if let Some(s) = spec.dp_size {
        m.insert("dp_size".into(), json!(s));
    }
    m.insert(
        "max_connection_attempts".into(),
        json!(spec.max_connection_attempts),
    );
    m.insert("is_healthy".into(), json!(w.is_healthy()));
    m.insert("status".into(), json!(w.status().as_str()));
    m.insert("load".into(), json!(w.in_flight()));
    Value::Object(m)
}

fn list(gw: &Gateway, model: Option<&str>) -> Reply {
    let snap = gw.registry.snapshot();
    let shown: Vec<&std::sync::Arc<Worker>> = snap
        .all
        .iter()
        .filter(|w| model.is_none_or(|m| w.serves(Some(m))))
        .collect();
    let count = |r: WorkerType| shown.iter().filter(|w| w.role() == r).count();
    let body = json!({
        "workers": shown.iter().map(|w| worker_json(w)).collect::<Vec<_>>(),
        "total": shown.len(),
        "stats": {
            "prefill_count": count(WorkerType::Prefill),
            "decode_count": count(WorkerType::Decode),
            "regular_count": count(WorkerType::Regular),
        },
    });
    Reply::json(200, body.to_string())
}

fn get(gw: &Gateway, id: &str) -> Reply {
    if uuid::Uuid::parse_str(id).is_err() {
        return Reply::error(
            ErrorCode::InvalidRequest,
            format!("`{id}` is not a worker id (UUID)"),
        );
    }
    match gw.registry.snapshot().by_id(id) {
        Some(w) => Reply::json(200, worker_json(w).to_string()),
        None => Reply::error(ErrorCode::WorkerNotFound, format!("no worker with id {id}")),
    }
}
