//! vLLM `MoRIIOConnector` over HTTP: the worker labels and their defaults, the pair check
//! (`moriio_pair_misconfigured`), the request checks (`moriio_fanout_unsupported`,
//! `moriio_request_id_reserved`, `moriio_route_unsupported`), the prefill-leg tag and edits, the
//! concurrent-WRITE decode params, and the handoff validation (`moriio_handoff_invalid`).
//!
//! A MoRI-IO decode engine never recomputes the prompt and parses the handoff in its scheduler
//! step, where a value of the wrong shape raises instead of failing one request. So everything
//! here fails closed: a pair, request or handoff that is not provably right is refused.

use std::fmt;
use std::net::IpAddr;

use crate::body::{scan_object, Sink, TopLevel};
use crate::errors::ErrorCode;
use crate::fields;
use crate::handoff::vllm::{
    self, Connector, DO_REMOTE_DECODE, DO_REMOTE_PREFILL, REMOTE_ENGINE_ID, TRANSFER_ID,
};
use crate::json;
use crate::route::Route;
use crate::value::{self, Kind};

/// Worker label: `read` or `write` (required, equal on both legs).
pub const LABEL_MODE: &str = "moriio_mode";
/// Worker label: where the peer reaches this worker's side channel (default: the URL host).
pub const LABEL_HOST: &str = "moriio_host";
/// Worker label: the engine's `handshake_port`.
pub const LABEL_HANDSHAKE_PORT: &str = "moriio_handshake_port";
/// Worker label: the engine's `notify_port`.
pub const LABEL_NOTIFY_PORT: &str = "moriio_notify_port";
/// Worker label: `sequential` or `concurrent` WRITE dispatch (honored on the decode worker).
pub const LABEL_WRITE_DISPATCH: &str = "moriio_write_dispatch";
/// Worker label: the engine's tensor-parallel size.
pub const LABEL_TP_SIZE: &str = "tp_size";

/// vLLM MoRI-IO's default `handshake_port`.
pub const DEFAULT_HANDSHAKE_PORT: u16 = 6301;
/// vLLM MoRI-IO's default `notify_port`.
pub const DEFAULT_NOTIFY_PORT: u16 = 61005;

/// Handoff (`kv_transfer_params`) keys specific to MoRI-IO.
pub const REMOTE_BLOCK_IDS: &str = "remote_block_ids";
pub const REMOTE_HOST: &str = "remote_host";
pub const REMOTE_HANDSHAKE_PORT: &str = "remote_handshake_port";
pub const REMOTE_NOTIFY_PORT: &str = "remote_notify_port";
pub const REMOTE_DP_SIZE: &str = "remote_dp_size";
pub const REMOTE_DP_SIZE_LOCAL: &str = "remote_dp_size_local";
pub const REMOTE_DP_RANK: &str = "remote_dp_rank";
pub const TP_SIZE: &str = "tp_size";
pub const REMOTE_TP_SIZE: &str = "remote_tp_size";

/// Request-id markers the connector reads its peer from before the explicit fields.
pub const PREFILL_ADDR_MARKER: &str = "___prefill_addr_";
pub const DECODE_ADDR_MARKER: &str = "___decode_addr_";

/// How the KV moves: the decode pulls after prefill (READ) or the prefill pushes (WRITE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

/// Whether the two WRITE legs go one after the other or at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteDispatch {
    Sequential,
    Concurrent,
}

/// What the pair check needs to know about one worker.
#[derive(Clone, Copy)]
pub struct MoriWorker<'a> {
    /// The worker's registered connector.
    pub connector: Connector,
    /// The worker's data-parallel size (1 when not DP).
    pub dp_size: u32,
    /// The host of the worker's URL (no scheme or port; IPv6 may be bracketed).
    pub url_host: &'a str,
    /// Label lookup, e.g. `&|k| labels.get(k).map(String::as_str)`.
    pub label: &'a dyn Fn(&str) -> Option<&'a str>,
}

/// One worker's parsed MoRI-IO settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoriSide {
    pub mode: Mode,
    /// Side-channel host (label, or the URL host).
    pub host: String,
    pub handshake_port: u16,
    pub notify_port: u16,
    pub write_dispatch: WriteDispatch,
    pub tp_size: Option<u32>,
}

/// An accepted pair: the mode, the effective dispatch (READ is always sequential), both sides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoriPlan {
    pub mode: Mode,
    pub dispatch: WriteDispatch,
    pub prefill: MoriSide,
    pub decode: MoriSide,
}

impl MoriPlan {
    /// Whether both legs go at once (WRITE with a `concurrent` decode worker).
    pub fn is_concurrent(&self) -> bool {
        self.dispatch == WriteDispatch::Concurrent
    }

    /// The side-channel ports the decode leg was told (concurrent dispatch only); the prefill's
    /// handoff must report the same.
    pub fn told_ports(&self) -> Option<(u16, u16)> {
        self.is_concurrent()
            .then_some((self.prefill.handshake_port, self.prefill.notify_port))
    }
}

