//! The worker API (`/workers`, `/workers/{id}`), SMG's routes and shapes:
//! `POST` registers (202, probed in the background, routed to only once healthy), `GET` lists or
//! shows, `PATCH`/`PUT` change a registration, `DELETE` drains then removes. Errors use SMG's
//! admin body `{"error": "...", "code": "..."}`. A worker's `api_key` is never echoed.
//!
//! Who may mutate: see [`super::auth`] (API key when set; loopback peers otherwise).

use bytes::Bytes;
use pdgate_filters::errors::{render_admin_error, ErrorCode};
use pingora::proxy::Session;
use serde_json::{json, Map, Value};
use std::sync::Arc;

use super::auth;
use crate::config::{WorkerSpec, WorkerType};
use crate::gateway::Gateway;
use crate::proxy::body::read_body;
use crate::proxy::routes::Endpoint;
use crate::reply::{Reply, JSON};
use crate::workers::pairing::Descriptor;
use crate::workers::worker::Origin;
use crate::workers::{intake, Worker};

/// Largest worker spec accepted.
const SPEC_LIMIT: usize = 1 << 20;

pub async fn handle(gw: &Arc<Gateway>, session: &mut Session, endpoint: &Endpoint) -> Reply {
    let method = session.req_header().method.clone();
    let mutating = method != http::Method::GET && method != http::Method::HEAD;
    if mutating && !auth::may_mutate(&gw.settings(), session) {
        session.set_keepalive(None);
        // With an API key set, a request without it was refused before it got here
        // (`Endpoint::needs_api_key`): what is left is an untrusted peer and no key.
        return admin_error(
            ErrorCode::Forbidden,
            &auth::only_trusted("worker changes are accepted"),
        );
    }
    match (endpoint, method) {
        (Endpoint::Workers, http::Method::GET) => {
            let model = query_param(session.req_header().uri.query(), "model");
            list(gw, model.as_deref())
        }
        (Endpoint::Workers, http::Method::POST) => match read_spec(gw, session).await {
            Ok(spec) => register(gw, spec).await,
            Err(r) => r,
        },
        (Endpoint::Worker(id), http::Method::GET) => match lookup(gw, id) {
            Ok(w) => Reply::json(200, worker_json(&w).to_string()),
            Err(r) => r,
        },
        (Endpoint::Worker(id), http::Method::DELETE) => remove(gw, id),
        (Endpoint::Worker(id), http::Method::PATCH) => {
            let body = match read_body(session, SPEC_LIMIT, gw.settings().body_read_timeout).await {
                Ok(b) => b,
                Err(r) => return r.reply,
            };
            patch(gw, id, &body).await
        }
        (Endpoint::Worker(id), http::Method::PUT) => match read_spec(gw, session).await {
            Ok(spec) => replace(gw, id, spec).await,
            Err(r) => r,
        },
        _ => admin_error(ErrorCode::MethodNotAllowed, "method not allowed"),
    }
}

fn admin_error(code: ErrorCode, message: &str) -> Reply {
    let mut r = Reply::body(code.status(), JSON, render_admin_error(code, message));
    r.error_code = Some(code.as_str());
    r
}

fn query_param(query: Option<&str>, key: &str) -> Option<String> {
    query?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v.to_string())
}

async fn read_spec(gw: &Gateway, session: &mut Session) -> Result<WorkerSpec, Reply> {
    let body = read_body(session, SPEC_LIMIT, gw.settings().body_read_timeout)
        .await
        .map_err(|r| r.reply)?;
    let spec = WorkerSpec::from_json(&body)
        .map_err(|e| admin_error(ErrorCode::BadRequest, &e.to_string()))?;
    check_spec(gw, &spec)?;
    for (key, why) in spec.unapplied() {
        log::warn!(
            "worker {}: `{key}` has no effect in pdgate: {why}",
            spec.url
        );
    }
    Ok(spec)
}

/// What pdgate accepts as a worker: a valid spec for an `http(s)://` or `grpc://` prefill or
/// decode leg, or (EPD mode) a `grpc://` encode worker.
fn check_spec(gw: &Gateway, spec: &WorkerSpec) -> Result<(), Reply> {
    spec.validate()
        .map_err(|e| admin_error(ErrorCode::BadRequest, &e.to_string()))?;
    if !matches!(
        spec.worker_type,
        WorkerType::Prefill | WorkerType::Decode | WorkerType::Encode
    ) {
        return Err(admin_error(
            ErrorCode::BadRequest,
            &format!(
                "worker_type `{}` is not served: pdgate routes prefill and decode workers (and \
                 encode workers in EPD mode) only",
                spec.worker_type.as_str()
            ),
        ));
    }
    crate::config::validate_worker_for_mode(&gw.config(), spec)
        .map_err(|e| admin_error(ErrorCode::BadRequest, &e.to_string()))
}

