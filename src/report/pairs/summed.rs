//! Many pairs' bootstraps from one pass over the draws. Two cells that scored the same
//! questions (the same goals, and per goal the same seeds with as many questions scored) give
//! every resample the difference `(Σ w·b̄ − Σ w·ā) / Σ w` over the drawn goals, with `ā` a
//! goal's score averaged over its seeds: so each cell's drawn sums are made once, and each of
//! its pairs reads two of them, not the draws again (a paper-scale report compares 45 pairs per
//! condition and budget, each over 10,000 resamples of 500 goals).

use super::{Metric, PAIR_DRAWS, Scores};

/// What a cell scored, without whether it was right: per goal, its seeds and questions scored.
pub(super) type Support<'r> = Vec<(&'r str, Vec<(u64, usize)>)>;

pub(super) fn support<'r>(scores: &Scores<'r>) -> Support<'r> {
    (scores.iter())
        .map(|(goal, seeds)| (*goal, seeds.iter().map(|(s, &(_, n))| (*s, n)).collect()))
        .collect()
}

/// Cells that share a support, and each resample's drawn sums of their columns: per metric the
/// goal's weight, then per cell and metric the weighted score.
pub(super) struct Summed {
    cells: Vec<usize>,
    columns: usize,
    sums: Vec<f64>,
}

const METRICS: [Metric; 2] = [Metric::Micro, Metric::Macro];

impl Summed {
    /// The drawn sums of `cells` (indices into `scored`, every one of `support`), `drawn` being
    /// `PAIR_DRAWS` resamples of as many goals as `support` has.
    pub(super) fn new(cells: Vec<usize>, scored: &[Scores], support: &Support, drawn: &[u32]) -> Self {
        let columns = METRICS.len() * (1 + cells.len());
        let mut matrix = Vec::with_capacity(support.len() * columns);
        for (goal, seeds) in support {
            let count = seeds.len() as f64;
            let weights = METRICS.map(|metric| match metric {
                Metric::Micro => seeds.iter().map(|&(_, n)| n as f64).sum::<f64>() / count,
                Metric::Macro => 1.0,
            });
            matrix.extend(weights);
            for &cell in &cells {
                let goal_seeds = scored[cell].get(goal);
                for (metric, weight) in METRICS.into_iter().zip(weights) {
                    let score = (goal_seeds.into_iter().flat_map(|s| s.values()))
                        .map(|&(right, n)| match metric {
                            Metric::Micro => right as f64 / n as f64,
                            Metric::Macro => f64::from(u8::from(right == n)),
                        })
                        .sum::<f64>();
                    matrix.push(weight * (score / count));
                }
            }
        }
        let sums = drawn_sums(&matrix, columns, drawn, support.len());
        Summed { cells, columns, sums }
    }

    /// Each resample's B − A in `metric` (0 where the drawn goals weigh nothing).
    pub(super) fn draws(&self, a: usize, b: usize, metric: Metric) -> Vec<f64> {
        let m = METRICS.iter().position(|&x| x == metric).unwrap_or(0);
        let column = |cell: usize| {
            let at = self.cells.iter().position(|&c| c == cell).unwrap_or(0);
            METRICS.len() * (1 + at) + m
        };
        let (a, b) = (column(a), column(b));
        (self.sums.chunks_exact(self.columns))
            .map(|one| {
                if one[m] > 0.0 {
                    (one[b] - one[a]) / one[m]
                } else {
                    0.0
                }
            })
            .collect()
    }
}

