//! The fetcher against tiny HTTP servers on 127.0.0.1: each test scripts the server's answers
//! per path and asserts what the client got and what the server saw (connections, requests).
//! Inside the crate (not under `tests/`) so that `dial`'s loopback-only guard is compiled in.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

use super::*;

/// What the test server does with a request.
enum Reply {
    /// Writes these bytes and closes.
    Raw(Vec<u8>),
    /// Writes these bytes (a head, say) and then holds the connection open until the server
    /// is dropped.
    ThenHang(Vec<u8>),
}

fn ok(body: &[u8], content_type: &str) -> Reply {
    let mut raw = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    Reply::Raw(raw)
}

fn chunked(chunks: &[&[u8]]) -> Reply {
    let mut raw = b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for chunk in chunks {
        raw.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        raw.extend_from_slice(chunk);
        raw.extend_from_slice(b"\r\n");
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    Reply::Raw(raw)
}

fn redirect(location: &str) -> Reply {
    Reply::Raw(
        format!("HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .into_bytes(),
    )
}

/// A scripted HTTP/1.1 server on 127.0.0.1; stops (every connection with it) when dropped.
struct TestServer {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    /// Each request's head, as received.
    requests: Arc<Mutex<Vec<String>>>,
    accept_loop: JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl TestServer {
    async fn start(reply: impl Fn(&str) -> Reply + Send + Sync + 'static) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let reply = Arc::new(reply);
        let (conn_count, seen) = (connections.clone(), requests.clone());
        let accept_loop = tokio::spawn(async move {
            // Dropping the set (when the loop is aborted) aborts every connection's task.
            let mut served = JoinSet::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                conn_count.fetch_add(1, Ordering::SeqCst);
                let (reply, seen) = (reply.clone(), seen.clone());
                served.spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let head = String::from_utf8_lossy(&head).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or("").to_owned();
                    seen.lock().unwrap().push(head);
                    match reply(&path) {
                        Reply::Raw(bytes) => {
                            let _ = stream.write_all(&bytes).await;
                            let _ = stream.shutdown().await;
                        }
                        Reply::ThenHang(bytes) => {
                            let _ = stream.write_all(&bytes).await;
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        TestServer {
            addr,
            connections,
            requests,
            accept_loop,
        }
    }

    fn port(&self) -> u16 {
        self.addr.port()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn connection_count(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    fn request_heads(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

/// Injected DNS: fixed answers per name, and a record of every lookup.
#[derive(Default)]
struct TestResolver {
    answers: HashMap<String, Vec<SocketAddr>>,
    lookups: Mutex<Vec<String>>,
}

impl TestResolver {
    fn with(mut self, name: &str, addrs: &[SocketAddr]) -> Self {
        self.answers.insert(name.to_owned(), addrs.to_vec());
        self
    }

    fn lookups(&self) -> Vec<String> {
        self.lookups.lock().unwrap().clone()
    }
}

impl Resolve for TestResolver {
    fn resolve(&self, host: &str, _port: u16) -> BoxFuture<'_, io::Result<Vec<SocketAddr>>> {
        self.lookups.lock().unwrap().push(host.to_owned());
        let answer = self
            .answers
            .get(host)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such test host"));
        Box::pin(async move { answer })
    }
}

fn open_policy() -> FetchPolicy {
    FetchPolicy {
        allow_private: true,
        ..FetchPolicy::default()
    }
}

#[tokio::test]
async fn forbidden_hosts_are_refused_without_a_connection() {
    let server = TestServer::start(|_| ok(b"should never be served", "image/png")).await;
    let p = server.port();
    let public: SocketAddr = format!("93.184.215.14:{p}").parse().unwrap();
    let private: SocketAddr = format!("10.0.0.7:{p}").parse().unwrap();
    let resolver = Arc::new(
        TestResolver::default()
            .with("loop.test", &[server.addr])
            .with("mixed.test", &[public, private])
            .with("localhost", &[server.addr]),
    );
    let fetcher = Fetcher::with_resolver(FetchPolicy::default(), resolver.clone());
    for url in [
        format!("http://127.0.0.1:{p}/"),
        format!("http://localhost:{p}/"),
        format!("http://LocalHost.:{p}/"),
        format!("http://foo.localhost:{p}/"),
        format!("http://localhost.localdomain:{p}/"),
        format!("http://2130706433:{p}/"),
        format!("http://0x7f.1:{p}/"),
        format!("http://0177.0.0.1:{p}/"),
        format!("http://127.1:{p}/"),
        format!("http://[::1]:{p}/"),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        format!("http://[::ffff:7f00:1]:{p}/"),
        "http://169.254.169.254/latest/meta-data".to_owned(),
        "http://10.0.0.1/".to_owned(),
        "http://[fe80::1%25eth0]/".to_owned(),
        format!("http://0.0.0.0:{p}/"),
        format!("http://loop.test:{p}/"),
        format!("http://mixed.test:{p}/"),
        "file:///etc/passwd".to_owned(),
        format!("gopher://127.0.0.1:{p}/_GET%20/"),
    ] {
        let err = fetcher.fetch(&url).await.unwrap_err();
        assert!(matches!(err, MediaError::Refused(_)), "{url}: {err}");
    }
    assert_eq!(server.connection_count(), 0);
    // Names that mean this machine never reach DNS; the others were resolved once each.
    assert_eq!(resolver.lookups(), ["loop.test", "mixed.test"]);
}

#[tokio::test]
async fn refusals_name_the_host_and_the_rule() {
    let fetcher = Fetcher::new(FetchPolicy::default());
    let err = fetcher
        .fetch("http://169.254.169.254/latest/meta-data?token=secret")
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(message.contains("169.254.169.254"), "{message}");
    assert!(message.contains("link-local"), "{message}");
    assert!(!message.contains("secret"), "{message}");
}

#[tokio::test]
async fn content_length_body_is_fetched_with_the_gateway_headers() {
    let server = TestServer::start(|path| match path {
        "/cat.png" => ok(b"\x89PNG fake image", "image/png"),
        _ => ok(b"", "text/plain"),
    })
    .await;
    let fetcher = Fetcher::new(open_policy());
    let media = fetcher.fetch(&server.url("/cat.png")).await.unwrap();
    assert_eq!(media.bytes, &b"\x89PNG fake image"[..]);
    assert_eq!(media.content_type.as_deref(), Some("image/png"));
    let heads = server.request_heads();
    assert_eq!(heads.len(), 1);
    let head = heads[0].to_ascii_lowercase();
    assert!(head.starts_with("get /cat.png http/1.1\r\n"), "{head}");
    assert!(
        head.contains(&format!("host: {}\r\n", server.addr)),
        "{head}"
    );
    assert!(head.contains("user-agent: pdgate\r\n"), "{head}");
    assert!(head.contains("accept: image/*\r\n"), "{head}");
}

#[tokio::test]
async fn chunked_body_is_fetched_whole() {
    let server = TestServer::start(|_| chunked(&[b"first ", b"second ", b"third"])).await;
    let media = Fetcher::new(open_policy())
        .fetch(&server.url("/img"))
        .await
        .unwrap();
    assert_eq!(media.bytes, &b"first second third"[..]);
}

#[tokio::test]
async fn redirect_chain_is_followed_to_the_final_server() {
    let b = TestServer::start(|_| ok(b"from b", "image/jpeg")).await;
    let b_url = b.url("/final.jpg");
    let a = TestServer::start(move |_| redirect(&b_url)).await;
    let media = Fetcher::new(open_policy())
        .fetch(&a.url("/start"))
        .await
        .unwrap();
    assert_eq!(media.bytes, &b"from b"[..]);
    assert_eq!((a.request_heads().len(), b.request_heads().len()), (1, 1));
    assert!(b.request_heads()[0].starts_with("GET /final.jpg "));
}

#[tokio::test]
async fn redirect_loop_fails_after_max_redirects() {
    let server = TestServer::start(|_| redirect("/again")).await;
    let policy = FetchPolicy {
        max_redirects: 3,
        ..open_policy()
    };
    let err = Fetcher::new(policy)
        .fetch(&server.url("/start"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MediaError::Fetch(m) if m.contains("redirected more than 3 times")),
        "{err}"
    );
    // The first request and three redirects followed; the fourth redirect is not.
    assert_eq!(server.request_heads().len(), 4);
}

/// Fetches `/media` from `server` with private hosts allowed and `max_bytes` set.
async fn fetch_with_limit(server: &TestServer, max_bytes: usize) -> Result<Media, MediaError> {
    let policy = FetchPolicy {
        max_bytes,
        ..open_policy()
    };
    Fetcher::new(policy).fetch(&server.url("/media")).await
}

#[tokio::test]
async fn announced_content_length_over_the_limit_is_refused_before_the_body() {
    // The server announces 1000 bytes and never sends them: only a refusal on the header alone
    // can end this fetch before the timeout.
    let server = TestServer::start(|_| {
        Reply::ThenHang(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".to_vec())
    })
    .await;
    let err = fetch_with_limit(&server, 100).await.unwrap_err();
    assert_eq!(err, MediaError::TooLarge { limit: 100 });
}

#[tokio::test]
async fn streamed_body_over_the_limit_is_cut() {
    let chunk = [7u8; 64];
    let server = TestServer::start(move |_| chunked(&[&chunk, &chunk, &chunk])).await;
    let err = fetch_with_limit(&server, 100).await.unwrap_err();
    assert_eq!(err, MediaError::TooLarge { limit: 100 });
}

#[tokio::test]
async fn body_exactly_at_the_limit_is_accepted() {
    let server = TestServer::start(|_| ok(&[1u8; 100], "image/png")).await;
    let media = fetch_with_limit(&server, 100).await.unwrap();
    assert_eq!(media.bytes.len(), 100);
}

#[tokio::test]
async fn silent_server_times_out() {
    let server = TestServer::start(|_| Reply::ThenHang(Vec::new())).await;
    let policy = FetchPolicy {
        timeout: Duration::from_millis(200),
        ..open_policy()
    };
    let err = Fetcher::new(policy)
        .fetch(&server.url("/slow"))
        .await
        .unwrap_err();
    assert_eq!(err, MediaError::Timeout);
    // The server's accept runs on this thread too: on a stalled machine it may come after the
    // client's timeout, so wait for it (with a deadline).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while server.connection_count() == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(server.connection_count(), 1);
}

#[tokio::test]
async fn error_status_is_a_fetch_error_without_the_body() {
    let server = TestServer::start(|_| {
        Reply::Raw(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 22\r\n\r\ninternal secret detail".to_vec(),
        )
    })
    .await;
    let err = Fetcher::new(open_policy())
        .fetch(&server.url("/missing.png"))
        .await
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, MediaError::Fetch(_)), "{message}");
    assert!(message.contains("404"), "{message}");
    assert!(!message.contains("secret"), "{message}");
}

#[tokio::test]
async fn allowed_domains_bind_the_first_hop_and_every_redirect() {
    let server = TestServer::start(|path| match path {
        "/to-evil" => redirect("http://evil.test/x.png"),
        "/to-self" => redirect("/ok.png"),
        _ => ok(b"media", "image/png"),
    })
    .await;
    let resolver = Arc::new(
        TestResolver::default()
            .with("media.test", &[server.addr])
            .with("evil.test", &[server.addr]),
    );
    let policy = FetchPolicy {
        allowed_domains: Some(FetchPolicy::parse_domains("media.test").unwrap()),
        ..open_policy()
    };
    let fetcher = Fetcher::with_resolver(policy, resolver.clone());

    let media = fetcher.fetch("http://Media.Test/ok.png").await.unwrap();
    assert_eq!(media.bytes, &b"media"[..]);

    let err = fetcher.fetch("http://evil.test/x.png").await.unwrap_err();
    assert!(
        matches!(&err, MediaError::Refused(m) if m.contains("evil.test")),
        "{err}"
    );

    let err = fetcher
        .fetch("http://media.test/to-evil")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MediaError::Refused(m) if m.contains("redirect") && m.contains("evil.test")),
        "{err}"
    );

    fetcher.fetch("http://media.test/to-self").await.unwrap();
    // One lookup per hop, and never one for a refused host.
    assert_eq!(
        resolver.lookups(),
        ["media.test", "media.test", "media.test", "media.test"]
    );
    let paths: Vec<String> = server
        .request_heads()
        .iter()
        .map(|h| h.split(' ').nth(1).unwrap().to_owned())
        .collect();
    assert_eq!(paths, ["/ok.png", "/to-evil", "/to-self", "/ok.png"]);
}

#[tokio::test]
async fn https_connects_to_the_resolved_address_with_the_url_host_as_sni() {
    // A listener that reads the ClientHello (whose server_name extension is plaintext) and
    // hangs up: no certificate tooling is needed to see which name the client asked for.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hello = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut bytes = vec![0u8; 4096];
        let n = stream.read(&mut bytes).await.unwrap();
        bytes.truncate(n);
        bytes
    });
    let resolver = Arc::new(TestResolver::default().with("images.media.test", &[addr]));
    let err = Fetcher::with_resolver(open_policy(), resolver)
        .fetch("https://images.media.test/cat.png")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, MediaError::Fetch(m) if m.contains("TLS")),
        "{err}"
    );
    let hello = hello.await.unwrap();
    assert_eq!(hello.first(), Some(&0x16), "a TLS handshake record");
    assert!(
        hello.windows(17).any(|w| w == b"images.media.test"),
        "the ClientHello names the URL's host"
    );
}

#[tokio::test]
async fn data_urls_are_decoded_without_io() {
    let fetcher = Fetcher::new(FetchPolicy {
        max_bytes: 4,
        ..FetchPolicy::default()
    });
    let media = fetcher.fetch("data:image/png;base64,AQID").await.unwrap();
    assert_eq!(
        (&media.bytes[..], media.content_type.as_deref()),
        (&[1u8, 2, 3][..], Some("image/png"))
    );
    assert_eq!(
        fetcher.fetch("data:,too long").await.unwrap_err(),
        MediaError::TooLarge { limit: 4 }
    );
}

#[tokio::test]
async fn unresolvable_host_is_a_fetch_error() {
    let fetcher = Fetcher::with_resolver(open_policy(), Arc::new(TestResolver::default()));
    let err = fetcher.fetch("http://nowhere.test/").await.unwrap_err();
    assert!(
        matches!(&err, MediaError::Fetch(m) if m.contains("nowhere.test")),
        "{err}"
    );
}

#[test]
fn fetcher_is_cheap_to_share_across_tasks() {
    fn assert_shareable<T: Clone + Send + Sync + 'static>() {}
    assert_shareable::<Fetcher>();
}
