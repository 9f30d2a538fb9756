//! `SseSplitter` + `DoneDetector` (+ `event_data`/`is_done_event`) under arbitrary chunkings.
//!
//! Input: c0 = number of chunk-length bytes k (mod 16), then k chunk lengths, then the stream.
//! The stream is fed whole, byte by byte, and in chunks of the given lengths (cycled; 0 = 1).
//!
//! Properties: the splitter's events and leftover are the same for every chunking; events plus
//! leftover concatenate back to the input; every event ends at a blank line (LF, CRLF or CR);
//! the detector's answer is the same for every chunking, agrees with `is_done_event` over the
//! split events (the final CR settled), and once true stays true.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pdgate_filters::sse::{event_data, is_done_event, DoneDetector, SseSplitter};

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

fn split(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
    let mut s = SseSplitter::new();
    let mut out = Vec::new();
    for c in chunks {
        s.push(c, &mut out);
    }
    let rest = s.finish();
    assert_eq!(s.finish(), None, "finish does not reset");
    (out, rest)
}

fn detect(chunks: &[&[u8]]) -> bool {
    let mut d = DoneDetector::new();
    let mut seen = false;
    for c in chunks {
        let now = d.feed(c);
        assert!(!seen || now, "DoneDetector went from done to not done");
        seen = now;
    }
    assert_eq!(d.is_done(), seen);
    seen
}

/// Whether an event is lines, each terminated (LF, CRLF or CR), the last and only the last one
/// empty: exactly what ends an event.
fn is_one_event(e: &[u8]) -> bool {
    let mut rest = e;
    let mut lines = Vec::new();
    while !rest.is_empty() {
        let Some(p) = rest.iter().position(|&b| b == b'\n' || b == b'\r') else {
            return false; // an unterminated last line
        };
        let term = if rest[p] == b'\r' && rest.get(p + 1) == Some(&b'\n') {
            2
        } else {
            1
        };
        lines.push(&rest[..p]);
        rest = &rest[p + term..];
    }
    lines.last().is_some_and(|l| l.is_empty())
        && lines[..lines.len() - 1].iter().all(|l| !l.is_empty())
}

fuzz_target!(|data: &[u8]| {
    let k = data.first().map_or(0, |b| usize::from(b % 16));
    let lens = data.get(1..(1 + k).min(data.len())).unwrap_or_default();
    let stream = data.get(1 + k..).unwrap_or_default();

    let whole = split(&[stream]);
    let bytewise: Vec<&[u8]> = stream.chunks(1).collect();
    let chunked = chunks(stream, lens);
    assert_eq!(
        split(&bytewise),
        whole,
        "splitter depends on chunking (byte by byte)"
    );
    assert_eq!(split(&chunked), whole, "splitter depends on chunking");
    let mut joined: Vec<u8> = whole.0.concat();
    joined.extend(whole.1.clone().unwrap_or_default());
    assert_eq!(joined, stream, "events + leftover are not the input");
    for e in &whole.0 {
        assert!(
            is_one_event(e),
            "not exactly one event ending at a blank line: {e:?}"
        );
        let _ = event_data(e);
    }

    let done = detect(&[stream]);
    assert_eq!(
        detect(&bytewise),
        done,
        "DoneDetector depends on chunking (byte by byte)"
    );
    assert_eq!(detect(&chunked), done, "DoneDetector depends on chunking");
    // A trailing byte settles a final CR, which the splitter otherwise holds back.
    let mut settled = stream.to_vec();
    settled.push(b'x');
    let (events, _) = split(&[&settled]);
    assert_eq!(
        events.iter().any(|e| is_done_event(e)),
        done,
        "DoneDetector disagrees with is_done_event"
    );
});
