//! How a range is cut into prefetch requests, and how many that makes,
//! computed arithmetically: a forged 2^40-byte range must cost one
//! division to count, not a walk over its pieces.

use crate::trace::PAGE_SIZE;

/// Splits `offset..offset+len` into requests covering at most `chunk` bytes
/// of whole pages each, yielding `(first, offset, len)`. Boundaries fall on
/// multiples of `chunk` counted from the range's first page, so no request
/// spans more pages than the kernel reads in one call, and the range is
/// covered exactly. A `chunk` of 0 is taken as 1; a range running past
/// `u64::MAX` ends there.
pub fn split(offset: u64, len: u64, chunk: u64) -> impl Iterator<Item = (bool, u64, u64)> {
    let chunk = chunk.max(1);
    let end = offset.saturating_add(len);
    let base = offset / PAGE_SIZE * PAGE_SIZE;
    let mut start = offset;
    std::iter::from_fn(move || {
        if start >= end {
            return None;
        }
        let first = start == offset;
        // The next boundary after `start`, counted from the first page.
        let stop = ((start - base) / chunk)
            .saturating_add(1)
            .saturating_mul(chunk)
            .saturating_add(base)
            .min(end);
        let piece = (first, start, stop - start);
        start = stop;
        Some(piece)
    })
}

/// How many requests [`split`] makes of the range, in constant time.
pub fn request_count(offset: u64, len: u64, chunk: u64) -> u64 {
    let chunk = chunk.max(1);
    let end = offset.saturating_add(len);
    if end <= offset {
        return 0;
    }
    let base = offset / PAGE_SIZE * PAGE_SIZE;
    // Pieces are the chunk-sized windows from `base` that the range
    // touches: from the one holding `offset` to the one holding `end - 1`.
    (end - 1 - base) / chunk - (offset - base) / chunk + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE_SIZE;

    #[test]
    fn split_table() {
        // (name, offset, len, chunk, want)
        type Case = (&'static str, u64, u64, u64, Vec<(bool, u64, u64)>);
        let cases: Vec<Case> = vec![
            ("empty", 0, 0, P, vec![]),
            ("fits in one", 0, 8 * P, 32 * P, vec![(true, 0, 8 * P)]),
            (
                "exact multiple",
                0,
                64 * P,
                32 * P,
                vec![(true, 0, 32 * P), (false, 32 * P, 32 * P)],
            ),
            (
                "remainder",
                P,
                70 * P,
                32 * P,
                vec![
                    (true, P, 32 * P),
                    (false, 33 * P, 32 * P),
                    (false, 65 * P, 6 * P),
                ],
            ),
            (
                "unaligned start stays within the page cap",
                100,
                3 * P,
                2 * P,
                vec![(true, 100, 2 * P - 100), (false, 2 * P, P + 100)],
            ),
            (
                "chunk smaller than a page",
                10,
                10,
                4,
                vec![(true, 10, 2), (false, 12, 4), (false, 16, 4)],
            ),
        ];
        for (name, offset, len, chunk, want) in cases {
            let got: Vec<_> = split(offset, len, chunk).collect();
            assert_eq!(got, want, "{name}");
            assert_eq!(
                request_count(offset, len, chunk),
                want.len() as u64,
                "{name}"
            );
        }
    }

    #[test]
    fn counts_huge_ranges_without_walking_them() {
        let limit = crate::limits::MAX_RANGE;
        assert_eq!(request_count(0, limit, 128 << 10), limit / (128 << 10));
        assert_eq!(request_count(0, u64::MAX, 1), u64::MAX);
        assert_eq!(request_count(u64::MAX - 1, 10, P), 1);
        assert_eq!(request_count(5, 0, P), 0);
    }
}
