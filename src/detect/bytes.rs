//! Finding the first byte of a kind eight bytes at a time, for the scans
//! over the bytes that make most of a stream (event data, JSON strings).

/// Each byte of a word set to `byte`.
pub(super) const fn splat(byte: u8) -> u64 {
    u64::from_ne_bytes([byte; 8])
}

/// The high bit of each byte of `word` below `bound` (at most 0x80), and
/// maybe of bytes after the first such one, which do not matter: a borrow
/// only runs on from a byte that is below.
pub(super) fn bytes_below(word: u64, bound: u8) -> u64 {
    word.wrapping_sub(splat(bound)) & !word & splat(0x80)
}

/// The high bit of each byte of `word` equal to `byte` (and maybe of bytes
/// after the first such one).
pub(super) fn bytes_equal(word: u64, byte: u8) -> u64 {
    bytes_below(word ^ splat(byte), 1)
}

/// The index of the first byte of `bytes` that `is_sought` accepts, or the
/// length of `bytes`. `sought_in` must say the same eight bytes at a time:
/// the high bit of each sought byte of a word read little-endian (bits
/// after the first sought byte do not matter).
pub(super) fn position(
    bytes: &[u8],
    sought_in: impl Fn(u64) -> u64,
    is_sought: impl Fn(u8) -> bool,
) -> usize {
    let mut chunks = bytes.chunks_exact(8);
    let mut start = 0;
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let found = sought_in(word);
        if found != 0 {
            return start + (found.trailing_zeros() / 8) as usize;
        }
        start += 8;
    }
    chunks
        .remainder()
        .iter()
        .position(|&byte| is_sought(byte))
        .map_or(bytes.len(), |offset| start + offset)
}
