//! How sure a difference between two compressors is (SPEC §13; the formulas and their worked
//! examples are in docs/statistics.md). Questions of a goal share one memory, so every interval
//! and test here resamples goals, never questions: per goal, the difference `x_g = b_g − a_g`
//! of its scores (averaged over the seeds both scored), weighted by its questions for Micro and
//! equally for Macro; a paired bootstrap over goals for the interval, a paired sign-flip
//! permutation over goals for the p-value (exact up to 16 goals that differ), Holm over the
//! report's pairs, and the smallest difference the goals could detect (MDE).

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::Cell;
use super::stats::{Interval, interval, resample};
use crate::protocol::{BudgetRule, CellId, Condition};
use crate::rng::SplitMix64;
use crate::store::ledger::ResultRow;
pub(crate) use memo::Memo;
use noise::variance;
pub(crate) use noise::{Noise, noise};
use summed::{Summed, alike_cells};

mod memo;
mod noise;
mod summed;

/// Resamples of a pair's bootstrap and draws of its permutation test (past exact enumeration).
pub(crate) const PAIR_DRAWS: usize = 10_000;
/// The fixed seed of both: the same results give the same interval and p.
pub(crate) const PAIR_SEED: u64 = 0x6761_6363_7061_6972;
/// Goals that differ, up to which the sign-flip test enumerates every sign pattern.
const EXACT_UP_TO: usize = 16;
/// Tests over as many goals that share their bootstrap's draws, made once: fewer draw their own.
const SHARED_DRAWS_FROM: usize = 4;
/// `z₀.₉₇₅ + z₀.₈`: α = 0.05 two-sided, power 0.8.
pub(crate) const Z_SUM: f64 = 1.959_963_985 + 0.841_621_234;
/// A pair is separated when its Holm-adjusted p is below this.
pub(crate) const ALPHA: f64 = 0.05;

/// One goal of a pair: its weight (questions for Micro, 1 for Macro) and `b_g − a_g`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GoalDiff {
    pub weight: f64,
    pub x: f64,
}

/// What the goals say of a difference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Compared {
    /// `D = Σ w_g x_g / Σ w_g`: B − A in the metric.
    pub diff: f64,
    pub ci95: Interval,
    pub p: f64,
    /// The goal-clustered standard error of `D`, and the MDE it gives.
    pub se: f64,
    pub mde: f64,
    pub goals: usize,
}

/// The difference over `goals`, its paired bootstrap interval, sign-flip p and MDE; None
/// without a goal.
pub(crate) fn compare(goals: &[GoalDiff]) -> Option<Compared> {
    compare_drawn(goals, None)
}

/// Every bootstrap resample's goal indices over `n` goals, in draw order: what `resample` draws
/// with `PAIR_SEED`, the same for every test over `n` goals, so drawn once for all of them.
fn drawn_indices(n: usize) -> Vec<u32> {
    let mut rng = SplitMix64::new(PAIR_SEED);
    (0..PAIR_DRAWS * n).map(|_| rng.below(n) as u32).collect()
}

/// Σ w x / Σ w over the drawn goals' `(w x, w)` (0 with no weight): one bootstrap resample.
fn weighted_mean(terms: &[(f64, f64)], drawn: impl Iterator<Item = usize>) -> f64 {
    let (mut sum, mut weight) = (0.0, 0.0);
    for i in drawn {
        let (wx, w) = terms[i];
        sum += wx;
        weight += w;
    }
    if weight > 0.0 { sum / weight } else { 0.0 }
}

/// `compare`, its bootstrap reading `drawn` (`drawn_indices` of as many goals) where given.
fn compare_drawn(goals: &[GoalDiff], drawn: Option<&[u32]>) -> Option<Compared> {
    compare_with(goals, || {
        // Each goal's (w x, w) side by side: a draw reads one pair (the same products, so the
        // same sums).
        let terms: Vec<(f64, f64)> = goals.iter().map(|g| (g.weight * g.x, g.weight)).collect();
        match drawn {
            Some(drawn) => (drawn.chunks(goals.len()))
                .map(|one| weighted_mean(&terms, one.iter().map(|&i| i as usize)))
                .collect(),
            None => resample(goals.len(), PAIR_DRAWS, PAIR_SEED, |one| {
                weighted_mean(&terms, one)
            }),
        }
    })
}

