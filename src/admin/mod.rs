//! Admin and local endpoints: readiness, the worker API, and who may call them.

pub mod auth;
pub mod engines;
pub mod workers;

use crate::config::WorkerType;
use pdgate_filters::errors::ErrorCode;

use crate::gateway::Gateway;
use crate::policy::RoutingInput;
use crate::reply::Reply;
use crate::workers::intake::worker_get;
use crate::workers::select::select_pair;

/// `/readiness`: ready only with at least one healthy prefill and one healthy decode worker
/// (and, in EPD mode, one healthy encode worker).
/// With service discovery the body also carries a `discovery` object (whether each role's pods
/// were listed, how many workers it holds, its latest watch error).
pub fn readiness(gw: &Gateway) -> Reply {
    let snap = gw.registry.snapshot();
    let prefill = snap.healthy(WorkerType::Prefill);
    let decode = snap.healthy(WorkerType::Decode);
    let epd = gw.config().epd_disaggregation;
    let encode = snap.healthy(WorkerType::Encode);
    let (status, mut body) = if prefill > 0 && decode > 0 && (!epd || encode > 0) {
        let healthy = snap.all.iter().filter(|w| w.is_healthy()).count();
        (
            200,
            serde_json::json!({
                "status": "ready",
                "healthy_workers": healthy,
                "total_workers": snap.all.len(),
                "prefill_healthy": prefill,
                "decode_healthy": decode,
            }),
        )
    } else {
        (
            503,
            serde_json::json!({
                "status": "not ready",
                "reason": "insufficient healthy workers",
                "prefill_healthy": prefill,
                "decode_healthy": decode,
            }),
        )
    };
    if epd {
        body["encode_healthy"] = encode.into();
    }
    if let Some(discovery) = gw.discovery.to_json() {
        body["discovery"] = discovery;
    }
    Reply::json(status, body.to_string())
}

/// `/health_generate`: picks one prefill/decode pair as a request would and asks both engines'
/// own `/health_generate` (each runs a tiny generation) at once. 200 when both pass; 503
/// `health_generate_failed` naming the failing leg(s); 503 `no_healthy_worker_pair` when no
/// pair can be chosen.
pub async fn health_generate(gw: &Gateway) -> Reply {
    let snap = gw.registry.snapshot();
    let policies = gw.policies.load();
    let pair = match select_pair(
        &snap,
        None,
        &policies,
        &RoutingInput::default(),
        crate::metrics::UNKNOWN_MODEL,
    ) {
        Ok(p) => p,
        Err(e) => return Reply::error(ErrorCode::NoHealthyWorkerPair, e.message()),
    };
    let timeout = gw.settings().health_generate_timeout;
    let (p, d) = if pair.prefill.is_grpc() {
        // The servicers' HealthCheck runs the engine's own tiny generation (SGLang with a fake
        // bootstrap host on disaggregated workers).
        let channels = crate::workers::grpc::ControlChannels::new();
        tokio::join!(
            channels.probe(&pair.prefill, timeout),
            channels.probe(&pair.decode, timeout),
        )
    } else {
        let (p, d) = tokio::join!(
            worker_get(&gw.client, &pair.prefill, "/health_generate", timeout),
            worker_get(&gw.client, &pair.decode, "/health_generate", timeout),
        );
        (matches!(p, Some((true, _))), matches!(d, Some((true, _))))
    };
    let failed: Vec<String> = [("prefill", &pair.prefill, p), ("decode", &pair.decode, d)]
        .into_iter()
        .filter(|(_, _, ok)| !ok)
        .map(|(leg, w, _)| format!("{leg} {}", w.url()))
        .collect();
    if failed.is_empty() {
        Reply::text(
            200,
            format!(
                "Health generate passed on selected pair: prefill={}, decode={}",
                pair.prefill.url(),
                pair.decode.url()
            ),
        )
    } else {
        Reply::error(
            ErrorCode::HealthGenerateFailed,
            format!("Health generate failed on {}", failed.join(" and ")),
        )
    }
}

/// `POST /reload`: the SIGHUP reload, on demand (admin-protected). 200 with what changed; 400
/// with the reason when the file is invalid (then nothing changed).
pub async fn reload(gw: &std::sync::Arc<Gateway>, session: &mut pingora::proxy::Session) -> Reply {
    if !auth::may_mutate(&gw.settings(), session) {
        session.set_keepalive(None);
        return Reply::error(
            ErrorCode::Forbidden,
            auth::only_trusted("reload is accepted"),
        );
    }
    match crate::reload::reload(gw).await {
        Ok(report) => Reply::json(200, report.to_json().to_string()),
        Err(reason) => Reply::error(
            ErrorCode::InvalidRequest,
            format!("reload rejected, nothing changed: {reason}"),
        ),
    }
}
