//! The flow map's hasher: a folded multiply under a key drawn at random
//! once per process (see the [queue's docs](super) for why not SipHash).
//!
//! # Invariants
//!
//! * Every bit of a key's words reaches every bit of the hash, and without
//!   the process's key no set of tenant ids can be chosen to collide.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::OnceLock;

/// Hashes a flow's key with a folded multiply (the high and low halves of
/// a 128-bit product, xored) under a key drawn at random once per process:
/// every bit of the key's words reaches every bit of the hash, and without
/// the key no set of ids can be chosen to collide in the map.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlowHasher(u64, u64);

impl FlowHasher {
    fn fold(word: u64, key: u64) -> u64 {
        let product = u128::from(word) * u128::from(key);
        (product as u64) ^ ((product >> 64) as u64)
    }
}

impl Hasher for FlowHasher {
    fn finish(&self) -> u64 {
        FlowHasher::fold(self.0, self.1 | 1)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, word: u64) {
        const K: u64 = 0x9E37_79B9_7F4A_7C15; // 2^64 / golden ratio
        self.0 = FlowHasher::fold(self.0 ^ word, self.1 ^ K);
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    fn write_isize(&mut self, word: isize) {
        self.write_u64(word as u64);
    }
}

/// Builds [`FlowHasher`]s under the process's random key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FlowKey(u64, u64);

impl Default for FlowKey {
    fn default() -> FlowKey {
        static KEY: OnceLock<FlowKey> = OnceLock::new();
        *KEY.get_or_init(|| {
            let random = RandomState::new();
            FlowKey(random.hash_one(0u64), random.hash_one(1u64))
        })
    }
}

impl BuildHasher for FlowKey {
    type Hasher = FlowHasher;

    fn build_hasher(&self) -> FlowHasher {
        FlowHasher(self.0, self.1)
    }
}