/// Builds the live worker, resolving its host off the reactor.
pub async fn build_worker(
    gw: &Gateway,
    id: String,
    spec: WorkerSpec,
    origin: Origin,
) -> Result<Arc<Worker>, Reply> {
    let address = crate::workers::WorkerAddress::parse(&spec.url)
        .map_err(|e| admin_error(ErrorCode::BadRequest, &e))?;
    let lookup = address.clone();
    let addr = tokio::task::spawn_blocking(move || intake::resolve(&lookup))
        .await
        .map_err(|e| admin_error(ErrorCode::InternalServerError, &e.to_string()))?
        .map_err(|e| admin_error(ErrorCode::BadRequest, &e))?;
    Ok(Worker::new(
        id,
        spec,
        address,
        addr,
        &gw.settings().worker_defaults,
        origin,
    ))
}

async fn register(gw: &Gateway, spec: WorkerSpec) -> Reply {
    let snap = gw.registry.snapshot();
    if let Some(existing) = snap.by_url(&spec.url) {
        return duplicate(&spec.url, &existing.id);
    }
    let id = uuid::Uuid::new_v4().to_string();
    let worker = match build_worker(gw, id.clone(), spec, Origin::Api).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let url = worker.url().to_string();
    if !gw.admit(worker.clone()) {
        let existing = gw
            .registry
            .snapshot()
            .by_url(&url)
            .map(|w| w.id.clone())
            .unwrap_or_default();
        return duplicate(&url, &existing);
    }
    log::info!(
        "worker {url} ({}) registered as {id}",
        worker.role().as_str()
    );
    let location = format!("/workers/{id}");
    Reply::json(
        202,
        json!({
            "status": "accepted",
            "worker_id": id,
            "url": url,
            "location": location,
            "message": "Worker addition queued for background processing",
        })
        .to_string(),
    )
    .with_header("location", location)
}

fn duplicate(url: &str, id: &str) -> Reply {
    admin_error(
        ErrorCode::WorkerAlreadyExists,
        &format!("Worker already exists at URL '{url}' with ID {id}. Use PUT /workers/{id} or PATCH /workers/{id} to change it"),
    )
}

/// The worker named by `id`: 400 for a malformed id, 404 for an unknown one.
fn lookup(gw: &Gateway, id: &str) -> Result<Arc<Worker>, Reply> {
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(admin_error(
            ErrorCode::BadRequest,
            &format!("`{id}` is not a worker id (a UUID)"),
        ));
    }
    gw.registry
        .snapshot()
        .by_id(id)
        .cloned()
        .ok_or_else(|| admin_error(ErrorCode::WorkerNotFound, &format!("Worker {id} not found")))
}

/// `DELETE`: draining at once, removed after `drain_settle`.
fn remove(gw: &Arc<Gateway>, id: &str) -> Reply {
    let w = match lookup(gw, id) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let id = w.id.clone();
    gw.retire(w);
    Reply::json(
        202,
        json!({
            "status": "accepted",
            "worker_id": id,
            "message": "Worker removal queued for background processing",
        })
        .to_string(),
    )
}

/// `PATCH`: `priority`, `cost`, `labels` (merged), `api_key`, `health`. The worker is re-created
/// with the same id and live state; requests in flight keep the old registration.
async fn patch(gw: &Gateway, id: &str, body: &Bytes) -> Reply {
    let patch: Value = match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => Value::Object(m),
        Ok(_) => return admin_error(ErrorCode::BadRequest, "the body must be a JSON object"),
        Err(e) => return admin_error(ErrorCode::BadRequest, &format!("invalid JSON: {e}")),
    };
    let current = match lookup(gw, id) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let mut spec_json = match serde_json::to_value(&current.spec) {
        Ok(v) => v,
        Err(e) => return admin_error(ErrorCode::InternalServerError, &e.to_string()),
    };
    // The serialized spec redacts the key; keep the real one unless the patch sets one.
    spec_json["api_key"] = json!(current.spec.api_key);
    for key in ["priority", "cost", "api_key", "health"] {
        if let Some(v) = patch.get(key) {
            spec_json[key] = v.clone();
        }
    }
    if let Some(Value::Object(labels)) = patch.get("labels") {
        let mut merged = spec_json["labels"].as_object().cloned().unwrap_or_default();
        for (k, v) in labels {
            merged.insert(k.clone(), v.clone());
        }
        spec_json["labels"] = Value::Object(merged);
    }
    let spec = match serde_json::from_value::<WorkerSpec>(spec_json) {
        Ok(s) => s,
        Err(e) => return admin_error(ErrorCode::BadRequest, &format!("invalid worker spec: {e}")),
    };
    swap_in(gw, &current, spec).await
}

