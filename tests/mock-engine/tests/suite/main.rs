//! The mock engines' tests, one binary: a binary per file cost ~40 MB of disk and a link each in
//! every clean build (README, "Disk").
mod common;
mod grpc_multimodal;
mod grpc_pd;
mod sglang_pd;
mod vllm_pd;
