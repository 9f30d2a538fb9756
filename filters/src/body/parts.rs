//! Where a rewrite's bytes go ([`Sink`]): copied into one buffer (`Vec<u8>`), or kept as
//! [`BodyParts`] — the client's bytes as shared slices of its body, the gateway's own (braces,
//! separators, the fields it sets) in one small buffer. A large body is then spliced without
//! being copied: a leg writes the pieces with one vectored write.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;

/// The receiver of a rewrite, in output order: ranges of the body being rewritten and bytes of
/// the gateway's own.
pub trait Sink {
    /// `body[range]` comes next.
    fn kept(&mut self, body: &[u8], range: Range<usize>);
    /// The bytes `write` appends come next.
    fn own(&mut self, write: impl FnOnce(&mut Vec<u8>));
}

impl Sink for Vec<u8> {
    fn kept(&mut self, body: &[u8], range: Range<usize>) {
        self.extend_from_slice(&body[range]);
    }

    fn own(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        write(self)
    }
}

/// A body as a few shared pieces, written in order. One piece (a body that was not spliced, or
/// a splice whose every byte is the client's) costs no allocation of its own.
#[derive(Clone, Debug)]
pub struct BodyParts {
    parts: Parts,
    len: usize,
}

#[derive(Clone, Debug)]
enum Parts {
    One(Bytes),
    Many(Arc<[Bytes]>),
}

impl BodyParts {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The pieces, in order.
    pub fn parts(&self) -> &[Bytes] {
        match &self.parts {
            Parts::One(b) => std::slice::from_ref(b),
            Parts::Many(v) => v,
        }
    }

    /// Appends every byte, in order.
    pub fn copy_into(&self, out: &mut Vec<u8>) {
        for p in self.parts() {
            out.extend_from_slice(p);
        }
    }
}

impl Default for BodyParts {
    fn default() -> Self {
        BodyParts::from(Bytes::new())
    }
}

impl From<Bytes> for BodyParts {
    fn from(b: Bytes) -> Self {
        BodyParts {
            len: b.len(),
            parts: Parts::One(b),
        }
    }
}

impl From<Vec<u8>> for BodyParts {
    fn from(v: Vec<u8>) -> Self {
        BodyParts::from(Bytes::from(v))
    }
}

impl PartialEq<[u8]> for BodyParts {
    fn eq(&self, other: &[u8]) -> bool {
        self.len == other.len() && {
            let mut rest = other;
            self.parts().iter().all(|p| {
                let (head, tail) = rest.split_at(p.len());
                rest = tail;
                head == &p[..]
            })
        }
    }
}

/// A [`Sink`] that keeps the pieces: ranges of `body` (adjacent ones merged, and the gateway's
/// bytes absorbed into them where the body has the same bytes there — a compact object's `{`
/// and `,`), and the rest in one buffer of its own.
pub struct PartsSink<'b> {
    body: &'b Bytes,
    pieces: Vec<Piece>,
    own: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Body(Range<usize>),
    Own(Range<usize>),
}

impl Piece {
    fn range(&self) -> Range<usize> {
        match self {
            Piece::Body(r) | Piece::Own(r) => r.clone(),
        }
    }
}

impl<'b> PartsSink<'b> {
    pub fn new(body: &'b Bytes) -> PartsSink<'b> {
        PartsSink {
            body,
            pieces: Vec::with_capacity(4),
            // The fields a handoff sets fit (its rooms, host, port and ranks).
            own: Vec::with_capacity(160),
        }
    }

    pub fn finish(self) -> BodyParts {
        let len = self.pieces.iter().map(|p| p.range().len()).sum();
        // The own pieces cover the buffer in order; one of them takes it whole, uncloned.
        let own_pieces = self
            .pieces
            .iter()
            .filter(|p| matches!(p, Piece::Own(_)))
            .count();
        let mut own = Some(Bytes::from(self.own));
        let mut slice = |p: &Piece| match p {
            Piece::Body(r) => self.body.slice(r.clone()),
            Piece::Own(_) if own_pieces == 1 => own.take().unwrap_or_default(),
            Piece::Own(r) => own.as_ref().map_or_else(Bytes::new, |o| o.slice(r.clone())),
        };
        let parts = match self.pieces.as_slice() {
            [] => Parts::One(Bytes::new()),
            [one] => Parts::One(slice(one)),
            many => Parts::Many(many.iter().map(&mut slice).collect()),
        };
        BodyParts { parts, len }
    }
}

/// A [`Sink`] for a leg's body: a body up to `share_above` bytes is copied into one buffer (a
/// leg copies a small body into its request head anyway, and the copy costs less than the
/// pieces' bookkeeping), a larger one kept as pieces ([`PartsSink`]).
pub enum BodySink<'b> {
    Copy(Vec<u8>),
    Parts(PartsSink<'b>),
}

impl<'b> BodySink<'b> {
    pub fn new(body: &'b Bytes, share_above: usize) -> BodySink<'b> {
        if body.len() > share_above {
            BodySink::Parts(PartsSink::new(body))
        } else {
            BodySink::Copy(Vec::with_capacity(body.len() + 160))
        }
    }

    pub fn finish(self) -> BodyParts {
        match self {
            BodySink::Copy(v) => BodyParts::from(v),
            BodySink::Parts(p) => p.finish(),
        }
    }
}

impl Sink for BodySink<'_> {
    fn kept(&mut self, body: &[u8], range: Range<usize>) {
        match self {
            BodySink::Copy(v) => v.kept(body, range),
            BodySink::Parts(p) => p.kept(body, range),
        }
    }

