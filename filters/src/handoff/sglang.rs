//! SGLang bootstrap rendezvous over HTTP (also TokenSpeed): the field names, the room, and the
//! leg bodies. Both legs carry the same client JSON plus `bootstrap_host`/`bootstrap_port`/
//! `bootstrap_room` pointing at the prefill's bootstrap server; the engines meet in the room.

use std::ops::Range;

use crate::body::{rewrite_into, Sink, TopLevel};
use crate::handoff::vllm::KV_TRANSFER_PARAMS;
use crate::json;

pub const BOOTSTRAP_HOST: &str = "bootstrap_host";
pub const BOOTSTRAP_PORT: &str = "bootstrap_port";
pub const BOOTSTRAP_ROOM: &str = "bootstrap_room";
/// DP rank the receiving engine schedules the request on.
pub const ROUTED_DP_RANK: &str = "routed_dp_rank";
/// Decode leg only: the DP rank the prefill leg went to.
pub const DISAGG_PREFILL_DP_RANK: &str = "disagg_prefill_dp_rank";
/// SGLang's deprecated spelling of [`ROUTED_DP_RANK`] (the engine copies it there when
/// `routed_dp_rank` is unset), so a client could steer a leg's DP rank through it.
pub const DATA_PARALLEL_RANK: &str = "data_parallel_rank";

/// Keys a client may not set itself on SGLang legs; they are stripped before the gateway adds
/// its own (a forged room would let a client join or break another request's rendezvous).
pub const CLIENT_FORBIDDEN_KEYS: &[&str] = &[
    BOOTSTRAP_HOST,
    BOOTSTRAP_PORT,
    BOOTSTRAP_ROOM,
    ROUTED_DP_RANK,
    DISAGG_PREFILL_DP_RANK,
    DATA_PARALLEL_RANK,
    KV_TRANSFER_PARAMS,
];

/// The rooms of one attempt: one for a single request, one per item for a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rooms {
    Single(u64),
    Batch(Vec<u64>),
}

impl Rooms {
    /// Fresh rooms for a request of `batch` items (`None`: a single request), each from its own
    /// 64 random bits drawn from `bits`.
    pub fn mint(batch: Option<usize>, mut bits: impl FnMut() -> u64) -> Rooms {
        match batch {
            None => Rooms::Single(room_from_bits(bits())),
            Some(n) => Rooms::Batch((0..n).map(|_| room_from_bits(bits())).collect()),
        }
    }

    /// The rooms as a slice (one element for `Single`).
    pub fn as_slice(&self) -> &[u64] {
        match self {
            Rooms::Single(r) => std::slice::from_ref(r),
            Rooms::Batch(rs) => rs,
        }
    }
}

/// A room uniform in `[0, 2^63-1]` from 64 random bits: the top bit cleared, so the room fits
/// the engines' signed 64-bit fields.
pub fn room_from_bits(bits: u64) -> u64 {
    bits & i64::MAX as u64
}

/// Where the decode engine finds the prefill's bootstrap server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootstrapTarget<'a> {
    /// The prefill worker URL's host (no scheme, port or DP suffix; IPv6 bracketed).
    pub host: &'a str,
    /// The registered bootstrap port; `None` is sent as JSON `null` (the engine then uses its
    /// own `--disaggregation-bootstrap-port`).
    pub port: Option<u16>,
}

/// Which leg a body is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leg {
    Prefill,
    Decode,
}

/// DP ranks of the chosen workers, when known (`--dp-aware`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DpRanks {
    pub prefill: Option<u32>,
    pub decode: Option<u32>,
}

/// The SGLang leg body: the client JSON minus [`CLIENT_FORBIDDEN_KEYS`], plus `bootstrap_host`
/// (string), `bootstrap_port` (integer or null) and `bootstrap_room` (integer) — or, for
/// `Rooms::Batch` of n rooms, three arrays of length n (host repeated, port repeated, rooms).
/// DP keys when known: prefill leg `routed_dp_rank: p`; decode leg `disagg_prefill_dp_rank: p`
/// and `routed_dp_rank: d`.
pub fn leg_body(
    body: &[u8],
    top: &TopLevel,
    target: &BootstrapTarget,
    rooms: &Rooms,
    leg: Leg,
    dp: &DpRanks,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 160);
    leg_body_into(&mut out, body, top, target, rooms, leg, dp, &[]);
    out
}

