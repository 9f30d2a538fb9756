//! `request_filter`: the front door. Resolves the route, authenticates, answers local endpoints,
//! and for PD routes reads and parses the body once and hands it to the legs. Returns
//! `Ok(true)` when the response was written here (everything but single-leg proxying).

use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use pdgate_filters::ascii::all_visible;
use pdgate_filters::errors::ErrorCode;
use pdgate_filters::{classify, scan_object, Route};
use pingora::proxy::Session;
use pingora::{Error, ErrorType};

use super::body::read_body;
use super::cors;
use super::ctx::RequestCtx;
use super::routes::{self, Endpoint, RouteRefusal};
use super::Listener;
use crate::admin;
use crate::gateway::Gateway;
use crate::in_box::in_box;
use crate::legs::dispatch::{self, Served};
use crate::legs::request::{ForwardHeaders, PdRequest, RoutingKeys};
use crate::limiter::Refusal;
use crate::reply::{self, Reply};
use crate::workers::select::is_available;

pub async fn run(
    gw: &Arc<Gateway>,
    listener: Listener,
    session: &mut Session,
    ctx: &mut RequestCtx,
) -> pingora::Result<bool> {
    crate::tick::ensure();
    let answered = serve(gw, listener, session, ctx).await?;
    // Boxed, and only when there is something to drain (a refusal): inline, the wait would size
    // this future, which lives as long as the request (a whole stream).
    if answered && !session.as_downstream_mut().is_body_done() {
        Box::pin(linger(session)).await;
    }
    Ok(answered)
}

/// After answering without reading the request body (a refusal: 413, 404, 401, …), reads and
/// discards what the client is still sending, for a bounded time, before the connection
/// closes. Closing a socket with unread data makes the kernel reset it, and the client may lose
/// the answer it was sent ("lingering close").
async fn linger(session: &mut Session) {
    let _ = tokio::time::timeout(LINGER, session.as_downstream_mut().drain_request_body()).await;
}

/// How long a refused request's unread body is drained before the connection closes.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

