//! The verification pattern: byte `o` of a buffer is a function of a seed and `o` alone, so both
//! sides of a transfer know what every byte must be.

use crate::BenchResult;
use crate::memory::BenchMemory;

const CHUNK: usize = 1 << 20;

fn word(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The pattern bytes for `[offset, offset+len)`.
pub fn bytes(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let first = offset / 8;
    let skip = (offset % 8) as usize;
    let words = (skip + len).div_ceil(8);
    let mut out = Vec::with_capacity(words * 8);
    for i in 0..words as u64 {
        out.extend_from_slice(&word(seed, first + i).to_le_bytes());
    }
    out.drain(..skip);
    out.truncate(len);
    out
}

/// Writes the pattern over `[offset, offset+len)` of `buf`.
///
/// # Errors
/// The range is outside the buffer, or a GPU copy failed.
pub fn fill(buf: &BenchMemory, seed: u64, offset: u64, len: u64) -> BenchResult<()> {
    let mut at = offset;
    while at < offset + len {
        let step = CHUNK.min((offset + len - at) as usize);
        buf.write_at(at as usize, &bytes(seed, at, step))?;
        at += step as u64;
    }
    Ok(())
}

/// The first offset in `[offset, offset+len)` whose byte differs from the pattern.
///
/// # Errors
/// The bytes could not be read (never taken as a match).
pub fn first_mismatch(
    buf: &BenchMemory,
    seed: u64,
    offset: u64,
    len: u64,
) -> BenchResult<Option<u64>> {
    let mut at = offset;
    let mut got = vec![0u8; CHUNK];
    while at < offset + len {
        let step = CHUNK.min((offset + len - at) as usize);
        buf.read_at(at as usize, &mut got[..step])?;
        let want = bytes(seed, at, step);
        if let Some(i) = got[..step].iter().zip(&want).position(|(a, b)| a != b) {
            return Ok(Some(at + i as u64));
        }
        at += step as u64;
    }
    Ok(None)
}

/// The first offset of `ranges` (start, length) whose byte differs from the pattern.
///
/// # Errors
/// As [`first_mismatch`].
pub fn first_mismatch_in(
    buf: &BenchMemory,
    seed: u64,
    ranges: &[(u64, u64)],
) -> BenchResult<Option<u64>> {
    for &(offset, len) in ranges {
        if let Some(at) = first_mismatch(buf, seed, offset, len)? {
            return Ok(Some(at));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_is_positional_and_detects_a_flipped_byte() {
        assert_eq!(bytes(1, 5, 10), bytes(1, 0, 15)[5..].to_vec());
        assert_ne!(bytes(1, 0, 64), bytes(2, 0, 64));
        let b = BenchMemory::new(None, 3 << 20).unwrap();
        fill(&b, 9, 3, (3 << 20) - 3).unwrap();
        assert_eq!(first_mismatch(&b, 9, 3, (3 << 20) - 3), Ok(None));
        b.write_at(2_000_001, &[!bytes(9, 2_000_001, 1)[0]])
            .unwrap();
        assert_eq!(first_mismatch(&b, 9, 3, (3 << 20) - 3), Ok(Some(2_000_001)));
        // A range it cannot read is an error, not a match.
        assert!(first_mismatch(&b, 9, 3 << 20, 8).is_err());
        assert!(fill(&b, 9, 3 << 20, 8).is_err());
    }
}
