//! Control-plane calls to the mock engines (`/mock/stats`, `/mock/reset`, `/flush_cache`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::http1::{Conn, Keep, RawRequest};

async fn call(addr: SocketAddr, method: &str, path: &str) -> Option<(u16, Vec<u8>)> {
    let mut c = Conn::connect(addr).await.ok()?;
    let req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n");
    let raw = RawRequest {
        bytes: Arc::from(req.into_bytes().into_boxed_slice()),
    };
    let r = c
        .send(&raw, Keep { body: true }, Duration::from_secs(10))
        .await
        .ok()?;
    Some((r.status, r.body))
}

/// `GET path` → JSON body.
pub async fn get_json(addr: SocketAddr, path: &str) -> Option<Value> {
    let (status, body) = call(addr, "GET", path).await?;
    if !(200..300).contains(&status) {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// A mock engine's model-route requests so far (`/mock/stats` `requests_total`).
pub async fn requests_total(addr: SocketAddr) -> Option<u64> {
    get_json(addr, "/mock/stats")
        .await?
        .get("requests_total")?
        .as_u64()
}

/// `POST path` with an empty body; true on 2xx.
pub async fn post(addr: SocketAddr, path: &str) -> bool {
    matches!(call(addr, "POST", path).await, Some((s, _)) if (200..300).contains(&s))
}