async fn serve(
    gw: &Arc<Gateway>,
    listener: Listener,
    session: &mut Session,
    ctx: &mut RequestCtx,
) -> pingora::Result<bool> {
    let method = session.req_header().method.clone();
    let path = session.req_header().uri.path().to_string();
    let endpoint = routes::resolve(&method, &path).and_then(|e| {
        // With a separate admin listener, the worker API lives there and PD routes stay here.
        let served = match (listener, &e) {
            (
                Listener::Admin,
                Endpoint::Pd(_)
                | Endpoint::CountTokens
                | Endpoint::NotInPd
                | Endpoint::HealthGenerate
                | Endpoint::Models
                | Endpoint::Model(_)
                | Endpoint::ServerInfo
                | Endpoint::ModelInfo
                | Endpoint::Loads,
            ) => false,
            (
                Listener::Data,
                Endpoint::Workers
                | Endpoint::Worker(_)
                | Endpoint::FlushCache
                | Endpoint::Reload
                | Endpoint::DebugHandoffs
                | Endpoint::DebugCapacity,
            ) => !gw.settings_now().separate_admin,
            (Listener::Probes, e) => {
                matches!(
                    e,
                    Endpoint::Liveness | Endpoint::Readiness | Endpoint::Health
                )
            }
            _ => true,
        };
        if served {
            Ok(e)
        } else {
            Err(RouteRefusal::NotFound)
        }
    });
    (ctx.request_id, ctx.engine_request_id_from) = request_id(gw, session, endpoint.as_ref().ok());
    if listener == Listener::Data {
        if let Some(policy) = &gw.settings_now().cors {
            let origin = session.req_header().headers.get(http::header::ORIGIN);
            ctx.cors = Some(policy.for_request(origin));
        }
    }

    // Request smuggling: a body framed two ways is refused, whatever the route.
    if has_conflicting_framing(session) {
        session.set_keepalive(None);
        reply::send(
            session,
            ctx,
            Reply::error(
                ErrorCode::InvalidRequest,
                "the request has both Content-Length and Transfer-Encoding (ambiguous framing)",
            ),
        )
        .await?;
        return Ok(true);
    }

    // With CORS on, any OPTIONS is a preflight, answered here (as SMG).
    if let (Some(cors), &http::Method::OPTIONS) = (&ctx.cors, &method) {
        refuse_unread(session);
        let allow = match &endpoint {
            Err(RouteRefusal::MethodNotAllowed(allow)) => Some(*allow),
            _ => None,
        };
        let mut reply = Reply::body(200, "", bytes::Bytes::new());
        for (name, value) in cors::preflight_headers(cors, allow) {
            reply = reply.with_header(name, value);
        }
        reply::send(session, ctx, reply).await?;
        return Ok(true);
    }

    let endpoint = match endpoint {
        Ok(e) => e,
        Err(refusal) => {
            refuse_unread(session);
            let reply = match refusal {
                RouteRefusal::NotFound => Reply::error(
                    ErrorCode::UnknownUrl,
                    format!("Invalid URL ({method} {path})"),
                ),
                RouteRefusal::MethodNotAllowed(allow) => Reply::error(
                    ErrorCode::MethodNotAllowed,
                    format!("{method} is not allowed on {path} (allowed: {allow})"),
                )
                .with_header("allow", allow),
            };
            reply::send(session, ctx, reply).await?;
            return Ok(true);
        }
    };
    ctx.endpoint = Some(endpoint.clone());

    if endpoint.needs_api_key() && !admin::auth::has_api_key(&gw.settings_now(), session) {
        refuse_unread(session);
        reply::send(
            session,
            ctx,
            Reply::error(ErrorCode::Unauthorized, admin::auth::key_refusal(session))
                .with_header("www-authenticate", "Bearer"),
        )
        .await?;
        return Ok(true);
    }

    match endpoint {
        Endpoint::Health | Endpoint::Liveness => {
            reply::send(session, ctx, Reply::text(200, "OK")).await?;
            Ok(true)
        }
        Endpoint::HealthGenerate => {
            let reply = Box::pin(admin::health_generate(gw)).await;
            reply::send(session, ctx, reply).await?;
            Ok(true)
        }
        Endpoint::Readiness => {
            reply::send(session, ctx, admin::readiness(gw)).await?;
            Ok(true)
        }
        Endpoint::Models => {
            reply::send(session, ctx, admin::engines::models(gw)).await?;
            Ok(true)
        }
        Endpoint::Model(id) => {
            let reply = admin::engines::model(gw, &id);
            reply::send(session, ctx, reply).await?;
            Ok(true)
        }
        Endpoint::ServerInfo | Endpoint::ModelInfo => {
            // `/get_model_info` carries the client's headers, as SMG's; the ones the legs
            // forward (its key, request id, trace context), not its cookies.
            let (path, forwarded) = if endpoint == Endpoint::ModelInfo {
                let h = ForwardHeaders::from_client(session.req_header(), ctx.engine_request_id());
                ("/get_model_info", h)
            } else {
                ("/get_server_info", ForwardHeaders::default())
            };
            let reply = Box::pin(admin::engines::proxy_info(gw, path, forwarded.as_slice())).await;
            reply::send(session, ctx, reply).await?;
            Ok(true)
        }
        Endpoint::Loads => {
            let reply = Box::pin(admin::engines::loads(gw)).await;
            reply::send(session, ctx, reply).await?;
            Ok(true)
        }
        Endpoint::FlushCache => {
            refuse_unread(session);
            let reply = if !admin::auth::may_mutate(&gw.settings_now(), session) {
                Reply::error(
                    ErrorCode::Forbidden,
                    admin::auth::only_trusted("flush_cache is accepted"),
                )
            } else {
                Box::pin(admin::engines::flush_cache(gw)).await
            };
            reply::send(session, ctx, reply).await?;
            Ok(true)
        }
        Endpoint::NotInPd => {
            refuse_unread(session);
            reply::send(
                session,
                ctx,
                Reply::error(
                    ErrorCode::NotImplemented,
                    format!("{path} is not supported in PD disaggregation mode"),
                ),
            )
            .await?;
            Ok(true)
        }
        Endpoint::Workers | Endpoint::Worker(_) => {
            let reply = Box::pin(admin::workers::handle(gw, session, &endpoint)).await;
            reply::send(session, ctx, reply).await?;
            Ok(true)
        }
        Endpoint::DebugHandoffs | Endpoint::DebugCapacity => {
            let reply = if !admin::auth::may_mutate(&gw.settings_now(), session) {
                Reply::error(
                    ErrorCode::Forbidden,
                    admin::auth::only_trusted("debug endpoints are served"),
                )
            } else if endpoint == Endpoint::DebugCapacity {
                Reply::json(200, gw.capacity.to_json().to_string())
            } else {
                let mut body = gw.ledger.to_json();
                body["links"] = links_json(gw);
                Reply::json(200, body.to_string())
            };
            reply::send(session, ctx, reply).await?;
            Ok(true)
        }
        Endpoint::Reload => {
            let reply = Box::pin(admin::reload(gw, session)).await;
            reply::send(session, ctx, reply).await?;
            Ok(true)
        }
        Endpoint::CountTokens => Box::pin(count_tokens(gw, session, ctx)).await,
        // Boxed arms: this future lives as long as the request (a whole stream), and inline
        // it would be as large as its largest arm (see `legs::dispatch`).
        Endpoint::Pd(route) => in_box(|| serve_pd(gw, session, ctx, route)).await,
    }
}