/// Parses one worker's MoRI-IO labels; `Err` is the reason for the log. `role` names the worker
/// in messages ("prefill"/"decode").
pub fn parse_side(role: &str, w: &MoriWorker<'_>) -> Result<MoriSide, String> {
    let label = w.label;
    let mode = match label(LABEL_MODE) {
        Some("read") => Mode::Read,
        Some("write") => Mode::Write,
        Some(other) => {
            return Err(format!(
                "{role} worker label `{LABEL_MODE}` must be `read` or `write`, got {other:?}"
            ))
        }
        None => return Err(format!("{role} worker has no `{LABEL_MODE}` label")),
    };
    let host = match label(LABEL_HOST) {
        Some(h) if valid_host(h) => h.to_owned(),
        Some(h) => {
            return Err(format!(
                "{role} worker label `{LABEL_HOST}` is not a host: {h:?}"
            ))
        }
        None if valid_host(w.url_host) => w.url_host.to_owned(),
        None => {
            return Err(format!(
                "{role} worker URL has no usable host for the MoRI-IO side channel"
            ))
        }
    };
    let port = |name: &str, default: u16| -> Result<u16, String> {
        match label(name) {
            None => Ok(default),
            Some(v) => parse_port_text(v).ok_or_else(|| {
                format!("{role} worker label `{name}` must be a port in 1..=65535, got {v:?}")
            }),
        }
    };
    let handshake_port = port(LABEL_HANDSHAKE_PORT, DEFAULT_HANDSHAKE_PORT)?;
    let notify_port = port(LABEL_NOTIFY_PORT, DEFAULT_NOTIFY_PORT)?;
    let write_dispatch = match label(LABEL_WRITE_DISPATCH) {
        None | Some("sequential") => WriteDispatch::Sequential,
        Some("concurrent") => WriteDispatch::Concurrent,
        Some(other) => {
            return Err(format!(
                "{role} worker label `{LABEL_WRITE_DISPATCH}` must be `sequential` or \
                 `concurrent`, got {other:?}"
            ))
        }
    };
    let tp_size = match label(LABEL_TP_SIZE) {
        None => None,
        Some(v) => Some(
            parse_digits(v)
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    format!("{role} worker label `{LABEL_TP_SIZE}` must be a positive integer, got {v:?}")
                })?,
        ),
    };
    Ok(MoriSide {
        mode,
        host,
        handshake_port,
        notify_port,
        write_dispatch,
        tp_size,
    })
}

/// The pair check, before either leg is contacted. `Err` (answered 503
/// `moriio_pair_misconfigured`) carries the reason for the gateway log.
///
/// Refused: a leg that is not a `MoRIIOConnector` worker; a worker with DP > 1; a missing,
/// unparsable or invalid label on either worker (a `moriio_write_dispatch` other than
/// `sequential`/`concurrent` included); legs in different modes; and in WRITE mode a decode side
/// channel the prefill cannot reach — a loopback or unspecified decode host while the prefill's
/// is not, or the prefill's own side channel (same host and a same port: two engines on one host
/// cannot share a port, so the labels point the prefill at itself). Under concurrent dispatch the
/// decode engine dials the prefill's labeled side channel, so a loopback or unspecified prefill
/// host while the decode's is not is refused too.
pub fn check_pair(prefill: &MoriWorker<'_>, decode: &MoriWorker<'_>) -> Result<MoriPlan, String> {
    check_worker("prefill", prefill)?;
    check_worker("decode", decode)?;
    let p = parse_side("prefill", prefill)?;
    let d = parse_side("decode", decode)?;
    if p.mode != d.mode {
        return Err(format!(
            "prefill worker is in {:?} mode but decode worker in {:?} mode",
            p.mode, d.mode
        ));
    }
    let dispatch = match p.mode {
        Mode::Read => WriteDispatch::Sequential,
        Mode::Write => d.write_dispatch,
    };
    if p.mode == Mode::Write {
        let (p_local, d_local) = (is_local_host(&p.host), is_local_host(&d.host));
        if d_local && !p_local {
            return Err(format!(
                "decode side channel host {:?} is loopback or unspecified, which prefill host \
                 {:?} cannot reach",
                d.host, p.host
            ));
        }
        if same_host(&p.host, &d.host)
            && (p.handshake_port == d.handshake_port || p.notify_port == d.notify_port)
        {
            return Err(format!(
                "decode side channel {}:{}/{} is the prefill's own side channel {}:{}/{}",
                d.host, d.handshake_port, d.notify_port, p.host, p.handshake_port, p.notify_port
            ));
        }
        if dispatch == WriteDispatch::Concurrent && p_local && !d_local {
            return Err(format!(
                "prefill side channel host {:?} is loopback or unspecified, which decode host \
                 {:?} cannot reach under concurrent dispatch",
                p.host, d.host
            ));
        }
    }
    Ok(MoriPlan {
        mode: p.mode,
        dispatch,
        prefill: p,
        decode: d,
    })
}

fn check_worker(role: &str, w: &MoriWorker<'_>) -> Result<(), String> {
    if w.connector != Connector::MoriIo {
        return Err(format!(
            "{role} worker is a {} worker, not MoRIIOConnector",
            w.connector.mode_label()
        ));
    }
    if w.dp_size > 1 {
        return Err(format!(
            "{role} worker has DP size {}; MoRI-IO PD supports DP 1 only",
            w.dp_size
        ));
    }
    Ok(())
}

/// Why a request cannot go over MoRI-IO.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestRefusal {
    /// Only chat completions and completions are supported.
    RouteUnsupported(Route),
    /// The request would make several engine requests share one handoff; names the cause.
    Fanout(&'static str),
    /// The body `request_id` carries a peer-address marker.
    RequestIdReserved,
}

impl RequestRefusal {
    /// The catalogue code the refusal is answered with.
    pub fn code(&self) -> ErrorCode {
        match self {
            RequestRefusal::RouteUnsupported(_) => ErrorCode::MoriioRouteUnsupported,
            RequestRefusal::Fanout(_) => ErrorCode::MoriioFanoutUnsupported,
            RequestRefusal::RequestIdReserved => ErrorCode::MoriioRequestIdReserved,
        }
    }
}

impl fmt::Display for RequestRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RequestRefusal::RouteUnsupported(route) => write!(
                f,
                "MoRI-IO PD supports only /v1/chat/completions and /v1/completions, not {}",
                route.upstream_path()
            ),
            RequestRefusal::Fanout(cause) => write!(
                f,
                "MoRI-IO PD hands off one request's KV; {cause} would share one handoff"
            ),
            RequestRefusal::RequestIdReserved => write!(
                f,
                "request ids containing `{PREFILL_ADDR_MARKER}` or `{DECODE_ADDR_MARKER}` are \
                 reserved by the MoRI-IO connector"
            ),
        }
    }
}

