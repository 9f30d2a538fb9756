//! The routes SMG's PD router serves from its workers rather than from a prefill/decode pair:
//! `GET /v1/models` (the registry's models), `GET /get_server_info` and `GET /get_model_info`
//! (proxied to the first registered prefill worker), `POST /flush_cache` and `GET /get_loads`
//! (every worker).
//! Shapes and codes are SMG 1.13.0's (checked against `smg launch` on the mock engines).

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use pdgate_filters::errors::{self, ErrorCode};
use serde_json::{json, Value};

use crate::config::WorkerType;
use crate::gateway::Gateway;
use crate::reply::Reply;
use crate::workers::grpc::ControlChannels;
use crate::workers::intake::worker_call;
use crate::workers::load;
use crate::workers::Worker;

/// How long a proxied info request or a worker's cache flush may take.
const ENGINE_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// `GET /v1/models`: OpenAI's model list, one card per model the registered workers serve
/// (declared in their specs or reported by their engines), first registration first. No model
/// known: 503 `No models available` (text), as SMG.
pub fn models(gw: &Gateway) -> Reply {
    let snap = gw.registry.snapshot();
    let mut ids: Vec<&str> = Vec::new();
    for w in snap.all.iter() {
        for m in w.models() {
            if !ids.contains(&m.as_str()) {
                ids.push(m);
            }
        }
    }
    if ids.is_empty() {
        return Reply::text(503, "No models available");
    }
    let data: Vec<Value> = ids.iter().map(|id| model_card(id)).collect();
    Reply::json(200, json!({"object": "list", "data": data}).to_string())
}

/// `GET /v1/models/{id}`: the model's card when a registered worker serves it, else 404
/// `model_not_found` (SMG 1.13.0's answers). `raw_id` is the path segment as sent.
pub fn model(gw: &Gateway, raw_id: &str) -> Reply {
    let id = percent_decoded(raw_id);
    let snap = gw.registry.snapshot();
    if snap
        .all
        .iter()
        .any(|w| w.models().iter().any(|m| m.as_str() == id))
    {
        return Reply::json(200, model_card(&id).to_string());
    }
    Reply::error(
        ErrorCode::ModelNotFound,
        format!("No worker available for model '{id}'"),
    )
}

/// One model's OpenAI card, as in the list.
fn model_card(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": "self_hosted"})
}

/// A path segment with its `%XX` escapes decoded (a client library may escape a model id's `/`
/// or `:`); an escape that is not two hex digits stays as sent, and so does the whole segment
/// when the decoded bytes are not UTF-8.
fn percent_decoded(raw: &str) -> String {
    match percent_encoding::percent_decode_str(raw).decode_utf8() {
        Ok(id) => id.into_owned(),
        Err(_) => raw.to_string(),
    }
}

/// `GET /get_server_info` and `GET /get_model_info`: the first registered healthy prefill
/// worker's own answer (status 200, its body and content type). Its error status maps to
/// `server_*` (`errors::server_error`); no answer is 500 `proxy_request_failed`; no healthy
/// prefill worker (none registered, or all down or draining) 503 `no_prefill_servers`, as
/// SMG 1.13.0 (an unhealthy one was asked anyway, a 500 with its connection error). `forwarded`: the client's headers to send along (SMG copies them for
/// `/get_model_info` only). A gRPC worker has no such HTTP route: 501, as SMG's gRPC router.
pub async fn proxy_info(
    gw: &Gateway,
    path: &'static str,
    forwarded: &[(HeaderName, HeaderValue)],
) -> Reply {
    let snap = gw.registry.snapshot();
    let prefill = snap
        .all
        .iter()
        .find(|w| w.role() == WorkerType::Prefill && w.is_healthy());
    let Some(prefill) = prefill else {
        return Reply::error(ErrorCode::NoPrefillServers, "No prefill servers available");
    };
    if prefill.is_grpc() {
        let what = if path == "/get_model_info" {
            "Get model info"
        } else {
            "Server info"
        };
        return Reply::text(501, format!("{what} not implemented"));
    }
    match worker_call(
        &gw.client,
        prefill,
        "GET",
        path,
        forwarded,
        ENGINE_CALL_TIMEOUT,
    )
    .await
    {
        Ok(a) if a.is_success() => {
            let reply = Reply::body(200, "", a.body);
            match a.content_type {
                Some(ct) => reply.with_header_value(http::header::CONTENT_TYPE, ct),
                None => reply,
            }
        }
        Ok(a) => {
            let (status, code) = errors::server_error(a.status);
            Reply::error_with_status(
                status,
                code,
                format!(
                    "Server returned status: {} {}",
                    a.status,
                    errors::reason_phrase(a.status)
                ),
            )
        }
        Err(why) => Reply::error(
            ErrorCode::ProxyRequestFailed,
            format!("Failed to proxy request: {why}"),
        ),
    }
}