/// Both `Content-Length` and `Transfer-Encoding` on one request (RFC 9112 §6.1: a server may
/// reject it, and must not keep the connection). Pingora drops the `Content-Length` before we
/// see the parsed head, so the raw header bytes are checked — only when a TE is present.
fn has_conflicting_framing(session: &Session) -> bool {
    if !session
        .req_header()
        .headers
        .contains_key(http::header::TRANSFER_ENCODING)
    {
        return false;
    }
    let Some(h1) = session.as_downstream().as_http1() else {
        return false;
    };
    const NAME: &[u8] = b"content-length:";
    h1.get_headers_raw_bytes()
        .split(|b| *b == b'\n')
        .any(|line| line.len() >= NAME.len() && line[..NAME.len()].eq_ignore_ascii_case(NAME))
}

/// A refusal sent without reading the request body: the unread bytes make the connection
/// unusable for another request.
fn refuse_unread(session: &mut Session) {
    let h = &session.req_header().headers;
    let has_body = h.contains_key(http::header::TRANSFER_ENCODING)
        || h.get(http::header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    if has_body {
        session.set_keepalive(None);
    }
}

async fn serve_pd(
    gw: &Arc<Gateway>,
    session: &mut Session,
    ctx: &mut RequestCtx,
    route: Route,
) -> pingora::Result<bool> {
    crate::trace::start_request(session.req_header(), ctx);
    // Boxed: what comes before the legs ends before them, and inline its state would stay in
    // this future for the life of the stream.
    let Some(req) = in_box(|| take_in(gw, session, ctx, route)).await? else {
        return Ok(true);
    };
    match dispatch::serve(gw, session, ctx, &req).await {
        Served::Answered => Ok(true),
        Served::Abort(why) => Err(Error::explain(ErrorType::ConnectionClosed, why)),
    }
}

/// Reads the body, takes the request's place under the admission limits and parses it. `None`:
/// the request was refused and answered.
async fn take_in(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    route: Route,
) -> pingora::Result<Option<PdRequest>> {
    let (max, timeout) = {
        let s = gw.settings_now();
        (s.max_payload_size, s.body_read_timeout)
    };
    let refusal = match read_body(session, max, timeout).await {
        Ok(body) => {
            // Admitted after the body is in: a queued request is watched for its client
            // leaving, and a refused one leaves the connection reusable.
            if admit(gw, session, ctx, true).await?.is_some() {
                return Ok(None);
            }
            match pd_request(gw, session, ctx, route, body) {
                Ok(req) => return Ok(Some(req)),
                Err(refusal) => refusal,
            }
        }
        Err(refusal) => refusal.reply,
    };
    reply::send(session, ctx, refusal).await?;
    Ok(None)
}

/// The parsed PD request (the body scanned once, its facts, routing keys and forwarded headers),
/// or the 400 that refuses it.
fn pd_request(
    gw: &Gateway,
    session: &Session,
    ctx: &mut RequestCtx,
    route: Route,
    body: bytes::Bytes,
) -> Result<PdRequest, Reply> {
    let top =
        scan_object(&body).map_err(|e| Reply::error(ErrorCode::JsonParseError, e.to_string()))?;
    let facts = classify(route, &body, &top)
        .map_err(|e| Reply::error(ErrorCode::InvalidRequest, e.to_string()))?;
    ctx.streaming = facts.stream;
    ctx.model_label = Some(gw.model_labels.label(facts.model.as_deref(), |m| {
        gw.registry.snapshot().all.iter().any(|w| w.serves(Some(m)))
    }));
    let (mut routing, canary) = routing_keys(session);
    routing.pinned = crate::workers::canary::pinned_link(canary, &gw.canary_secret);
    if gw.policies.load().needs_text() {
        let t = pdgate_filters::routing_text::routing_text(route, &body, &top);
        routing.text = t.text;
        routing.token_ids = t.token_ids;
    }
    let forward = ForwardHeaders::from_client(session.req_header(), ctx.engine_request_id());
    Ok(PdRequest {
        route,
        body,
        top,
        facts,
        forward,
        routing,
    })
}

/// `/v1/messages/count_tokens`: one available prefill worker, proxied by Pingora itself
/// (`upstream_peer`), so the body streams through without being buffered here.
async fn count_tokens(
    gw: &Arc<Gateway>,
    session: &mut Session,
    ctx: &mut RequestCtx,
) -> pingora::Result<bool> {
    let declared = session
        .req_header()
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|l| l > gw.settings_now().max_payload_size) {
        refuse_unread(session);
        reply::send(
            session,
            ctx,
            Reply::error(
                ErrorCode::PayloadTooLarge,
                "request body exceeds max_payload_size",
            ),
        )
        .await?;
        return Ok(true);
    }
    if let Some(answered) = admit(gw, session, ctx, false).await? {
        return Ok(answered);
    }
    let snap = gw.registry.snapshot();
    let available: Vec<_> = snap.prefills.iter().filter(|w| is_available(w)).collect();
    // A gRPC fleet has no HTTP endpoint to ask: the gateway's tokenizer answers, no leg.
    if let Some(w) = available.iter().find(|w| w.is_grpc()) {
        let source = std::sync::Arc::clone(w);
        drop(snap);
        let reply = Box::pin(crate::legs::grpc::count_tokens(gw, session, source)).await;
        reply::send(session, ctx, reply).await?;
        return Ok(true);
    }
    let chosen = if available.is_empty() {
        None
    } else {
        let idx = rand::random::<usize>() % available.len();
        Some(available[idx].clone())
    };
    match chosen {
        Some(w) => {
            // The body streams through Pingora's proxy loop: bound each read by the body
            // deadline (the whole-body deadline is checked per chunk in request_body_filter).
            session.set_read_timeout(Some(gw.settings_now().body_read_timeout));
            let guard = w.track(header_str(session, &ROUTING_KEY).is_some());
            ctx.single_leg = Some((w.clone(), guard));
            Ok(false)
        }
        None => {
            refuse_unread(session);
            reply::send(
                session,
                ctx,
                Reply::error(
                    ErrorCode::NoAvailableWorkers,
                    "No available prefill workers (all circuits open or unhealthy)",
                ),
            )
            .await?;
            Ok(true)
        }
    }
}