    fn own(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        match self {
            BodySink::Copy(v) => v.own(write),
            BodySink::Parts(p) => p.own(write),
        }
    }
}

impl Sink for PartsSink<'_> {
    fn kept(&mut self, body: &[u8], mut range: Range<usize>) {
        // The pieces are slices of the body this sink was made for: a splice of another one
        // would send the wrong bytes.
        debug_assert!(std::ptr::eq(body.as_ptr(), self.body.as_ptr()));
        if range.is_empty() {
            return;
        }
        // The gateway's last bytes, when the body has the same ones just before: the body's.
        if let Some(Piece::Own(o)) = self.pieces.last() {
            let o = o.clone();
            let n = o.len();
            if o.end == self.own.len()
                && range.start >= n
                && self.body[range.start - n..range.start] == self.own[o.clone()]
            {
                self.pieces.pop();
                self.own.truncate(o.start);
                range.start -= n;
            }
        }
        match self.pieces.last_mut() {
            Some(Piece::Body(r)) if r.end == range.start => r.end = range.end,
            _ => self.pieces.push(Piece::Body(range)),
        }
    }

    fn own(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.own.len();
        write(&mut self.own);
        let end = self.own.len();
        if end == start {
            return;
        }
        // The same bytes next in the body: the body's.
        if let Some(Piece::Body(r)) = self.pieces.last_mut() {
            let n = end - start;
            if self.body.get(r.end..r.end + n) == Some(&self.own[start..end]) {
                r.end += n;
                self.own.truncate(start);
                return;
            }
        }
        match self.pieces.last_mut() {
            Some(Piece::Own(o)) if o.end == start => o.end = end,
            _ => self.pieces.push(Piece::Own(start..end)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(p: &BodyParts) -> Vec<u8> {
        let mut v = Vec::new();
        p.copy_into(&mut v);
        v
    }

    /// What a rewrite of a two-entry object sends: `{`, the first entry, `,`, the second, then
    /// `tail` (the set fields and the closing brace).
    fn two_entries(
        body: &Bytes,
        first: Range<usize>,
        second: Range<usize>,
        tail: &[u8],
    ) -> BodyParts {
        let mut s = PartsSink::new(body);
        s.own(|o| o.push(b'{'));
        s.kept(body, first);
        s.own(|o| o.push(b','));
        s.kept(body, second);
        s.own(|o| o.extend_from_slice(tail));
        s.finish()
    }

    #[test]
    fn the_gateways_bytes_that_the_body_has_are_taken_from_it() {
        let body = Bytes::from_static(b"{\"a\":1,\"b\":2}");
        let p = two_entries(&body, 1..6, 7..12, b",\"c\":3}");
        assert_eq!(joined(&p), b"{\"a\":1,\"b\":2,\"c\":3}");
        assert_eq!(p.len(), joined(&p).len());
        // The whole client object up to its last entry is one slice of the body.
        assert_eq!(p.parts().len(), 2);
        assert_eq!(&p.parts()[0][..], b"{\"a\":1,\"b\":2");
        assert_eq!(p.parts()[0].as_ptr(), body.as_ptr());
        assert!(p == *b"{\"a\":1,\"b\":2,\"c\":3}".as_slice());
    }

    #[test]
    fn bytes_the_body_does_not_have_there_are_kept_apart() {
        let body = Bytes::from_static(b" { \"a\" : 1 , \"b\":2 }");
        let p = two_entries(&body, 3..10, 13..18, b"}");
        assert_eq!(joined(&p), b"{\"a\" : 1,\"b\":2}");
        assert!(p != *b"{\"a\" : 1,\"b\":3}".as_slice());
    }

    #[test]
    fn a_leg_sink_copies_a_small_body_and_shares_a_large_one() {
        let body = Bytes::from_static(b"{\"a\":1}");
        for share_above in [0, body.len()] {
            let mut s = BodySink::new(&body, share_above);
            s.own(|o| o.push(b'{'));
            s.kept(&body, 1..6);
            s.own(|o| o.extend_from_slice(b",\"b\":2}"));
            let p = s.finish();
            assert_eq!(joined(&p), b"{\"a\":1,\"b\":2}");
            let shared = p.parts()[0].as_ptr() == body.as_ptr();
            assert_eq!(shared, share_above == 0, "share above {share_above}");
        }
    }

    #[test]
    fn an_empty_or_whole_body_is_one_piece() {
        let body = Bytes::from_static(b"{}");
        let s = PartsSink::new(&body);
        let p = s.finish();
        assert!(p.is_empty());
        assert_eq!(p.parts().len(), 1);
        let mut s = PartsSink::new(&body);
        s.own(|o| o.extend_from_slice(b"{}"));
        let p = s.finish();
        assert_eq!(p.parts().len(), 1);
        assert_eq!(joined(&p), b"{}");
        let whole = BodyParts::from(body.clone());
        assert_eq!(whole.parts()[0].as_ptr(), body.as_ptr());
    }
}
