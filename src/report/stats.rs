//! The statistics behind the reports: the spread over seeds, one bootstrap (a fixed-seed
//! resampling loop and its percentile interval) for a cell's intervals and for `gacc diff`'s
//! paired test, the exact McNemar test, and nearest-rank percentiles for latencies.

use serde::Serialize;

use crate::rng::SplitMix64;

/// Mean and sample standard deviation (n - 1; 0 for a single value) over seeds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Spread {
    pub mean: f64,
    pub std: f64,
}

/// `0.667 ± 0.012`, or `n/a` where nothing was measured.
pub(crate) fn shown(spread: Option<Spread>) -> String {
    match spread {
        Some(Spread { mean, std }) => format!("{mean:.3} ± {std:.3}"),
        None => "n/a".to_owned(),
    }
}

pub(crate) fn spread(values: &[f64]) -> Spread {
    let n = values.len();
    if n == 0 {
        return Spread { mean: 0.0, std: 0.0 };
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    let std = if n < 2 {
        0.0
    } else {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
    };
    Spread { mean, std }
}

/// Resamples of a cell's bootstrap interval in `report.json`.
pub(crate) const REPORT_RESAMPLES: usize = 1000;
/// The fixed seed of every report's bootstrap: the same results give the same interval.
pub(crate) const REPORT_SEED: u64 = 0x6761_6363_6369_3935;
/// Resamples of `gacc diff`'s paired bootstrap: more than a report's, since a regression
/// verdict rests on its interval.
pub(crate) const DIFF_RESAMPLES: usize = 10_000;
/// The fixed seed of `gacc diff`'s paired bootstrap.
pub(crate) const DIFF_SEED: u64 = 0x6761_6363_6469_6666;

/// A 95% percentile interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Interval {
    pub low: f64,
    pub high: f64,
}

/// `resamples` values of `statistic`, each over `n` indices drawn uniformly with replacement
/// from a generator seeded with `seed` (so the same inputs give the same values).
pub(crate) fn resample<T>(
    n: usize,
    resamples: usize,
    seed: u64,
    mut statistic: impl FnMut(Draws<'_>) -> T,
) -> Vec<T> {
    let mut rng = SplitMix64::new(seed);
    (0..resamples)
        .map(|_| {
            statistic(Draws {
                rng: &mut rng,
                n,
                left: n,
            })
        })
        .collect()
}

/// One resample's indices: `n` draws from `0..n`, made as they are read. A type of its own,
/// not a `dyn Iterator`, so a statistic's loop inlines the draw (a report resamples hundreds
/// of cells a thousand times each, at the end of a run).
pub(crate) struct Draws<'r> {
    rng: &'r mut SplitMix64,
    n: usize,
    left: usize,
}

impl Iterator for Draws<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        self.left = self.left.checked_sub(1)?;
        Some(self.rng.below(self.n))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// The 95% percentile interval of bootstrap values (the empirical 2.5% and 97.5% points).
pub(crate) fn interval(mut values: Vec<f64>) -> Interval {
    if values.is_empty() {
        return Interval { low: 0.0, high: 0.0 };
    }
    // The two order statistics alone: what sorting every value would give, in linear time (a
    // paper-scale report takes a thousand intervals of 10,000 values).
    let rank = |q: f64| ((q * values.len() as f64) as usize).min(values.len() - 1);
    let (low, high) = (rank(0.025), rank(0.975));
    let (below, high_value, _) = values.select_nth_unstable_by(high, f64::total_cmp);
    let high = *high_value;
    let low = if low < below.len() {
        *below.select_nth_unstable_by(low, f64::total_cmp).1
    } else {
        high
    };
    Interval { low, high }
}

/// A paired bootstrap of the Macro difference (B − A) over goals scored in both runs.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Bootstrap {
    pub shared_goals: usize,
    pub delta: f64,
    pub ci95_low: f64,
    pub ci95_high: f64,
}

/// The exact two-sided McNemar p-value for `b` and `c` discordant pairs:
/// `min(1, 2 · P(X ≤ min(b, c)))` with `X ~ Binomial(b + c, 1/2)`.
pub(crate) fn mcnemar_p(b: usize, c: usize) -> f64 {
    let n = b + c;
    if n == 0 {
        return 1.0;
    }
    let k = b.min(c);
    // log C(n, i) - n log 2, summed in log space for large n.
    let ln2 = std::f64::consts::LN_2;
    let mut log_term = -(n as f64) * ln2; // i = 0
    let mut log_sum = log_term;
    for i in 1..=k {
        log_term += ((n - i + 1) as f64).ln() - (i as f64).ln();
        let (hi, lo) = if log_sum > log_term {
            (log_sum, log_term)
        } else {
            (log_term, log_sum)
        };
        log_sum = hi + (lo - hi).exp().ln_1p();
    }
    (2.0 * log_sum.exp()).min(1.0)
}

