//! The engines' gRPC wire contract: prost messages and tonic clients and servers generated at
//! build time from the protos vendored in this directory (`smg-grpc-proto` 0.4.28, unmodified;
//! see `PROVENANCE.md`).
//!
//! One module per proto package, each holding its messages, a `*_client` module and a
//! `*_server` module:
//!
//! | module | proto package | service |
//! |---|---|---|
//! | [`common`] | `smg.grpc.common` | (messages shared by every engine) |
//! | [`sglang`] | `sglang.grpc.scheduler` | `SglangScheduler` |
//! | [`vllm`] | `vllm.grpc.engine` | `VllmEngine` |
//! | [`tokenspeed`] | `tokenspeed.grpc.scheduler` | `TokenSpeedScheduler` |
//! | [`tokenspeed_encoder`] | `tokenspeed.grpc.encoder` | `TokenSpeedEncoder` |
//!
//! The engines refer to [`common`] types by this crate's path (one `GetTokenizerChunk` type for
//! all three), and [`tokenspeed_encoder`] uses [`tokenspeed`]'s multimodal types. Google's
//! `Struct` and `Timestamp` are [`prost_types`]'.

// Generated code follows the protos' shapes, not our lints (today clippy's `large_enum_variant`
// fires on vLLM's `generate_response::Response`); the allowance stops at these modules, and
// covers all of clippy so a toolchain update cannot fail CI on code nobody can edit.
macro_rules! generated_module {
    ($(#[$doc:meta])* $name:ident, $file:literal) => {
        $(#[$doc])*
        #[allow(clippy::all)]
        pub mod $name {
            include!(concat!(env!("OUT_DIR"), "/", $file));
        }
    };
}

generated_module!(
    /// `smg.grpc.common`: tokenizer bundle, KV events, cache flush and profiling messages.
    common,
    "smg.grpc.common.rs"
);
generated_module!(
    /// `sglang.grpc.scheduler`: the SGLang scheduler service.
    sglang,
    "sglang.grpc.scheduler.rs"
);
generated_module!(
    /// `vllm.grpc.engine`: the vLLM engine service.
    vllm,
    "vllm.grpc.engine.rs"
);
generated_module!(
    /// `tokenspeed.grpc.scheduler`: the TokenSpeed scheduler service.
    tokenspeed,
    "tokenspeed.grpc.scheduler.rs"
);
generated_module!(
    /// `tokenspeed.grpc.encoder`: the TokenSpeed encoder service (EPD).
    tokenspeed_encoder,
    "tokenspeed.grpc.encoder.rs"
);

/// The encoded `google.protobuf.FileDescriptorSet` the code above was generated from: the
/// vendored files and their imports, without source info. For descriptor-level checks and,
/// later, gRPC reflection in the mock engines.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

/// The `smg-grpc-proto` release the vendored files come from.
pub const SMG_GRPC_PROTO_VERSION: &str = "0.4.28";
