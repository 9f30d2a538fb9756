//! `BodyDecoder` (leg response framing) on arbitrary bytes under arbitrary chunkings.
//!
//! Input: c0 picks the framing (chunked / length / until-close; the length is c1..c3), c4 the
//! number k of chunk-length bytes (mod 16), then k chunk lengths, then the wire bytes.
//!
//! Properties: never panics; the error (if any), done-ness and (for valid framing) the decoded
//! payload are the same whether the wire arrives whole, byte by byte, or in the given chunks;
//! a Length body never yields more than its length.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use pdgate_filters::framing::{BodyDecoder, Framing, FramingError};

type Outcome = (Vec<u8>, Option<FramingError>, bool, Vec<u8>);

fn run(framing: Framing, pieces: &[&[u8]]) -> Outcome {
    let mut d = BodyDecoder::new(framing);
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for p in pieces {
        buf.extend_from_slice(p);
        match d.decode(&mut buf) {
            Ok(b) => out.extend_from_slice(&b),
            Err(e) => return (out, Some(e), d.is_done(), Vec::new()),
        }
        if d.is_done() {
            break;
        }
    }
    (out, None, d.is_done(), buf.to_vec())
}

fn chunks<'a>(stream: &'a [u8], lens: &[u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < stream.len() {
        let len = lens
            .get(i % lens.len().max(1))
            .map_or(1, |&l| usize::from(l).max(1));
        let end = (at + len).min(stream.len());
        out.push(&stream[at..end]);
        at = end;
        i += 1;
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 5 {
        return;
    }
    let length = u64::from(u32::from_le_bytes([data[1], data[2], data[3], 0]));
    let framing = match data[0] % 3 {
        0 => Framing::Chunked,
        1 => Framing::Length(length),
        _ => Framing::UntilClose,
    };
    let k = usize::from(data[4] % 16).min(data.len() - 5);
    let lens = &data[5..5 + k];
    let wire = &data[5 + k..];

    let whole = run(framing, &[wire]);
    let bytewise: Vec<&[u8]> = wire.chunks(1).collect();
    let chunked = chunks(wire, lens);
    for other in [run(framing, &bytewise), run(framing, &chunked)] {
        // A decoder that stops at the body's end leaves the rest of the later pieces unfed:
        // compare error and done-ness, and the payload when the framing was valid (a broken
        // body is dropped whole, so how much of it came out before the error is moot).
        if whole.1.is_none() {
            assert_eq!(whole.0, other.0, "payload depends on chunking");
        }
        assert_eq!(whole.1, other.1, "error depends on chunking");
        assert_eq!(whole.2, other.2, "done-ness depends on chunking");
    }
    if let Framing::Length(n) = framing {
        assert!(whole.0.len() as u64 <= n);
    }
});
