//! Server-sent events as the engines stream them: splitting a byte stream into events, spotting
//! the terminal `data: [DONE]` event cheaply, and reading an event's `data`. Line endings follow
//! the SSE spec (LF, CRLF or CR); an event ends at an empty line.

use std::borrow::Cow;

/// The terminal event's data.
pub const DONE: &[u8] = b"[DONE]";

/// Incremental event splitter: push chunks of any size, get complete events, each with its
/// terminating blank line. Concatenating every event and [`SseSplitter::finish`]'s leftover
/// gives back the input exactly, whatever the chunking.
#[derive(Debug, Default)]
pub struct SseSplitter {
    buf: Vec<u8>,
    /// Next byte not yet examined.
    scan: usize,
    /// Start of the line being read.
    line_start: usize,
}

impl SseSplitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `chunk` and moves every event it completes into `out`, in order.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Vec<u8>>) {
        self.buf.extend_from_slice(chunk);
        let mut event_start = 0;
        let len = self.buf.len();
        let mut i = self.scan;
        // Where the next push resumes: past everything examined, or at an undecided final CR.
        let mut resume = len;
        while let Some(p) = self.buf[i..].iter().position(|&b| b == b'\n' || b == b'\r') {
            let pos = i + p;
            let term = if self.buf[pos] == b'\n' {
                1
            } else if pos + 1 < len {
                if self.buf[pos + 1] == b'\n' {
                    2
                } else {
                    1
                }
            } else {
                // A CR as the last byte may be the start of a CRLF: wait for the next byte.
                resume = pos;
                break;
            };
            let after = pos + term;
            if pos == self.line_start {
                out.push(self.buf[event_start..after].to_vec());
                event_start = after;
            }
            self.line_start = after;
            i = after;
        }
        self.scan = resume;
        if event_start > 0 {
            self.buf.drain(..event_start);
            self.scan -= event_start;
            self.line_start -= event_start;
        }
    }

    /// Ends the stream: the bytes of an unterminated last event, if any.
    pub fn finish(&mut self) -> Option<Vec<u8>> {
        self.scan = 0;
        self.line_start = 0;
        if self.buf.is_empty() {
            None
        } else {
            Some(std::mem::take(&mut self.buf))
        }
    }
}

/// Streaming detector of the terminal `data: [DONE]` event: true once an event whose data is
/// exactly `[DONE]` has been ended by its blank line. It keeps O(1) state (a 16-byte line
/// prefix), so it never buffers the stream, and its answer does not depend on the chunking.
/// `[DONE]` inside a JSON payload never triggers: it is not a whole `data:` line there.
#[derive(Debug, Default)]
pub struct DoneDetector {
    done: bool,
    line: [u8; 16],
    line_len: usize,
    line_overflow: bool,
    after_cr: bool,
    /// `data` lines in the current event (saturating at 2) and whether the first was `[DONE]`.
    data_lines: u8,
    first_data_done: bool,
}

impl DoneDetector {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next chunk; true once the terminal event has been seen (and from then on).
    /// Each line's end is found with `memchr2` (a blank line, the one ending each event, without
    /// a search); a line that starts and ends in this chunk is read where it lies, and only a
    /// line cut by the chunk's end keeps its first 16 bytes for the next chunk.
    pub fn feed(&mut self, chunk: &[u8]) -> bool {
        let mut rest = chunk;
        while !rest.is_empty() && !self.done {
            if self.after_cr {
                // A CR LF pair is one line end.
                self.after_cr = false;
                if rest[0] == b'\n' {
                    rest = &rest[1..];
                    continue;
                }
            }
            let end = match rest[0] {
                b'\n' | b'\r' => Some(0),
                _ => memchr::memchr2(b'\n', b'\r', rest),
            };
            let Some(at) = end else {
                self.keep(rest);
                break;
            };
            if self.line_len == 0 && !self.line_overflow {
                let kept = &rest[..at.min(self.line.len())];
                self.end_line(kept, at > kept.len());
            } else {
                self.keep(&rest[..at]);
                let kept = self.line;
                self.end_line(&kept[..self.line_len], self.line_overflow);
            }
            self.after_cr = rest[at] == b'\r';
            rest = &rest[at + 1..];
        }
        self.done
    }

