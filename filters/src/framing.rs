//! HTTP/1.1 response body framing for the legs: `Content-Length`, `chunked`, or read until the
//! engine closes (RFC 9112 §6.3, §7.1).
//!
//! The decoder works on whatever bytes have arrived and hands back all the payload they hold in
//! one piece, so a relay that reads once writes once: several SSE events that came in one read
//! leave in one write. A single payload run is split off the read buffer without a copy; runs
//! from several chunks are joined. Bytes past the end of the body are left in the buffer (the
//! caller must then not pool the connection). Hostile framing is an error, never a panic:
//! chunk-size lines and trailers are bounded, sizes cannot overflow, CRLF is required where the
//! grammar says so.

use bytes::{Buf, Bytes, BytesMut};

/// Longest chunk-size line (size, extensions, CRLF) or trailer line accepted.
pub const MAX_LINE: usize = 4096;
/// Most trailer bytes accepted after the last chunk.
pub const MAX_TRAILERS: usize = 16 * 1024;

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes (0: no body).
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the connection closes (no length; cannot be pooled).
    UntilClose,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FramingError {
    /// A chunk-size line that is not hex digits (with optional extensions) and CRLF.
    BadChunkSize,
    /// A chunk-size with more digits than a u64 holds.
    ChunkTooLarge,
    /// Chunk data not followed by CRLF.
    MissingCrlf,
    /// A chunk-size or trailer line longer than [`MAX_LINE`], or trailers past [`MAX_TRAILERS`].
    LineTooLong,
    /// The connection closed before the body's end.
    Truncated,
}

impl std::fmt::Display for FramingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FramingError::BadChunkSize => "malformed chunk size",
            FramingError::ChunkTooLarge => "chunk size overflows",
            FramingError::MissingCrlf => "chunk data not followed by CRLF",
            FramingError::LineTooLong => "chunk-size line or trailers too long",
            FramingError::Truncated => "connection closed before the end of the body",
        })
    }
}

impl std::error::Error for FramingError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// `Length`: bytes still to come.
    Remaining(u64),
    /// `Chunked`: expecting a chunk-size line.
    Size,
    /// `Chunked`: inside a chunk's data, bytes still to come.
    Data(u64),
    /// `Chunked`: expecting the CRLF after a chunk's data.
    DataEnd,
    /// `Chunked`: after the last chunk, reading trailer lines; bytes of trailers seen so far.
    Trailers(usize),
    UntilClose,
    Done,
}

/// Incremental body decoder (see the module doc).
#[derive(Debug, Clone)]
pub struct BodyDecoder {
    state: State,
}

impl BodyDecoder {
    pub fn new(framing: Framing) -> Self {
        let state = match framing {
            Framing::Length(0) => State::Done,
            Framing::Length(n) => State::Remaining(n),
            Framing::Chunked => State::Size,
            Framing::UntilClose => State::UntilClose,
        };
        BodyDecoder { state }
    }

    /// True once the whole body has been decoded.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Payload bytes still expected when the framing says so (`Content-Length`, or the rest of
    /// the current chunk): a hint for how much to read next.
    pub fn expected(&self) -> Option<u64> {
        match self.state {
            State::Remaining(n) | State::Data(n) => Some(n),
            _ => None,
        }
    }