impl std::error::Error for RequestRefusal {}

/// Whether a request id (an `X-Request-Id` value or the body `request_id`) carries the
/// connector's peer-address markers. The gateway checks every forwarded header value with this.
pub fn request_id_is_reserved(id: &str) -> bool {
    id.contains(PREFILL_ADDR_MARKER) || id.contains(DECODE_ADDR_MARKER)
}

/// The request checks, before either leg is contacted: the route (501), fan-out (400: `n > 1`,
/// a `prompt` or `prompt_embeds` list of more than one item, `use_beam_search: true`) and a
/// reserved body `request_id` (400). A one-item list or a flat token list is one engine request
/// and passes.
pub fn check_request(route: Route, body: &[u8], top: &TopLevel) -> Result<(), RequestRefusal> {
    if !matches!(route, Route::ChatCompletions | Route::Completions) {
        return Err(RequestRefusal::RouteUnsupported(route));
    }
    let get = |k: &str| top.get_non_null(body, k);
    if get(fields::N)
        .and_then(value::as_u64)
        .is_some_and(|n| n > 1)
    {
        return Err(RequestRefusal::Fanout("`n` > 1"));
    }
    if let Some(shape) = get(fields::PROMPT).and_then(value::array_shape) {
        if shape.len > 1 && !shape.all(Kind::Integer) {
            return Err(RequestRefusal::Fanout("a batched `prompt`"));
        }
    }
    if let Some(shape) = get(fields::PROMPT_EMBEDS).and_then(value::array_shape) {
        if shape.len > 1 {
            return Err(RequestRefusal::Fanout("a `prompt_embeds` list"));
        }
    }
    if get(fields::USE_BEAM_SEARCH).and_then(value::as_bool) == Some(true) {
        return Err(RequestRefusal::Fanout("`use_beam_search`"));
    }
    if let Some(id) = get(fields::REQUEST_ID).and_then(value::as_str) {
        if request_id_is_reserved(&id) {
            return Err(RequestRefusal::RequestIdReserved);
        }
    }
    Ok(())
}

/// The prefill leg's `kv_transfer_params`: the NIXL-style tag plus the minted `transfer_id`,
/// `remote_dp_size: 1`, the decode's TP as `remote_tp_size` when labeled, and in WRITE mode the
/// decode's side channel (`remote_host`, `remote_handshake_port`, `remote_notify_port`).
pub fn prefill_tag(plan: &MoriPlan, transfer_id: &str) -> Vec<u8> {
    let id = json::string(transfer_id);
    let tp = plan.decode.tp_size.map(|t| json::u64_text(u64::from(t)));
    let host = json::string(&plan.decode.host);
    let hp = json::u64_text(u64::from(plan.decode.handshake_port));
    let np = json::u64_text(u64::from(plan.decode.notify_port));
    let mut fields_: Vec<(&str, &[u8])> = vec![
        (DO_REMOTE_DECODE, b"true"),
        (DO_REMOTE_PREFILL, b"false"),
        (TRANSFER_ID, &id),
        (REMOTE_DP_SIZE, b"1"),
    ];
    if let Some(tp) = &tp {
        fields_.push((REMOTE_TP_SIZE, tp));
    }
    if plan.mode == Mode::Write {
        fields_.push((REMOTE_HOST, &host));
        fields_.push((REMOTE_HANDSHAKE_PORT, &hp));
        fields_.push((REMOTE_NOTIFY_PORT, &np));
    }
    json::object(&fields_)
}

/// The MoRI-IO prefill leg: the vLLM one-token prefill leg tagged with `tag`, plus
/// `ignore_eos: true` and without `stop`/`stop_token_ids` — the connector hands off only when
/// the leg ends at its cap, so the one (discarded) token must not be a stop.
/// Written into any [`Sink`]: a `Vec` (one copy), or a [`crate::body::PartsSink`].
pub fn prefill_leg_body_into<S: Sink>(
    out: &mut S,
    route: Route,
    body: &[u8],
    top: &TopLevel,
    tag: &[u8],
) {
    vllm::prefill_leg_body_into(
        out,
        route,
        body,
        top,
        Some(tag),
        &[fields::STOP, fields::STOP_TOKEN_IDS],
        &[(fields::IGNORE_EOS, b"true")],
    )
}

/// The decode leg's `kv_transfer_params` under concurrent WRITE dispatch, minted up front from
/// the prefill worker's labels: `{"do_remote_decode":false,"do_remote_prefill":true,
/// "transfer_id","remote_dp_size":1,"remote_host","remote_handshake_port","remote_notify_port"
/// [,"remote_tp_size"]}`.
pub fn concurrent_decode_params(plan: &MoriPlan, transfer_id: &str) -> Vec<u8> {
    let id = json::string(transfer_id);
    let host = json::string(&plan.prefill.host);
    let hp = json::u64_text(u64::from(plan.prefill.handshake_port));
    let np = json::u64_text(u64::from(plan.prefill.notify_port));
    let tp = plan.prefill.tp_size.map(|t| json::u64_text(u64::from(t)));
    let mut fields_: Vec<(&str, &[u8])> = vec![
        (DO_REMOTE_DECODE, b"false"),
        (DO_REMOTE_PREFILL, b"true"),
        (TRANSFER_ID, &id),
        (REMOTE_DP_SIZE, b"1"),
        (REMOTE_HOST, &host),
        (REMOTE_HANDSHAKE_PORT, &hp),
        (REMOTE_NOTIFY_PORT, &np),
    ];
    if let Some(tp) = &tp {
        fields_.push((REMOTE_TP_SIZE, tp));
    }
    json::object(&fields_)
}

/// What a prefill handoff must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffExpectation<'a> {
    /// The `transfer_id` minted for this attempt.
    pub transfer_id: &'a str,
    /// Under concurrent dispatch: the (handshake, notify) ports the decode leg was told.
    pub told_ports: Option<(u16, u16)>,
}

