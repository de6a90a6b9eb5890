//! Feedback (prefetchd §IV-D): the aggressiveness scale factor rises when
//! predictable (linear) application reads still reach the disk, and falls
//! when none do while the prefetcher reads more than the application asks.
//!
//! prefetchd leaves the cache to the kernel and "hopes [pages] remain
//! cached"; under memory pressure that hope turns into a loop: prefetched
//! pages are evicted before the application reaches them (or push out pages
//! it already uses), so its reads reach the disk again, which the rule
//! above answers by prefetching *more*. The recorder sees both symptoms
//! exactly — a page inserted a second time before its first use, and a page
//! the application used being read from storage again — so an interval
//! with more than a trace of either halves the scale and caps it there. The
//! cap is lifted again only after a hold that doubles with every relapse
//! (exponential backoff), so a working set that does not fit is retried
//! ever more rarely instead of being thrashed periodically.

/// The scale factor's controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Controller {
    pub scale: f64,
    pub min: f64,
    pub max: f64,
    /// Share of linear requests reaching disk above which to speed up.
    pub miss_threshold: f64,
    /// Evictions (evicted-unused plus refaults) above this share of the
    /// interval's traffic mean the prefetcher is thrashing the cache.
    pub thrash_threshold: f64,
    /// The scale may not exceed this while backing off from thrashing.
    pub ceiling: f64,
    /// Intervals thrashing was detected in.
    pub thrashed: u64,
    hold: u32,
    backoff: u32,
}

impl Default for Controller {
    fn default() -> Self {
        // prefetchd starts near 1.0: read what the application is expected to use.
        Controller {
            scale: 1.0,
            min: 0.25,
            max: 16.0,
            miss_threshold: 0.05,
            thrash_threshold: 0.02,
            ceiling: 16.0,
            thrashed: 0,
            hold: 0,
            backoff: 0,
        }
    }
}

impl Controller {
    /// A controller that always answers `scale`: the static prefetcher.
    pub fn fixed(scale: f64) -> Self {
        Controller {
            scale,
            min: scale,
            max: scale,
            ceiling: scale,
            ..Controller::default()
        }
    }
}

/// One polling interval, seen from the page events.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Interval {
    /// Pages of recognised streams the application requested.
    pub linear_requested: u64,
    /// Of those, pages the application itself had to read from storage.
    pub linear_missed: u64,
    /// Pages the prefetcher read (brought into the cache).
    pub prefetched: u64,
    /// Prefetched pages evicted before the application used them.
    pub evicted_unused: u64,
    /// Pages the application had used that it had to read from storage again.
    pub refaulted: u64,
}

impl Interval {
    /// Whether this interval shows the prefetcher fighting the cache.
    pub fn thrashing(&self, threshold: f64) -> bool {
        let lost = self.evicted_unused + self.refaulted;
        let traffic = self.prefetched + self.linear_requested;
        lost >= 16 && lost as f64 > threshold * traffic as f64
    }
}

