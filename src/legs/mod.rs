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

/// A fresh UUIDv7 (the engine request ids of gRPC attempts, Mooncake transfer ids). Its random
/// bits come from the thread's RNG: the `uuid` crate's own `now_v7` asks the kernel
/// (`getrandom`) on every call, a system call per request on the hot path.
pub fn uuid_v7() -> uuid::Uuid {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    uuid::Builder::from_unix_timestamp_millis(millis, &rand::random()).into_uuid()
}

/// `f`, or a test failure when it has not resolved in time: a leg that waits for bytes that are
/// not coming fails its test instead of hanging it.
#[cfg(test)]
pub(crate) async fn within<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(std::time::Duration::from_secs(20), f)
        .await
        .expect("no outcome within 20 s")
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_v7_is_a_version_7_uuid_of_now_and_unique() {
        let a = super::uuid_v7();
        let b = super::uuid_v7();
        assert_ne!(a, b);
        assert_eq!(a.get_version_num(), 7);
        assert_eq!(a.get_variant(), uuid::Variant::RFC4122);
        let (secs, _) = a.get_timestamp().expect("v7 has a timestamp").to_unix();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(now.abs_diff(secs) <= 1, "{secs} vs {now}");
    }
}
