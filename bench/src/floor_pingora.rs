//! `floor-proxy --pingora`: the floor of `floor.rs` served through Pingora's `ProxyHttp`, as a
//! yardstick for what Pingora's HTTP/1 session costs by itself (issue 15 asks for pdgate to stay
//! in Pingora's phases): the same splice, the same two legs written at once on keep-alive
//! connections, the same whole answer relayed, but the client's request is read and the answer
//! written by Pingora's downstream session from inside `request_filter`.
//!
//! So pdgate ÷ this floor is what pdgate's own work costs (parse, pair selection, timeouts,
//! metrics, logs, accounting), and this floor ÷ the plain one is Pingora's share.
//!
//! Set up as pdgate sets up its own service where Pingora offers a choice: no downstream
//! modules (pdgate registers none: Pingora's default compression module costs even disabled),
//! `threads` workers of Pingora's work-stealing runtime. Connections to the engines come from a
//! pool shared by every client connection (a gateway cannot tie them to one client), locked
//! only to take or return one. The answer goes out with a `Content-Length` (a chunked engine
//! body is joined first): one client write, like pdgate's.

use std::net::SocketAddr;
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use pdgate_filters::framing::{BodyDecoder, Framing};
use pingora::http::ResponseHeader;
use pingora::modules::http::HttpModules;
use pingora::proxy::{http_proxy_service, ProxyHttp, Session};
use pingora::server::configuration::ServerConf;
use pingora::server::Server;
use pingora::upstreams::peer::HttpPeer;

use crate::floor::{leg_body, request, FloorSpec, Upstream};

/// Idle keep-alive connections to one engine.
struct Pool {
    addr: SocketAddr,
    idle: Mutex<Vec<Upstream>>,
}

impl Pool {
    fn take(&self) -> Upstream {
        let idle = self.idle.lock().expect("pool lock").pop();
        idle.unwrap_or_else(|| Upstream::new(self.addr))
    }

    fn put(&self, up: Upstream) {
        self.idle.lock().expect("pool lock").push(up);
    }

    /// One exchange on a pooled connection; the connection goes back only when it succeeded.
    async fn exchange(&self, req: &[u8]) -> Option<Upstream> {
        let mut up = self.take();
        match up.exchange(req).await {
            Ok(()) => Some(up),
            Err(_) => None,
        }
    }
}

struct PingoraFloor {
    bootstrap_port: u16,
    prefill_host: String,
    decode_host: String,
    prefill: Pool,
    decode: Pool,
}

/// The engine's answer (head and whole body in `raw`) as the client gets it: the status and
/// the content type, the body joined when it was chunked.
fn answer(raw: &[u8]) -> Option<(u16, Option<Bytes>, Bytes)> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(raw).ok()? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return None,
    };
    let status = resp.code?;
    let mut content_type = None;
    let mut chunked = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-type") {
            content_type = Some(Bytes::copy_from_slice(h.value));
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = h.value.eq_ignore_ascii_case(b"chunked");
        }
    }
    let body = &raw[head..];
    let body = if chunked {
        dechunk(body)?
    } else {
        Bytes::copy_from_slice(body)
    };
    Some((status, content_type, body))
}

/// The data of a whole chunked body (the gateway's own decoder, as the load generator uses).
fn dechunk(body: &[u8]) -> Option<Bytes> {
    let mut decoder = BodyDecoder::new(Framing::Chunked);
    let data = decoder.decode(&mut BytesMut::from(body)).ok()?;
    decoder.is_done().then_some(data)
}

#[async_trait]
impl ProxyHttp for PingoraFloor {
    type CTX = ();

    fn new_ctx(&self) {}

    fn init_downstream_modules(&self, _modules: &mut HttpModules) {}

    async fn request_filter(&self, session: &mut Session, _ctx: &mut ()) -> pingora::Result<bool> {
        let mut body = BytesMut::new();
        while let Some(piece) = session.read_request_body().await? {
            body.extend_from_slice(&piece);
        }
        let path = session.req_header().uri.path().to_owned();
        let legs = leg_body(&body, self.bootstrap_port);
        let leg_p = request("POST", &path, &self.prefill_host, &legs);
        let leg_d = request("POST", &path, &self.decode_host, &legs);
        let (p, d) = tokio::join!(self.prefill.exchange(&leg_p), self.decode.exchange(&leg_d));
        let answered = match (p, d) {
            (Some(p), Some(d)) => {
                let answer = answer(&d.buf);
                self.prefill.put(p);
                self.decode.put(d);
                answer
            }
            (p, d) => {
                // The one that answered goes back; the other was closed.
                if let Some(p) = p {
                    self.prefill.put(p);
                }
                if let Some(d) = d {
                    self.decode.put(d);
                }
                None
            }
        };
        let (status, content_type, body) = answered.unwrap_or((502, None, Bytes::new()));
        let mut head = ResponseHeader::build(status, Some(2))?;
        if let Some(ct) = content_type {
            head.insert_header(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_maybe_shared(ct)
                    .map_err(|_| pingora::Error::new(pingora::ErrorType::InvalidHTTPHeader))?,
            )?;
        }
        head.insert_header(http::header::CONTENT_LENGTH, body.len())?;
        session.write_response_header(Box::new(head), false).await?;
        session.write_response_body(Some(body), true).await?;
        Ok(true)
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut (),
    ) -> pingora::Result<Box<HttpPeer>> {
        // Every request is answered in `request_filter`.
        Err(pingora::Error::new(pingora::ErrorType::InternalError))
    }
}

/// Serves until the process is killed.
pub fn run(spec: FloorSpec) -> Result<(), String> {
    let conf = ServerConf {
        version: 1,
        threads: spec.threads.max(1),
        grace_period_seconds: Some(0),
        graceful_shutdown_timeout_seconds: Some(1),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let app = PingoraFloor {
        bootstrap_port: spec.bootstrap_port,
        prefill_host: spec.prefill.to_string(),
        decode_host: spec.decode.to_string(),
        prefill: Pool {
            addr: spec.prefill,
            idle: Mutex::new(Vec::new()),
        },
        decode: Pool {
            addr: spec.decode,
            idle: Mutex::new(Vec::new()),
        },
    };
    let mut service = http_proxy_service(&server.configuration, app);
    service.add_tcp(&spec.addr.to_string());
    server.add_service(service);
    eprintln!(
        "floor-proxy (Pingora) listening on {} (prefill {}, decode {})",
        spec.addr, spec.prefill, spec.decode
    );
    server.run_forever()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_keep_status_and_type_and_join_chunks() {
        let r = b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
        let (status, ct, body) = answer(r).unwrap();
        assert_eq!(
            (status, ct.as_deref(), &body[..]),
            (201, Some(&b"application/json"[..]), &b"{}"[..])
        );
        let c = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n3;x=1\r\n!!!\r\n0\r\n\r\n";
        assert_eq!(&answer(c).unwrap().2[..], b"ok!!!");
        assert!(answer(&c[..20]).is_none());
        assert!(dechunk(b"zz\r\n").is_none());
    }
}