    /// Adds bytes of a line cut by a chunk's end: the first 16 are kept (a long `data:` line
    /// still counts as one of the event's data lines), more mark the line as too long to be
    /// `[DONE]`.
    fn keep(&mut self, bytes: &[u8]) {
        if self.line_overflow {
            return;
        }
        let room = self.line.len() - self.line_len;
        let kept = bytes.len().min(room);
        self.line[self.line_len..self.line_len + kept].copy_from_slice(&bytes[..kept]);
        self.line_len += kept;
        self.line_overflow = bytes.len() > room;
    }

    /// Whether the terminal event has been seen.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// A line has ended: `line` is its first 16 bytes at most, `overflow` whether it was longer.
    fn end_line(&mut self, line: &[u8], overflow: bool) {
        if line.is_empty() && !overflow {
            if self.data_lines == 1 && self.first_data_done {
                self.done = true;
            }
            self.data_lines = 0;
            self.first_data_done = false;
        } else {
            let value = if line == b"data" && !overflow {
                Some(&b""[..])
            } else {
                line.strip_prefix(b"data:")
            };
            if let Some(value) = value {
                let value = value.strip_prefix(b" ").unwrap_or(value);
                if self.data_lines == 0 {
                    self.first_data_done = value == DONE && !overflow;
                }
                self.data_lines = self.data_lines.saturating_add(1).min(2);
            }
        }
        self.line_len = 0;
        self.line_overflow = false;
    }
}

/// Splits an event into its lines (without terminators), per the SSE line-ending rules.
fn lines(event: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = event;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
            None => {
                let line = rest;
                rest = &[];
                Some(line)
            }
            Some(p) => {
                let line = &rest[..p];
                let term = if rest[p] == b'\r' && rest.get(p + 1) == Some(&b'\n') {
                    2
                } else {
                    1
                };
                rest = &rest[p + term..];
                Some(line)
            }
        }
    })
}

/// The value of a `data` line (one leading space removed), or `None` for other lines.
fn data_value(line: &[u8]) -> Option<&[u8]> {
    if line == b"data" {
        return Some(b"");
    }
    let value = line.strip_prefix(b"data:")?;
    Some(value.strip_prefix(b" ").unwrap_or(value))
}

/// The payload of an event's `data:` lines (several joined with `\n`), or `None` when it has
/// none (a comment, a keep-alive, only `event:`/`id:` fields).
pub fn event_data(event: &[u8]) -> Option<Cow<'_, [u8]>> {
    let mut values = lines(event).filter_map(data_value);
    let first = values.next()?;
    let Some(second) = values.next() else {
        return Some(Cow::Borrowed(first));
    };
    let mut joined = Vec::with_capacity(event.len());
    joined.extend_from_slice(first);
    joined.push(b'\n');
    joined.extend_from_slice(second);
    for v in values {
        joined.push(b'\n');
        joined.extend_from_slice(v);
    }
    Some(Cow::Owned(joined))
}

