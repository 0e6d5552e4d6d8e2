//! Stopping early (SPEC §13): an anytime-valid 95% confidence sequence for the mean paired
//! difference of a pair over the goals of a cell, read in a seeded order, and the verdict a run
//! stops on. Goals read in a random order are a sample without replacement of the cell's `N`
//! goals; the sequence is Waudby-Smith & Ramdas's (2020) without-replacement construction with
//! the normal-mixture boundary of Howard et al. (2021), whose coverage holds however often it is
//! looked at (docs/statistics.md, "Stopping early").

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::stats::Interval;
use crate::store::ledger::ResultRow;

/// The error of the sequence: it holds the mean for every number of goals read, at once, with
/// probability 0.95.
pub(crate) const STOP_ALPHA: f64 = 0.05;

/// The 95% confidence sequence for the mean over all `total` goals of `x` (each in [−1, 1]),
/// after reading `x` (in reading order, without replacement), with the boundary tightest near
/// `rho` goals. Each bound is clipped to [−1, 1].
pub(crate) fn confidence_sequence(x: &[f64], total: usize, rho: f64) -> Interval {
    let t = x.len();
    if t == 0 || total == 0 || t > total {
        return Interval { low: -1.0, high: 1.0 };
    }
    let n = total as f64;
    // S_t, Σ S_{i−1}/(N−i+1) and Σ 1/(N−i+1), i = 1..t.
    let (mut sum, mut drift, mut weight) = (0.0, 0.0, 0.0);
    for (i, xi) in x.iter().enumerate() {
        let left = n - i as f64;
        drift += sum / left;
        weight += 1.0 / left;
        sum += xi;
    }
    let tr = t as f64 + rho;
    let boundary = (tr * (tr / (rho * STOP_ALPHA * STOP_ALPHA)).ln()).sqrt();
    let centre = sum + drift;
    let scale = n * weight;
    Interval {
        low: ((centre - boundary) / scale).clamp(-1.0, 1.0),
        high: ((centre + boundary) / scale).clamp(-1.0, 1.0),
    }
}

/// What the sequence says of a pair in a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It excludes 0.
    Separated,
    /// It lies within ±margin.
    WithinMargin,
    Undecided,
}

impl Verdict {
    pub(crate) fn of(interval: Interval, margin: f64) -> Verdict {
        if interval.low > 0.0 || interval.high < 0.0 {
            Verdict::Separated
        } else if interval.low >= -margin && interval.high <= margin {
            Verdict::WithinMargin
        } else {
            Verdict::Undecided
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Separated => "separated",
            Verdict::WithinMargin => "within the margin",
            Verdict::Undecided => "undecided",
        }
    }
}

/// One listed pair in one (condition, budget) after some goals.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PairCheck {
    /// `condition · ratio`, as the cell's rows name them.
    pub cell: String,
    pub a: String,
    pub b: String,
    /// Goals both compressors were scored on so far.
    pub goals: usize,
    pub interval: Interval,
    pub verdict: Verdict,
}