/// `compare`, its bootstrap's resampled differences made by `draws`.
fn compare_with(goals: &[GoalDiff], draws: impl FnOnce() -> Vec<f64>) -> Option<Compared> {
    let total: f64 = goals.iter().map(|g| g.weight).sum();
    if goals.is_empty() || total <= 0.0 {
        return None;
    }
    let diff = goals.iter().map(|g| g.weight * g.x).sum::<f64>() / total;
    let se = standard_error(goals, diff, total);
    Some(Compared {
        diff,
        ci95: interval(draws()),
        p: sign_flip_p(goals),
        se,
        mde: Z_SUM * se,
        goals: goals.len(),
    })
}

/// `SE = sqrt(G/(G−1) · Σ_g w_g² (x_g − D)²)`, weights normalised to sum to one.
fn standard_error(goals: &[GoalDiff], diff: f64, total: f64) -> f64 {
    let g = goals.len() as f64;
    if goals.len() < 2 {
        return 0.0;
    }
    let sum: f64 = goals
        .iter()
        .map(|d| (d.weight / total).powi(2) * (d.x - diff).powi(2))
        .sum();
    (g / (g - 1.0) * sum).sqrt()
}

/// The two-sided paired sign-flip permutation p of `T = Σ w_g x_g`: the share of sign patterns
/// whose `|T|` is at least the observed. Goals that do not differ change nothing and are left
/// out; up to `EXACT_UP_TO` that differ every pattern is counted, else `PAIR_DRAWS` seeded
/// draws give `(1 + #{|T*| ≥ |T|}) / (1 + draws)`.
pub(crate) fn sign_flip_p(goals: &[GoalDiff]) -> f64 {
    let values: Vec<f64> = (goals.iter())
        .map(|g| g.weight * g.x)
        .filter(|v| *v != 0.0)
        .collect();
    if values.is_empty() {
        return 1.0;
    }
    let observed = values.iter().sum::<f64>().abs();
    // Relative to the values' scale: sums that are equal but added in another order count.
    let tolerance = 1e-12 * values.iter().map(|v| v.abs()).sum::<f64>();
    let at_least = |t: f64| t.abs() >= observed - tolerance;
    if values.len() <= EXACT_UP_TO {
        let patterns = 1u32 << values.len();
        let extreme = (0..patterns)
            .filter(|mask| {
                let t: f64 = (values.iter().enumerate())
                    .map(|(i, v)| if mask >> i & 1 == 1 { -v } else { *v })
                    .sum();
                at_least(t)
            })
            .count();
        return extreme as f64 / f64::from(patterns);
    }
    // A draw flips value i where bit i % 64 of its (i / 64)-th random word is set:
    // `T* = Σ v − 2 Σ_flipped v`, the flipped sum read a byte of bits at a time from each block of
    // eight values' subset sums (a paper-scale report makes a thousand such tests of 10,000
    // draws over 500 goals). The patterns are those of flipping value by value; the sums differ
    // from it only in rounding, which `tolerance` absorbs.
    let total: f64 = values.iter().sum();
    let subset_sums: Vec<[f64; 256]> = (values.chunks(8))
        .map(|block| {
            let mut sums = [0.0; 256];
            for mask in 1..256usize {
                let lowest = mask.trailing_zeros() as usize;
                sums[mask] = sums[mask & (mask - 1)] + block.get(lowest).copied().unwrap_or(0.0);
            }
            sums
        })
        .collect();
    let mut rng = SplitMix64::new(PAIR_SEED);
    let mut extreme = 0usize;
    for _ in 0..PAIR_DRAWS {
        let (mut flipped, mut bits) = (0.0, 0u64);
        for (block, sums) in subset_sums.iter().enumerate() {
            if block % 8 == 0 {
                bits = rng.next_u64();
            }
            flipped += sums[(bits >> (block % 8 * 8) & 0xFF) as usize];
        }
        extreme += usize::from(at_least(total - 2.0 * flipped));
    }
    (1 + extreme) as f64 / (1 + PAIR_DRAWS) as f64
}

