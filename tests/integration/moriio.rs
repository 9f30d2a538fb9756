//! MoRI-IO over HTTP, end to end: READ, sequential WRITE and concurrent WRITE against mock vLLM
//! engines that really pull, push and allocate KV blocks; the refusals before any leg; the
//! handoff gate, with a small hand-written engine (`FakeEngine`) for the answers the mock is too
//! well-behaved to give (a crafted `kv_transfer_params`, a decode that answers at once or hangs
//! up).
//!
//! Every MoRI-IO worker's side channel is on loopback (the mocks' own IPs), which the WRITE host
//! rule allows because both legs are loopback; the host refusals use labels only, and no leg is
//! contacted then.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use mock_engine::client::{self, ClientOptions, Response};
use mock_engine::output::{self, Output};
use mock_engine::{Connector, EngineKind, Fault, FaultMatch, MockEngine, MockEngineConfig, Role};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::harness::{metric_value, read_request, Gateway};

const CHAT: &str = "/v1/chat/completions";
const COMPLETIONS: &str = "/v1/completions";
/// Exactly one attempt per request, so each failure is answered as it happened.
const ONE_ATTEMPT: &str = "  retry_max_retries: 1\n";

// ---- fleets ---------------------------------------------------------------------------------

struct MoriFleet {
    prefill: MockEngine,
    decode: MockEngine,
    reference: MockEngine,
}

impl MoriFleet {
    async fn start(connector: Connector) -> MoriFleet {
        let spawn = |role, ip: [u8; 4]| {
            MockEngine::spawn(
                MockEngineConfig::test(EngineKind::Vllm, role, ip).with_connector(connector),
            )
        };
        MoriFleet {
            prefill: spawn(Role::Prefill, [127, 0, 5, 2]).await.unwrap(),
            decode: spawn(Role::Decode, [127, 0, 5, 3]).await.unwrap(),
            reference: spawn(Role::Both, [127, 0, 5, 4]).await.unwrap(),
        }
    }

    /// A gateway over this fleet, its decode labelled for concurrent WRITE dispatch.
    async fn concurrent_gateway(&self, extra: &str) -> Gateway {
        let decode = concurrent(self.decode.worker_spec());
        gateway(&[self.prefill.worker_spec(), decode], extra).await
    }

    async fn reference(&self, path: &str, body: &Value) -> Response {
        client::post_json(format!("{}{}", self.reference.api_url(), path), body)
            .await
            .unwrap()
    }

    /// Nothing the gateway could have leaked: no pinned prefill block (and none that had to
    /// expire unread), no decode WRITE allocation left without its push.
    async fn assert_nothing_left(&self) {
        for e in [&self.prefill, &self.decode] {
            assert!(
                e.wait_idle(Duration::from_secs(5)).await,
                "engine still busy"
            );
        }
        let ok = self
            .prefill
            .wait_for(Duration::from_secs(5), |e| e.stats().pinned_blocks == 0)
            .await;
        assert!(ok, "blocks left pinned: {:?}", self.prefill.pinned());
        let p = self.prefill.stats();
        assert_eq!(p.kv_expired_unread_total, 0, "pinned blocks expired unread");
        assert_eq!(self.decode.stats().leaked_allocs, 0, "decode blocks leaked");
    }
}

/// A lone mock vLLM decode (the prefill is a [`FakeEngine`]).
async fn mock_decode(ip: [u8; 4], connector: Connector) -> MockEngine {
    MockEngine::spawn(
        MockEngineConfig::test(EngineKind::Vllm, Role::Decode, ip).with_connector(connector),
    )
    .await
    .unwrap()
}

/// The smallest completion request.
fn tiny() -> Value {
    json!({"model": "mock-model", "prompt": "x", "max_tokens": 2})
}

/// A fault on the next request, whatever its route.
fn hang_once() -> Fault {
    Fault::Hang {
        count: Some(1),
        matcher: FaultMatch::default(),
    }
}

fn delay_once(ms: u64) -> Fault {
    Fault::DelayHead {
        ms,
        count: Some(1),
        matcher: FaultMatch::default(),
    }
}

async fn gateway(workers: &[Value], extra: &str) -> Gateway {
    let mut gw = Gateway::start(workers, extra).await;
    gw.wait_ready().await;
    gw
}

/// `spec` with `labels` set (a `None` value removes the label).
fn labeled(mut spec: Value, labels: &[(&str, Option<&str>)]) -> Value {
    let map = spec["labels"].as_object_mut().expect("a labelled spec");
    for (k, v) in labels {
        match v {
            Some(v) => map.insert(k.to_string(), json!(v)),
            None => map.remove(*k),
        };
    }
    spec
}

fn concurrent(spec: Value) -> Value {
    labeled(spec, &[("moriio_write_dispatch", Some("concurrent"))])
}