/// Validates the handoff in a prefill leg response and returns its raw `kv_transfer_params`
/// (relayed verbatim to a sequential decode leg). `Err` (502 `moriio_handoff_invalid`) carries
/// the reason for the log.
pub fn validate_handoff<'b>(
    prefill_response: &'b [u8],
    expect: &HandoffExpectation<'_>,
) -> Result<&'b [u8], String> {
    let params = vllm::harvest_kv_transfer_params(prefill_response)
        .ok_or_else(|| "prefill response has no kv_transfer_params object".to_owned())?;
    validate_params(params, expect)?;
    Ok(params)
}

/// Validates a `kv_transfer_params` object, field by field, in the shapes the decode engine's
/// connector parses:
/// * `transfer_id` equals the minted id;
/// * `remote_engine_id` is a non-empty string;
/// * `remote_block_ids` is a flat list of integers, or a list of integer lists (one per KV cache
///   group);
/// * `remote_host` is a non-empty string without whitespace (not compared with the label);
/// * `remote_handshake_port` and `remote_notify_port` are non-zero ports, as a number or a
///   decimal string — and under concurrent dispatch equal to the ports the decode leg was told;
/// * `remote_dp_size`, `remote_dp_size_local`, `remote_dp_rank`, `tp_size`, `remote_tp_size`,
///   when present and not null, are non-negative integers, as a number or a decimal string.
pub fn validate_params(params: &[u8], expect: &HandoffExpectation<'_>) -> Result<(), String> {
    let top = scan_object(params).map_err(|e| format!("kv_transfer_params: {e}"))?;
    let get = |k: &str| top.get_non_null(params, k);
    let text = |raw: &[u8]| String::from_utf8_lossy(raw).into_owned();

    match get(TRANSFER_ID).map(|raw| (raw, value::as_str(raw))) {
        None => return Err(format!("{TRANSFER_ID} is missing")),
        Some((raw, None)) => return Err(format!("{TRANSFER_ID} is not a string: {}", text(raw))),
        Some((_, Some(id))) if id != expect.transfer_id => {
            return Err(format!(
                "{TRANSFER_ID} {id:?} is not the minted {:?}",
                expect.transfer_id
            ))
        }
        Some(_) => {}
    }

    match get(REMOTE_ENGINE_ID).map(|raw| (raw, value::as_str(raw))) {
        None => return Err(format!("{REMOTE_ENGINE_ID} is missing")),
        Some((_, Some(id))) if !id.is_empty() => {}
        Some((raw, _)) => {
            return Err(format!(
                "{REMOTE_ENGINE_ID} must be a non-empty string, got {}",
                text(raw)
            ))
        }
    }

    let blocks = get(REMOTE_BLOCK_IDS).ok_or_else(|| format!("{REMOTE_BLOCK_IDS} is missing"))?;
    if !is_block_id_list(blocks) {
        return Err(format!(
            "{REMOTE_BLOCK_IDS} must be a list of integers or a list of integer lists, got {}",
            text(blocks)
        ));
    }

    match get(REMOTE_HOST).map(|raw| (raw, value::as_str(raw))) {
        None => return Err(format!("{REMOTE_HOST} is missing")),
        Some((_, Some(h))) if !h.is_empty() && !h.chars().any(char::is_whitespace) => {}
        Some((raw, _)) => {
            return Err(format!(
                "{REMOTE_HOST} must be a non-empty string without whitespace, got {}",
                text(raw)
            ))
        }
    }

    let mut ports = [0u16; 2];
    for (slot, key) in ports
        .iter_mut()
        .zip([REMOTE_HANDSHAKE_PORT, REMOTE_NOTIFY_PORT])
    {
        let raw = get(key).ok_or_else(|| format!("{key} is missing"))?;
        *slot = parse_port_json(raw).ok_or_else(|| {
            format!(
                "{key} must be a port in 1..=65535 (number or string), got {}",
                text(raw)
            )
        })?;
    }

    for key in [
        REMOTE_DP_SIZE,
        REMOTE_DP_SIZE_LOCAL,
        REMOTE_DP_RANK,
        TP_SIZE,
        REMOTE_TP_SIZE,
    ] {
        if let Some(raw) = get(key) {
            if parse_count_json(raw).is_none() {
                return Err(format!(
                    "{key} must be an integer count (number or decimal string), got {}",
                    text(raw)
                ));
            }
        }
    }

    if let Some((hp, np)) = expect.told_ports {
        if ports != [hp, np] {
            return Err(format!(
                "handoff side channel ports {}/{} differ from the {hp}/{np} the decode leg was told",
                ports[0], ports[1]
            ));
        }
    }
    Ok(())
}

fn is_block_id_list(raw: &[u8]) -> bool {
    let Some(shape) = value::array_shape(raw) else {
        return false;
    };
    if shape.all(Kind::Integer) {
        return true;
    }
    shape.all(Kind::Array)
        && value::for_each_element(raw, |group| {
            value::array_shape(group).is_some_and(|s| s.all(Kind::Integer))
        })
}

/// ASCII decimal digits only (no sign, space or underscore) → `u64`.
fn parse_digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn parse_port_text(s: &str) -> Option<u16> {
    parse_digits(s)
        .and_then(|n| u16::try_from(n).ok())
        .filter(|p| *p != 0)
}

/// A port written as a JSON integer or a JSON string of digits.
fn parse_port_json(raw: &[u8]) -> Option<u16> {
    match value::kind(raw)? {
        Kind::Integer => value::as_u64(raw)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|p| *p != 0),
        Kind::String => parse_port_text(&value::as_str(raw)?),
        _ => None,
    }
}

/// A non-negative integer written as a JSON integer or a JSON string of digits.
fn parse_count_json(raw: &[u8]) -> Option<u64> {
    match value::kind(raw)? {
        Kind::Integer => value::as_u64(raw),
        Kind::String => parse_digits(&value::as_str(raw)?),
        _ => None,
    }
}

