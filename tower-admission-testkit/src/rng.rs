//! SplitMix64: a small, seeded, dependency-free generator for tests that
//! print their seed so a failure can be replayed.

#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// A generator seeded with `seed`, its first output discarded.
    pub fn new(seed: u64) -> Rng {
        let mut rng = Rng(seed);
        rng.next();
        rng
    }

    #[allow(clippy::should_implement_trait)] // an endless stream, not an iterator
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An index in `0..len`.
    pub fn index(&mut self, len: usize) -> usize {
        (self.next() % len as u64) as usize
    }

    /// One of `weights.len()` outcomes, each with its weight.
    pub fn pick(&mut self, weights: &[u64]) -> usize {
        let mut roll = self.below(weights.iter().sum());
        for (index, &weight) in weights.iter().enumerate() {
            if roll < weight {
                return index;
            }
            roll -= weight;
        }
        unreachable!("roll below the sum of weights")
    }
}