/// The first registered worker of each engine (a DP rank's worker shares its engine's URL).
fn one_per_engine(all: &[std::sync::Arc<Worker>]) -> Vec<&std::sync::Arc<Worker>> {
    let mut engines: Vec<&std::sync::Arc<Worker>> = Vec::new();
    for w in all {
        if !engines
            .iter()
            .any(|e| e.address.base_url == w.address.base_url)
        {
            engines.push(w);
        }
    }
    engines
}

/// `GET /get_loads`: every engine's load report, asked now (SMG's shape: one row per DP rank
/// with its worker and role, and the aggregate over the rows). An engine that gives no report
/// is left out of `loads` and named in `unreachable` with why (pdgate's addition).
pub async fn loads(gw: &Gateway) -> Reply {
    let snap = gw.registry.snapshot();
    let engines = one_per_engine(&snap.all);
    let channels = ControlChannels::new();
    let timeout = gw.settings_now().health.timeout;
    let reports = futures::future::join_all(engines.iter().map(|w| {
        let channels = &channels;
        async move { (w, load::rows_now(&gw.client, channels, w, timeout).await) }
    }))
    .await;
    let mut rows = Vec::new();
    let mut unreachable = Vec::new();
    for (w, report) in reports {
        match report {
            Ok(ranks) => {
                for rank in ranks {
                    let mut row = serde_json::Map::new();
                    row.insert("worker".into(), json!(w.address.base_url));
                    row.insert("worker_type".into(), json!(w.role().as_str()));
                    row.extend(rank);
                    rows.push(Value::Object(row));
                }
            }
            Err(why) => unreachable.push(json!({"worker": w.address.base_url, "error": why})),
        }
    }
    // A fold from +0.0: `sum` of no floats is -0.0, which would print as `-0.0`.
    let sum = |key: &str| -> f64 {
        rows.iter()
            .filter_map(|r| r[key].as_f64())
            .fold(0.0, |a, b| a + b)
    };
    // Over the rows that report the field (a vLLM or gRPC row has no `utilization`).
    let mean = |key: &str| -> f64 {
        let n = rows.iter().filter(|r| r[key].is_number()).count();
        if n == 0 {
            0.0
        } else {
            sum(key) / n as f64
        }
    };
    let aggregate = json!({
        "total_running_reqs": sum("num_running_reqs") as u64,
        "total_waiting_reqs": sum("num_waiting_reqs") as u64,
        "total_reqs": sum("num_total_reqs") as u64,
        "avg_token_usage": mean("token_usage"),
        "avg_throughput": mean("gen_throughput"),
        "avg_utilization": mean("utilization"),
    });
    let mut body = json!({
        "timestamp": rfc3339_utc(std::time::SystemTime::now()),
        "version": concat!("pdgate-", env!("CARGO_PKG_VERSION")),
        "dp_rank_count": rows.len(),
        "loads": rows,
        "aggregate": aggregate,
    });
    if !unreachable.is_empty() {
        body["unreachable"] = Value::Array(unreachable);
    }
    Reply::json(200, body.to_string())
}