    /// Consumes from `buf` all the framing and payload it holds and returns the payload (empty
    /// when `buf` holds no payload yet). Incomplete framing stays in `buf` for the next call.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Bytes, FramingError> {
        let mut out = Collect::default();
        let used = self.run(buf, &mut out)?;
        Ok(out.finish(buf, used))
    }

    /// Like [`BodyDecoder::decode`], but the payload is dropped instead of handed out: how many
    /// payload bytes were consumed. For a body read only to reach its end (a drained prefill):
    /// nothing is split off the buffer or joined.
    pub fn skip(&mut self, buf: &mut BytesMut) -> Result<usize, FramingError> {
        let mut skipped = 0usize;
        let used = self.run(buf, &mut skipped)?;
        buf.advance(used);
        Ok(skipped)
    }

    /// Walks the framing and payload at the front of `buf`, telling `out` where each run of
    /// payload lies, and returns how many bytes it consumed (framing and payload). The buffer
    /// itself is left for the caller to cut once: a read of many small chunks (an SSE burst)
    /// costs one cut, not three a chunk.
    fn run(&mut self, buf: &[u8], out: &mut impl Payload) -> Result<usize, FramingError> {
        let mut at = 0usize;
        loop {
            let rest = &buf[at..];
            match self.state {
                State::Done => break,
                State::UntilClose => {
                    out.take(buf, at, rest.len());
                    at = buf.len();
                    break;
                }
                State::Remaining(n) | State::Data(n) => {
                    if rest.is_empty() {
                        break;
                    }
                    let take = take_len(n, rest.len());
                    out.take(buf, at, take);
                    at += take;
                    let left = n - take as u64;
                    let chunked = matches!(self.state, State::Data(_));
                    self.state = match (left, chunked) {
                        (0, false) => State::Done,
                        (0, true) => State::DataEnd,
                        (left, false) => State::Remaining(left),
                        (left, true) => State::Data(left),
                    };
                    if left != 0 {
                        break;
                    }
                }
                State::DataEnd => {
                    if rest.len() < 2 {
                        if rest.first().is_some_and(|&b| b != b'\r') {
                            return Err(FramingError::MissingCrlf);
                        }
                        break;
                    }
                    if &rest[..2] != b"\r\n" {
                        return Err(FramingError::MissingCrlf);
                    }
                    at += 2;
                    self.state = State::Size;
                }
                State::Size => {
                    let Some(end) = find_crlf(rest, MAX_LINE)? else {
                        break;
                    };
                    let size = parse_chunk_size(&rest[..end])?;
                    at += end + 2;
                    self.state = if size == 0 {
                        State::Trailers(0)
                    } else {
                        State::Data(size)
                    };
                }
                State::Trailers(seen) => {
                    let Some(end) = find_crlf(rest, MAX_LINE)? else {
                        break;
                    };
                    let seen = seen + end + 2;
                    if seen > MAX_TRAILERS {
                        return Err(FramingError::LineTooLong);
                    }
                    at += end + 2;
                    self.state = if end == 0 {
                        State::Done
                    } else {
                        State::Trailers(seen)
                    };
                }
            }
        }
        Ok(at)
    }

    /// The connection reached end of file: `Ok` when that ends the body (`UntilClose`, or it
    /// was already complete), otherwise [`FramingError::Truncated`].
    pub fn finish(&mut self) -> Result<(), FramingError> {
        match self.state {
            State::UntilClose | State::Done => {
                self.state = State::Done;
                Ok(())
            }
            _ => Err(FramingError::Truncated),
        }
    }
}

fn take_len(want: u64, have: usize) -> usize {
    usize::try_from(want).map_or(have, |w| w.min(have))
}

/// Where the decoder puts the payload it finds: `take` is told that the `n` bytes of `buf` at
/// `at` are payload (the decoder cuts the buffer once, after the walk).
trait Payload {
    fn take(&mut self, buf: &[u8], at: usize, n: usize);
}

/// The payload handed out: a single run is split off the buffer (no copy when a read holds one
/// chunk); from the second run on they are joined, in one buffer sized for everything that can
/// still come out of this read, so a read of many small chunks (an SSE burst) is joined without
/// regrowing.
#[derive(Default)]
struct Collect {
    /// The first run: where it starts in the buffer, and its length.
    first: Option<(usize, usize)>,
    joined: Option<BytesMut>,
}

impl Payload for Collect {
    fn take(&mut self, buf: &[u8], at: usize, n: usize) {
        if n == 0 {
            return;
        }
        if let Some(j) = self.joined.as_mut() {
            j.extend_from_slice(&buf[at..at + n]);
        } else if let Some((f, len)) = self.first {
            let mut j = BytesMut::with_capacity(len + buf.len() - at);
            j.extend_from_slice(&buf[f..f + len]);
            j.extend_from_slice(&buf[at..at + n]);
            self.joined = Some(j);
        } else {
            self.first = Some((at, n));
        }
    }
}

impl Collect {
    /// The payload, with the `used` bytes at the front of `buf` cut off it.
    fn finish(self, buf: &mut BytesMut, used: usize) -> Bytes {
        match (self.first, self.joined) {
            (_, Some(j)) => {
                buf.advance(used);
                j.freeze()
            }
            (Some((at, len)), None) => {
                buf.advance(at);
                let piece = buf.split_to(len).freeze();
                buf.advance(used - at - len);
                piece
            }
            (None, None) => {
                buf.advance(used);
                Bytes::new()
            }
        }
    }
}

/// The payload dropped, counted.
impl Payload for usize {
    fn take(&mut self, _: &[u8], _: usize, n: usize) {
        *self += n;
    }
}

/// Index of the CRLF ending the line at the start of `buf`, `None` when it has not arrived
/// yet. A bare LF, or a line longer than `max`, is an error.
fn find_crlf(buf: &[u8], max: usize) -> Result<Option<usize>, FramingError> {
    let window = &buf[..buf.len().min(max)];
    match window.iter().position(|&b| b == b'\n') {
        Some(0) => Err(FramingError::BadChunkSize),
        Some(i) if window[i - 1] == b'\r' => Ok(Some(i - 1)),
        Some(_) => Err(FramingError::BadChunkSize),
        None if buf.len() >= max => Err(FramingError::LineTooLong),
        None => Ok(None),
    }
}

