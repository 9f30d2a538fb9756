//! Integration tests: the real `pdgate` binary against mock engines on loopback. One test binary
//! (shared build and link), one module per capability.
//!
//! CI runs the whole suite once, on a loaded 2-core machine, and one red test keeps everything
//! from landing. So every test here (and in the crates' own test modules) keeps to these rules,
//! each learned from a test that failed that way:
//!
//! - Wait for a condition, with a deadline; never for a time (`wait_records`, `wait_idle`,
//!   `metrics_when`).
//! - Where a timing decides the outcome (a fault that fires after a delay while the other legs
//!   must have arrived, a window that must still be open when the next request comes), leave it
//!   seconds, not milliseconds: a loaded machine stalls a process for hundreds of them. Unit
//!   tests pass the time in (`LinkTable::usable_at`, `RateBucket::try_take_at`) instead of
//!   sleeping past a cooldown.
//! - A scripted peer counts a reset as a close: a socket closed with bytes still unread in it
//!   goes out as a reset (ECONNRESET at the peer), not an end of stream.
//! - A mock engine writes a request's outcome before the request leaves the in-flight count that
//!   `wait_idle` watches.

mod admission;
mod chaos;
mod cli;
mod deploy;
mod engine_routes;
mod engine_wire;
mod fanout;
mod file_discovery;
mod grpc_pd;
mod grpc_workers;
mod handoff_health;
mod harness;
mod hostile;
mod http_admission;
mod kubernetes;
mod lifecycle;
mod moriio;
mod multimodal;
mod observability;
mod operations;
mod operator_flags;
mod otlp_tracing;
mod policies;
mod request_shape;
mod sglang;
mod vllm;
mod workers;