/// A usable side-channel host: non-empty, no whitespace.
fn valid_host(h: &str) -> bool {
    !h.is_empty() && !h.chars().any(char::is_whitespace)
}

fn normalize_host(h: &str) -> String {
    let h = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    let h = h.strip_suffix('.').unwrap_or(h);
    h.to_ascii_lowercase()
}

fn same_host(a: &str, b: &str) -> bool {
    let (a, b) = (normalize_host(a), normalize_host(b));
    match (a.parse::<IpAddr>(), b.parse::<IpAddr>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Loopback or unspecified: `localhost` (and `*.localhost`), 127.0.0.0/8, `::1`, `0.0.0.0`,
/// `::`, and their IPv4-mapped IPv6 forms.
fn is_local_host(h: &str) -> bool {
    let h = normalize_host(h);
    if h == "localhost" || h.ends_with(".localhost") {
        return true;
    }
    match h.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => v4.is_loopback() || v4.is_unspecified(),
        Ok(IpAddr::V6(v6)) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| v4.is_loopback() || v4.is_unspecified())
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::collections::HashMap;

    /// A worker with labels, for the pair check.
    struct W {
        connector: Connector,
        dp_size: u32,
        url_host: &'static str,
        labels: HashMap<&'static str, &'static str>,
    }

    fn w(url_host: &'static str, labels: &[(&'static str, &'static str)]) -> W {
        W {
            connector: Connector::MoriIo,
            dp_size: 1,
            url_host,
            labels: labels.iter().copied().collect(),
        }
    }

    fn check(p: &W, d: &W) -> Result<MoriPlan, String> {
        let pl = |k: &str| p.labels.get(k).copied();
        let dl = |k: &str| d.labels.get(k).copied();
        check_pair(
            &MoriWorker {
                connector: p.connector,
                dp_size: p.dp_size,
                url_host: p.url_host,
                label: &pl,
            },
            &MoriWorker {
                connector: d.connector,
                dp_size: d.dp_size,
                url_host: d.url_host,
                label: &dl,
            },
        )
    }

    fn refused(p: &W, d: &W, needle: &str) {
        let err = check(p, d).unwrap_err();
        assert!(err.contains(needle), "{err:?} lacks {needle:?}");
    }

    const WRITE: (&str, &str) = ("moriio_mode", "write");
    const READ: (&str, &str) = ("moriio_mode", "read");

    #[test]
    fn labels_default_to_url_host_and_engine_ports() {
        let plan = check(&w("10.0.0.1", &[WRITE]), &w("10.0.0.2", &[WRITE])).unwrap();
        assert_eq!(plan.mode, Mode::Write);
        assert_eq!(plan.dispatch, WriteDispatch::Sequential);
        assert_eq!(plan.decode.host, "10.0.0.2");
        assert_eq!(plan.decode.handshake_port, 6301);
        assert_eq!(plan.decode.notify_port, 61005);
        assert_eq!(plan.decode.tp_size, None);
        assert_eq!(plan.told_ports(), None);
    }

    #[test]
    fn labels_override_defaults() {
        let d = w(
            "d",
            &[
                WRITE,
                ("moriio_host", "10.9.9.9"),
                ("moriio_handshake_port", "7000"),
                ("moriio_notify_port", "7001"),
                ("moriio_write_dispatch", "concurrent"),
                ("tp_size", "8"),
            ],
        );
        let plan = check(&w("p", &[WRITE]), &d).unwrap();
        assert_eq!(plan.decode.host, "10.9.9.9");
        assert_eq!(
            (plan.decode.handshake_port, plan.decode.notify_port),
            (7000, 7001)
        );
        assert_eq!(plan.decode.tp_size, Some(8));
        assert!(plan.is_concurrent());
        assert_eq!(plan.told_ports(), Some((6301, 61005)));
    }

    #[test]
    fn read_pair_stays_sequential_even_if_labeled_concurrent() {
        let d = w("d", &[READ, ("moriio_write_dispatch", "concurrent")]);
        let plan = check(&w("p", &[READ]), &d).unwrap();
        assert_eq!(plan.dispatch, WriteDispatch::Sequential);
    }

    #[test]
    fn write_dispatch_is_honored_on_decode_only() {
        let p = w("p", &[WRITE, ("moriio_write_dispatch", "concurrent")]);
        let plan = check(&p, &w("d", &[WRITE])).unwrap();
        assert_eq!(plan.dispatch, WriteDispatch::Sequential);
    }

    #[test]
    fn pair_refuses_a_non_moriio_leg() {
        let mut p = w("p", &[WRITE]);
        p.connector = Connector::Nixl;
        refused(&p, &w("d", &[WRITE]), "prefill worker is a nixl worker");
        let mut d = w("d", &[WRITE]);
        d.connector = Connector::Passthrough;
        refused(
            &w("p", &[WRITE]),
            &d,
            "decode worker is a passthrough worker",
        );
    }

    #[test]
    fn pair_refuses_dp_above_one() {
        let mut d = w("d", &[WRITE]);
        d.dp_size = 2;
        refused(&w("p", &[WRITE]), &d, "DP size 2");
    }

    #[test]
    fn pair_refuses_missing_mode() {
        refused(
            &w("p", &[]),
            &w("d", &[WRITE]),
            "prefill worker has no `moriio_mode`",
        );
    }

    #[test]
    fn pair_refuses_invalid_mode() {
        refused(
            &w("p", &[WRITE]),
            &w("d", &[("moriio_mode", "WRITE")]),
            "must be `read` or `write`",
        );
    }

    #[test]
    fn pair_refuses_mixed_modes() {
        refused(&w("p", &[READ]), &w("d", &[WRITE]), "Read mode but decode");
    }

    #[test]
    fn pair_refuses_unparsable_ports() {
        for bad in ["0", "65536", "-1", "x", "", " 6301", "+6301"] {
            let d = w("d", &[WRITE, ("moriio_handshake_port", bad)]);
            refused(&w("p", &[WRITE]), &d, "moriio_handshake_port");
            let d = w("d", &[WRITE, ("moriio_notify_port", bad)]);
            refused(&w("p", &[WRITE]), &d, "moriio_notify_port");
        }
    }

    #[test]
    fn pair_refuses_invalid_write_dispatch_on_either_worker() {
        let bad = ("moriio_write_dispatch", "parallel");
        refused(
            &w("p", &[WRITE, bad]),
            &w("d", &[WRITE]),
            "prefill worker label",
        );
        refused(
            &w("p", &[WRITE]),
            &w("d", &[WRITE, bad]),
            "decode worker label",
        );
        refused(
            &w("p", &[READ]),
            &w("d", &[READ, bad]),
            "moriio_write_dispatch",
        );
    }

    #[test]
    fn pair_refuses_invalid_tp_size() {
        for bad in ["0", "x", "-2", "1.5"] {
            let d = w("d", &[WRITE, ("tp_size", bad)]);
            refused(&w("p", &[WRITE]), &d, "tp_size");
        }
    }

    #[test]
    fn pair_refuses_invalid_host_label() {
        refused(
            &w("p", &[WRITE]),
            &w("d", &[WRITE, ("moriio_host", "")]),
            "moriio_host",
        );
        refused(
            &w("p", &[WRITE]),
            &w("d", &[WRITE, ("moriio_host", "a b")]),
            "moriio_host",
        );
        refused(&w("p", &[WRITE]), &w("", &[WRITE]), "no usable host");
    }

    #[test]
    fn write_pair_refuses_loopback_decode_with_remote_prefill() {
        for local in [
            "localhost",
            "127.0.0.1",
            "0.0.0.0",
            "[::]",
            "[::1]",
            "127.1.2.3",
        ] {
            let d = w("d", &[WRITE, ("moriio_host", local)]);
            refused(&w("10.0.0.1", &[WRITE]), &d, "loopback or unspecified");
        }
    }

    #[test]
    fn write_pair_allows_loopback_on_both_sides_with_distinct_ports() {
        let d = w(
            "127.0.0.1",
            &[
                WRITE,
                ("moriio_handshake_port", "7000"),
                ("moriio_notify_port", "7001"),
            ],
        );
        assert!(check(&w("127.0.0.1", &[WRITE]), &d).is_ok());
    }

    #[test]
    fn read_pair_ignores_side_channel_hosts() {
        assert!(check(&w("10.0.0.1", &[READ]), &w("127.0.0.1", &[READ])).is_ok());
        assert!(check(&w("h", &[READ]), &w("h", &[READ])).is_ok());
    }

    #[test]
    fn write_pair_refuses_decode_side_channel_equal_to_prefill() {
        refused(
            &w("10.0.0.1", &[WRITE]),
            &w("10.0.0.2", &[WRITE, ("moriio_host", "10.0.0.1")]),
            "prefill's own side channel",
        );
        refused(
            &w("Host.Example", &[WRITE]),
            &w("host.example", &[WRITE, ("moriio_notify_port", "9")]),
            "prefill's own side channel",
        );
        refused(
            &w("[::ffff:10.0.0.1]", &[WRITE]),
            &w("::FFFF:10.0.0.1", &[WRITE, ("moriio_notify_port", "9")]),
            "prefill's own side channel",
        );
    }

    #[test]
    fn concurrent_pair_refuses_loopback_prefill_with_remote_decode() {
        let d = w(
            "10.0.0.2",
            &[WRITE, ("moriio_write_dispatch", "concurrent")],
        );
        refused(&w("localhost", &[WRITE]), &d, "under concurrent dispatch");
        // Sequential: the decode never dials the prefill's labeled host.
        assert!(check(&w("localhost", &[WRITE]), &w("10.0.0.2", &[WRITE])).is_ok());
    }

    fn req(route: Route, body: &str) -> Result<(), RequestRefusal> {
        let top = scan_object(body.as_bytes()).unwrap();
        check_request(route, body.as_bytes(), &top)
    }

    #[test]
    fn only_chat_and_completions_routes_are_supported() {
        assert!(req(Route::ChatCompletions, "{}").is_ok());
        assert!(req(Route::Completions, "{}").is_ok());
        for r in [
            Route::Generate,
            Route::Messages,
            Route::Responses,
            Route::Rerank,
            Route::CountTokens,
        ] {
            let e = req(r, "{}").unwrap_err();
            assert_eq!(e, RequestRefusal::RouteUnsupported(r));
            assert_eq!(e.code(), ErrorCode::MoriioRouteUnsupported);
            assert_eq!(e.code().status(), 501);
        }
    }

    #[test]
    fn fanout_n_above_one_is_refused() {
        let e = req(Route::ChatCompletions, r#"{"n":2}"#).unwrap_err();
        assert_eq!(e.code(), ErrorCode::MoriioFanoutUnsupported);
        assert!(req(Route::ChatCompletions, r#"{"n":1}"#).is_ok());
    }

    #[test]
    fn fanout_batched_prompt_is_refused() {
        assert!(req(Route::Completions, r#"{"prompt":["a","b"]}"#).is_err());
        assert!(req(Route::Completions, r#"{"prompt":[[1],[2]]}"#).is_err());
        assert!(req(Route::Completions, r#"{"prompt":["a"]}"#).is_ok());
        assert!(req(Route::Completions, r#"{"prompt":[1,2,3]}"#).is_ok());
        assert!(req(Route::Completions, r#"{"prompt":"a"}"#).is_ok());
    }

    #[test]
    fn fanout_prompt_embeds_list_is_refused() {
        assert!(req(Route::Completions, r#"{"prompt_embeds":["AA==","AA=="]}"#).is_err());
        assert!(req(Route::Completions, r#"{"prompt_embeds":"AA=="}"#).is_ok());
    }

    #[test]
    fn fanout_beam_search_is_refused() {
        let e = req(Route::Completions, r#"{"use_beam_search":true}"#).unwrap_err();
        assert!(e.to_string().contains("use_beam_search"));
        assert!(req(Route::Completions, r#"{"use_beam_search":false}"#).is_ok());
    }

    #[test]
    fn request_id_with_peer_markers_is_reserved() {
        for id in ["x___prefill_addr_10.0.0.1:1", "___decode_addr_h:2_uuid"] {
            assert!(request_id_is_reserved(id));
            let body = format!(r#"{{"request_id":{}}}"#, serde_json::to_string(id).unwrap());
            let e = req(Route::ChatCompletions, &body).unwrap_err();
            assert_eq!(e.code(), ErrorCode::MoriioRequestIdReserved);
        }
        assert!(!request_id_is_reserved("plain-id"));
        assert!(req(
            Route::ChatCompletions,
            r#"{"request_id":"\u005f__prefill_addr_x"}"#
        )
        .is_err());
    }

    fn plan(mode: Mode, dispatch: WriteDispatch) -> MoriPlan {
        let side = |host: &str, hp, np, tp| MoriSide {
            mode,
            host: host.to_owned(),
            handshake_port: hp,
            notify_port: np,
            write_dispatch: dispatch,
            tp_size: tp,
        };
        MoriPlan {
            mode,
            dispatch,
            prefill: side("10.0.0.1", 6301, 61005, Some(4)),
            decode: side("10.0.0.2", 7000, 7001, Some(8)),
        }
    }

    #[test]
    fn write_prefill_tag_names_the_decode_side_channel() {
        let tag = prefill_tag(&plan(Mode::Write, WriteDispatch::Sequential), "xfer-1");
        let v: Value = serde_json::from_slice(&tag).unwrap();
        assert_eq!(
            v,
            json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":"xfer-1",
                "remote_dp_size":1,"remote_tp_size":8,"remote_host":"10.0.0.2",
                "remote_handshake_port":7000,"remote_notify_port":7001})
        );
    }

    #[test]
    fn read_prefill_tag_has_no_side_channel() {
        let mut p = plan(Mode::Read, WriteDispatch::Sequential);
        p.decode.tp_size = None;
        let v: Value = serde_json::from_slice(&prefill_tag(&p, "xfer-1")).unwrap();
        assert_eq!(
            v,
            json!({"do_remote_decode":true,"do_remote_prefill":false,"transfer_id":"xfer-1",
                "remote_dp_size":1})
        );
    }

    #[test]
    fn moriio_prefill_leg_ignores_eos_and_drops_stops() {
        let body = br#"{"prompt":"x","stop":["."],"stop_token_ids":[2],"ignore_eos":false,"max_tokens":9}"#;
        let top = scan_object(body).unwrap();
        let mut out = Vec::new();
        prefill_leg_body_into(&mut out, Route::Completions, body, &top, br#"{"t":1}"#);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({"prompt":"x","ignore_eos":true,"stream":false,"max_tokens":1,
                "kv_transfer_params":{"t":1}})
        );
    }

    #[test]
    fn concurrent_decode_params_name_the_prefill_side_channel() {
        let p = plan(Mode::Write, WriteDispatch::Concurrent);
        let v: Value = serde_json::from_slice(&concurrent_decode_params(&p, "xfer-9")).unwrap();
        assert_eq!(
            v,
            json!({"do_remote_decode":false,"do_remote_prefill":true,"transfer_id":"xfer-9",
                "remote_dp_size":1,"remote_host":"10.0.0.1","remote_handshake_port":6301,
                "remote_notify_port":61005,"remote_tp_size":4})
        );
    }

    // ---- handoff validation: one test per rule and malformed shape ----

    const GOOD: &str = r#"{"do_remote_prefill":true,"do_remote_decode":false,
        "remote_block_ids":[[1,2,3]],"remote_engine_id":"e1","remote_host":"10.0.0.1",
        "remote_handshake_port":6301,"remote_notify_port":"61005","remote_dp_size":1,
        "tp_size":"8","transfer_id":"xfer-1"}"#;

    const SEQ: HandoffExpectation<'static> = HandoffExpectation {
        transfer_id: "xfer-1",
        told_ports: None,
    };

    /// GOOD with `key` set to `raw` (or removed when `raw` is None).
    fn with(key: &str, raw: Option<&str>) -> Vec<u8> {
        let top = scan_object(GOOD.as_bytes()).unwrap();
        let set: Vec<(&str, &[u8])> = raw.iter().map(|r| (key, r.as_bytes())).collect();
        crate::body::rewrite(GOOD.as_bytes(), &top, &[key], &set)
    }

    fn invalid(key: &str, raw: Option<&str>, needle: &str) {
        let params = with(key, raw);
        let err = validate_params(&params, &SEQ).unwrap_err();
        assert!(
            err.contains(needle),
            "{key}={raw:?}: {err:?} lacks {needle:?}"
        );
    }

    #[test]
    fn a_well_formed_handoff_is_relayed_verbatim() {
        let resp = format!(r#"{{"id":"cmpl-1","kv_transfer_params":{GOOD}}}"#);
        let params = validate_handoff(resp.as_bytes(), &SEQ).unwrap();
        assert_eq!(params, GOOD.as_bytes());
    }

    #[test]
    fn handoff_missing_is_invalid() {
        for resp in [
            &br#"{"id":"x"}"#[..],
            br#"{"kv_transfer_params":null}"#,
            br#"{"kv_transfer_params":"x"}"#,
            b"oops",
        ] {
            let err = validate_handoff(resp, &SEQ).unwrap_err();
            assert!(err.contains("no kv_transfer_params"), "{err}");
        }
    }

    #[test]
    fn handoff_transfer_id_missing() {
        invalid("transfer_id", None, "transfer_id is missing");
        invalid("transfer_id", Some("null"), "transfer_id is missing");
    }

    #[test]
    fn handoff_transfer_id_not_a_string() {
        invalid("transfer_id", Some("1"), "not a string");
    }

    #[test]
    fn handoff_transfer_id_foreign() {
        invalid("transfer_id", Some(r#""xfer-2""#), "not the minted");
    }

    #[test]
    fn handoff_engine_id_missing() {
        invalid("remote_engine_id", None, "remote_engine_id is missing");
    }

    #[test]
    fn handoff_engine_id_empty() {
        invalid("remote_engine_id", Some(r#""""#), "non-empty string");
    }

    #[test]
    fn handoff_engine_id_not_a_string() {
        invalid("remote_engine_id", Some("7"), "non-empty string");
    }

    #[test]
    fn handoff_block_ids_missing() {
        invalid("remote_block_ids", None, "remote_block_ids is missing");
    }

    #[test]
    fn handoff_block_ids_flat_and_grouped_lists_pass() {
        for ok in ["[1,2,3]", "[[1],[2,3]]", "[]", "[[]]"] {
            validate_params(&with("remote_block_ids", Some(ok)), &SEQ).unwrap();
        }
    }

    #[test]
    fn handoff_block_ids_not_a_list() {
        invalid("remote_block_ids", Some("5"), "list of integers");
    }

    #[test]
    fn handoff_block_ids_mixed_levels() {
        invalid("remote_block_ids", Some("[1,[2]]"), "list of integers");
    }

    #[test]
    fn handoff_block_ids_non_integer_elements() {
        invalid("remote_block_ids", Some("[1.5]"), "list of integers");
        invalid("remote_block_ids", Some(r#"["1"]"#), "list of integers");
        invalid("remote_block_ids", Some("[null]"), "list of integers");
    }

    #[test]
    fn handoff_block_ids_non_integer_in_groups() {
        invalid(
            "remote_block_ids",
            Some(r#"[[1],["2"]]"#),
            "list of integers",
        );
        invalid("remote_block_ids", Some("[[[1]]]"), "list of integers");
    }

    #[test]
    fn handoff_host_missing() {
        invalid("remote_host", None, "remote_host is missing");
    }

    #[test]
    fn handoff_host_empty() {
        invalid("remote_host", Some(r#""""#), "without whitespace");
    }

    #[test]
    fn handoff_host_with_whitespace() {
        invalid("remote_host", Some(r#""10.0.0.1 ""#), "without whitespace");
        invalid("remote_host", Some(r#""a\tb""#), "without whitespace");
    }

    #[test]
    fn handoff_host_not_a_string() {
        invalid("remote_host", Some("[\"h\"]"), "without whitespace");
    }

    #[test]
    fn handoff_host_is_not_compared_with_the_label() {
        validate_params(&with("remote_host", Some(r#""prefill-0.example""#)), &SEQ).unwrap();
    }

    #[test]
    fn handoff_ports_missing() {
        invalid(
            "remote_handshake_port",
            None,
            "remote_handshake_port is missing",
        );
        invalid("remote_notify_port", None, "remote_notify_port is missing");
    }

    #[test]
    fn handoff_ports_as_number_or_string_pass() {
        for ok in ["1", "65535", r#""6301""#] {
            validate_params(&with("remote_handshake_port", Some(ok)), &SEQ).unwrap();
            validate_params(&with("remote_notify_port", Some(ok)), &SEQ).unwrap();
        }
    }

    #[test]
    fn handoff_port_zero() {
        invalid("remote_handshake_port", Some("0"), "port in 1..=65535");
        invalid("remote_notify_port", Some(r#""0""#), "port in 1..=65535");
    }

    #[test]
    fn handoff_port_out_of_range() {
        invalid("remote_handshake_port", Some("65536"), "port in 1..=65535");
        invalid("remote_notify_port", Some("-1"), "port in 1..=65535");
    }

    #[test]
    fn handoff_port_not_an_integer() {
        invalid("remote_handshake_port", Some("6301.0"), "port in 1..=65535");
        invalid(
            "remote_notify_port",
            Some(r#""61005x""#),
            "port in 1..=65535",
        );
        invalid("remote_notify_port", Some(r#""""#), "port in 1..=65535");
        invalid("remote_notify_port", Some("true"), "port in 1..=65535");
    }

    #[test]
    fn handoff_counts_accept_numbers_decimal_strings_and_null() {
        for key in [
            "remote_dp_size",
            "remote_dp_size_local",
            "remote_dp_rank",
            "tp_size",
            "remote_tp_size",
        ] {
            for ok in [Some("0"), Some("8"), Some(r#""8""#), Some("null"), None] {
                validate_params(&with(key, ok), &SEQ).unwrap();
            }
        }
    }

    #[test]
    fn handoff_counts_reject_non_integers() {
        for key in [
            "remote_dp_size",
            "remote_dp_size_local",
            "remote_dp_rank",
            "tp_size",
            "remote_tp_size",
        ] {
            for bad in ["1.5", "-1", r#""x""#, r#""-1""#, r#""""#, "[1]", "true"] {
                invalid(key, Some(bad), "integer count");
            }
        }
    }

    #[test]
    fn handoff_not_an_object() {
        let err = validate_params(b"[1]", &SEQ).unwrap_err();
        assert!(err.contains("object"), "{err}");
    }

    #[test]
    fn concurrent_handoff_must_report_the_told_ports() {
        let told = HandoffExpectation {
            transfer_id: "xfer-1",
            told_ports: Some((6301, 61005)),
        };
        validate_params(GOOD.as_bytes(), &told).unwrap();
        let other = HandoffExpectation {
            told_ports: Some((6301, 61006)),
            ..told
        };
        let err = validate_params(GOOD.as_bytes(), &other).unwrap_err();
        assert!(err.contains("the decode leg was told"), "{err}");
    }
}
