//! A fixed, seedless 64-bit hash for ring positions, routing keys and URL maps.
//!
//! Fixed so ring positions (and therefore key → worker assignments) are identical across
//! restarts and across gateway replicas. It is a wyhash-style construction: 16 bytes per
//! 64×64→128-bit folded multiply, then a final mix. Not cryptographic; a client that picks its
//! own routing key can already choose its worker, so collision resistance buys nothing here.
//! SMG uses blake3 (consistent_hashing) and xxh3 (prefix_hash); positions therefore differ from
//! SMG's, which only matters if two different routers must agree on one ring.

use std::hash::{BuildHasher, Hasher};

const P0: u64 = 0xa076_1d64_78bd_642f;
const P1: u64 = 0xe703_7ed1_a0b4_28db;
const P2: u64 = 0x8ebc_6af0_9c88_c6e3;
const P3: u64 = 0x5899_65cc_7537_4cc3;

#[inline(always)]
fn folded_mul(a: u64, b: u64) -> u64 {
    let full = (a as u128).wrapping_mul(b as u128);
    (full as u64) ^ ((full >> 64) as u64)
}

#[inline(always)]
fn read_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    u64::from_le_bytes(buf)
}

/// Running state: absorb 16-byte blocks, then `finish` with the total length.
#[derive(Clone, Copy)]
struct State(u64);

impl State {
    #[inline(always)]
    fn new(seed: u64) -> State {
        State(seed ^ P0)
    }

    #[inline(always)]
    fn block(&mut self, a: u64, b: u64) {
        self.0 = folded_mul(a ^ P1, b ^ self.0);
    }

    #[inline(always)]
    fn finish(self, len: u64) -> u64 {
        folded_mul(self.0 ^ P2, len ^ P3)
    }
}

#[inline]
fn absorb_bytes(state: &mut State, bytes: &[u8]) {
    let mut blocks = bytes.chunks_exact(16);
    for block in &mut blocks {
        let (a, b) = block.split_at(8);
        state.block(read_u64(a), read_u64(b));
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let (a, b) = tail.split_at(tail.len().min(8));
        // A length byte in the top of the last word keeps "ab" and "ab\0" apart.
        state.block(read_u64(a), read_u64(b) ^ ((tail.len() as u64) << 56));
    }
}

/// Hash of a byte string.
#[inline]
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut state = State::new(0);
    absorb_bytes(&mut state, bytes);
    state.finish(bytes.len() as u64)
}

/// Hash of a token-id sequence (the ids' little-endian bytes, hashed word by word).
#[inline]
pub(crate) fn hash_tokens(tokens: &[u32]) -> u64 {
    let mut state = State::new(P3);
    let mut blocks = tokens.chunks_exact(4);
    for b in &mut blocks {
        state.block(
            b[0] as u64 | (b[1] as u64) << 32,
            b[2] as u64 | (b[3] as u64) << 32,
        );
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        let mut w = [0u64; 4];
        for (slot, &t) in w.iter_mut().zip(tail) {
            *slot = t as u64;
        }
        state.block(w[0] | w[1] << 32, w[2] | (tail.len() as u64) << 56);
    }
    state.finish(tokens.len() as u64 * 4)
}

/// `std` hasher over [`hash_bytes`]-style mixing, for URL → id maps.
#[derive(Clone, Copy)]
pub(crate) struct FastHasher {
    state: State,
    len: u64,
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        absorb_bytes(&mut self.state, bytes);
        self.len = self.len.wrapping_add(bytes.len() as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.state.finish(self.len)
    }
}

/// Builds [`FastHasher`]s for `HashMap<_, _, FastBuild>`.
#[derive(Clone, Copy, Default)]
pub(crate) struct FastBuild;

impl BuildHasher for FastBuild {
    type Hasher = FastHasher;
    #[inline]
    fn build_hasher(&self) -> FastHasher {
        FastHasher {
            state: State::new(0),
            len: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_is_fixed_across_calls_and_sensitive_to_every_byte() {
        let a = hash_bytes(b"http://w1:8000#17");
        assert_eq!(a, hash_bytes(b"http://w1:8000#17"));
        assert_ne!(a, hash_bytes(b"http://w1:8000#18"));
        assert_ne!(hash_bytes(b"ab"), hash_bytes(b"ab\0"));
        assert_ne!(hash_bytes(b""), hash_bytes(b"\0"));
        assert_ne!(hash_tokens(&[1, 2, 3]), hash_tokens(&[1, 2, 3, 0]));
    }

    #[test]
    fn hash_spreads_sequential_keys_evenly_over_buckets() {
        let mut buckets = [0u32; 16];
        for i in 0..16_000 {
            buckets[(hash_bytes(format!("key-{i}").as_bytes()) >> 60) as usize] += 1;
        }
        for b in buckets {
            assert!((800..1200).contains(&b), "{buckets:?}");
        }
    }
}