/// Holm's step-down adjustment, in the order given: sorted ascending, `p_(i)` becomes
/// `max_{j ≤ i} min(1, (m − j + 1) p_(j))`.
pub(crate) fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adjusted = vec![0.0; m];
    let mut running: f64 = 0.0;
    for (j, &i) in order.iter().enumerate() {
        running = running.max(((m - j) as f64 * p[i]).min(1.0));
        adjusted[i] = running;
    }
    adjusted
}

/// The goals needed to detect a paired difference `effect` at α = 0.05 and power 0.8, given
/// the sample standard deviation `sd` of per-goal differences: `((z₀.₉₇₅ + z₀.₈) · sd / d)²`.
pub(crate) fn goals_needed(sd: f64, effect: f64) -> u64 {
    if effect <= 0.0 {
        return u64::MAX;
    }
    (Z_SUM * sd / effect).powi(2).ceil() as u64
}

/// Which metric a pair compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Metric {
    Micro,
    Macro,
}

/// Two compressors of one (condition, budget), on the same goals and seeds (SPEC §13).
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct Pair {
    pub(crate) condition: Condition,
    #[serde(flatten)]
    pub(crate) rule: BudgetRule,
    pub(crate) a: String,
    pub(crate) b: String,
    pub(crate) metric: Metric,
    /// B − A.
    pub(crate) diff: f64,
    /// Paired bootstrap over goals.
    pub(crate) ci95: Interval,
    /// Paired sign-flip permutation over goals, two-sided.
    pub(crate) p: f64,
    /// Holm-adjusted over every pair of the report.
    pub(crate) p_holm: f64,
    /// `p_holm` below 0.05; else the pair is within noise.
    pub(crate) separated: bool,
    /// Goals both scored.
    pub(crate) goals: usize,
    /// The smallest difference these goals detect at α = 0.05 with power 0.8.
    pub(crate) mde: f64,
}

/// A cell's scored questions by goal and seed: (right, scored). In goal order, so that every
/// sum over goals is made in the same order (the same report, to the last bit, whatever the
/// hash seed).
pub(crate) type Scores<'r> = BTreeMap<&'r str, BTreeMap<u64, (usize, usize)>>;

pub(crate) fn scores<'r>(rows: &[&'r ResultRow]) -> Scores<'r> {
    let mut goals: Scores = BTreeMap::new();
    for row in rows.iter().filter(|r| r.failure.is_none()) {
        let Some(correct) = row.correct else { continue };
        let seed = goals
            .entry(row.goal_id.as_str())
            .or_default()
            .entry(row.seed)
            .or_default();
        seed.0 += usize::from(correct);
        seed.1 += 1;
    }
    goals
}

/// Per goal both scored (on the seeds both scored), its weight and B − A in `metric`.
pub(crate) fn goal_diffs(a: &Scores, b: &Scores, metric: Metric) -> Vec<GoalDiff> {
    let mut goals: Vec<(&&str, GoalDiff)> = Vec::new();
    for (goal, a_seeds) in a {
        let Some(b_seeds) = b.get(goal) else { continue };
        let both: Vec<((usize, usize), (usize, usize))> = (a_seeds.iter())
            .filter_map(|(seed, &sa)| Some((sa, *b_seeds.get(seed)?)))
            .filter(|((_, na), (_, nb))| *na > 0 && *nb > 0)
            .collect();
        if both.is_empty() {
            continue;
        }
        let score = |(right, scored): (usize, usize)| match metric {
            Metric::Micro => right as f64 / scored as f64,
            Metric::Macro => f64::from(u8::from(right == scored)),
        };
        let seeds = both.len() as f64;
        let x = both.iter().map(|&(sa, sb)| score(sb) - score(sa)).sum::<f64>() / seeds;
        let weight = match metric {
            Metric::Micro => both.iter().map(|((_, na), _)| *na as f64).sum::<f64>() / seeds,
            Metric::Macro => 1.0,
        };
        goals.push((goal, GoalDiff { weight, x }));
    }
    // In goal order: the bootstrap draws by index, so the same goals give the same interval.
    goals.sort_by(|a, b| a.0.cmp(b.0));
    goals.into_iter().map(|(_, d)| d).collect()
}