/// [`leg_body`] with further top-level keys set (`extra`, e.g. the canonical `model`), into any
/// [`Sink`]: a `Vec` (one copy), or a [`crate::body::PartsSink`] (the client's bytes uncopied).
#[allow(clippy::too_many_arguments)]
pub fn leg_body_into<S: Sink>(
    out: &mut S,
    body: &[u8],
    top: &TopLevel,
    target: &BootstrapTarget,
    rooms: &Rooms,
    leg: Leg,
    dp: &DpRanks,
    extra: &[(&str, &[u8])],
) {
    let n = rooms.as_slice().len();
    let mut scratch = Vec::with_capacity((target.host.len() + 30) * n.max(1) + 64);
    let host = push_value(&mut scratch, rooms, |out| {
        json::push_string(out, target.host)
    });
    let port = push_value(&mut scratch, rooms, |out| match target.port {
        Some(p) => json::push_u64(out, u64::from(p)),
        None => out.extend_from_slice(b"null"),
    });
    let room = {
        let start = scratch.len();
        match rooms {
            Rooms::Single(r) => json::push_u64(&mut scratch, *r),
            Rooms::Batch(rs) => {
                push_array(&mut scratch, rs.len(), |out, i| json::push_u64(out, rs[i]))
            }
        }
        start..scratch.len()
    };
    let mut dp_values: [(&str, Option<u32>); 2] = [("", None), ("", None)];
    match leg {
        Leg::Prefill => dp_values[0] = (ROUTED_DP_RANK, dp.prefill),
        Leg::Decode => {
            dp_values[0] = (DISAGG_PREFILL_DP_RANK, dp.prefill);
            dp_values[1] = (ROUTED_DP_RANK, dp.decode);
        }
    }
    let dp_ranges: Vec<(&str, Range<usize>)> = dp_values
        .iter()
        .filter_map(|(key, rank)| {
            let rank = (*rank)?;
            let start = scratch.len();
            json::push_u64(&mut scratch, u64::from(rank));
            Some((*key, start..scratch.len()))
        })
        .collect();

    let mut set: Vec<(&str, &[u8])> = Vec::with_capacity(5 + extra.len());
    set.extend_from_slice(extra);
    set.push((BOOTSTRAP_HOST, &scratch[host]));
    set.push((BOOTSTRAP_PORT, &scratch[port]));
    set.push((BOOTSTRAP_ROOM, &scratch[room]));
    for (key, range) in &dp_ranges {
        set.push((key, &scratch[range.clone()]));
    }
    rewrite_into(out, body, top, CLIENT_FORBIDDEN_KEYS, &set)
}

/// Writes one scalar (single room) or that scalar repeated per room (batch); returns its range.
fn push_value(
    scratch: &mut Vec<u8>,
    rooms: &Rooms,
    mut scalar: impl FnMut(&mut Vec<u8>),
) -> Range<usize> {
    let start = scratch.len();
    match rooms {
        Rooms::Single(_) => scalar(scratch),
        Rooms::Batch(rs) => push_array(scratch, rs.len(), |out, _| scalar(out)),
    }
    start..scratch.len()
}

