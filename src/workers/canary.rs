//! Link canaries (opt-in, `link_canary_interval_secs`): every interval, one tiny PD request per
//! prefill → decode link, so a broken link is found before a user's request lands on it.
//!
//! A canary is a real request to the gateway's own serving listener, through the whole path a
//! client request takes (admission, legs, relay, the handoff verdict and the link's breaker),
//! pinned to its link by the `x-pdgate-canary` header. The header carries a secret minted at
//! startup, so no client can pin a pair; without the secret it is an ordinary (ignored) header,
//! and it is never forwarded to an engine. A pinned request makes one attempt (no retry on
//! another pair: the outcome belongs to the link) and may cross an open link — a canary is
//! also how an open link is probed with no user traffic.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use pingora::upstreams::peer::HttpPeer;

use crate::gateway::Gateway;
use crate::legs::client::{AnswerHeaders, LegClient, LegPeer, LegRequest};
use crate::metrics::METRICS;
use crate::workers::select::is_available;

/// The header that pins a request to one link: `<secret> <prefill id> <decode id>`.
pub static CANARY_HEADER: HeaderName = HeaderName::from_static("x-pdgate-canary");

/// How long one canary may take.
const CANARY_TIMEOUT: Duration = Duration::from_secs(30);

/// The link a request is pinned to, when its `x-pdgate-canary` header carries `secret`.
pub fn pinned_link(value: Option<&str>, secret: &str) -> Option<(String, String)> {
    let mut it = value?.split(' ');
    let (token, prefill, decode) = (it.next()?, it.next()?, it.next()?);
    if it.next().is_some() || !crate::admin::auth::same(token.as_bytes(), secret.as_bytes()) {
        return None;
    }
    Some((prefill.to_string(), decode.to_string()))
}

pub struct LinkCanaries {
    pub gw: Arc<Gateway>,
}

#[async_trait]
impl BackgroundService for LinkCanaries {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let client = LegClient::new(8, Some(Duration::from_secs(30)));
        loop {
            let interval = self.gw.settings().link_canary_interval;
            let wait = if interval.is_zero() {
                // Off: look again later (a reload may turn it on).
                Duration::from_secs(5)
            } else {
                self.round(&client).await;
                interval
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
}

impl LinkCanaries {
    /// One canary per link between available workers, one after the other.
    async fn round(&self, client: &LegClient) {
        let cfg = self.gw.config();
        let Some(own) = own_address(&cfg.host, cfg.port) else {
            return;
        };
        let peer = LegPeer::new(HttpPeer::new(own, false, String::new()));
        let authority = own.to_string();
        let snap = self.gw.registry.snapshot();
        let links: Vec<(String, String, Option<String>)> = snap
            .prefills
            .iter()
            .enumerate()
            .filter(|(_, p)| is_available(p))
            .flat_map(|(i, p)| {
                snap.pairs[i]
                    .iter()
                    .map(|&d| &snap.decodes[d])
                    .filter(|d| is_available(d))
                    .map(|d| (p.id.clone(), d.id.clone(), p.models().first().cloned()))
                    .collect::<Vec<_>>()
            })
            .collect();
        drop(snap);
        for (prefill, decode, model) in links {
            let passed = self
                .send(
                    client,
                    &peer,
                    &authority,
                    &prefill,
                    &decode,
                    model.as_deref(),
                )
                .await;
            METRICS
                .pd_canaries
                .with_label_values(&[if passed { "passed" } else { "failed" }])
                .inc();
        }
    }

    async fn send(
        &self,
        client: &LegClient,
        peer: &LegPeer,
        authority: &str,
        prefill: &str,
        decode: &str,
        model: Option<&str>,
    ) -> bool {
        let mut body = serde_json::json!({
            "prompt": "pdgate link canary: is the KV handoff between these two workers healthy?",
            "max_tokens": 1,
            "stream": false,
        });
        if let Some(m) = model {
            body["model"] = serde_json::json!(m);
        }
        let pin = format!("{} {prefill} {decode}", self.gw.canary_secret);
        let mut headers = Vec::with_capacity(2);
        if let Ok(v) = HeaderValue::from_str(&pin) {
            headers.push((CANARY_HEADER.clone(), v));
        }
        if let Some(key) = self.gw.settings().api_key.as_deref() {
            if let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}")) {
                headers.push((http::header::AUTHORIZATION, v));
            }
        }
        let req = LegRequest {
            answer_headers: AnswerHeaders::All,
            method: "POST",
            path: "/v1/completions",
            host: authority,
            headers: &headers,
            body: Bytes::from(body.to_string()).into(),
        };
        match client.open(peer, &req, CANARY_TIMEOUT).await {
            Ok(mut leg) => {
                leg.set_read_timeout(Some(CANARY_TIMEOUT));
                let ok = leg.is_success();
                let read = leg.read_to_end(1 << 20).await.is_ok();
                if read {
                    client.release(leg, peer).await;
                }
                ok && read
            }
            Err(e) => {
                log::debug!("link canary {prefill} -> {decode}: {e}");
                false
            }
        }
    }
}

/// Where the gateway's own serving listener is reached from this host: its address, with an
/// unspecified one (`0.0.0.0`, `::`) replaced by loopback.
fn own_address(host: &str, port: u16) -> Option<std::net::SocketAddr> {
    let ip: std::net::IpAddr = host.trim_matches(['[', ']']).parse().ok()?;
    let ip = match ip {
        std::net::IpAddr::V4(v4) if v4.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
        std::net::IpAddr::V6(v6) if v6.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_secret_pins_a_link() {
        assert_eq!(
            pinned_link(Some("s3cret p1 d1"), "s3cret"),
            Some(("p1".into(), "d1".into()))
        );
        for bad in [
            None,
            Some("guess p1 d1"),
            Some("s3cret p1"),
            Some("s3cret p1 d1 x"),
        ] {
            assert_eq!(pinned_link(bad, "s3cret"), None, "{bad:?}");
        }
    }

    #[test]
    fn an_unspecified_listener_is_reached_on_loopback() {
        assert_eq!(
            own_address("0.0.0.0", 30000),
            Some("127.0.0.1:30000".parse().unwrap())
        );
        assert_eq!(own_address("::", 1), Some("[::1]:1".parse().unwrap()));
        assert_eq!(
            own_address("127.0.9.1", 2),
            Some("127.0.9.1:2".parse().unwrap())
        );
        assert_eq!(own_address("gateway.local", 2), None);
    }
}
