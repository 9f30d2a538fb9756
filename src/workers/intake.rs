//! Turning a validated [`WorkerSpec`] into a live [`Worker`]: the URL split for legs and the
//! bootstrap host, the address resolved once (never on the hot path: Pingora's peer resolves
//! hostnames with a blocking call), and the runtime resolved.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use crate::config::{RuntimeType, WorkerSpec};

use super::worker::{Status, Worker, WorkerAddress};

/// The runtime a spec declares; an unspecified one is SGLang until detection says otherwise
/// (SMG's fallback for an unresolved runtime).
pub fn declared_runtime(spec: &WorkerSpec) -> RuntimeType {
    match spec.runtime_type {
        RuntimeType::Unspecified => RuntimeType::Sglang,
        r => r,
    }
}

/// Resolves `host:port` (blocking; for startup, or inside `spawn_blocking`).
pub fn resolve(address: &WorkerAddress) -> Result<SocketAddr, String> {
    (address.resolve_host(), address.port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {}: {e}", address.authority))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", address.authority))
}

/// A worker from the startup configuration: `pending` until its first health probe succeeds
/// (or `ready` at once when health checks are disabled).
pub fn startup_worker(spec: &WorkerSpec, health_checks: bool) -> Result<Arc<Worker>, String> {
    let address = WorkerAddress::parse(&spec.url)?;
    let addr = resolve(&address)?;
    let initial = if health_checks {
        Status::Pending
    } else {
        Status::Ready
    };
    Ok(Worker::new(
        uuid::Uuid::new_v4().to_string(),
        spec.clone(),
        declared_runtime(spec),
        address,
        addr,
        initial,
    ))
}
