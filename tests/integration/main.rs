//! Integration tests: the real `pdgate` binary against mock engines on loopback. One test binary
//! (shared build and link), one module per capability.

mod cli;
mod harness;
mod lifecycle;
mod policies;
mod moriio;
mod observability;
mod operations;
mod sglang;
mod vllm;
mod workers;
