//! Bytes classified eight at a time in a `u64` (SIMD within a register):
//! the detectors pass over event data and JSON strings, most of a stream's
//! bytes, a word at a time.

/// A word of bytes of 1.
const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
/// The high bit of every byte.
pub(super) const HIGH_BITS: u64 = u64::from_ne_bytes([0x80; 8]);

/// The high bit of each byte of `word` below `n` (`n` at most 0x80). A
/// borrow only runs on from a byte that is below, so bytes after the first
/// marked one may be marked wrongly; callers look at the first only.
#[inline]
pub(super) fn below(word: u64, n: u8) -> u64 {
    word.wrapping_sub(ONES * u64::from(n)) & !word & HIGH_BITS
}

/// The high bit of each byte of `word` equal to `byte`, as [`below`]
/// marks them.
#[inline]
pub(super) fn equal(word: u64, byte: u8) -> u64 {
    below(word ^ (ONES * u64::from(byte)), 1)
}

/// The index of the first marked byte of a word read little-endian.
#[inline]
pub(super) fn first(marks: u64) -> usize {
    (marks.trailing_zeros() / 8) as usize
}