/// Every prefill → decode link not closed (link health), for `/debug/handoffs`.
fn links_json(gw: &Gateway) -> serde_json::Value {
    let snap = gw.registry.snapshot();
    let links: Vec<serde_json::Value> = snap
        .prefills
        .iter()
        .flat_map(|p| {
            p.links.unhealthy().into_iter().map(|mut l| {
                l["prefill"] = serde_json::json!(p.url());
                l
            })
        })
        .collect();
    serde_json::Value::Array(links)
}

/// Takes the request's place under the admission limits (`crate::limiter`). `None`: admitted
/// (or no limits), go on; `Some(true)`: refused and answered. A client that leaves while
/// queued ends the request without an answer. `body_read`: the body is in, so the connection
/// can be watched for the client leaving; otherwise the unread body hides that until the
/// queue deadline.
async fn admit(
    gw: &Gateway,
    session: &mut Session,
    ctx: &mut RequestCtx,
    body_read: bool,
) -> pingora::Result<Option<bool>> {
    let Some(limiter) = gw.limiter.load_full() else {
        return Ok(None);
    };
    let watched = &mut *session;
    let client_gone = move || async move {
        if body_read {
            let _ = watched.read_body_or_idle(true).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let refusal = match limiter.admit(client_gone).await {
        Ok(admitted) => {
            ctx.admission = Some(admitted);
            return Ok(None);
        }
        Err(refusal) => refusal,
    };
    let code = match refusal {
        Refusal::ClientGone => {
            ctx.client_gone = true;
            return Err(Error::explain(
                ErrorType::ConnectionClosed,
                "the client left while queued for admission",
            ));
        }
        Refusal::QueueFull { .. } => ErrorCode::AdmissionQueueFull,
        Refusal::Timeout => ErrorCode::AdmissionQueueTimeout,
    };
    if !body_read {
        refuse_unread(session);
    }
    let reply = Reply::error(code, refusal.message())
        .with_retry_after(crate::config::defaults::ADMISSION_RETRY_AFTER_SECS);
    reply::send(session, ctx, reply).await?;
    Ok(Some(true))
}

/// The routing headers, parsed once (a lookup by `&str` parses and lowercases the name first).
static ROUTING_KEY: HeaderName =
    HeaderName::from_static(crate::config::defaults::ROUTING_KEY_HEADER);
static TARGET_WORKER: HeaderName = HeaderName::from_static("x-smg-target-worker");
static FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

fn header_str<'a>(session: &'a Session, name: &HeaderName) -> Option<&'a str> {
    session
        .req_header()
        .headers
        .get(name)
        .and_then(non_empty_str)
}