/// `1*HEXDIG [ BWS ";" extensions ]`: the size; extensions are ignored (no CR/LF inside).
/// One pass over the digits; a line that is only digits (what engines send) ends there.
fn parse_chunk_size(line: &[u8]) -> Result<u64, FramingError> {
    let mut size: u64 = 0;
    let mut digits = 0;
    for &b in line {
        let d = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            b'A'..=b'F' => b - b'A' + 10,
            _ => break,
        };
        // Leading zeros never fill the top digit; a seventeenth significant digit would.
        if size >> 60 != 0 {
            return Err(FramingError::ChunkTooLarge);
        }
        size = size << 4 | u64::from(d);
        digits += 1;
    }
    if digits == 0 {
        return Err(FramingError::BadChunkSize);
    }
    let rest = &line[digits..];
    if rest.is_empty() {
        return Ok(size);
    }
    let rest_trimmed = rest
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .map_or(&rest[rest.len()..], |i| &rest[i..]);
    if !rest_trimmed.is_empty() && rest_trimmed[0] != b';' {
        return Err(FramingError::BadChunkSize);
    }
    if rest.iter().any(|&b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(FramingError::BadChunkSize);
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(framing: Framing, pieces: &[&[u8]]) -> Result<(Vec<u8>, bool, usize), FramingError> {
        let mut d = BodyDecoder::new(framing);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for p in pieces {
            buf.extend_from_slice(p);
            out.extend_from_slice(&d.decode(&mut buf)?);
        }
        Ok((out, d.is_done(), buf.len()))
    }

    #[test]
    fn content_length_exact_and_overread() {
        assert_eq!(
            feed(Framing::Length(5), &[b"he", b"llo"]).unwrap(),
            (b"hello".to_vec(), true, 0)
        );
        let (out, done, left) = feed(Framing::Length(3), &[b"abcdef"]).unwrap();
        assert_eq!((out, done, left), (b"abc".to_vec(), true, 3));
        assert!(BodyDecoder::new(Framing::Length(0)).is_done());
    }

    #[test]
    fn chunked_in_one_read_comes_out_in_one_piece() {
        let wire = b"6\r\ndata: \r\n3\r\nab\n\r\n0\r\n\r\n";
        let mut d = BodyDecoder::new(Framing::Chunked);
        let mut buf = BytesMut::from(&wire[..]);
        let out = d.decode(&mut buf).unwrap();
        assert_eq!(&out[..], b"data: ab\n");
        assert!(d.is_done());
        assert!(buf.is_empty());
    }

    #[test]
    fn chunked_byte_by_byte_matches_whole() {
        let wire =
            b"4;name=v\r\nWiki\r\n5 \r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nX-T: 1\r\n\r\n";
        let pieces: Vec<&[u8]> = wire.chunks(1).collect();
        let (out, done, left) = feed(Framing::Chunked, &pieces).unwrap();
        assert_eq!(out, b"Wikipedia in\r\n\r\nchunks.".to_vec());
        assert!(done);
        assert_eq!(left, 0);
    }

    #[test]
    fn chunked_rejects_bad_framing() {
        for bad in [
            &b"zz\r\n"[..],
            b"\r\n",
            b"5\nhello",
            b"3\r\nabcX\r\n",
            b"10000000000000000\r\n",
            b"3 x\r\n",
        ] {
            assert!(feed(Framing::Chunked, &[bad]).is_err(), "{bad:?}");
        }
        let long = vec![b'1'; MAX_LINE + 1];
        assert_eq!(
            feed(Framing::Chunked, &[&long]).unwrap_err(),
            FramingError::LineTooLong
        );
        assert_eq!(
            feed(Framing::Chunked, &[b"11111111111111111\r\n"]).unwrap_err(),
            FramingError::ChunkTooLarge
        );
        let long_ext = [b"1;".as_slice(), &vec![b'a'; MAX_LINE]].concat();
        assert_eq!(
            feed(Framing::Chunked, &[&long_ext]).unwrap_err(),
            FramingError::LineTooLong
        );
    }

    #[test]
    fn leading_zeros_are_fine() {
        let (out, done, _) = feed(
            Framing::Chunked,
            &[b"00000000000000000003\r\nabc\r\n0\r\n\r\n"],
        )
        .unwrap();
        assert_eq!((out, done), (b"abc".to_vec(), true));
    }

    #[test]
    fn eof_ends_only_close_delimited_bodies() {
        let mut d = BodyDecoder::new(Framing::UntilClose);
        let mut buf = BytesMut::from(&b"xyz"[..]);
        assert_eq!(&d.decode(&mut buf).unwrap()[..], b"xyz");
        assert!(d.finish().is_ok());
        assert!(d.is_done());
        let mut d = BodyDecoder::new(Framing::Chunked);
        assert_eq!(d.finish(), Err(FramingError::Truncated));
        let mut d = BodyDecoder::new(Framing::Length(4));
        assert_eq!(d.finish(), Err(FramingError::Truncated));
    }

    #[test]
    fn bytes_after_the_last_chunk_stay_in_the_buffer() {
        let (_, done, left) = feed(Framing::Chunked, &[b"1\r\na\r\n0\r\n\r\nHTTP/1.1"]).unwrap();
        assert!(done);
        assert_eq!(left, 8);
    }
}