/// The cells from `at` on (one condition and budget) that share a support with another, in
/// classes of two or more: their pairs' bootstraps are summed once per cell.
pub(super) fn alike_cells<'r>(scored: &[Scores<'r>], at: usize) -> Vec<(Vec<usize>, Support<'r>)> {
    let supports: Vec<Support> = scored[at..].iter().map(support).collect();
    let mut taken = vec![false; supports.len()];
    let mut classes = Vec::new();
    for (i, support) in supports.iter().enumerate() {
        if taken[i] || support.is_empty() {
            continue;
        }
        let cells: Vec<usize> = (i..supports.len())
            .filter(|&j| !taken[j] && supports[j] == *support)
            .collect();
        for &j in &cells {
            taken[j] = true;
        }
        if cells.len() >= 2 {
            classes.push((cells.iter().map(|j| at + j).collect(), support.clone()));
        }
    }
    classes
}

/// Per resample, every column's sum over the drawn rows of `matrix`, in draw order.
fn drawn_sums(matrix: &[f64], columns: usize, drawn: &[u32], goals: usize) -> Vec<f64> {
    let mut sums = vec![0.0; PAIR_DRAWS * columns];
    for (one, out) in drawn.chunks_exact(goals).zip(sums.chunks_exact_mut(columns)) {
        for &i in one {
            let row = &matrix[i as usize * columns..][..columns];
            for (sum, value) in out.iter_mut().zip(row) {
                *sum += value;
            }
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::super::{drawn_indices, goal_diffs};
    use super::*;
    use crate::rng::SplitMix64;

    /// Three cells over 60 goals of 1–6 questions and two seeds, scored at random.
    fn cells(goal_names: &[String]) -> Vec<Scores<'_>> {
        let mut rng = SplitMix64::new(5);
        let questions: Vec<usize> = goal_names.iter().map(|_| 1 + rng.below(6)).collect();
        (0..3)
            .map(|_| {
                (goal_names.iter().zip(&questions))
                    .map(|(goal, &n)| {
                        let seeds = [1, 2].map(|seed| (seed, (rng.below(n + 1), n)));
                        (goal.as_str(), seeds.into_iter().collect())
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn summed_draws_are_each_pairs_own_draws() {
        let goal_names: Vec<String> = (0..60).map(|g| format!("g{g:02}")).collect();
        let scored = cells(&goal_names);
        let support = support(&scored[0]);
        assert!(scored.iter().all(|s| super::support(s) == support));
        let drawn = drawn_indices(support.len());
        let summed = Summed::new(vec![0, 1, 2], &scored, &support, &drawn);
        for (a, b) in [(0, 1), (0, 2), (1, 2)] {
            for metric in METRICS {
                let goals = goal_diffs(&scored[a], &scored[b], metric);
                let terms: Vec<(f64, f64)> = goals.iter().map(|g| (g.weight * g.x, g.weight)).collect();
                let own: Vec<f64> = (drawn.chunks(goals.len()))
                    .map(|one| super::super::weighted_mean(&terms, one.iter().map(|&i| i as usize)))
                    .collect();
                let got = summed.draws(a, b, metric);
                assert_eq!(got.len(), own.len());
                let off = (got.iter().zip(&own))
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max);
                assert!(off < 1e-12, "{a} {b} {metric:?}: {off}");
                assert!(own.iter().any(|&d| d != own[0]), "the draws vary");
            }
        }
    }

    #[test]
    fn only_cells_that_scored_the_same_questions_are_summed_together() {
        let goal_names: Vec<String> = (0..8).map(|g| format!("g{g}")).collect();
        let mut scored = cells(&goal_names);
        scored.extend(cells(&goal_names));
        // Cell 4 failed a question of g3 under seed 2, cell 5 lost seed 1 of g0.
        scored[4].get_mut("g3").unwrap().get_mut(&2).unwrap().1 -= 1;
        scored[5].get_mut("g0").unwrap().remove(&1);
        let classes = alike_cells(&scored, 1);
        let cells: Vec<&Vec<usize>> = classes.iter().map(|(cells, _)| cells).collect();
        // Cells 1, 2 and 3 are alike (cells(...) draws the same questions); 4 and 5 stand alone.
        assert_eq!(cells, [&vec![1, 2, 3]]);
        assert!(alike_cells(&scored, 5).is_empty());
    }
}