/// Every pair of compressors per (condition, budget), in Micro and Macro, Holm-adjusted over
/// all of them; each test read from `memo` where it was made before, else made and kept there.
pub(crate) fn pairs(cells: &[CellId], rows: &HashMap<CellId, Vec<&ResultRow>>, memo: Memo) -> Vec<Pair> {
    let mut groups: BTreeMap<(Condition, BudgetRule), Vec<&CellId>> = BTreeMap::new();
    for cell in cells {
        groups.entry((cell.condition, cell.rule)).or_default().push(cell);
    }
    let no_rows = Vec::new();
    // Every comparison first, in report order; then their bootstraps and sign flips on every
    // core (each is seeded alone, so the order they are made in changes no value).
    let mut asked = Vec::new();
    let mut scored = Vec::new();
    let mut alike = Vec::new();
    for ((condition, rule), mut group) in groups {
        group.sort_by(|x, y| x.compressor.cmp(&y.compressor));
        let at = scored.len();
        scored.extend(
            group
                .iter()
                .map(|cell| scores(rows.get(*cell).unwrap_or(&no_rows))),
        );
        alike.extend(alike_cells(&scored, at));
        for (i, a) in group.iter().copied().enumerate() {
            for (j, b) in group.iter().copied().enumerate().skip(i + 1) {
                for metric in [Metric::Micro, Metric::Macro] {
                    asked.push(((condition, rule, a, b, metric), (at + i, at + j)));
                }
            }
        }
    }
    let cells: Vec<(Metric, (usize, usize))> = (asked.iter())
        .map(|&((.., metric), cells)| (metric, cells))
        .collect();
    let compared = memo::kept_or_made(memo, &cells, &scored, &alike);
    let mut found = Vec::new();
    for (((condition, rule, a, b, metric), _), compared) in asked.into_iter().zip(compared) {
        let Some(compared) = compared else {
            continue;
        };
        found.push(Pair {
            condition,
            rule,
            a: a.compressor.clone(),
            b: b.compressor.clone(),
            metric,
            diff: compared.diff,
            ci95: compared.ci95,
            p: compared.p,
            p_holm: compared.p,
            separated: false,
            goals: compared.goals,
            mde: compared.mde,
        });
    }
    let adjusted = holm(&found.iter().map(|p| p.p).collect::<Vec<_>>());
    for (pair, p_holm) in found.iter_mut().zip(adjusted) {
        pair.p_holm = p_holm;
        pair.separated = p_holm < ALPHA;
    }
    found
}