/// Per listed pair (a, b) and every (condition, budget) where both were scored, the confidence
/// sequence of B − A in Micro over the goals read: each goal's share right, averaged over the
/// seeds both were scored on (the goals' unweighted mean), in `order`, out of `total` goals.
pub(crate) fn check_pairs(
    rows: &[ResultRow],
    pairs: &[(String, String)],
    order: &HashMap<String, usize>,
    total: usize,
    rho: f64,
    margin: f64,
) -> Vec<PairCheck> {
    // Per (cell, compressor), its rows, then per goal, per seed: (right, scored).
    let mut by_cell: BTreeMap<(String, &str), Vec<&ResultRow>> = BTreeMap::new();
    for row in rows {
        let id = row.cell();
        let cell = format!("{} · {}", id.condition, id.rule);
        by_cell
            .entry((cell, row.compressor.as_str()))
            .or_default()
            .push(row);
    }
    let scores: BTreeMap<_, _> = (by_cell.into_iter())
        .map(|(key, rows)| (key, super::pairs::scores(&rows)))
        .collect();
    let cells: BTreeSet<&String> = scores.keys().map(|(cell, _)| cell).collect();
    let mut checks = Vec::new();
    for cell in cells {
        for (a, b) in pairs {
            let (Some(sa), Some(sb)) = (
                scores.get(&(cell.clone(), a.as_str())),
                scores.get(&(cell.clone(), b.as_str())),
            ) else {
                continue;
            };
            let mut goals: Vec<(usize, f64)> = Vec::new();
            for (goal, seeds_a) in sa {
                let (Some(seeds_b), Some(&at)) = (sb.get(goal), order.get(*goal)) else {
                    continue;
                };
                let share = |(right, scored): (usize, usize)| right as f64 / scored as f64;
                let both: Vec<f64> = (seeds_a.iter())
                    .filter_map(|(seed, &x)| Some(share(*seeds_b.get(seed)?) - share(x)))
                    .collect();
                if !both.is_empty() {
                    goals.push((at, both.iter().sum::<f64>() / both.len() as f64));
                }
            }
            goals.sort_by_key(|(at, _)| *at);
            let x: Vec<f64> = goals.iter().map(|(_, x)| *x).collect();
            let interval = confidence_sequence(&x, total, rho);
            checks.push(PairCheck {
                cell: cell.clone(),
                a: a.clone(),
                b: b.clone(),
                goals: x.len(),
                interval,
                verdict: Verdict::of(interval, margin),
            });
        }
    }
    checks
}

/// What report.json says of a run that stopped early.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub(crate) struct StoppedEarly {
    pub goals_read: usize,
    pub goals: usize,
    pub why: String,
    /// Each listed pair's confidence sequence when the run stopped.
    pub pairs: Vec<String>,
    /// Memory jobs not run, and their questions' reads and judgements.
    pub memories_not_run: usize,
    pub questions_not_run: usize,
    /// What those would have cost at this run's cost per call so far (none if nothing was paid).
    pub usd_not_paid: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rounded(interval: Interval) -> (f64, f64) {
        let r = |v: f64| (v * 100.0).round() / 100.0;
        (r(interval.low), r(interval.high))
    }

    #[test]
    fn the_worked_example_separates_at_40_of_120_goals() {
        // docs/statistics.md: N = 120, X_i = 1, ρ = 40, α = 0.05.
        assert_eq!(rounded(confidence_sequence(&[1.0; 20], 120, 40.0)), (0.10, 1.0));
        assert_eq!(rounded(confidence_sequence(&[1.0; 40], 120, 40.0)), (0.52, 1.0));
        assert_eq!(
            Verdict::of(confidence_sequence(&[1.0; 20], 120, 40.0), 0.01),
            Verdict::Separated
        );
        assert_eq!(
            confidence_sequence(&[], 120, 40.0),
            Interval { low: -1.0, high: 1.0 }
        );
        // Every goal read: the interval holds the mean, about ±0.05 around it.
        let all = confidence_sequence(&[0.5; 120], 120, 40.0);
        assert!(
            all.low < 0.5 && 0.5 < all.high && all.high - all.low < 0.2,
            "{all:?}"
        );
    }

    #[test]
    fn under_no_difference_at_most_5_percent_of_runs_ever_exclude_0() {
        // 1,000 seeded null runs of 120 goals, each a population whose mean is exactly 0: 60
        // goal differences drawn from {0, 0.25, …, 1} and their negations, read in a shuffled
        // order, checked after every batch of 20 from 40 on.
        let mut rng = crate::rng::SplitMix64::new(13);
        let mut ever = 0;
        for _ in 0..1000 {
            let half: Vec<f64> = (0..60).map(|_| rng.below(5) as f64 * 0.25).collect();
            let mut x: Vec<f64> = half.iter().flat_map(|v| [*v, -v]).collect();
            for i in (1..x.len()).rev() {
                x.swap(i, rng.below(i + 1));
            }
            let excluded = (2..=6).any(|batch| {
                let interval = confidence_sequence(&x[..batch * 20], 120, 40.0);
                interval.low > 0.0 || interval.high < 0.0
            });
            ever += usize::from(excluded);
        }
        assert!(ever <= 50, "{ever} of 1,000 null runs excluded 0");
    }
}
