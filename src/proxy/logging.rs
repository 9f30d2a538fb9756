//! `logging`: the last phase of every request. One access-log line and the request-level
//! metrics; never the request body.

use pingora::proxy::Session;
use pingora::Error;

use super::ctx::RequestCtx;
use super::routes::Endpoint;
use crate::gateway::Gateway;
use crate::metrics::{BACKEND_PD, HTTP, METRICS};

pub fn record(gw: &Gateway, session: &Session, e: Option<&Error>, ctx: &RequestCtx) {
    let _ = gw;
    let elapsed = ctx.started.elapsed();
    let status = if ctx.status == 0 && ctx.client_gone {
        499
    } else {
        ctx.status
    };
    let path_label = ctx
        .endpoint
        .as_ref()
        .map_or("unmatched", Endpoint::metric_path);
    let status_label = status.to_string();
    let method = session.req_header().method.as_str();
    METRICS
        .http_responses
        .with_label_values(&[path_label, &status_label, ctx.error_code.unwrap_or("")])
        .inc();
    METRICS
        .http_requests
        .with_label_values(&[method, path_label])
        .inc();
    METRICS
        .http_request_duration
        .with_label_values(&[method, path_label])
        .observe(elapsed.as_secs_f64());

    if let Some(Endpoint::Pd(route)) = &ctx.endpoint {
        let model = ctx
            .model_label
            .as_deref()
            .unwrap_or(crate::metrics::UNKNOWN_MODEL);
        let endpoint = route.metric_endpoint();
        METRICS
            .router_requests
            .with_label_values(&[
                HTTP,
                BACKEND_PD,
                HTTP,
                model,
                endpoint,
                if ctx.streaming { "true" } else { "false" },
            ])
            .inc();
        if (200..300).contains(&status) && e.is_none() {
            METRICS
                .router_request_duration
                .with_label_values(&[HTTP, BACKEND_PD, HTTP, model, endpoint])
                .observe(elapsed.as_secs_f64());
        } else if status >= 400 {
            METRICS
                .router_request_errors
                .with_label_values(&[HTTP, BACKEND_PD, HTTP, model, endpoint, error_type(status)])
                .inc();
        }
    }

    if log::log_enabled!(log::Level::Info) {
        let (prefill, decode) = ctx
            .pair
            .as_ref()
            .map_or(("-", "-"), |p| (p.prefill.url(), p.decode.url()));
        let path = session.req_header().uri.path();
        log::info!(
            target: "pdgate::access",
            "request_id={} method={} path={} model={} status={} error={} prefill={} decode={} connector={} room={} transfer_id={} attempts={} ttft_ms={} duration_ms={:.1}{}",
            ctx.request_id,
            method,
            path,
            ctx.model_label.as_deref().unwrap_or("-"),
            status,
            ctx.error_code.unwrap_or("-"),
            prefill,
            decode,
            ctx.connector.unwrap_or("-"),
            ctx.room.map_or_else(|| "-".to_string(), |r| r.to_string()),
            ctx.transfer_id.as_deref().unwrap_or("-"),
            ctx.attempts,
            ctx.ttft.map_or_else(|| "-".to_string(), |t| format!("{:.1}", t.as_secs_f64() * 1e3)),
            elapsed.as_secs_f64() * 1e3,
            match e {
                Some(e) if !ctx.client_gone => format!(" failure=\"{e}\""),
                _ if ctx.client_gone => " client_gone=true".to_string(),
                _ => String::new(),
            }
        );
    }
}

/// SMG's `error_type` label.
fn error_type(status: u16) -> &'static str {
    match status {
        400 => "validation_error",
        404 => "no_workers",
        408 | 504 => "timeout",
        500..=599 => "backend_error",
        _ => "internal_error",
    }
}
