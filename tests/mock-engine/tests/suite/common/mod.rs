//! Shared helpers of the mock-engine tests.
#![allow(dead_code)]

pub mod grpc;

use std::time::Duration;

use bytes::Bytes;
use mock_engine::client::{self, ClientOptions, Response};
use mock_engine::{EngineKind, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};

pub const SECS: Duration = Duration::from_secs(10);

pub async fn engine(engine: EngineKind, role: Role, ip: [u8; 4]) -> MockEngine {
    MockEngine::spawn(MockEngineConfig::test(engine, role, ip))
        .await
        .expect("spawn mock engine")
}

pub async fn engine_with(cfg: MockEngineConfig) -> MockEngine {
    MockEngine::spawn(cfg).await.expect("spawn mock engine")
}

/// POSTs JSON (optionally from a source IP) and reads the whole response.
pub fn post<'a>(
    url: impl Into<String>,
    body: &'a Value,
) -> impl std::future::Future<Output = Response> + 'a {
    let url = url.into();
    async move { post_from(None, &url, body).await }
}

pub async fn post_from(src: Option<[u8; 4]>, url: &str, body: &Value) -> Response {
    let opts = ClientOptions {
        source_ip: src.map(Into::into),
        timeout: Some(Duration::from_secs(30)),
    };
    client::request_with(
        &opts,
        "POST",
        url,
        &[
            ("content-type", "application/json"),
            ("x-request-id", "req-test-1"),
        ],
        Some(Bytes::from(body.to_string())),
    )
    .await
    .expect("request")
}

/// Adds SGLang bootstrap fields pointing at prefill `p`.
pub fn with_room(body: &Value, p: &MockEngine, room: u64) -> Value {
    let mut b = body.clone();
    b["bootstrap_host"] = json!(p.host());
    b["bootstrap_port"] = json!(p.bootstrap_port());
    b["bootstrap_room"] = json!(room);
    b
}

pub fn with_rooms(body: &Value, p: &MockEngine, rooms: &[u64]) -> Value {
    let mut b = body.clone();
    b["bootstrap_host"] = json!(vec![p.host(); rooms.len()]);
    b["bootstrap_port"] = json!(vec![p.bootstrap_port(); rooms.len()]);
    b["bootstrap_room"] = json!(rooms);
    b
}

pub fn room() -> u64 {
    rand::random::<u64>() & (i64::MAX as u64)
}

/// Sends both legs at once (as a parallel-dispatch gateway does).
pub async fn pd(p: &MockEngine, d: &MockEngine, path: &str, body: &Value) -> (Response, Response) {
    let pu = format!("{}{path}", p.api_url());
    let du = format!("{}{path}", d.api_url());
    tokio::join!(post(&pu, body), post(&du, body))
}
