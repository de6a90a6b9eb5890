//! Stream detection (prefetchd §IV-B): one state machine per (process,
//! file), fed with the application's page requests in order. A request
//! that starts where the previous one ended counts its pages as
//! consecutive; one that ends where the previous started, as reverse; one
//! that repeats the previous jump and size, as strided. Counters weigh by
//! request size. At the end of a polling interval the dominant pattern, if
//! it covers more than the match threshold of the pages, is a stream.

/// What a stream looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    Forward,
    Backward,
    /// Requests of `len` pages every `stride` pages (stride > len), forward
    /// or backward (negative stride).
    Strided {
        stride: i64,
        len: u64,
    },
}

/// A recognised stream, ready to be prefetched ahead of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stream {
    pub pattern: Pattern,
    /// The next page the application is expected to read (forward: after
    /// its last request; backward: before it; strided: the next stride).
    pub next: u64,
    /// Pages the application requested in the interval.
    pub pages: u64,
    /// Share of those pages that fit the pattern.
    pub linear_share: f64,
}

/// Counters for one (process, file) over one polling interval.
#[derive(Debug, Clone, Default)]
pub struct Detector {
    last: Option<(u64, u64)>,
    last_jump: Option<i64>,
    consec: u64,
    reverse: u64,
    strided: u64,
    total: u64,
}

/// Default pattern-match threshold: prefetchd's 0.60.
pub const MATCH_THRESHOLD: f64 = 0.6;

impl Detector {
    /// One application request of `count` pages at page `index`.
    pub fn request(&mut self, index: u64, count: u64) {
        let mut index = index;
        let mut count = count.max(1);
        if let Some((start, len)) = self.last {
            // One read() is reported in batches that overlap (each lookup
            // reports up to the end of the request): count what is new, as
            // the continuation it is.
            let end = start + len;
            if index >= start && index < end {
                if index + count <= end {
                    return;
                }
                count = index + count - end;
                index = end;
            }
            let jump = index as i64 - start as i64;
            if index == start + len {
                self.consec += count;
            } else if index + count == start {
                self.reverse += count;
            } else if self.last_jump == Some(jump) && count == len && jump != 0 {
                self.strided += count;
            }
            self.last_jump = Some(jump);
        }
        self.last = Some((index, count));
        self.total += count;
    }

    /// Pages requested since the interval began.
    pub fn requested(&self) -> u64 {
        self.total
    }

    /// The stream seen in this interval, if any; resets the counters but
    /// keeps the position, so a stream spanning intervals stays recognised.
    pub fn end_interval(&mut self, threshold: f64) -> Option<Stream> {
        let total = self.total.max(1) as f64;
        let (start, len) = self.last?;
        let best = [
            (self.consec, Pattern::Forward),
            (self.reverse, Pattern::Backward),
            (
                self.strided,
                Pattern::Strided {
                    stride: self.last_jump.unwrap_or(0),
                    len,
                },
            ),
        ]
        .into_iter()
        .max_by_key(|(n, _)| *n)
        .expect("three candidates");
        let share = best.0 as f64 / total;
        let pages = self.total;
        self.consec = 0;
        self.reverse = 0;
        self.strided = 0;
        self.total = 0;
        if pages == 0 || share <= threshold {
            return None;
        }
        let next = match best.1 {
            Pattern::Forward => start + len,
            Pattern::Backward => start.saturating_sub(1),
            Pattern::Strided { stride, .. } => (start as i64 + stride).max(0) as u64,
        };
        Some(Stream {
            pattern: best.1,
            next,
            pages,
            linear_share: share,
        })
    }
}