/// A header value as `header_str` takes it: text, not empty.
fn non_empty_str(v: &HeaderValue) -> Option<&str> {
    v.to_str().ok().filter(|v| !v.is_empty())
}

/// Calls `f` with each header name's first value in the client's head (what `get` gives), in
/// one walk over it: `get` hashes the name for each lookup, and a PD request made ten, most of
/// them misses. The values of one name come one after another in a `HeaderMap`'s iteration,
/// the first first.
fn each_first_value<'a>(session: &'a Session, mut f: impl FnMut(&HeaderName, &'a HeaderValue)) {
    let mut last: Option<&HeaderName> = None;
    for (name, value) in session.req_header().headers.iter() {
        if last != Some(name) {
            last = Some(name);
            f(name, value);
        }
    }
}

/// The first value of each of `names` in the client's head.
fn first_values<'a, const N: usize>(
    session: &'a Session,
    names: [&HeaderName; N],
) -> [Option<&'a HeaderValue>; N] {
    let mut found = [None; N];
    each_first_value(session, |name, value| {
        if let Some(i) = names.iter().position(|n| *n == name) {
            found[i] = Some(value);
        }
    });
    found
}

/// The routing keys and the canary pin's header (`None` when absent or empty).
fn routing_keys(session: &Session) -> (RoutingKeys, Option<&str>) {
    let [routing_key, target_worker, authorization, forwarded_for, cookie, canary] = first_values(
        session,
        [
            &ROUTING_KEY,
            &TARGET_WORKER,
            &http::header::AUTHORIZATION,
            &FORWARDED_FOR,
            &http::header::COOKIE,
            &crate::workers::canary::CANARY_HEADER,
        ],
    )
    .map(|v| v.and_then(non_empty_str));
    let keys = RoutingKeys {
        routing_key: routing_key.filter(|k| k.len() <= 128).map(str::to_string),
        target_worker: target_worker.map(str::to_string),
        implicit_key: authorization
            .or(forwarded_for)
            .or(cookie)
            .map(str::to_string),
        text: None,
        token_ids: None,
        pinned: None,
    };
    (keys, canary)
}

