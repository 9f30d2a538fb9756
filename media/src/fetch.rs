//! The fetcher: for each hop, judge the URL ([`check_target`]), resolve its host once, judge
//! every address ([`check_addrs`]), connect to a judged address itself (no second resolution,
//! so no DNS rebinding between check and connect), speak HTTP/1.1 over hyper (TLS by rustls
//! with the machine's roots, the URL's host name for SNI and certificate checks), and follow at
//! most `max_redirects` redirects, each judged again. The whole of it runs under one timeout.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};
use http::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HOST, LOCATION, USER_AGENT};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use log::debug;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::address::check_addrs;
use crate::data_url::decode_data_url;
use crate::host::Host;
use crate::target::{check_target, Scheme, Target};
use crate::{FetchPolicy, Media, MediaError};

/// A boxed, sendable future (the shape `futures::future::BoxFuture` has, without the crate).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Turns a host name into the addresses to connect to. Every address returned is judged, and
/// the connection goes to one of them as returned (its port included).
pub trait Resolve: Send + Sync {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'_, io::Result<Vec<SocketAddr>>>;
}

/// The system resolver, through `tokio::net::lookup_host`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str, port: u16) -> BoxFuture<'_, io::Result<Vec<SocketAddr>>> {
        let host = host.to_owned();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), port))
                .await?
                .collect())
        })
    }
}

/// Fetches media under one [`FetchPolicy`]. Cheap to clone and share across tasks.
#[derive(Clone)]
pub struct Fetcher {
    inner: Arc<FetcherInner>,
}

impl std::fmt::Debug for Fetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetcher")
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

struct FetcherInner {
    policy: FetchPolicy,
    resolver: Arc<dyn Resolve>,
    /// Built on the first https fetch: loading the machine's roots costs milliseconds that a
    /// gateway with no https media never needs to pay.
    tls: OnceLock<Result<Arc<rustls::ClientConfig>, String>>,
}

impl Fetcher {
    pub fn new(policy: FetchPolicy) -> Self {
        Fetcher::with_resolver(policy, Arc::new(SystemResolver))
    }

    pub fn with_resolver(policy: FetchPolicy, resolver: Arc<dyn Resolve>) -> Self {
        Fetcher {
            inner: Arc::new(FetcherInner {
                policy,
                resolver,
                tls: OnceLock::new(),
            }),
        }
    }

    pub fn policy(&self) -> &FetchPolicy {
        &self.inner.policy
    }

    /// The media at `url`: an http(s) URL fetched under the policy, or a `data:` URL decoded
    /// (bounded by `max_bytes`, no I/O).
    pub async fn fetch(&self, url: &str) -> Result<Media, MediaError> {
        let policy = &self.inner.policy;
        let trimmed = url.trim_start();
        if trimmed
            .get(..5)
            .is_some_and(|s| s.eq_ignore_ascii_case("data:"))
        {
            return decode_data_url(trimmed, policy.max_bytes);
        }
        tokio::time::timeout(policy.timeout, self.fetch_over_network(url))
            .await
            .unwrap_or(Err(MediaError::Timeout))
    }

    async fn fetch_over_network(&self, url: &str) -> Result<Media, MediaError> {
        let policy = &self.inner.policy;
        let mut target = check_target(url, policy)?;
        let mut redirects = 0u8;
        loop {
            let addrs = self.resolve_checked(&target).await?;
            let (response, connection) = self.send_get(&target, &addrs).await?;
            if let Some(location) = redirect_location(&response, &target)? {
                if redirects >= policy.max_redirects {
                    return Err(MediaError::Fetch(format!(
                        "{target} redirected more than {} times",
                        policy.max_redirects
                    )));
                }
                redirects += 1;
                let next = target.join(&location);
                let from = target.to_string();
                target = check_target(&next, policy)
                    .map_err(|e| in_context(e, &format!("redirect from {from}")))?;
                debug!("media fetch: {from} redirected to {target}");
                continue;
            }
            let media = read_media(response, &target, policy.max_bytes).await;
            drop(connection);
            return media;
        }
    }

    /// The host's addresses, resolved once and every one of them judged.
    async fn resolve_checked(&self, target: &Target) -> Result<Vec<SocketAddr>, MediaError> {
        let addrs = match &target.host {
            Host::Ip(ip) => vec![SocketAddr::new(*ip, target.port)],
            Host::Domain(name) => self
                .inner
                .resolver
                .resolve(name, target.port)
                .await
                .map_err(|e| MediaError::Fetch(format!("could not resolve {name}: {e}")))?,
        };
        check_addrs(&addrs, &self.inner.policy)
            .map_err(|e| in_context(e, &format!("host {}", target.host)))?;
        Ok(addrs)
    }

