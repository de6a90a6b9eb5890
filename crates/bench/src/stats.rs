//! Statistics over launch times, as hyperfine computes them: median and
//! min…max as the headline (launch times are skewed by the occasional slow
//! run, so the mean misleads), and outliers flagged by the modified Z-score
//! (Iglewicz and Hoaglin), with hyperfine's deliberately high threshold so
//! that only runs disturbed by something else on the machine are flagged.

/// hyperfine's threshold (`outlier_detection.rs`): far above the textbook
/// 3.5, because launch times have heavy tails and a warning should mean
/// "something interfered", not "the distribution is not normal".
pub const OUTLIER_THRESHOLD: f64 = 14.0;

/// The median of `xs` (the mean of the middle two for an even count).
/// `None` for an empty slice.
pub fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

pub fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

/// Sample standard deviation; `None` below two values.
pub fn stddev(xs: &[f64]) -> Option<f64> {
    if xs.len() < 2 {
        return None;
    }
    let m = mean(xs)?;
    let var = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (xs.len() - 1) as f64;
    Some(var.sqrt())
}

/// Modified Z-scores: (x − median) / (1.4826 · MAD). 1.4826·MAD estimates
/// the standard deviation of normal data but, unlike it, is not dragged
/// along by the outliers it is meant to find.
pub fn modified_zscores(xs: &[f64]) -> Vec<f64> {
    let Some(med) = median(xs) else {
        return Vec::new();
    };
    let dev: Vec<f64> = xs.iter().map(|x| (x - med).abs()).collect();
    let mad = median(&dev).unwrap_or(0.0);
    // All (or most) values equal: nothing deviates in a meaningful way,
    // except values that differ at all, which get an infinite score only if
    // the MAD is exactly zero. hyperfine guards with EPSILON the same way.
    let scale = 1.4826 * mad.max(f64::EPSILON);
    xs.iter().map(|x| (x - med) / scale).collect()
}

/// Indexes of the values whose modified Z-score exceeds the threshold.
pub fn outliers(xs: &[f64]) -> Vec<usize> {
    modified_zscores(xs)
        .iter()
        .enumerate()
        .filter(|(_, z)| z.abs() > OUTLIER_THRESHOLD)
        .map(|(i, _)| i)
        .collect()
}

/// Share of the cold–warm gap a launch time captures:
/// (t_cold − t) / (t_cold − t_warm). 1 means as fast as warm, 0 as slow as
/// cold, negative slower than cold. `None` when cold is not slower than
/// warm (no gap to capture: the launch does not wait for storage).
pub fn gap_captured(t: f64, cold: f64, warm: f64) -> Option<f64> {
    let gap = cold - warm;
    (gap > 0.0 && gap.is_finite()).then(|| (cold - t) / gap)
}

/// The gap captured from paired rounds: median over rounds of
/// (t_cold − t) divided by the median over rounds of (t_cold − t_warm),
/// each difference taken within one round. Robust to a machine that drifts
/// during a run (other load adding time to every launch of some rounds),
/// which moves a round's launches together but each scenario's median by
/// a different amount. `rounds` holds (cold, warm, t) of each
/// round that has all three. `None` without a positive median gap.
pub fn paired_gap_captured(rounds: &[(f64, f64, f64)]) -> Option<f64> {
    let won: Vec<f64> = rounds.iter().map(|(c, _, t)| c - t).collect();
    let gap: Vec<f64> = rounds.iter().map(|(c, w, _)| c - w).collect();
    let (won, gap) = (median(&won)?, median(&gap)?);
    (gap > 0.0 && gap.is_finite()).then(|| won / gap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paired_gap_follows_a_drifting_machine() {
        // Rounds 0-2 on a quiet machine, 3-4 with every launch 0.4 s
        // slower: the medians per scenario mix the two (cold 2.0, warm
        // 1.0, t 1.25: 75%), the paired gap does not.
        let rounds = [
            (2.0, 1.0, 1.2),
            (2.0, 1.0, 1.25),
            (2.0, 1.0, 1.15),
            (2.4, 1.4, 1.6),
            (2.4, 1.4, 1.64),
        ];
        let g = paired_gap_captured(&rounds).unwrap();
        assert!((g - 0.8).abs() < 1e-9, "{g}");
        assert_eq!(paired_gap_captured(&[]), None);
        assert_eq!(paired_gap_captured(&[(1.0, 1.0, 1.0)]), None);
    }

    #[test]
    fn median_odd_even_empty() {
        for (xs, want) in [
            (vec![3.0, 1.0, 2.0], Some(2.0)),
            (vec![4.0, 1.0, 3.0, 2.0], Some(2.5)),
            (vec![7.0], Some(7.0)),
            (vec![], None),
        ] {
            assert_eq!(median(&xs), want, "{xs:?}");
        }
    }

    #[test]
    fn mean_and_stddev() {
        let xs = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0];
        assert_eq!(mean(&xs), Some(5.0));
        let s = stddev(&xs).unwrap();
        assert!((s - 2.138089935).abs() < 1e-6, "{s}");
        assert_eq!(stddev(&[1.0]), None);
    }

    #[test]
    fn zscores_like_hyperfine() {
        // 1..5: median 3, MAD 1, so z = (x - 3) / 1.4826.
        let z = modified_zscores(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        let want = [-1.349, -0.674, 0.0, 0.674, 1.349];
        for (a, b) in z.iter().zip(want) {
            assert!((a - b).abs() < 1e-3, "{z:?}");
        }
    }

    #[test]
    fn outliers_table() {
        for (xs, want) in [
            (vec![1.0, 1.01, 0.99, 1.0, 1.02], vec![]),
            (vec![1.0, 1.01, 0.99, 1.0, 1.02, 5.0], vec![5]),
            (vec![1.0, 1.0, 1.0, 1.0], vec![]),
            (vec![0.1, 0.1, 0.1, 0.1, 0.2], vec![4]),
            (vec![], vec![]),
        ] {
            assert_eq!(outliers(&xs), want, "{xs:?}");
        }
    }

    #[test]
    fn gap_table() {
        for (t, cold, warm, want) in [
            (1.0, 1.0, 0.5, Some(0.0)),
            (0.5, 1.0, 0.5, Some(1.0)),
            (0.75, 1.0, 0.5, Some(0.5)),
            (1.25, 1.0, 0.5, Some(-0.5)),
            (0.4, 0.5, 0.5, None),
            (0.4, 0.4, 0.5, None),
        ] {
            assert_eq!(gap_captured(t, cold, warm), want, "{t} {cold} {warm}");
        }
    }
}