/// Page ranges `(first, count)` to prefetch for `pages` pages of `s`.
pub fn window(s: &Stream, pages: u64, file_pages: u64) -> Vec<(u64, u64)> {
    if pages == 0 {
        return Vec::new();
    }
    match s.pattern {
        Pattern::Forward => {
            let end = (s.next + pages).min(file_pages);
            (s.next < end)
                .then(|| (s.next, end - s.next))
                .into_iter()
                .collect()
        }
        Pattern::Backward => {
            let first = (s.next + 1).saturating_sub(pages);
            let end = (s.next + 1).min(file_pages);
            (first < end)
                .then(|| (first, end - first))
                .into_iter()
                .collect()
        }
        Pattern::Strided { stride, len } => {
            let mut out = Vec::new();
            let mut at = s.next as i64;
            let mut left = pages;
            while left > 0 && at >= 0 && (at as u64) < file_pages {
                let n = len.min(left).min(file_pages - at as u64);
                out.push((at as u64, n));
                left -= n;
                at += stride;
            }
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(reqs: &[(u64, u64)]) -> Option<Stream> {
        let mut d = Detector::default();
        for &(i, c) in reqs {
            d.request(i, c);
        }
        d.end_interval(MATCH_THRESHOLD)
    }

    #[test]
    fn patterns_that_must_and_must_not_trigger() {
        let seq: Vec<(u64, u64)> = (0..10).map(|i| (i * 4, 4)).collect();
        let back: Vec<(u64, u64)> = (0..10).rev().map(|i| (i * 4, 4)).collect();
        let strided: Vec<(u64, u64)> = (0..10).map(|i| (i * 10, 2)).collect();
        let random = [(50, 1), (3, 1), (90, 1), (17, 1), (61, 1), (8, 1), (33, 1)];
        type Case = (&'static str, Vec<(u64, u64)>, Option<(Pattern, u64)>);
        let cases: Vec<Case> = vec![
            ("sequential forward", seq, Some((Pattern::Forward, 40))),
            ("sequential backward", back, Some((Pattern::Backward, 0))),
            (
                "strided",
                strided,
                Some((Pattern::Strided { stride: 10, len: 2 }, 100)),
            ),
            ("random", random.to_vec(), None),
            ("one request", vec![(5, 1)], None),
            ("nothing", vec![], None),
        ];
        for (name, reqs, want) in cases {
            let got = feed(&reqs).map(|s| (s.pattern, s.next));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn overlapping_batches_of_one_read_are_a_forward_stream() {
        // read() of 256 pages reported as batches (0..256), (15..256), ...
        let mut reqs = Vec::new();
        for chunk in 0..4u64 {
            for b in (0..256).step_by(15) {
                reqs.push((chunk * 256 + b, 256 - b));
            }
        }
        assert_eq!(
            feed(&reqs).map(|s| (s.pattern, s.next, s.pages)),
            Some((Pattern::Forward, 1024, 1024))
        );
    }

    #[test]
    fn mostly_sequential_with_noise_still_triggers() {
        let mut reqs: Vec<(u64, u64)> = (0..20).map(|i| (i * 8, 8)).collect();
        reqs.insert(10, (999, 1));
        reqs.insert(15, (5, 1));
        assert!(feed(&reqs).is_some());
    }

    #[test]
    fn windows() {
        let fwd = Stream {
            pattern: Pattern::Forward,
            next: 10,
            pages: 0,
            linear_share: 1.0,
        };
        assert_eq!(window(&fwd, 5, 100), vec![(10, 5)]);
        assert_eq!(
            window(&fwd, 500, 100),
            vec![(10, 90)],
            "clipped at the end of the file"
        );
        let back = Stream {
            pattern: Pattern::Backward,
            next: 10,
            pages: 0,
            linear_share: 1.0,
        };
        assert_eq!(window(&back, 4, 100), vec![(7, 4)]);
        let st = Stream {
            pattern: Pattern::Strided { stride: 10, len: 2 },
            next: 20,
            pages: 0,
            linear_share: 1.0,
        };
        assert_eq!(window(&st, 5, 100), vec![(20, 2), (30, 2), (40, 1)]);
        assert_eq!(window(&fwd, 0, 100), vec![]);
    }
}
