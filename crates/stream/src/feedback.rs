//! Feedback (prefetchd §IV-D): the aggressiveness scale factor rises when
//! predictable (linear) application reads still reach the disk, and falls
//! when none do while the prefetcher reads more than the application asks.

/// The scale factor's controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Controller {
    pub scale: f64,
    pub min: f64,
    pub max: f64,
    /// Share of linear requests reaching disk above which to speed up.
    pub miss_threshold: f64,
}

impl Default for Controller {
    fn default() -> Self {
        // prefetchd starts near 1.0: read what the application is expected to use.
        Controller {
            scale: 1.0,
            min: 0.25,
            max: 16.0,
            miss_threshold: 0.05,
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
}

impl Controller {
    /// Adjusts the scale after an interval and returns it.
    pub fn update(&mut self, i: Interval) -> f64 {
        let miss_share = if i.linear_requested == 0 {
            0.0
        } else {
            i.linear_missed as f64 / i.linear_requested as f64
        };
        if miss_share > self.miss_threshold {
            self.scale = (self.scale * 1.5).min(self.max);
        } else if i.linear_missed == 0 && i.prefetched > i.linear_requested {
            self.scale = (self.scale * 0.8).max(self.min);
        }
        self.scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rises_on_misses_falls_on_waste_and_converges() {
        let mut c = Controller::default();
        let cases = [
            (
                Interval {
                    linear_requested: 100,
                    linear_missed: 50,
                    prefetched: 50,
                },
                1.5,
            ),
            (
                Interval {
                    linear_requested: 100,
                    linear_missed: 20,
                    prefetched: 80,
                },
                2.25,
            ),
            (
                Interval {
                    linear_requested: 100,
                    linear_missed: 0,
                    prefetched: 100,
                },
                2.25,
            ),
            (
                Interval {
                    linear_requested: 100,
                    linear_missed: 0,
                    prefetched: 300,
                },
                1.8,
            ),
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
            c.update(Interval {
                linear_requested: 100,
                linear_missed: missed,
                prefetched,
            });
        }
        assert!((2.0..=6.0).contains(&c.scale), "scale {}", c.scale);
        // Bounds hold.
        let mut c = Controller::default();
        for _ in 0..50 {
            c.update(Interval {
                linear_requested: 10,
                linear_missed: 10,
                prefetched: 0,
            });
        }
        assert_eq!(c.scale, c.max);
        for _ in 0..50 {
            c.update(Interval {
                linear_requested: 10,
                linear_missed: 0,
                prefetched: 1000,
            });
        }
        assert_eq!(c.scale, c.min);
    }
}