/// Each test of `asked` (a metric and two cells of `scored`) on every core: summed where its
/// cells are `alike`, else by its own pass over the draws; those `kept` already are not made.
pub(super) fn compare_all(
    asked: &[(Metric, (usize, usize))],
    scored: &[Scores],
    alike: &[(Vec<usize>, summed::Support)],
    kept: &[Option<Compared>],
) -> Vec<Option<Compared>> {
    let tests: Vec<usize> = (0..asked.len()).collect();
    let diffs = crate::parallel::map_in_parallel(&tests, |&k| {
        let (metric, (i, j)) = asked[k];
        match kept[k] {
            Some(_) => Vec::new(),
            None => goal_diffs(&scored[i], &scored[j], metric),
        }
    });
    let mut class_of = vec![None; scored.len()];
    for (class, (cells, _)) in alike.iter().enumerate() {
        for &cell in cells {
            class_of[cell] = Some(class);
        }
    }
    let summed_pair = |(i, j): (usize, usize)| class_of[i].filter(|&c| class_of[j] == Some(c));
    // Only the classes with a test to make are summed. The draws of each goal count that many
    // tests, or a class of alike cells, share: made once (20 MB for 500 goals).
    let mut needed = vec![false; alike.len()];
    let mut tests_of = BTreeMap::<usize, usize>::new();
    for ((goals, (_, cells)), kept) in diffs.iter().zip(asked).zip(kept) {
        match (kept, summed_pair(*cells)) {
            (Some(_), _) => {}
            (None, Some(class)) => needed[class] = true,
            (None, None) => *tests_of.entry(goals.len()).or_default() += 1,
        }
    }
    let shared = (tests_of.into_iter())
        .filter(|&(_, tests)| tests >= SHARED_DRAWS_FROM)
        .map(|(n, _)| n)
        .chain(
            (alike.iter().zip(&needed)).filter_map(|((_, support), &needed)| needed.then_some(support.len())),
        );
    let shared: std::collections::BTreeSet<usize> = shared.filter(|&n| n > 0).collect();
    let drawn: BTreeMap<usize, Vec<u32>> = (shared.into_iter()).map(|n| (n, drawn_indices(n))).collect();
    let classes: Vec<usize> = (0..alike.len()).filter(|&class| needed[class]).collect();
    let mut summed: Vec<Option<Summed>> = (0..alike.len()).map(|_| None).collect();
    let made = crate::parallel::map_in_parallel(&classes, |&class| {
        let (cells, support) = &alike[class];
        let drawn = drawn.get(&support.len()).map_or(&[][..], Vec::as_slice);
        Summed::new(cells.clone(), scored, support, drawn)
    });
    for (class, made) in classes.into_iter().zip(made) {
        summed[class] = Some(made);
    }
    crate::parallel::map_in_parallel(&tests, |&k| {
        let (goals, (metric, cells)) = (&diffs[k], asked[k]);
        if kept[k].is_some() {
            return kept[k];
        }
        match summed_pair(cells).and_then(|class| summed[class].as_ref()) {
            Some(summed) => compare_with(goals, || summed.draws(cells.0, cells.1, metric)),
            None => compare_drawn(goals, drawn.get(&goals.len()).map(Vec::as_slice)),
        }
    })
}

/// The sample standard deviation of the per-goal differences of the most variable pair of a
/// run, in Micro and in Macro: what `gacc plan --power --pilot RUN` sizes the next run by.
/// None where the run has no pair (one compressor).
pub(crate) fn largest_sd(results: &[ResultRow]) -> Option<(f64, f64)> {
    let mut cells: BTreeMap<(Condition, BudgetRule), BTreeMap<&str, Vec<&ResultRow>>> = BTreeMap::new();
    for row in results {
        let id = row.cell();
        (cells.entry((id.condition, id.rule)).or_default())
            .entry(row.compressor.as_str())
            .or_default()
            .push(row);
    }
    let sd = |goals: &[GoalDiff]| variance(&goals.iter().map(|g| g.x).collect::<Vec<_>>()).sqrt();
    let mut largest: Option<(f64, f64)> = None;
    for group in cells.values() {
        let scored: Vec<Scores> = group.values().map(|rows| scores(rows)).collect();
        for (i, a) in scored.iter().enumerate() {
            for b in &scored[i + 1..] {
                let (micro, macro_) = (goal_diffs(a, b, Metric::Micro), goal_diffs(a, b, Metric::Macro));
                if micro.len() < 2 || macro_.len() < 2 {
                    continue;
                }
                let (m, k) = (sd(&micro), sd(&macro_));
                largest = Some(largest.map_or((m, k), |(x, y)| (x.max(m), y.max(k))));
            }
        }
    }
    largest
}

/// The best and worst rank a compressor can hold in its (condition, budget), by Micro: one
/// more than those above it it is separated from, and the compressors less those below it it
/// is separated from (SPEC §13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub(crate) struct Rank {
    pub(crate) best: usize,
    pub(crate) worst: usize,
}

