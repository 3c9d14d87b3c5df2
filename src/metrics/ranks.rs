//! The handles of every rank ever recognised, by rank number.

use super::*;

/// The handles of every rank ever recognised, by rank number.
///
/// It only grows, and only in [`Recorder::configured`] (under the gate's
/// lock); events read it without a lock of their own, so the gate's hot
/// path takes one lock, not two. Chunk `k` holds ranks `2^k - 1` to
/// `2^(k+1) - 2`, so a registered handle never moves.
pub(super) struct RankTable {
    pub(super) chunks: [OnceLock<Box<[OnceLock<BucketMetrics>]>>; RankTable::CHUNKS],
    /// One more than the highest rank registered.
    pub(super) len: AtomicUsize,
}

impl RankTable {
    /// Enough for every `u32` rank.
    const CHUNKS: usize = 33;

    pub(super) fn new() -> Self {
        RankTable {
            chunks: [const { OnceLock::new() }; RankTable::CHUNKS],
            len: AtomicUsize::new(0),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Chunk and offset of `rank`.
    pub(super) fn position(rank: usize) -> (usize, usize) {
        let index = rank + 1;
        let chunk = (usize::BITS - 1 - index.leading_zeros()) as usize;
        (chunk, index - (1 << chunk))
    }

    #[cfg(test)]
    pub(super) fn get(&self, rank: usize) -> Option<&BucketMetrics> {
        let (chunk, offset) = Self::position(rank);
        self.chunks.get(chunk)?.get()?.get(offset)?.get()
    }

    pub(super) fn get_or_register(
        &self,
        rank: usize,
        register: impl FnOnce() -> BucketMetrics,
    ) -> &BucketMetrics {
        let (chunk, offset) = Self::position(rank);
        let cells = self.chunks[chunk]
            .get_or_init(|| (0..1usize << chunk).map(|_| OnceLock::new()).collect());
        self.len.fetch_max(rank + 1, Ordering::Relaxed);
        cells[offset].get_or_init(register)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_table_positions_cover_every_rank_once() {
        assert_eq!(RankTable::position(0), (0, 0));
        assert_eq!(RankTable::position(1), (1, 0));
        assert_eq!(RankTable::position(2), (1, 1));
        assert_eq!(RankTable::position(3), (2, 0));
        assert_eq!(RankTable::position(6), (2, 3));
        assert_eq!(RankTable::position(7), (3, 0));
        let last = RankTable::position(u32::MAX as usize - 1);
        assert_eq!(last, (31, (1 << 31) - 1));
        assert!(last.0 < RankTable::CHUNKS);
    }

    #[test]
    fn rank_table_registers_each_rank_once_and_keeps_it() {
        let table = RankTable::new();
        let names = Names::new("test");
        assert!(table.get(0).is_none());
        let mut registered = 0;
        for rank in [0, 1, 2, 5, 2] {
            table.get_or_register(rank, || {
                registered += 1;
                BucketMetrics::register(&names, &Shape::plain(), Some(rank as u32))
            });
        }
        assert_eq!(registered, 4);
        assert_eq!(table.len(), 6);
        assert!(table.get(5).is_some());
        assert!(table.get(3).is_none(), "rank 3 was never registered");
    }
}