/// `2026-12-04T11:05:04.340890097Z` (UTC, nanoseconds), as SMG's `timestamp`.
fn rfc3339_utc(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// `POST /flush_cache`: every registered worker flushes its prefix cache at once (HTTP: the
/// engine's `POST /flush_cache`; gRPC: its `FlushCache`). 200 when all did, 206 with the
/// failures otherwise; SMG's body. A DP rank's worker shares its engine, so an engine is asked
/// once.
pub async fn flush_cache(gw: &Gateway) -> Reply {
    let snap = gw.registry.snapshot();
    let engines = one_per_engine(&snap.all);
    let http_workers = engines.iter().filter(|w| !w.is_grpc()).count();
    let grpc_workers = engines.len() - http_workers;
    if engines.is_empty() {
        return flush_reply(
            &[],
            &[],
            0,
            0,
            "No workers available for cache flush".into(),
        );
    }
    let channels = ControlChannels::new();
    let flushes = engines.iter().map(|w| {
        let channels = &channels;
        async move {
            let result = if w.is_grpc() {
                channels.flush_cache(w, ENGINE_CALL_TIMEOUT).await
            } else {
                match worker_call(
                    &gw.client,
                    w,
                    "POST",
                    "/flush_cache",
                    &[],
                    ENGINE_CALL_TIMEOUT,
                )
                .await
                {
                    Ok(a) if a.is_success() => Ok(()),
                    Ok(a) => Err(format!(
                        "flush_cache returned {}: {}",
                        a.status,
                        String::from_utf8_lossy(&a.body).trim()
                    )),
                    Err(why) => Err(why),
                }
            };
            (w.address.base_url.clone(), result)
        }
    });
    let results = futures::future::join_all(flushes).await;
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (url, result) in results {
        match result {
            Ok(()) => ok.push(url),
            Err(why) => failed.push((url, why)),
        }
    }
    let message = if failed.is_empty() {
        format!("Successfully flushed cache on all {} workers", ok.len())
    } else {
        format!(
            "Cache flush: {} succeeded, {} failed",
            ok.len(),
            failed.len()
        )
    };
    flush_reply(&ok, &failed, http_workers, grpc_workers, message)
}

fn flush_reply(
    ok: &[String],
    failed: &[(String, String)],
    http_workers: usize,
    grpc_workers: usize,
    message: String,
) -> Reply {
    let mut body = json!({
        "status": if failed.is_empty() { "success" } else { "partial_success" },
        "message": message,
        "workers_flushed": ok.len(),
        "total_http_workers": http_workers,
        "total_grpc_workers": grpc_workers,
        "total_zmq_workers_skipped": 0,
        "total_workers": http_workers + grpc_workers,
    });
    if !failed.is_empty() {
        body["successful"] = json!(ok);
        body["failed"] = failed
            .iter()
            .map(|(url, why)| json!({"worker": url, "error": why}))
            .collect();
    }
    Reply::json(if failed.is_empty() { 200 } else { 206 }, body.to_string())
}

#[cfg(test)]
mod tests {
    use super::{percent_decoded, rfc3339_utc};
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |secs: u64, nanos: u32| rfc3339_utc(UNIX_EPOCH + Duration::new(secs, nanos));
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(at(951_782_400, 5), "2000-02-29T00:00:00.000000005Z");
        assert_eq!(
            at(1_796_382_304, 340_890_097),
            "2026-12-04T11:05:04.340890097Z"
        );
        assert_eq!(at(4_107_542_399, 0), "2100-02-28T23:59:59.000000000Z");
    }

    #[test]
    fn a_model_id_is_percent_decoded_where_it_can_be() {
        assert_eq!(percent_decoded("org%2Fname"), "org/name");
        assert_eq!(percent_decoded("a%3a1"), "a:1");
        assert_eq!(percent_decoded("plain"), "plain");
        assert_eq!(percent_decoded("100%"), "100%");
        assert_eq!(percent_decoded("%zz%4"), "%zz%4");
        assert_eq!(percent_decoded("%ff"), "%ff", "not UTF-8: left as sent");
    }
}
