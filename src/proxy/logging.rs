//! `logging`: the last phase of every request. One access-log line and the request-level
//! metrics; never the request body.

use pingora::proxy::Session;
use pingora::Error;

use super::ctx::RequestCtx;
use super::routes::Endpoint;
use crate::gateway::Gateway;
use crate::metrics::{BACKEND_PD, GRPC, HTTP, METRICS};

pub fn record(gw: &Gateway, session: &Session, e: Option<&Error>, ctx: &RequestCtx) {
    let elapsed = ctx.started.elapsed();
    let status = if ctx.status == 0 && ctx.client_gone {
        499
    } else {
        ctx.status
    };
    // A path no route serves is `other`, as SMG 1.13.0 labels it.
    let path_label = ctx.endpoint.as_ref().map_or("other", Endpoint::metric_path);
    let mut status_buf = [0u8; 20];
    let status_label = pdgate_filters::json::decimal(u64::from(status), &mut status_buf);
    let method = session.req_header().method.as_str();
    METRICS.http_responses.with(
        &[path_label, status_label, ctx.error_code.unwrap_or("")],
        |m| m.inc(),
    );
    METRICS
        .http_requests
        .with(&[method, path_label], |m| m.inc());
    METRICS
        .http_request_duration
        .with(&[method, path_label], |m| m.observe(elapsed.as_secs_f64()));

    if let Some(Endpoint::Pd(route)) = &ctx.endpoint {
        let model = ctx
            .model_label
            .as_deref()
            .unwrap_or(crate::metrics::UNKNOWN_MODEL);
        let endpoint = route.metric_endpoint();
        // SMG's HTTP and gRPC PD routers label their series `http` and `grpc` (router type and
        // connection mode alike).
        let mode = router_mode(gw, ctx);
        METRICS.router_requests.with(
            &[
                mode,
                BACKEND_PD,
                mode,
                model,
                endpoint,
                if ctx.streaming { "true" } else { "false" },
            ],
            |m| m.inc(),
        );
        if (200..300).contains(&status) && e.is_none() {
            METRICS
                .router_request_duration
                .with(&[mode, BACKEND_PD, mode, model, endpoint], |m| {
                    m.observe(elapsed.as_secs_f64())
                });
        } else if status >= 400 {
            METRICS.router_request_errors.with(
                &[mode, BACKEND_PD, mode, model, endpoint, error_type(status)],
                |m| m.inc(),
            );
        }
    }

    if log::log_enabled!(log::Level::Info) {
        let (prefill, decode) = ctx.pair.as_ref().map_or((None, None), |p| {
            (Some(p.prefill.url()), Some(p.decode.url()))
        });
        let path = session.req_header().uri.path();
        let failure = match e {
            Some(e) if !ctx.client_gone => Some(e.to_string()),
            _ => None,
        };
        // Fields as key-values: `crate::logs` writes them as `key=value` or as JSON keys.
        log::info!(
            target: "pdgate::access",
            request_id = ctx.request_id.as_str(),
            method = method,
            path = path,
            model = ctx.model_label.as_deref(),
            status = status,
            error = ctx.error_code,
            prefill = prefill,
            decode = decode,
            connector = ctx.connector,
            room = ctx.room,
            transfer_id = ctx.transfer_id.as_deref(),
            attempts = ctx.attempts,
            ttft_ms = ctx.ttft.map(|t| t.as_secs_f64() * 1e3),
            duration_ms = elapsed.as_secs_f64() * 1e3,
            failure = failure.as_deref(),
            client_gone = ctx.client_gone;
            ""
        );
    }
}

/// `http` or `grpc`: the pair's transport, or, for a request refused before a pair was chosen,
/// the registered workers' (gRPC when any is).
fn router_mode(gw: &Gateway, ctx: &RequestCtx) -> &'static str {
    let grpc = match &ctx.pair {
        Some(pair) => pair.prefill.is_grpc(),
        None => gw.registry.snapshot().all.iter().any(|w| w.is_grpc()),
    };
    if grpc {
        GRPC
    } else {
        HTTP
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