fn push_array(out: &mut Vec<u8>, n: usize, mut item: impl FnMut(&mut Vec<u8>, usize)) {
    out.push(b'[');
    for i in 0..n {
        if i > 0 {
            out.push(b',');
        }
        item(out, i);
    }
    out.push(b']');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::body::scan_object;
    use serde_json::{json, Value};

    const TARGET: BootstrapTarget = BootstrapTarget {
        host: "10.0.0.5",
        port: Some(8998),
    };

    fn leg(body: &str, rooms: &Rooms, leg_: Leg, dp: &DpRanks) -> (Vec<u8>, Value) {
        let top = scan_object(body.as_bytes()).unwrap();
        let out = leg_body(body.as_bytes(), &top, &TARGET, rooms, leg_, dp);
        let v = serde_json::from_slice(&out).unwrap();
        (out, v)
    }

    #[test]
    fn single_request_gets_scalar_bootstrap_fields() {
        let (_, v) = leg(
            r#"{"text":"hi"}"#,
            &Rooms::Single(7311938215512217017),
            Leg::Prefill,
            &DpRanks::default(),
        );
        assert_eq!(
            v,
            json!({"text":"hi","bootstrap_host":"10.0.0.5","bootstrap_port":8998,
                "bootstrap_room":7311938215512217017u64})
        );
    }

    #[test]
    fn rooms_are_exact_integers() {
        let room = i64::MAX as u64;
        let (out, _) = leg("{}", &Rooms::Single(room), Leg::Decode, &DpRanks::default());
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("\"bootstrap_room\":9223372036854775807"),
            "{text}"
        );
    }

    #[test]
    fn missing_port_is_null() {
        let body = br#"{"a":1}"#;
        let top = scan_object(body).unwrap();
        let target = BootstrapTarget {
            host: "p",
            port: None,
        };
        let out = leg_body(
            body,
            &top,
            &target,
            &Rooms::Single(1),
            Leg::Prefill,
            &DpRanks::default(),
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["bootstrap_port"], Value::Null);
        assert!(v.as_object().unwrap().contains_key("bootstrap_port"));
    }

    #[test]
    fn host_is_an_escaped_json_string() {
        let body = b"{}";
        let top = scan_object(body).unwrap();
        let target = BootstrapTarget {
            host: "[::1]\"x",
            port: Some(1),
        };
        let out = leg_body(
            body,
            &top,
            &target,
            &Rooms::Single(1),
            Leg::Prefill,
            &DpRanks::default(),
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["bootstrap_host"], "[::1]\"x");
    }

    #[test]
    fn batch_rooms_are_arrays_of_equal_length() {
        let rooms = Rooms::Batch(vec![1, 2, 3]);
        let (_, v) = leg(
            r#"{"input_ids":[[1,2],[3,4],[5,6]]}"#,
            &rooms,
            Leg::Decode,
            &DpRanks::default(),
        );
        assert_eq!(
            v["bootstrap_host"],
            json!(["10.0.0.5", "10.0.0.5", "10.0.0.5"])
        );
        assert_eq!(v["bootstrap_port"], json!([8998, 8998, 8998]));
        assert_eq!(v["bootstrap_room"], json!([1, 2, 3]));
    }

    #[test]
    fn batch_of_one_is_still_arrays() {
        let (_, v) = leg(
            "{}",
            &Rooms::Batch(vec![9]),
            Leg::Prefill,
            &DpRanks::default(),
        );
        assert_eq!(v["bootstrap_room"], json!([9]));
        assert_eq!(v["bootstrap_host"], json!(["10.0.0.5"]));
    }

    #[test]
    fn sglang_legs_share_one_room_and_differ_only_in_dp_keys() {
        let body = r#"{"text":"hi","stream":true}"#;
        let dp = DpRanks {
            prefill: Some(1),
            decode: Some(0),
        };
        let (_, p) = leg(body, &Rooms::Single(42), Leg::Prefill, &dp);
        let (_, d) = leg(body, &Rooms::Single(42), Leg::Decode, &dp);
        assert_eq!(p["bootstrap_room"], d["bootstrap_room"]);
        assert_eq!(p["routed_dp_rank"], 1);
        assert!(p.get("disagg_prefill_dp_rank").is_none());
        assert_eq!(d["disagg_prefill_dp_rank"], 1);
        assert_eq!(d["routed_dp_rank"], 0);
    }

    #[test]
    fn decode_without_known_decode_rank_gets_only_prefill_rank() {
        let dp = DpRanks {
            prefill: Some(3),
            decode: None,
        };
        let (_, d) = leg("{}", &Rooms::Single(1), Leg::Decode, &dp);
        assert_eq!(d["disagg_prefill_dp_rank"], 3);
        assert!(d.get("routed_dp_rank").is_none());
    }

    #[test]
    fn no_dp_keys_without_ranks() {
        let (_, p) = leg("{}", &Rooms::Single(1), Leg::Prefill, &DpRanks::default());
        assert!(p.get("routed_dp_rank").is_none());
    }

    #[test]
    fn client_bootstrap_and_handoff_keys_are_replaced() {
        let body = r#"{"bootstrap_room":5,"bootstrap_host":"evil","bootstrap_port":1,
            "routed_dp_rank":9,"disagg_prefill_dp_rank":9,"data_parallel_rank":9,"kv_transfer_params":{},
            "bootstrap_r\u006fom":6,"text":"x"}"#;
        let (out, v) = leg(body, &Rooms::Single(77), Leg::Prefill, &DpRanks::default());
        assert_eq!(
            v,
            json!({"text":"x","bootstrap_host":"10.0.0.5","bootstrap_port":8998,
                "bootstrap_room":77})
        );
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("bootstrap_room").count(), 1);
    }

    #[test]
    fn untouched_entries_stay_byte_identical_and_in_order() {
        let body =
            r#"{"z": 1.50, "sampling_params" : {"max_new_tokens":16, "temperature":0},"a":"é"}"#;
        let (out, _) = leg(body, &Rooms::Single(1), Leg::Prefill, &DpRanks::default());
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with(
            r#"{"z": 1.50,"sampling_params" : {"max_new_tokens":16, "temperature":0},"a":"é","#
        ));
    }

    #[test]
    fn extra_keys_replace_client_values() {
        let body = br#"{"model":"alias","x":1}"#;
        let top = scan_object(body).unwrap();
        let mut out = Vec::new();
        leg_body_into(
            &mut out,
            body,
            &top,
            &TARGET,
            &Rooms::Single(1),
            Leg::Prefill,
            &DpRanks::default(),
            &[("model", b"\"canonical\"")],
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "canonical");
        assert_eq!(v["x"], 1);
    }

    #[test]
    fn room_from_bits_clears_the_top_bit() {
        assert_eq!(room_from_bits(u64::MAX), i64::MAX as u64);
        assert_eq!(room_from_bits(1 << 63), 0);
        assert_eq!(room_from_bits(12345), 12345);
    }

    #[test]
    fn mint_draws_one_room_per_item() {
        let mut next = 0u64;
        let mut bits = || {
            next += 1;
            next | (1 << 63)
        };
        assert_eq!(Rooms::mint(None, &mut bits), Rooms::Single(1));
        assert_eq!(Rooms::mint(Some(3), &mut bits), Rooms::Batch(vec![2, 3, 4]));
        assert_eq!(Rooms::Batch(vec![2, 3]).as_slice(), &[2, 3]);
        assert_eq!(Rooms::Single(5).as_slice(), &[5]);
    }
}