/// The request id: the first configured request-id header the client sent, else a new id with
/// the route's prefix (`chatcmpl-`, `cmpl-`, `gnt-`, `resp-`, `msg_`, `req-`) and 24
/// alphanumerics; and where the part the engines are sent starts (the prefix's length for a
/// minted id, 0 for the client's).
fn request_id(gw: &Gateway, session: &Session, endpoint: Option<&Endpoint>) -> (String, usize) {
    // The earliest configured name whose (first) value is fit wins.
    let names = &gw.settings_now().request_id_headers;
    let mut best: Option<(usize, &str)> = None;
    each_first_value(session, |name, value| {
        let Some(i) = names.iter().position(|n| n == name) else {
            return;
        };
        if best.is_some_and(|(b, _)| b < i) {
            return;
        }
        let fit = non_empty_str(value).filter(|v| v.len() <= 256 && all_visible(v.as_bytes()));
        if let Some(v) = fit {
            best = Some((i, v));
        }
    });
    if let Some((_, v)) = best {
        return (v.to_string(), 0);
    }
    let prefix = match endpoint {
        Some(Endpoint::Pd(Route::ChatCompletions)) => "chatcmpl-",
        Some(Endpoint::Pd(Route::Completions)) => "cmpl-",
        Some(Endpoint::Pd(Route::Generate)) => "gnt-",
        Some(Endpoint::Pd(Route::Responses)) => "resp-",
        Some(Endpoint::Pd(Route::Messages)) | Some(Endpoint::CountTokens) => "msg_",
        _ => "req-",
    };
    (mint_request_id(prefix), prefix.len())
}

/// A request id the gateway makes up: `prefix` and 24 random letters and digits.
fn mint_request_id(prefix: &str) -> String {
    const ALNUM: &[u8; 62] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    const CHARS: usize = 24;
    // Below 248 (4 × 62) a random byte maps to a character without bias; the 3% above are
    // drawn again. One fill of random bytes instead of a ranged draw per character (callgrind:
    // ~2,000 instructions a request went to the 24 draws).
    const UNBIASED: u8 = 248;
    let mut rng = rand::thread_rng();
    let mut bytes = [0u8; 32];
    let mut chars = [0u8; CHARS];
    let mut pushed = 0;
    while pushed < CHARS {
        rand::RngCore::fill_bytes(&mut rng, &mut bytes);
        for &b in bytes.iter().filter(|&&b| b < UNBIASED).take(CHARS - pushed) {
            chars[pushed] = ALNUM[usize::from(b % 62)];
            pushed += 1;
        }
    }
    let mut id = String::with_capacity(prefix.len() + CHARS);
    id.push_str(prefix);
    // Letters and digits: ASCII, so the bytes are the text (checked once, not a char at a time).
    id.push_str(std::str::from_utf8(&chars).unwrap_or_default());
    id
}

#[cfg(test)]
mod tests {
    use super::mint_request_id;

    #[test]
    fn a_minted_request_id_is_the_prefix_and_24_letters_or_digits() {
        let id = mint_request_id("chatcmpl-");
        let rest = id.strip_prefix("chatcmpl-").expect("the prefix");
        assert_eq!(rest.len(), 24);
        assert!(rest.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        assert_ne!(mint_request_id("chatcmpl-"), id);
    }

    #[test]
    fn minted_request_ids_use_every_letter_and_digit_about_as_often() {
        let mut seen = [0u32; 128];
        for _ in 0..20_000 {
            for b in mint_request_id("").bytes() {
                seen[usize::from(b)] += 1;
            }
        }
        // 480,000 characters over 62: 7,742 each, give or take 87 (one standard deviation).
        // A byte taken modulo 62 without the redraw would give 8 of them 5 chances in 256
        // instead of 4 (9,375 each): far outside these bounds (six deviations).
        for b in (b'0'..=b'9').chain(b'A'..=b'Z').chain(b'a'..=b'z') {
            let n = seen[usize::from(b)];
            assert!(
                (7_220..=8_265).contains(&n),
                "{} drawn {n} times",
                b as char
            );
        }
    }
}
