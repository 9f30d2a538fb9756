//! Integration tests: the real `pdgate` binary against mock engines on loopback. One test binary
//! (shared build and link), one module per capability.

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
