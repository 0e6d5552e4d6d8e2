//! The cross-goal condition's pairing: each goal shown a goal of another source.

use crate::rng::SplitMix64;

/// How many seeded shuffles to try for a true derangement before choosing per goal.
const DERANGEMENT_TRIES: usize = 1000;

/// For each goal (source, goal), a goal of a different source: a permutation of all goals
/// when one exists, seeded by `seed`; otherwise a seeded choice per goal.
pub(crate) fn derangement(goals: &[(usize, usize)], seed: u64) -> Vec<(usize, usize)> {
    let sources: std::collections::BTreeSet<usize> = goals.iter().map(|g| g.0).collect();
    if sources.len() < 2 {
        return goals.to_vec();
    }
    let mut rng = SplitMix64::new(seed ^ 0x6761_6363_2d78_676c);
    let mut order: Vec<usize> = (0..goals.len()).collect();
    for _ in 0..DERANGEMENT_TRIES {
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        if order.iter().enumerate().all(|(i, &j)| goals[i].0 != goals[j].0) {
            return order.into_iter().map(|j| goals[j]).collect();
        }
    }
    goals
        .iter()
        .map(|&(s, _)| {
            let others: Vec<&(usize, usize)> = goals.iter().filter(|g| g.0 != s).collect();
            *others[rng.below(others.len())]
        })
        .collect()
}