/// `data: <json>\n\n` on one `data:` line: line breaks in the JSON (whitespace outside its
/// strings, where JSON allows none) become spaces.
pub fn data_event(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend(
        json.iter()
            .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\n\n");
    out
}

/// Whether an event is the terminal `data: [DONE]`.
pub fn is_done_event(event: &[u8]) -> bool {
    event_data(event).as_deref() == Some(DONE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, Option<Vec<u8>>) {
        let mut s = SseSplitter::new();
        let mut out = Vec::new();
        for c in chunks {
            s.push(c, &mut out);
        }
        (out, s.finish())
    }

    #[test]
    fn splits_several_events_in_one_chunk() {
        let (events, rest) = split_all(&[b"data: a\n\ndata: b\n\n"]);
        assert_eq!(events, [b"data: a\n\n".to_vec(), b"data: b\n\n".to_vec()]);
        assert_eq!(rest, None);
    }

    #[test]
    fn joins_an_event_split_across_chunks() {
        let (events, rest) = split_all(&[b"da", b"ta: {\"x\"", b":1}\n", b"\nda"]);
        assert_eq!(events, [b"data: {\"x\":1}\n\n".to_vec()]);
        assert_eq!(rest, Some(b"da".to_vec()));
    }

    #[test]
    fn accepts_crlf_and_cr_line_endings() {
        let (events, rest) = split_all(&[b"data: a\r\n\r\ndata: b\r\rdata: c\n\r\n"]);
        assert_eq!(
            events,
            [
                b"data: a\r\n\r\n".to_vec(),
                b"data: b\r\r".to_vec(),
                b"data: c\n\r\n".to_vec()
            ]
        );
        assert_eq!(rest, None);
    }

    #[test]
    fn crlf_split_between_chunks_is_one_line_ending() {
        let (events, rest) = split_all(&[b"data: a\r", b"\n\r", b"\n"]);
        assert_eq!(events, [b"data: a\r\n\r\n".to_vec()]);
        assert_eq!(rest, None);
    }

    #[test]
    fn trailing_cr_waits_for_the_next_byte() {
        let mut s = SseSplitter::new();
        let mut out = Vec::new();
        s.push(b"data: a\r\r", &mut out);
        assert!(out.is_empty());
        s.push(b"data: b", &mut out);
        assert_eq!(out, [b"data: a\r\r".to_vec()]);
        assert_eq!(s.finish(), Some(b"data: b".to_vec()));
    }

    #[test]
    fn leading_blank_line_is_its_own_event() {
        let (events, _) = split_all(&[b"\ndata: a\n\n"]);
        assert_eq!(events, [b"\n".to_vec(), b"data: a\n\n".to_vec()]);
    }

    #[test]
    fn finish_on_empty_is_none_and_resets() {
        let mut s = SseSplitter::new();
        assert_eq!(s.finish(), None);
        let mut out = Vec::new();
        s.push(b"x", &mut out);
        assert_eq!(s.finish(), Some(b"x".to_vec()));
        assert_eq!(s.finish(), None);
    }

    #[test]
    fn event_data_reads_single_and_multi_line_data() {
        assert_eq!(
            event_data(b"data: {\"a\":1}\n\n").unwrap().as_ref(),
            b"{\"a\":1}"
        );
        assert!(matches!(
            event_data(b"data:x\n\n"),
            Some(Cow::Borrowed(b"x"))
        ));
        assert_eq!(
            event_data(b"event: e\ndata: a\r\ndata:  b\rid: 1\n\n")
                .unwrap()
                .as_ref(),
            b"a\n b"
        );
        assert_eq!(event_data(b"data\n\n").unwrap().as_ref(), b"");
    }

    #[test]
    fn event_data_is_none_without_data_lines() {
        assert_eq!(event_data(b": keep-alive\n\n"), None);
        assert_eq!(event_data(b"event: ping\n\n"), None);
        assert_eq!(event_data(b"\n"), None);
        assert_eq!(event_data(b"datum: x\n\n"), None);
    }

    #[test]
    fn is_done_event_needs_exact_done_data() {
        assert!(is_done_event(b"data: [DONE]\n\n"));
        assert!(is_done_event(b"data:[DONE]\r\n\r\n"));
        assert!(!is_done_event(b"data: [DONE] \n\n"));
        assert!(!is_done_event(b"data: {\"t\":\"data: [DONE]\"}\n\n"));
        assert!(!is_done_event(b"data: [DONE]\ndata: [DONE]\n\n"));
        assert!(!is_done_event(b": [DONE]\n\n"));
    }

    fn detect(chunks: &[&[u8]]) -> bool {
        let mut d = DoneDetector::new();
        let mut seen = false;
        for c in chunks {
            seen = d.feed(c);
        }
        seen
    }

    #[test]
    fn done_is_detected_after_its_blank_line() {
        assert!(detect(&[b"data: x\n\ndata: [DONE]\n\n"]));
        assert!(!detect(&[b"data: x\n\ndata: [DONE]\n"]));
        assert!(detect(&[b"data:[DONE]\r\n\r\n"]));
        assert!(detect(&[b"data: [DONE]\r\r"]));
    }

    #[test]
    fn done_split_across_chunks_is_detected() {
        assert!(detect(&[b"data: [DO", b"NE]\n", b"\n"]));
        assert!(detect(&[b"data: [DONE]\r", b"\n\r", b"\n"]));
    }

    #[test]
    fn crlf_split_after_done_is_not_a_blank_line() {
        let mut d = DoneDetector::new();
        assert!(!d.feed(b"data: [DONE]\r"));
        assert!(!d.feed(b"\n"));
        assert!(d.feed(b"\r\n"));
    }

    #[test]
    fn done_inside_json_string_does_not_end_stream() {
        assert!(!detect(&[
            b"data: {\"delta\":\"data: [DONE]\\n\\n\"}\n\n",
            b"data: {\"x\":\"[DONE]\"}\n\n"
        ]));
    }

    #[test]
    fn done_not_at_line_start_does_not_count() {
        assert!(!detect(&[b"xdata: [DONE]\n\n"]));
        assert!(!detect(&[b" data: [DONE]\n\n"]));
    }

    #[test]
    fn done_with_a_second_data_line_is_not_terminal() {
        assert!(!detect(&[b"data: [DONE]\ndata: more\n\n"]));
        assert!(!detect(&[b"data: x\ndata: [DONE]\n\n"]));
    }

    #[test]
    fn done_after_event_and_id_fields_counts() {
        assert!(detect(&[b"event: end\nid: 3\ndata: [DONE]\n\n"]));
    }

    #[test]
    fn the_answer_does_not_depend_on_the_chunking() {
        // Each stream with the answer for the whole of it.
        let streams: [(&[u8], bool); 9] = [
            (b"data: x\n\ndata: [DONE]\n\n", true),
            (b"data: x\r\n\r\ndata: [DONE]\r\n\r\n", true),
            (b"data: [DONE]\r\rtrailing", true),
            (b"data: [DONE]\r\n\n", true),
            (b"data: [DONE]\ndata: more\n\n", false),
            (b"data: 0123456789abcdef\n\ndata:[DONE]\n\n", true),
            (b"data: [DONE]xxxxxxxxxxxxxxxx\n\n", false),
            // A long first data line is still a data line: `[DONE]` is then the event's second.
            (b"data: data: data: \ndata: [DONE]\n\n", false),
            (b"event: end\r\nid: 3\r\ndata: [DONE]\r\n\r\n", true),
        ];
        for (stream, done) in streams {
            assert_eq!(detect(&[stream]), done, "{stream:?}");
            let bytes: Vec<&[u8]> = stream.chunks(1).collect();
            assert_eq!(detect(&bytes), done, "{stream:?} byte by byte");
            for at in 0..=stream.len() {
                let (a, b) = stream.split_at(at);
                assert_eq!(detect(&[a, b]), done, "{stream:?} split at {at}");
            }
        }
    }

    #[test]
    fn long_lines_are_skipped_without_buffering() {
        let long = vec![b'a'; 10_000];
        let mut d = DoneDetector::new();
        d.feed(b"data: ");
        d.feed(&long);
        assert!(!d.feed(b"\n\n"));
        assert!(d.feed(b"data: [DONE]\n\n"));
        assert!(d.is_done());
        assert!(d.feed(b"anything"));
    }
}
