//! How much a cell's scores move between goals, and how much of that is seeds (SPEC §13).

use serde::Serialize;

use super::scores;
use crate::store::ledger::ResultRow;

/// A cell's spread over goals and seeds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Noise {
    /// Goals scored.
    pub(crate) goals: usize,
    /// The sample standard deviation over goals of a goal's Micro (seeds averaged), and of its
    /// Macro (the share of seeds with every question right).
    pub(crate) micro_goal_sd: f64,
    pub(crate) macro_goal_sd: f64,
    /// Of the variance of a (goal, seed)'s Micro, the share within goals (between seeds); null
    /// with one seed or no variance at all.
    pub(crate) seed_share: Option<f64>,
}

/// The sample variance (n − 1; 0 for one value).
pub(super) fn variance(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)
}

/// A cell's noise from its rows; None with fewer than two goals scored.
pub(crate) fn noise(rows: &[&ResultRow]) -> Option<Noise> {
    let goals = scores(rows);
    if goals.len() < 2 {
        return None;
    }
    let (mut micro, mut macro_, mut within) = (Vec::new(), Vec::new(), Vec::new());
    for seeds in goals.values() {
        let shares: Vec<f64> = seeds
            .values()
            .map(|&(right, n)| right as f64 / n as f64)
            .collect();
        let whole: Vec<f64> = seeds
            .values()
            .map(|&(right, n)| f64::from(u8::from(right == n)))
            .collect();
        micro.push(shares.iter().sum::<f64>() / shares.len() as f64);
        macro_.push(whole.iter().sum::<f64>() / whole.len() as f64);
        if shares.len() > 1 {
            within.push(variance(&shares));
        }
    }
    let between = variance(&micro);
    let seed_share = (!within.is_empty()).then(|| within.iter().sum::<f64>() / within.len() as f64);
    let seed_share = seed_share.and_then(|w| (between + w > 0.0).then(|| w / (between + w)));
    Some(Noise {
        goals: goals.len(),
        micro_goal_sd: between.sqrt(),
        macro_goal_sd: variance(&macro_).sqrt(),
        seed_share,
    })
}