/// `PUT`: a whole new spec for the same URL.
async fn replace(gw: &Gateway, id: &str, spec: WorkerSpec) -> Reply {
    let current = match lookup(gw, id) {
        Ok(w) => w,
        Err(r) => return r,
    };
    if spec.url != current.spec.url {
        return admin_error(
            ErrorCode::BadRequest,
            "PUT keeps the worker's URL; register a new worker for another URL",
        );
    }
    swap_in(gw, &current, spec).await
}

async fn swap_in(gw: &Gateway, current: &Arc<Worker>, spec: WorkerSpec) -> Reply {
    if let Err(r) = check_spec(gw, &spec) {
        return r;
    }
    let worker = match build_worker(gw, current.id.clone(), spec, current.origin).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let id = worker.id.clone();
    gw.swap(current, worker);
    Reply::json(
        202,
        json!({"status": "accepted", "worker_id": id, "message": "Worker update applied"})
            .to_string(),
    )
}

/// One worker as `GET /workers` shows it (optional keys omitted when empty; never the api_key).
/// Facts are the merged view: a gRPC worker's reported facts appear as labels (the registered
/// labels winning) and in the `kv_*` / `dp_size` keys.
pub fn worker_json(w: &Worker) -> Value {
    let spec = &w.spec;
    let mut m = Map::new();
    m.insert("id".into(), json!(w.id));
    m.insert(
        "model_id".into(),
        json!(w.models().first().map_or("unknown", String::as_str)),
    );
    m.insert("url".into(), json!(spec.url));
    if !w.models().is_empty() {
        m.insert(
            "models".into(),
            json!(w
                .models()
                .iter()
                .map(|id| json!({"id": id}))
                .collect::<Vec<_>>()),
        );
    }
    m.insert("worker_type".into(), json!(spec.worker_type.as_str()));
    m.insert(
        "connection_mode".into(),
        json!(w.connection_mode().as_str()),
    );
    m.insert("runtime_type".into(), json!(w.runtime().as_str()));
    if !w.labels().is_empty() {
        m.insert("labels".into(), json!(w.labels()));
    }
    m.insert("priority".into(), json!(spec.priority));
    m.insert("cost".into(), json!(spec.cost));
    if let Some(p) = spec.bootstrap_port {
        m.insert("bootstrap_port".into(), json!(p));
    }
    if let Some(c) = w.kv_connector() {
        m.insert("kv_connector".into(), json!(c));
    }
    if let Some(r) = w.kv_role() {
        m.insert("kv_role".into(), json!(r));
    }
    if let Some(e) = w.kv_engine_id() {
        m.insert("kv_engine_id".into(), json!(e));
    }
    if let Some(r) = w.address.dp_rank.or(spec.dp_rank) {
        m.insert("dp_rank".into(), json!(r));
    }
    if let Some(s) = w.dp_size() {
        m.insert("dp_size".into(), json!(s));
    }
    m.insert(
        "max_connection_attempts".into(),
        json!(spec.max_connection_attempts),
    );
    if matches!(spec.worker_type, WorkerType::Prefill | WorkerType::Decode) {
        m.insert("pd_pairing".into(), json!(Descriptor::of(w).key()));
    }
    m.insert("is_healthy".into(), json!(w.is_healthy()));
    m.insert("status".into(), json!(w.status().as_str()));
    m.insert("load".into(), json!(w.in_flight()));
    if spec.worker_type == WorkerType::Prefill {
        // Link health: this prefill's links to decodes that are out of selection or probing.
        m.insert("links_out".into(), Value::Array(w.links.unhealthy()));
    }
    Value::Object(m)
}

fn list(gw: &Gateway, model: Option<&str>) -> Reply {
    let snap = gw.registry.snapshot();
    let shown: Vec<&Arc<Worker>> = snap
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
            "encode_count": count(WorkerType::Encode),
            "regular_count": count(WorkerType::Regular),
        },
    });
    Reply::json(200, body.to_string())
}
