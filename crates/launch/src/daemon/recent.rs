//! The latest launches' latencies, for `status`: exec to replay start, to
//! the first request, and so on, as median, 90th percentile and maximum.

/// How many of the latest launches the status percentiles cover. They are
/// recomputed (copied and sorted) on every pass of the event loop, so they
/// must not grow with the daemon's uptime: 100,000 launches would cost
/// milliseconds every 20 ms.
const RECENT_LAUNCHES: usize = 4096;

/// One latency over the latest launches, in microseconds.
#[derive(Default)]
pub(super) struct Recent(Vec<f64>);

impl Recent {
    /// Appends `x`, dropping the oldest beyond [`RECENT_LAUNCHES`].
    pub(super) fn push(&mut self, x: f64) {
        let v = &mut self.0;
        if v.len() >= RECENT_LAUNCHES {
            v.drain(..=v.len() - RECENT_LAUNCHES);
        }
        v.push(x);
    }

    /// Median, 90th percentile and maximum (zeros before any launch).
    pub(super) fn percentiles(&self) -> [f64; 3] {
        if self.0.is_empty() {
            return [0.0; 3];
        }
        let mut s = self.0.clone();
        s.sort_by(f64::total_cmp);
        let at = |q: f64| s[((s.len() - 1) as f64 * q).round() as usize];
        [at(0.5), at(0.9), s[s.len() - 1]]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_launches_only() {
        let mut r = Recent::default();
        assert_eq!(r.percentiles(), [0.0; 3]);
        for i in 0..RECENT_LAUNCHES + 10 {
            r.push(i as f64);
        }
        assert_eq!(r.0.len(), RECENT_LAUNCHES);
        assert_eq!(r.0[0], 10.0, "the oldest were dropped");
        assert_eq!(r.percentiles()[2], (RECENT_LAUNCHES + 9) as f64);
        let mut r = Recent::default();
        for x in [3.0, 1.0, 2.0] {
            r.push(x);
        }
        assert_eq!(r.percentiles(), [2.0, 3.0, 3.0]);
    }
}
