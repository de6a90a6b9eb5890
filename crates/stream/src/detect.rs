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
        let s = self.peek(threshold);
        self.consec = 0;
        self.reverse = 0;
        self.strided = 0;
        self.total = 0;
        s
    }

    /// The stream seen so far in this interval, if any, without ending it.
    pub fn peek(&self, threshold: f64) -> Option<Stream> {
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

/// How far ahead of a stream to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// `pages` pages of the pattern from the reader's next page; pages
    /// already asked for are not asked again. A new stream gets this: a
    /// lookahead of its quota.
    FromReader,
    /// `pages` pages *not yet asked for*, walking the pattern from the
    /// reader's next page: prefetchd's "last known stop block" as the start
    /// block, so with a scale of 1 the lookahead the stream has is kept,
    /// with more it grows, with less it shrinks.
    FromStop,
}

/// Page ranges `(first, count)` to ask for next for stream `s` of a file
/// of `file_pages` pages, in the order the reader will reach them, leaving
/// out pages `asked` says were asked for already.
pub fn window(
    s: &Stream,
    pages: u64,
    file_pages: u64,
    reach: Reach,
    asked: impl Fn(u64) -> bool,
) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    let (mut walked, mut new) = (0u64, 0u64);
    let mut take = |p: u64| -> bool {
        let budget = match reach {
            Reach::FromReader => walked,
            Reach::FromStop => new,
        };
        if budget >= pages {
            return false;
        }
        walked += 1;
        if !asked(p) {
            new += 1;
            match out.last_mut() {
                Some((f, n)) if *f + *n == p => *n += 1,
                Some((f, n)) if p + 1 == *f => {
                    *f = p;
                    *n += 1;
                }
                _ => out.push((p, 1)),
            }
        }
        true
    };
    match s.pattern {
        Pattern::Forward => {
            for p in s.next..file_pages {
                if !take(p) {
                    break;
                }
            }
        }
        Pattern::Backward => {
            if s.next < file_pages {
                for p in (0..=s.next).rev() {
                    if !take(p) {
                        break;
                    }
                }
            }
        }
        Pattern::Strided { stride, len } => {
            let mut at = s.next as i64;
            'walk: while at >= 0 && (at as u64) < file_pages {
                for p in at as u64..(at as u64 + len).min(file_pages) {
                    if !take(p) {
                        break 'walk;
                    }
                }
                at += stride;
            }
        }
    }
    out
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
        let none = |_| false;
        let fwd = Stream {
            pattern: Pattern::Forward,
            next: 10,
            pages: 0,
            linear_share: 1.0,
        };
        let from = Reach::FromReader;
        assert_eq!(window(&fwd, 5, 100, from, none), vec![(10, 5)]);
        assert_eq!(
            window(&fwd, 500, 100, from, none),
            vec![(10, 90)],
            "clipped at the end of the file"
        );
        let back = Stream {
            pattern: Pattern::Backward,
            next: 10,
            pages: 0,
            linear_share: 1.0,
        };
        assert_eq!(window(&back, 4, 100, from, none), vec![(7, 4)]);
        assert_eq!(window(&back, 40, 100, from, none), vec![(0, 11)]);
        let st = Stream {
            pattern: Pattern::Strided { stride: 10, len: 2 },
            next: 20,
            pages: 0,
            linear_share: 1.0,
        };
        assert_eq!(
            window(&st, 5, 100, from, none),
            vec![(20, 2), (30, 2), (40, 1)]
        );
        assert_eq!(window(&fwd, 0, 100, from, none), vec![]);
        let rev = Stream {
            pattern: Pattern::Strided {
                stride: -10,
                len: 2,
            },
            next: 20,
            pages: 0,
            linear_share: 1.0,
        };
        assert_eq!(
            window(&rev, 10, 100, from, none),
            vec![(20, 2), (10, 2), (0, 2)],
            "a backward stride stops at the start of the file"
        );
    }

    /// Asked-for pages are skipped either way; from the reader the window
    /// ends where the quota does, from the last stop it goes on for
    /// `pages` new pages.
    #[test]
    fn windows_continue_from_the_last_stop() {
        let fwd = Stream {
            pattern: Pattern::Forward,
            next: 10,
            pages: 0,
            linear_share: 1.0,
        };
        let asked = |p: u64| (10..30).contains(&p);
        assert_eq!(window(&fwd, 20, 100, Reach::FromReader, asked), vec![]);
        assert_eq!(
            window(&fwd, 25, 100, Reach::FromReader, asked),
            vec![(30, 5)]
        );
        assert_eq!(
            window(&fwd, 20, 100, Reach::FromStop, asked),
            vec![(30, 20)]
        );
        assert_eq!(
            window(&fwd, 20, 40, Reach::FromStop, asked),
            vec![(30, 10)],
            "not past the end of the file"
        );
        // A gap the reader skipped past is not the stop; holes are filled.
        let holes = |p: u64| (10..30).contains(&p) && p != 15;
        assert_eq!(
            window(&fwd, 3, 100, Reach::FromStop, holes),
            vec![(15, 1), (30, 2)]
        );
        let back = Stream {
            pattern: Pattern::Backward,
            next: 50,
            pages: 0,
            linear_share: 1.0,
        };
        let asked = |p: u64| (40..=50).contains(&p);
        assert_eq!(window(&back, 5, 100, Reach::FromStop, asked), vec![(35, 5)]);
        let st = Stream {
            pattern: Pattern::Strided { stride: 10, len: 2 },
            next: 0,
            pages: 0,
            linear_share: 1.0,
        };
        let asked = |p: u64| p < 20;
        assert_eq!(
            window(&st, 3, 100, Reach::FromStop, asked),
            vec![(20, 2), (30, 1)]
        );
    }

    #[test]
    fn peek_does_not_end_the_interval() {
        let mut d = Detector::default();
        for i in 0..10 {
            d.request(i * 4, 4);
        }
        let seen = d.peek(MATCH_THRESHOLD);
        assert_eq!(seen.map(|s| s.next), Some(40));
        assert_eq!(d.requested(), 40);
        assert_eq!(d.end_interval(MATCH_THRESHOLD), seen);
        assert_eq!(d.requested(), 0);
        assert_eq!(d.peek(MATCH_THRESHOLD), None);
    }
}
