//! The sub-request module: the legs of a PD request (prefill and decode), how they are
//! dispatched for each engine, and how the decode output is relayed back.
//!
//! `request` (what the legs carry) → `dispatch` (attempt loop, retries) → `parallel` (SGLang) or `sequential` (vLLM)
//! → `prefill` (the background prefill leg) and `relay` (decode output to the client), all over
//! `client` (HTTP/1.1 over Pingora's connector, idle connections parked in `pool`).

pub mod admit;
pub mod client;
pub mod dispatch;
pub mod fanout;
pub mod grpc;
pub mod handoff;
pub mod moriio;
pub mod parallel;
pub mod pool;
pub mod prefill;
pub mod relay;
pub mod request;
pub mod sequential;