fn extract(path: &str, r: &Response) -> Output {
    output::extract(path, r.is_sse(), &r.body)
        .unwrap_or_else(|e| panic!("{path}: {e}: {}", r.text()))
}

fn bodies(stream: bool) -> Vec<(&'static str, Value)> {
    vec![
        (
            CHAT,
            json!({"model": "mock-model", "messages": [{"role": "user", "content": "Tell me about RDMA"}],
                   "max_tokens": 8, "stream": stream}),
        ),
        (
            COMPLETIONS,
            json!({"model": "mock-model", "prompt": "KV moves over MoRI-IO when", "max_tokens": 8, "stream": stream}),
        ),
    ]
}

/// The gateway's Prometheus exposition. Its listener may come up a moment after `/health`
/// answers, so a refused connection is retried until a deadline.
async fn scrape(gw: &Gateway) -> String {
    let url = format!("http://127.0.0.1:{}/metrics", gw.prometheus_port);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match client::get(url.as_str()).await {
            Ok(r) if r.status == 200 => return r.text(),
            other if Instant::now() > deadline => panic!("scrape {url}: {other:?}"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

fn metric(m: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_value(m, name, labels).unwrap_or(0.0)
}

fn assert_error(r: &Response, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], code, "{}", r.text());
}

// ---- PD output = reference ------------------------------------------------------------------

async fn pd_equals_reference(connector: Connector, dispatch_concurrent: bool) {
    let fleet = MoriFleet::start(connector).await;
    let mut decode = fleet.decode.worker_spec();
    if dispatch_concurrent {
        decode = concurrent(decode);
    }
    let gw = gateway(&[fleet.prefill.worker_spec(), decode], "").await;
    let mut sent = 0.0;
    for stream in [false, true] {
        for (path, body) in bodies(stream) {
            let pd = gw.post(path, &body).await;
            sent += 1.0;
            assert_eq!(pd.status, 200, "{path} stream={stream}: {}", pd.text());
            let reference = fleet.reference(path, &body).await;
            assert_eq!(
                extract(path, &pd),
                extract(path, &reference),
                "{path} stream={stream}"
            );
            let d = fleet
                .decode
                .records()
                .last()
                .cloned()
                .expect("a decode leg");
            assert_eq!(d.handoff.kv_source.as_deref(), Some("remote"), "{path}");
            assert_eq!(
                d.handoff.items[0].integrity.as_deref(),
                Some("ok"),
                "{path}: the decode worked on foreign KV"
            );
        }
    }
    let m = scrape(&gw).await;
    assert_eq!(
        metric(&m, "smg_pd_kv_connector_mode_total", &[("mode", "moriio")]),
        sent
    );
    assert_eq!(metric(&m, "smg_pd_kv_transfer_failures_total", &[]), 0.0);
    fleet.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moriio_read_pd_output_equals_reference() {
    pd_equals_reference(Connector::MoriioRead, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moriio_write_sequential_pd_output_equals_reference() {
    pd_equals_reference(Connector::MoriioWrite, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moriio_write_concurrent_pd_output_equals_reference() {
    pd_equals_reference(Connector::MoriioWrite, true).await;
}

// ---- what each leg carries ------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_leg_is_tagged_for_write_and_ignores_eos_while_decode_keeps_stops() {
    let fleet = MoriFleet::start(Connector::MoriioWrite).await;
    let decode = labeled(fleet.decode.worker_spec(), &[("tp_size", Some("2"))]);
    let gw = gateway(&[fleet.prefill.worker_spec(), decode], "").await;
    // The prefill's one token is EOS unless `ignore_eos`: the connector would then hand off
    // nothing, and a MoRI-IO decode cannot recompute.
    fleet
        .prefill
        .inject(Fault::EosFirstToken { count: Some(1) })
        .await;
    let body = json!({"model": "mock-model", "prompt": "stop conditions stay on decode",
        "max_tokens": 6, "stop": ["zzz"], "stop_token_ids": [7],
        "kv_transfer_params": {"remote_host": "203.0.113.9"}});
    let r = gw.post(COMPLETIONS, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());

    let p = fleet.prefill.records().last().cloned().unwrap();
    let d = fleet.decode.records().last().cloned().unwrap();
    let tag = &p.body["kv_transfer_params"];
    let id = tag["transfer_id"].as_str().expect("a minted transfer_id");
    assert!(id.starts_with("xfer-"), "{id}");
    assert_eq!(
        *tag,
        json!({"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": id,
            "remote_dp_size": 1, "remote_tp_size": 2, "remote_host": fleet.decode.host(),
            "remote_handshake_port": fleet.decode.side_channel_port().unwrap(),
            "remote_notify_port": fleet.decode.notify_port().unwrap()})
    );
    assert_eq!(p.body["ignore_eos"], true);
    assert_eq!(p.body["max_tokens"], 1);
    assert_eq!(p.body["stream"], false);
    assert!(p.body.get("stop").is_none() && p.body.get("stop_token_ids").is_none());

    assert_eq!(d.body["stop"], json!(["zzz"]));
    assert_eq!(d.body["stop_token_ids"], json!([7]));
    assert_eq!(d.body["max_tokens"], 6);
    assert!(d.body.get("ignore_eos").is_none());
    assert_eq!(
        d.body["kv_transfer_params"],
        p.handoff.returned_params.clone().unwrap(),
        "the handoff was not relayed verbatim"
    );
    assert_eq!(p.x_request_id, d.x_request_id);
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("kv_transfer_params");
    assert_eq!(
        extract(COMPLETIONS, &r),
        extract(COMPLETIONS, &fleet.reference(COMPLETIONS, &plain).await)
    );
    fleet.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_prefill_leg_names_no_side_channel() {
    let fleet = MoriFleet::start(Connector::MoriioRead).await;
    let gw = gateway(
        &[fleet.prefill.worker_spec(), fleet.decode.worker_spec()],
        "",
    )
    .await;
    let r = gw
        .post(
            CHAT,
            &json!({"model": "mock-model", "messages": [{"role": "user", "content": "read"}],
                "max_completion_tokens": 5}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = fleet.prefill.records().last().cloned().unwrap();
    let tag = &p.body["kv_transfer_params"];
    assert_eq!(
        *tag,
        json!({"do_remote_decode": true, "do_remote_prefill": false,
            "transfer_id": tag["transfer_id"], "remote_dp_size": 1})
    );
    assert_eq!(p.body["max_completion_tokens"], 1);
    fleet.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_write_sends_both_legs_at_once_with_params_minted_from_the_prefill_labels() {
    let fleet = MoriFleet::start(Connector::MoriioWrite).await;
    let prefill = labeled(fleet.prefill.worker_spec(), &[("tp_size", Some("1"))]);
    let gw = gateway(&[prefill, concurrent(fleet.decode.worker_spec())], "").await;
    // The prefill starts late: a sequential gateway would send the decode only after it ended
    // (1 s: a loaded machine's stall between the two legs must not pass for that, and the push
    // still lands within the decode's 2 s WRITE wait).
    fleet.prefill.inject(delay_once(1_000)).await;
    let body = json!({"model": "mock-model", "prompt": "both at once", "max_tokens": 4});
    let r = gw.post(COMPLETIONS, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let p = fleet.prefill.records().last().cloned().unwrap();
    let d = fleet.decode.records().last().cloned().unwrap();
    assert!(
        d.arrive_ms < p.outcome.done_at_ms.unwrap(),
        "the decode leg waited for the prefill"
    );
    let id = p.body["kv_transfer_params"]["transfer_id"].clone();
    assert_eq!(
        d.body["kv_transfer_params"],
        json!({"do_remote_decode": false, "do_remote_prefill": true, "transfer_id": id,
            "remote_dp_size": 1, "remote_host": fleet.prefill.host(),
            "remote_handshake_port": fleet.prefill.side_channel_port().unwrap(),
            "remote_notify_port": fleet.prefill.notify_port().unwrap(), "remote_tp_size": 1})
    );
    assert_eq!(
        extract(COMPLETIONS, &r),
        extract(COMPLETIONS, &fleet.reference(COMPLETIONS, &body).await)
    );
    fleet.assert_nothing_left().await;
}

// ---- refusals before any leg ----------------------------------------------------------------

type SpecEdit = fn(&mut Value);

fn set_label(spec: &mut Value, k: &str, v: &str) {
    spec["labels"][k] = json!(v);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_pairs_are_refused_before_any_leg() {
    let fleet = MoriFleet::start(Connector::MoriioWrite).await;
    // (what is wrong, prefill edit, decode edit, the reason the log must give)
    let cases: Vec<(&str, SpecEdit, SpecEdit, &str)> = vec![
        (
            "legs in different modes",
            |p| set_label(p, "moriio_mode", "read"),
            |_| {},
            "mode",
        ),
        (
            "a prefill that is not MoRI-IO",
            |p| {
                p["kv_connector"] = json!("NixlConnector");
                set_label(p, "kv_connector", "NixlConnector");
            },
            |_| {},
            "not MoRIIOConnector",
        ),
        (
            "a missing moriio_mode",
            |_| {},
            |d| {
                d["labels"].as_object_mut().unwrap().remove("moriio_mode");
            },
            "no `moriio_mode` label",
        ),
        (
            "an unparsable port label",
            |_| {},
            |d| set_label(d, "moriio_notify_port", "abc"),
            "moriio_notify_port",
        ),
        (
            "a decode with DP > 1",
            |_| {},
            |d| d["dp_size"] = json!(2),
            "DP size 2",
        ),
        (
            "an unparsable dp_size label",
            |_| {},
            |d| set_label(d, "dp_size", "two"),
            "dp_size",
        ),
        (
            "an invalid moriio_write_dispatch",
            |_| {},
            |d| set_label(d, "moriio_write_dispatch", "parallel"),
            "moriio_write_dispatch",
        ),
        (
            "a loopback decode side channel for a remote prefill",
            |p| set_label(p, "moriio_host", "10.0.0.1"),
            |d| set_label(d, "moriio_host", "127.0.0.1"),
            "loopback or unspecified",
        ),
        (
            "an unspecified decode side channel for a remote prefill",
            |p| set_label(p, "moriio_host", "10.0.0.1"),
            |d| set_label(d, "moriio_host", "0.0.0.0"),
            "loopback or unspecified",
        ),
        (
            "a loopback prefill side channel for a remote concurrent decode",
            |p| set_label(p, "moriio_host", "localhost"),
            |d| {
                set_label(d, "moriio_host", "10.0.0.2");
                set_label(d, "moriio_write_dispatch", "concurrent");
            },
            "under concurrent dispatch",
        ),
        (
            "a decode side channel that is the prefill's own",
            |p| {
                set_label(p, "moriio_host", "10.0.0.1");
                set_label(p, "moriio_handshake_port", "6301");
            },
            |d| {
                set_label(d, "moriio_host", "10.0.0.1");
                set_label(d, "moriio_handshake_port", "6301");
            },
            "prefill's own side channel",
        ),
    ];
    for (what, edit_prefill, edit_decode, reason) in cases {
        let (mut p, mut d) = (fleet.prefill.worker_spec(), fleet.decode.worker_spec());
        edit_prefill(&mut p);
        edit_decode(&mut d);
        // Pairing may keep some of these apart before MoRI-IO sees them; turn it off.
        let gw = gateway(&[p, d], "  pd_pairing_mode: off\n").await;
        let r = gw.post(COMPLETIONS, &tiny()).await;
        assert_error(&r, 503, "moriio_pair_misconfigured");
        assert!(
            !r.text().contains(reason),
            "{what}: the reason went to the client"
        );
        let log = gw.log();
        assert!(
            log.contains("is misconfigured") && log.contains(reason),
            "{what}: the log lacks {reason:?}\n{log}"
        );
        let m = scrape(&gw).await;
        assert_eq!(
            metric(&m, "smg_pd_kv_transfer_failures_total", &[]),
            1.0,
            "{what}"
        );
        assert_eq!(
            metric(&m, "smg_pd_kv_connector_mode_total", &[("mode", "moriio")]),
            0.0,
            "{what}: counted as a dispatch"
        );
    }
    assert!(fleet.prefill.records().is_empty(), "a prefill leg went out");
    assert!(fleet.decode.records().is_empty(), "a decode leg went out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_moriio_cannot_serve_are_refused_before_any_leg() {
    let fleet = MoriFleet::start(Connector::MoriioRead).await;
    let gw = gateway(
        &[fleet.prefill.worker_spec(), fleet.decode.worker_spec()],
        "",
    )
    .await;
    let chat = |extra: Value| {
        let mut b = json!({"model": "mock-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let completion = |prompt: Value, extra: Value| {
        let mut b = json!({"model": "mock-model", "prompt": prompt, "max_tokens": 2});
        b.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        b
    };
    let fanout = [
        (CHAT, chat(json!({"n": 2}))),
        (COMPLETIONS, completion(json!(["a", "b"]), json!({}))),
        (COMPLETIONS, completion(json!([[1, 2], [3]]), json!({}))),
        (
            COMPLETIONS,
            completion(json!("x"), json!({"prompt_embeds": ["AA==", "AA=="]})),
        ),
        (
            COMPLETIONS,
            completion(json!("x"), json!({"use_beam_search": true})),
        ),
    ];
    for (path, body) in &fanout {
        let r = gw.post(path, body).await;
        assert_error(&r, 400, "moriio_fanout_unsupported");
    }
    let marked = "req___prefill_addr_10.0.0.9:6301___decode_addr_10.0.0.8:61005_1";
    let r = gw.post(CHAT, &chat(json!({"request_id": marked}))).await;
    assert_error(&r, 400, "moriio_request_id_reserved");
    let r = client::request(
        "POST",
        &gw.url(CHAT),
        &[
            ("content-type", "application/json"),
            ("x-request-id", "abc___decode_addr_10.0.0.8:61005"),
        ],
        Some(Bytes::from(chat(json!({})).to_string())),
    )
    .await
    .unwrap();
    assert_error(&r, 400, "moriio_request_id_reserved");
    for (path, body) in [
        (
            "/generate",
            json!({"text": "x", "sampling_params": {"max_new_tokens": 2}}),
        ),
        (
            "/v1/responses",
            json!({"model": "mock-model", "input": "x", "max_output_tokens": 2}),
        ),
    ] {
        let r = gw.post(path, &body).await;
        assert_error(&r, 501, "moriio_route_unsupported");
    }
    assert!(fleet.prefill.records().is_empty(), "a prefill leg went out");
    assert!(fleet.decode.records().is_empty(), "a decode leg went out");
    let m = scrape(&gw).await;
    assert_eq!(metric(&m, "smg_pd_kv_transfer_failures_total", &[]), 0.0);
    assert_eq!(
        metric(&m, "smg_pd_kv_connector_mode_total", &[("mode", "moriio")]),
        0.0
    );

    // The same gateway serves a request without those features (one-item prompts included).
    let r = gw
        .post(
            COMPLETIONS,
            &completion(json!(["only one"]), json!({"n": 1})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = scrape(&gw).await;
    assert_eq!(
        metric(&m, "smg_pd_kv_connector_mode_total", &[("mode", "moriio")]),
        1.0
    );
    fleet.assert_nothing_left().await;
}

// ---- the handoff gate -----------------------------------------------------------------------

/// A well-formed MoRI-IO handoff answering the prefill leg `leg`, from a prefill at `host` with
/// side-channel ports `ports`.
fn good_handoff(leg: &Value, host: &str, ports: (u16, u16)) -> Value {
    json!({"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": [[1, 2]],
        "remote_engine_id": "fake-engine", "remote_host": host,
        "remote_handshake_port": ports.0, "remote_notify_port": ports.1,
        "remote_dp_size": 1, "tp_size": 1,
        "transfer_id": leg["kv_transfer_params"]["transfer_id"]})
}

fn completion_with(text: &str, params: Option<Value>) -> Value {
    let mut v = json!({"id": "cmpl-fake", "object": "text_completion", "created": 0,
        "model": "mock-model", "usage": null,
        "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "length",
            "stop_reason": null}]});
    if let Some(p) = params {
        v["kv_transfer_params"] = p;
    }
    v
}

/// Every malformed shape the spec names, applied to a good handoff.
const MALFORMED: &[(&str, SpecEdit)] = &[
    ("no handoff", |h| *h = Value::Null),
    ("a foreign transfer_id", |h| {
        h["transfer_id"] = json!("xfer-someone-else")
    }),
    ("no transfer_id", |h| {
        h.as_object_mut().unwrap().remove("transfer_id");
    }),
    ("an empty engine id", |h| h["remote_engine_id"] = json!("")),
    ("string block ids", |h| {
        h["remote_block_ids"] = json!([["1", "2"]])
    }),
    ("fractional block ids", |h| {
        h["remote_block_ids"] = json!([1.5])
    }),
    ("an empty remote_host", |h| h["remote_host"] = json!("")),
    ("a zero handshake port", |h| {
        h["remote_handshake_port"] = json!(0)
    }),
    ("a non-numeric notify port", |h| {
        h["remote_notify_port"] = json!("abc")
    }),
    ("a fractional tp_size", |h| h["tp_size"] = json!(1.5)),
    ("a non-numeric remote_dp_size", |h| {
        h["remote_dp_size"] = json!("one")
    }),
    ("a negative remote_tp_size", |h| {
        h["remote_tp_size"] = json!(-1)
    }),
];

const FAKE_PORTS: (u16, u16) = (7001, 7002);

/// A fake decode's labels for concurrent WRITE dispatch.
fn fake_concurrent_decode_labels(host: &str) -> Vec<(&'static str, String)> {
    let mut labels = fake_labels("write", host);
    labels.push(("moriio_write_dispatch", "concurrent".into()));
    labels
}

fn fake_labels(mode: &str, host: &str) -> Vec<(&'static str, String)> {
    vec![
        ("moriio_mode", mode.to_string()),
        ("moriio_host", host.to_string()),
        ("moriio_handshake_port", FAKE_PORTS.0.to_string()),
        ("moriio_notify_port", FAKE_PORTS.1.to_string()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_handoff_fails_with_502_and_no_decode_leg() {
    let case = Arc::new(AtomicUsize::new(usize::MAX));
    let prefill = FakeEngine::spawn([127, 0, 5, 12], {
        let case = case.clone();
        move |leg| {
            let mut h = good_handoff(leg, "127.0.5.12", FAKE_PORTS);
            if let Some((_, corrupt)) = MALFORMED.get(case.load(Ordering::SeqCst)) {
                corrupt(&mut h);
            }
            FakeAnswer::Json(Duration::ZERO, 200, completion_with(" x", Some(h)))
        }
    })
    .await;
    let decode = mock_decode([127, 0, 5, 13], Connector::MoriioRead).await;
    let p_spec = prefill.spec("prefill", &fake_labels("read", "127.0.5.12"));
    let gw = gateway(&[p_spec, decode.worker_spec()], ONE_ATTEMPT).await;
    let body = json!({"model": "mock-model", "prompt": "handoff", "max_tokens": 3});
    for (i, (what, _)) in MALFORMED.iter().enumerate() {
        case.store(i, Ordering::SeqCst);
        let r = gw.post(COMPLETIONS, &body).await;
        assert_error(&r, 502, "moriio_handoff_invalid");
        assert!(decode.records().is_empty(), "{what}: a decode leg went out");
        assert_eq!(prefill.bodies().len(), i + 1, "{what}: retried");
        let m = scrape(&gw).await;
        assert_eq!(
            metric(&m, "smg_pd_kv_transfer_failures_total", &[]),
            (i + 1) as f64,
            "{what}"
        );
    }
    // Control: the same engine with a well-formed handoff gets its decode leg, params verbatim.
    case.store(usize::MAX, Ordering::SeqCst);
    let r = gw.post(COMPLETIONS, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    let d = decode.records();
    assert_eq!(d.len(), 1);
    let leg = prefill.bodies().pop().unwrap();
    assert_eq!(
        d[0].body["kv_transfer_params"],
        good_handoff(&leg, "127.0.5.12", FAKE_PORTS)
    );
    let m = scrape(&gw).await;
    assert_eq!(
        metric(&m, "smg_pd_kv_connector_mode_total", &[("mode", "moriio")]),
        (MALFORMED.len() + 1) as f64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_handoff_is_retried_on_a_new_transfer_id() {
    let prefill = FakeEngine::spawn([127, 0, 5, 14], |leg| {
        let mut h = good_handoff(leg, "127.0.5.14", FAKE_PORTS);
        h["transfer_id"] = json!("xfer-stale");
        FakeAnswer::Json(Duration::ZERO, 200, completion_with(" x", Some(h)))
    })
    .await;
    let decode = mock_decode([127, 0, 5, 15], Connector::MoriioRead).await;
    let p_spec = prefill.spec("prefill", &fake_labels("read", "127.0.5.14"));
    let gw = gateway(
        &[p_spec, decode.worker_spec()],
        "  retry_max_retries: 2\n  retry_initial_backoff_ms: 1\n",
    )
    .await;
    let r = gw.post(COMPLETIONS, &tiny()).await;
    assert_error(&r, 502, "moriio_handoff_invalid");
    let legs = prefill.bodies();
    assert_eq!(legs.len(), 2, "one retry expected");
    assert_ne!(
        legs[0]["kv_transfer_params"]["transfer_id"], legs[1]["kv_transfer_params"]["transfer_id"],
        "a retry reused the transfer id"
    );
    assert!(decode.records().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_decode_answer_is_held_until_the_handoff_passes() {
    // The decode answers at once; the prefill takes 300 ms and its handoff decides.
    const PREFILL_MS: u64 = 300;
    let case = Arc::new(AtomicUsize::new(0));
    let prefill = FakeEngine::spawn([127, 0, 5, 16], {
        let case = case.clone();
        move |leg| {
            let mut h = good_handoff(leg, "prefill-0.example", FAKE_PORTS);
            match case.load(Ordering::SeqCst) {
                1 => h["remote_notify_port"] = json!(FAKE_PORTS.1 + 1),
                2 => h["transfer_id"] = json!("xfer-other"),
                _ => {}
            }
            FakeAnswer::Json(
                Duration::from_millis(PREFILL_MS),
                200,
                completion_with(" x", Some(h)),
            )
        }
    })
    .await;
    let decode = FakeEngine::spawn([127, 0, 5, 17], |_| {
        FakeAnswer::Json(Duration::ZERO, 200, completion_with(" decoded", None))
    })
    .await;
    let mut p_labels = fake_labels("write", "127.0.5.16");
    p_labels.push(("tp_size", "4".into()));
    let d_labels = fake_concurrent_decode_labels("127.0.5.17");
    let gw = gateway(
        &[
            prefill.spec("prefill", &p_labels),
            decode.spec("decode", &d_labels),
        ],
        ONE_ATTEMPT,
    )
    .await;
    let body = json!({"model": "mock-model", "prompt": "held", "max_tokens": 3});

    let started = Instant::now();
    let r = gw.post(COMPLETIONS, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["text"], " decoded");
    assert!(
        started.elapsed() >= Duration::from_millis(PREFILL_MS),
        "the decode answer went out before the prefill's handoff"
    );
    let leg = prefill.bodies().pop().unwrap();
    assert_eq!(
        decode.bodies()[0]["kv_transfer_params"],
        json!({"do_remote_decode": false, "do_remote_prefill": true,
            "transfer_id": leg["kv_transfer_params"]["transfer_id"], "remote_dp_size": 1,
            "remote_host": "127.0.5.16", "remote_handshake_port": FAKE_PORTS.0,
            "remote_notify_port": FAKE_PORTS.1, "remote_tp_size": 4}),
        "decode params not minted from the prefill's labels"
    );
    // The handoff's host is not compared with the label; its ports are.
    for (i, what) in [
        (1, "other ports than the decode was told"),
        (2, "a foreign transfer_id"),
    ] {
        case.store(i, Ordering::SeqCst);
        let r = gw.post(COMPLETIONS, &body).await;
        assert_error(&r, 502, "moriio_handoff_invalid");
        assert!(
            !r.text().contains("decoded"),
            "{what}: decode output leaked"
        );
        assert_eq!(
            decode.bodies().len(),
            1 + i,
            "{what}: decode not sent at once"
        );
    }
    let m = scrape(&gw).await;
    assert_eq!(metric(&m, "smg_pd_kv_transfer_failures_total", &[]), 2.0);
    assert_eq!(
        metric(&m, "smg_pd_kv_connector_mode_total", &[("mode", "moriio")]),
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_concurrent_handoff_drops_the_waiting_decode_leg() {
    let prefill = FakeEngine::spawn([127, 0, 5, 18], |leg| {
        let mut h = good_handoff(leg, "127.0.5.18", FAKE_PORTS);
        h["remote_handshake_port"] = json!("0");
        FakeAnswer::Json(
            Duration::from_millis(100),
            200,
            completion_with(" x", Some(h)),
        )
    })
    .await;
    let decode = mock_decode([127, 0, 5, 19], Connector::MoriioWrite).await;
    let gw = gateway(
        &[
            prefill.spec("prefill", &fake_labels("write", "127.0.5.18")),
            concurrent(decode.worker_spec()),
        ],
        ONE_ATTEMPT,
    )
    .await;
    let r = gw
        .post(
            COMPLETIONS,
            &json!({"model": "mock-model", "prompt": "x", "max_tokens": 2, "stream": true}),
        )
        .await;
    assert_error(&r, 502, "moriio_handoff_invalid");
    // The decode engine allocated blocks for a push that will never come; the gateway hung up
    // on it (vLLM then keeps the blocks: vllm-project/vllm#59382, the documented trade-off).
    let d = decode.wait_records(1, Duration::from_secs(5)).await;
    assert!(
        d[0].outcome.cancelled,
        "the decode leg was not dropped: {:?}",
        d[0].outcome
    );
}

// ---- concurrent failures --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_prefill_error_passes_through_and_drops_the_decode() {
    let fleet = MoriFleet::start(Connector::MoriioWrite).await;
    let gw = fleet.concurrent_gateway(ONE_ATTEMPT).await;
    fleet
        .prefill
        .inject(Fault::FailStatus {
            status: 429,
            body: Some(json!({"error": {"message": "busy"}}).to_string()),
            count: Some(1),
            matcher: FaultMatch::default(),
        })
        .await;
    let r = gw.post(COMPLETIONS, &tiny()).await;
    assert_error(&r, 429, "prefill_upstream_error");
    assert_eq!(r.json()["error"]["message"], "busy");
    assert!(fleet.decode.wait_idle(Duration::from_secs(5)).await);
    // The decode leg may not have reached the engine before the gateway hung up on it.
    for d in fleet.decode.records() {
        assert!(d.outcome.cancelled, "decode answered: {:?}", d.outcome);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_decode_error_status_is_returned_without_waiting_for_the_prefill() {
    let fleet = MoriFleet::start(Connector::MoriioWrite).await;
    // The decode refuses once the prefill is surely in flight (2 s: time for a loaded machine to
    // send it); the prefill never answers.
    let decode = FakeEngine::spawn([127, 0, 5, 21], |_| {
        FakeAnswer::Json(
            Duration::from_secs(2),
            503,
            json!({"error": {"message": "decode is full"}}),
        )
    })
    .await;
    let d_labels = fake_concurrent_decode_labels("127.0.5.21");
    let gw = gateway(
        &[
            fleet.prefill.worker_spec(),
            decode.spec("decode", &d_labels),
        ],
        ONE_ATTEMPT,
    )
    .await;
    fleet.prefill.inject(hang_once()).await;
    let body = tiny();
    let r = client::request_with(
        &ClientOptions {
            source_ip: None,
            timeout: Some(Duration::from_secs(10)),
        },
        "POST",
        &gw.url(COMPLETIONS),
        &[("content-type", "application/json")],
        Some(Bytes::from(body.to_string())),
    )
    .await
    .expect("the gateway waited for the hung prefill");
    assert_error(&r, 503, "decode_unavailable");
    assert_eq!(r.json()["error"]["message"], "decode is full");
    let p = fleet.prefill.wait_records(1, Duration::from_secs(5)).await;
    assert!(p[0].outcome.cancelled, "the prefill leg was not dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_decode_transport_error_is_502_and_drops_the_prefill() {
    let fleet = MoriFleet::start(Connector::MoriioWrite).await;
    // The decode hangs up once the prefill is surely in flight (2 s: time for a loaded machine to
    // send it); the prefill answers only well after that.
    let decode = FakeEngine::spawn([127, 0, 5, 20], |_| {
        FakeAnswer::HangUp(Duration::from_secs(2))
    })
    .await;
    let d_labels = fake_concurrent_decode_labels("127.0.5.20");
    let gw = gateway(
        &[
            fleet.prefill.worker_spec(),
            decode.spec("decode", &d_labels),
        ],
        ONE_ATTEMPT,
    )
    .await;
    fleet.prefill.inject(delay_once(5_000)).await;
    let r = gw.post(COMPLETIONS, &tiny()).await;
    assert_error(&r, 502, "decode_request_failed");
    let p = fleet.prefill.wait_records(1, Duration::from_secs(5)).await;
    assert!(p[0].outcome.cancelled, "the prefill leg was not dropped");
    fleet.assert_nothing_left().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_hang_up_during_a_concurrent_write_drops_both_legs() {
    let fleet = MoriFleet::start(Connector::MoriioWrite).await;
    // A client that leaves lets the prefill go on pushing (so the decode's WRITE allocation is
    // released) for at most the prefill's deadline; then both legs are dropped.
    let gw = fleet
        .concurrent_gateway("  prefill_head_timeout_secs: 1\n")
        .await;
    // The prefill never answers, so the decode waits for its push.
    fleet.prefill.inject(hang_once()).await;
    let client = send_raw(
        &gw,
        COMPLETIONS,
        &json!({"model": "mock-model", "prompt": "bye", "max_tokens": 4, "stream": true}),
    )
    .await;
    for e in [&fleet.prefill, &fleet.decode] {
        assert!(
            e.wait_for(Duration::from_secs(5), |e| e.records().len() == 1)
                .await,
            "both legs should be in flight"
        );
    }
    drop(client);
    for (e, leg) in [(&fleet.prefill, "prefill"), (&fleet.decode, "decode")] {
        let r = e.wait_records(1, Duration::from_secs(5)).await;
        assert!(
            r[0].outcome.cancelled,
            "the {leg} leg outlived the client: {:?}",
            r[0].outcome
        );
    }
}

// ---- a hand-written engine ------------------------------------------------------------------

/// What a [`FakeEngine`] does with a model-route request.
enum FakeAnswer {
    /// After a delay, this status and JSON body.
    Json(Duration, u16, Value),
    /// After a delay, close the connection without a response.
    HangUp(Duration),
}

/// A minimal vLLM-looking HTTP/1 server: `/health`, `/v1/models`, and every POST answered by a
/// closure of the request body (one request per connection).
struct FakeEngine {
    addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Value>>>,
    accept: JoinHandle<()>,
}

type Answer = Arc<dyn Fn(&Value) -> FakeAnswer + Send + Sync>;

impl FakeEngine {
    async fn spawn(
        ip: [u8; 4],
        answer: impl Fn(&Value) -> FakeAnswer + Send + Sync + 'static,
    ) -> FakeEngine {
        let listener = TcpListener::bind((IpAddr::from(ip), 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
        let answer: Answer = Arc::new(answer);
        let accept = tokio::spawn({
            let bodies = bodies.clone();
            async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(serve_fake(conn, answer.clone(), bodies.clone()));
                }
            }
        });
        FakeEngine {
            addr,
            bodies,
            accept,
        }
    }

    /// The POST bodies received so far.
    fn bodies(&self) -> Vec<Value> {
        self.bodies.lock().unwrap().clone()
    }

    /// A MoRI-IO vLLM worker spec for this engine.
    fn spec(&self, worker_type: &str, labels: &[(&str, String)]) -> Value {
        let labels: serde_json::Map<String, Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        json!({"url": format!("http://{}", self.addr), "worker_type": worker_type,
            "runtime_type": "vllm", "kv_connector": "MoRIIOConnector", "labels": labels})
    }
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve_fake(mut conn: TcpStream, answer: Answer, bodies: Arc<Mutex<Vec<Value>>>) {
    let Some((method, path, body)) = read_request(&mut conn).await else {
        return;
    };
    let (status, payload) = match (method.as_str(), path.as_str()) {
        ("GET", "/health") => (200, String::new()),
        ("GET", "/v1/models") => (
            200,
            json!({"object": "list", "data": [{"id": "mock-model", "object": "model", "owned_by": "vllm"}]})
                .to_string(),
        ),
        ("POST", _) => {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            bodies.lock().unwrap().push(v.clone());
            match answer(&v) {
                FakeAnswer::HangUp(delay) => {
                    tokio::time::sleep(delay).await;
                    return;
                }
                FakeAnswer::Json(delay, status, out) => {
                    tokio::time::sleep(delay).await;
                    (status, out.to_string())
                }
            }
        }
        _ => (404, String::new()),
    };
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        payload.len()
    );
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.write_all(payload.as_bytes()).await;
    let _ = conn.shutdown().await;
}

/// Sends a request on a raw connection and returns the connection unread: dropping it is a
/// client hang-up the gateway sees at once.
async fn send_raw(gw: &Gateway, path: &str, body: &Value) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", gw.port)).await.unwrap();
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s
}
