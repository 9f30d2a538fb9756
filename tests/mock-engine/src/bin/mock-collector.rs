//! `mock-collector`: the mock OpenTelemetry collector ([`mock_engine::otlp`]) as a process, for
//! scripts and benchmarks. Prints `READY grpc=IP:PORT http=http://IP:PORT/v1/traces
//! control=http://IP:PORT` once listening; spans as JSON on `GET <control>/mock/spans` (the first
//! `--keep`), counts on `GET <control>/mock/stats`; exits on SIGTERM/SIGINT.

use std::net::IpAddr;

use clap::Parser;
use mock_engine::otlp::MockCollector;

#[derive(Parser)]
#[command(
    name = "mock-collector",
    about = "Mock OTLP trace collector (gRPC + HTTP/protobuf)"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// OTLP/gRPC port (0: any).
    #[arg(long, default_value_t = 0)]
    grpc_port: u16,
    /// OTLP/HTTP and control port (0: any).
    #[arg(long, default_value_t = 0)]
    http_port: u16,
    /// Spans kept for `GET /mock/spans`; the rest are only counted (`GET /mock/stats`).
    #[arg(long, default_value_t = 10_000)]
    keep: usize,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let collector =
        MockCollector::spawn_on(args.host, args.grpc_port, args.http_port, args.keep).await?;
    println!(
        "READY grpc={} http={} control={}",
        collector.grpc_endpoint(),
        collector.http_endpoint(),
        collector.control_url()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(collector);
    Ok(())
}
