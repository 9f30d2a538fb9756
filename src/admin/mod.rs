//! Admin and local endpoints: readiness, the worker API, and who may call them.

pub mod auth;
pub mod workers;

use crate::config::WorkerType;
use crate::gateway::Gateway;
use crate::reply::Reply;

/// `/readiness`: ready only with at least one healthy prefill and one healthy decode worker.
pub fn readiness(gw: &Gateway) -> Reply {
    let snap = gw.registry.snapshot();
    let prefill = snap.healthy(WorkerType::Prefill);
    let decode = snap.healthy(WorkerType::Decode);
    if prefill > 0 && decode > 0 {
        let healthy = snap.all.iter().filter(|w| w.is_healthy()).count();
        Reply::json(
            200,
            serde_json::json!({
                "status": "ready",
                "healthy_workers": healthy,
                "total_workers": snap.all.len(),
                "prefill_healthy": prefill,
                "decode_healthy": decode,
            })
            .to_string(),
        )
    } else {
        Reply::json(
            503,
            serde_json::json!({
                "status": "not ready",
                "reason": "insufficient healthy workers",
                "prefill_healthy": prefill,
                "decode_healthy": decode,
            })
            .to_string(),
        )
    }
}
