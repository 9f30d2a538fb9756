//! MoRI-IO over HTTP (vLLM `MoRIIOConnector`): READ and WRITE handoffs, sequential by default,
//! concurrent WRITE on opt-in. Taken whenever the decode worker is a MoRI-IO worker; a decode
//! leg never goes out without a valid handoff (a MoRI-IO decode engine cannot recompute).
//!
//! (Being written: until then every MoRI-IO pair is refused before any leg is contacted.)

use pdgate_filters::errors::ErrorCode;
use pdgate_filters::handoff::vllm::Connector;
use pingora::proxy::Session;

use super::dispatch::Attempt;
use super::request::PdRequest;
use crate::gateway::Gateway;
use crate::proxy::ctx::RequestCtx;
use crate::reply::Reply;
use crate::workers::select::Pair;
use crate::workers::Worker;

/// Whether a worker speaks MoRI-IO (its registered connector).
pub fn is_moriio(w: &Worker) -> bool {
    Connector::from_name(w.spec.kv_connector.as_deref()) == Connector::MoriIo
}

pub async fn attempt(
    _gw: &Gateway,
    _session: &mut Session,
    _ctx: &mut RequestCtx,
    _req: &PdRequest,
    pair: &Pair,
) -> Attempt {
    log::warn!(
        "MoRI-IO pair {} -> {} refused: MoRI-IO dispatch is not available yet",
        pair.prefill.url(),
        pair.decode.url()
    );
    Attempt::Refused(Reply::error(
        ErrorCode::MoriioPairMisconfigured,
        "MoRI-IO pair is not configured for MoRI-IO (see the gateway log)",
    ))
}