/// Each cell's rank interval among the compressors of its (condition, budget), by Micro.
pub(crate) fn ranks(cells: &[Cell], pairs: &[Pair]) -> HashMap<CellId, Rank> {
    let separated = |x: &CellId, y: &CellId| {
        pairs.iter().any(|p| {
            p.metric == Metric::Micro
                && p.separated
                && p.condition == x.condition
                && p.rule == x.rule
                && ((p.a == x.compressor && p.b == y.compressor)
                    || (p.b == x.compressor && p.a == y.compressor))
        })
    };
    let mut ranks = HashMap::new();
    for cell in cells {
        let Some(micro) = cell.micro else { continue };
        let peers: Vec<(&CellId, f64)> = (cells.iter())
            .filter(|c| c.id.condition == cell.id.condition && c.id.rule == cell.id.rule)
            .filter_map(|c| Some((&c.id, c.micro?.mean)))
            .collect();
        let above = (peers.iter())
            .filter(|(id, m)| *m > micro.mean && separated(&cell.id, id))
            .count();
        let below = (peers.iter())
            .filter(|(id, m)| *m < micro.mean && separated(&cell.id, id))
            .count();
        ranks.insert(
            cell.id.clone(),
            Rank {
                best: 1 + above,
                worst: peers.len() - below,
            },
        );
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sign-flip p drawn value by value, as SPEC §13 states it: what `sign_flip_p`'s
    /// subset sums must give.
    fn flipped_one_by_one(values: &[f64]) -> f64 {
        let observed = values.iter().sum::<f64>().abs();
        let tolerance = 1e-12 * values.iter().map(|v| v.abs()).sum::<f64>();
        let mut rng = SplitMix64::new(PAIR_SEED);
        let mut extreme = 0usize;
        for _ in 0..PAIR_DRAWS {
            let (mut t, mut bits) = (0.0, 0u64);
            for (i, v) in values.iter().enumerate() {
                if i % 64 == 0 {
                    bits = rng.next_u64();
                }
                t += if bits >> (i % 64) & 1 == 1 { -v } else { *v };
            }
            extreme += usize::from(t.abs() >= observed - tolerance);
        }
        (1 + extreme) as f64 / (1 + PAIR_DRAWS) as f64
    }

    #[test]
    fn shared_draws_are_the_draws_a_test_makes_alone() {
        let mut rng = SplitMix64::new(11);
        for goals in [1, 2, 37, 120] {
            let diffs: Vec<GoalDiff> = (0..goals)
                .map(|_| GoalDiff {
                    weight: 1.0 + rng.below(4) as f64,
                    x: rng.below(5) as f64 / 4.0 - 0.5,
                })
                .collect();
            let alone = compare(&diffs).unwrap();
            assert_eq!(
                compare_drawn(&diffs, Some(&drawn_indices(goals))),
                Some(alone),
                "{goals}"
            );
        }
    }

    #[test]
    fn the_subset_sums_flip_as_value_by_value_does() {
        let (mut rng, mut checked) = (SplitMix64::new(7), 0);
        for goals in [17, 40, 64, 65, 131, 500] {
            for shift in [0.0, 0.05, 0.2] {
                let diffs: Vec<GoalDiff> = (0..goals)
                    .map(|_| GoalDiff {
                        weight: 1.0 + rng.below(5) as f64,
                        x: (rng.below(7) as f64 - 3.0) / 3.0 + shift,
                    })
                    .collect();
                let values: Vec<f64> = (diffs.iter())
                    .map(|g| g.weight * g.x)
                    .filter(|v| *v != 0.0)
                    .collect();
                if values.len() <= EXACT_UP_TO {
                    continue;
                }
                checked += 1;
                assert_eq!(
                    sign_flip_p(&diffs),
                    flipped_one_by_one(&values),
                    "{goals} {shift}"
                );
            }
        }
        assert!(checked >= 15, "{checked} drawn tests");
    }

    fn equal(x: &[f64]) -> Vec<GoalDiff> {
        x.iter().map(|&x| GoalDiff { weight: 8.0, x }).collect()
    }

    /// docs/statistics.md's worked example: 12 goals of 8 questions, B right on 3 goals A is
    /// not, A on 1 goal B is not.
    #[test]
    fn the_worked_example_resamples_goals_not_questions() {
        let goals = equal(&[1.0, 1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        let compared = compare(&goals).unwrap();
        assert!((compared.diff - 2.0 / 12.0).abs() < 1e-12);
        // 16 sign patterns of the four goals that differ, 10 of them with |sum| ≥ 2.
        assert_eq!(compared.p, 0.625);
        assert!((compared.mde - 0.4669).abs() < 5e-5, "{}", compared.mde);
        assert!(compared.ci95.low <= 0.0 && compared.ci95.high > compared.diff);
        assert_eq!(compare(&goals).unwrap(), compared, "a fixed seed");
        // The goals needed to detect 0.02, from the sample SD of the differences (0.5774).
        let mean = 2.0 / 12.0;
        let sd = ((goals.iter().map(|g| (g.x - mean).powi(2)).sum::<f64>()) / 11.0).sqrt();
        assert!((sd - 0.5774).abs() < 5e-5);
        assert_eq!(goals_needed(sd, 0.02), 6541);
    }

    #[test]
    fn holm_steps_down_and_stays_monotone() {
        let adjusted = holm(&[0.01, 0.04, 0.03]);
        let expected = [0.03, 0.06, 0.06];
        for (got, want) in adjusted.iter().zip(expected) {
            assert!((got - want).abs() < 1e-12, "{adjusted:?}");
        }
        assert_eq!(holm(&[0.5, 0.9]), vec![1.0, 1.0]);
        assert!(holm(&[]).is_empty());
    }

    #[test]
    fn a_difference_on_every_goal_is_separated_and_none_is_not() {
        // 30 goals, B right on every one A is not: past exact enumeration, p at its floor.
        let all = equal(&[1.0; 30]);
        let compared = compare(&all).unwrap();
        assert_eq!(compared.p, 1.0 / (1.0 + PAIR_DRAWS as f64));
        assert_eq!((compared.ci95.low, compared.ci95.high), (1.0, 1.0));
        // No goal differs: p is 1 and the interval is zero.
        let none = compare(&equal(&[0.0; 10])).unwrap();
        assert_eq!(none.p, 1.0);
        assert_eq!(none.mde, 0.0);
        // Exact: 4 goals all one way give 2 of 16 patterns.
        assert_eq!(sign_flip_p(&equal(&[1.0; 4])), 0.125);
        assert!(compare(&[]).is_none());
    }

    #[test]
    fn noise_splits_goals_from_seeds() {
        let row = |seed: u64, goal: &str, correct: bool| -> ResultRow {
            serde_json::from_value(serde_json::json!({
                "seed": seed, "compressor": "c", "condition": "own-goal", "ratio": 0.5,
                "source_id": "s", "goal_id": goal, "question_id": "q", "memory_key": "k",
                "answer": "a", "correct": correct,
            }))
            .unwrap()
        };
        // Goal g1 right under both seeds, g2 under one: goal scores 1 and 0.5.
        let rows = [
            row(1, "g1", true),
            row(2, "g1", true),
            row(1, "g2", true),
            row(2, "g2", false),
        ];
        let rows: Vec<&ResultRow> = rows.iter().collect();
        let found = noise(&rows).unwrap();
        assert_eq!(found.goals, 2);
        // Between goals: sd of (1, 0.5) = 0.3536; within: var over seeds (0, 0.5) = 0 and 0.5,
        // mean 0.25; between 0.125: seeds' share 0.25 / 0.375.
        assert!((found.micro_goal_sd - 0.125f64.sqrt()).abs() < 1e-12);
        assert!((found.seed_share.unwrap() - 0.25 / 0.375).abs() < 1e-12);
        assert!(noise(&rows[..2]).is_none(), "one goal has no spread");
    }

    #[test]
    fn weights_count_questions_for_micro() {
        // A goal of 30 questions that gains a third and one of 2 that loses all: D is the
        // questions' difference, (10 − 2) / 32.
        let goals = [
            GoalDiff {
                weight: 30.0,
                x: 1.0 / 3.0,
            },
            GoalDiff { weight: 2.0, x: -1.0 },
        ];
        assert!((compare(&goals).unwrap().diff - 8.0 / 32.0).abs() < 1e-12);
    }
}