/// Percentile interval of the mean difference of paired 0/1 outcomes, resampled with a fixed
/// seed.
pub(crate) fn paired_bootstrap(pairs: &[(bool, bool)], resamples: usize, seed: u64) -> Bootstrap {
    let n = pairs.len();
    let delta_of = |sum: i64| if n == 0 { 0.0 } else { sum as f64 / n as f64 };
    let differences: Vec<i64> = pairs.iter().map(|(a, b)| i64::from(*b) - i64::from(*a)).collect();
    let delta = delta_of(differences.iter().sum());
    if n == 0 {
        return Bootstrap {
            shared_goals: 0,
            delta,
            ci95_low: 0.0,
            ci95_high: 0.0,
        };
    }
    let deltas = resample(n, resamples, seed, |drawn| {
        delta_of(drawn.map(|i| differences[i]).sum())
    });
    let Interval { low, high } = interval(deltas);
    Bootstrap {
        shared_goals: n,
        delta,
        ci95_low: low,
        ci95_high: high,
    }
}

/// The value at quantile `q` of sorted values (nearest rank).
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_over_seeds() {
        assert_eq!(spread(&[0.5]), Spread { mean: 0.5, std: 0.0 });
        let s = spread(&[1.0, 2.0, 3.0]);
        assert_eq!(s.mean, 2.0);
        assert_eq!(s.std, 1.0);
    }

    #[test]
    fn mcnemar_matches_hand_computed_binomial_tails() {
        assert_eq!(mcnemar_p(0, 0), 1.0);
        // n = 5, k = 0: 2 · (1/32) = 0.0625
        assert!((mcnemar_p(0, 5) - 0.0625).abs() < 1e-12);
        // n = 10, k = 1: 2 · (1 + 10)/1024 = 0.021484375
        assert!((mcnemar_p(1, 9) - 0.021_484_375).abs() < 1e-12);
        // n = 12, k = 2: 2 · (1 + 12 + 66)/4096 = 0.03857421875
        assert!((mcnemar_p(10, 2) - 0.038_574_218_75).abs() < 1e-12);
        assert_eq!(mcnemar_p(3, 3), 1.0);
        // Large n stays finite and symmetric.
        let p = mcnemar_p(40_000, 40_400);
        assert!(p > 0.0 && p < 1.0);
        assert_eq!(p, mcnemar_p(40_400, 40_000));
    }

    #[test]
    fn bootstrap_is_deterministic_and_brackets_the_difference() {
        let pairs: Vec<(bool, bool)> = (0..40).map(|i| (i % 2 == 0, i % 4 != 3)).collect();
        let one = paired_bootstrap(&pairs, 2000, 7);
        assert_eq!(one, paired_bootstrap(&pairs, 2000, 7));
        // A right on 20 of 40, B right on 30 of 40: delta 0.25.
        assert!((one.delta - 0.25).abs() < 1e-12);
        assert!(one.ci95_low < 0.25 && one.ci95_high > 0.25);
        assert!(one.ci95_low > 0.0, "a clear gain excludes zero");
        // All differences equal: the interval collapses onto them.
        let same = paired_bootstrap(&[(false, true); 10], 500, 1);
        assert_eq!((same.ci95_low, same.ci95_high), (1.0, 1.0));
        let none = paired_bootstrap(&[], 500, 1);
        assert_eq!(none.shared_goals, 0);
    }

    #[test]
    fn the_interval_is_the_sorted_values_2_5_and_97_5_percent_points() {
        let mut rng = SplitMix64::new(3);
        for n in [1, 2, 3, 39, 40, 41, 80, 10_000] {
            // Few distinct values: ties at the two points.
            let values: Vec<f64> = (0..n).map(|_| rng.below(7) as f64 / 4.0 - 0.5).collect();
            let mut sorted = values.clone();
            sorted.sort_by(f64::total_cmp);
            let at = |q: f64| sorted[((q * n as f64) as usize).min(n - 1)];
            let got = interval(values);
            assert_eq!((got.low, got.high), (at(0.025), at(0.975)), "{n}");
        }
        assert_eq!(interval(Vec::new()), Interval { low: 0.0, high: 0.0 });
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(percentile(&values, 0.5), 10.0);
        assert_eq!(percentile(&values, 0.95), 19.0);
        assert_eq!(percentile(&values, 1.0), 20.0);
        assert_eq!(percentile(&[3.0], 0.5), 3.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }
}
