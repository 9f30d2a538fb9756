//! pdgate: a prefill/decode disaggregation gateway for LLM inference, built on Pingora.
//!
//! The request path runs one way: parse → select → plan legs → dispatch → relay → account.
//! See `docs/architecture.md` for where each fact lives.

pub mod admin;
pub mod blocks;
pub mod capacity;
pub mod config;
pub mod demo;
pub mod discovery;
pub mod drain;
pub mod gateway;
pub mod gather;
pub mod head;
pub mod in_box;
pub mod labelled;
pub mod ledger;
pub mod legs;
pub mod limiter;
pub mod listen_check;
pub mod logs;
pub mod metrics;
pub mod models;
pub mod policy;
pub mod proxy;
pub mod reload;
pub mod reply;
pub mod scratch;
pub mod server;
pub mod tick;
pub mod trace;
pub mod workers;