    /// Connects to the first reachable judged address and sends one GET.
    async fn send_get(
        &self,
        target: &Target,
        addrs: &[SocketAddr],
    ) -> Result<(Response<Incoming>, ConnectionTask), MediaError> {
        let mut last_error = None;
        let mut tcp = None;
        for &addr in addrs {
            debug!("media fetch: {target} connecting to {addr}");
            match dial(addr).await {
                Ok(stream) => {
                    tcp = Some(stream);
                    break;
                }
                Err(e) => last_error = Some(e),
            }
        }
        let Some(tcp) = tcp else {
            let why = last_error.map_or_else(|| "no address".to_owned(), |e| e.to_string());
            return Err(MediaError::Fetch(format!(
                "could not connect to {target}: {why}"
            )));
        };
        let _ = tcp.set_nodelay(true);
        match target.scheme {
            Scheme::Http => exchange(TokioIo::new(tcp), target).await,
            Scheme::Https => {
                let config = self.tls_config()?;
                let server_name = match &target.host {
                    Host::Domain(name) => ServerName::try_from(name.clone()).map_err(|_| {
                        MediaError::BadUrl(format!("host {name} is not a valid TLS server name"))
                    })?,
                    Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
                };
                let tls = tokio_rustls::TlsConnector::from(config)
                    .connect(server_name, tcp)
                    .await
                    .map_err(|e| MediaError::Fetch(format!("TLS with {target} failed: {e}")))?;
                exchange(TokioIo::new(tls), target).await
            }
        }
    }

    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, MediaError> {
        self.inner
            .tls
            .get_or_init(build_tls_config)
            .clone()
            .map_err(MediaError::Fetch)
    }
}

/// Opens the TCP connection to an address that has been judged.
async fn dial(addr: SocketAddr) -> io::Result<TcpStream> {
    // Test builds never leave this machine, whatever the policy under test gets wrong: a
    // regression shows up as a failed test, not as traffic to a real address.
    if cfg!(test) && !addr.ip().to_canonical().is_loopback() {
        return Err(io::Error::other("test builds dial loopback only"));
    }
    TcpStream::connect(addr).await
}

/// The hyper connection's driver, aborted when dropped so that a fetch cut by its timeout (or
/// finished) leaves no task holding the socket.
struct ConnectionTask(JoinHandle<()>);

impl Drop for ConnectionTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One HTTP/1.1 GET on an established connection.
async fn exchange<T>(
    io: T,
    target: &Target,
) -> Result<(Response<Incoming>, ConnectionTask), MediaError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| MediaError::Fetch(format!("HTTP with {target} failed: {e}")))?;
    let host = target.to_string();
    let task = ConnectionTask(tokio::spawn(async move {
        if let Err(e) = connection.await {
            debug!("media fetch: connection to {host} ended: {e}");
        }
    }));
    let request = Request::get(&target.path_and_query)
        .header(HOST, target.authority())
        .header(USER_AGENT, "pdgate")
        .header(ACCEPT, "image/*")
        .body(Empty::<Bytes>::new())
        .map_err(|e| MediaError::BadUrl(format!("host {}: {e}", target.host)))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| MediaError::Fetch(format!("{target} gave no HTTP response: {e}")))?;
    Ok((response, task))
}

/// The `Location` of a redirect response; `None` for any other response.
fn redirect_location(
    response: &Response<Incoming>,
    target: &Target,
) -> Result<Option<String>, MediaError> {
    if !matches!(
        response.status(),
        StatusCode::MOVED_PERMANENTLY
            | StatusCode::FOUND
            | StatusCode::SEE_OTHER
            | StatusCode::TEMPORARY_REDIRECT
            | StatusCode::PERMANENT_REDIRECT
    ) {
        return Ok(None);
    }
    let location = response
        .headers()
        .get(LOCATION)
        .ok_or_else(|| {
            MediaError::Fetch(format!(
                "{target} answered HTTP {} without a Location",
                response.status()
            ))
        })?
        .to_str()
        .map_err(|_| MediaError::Fetch(format!("{target} sent an unreadable Location")))?;
    Ok(Some(location.to_owned()))
}

/// The body of a final response, refused when not 2xx or larger than `max_bytes` (by its
/// Content-Length before reading, or as it streams).
async fn read_media(
    response: Response<Incoming>,
    target: &Target,
    max_bytes: usize,
) -> Result<Media, MediaError> {
    let status = response.status();
    if !status.is_success() {
        return Err(MediaError::Fetch(format!(
            "{target} answered HTTP {status}"
        )));
    }
    let announced = response
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|len| len > max_bytes as u64) {
        return Err(MediaError::TooLarge { limit: max_bytes });
    }
    let content_type = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty());
    // Reserve what was announced (already bounded by max_bytes), at most 1 MiB up front.
    let reserve = announced.map_or(0, |len| len.min(1 << 20) as usize);
    let mut bytes = BytesMut::with_capacity(reserve);
    let mut body = response.into_body();
    while let Some(frame) = body.frame().await {
        let frame =
            frame.map_err(|e| MediaError::Fetch(format!("reading the body from {target}: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > max_bytes {
                return Err(MediaError::TooLarge { limit: max_bytes });
            }
            bytes.extend_from_slice(&data);
        }
    }
    debug!(
        "media fetch: {target} gave {} bytes ({})",
        bytes.len(),
        content_type.as_deref().unwrap_or("no content type")
    );
    Ok(Media {
        bytes: bytes.freeze(),
        content_type,
    })
}

/// rustls with ring (the provider kube already builds) and the machine's root certificates.
fn build_tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    let found = rustls_native_certs::load_native_certs();
    for error in &found.errors {
        debug!("media fetch: skipping a root certificate source: {error}");
    }
    let mut roots = rustls::RootCertStore::empty();
    let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err("no trusted root certificates on this machine for https media".into());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Prefixes an error's message with where it happened (a redirect, a resolved host), keeping
/// its kind.
fn in_context(error: MediaError, context: &str) -> MediaError {
    match error {
        MediaError::Refused(m) => MediaError::Refused(format!("{context}: {m}")),
        MediaError::Fetch(m) => MediaError::Fetch(format!("{context}: {m}")),
        MediaError::BadUrl(m) => MediaError::BadUrl(format!("{context}: {m}")),
        other => other,
    }
}

#[cfg(test)]
mod tests;
