//! Decode admission on the HTTP dispatch modes (the window itself is `workers::admission`): the
//! slots of one attempt are claimed once its pair is chosen and before any leg goes out — one
//! per sequence the decode engine will run — and the attempt holds them until its decode legs
//! ended, however they end (answered, failed, client gone: the attempt returns only then).

use pdgate_filters::errors::ErrorCode;
use pingora::proxy::Session;

use super::dispatch::Attempt;
use crate::gateway::Settings;
use crate::reply::Reply;
use crate::workers::admission::{self, NotAdmitted, Slots};
use crate::workers::Worker;

/// Claims `n` slots on `decode` (`None` when it reports no window: not gated), waiting up to
/// `pd_admission_wait_secs` while watching the client. A shed or a client that left is the
/// attempt's outcome.
pub async fn claim(
    settings: &Settings,
    session: &mut Session,
    decode: &Worker,
    n: usize,
) -> Result<Option<Slots>, Attempt> {
    let n = u32::try_from(n).unwrap_or(u32::MAX);
    let client_gone = move || async move {
        let _ = session.read_body_or_idle(true).await;
    };
    match admission::admit(decode, n, settings.pd_admission_wait, client_gone).await {
        Ok(slots) => Ok(slots),
        Err(NotAdmitted::ClientGone) => Err(Attempt::ClientGone),
        Err(NotAdmitted::Shed) => Err(Attempt::Refused(shed_reply(
            decode,
            settings.overload_retry_after_secs,
        ))),
    }
}

/// The answer to a dispatch shed at the decode's window: 503 `worker_overload_protection_shed`
/// with `Retry-After` (final: a retry would meet the same full window).
pub fn shed_reply(decode: &Worker, retry_after_secs: u64) -> Reply {
    Reply::error(
        ErrorCode::WorkerOverloadProtectionShed,
        format!(
            "the decode worker {} has no free slot in its running window",
            decode.url()
        ),
    )
    .with_retry_after(retry_after_secs)
}
