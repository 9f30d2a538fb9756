//! KV handoff wire fields, one module per rendezvous protocol: the names and shapes the gateway
//! adds to (or relays between) the prefill and decode legs.
//!
//! * [`sglang`]: parallel dispatch with a bootstrap room (SGLang, TokenSpeed over HTTP).
//! * [`vllm`]: sequential dispatch relaying `kv_transfer_params` (NIXL, Mooncake, passthrough).
//! * [`moriio`]: vLLM MoRI-IO checks, tags and handoff validation.

pub mod moriio;
pub mod sglang;
pub mod vllm;
