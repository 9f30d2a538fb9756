//! A map hasher for keys that are already hashes (a `u64` computed once, e.g. a SipHash of a
//! peer or of a text): the key is used as its own hash instead of being hashed again on every
//! lookup.

use std::hash::{BuildHasherDefault, Hasher};

/// `HashMap<u64, V, BuildPrehashed>`: the `u64` key is the hash.
pub type BuildPrehashed = BuildHasherDefault<Prehashed>;

#[derive(Default)]
pub struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are meant (`write_u64`); anything else still spreads.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    #[test]
    fn a_u64_key_is_its_own_hash_and_maps_still_find_every_key() {
        assert_eq!(
            BuildPrehashed::default().hash_one(0xdead_beef_u64),
            0xdead_beef
        );
        let mut map: HashMap<u64, u64, BuildPrehashed> = HashMap::default();
        for k in (0..1000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            map.insert(k, k ^ 1);
        }
        for k in (0..1000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
            assert_eq!(map.get(&k), Some(&(k ^ 1)));
        }
    }
}