impl Controller {
    /// Adjusts the scale after an interval and returns it.
    pub fn update(&mut self, i: Interval) -> f64 {
        if self.min == self.max {
            return self.scale;
        }
        if i.thrashing(self.thrash_threshold) {
            // Back off at once and stay below; do not treat the misses the
            // evictions caused as a reason to prefetch more.
            self.thrashed += 1;
            self.scale = (self.scale * 0.5).max(self.min);
            self.ceiling = self.scale;
            self.backoff = (self.backoff * 2).clamp(4, 1 << 12);
            self.hold = self.backoff;
            return self.scale;
        }
        if self.ceiling < self.max {
            if self.hold > 0 {
                self.hold -= 1;
            } else {
                self.ceiling = (self.ceiling * 1.5).min(self.max);
                self.hold = self.backoff;
            }
        }
        let miss_share = if i.linear_requested == 0 {
            0.0
        } else {
            i.linear_missed as f64 / i.linear_requested as f64
        };
        if miss_share > self.miss_threshold {
            self.scale = (self.scale * 1.5).min(self.max).min(self.ceiling);
        } else if i.linear_missed == 0 && i.prefetched > i.linear_requested {
            self.scale = (self.scale * 0.8).max(self.min);
        }
        self.scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(linear_requested: u64, linear_missed: u64, prefetched: u64) -> Interval {
        Interval {
            linear_requested,
            linear_missed,
            prefetched,
            ..Interval::default()
        }
    }

    #[test]
    fn rises_on_misses_falls_on_waste_and_converges() {
        let mut c = Controller::default();
        let cases = [
            (iv(100, 50, 50), 1.5),
            (iv(100, 20, 80), 2.25),
            (iv(100, 0, 100), 2.25),
            (iv(100, 0, 300), 1.8),
        ];
        for (i, want) in cases {
            assert!((c.update(i) - want).abs() < 1e-9, "{i:?}");
        }
        // An application that needs ~3x its request rate ahead: the scale
        // settles between the rise and the fall, neither growing nor
        // collapsing.
        let mut c = Controller::default();
        for _ in 0..50 {
            let prefetched = (100.0 * c.scale) as u64;
            let missed = 300u64.saturating_sub(prefetched).min(100);
            c.update(iv(100, missed, prefetched));
        }
        assert!((2.0..=6.0).contains(&c.scale), "scale {}", c.scale);
        // Bounds hold.
        let mut c = Controller::default();
        for _ in 0..50 {
            c.update(iv(10, 10, 0));
        }
        assert_eq!(c.scale, c.max);
        for _ in 0..50 {
            c.update(iv(10, 0, 1000));
        }
        assert_eq!(c.scale, c.min);
        assert_eq!(c.thrashed, 0);
    }

    #[test]
    fn thrashing_is_detected_only_above_a_trace() {
        let cases = [
            ("nothing lost", iv(1000, 0, 1000), false),
            (
                "a few pages",
                Interval {
                    evicted_unused: 10,
                    ..iv(1000, 0, 1000)
                },
                false,
            ),
            (
                "under 2%",
                Interval {
                    evicted_unused: 30,
                    ..iv(1000, 0, 1000)
                },
                false,
            ),
            (
                "evicted before use",
                Interval {
                    evicted_unused: 100,
                    ..iv(1000, 0, 1000)
                },
                true,
            ),
            (
                "working set refaulted",
                Interval {
                    refaulted: 200,
                    ..iv(1000, 200, 500)
                },
                true,
            ),
        ];
        for (name, i, want) in cases {
            assert_eq!(i.thrashing(0.02), want, "{name}");
        }
    }

    /// A cache that holds only 200 pages ahead of a reader that would like
    /// 300: prefetching beyond 200 evicts its own pages before use, which
    /// the reader then misses. Without the back-off every miss raises the
    /// scale and the loop never ends; with it the scale settles under the
    /// point where thrashing starts and retries it ever more rarely.
    #[test]
    fn backs_off_from_a_prefetch_eviction_loop() {
        fn interval(scale: f64) -> Interval {
            let prefetched = (100.0 * scale) as u64;
            let evicted = prefetched.saturating_sub(200);
            let missed = (300u64.saturating_sub(prefetched.min(200)) + evicted).min(100);
            Interval {
                linear_requested: 100,
                linear_missed: missed,
                prefetched,
                evicted_unused: evicted,
                refaulted: 0,
            }
        }
        let mut c = Controller::default();
        let mut thrashing_late = 0;
        for n in 0..400 {
            let i = interval(c.scale);
            if n >= 50 && i.thrashing(c.thrash_threshold) {
                thrashing_late += 1;
            }
            c.update(i);
        }
        assert!(
            interval(c.scale).evicted_unused < 16,
            "settled at the eviction point, not above it: {}",
            c.scale
        );
        assert!(
            c.thrashed <= 8,
            "thrashed {} times in 400 intervals",
            c.thrashed
        );
        assert!(
            thrashing_late <= 4,
            "{thrashing_late} relapses after warm-up"
        );
        // Without detection (no eviction signal) the same misses drive the
        // scale to the top: the loop the back-off breaks.
        let mut blind = Controller::default();
        for _ in 0..400 {
            let i = Interval {
                evicted_unused: 0,
                ..interval(blind.scale)
            };
            blind.update(i);
        }
        assert_eq!(blind.scale, blind.max);
    }

    #[test]
    fn a_fixed_controller_never_moves() {
        let mut c = Controller::fixed(8.0);
        for i in [
            iv(100, 100, 0),
            iv(100, 0, 10_000),
            Interval {
                evicted_unused: 1000,
                ..iv(1, 0, 1)
            },
        ] {
            assert_eq!(c.update(i), 8.0);
        }
    }
}
