//! Compiles the vendored engine protos into tonic clients and servers, in `OUT_DIR`.
//!
//! protox parses the .proto files in pure Rust (no system `protoc`, so a clean CI box needs no
//! extra package), and tonic-prost-build turns its FileDescriptorSet into prost messages plus
//! tonic client and server code. One file per proto package lands in `OUT_DIR`; `src/lib.rs`
//! includes each into a module of its own. The descriptor set itself is written next to them as
//! `file_descriptor_set.bin` for the field-number check against the servicers' stubs.

use std::path::PathBuf;

use prost::Message;

/// The vendored files, compiled together. Keep in step with `VENDORED` in `check_stubs.py`.
const PROTO_FILES: [&str; 5] = [
    "common.proto",
    "sglang_scheduler.proto",
    "vllm_engine.proto",
    "tokenspeed_scheduler.proto",
    "tokenspeed_encoder.proto",
];

/// Each proto package and the module of this crate that holds it (see `src/lib.rs`).
const PACKAGES: [(&str, &str); 5] = [
    ("smg.grpc.common", "crate::common"),
    ("sglang.grpc.scheduler", "crate::sglang"),
    ("vllm.grpc.engine", "crate::vllm"),
    ("tokenspeed.grpc.scheduler", "crate::tokenspeed"),
    ("tokenspeed.grpc.encoder", "crate::tokenspeed_encoder"),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    println!("cargo:rerun-if-changed=build.rs");
    for file in PROTO_FILES {
        println!("cargo:rerun-if-changed={}", proto_dir.join(file).display());
    }

    // Imports resolve against the proto directory itself (the engines import "common.proto"
    // by bare name); google/protobuf/{struct,timestamp}.proto come built into protox.
    let fds = protox::compile(PROTO_FILES, [&proto_dir])?;

    // Written with its imports (the google well-known types), so the set stands alone, and
    // without comments, which nothing reads from the binary form.
    let mut descriptor_set = fds.clone();
    for file in &mut descriptor_set.file {
        file.source_code_info = None;
    }
    std::fs::write(
        out_dir.join("file_descriptor_set.bin"),
        descriptor_set.encode_to_vec(),
    )?;

    // One pass per package, each writing only `<package>.rs`. Every other package is an
    // `extern_path` to its module in this crate, so the engines share one `common` and the
    // encoder uses the TokenSpeed scheduler's types. prost-build skips extern messages but would
    // still write an extern package's client and server, so this pass's copy of the set keeps
    // only its own package's services. Every file stays in: prost-build looks at all the
    // messages a field can reach to decide which derives apply.
    for (package, _) in PACKAGES {
        let mut pass = fds.clone();
        for file in &mut pass.file {
            if file.package() != package {
                file.service.clear();
            }
        }
        let mut builder = tonic_prost_build::configure()
            .build_client(true)
            // Servers for the mock engines (tests/mock-engine); an RPC a mock does not implement
            // answers UNIMPLEMENTED, as a servicer without that feature does.
            .build_server(true)
            .generate_default_stubs(true);
        for (other, module) in PACKAGES {
            if other != package {
                builder = builder.extern_path(format!(".{other}"), module);
            }
        }
        builder.compile_fds(pass)?;
    }
    Ok(())
}
