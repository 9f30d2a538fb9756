//! SGLang `leg_body` / `leg_body_into`: single and batch rooms, both legs, DP ranks, any
//! bootstrap host and port, on any client object.
//!
//! Input: 8 control bytes, then the client body.
//! * c0: bit0 decode leg, bit1 prefill DP rank, bit2 decode DP rank, bit3 port known, bit4 batch,
//!   bit5 extra `model` set, bits6-7 unused
//! * c1: batch size (0..=255); c2-c3: port; c4: prefill rank; c5: decode rank; c6: host choice;
//!   c7: seed of the room bits
//!
//! Properties: the leg is the client object minus every client handoff/DP key (escaped spellings
//! included) plus exactly one `bootstrap_host`/`bootstrap_port`/`bootstrap_room` (arrays of the
//! batch length for a batch) and the DP keys of that leg; every other entry byte-identical and
//! in order; rooms within the engines' signed 64-bit range.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::handoff::sglang::{
    leg_body_into, BootstrapTarget, DpRanks, Leg, Rooms, BOOTSTRAP_HOST, BOOTSTRAP_PORT,
    BOOTSTRAP_ROOM, CLIENT_FORBIDDEN_KEYS, DISAGG_PREFILL_DP_RANK, ROUTED_DP_RANK,
};
use pdgate_filters::scan_object;
use pdgate_filters_fuzz::{assert_rewritten, parse_object, split_control, TRICKY_STRINGS};
use serde_json::{json, Value};

fuzz_target!(|data: &[u8]| {
    let (c, body) = split_control::<8>(data);
    let Ok(top) = scan_object(body) else { return };
    let leg = if c[0] & 1 != 0 {
        Leg::Decode
    } else {
        Leg::Prefill
    };
    let dp = DpRanks {
        prefill: (c[0] & 2 != 0).then_some(u32::from(c[4])),
        decode: (c[0] & 4 != 0).then_some(u32::from(c[5]) << 24 | 0xff),
    };
    let port = (c[0] & 8 != 0).then_some(u16::from_be_bytes([c[2], c[3]]));
    let host = TRICKY_STRINGS[usize::from(c[6]) % TRICKY_STRINGS.len()];
    let target = BootstrapTarget { host, port };
    let mut state = u64::from(c[7]).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let bits = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let batch = (c[0] & 16 != 0).then_some(usize::from(c[1]));
    let rooms = Rooms::mint(batch, bits);
    let extra: &[(&str, &[u8])] = if c[0] & 32 != 0 {
        &[("model", b"\"canonical\"")]
    } else {
        &[]
    };

    let mut out = Vec::new();
    leg_body_into(&mut out, body, &top, &target, &rooms, leg, &dp, extra);

    // The exact set the gateway adds, built here from the documented contract.
    let per_item = |v: Value| match &rooms {
        Rooms::Single(_) => v,
        Rooms::Batch(rs) => Value::Array(vec![v; rs.len()]),
    };
    let host_v = per_item(json!(host));
    let port_v = per_item(port.map_or(Value::Null, |p| json!(p)));
    let room_v = match &rooms {
        Rooms::Single(r) => json!(r),
        Rooms::Batch(rs) => json!(rs),
    };
    let mut set: Vec<(&str, Vec<u8>)> = extra.iter().map(|(k, v)| (*k, v.to_vec())).collect();
    set.push((BOOTSTRAP_HOST, host_v.to_string().into_bytes()));
    set.push((BOOTSTRAP_PORT, port_v.to_string().into_bytes()));
    set.push((BOOTSTRAP_ROOM, room_v.to_string().into_bytes()));
    let (first, second) = match leg {
        Leg::Prefill => ((ROUTED_DP_RANK, dp.prefill), ("", None)),
        Leg::Decode => (
            (DISAGG_PREFILL_DP_RANK, dp.prefill),
            (ROUTED_DP_RANK, dp.decode),
        ),
    };
    for (k, rank) in [first, second] {
        if let Some(r) = rank {
            set.push((k, r.to_string().into_bytes()));
        }
    }
    let set: Vec<(&str, &[u8])> = set.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    assert_rewritten(body, &top, &out, CLIENT_FORBIDDEN_KEYS, &set);

    let leg_obj = parse_object(&out, "leg body");
    for room in rooms.as_slice() {
        assert!(*room <= i64::MAX as u64, "room {room} overflows i64");
    }
    if let Rooms::Batch(rs) = &rooms {
        for k in [BOOTSTRAP_HOST, BOOTSTRAP_PORT, BOOTSTRAP_ROOM] {
            let len = leg_obj[k].as_array().map(Vec::len);
            assert_eq!(
                len,
                Some(rs.len()),
                "{k} is not an array of the batch length"
            );
        }
    }
});
