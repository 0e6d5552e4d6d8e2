//! Micro and Macro accuracy (SPEC §1), per cell and seed, and their bootstrap intervals.

use serde::Serialize;

use crate::report::stats::{Interval, interval, resample};

/// The verdicts of one cell and seed, grouped by goal: `goals[g][q]` is `c_gq`.
/// A `None` is a question that was not scored (its job failed).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Score {
    /// None when no question was scored: nothing was measured.
    pub micro: Option<f64>,
    /// None when no goal had every question scored.
    #[serde(rename = "macro")]
    pub macro_: Option<f64>,
    /// Questions judged correct.
    pub correct: usize,
    /// Questions scored.
    pub questions: usize,
    /// Goals whose every question was scored.
    pub goals: usize,
    pub goals_all_correct: usize,
    /// Questions not scored because a job failed.
    pub unscored_questions: usize,
}

/// Scores one cell and seed:
/// `Micro = Σ_g Σ_q c_gq / Σ_g |Q_g|` and `Macro = (1/|G|) Σ_g Π_q c_gq`.
/// Unscored questions count in neither; a goal with one counts in neither Macro term.
pub(crate) fn score(goals: &[Vec<Option<bool>>]) -> Score {
    let mut score = Score {
        micro: None,
        macro_: None,
        correct: 0,
        questions: 0,
        goals: 0,
        goals_all_correct: 0,
        unscored_questions: 0,
    };
    for goal in goals {
        let unscored = goal.iter().filter(|c| c.is_none()).count();
        score.unscored_questions += unscored;
        score.questions += goal.len() - unscored;
        score.correct += goal.iter().filter(|c| **c == Some(true)).count();
        if unscored == 0 && !goal.is_empty() {
            score.goals += 1;
            score.goals_all_correct += usize::from(goal.iter().all(|c| *c == Some(true)));
        }
    }
    score.micro = ratio(score.correct, score.questions);
    score.macro_ = ratio(score.goals_all_correct, score.goals);
    score
}

/// The share, or None when there is nothing to share out: no measurement is a number.
fn ratio(numerator: usize, denominator: usize) -> Option<f64> {
    (denominator > 0).then(|| numerator as f64 / denominator as f64)
}

/// 95% bootstrap intervals of Micro and Macro over goals: each resample draws goals (one
/// goal of one seed is one unit) with replacement and scores them as `score` does.
pub(crate) fn bootstrap(
    goals: &[Vec<Option<bool>>],
    resamples: usize,
    seed: u64,
) -> (Option<Interval>, Option<Interval>) {
    // Per scored goal: (correct, questions, all correct); unscored questions count in neither.
    let units: Vec<(usize, usize, bool)> = goals
        .iter()
        .filter(|g| !g.is_empty() && g.iter().all(Option::is_some))
        .map(|g| {
            let correct = g.iter().filter(|c| **c == Some(true)).count();
            (correct, g.len(), correct == g.len())
        })
        .collect();
    if units.is_empty() {
        return (None, None);
    }
    let (micro, macro_): (Vec<f64>, Vec<f64>) = resample(units.len(), resamples, seed, |drawn| {
        let (mut correct, mut questions, mut whole) = (0, 0, 0);
        for unit in drawn.map(|i| units[i]) {
            correct += unit.0;
            questions += unit.1;
            whole += usize::from(unit.2);
        }
        // Every drawn unit is a scored goal with questions: both shares exist.
        (
            ratio(correct, questions).unwrap_or(0.0),
            ratio(whole, units.len()).unwrap_or(0.0),
        )
    })
    .into_iter()
    .unzip();
    (Some(interval(micro)), Some(interval(macro_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn goals(verdicts: &[&[bool]]) -> Vec<Vec<Option<bool>>> {
        verdicts
            .iter()
            .map(|g| g.iter().map(|c| Some(*c)).collect())
            .collect()
    }

    #[test]
    fn micro_and_macro_by_hand() {
        // Four goals, three questions each, each missing its last question: 8/12, no goal whole.
        let s = score(&goals(&[&[true, true, false]; 4].map(|g| g as &[bool])));
        assert_eq!((s.correct, s.questions), (8, 12));
        assert_eq!(s.micro, Some(2.0 / 3.0));
        assert_eq!(s.macro_, Some(0.0));
        assert_eq!((s.goals, s.goals_all_correct), (4, 0));
    }

    #[test]
    fn macro_is_not_the_mean_of_per_goal_accuracy() {
        // Goal A: 1 of 4 right; goal B: 1 of 1 right.
        let s = score(&goals(&[&[true, false, false, false], &[true]]));
        assert_eq!(s.micro, Some(2.0 / 5.0));
        assert_eq!(s.macro_, Some(0.5));
        let mean_per_goal = (0.25 + 1.0) / 2.0;
        assert_ne!(s.macro_, Some(mean_per_goal));
        let s = score(&goals(&[&[true, true], &[true, false, true]]));
        assert_eq!(s.micro, Some(4.0 / 5.0));
        assert_eq!(s.macro_, Some(0.5));
    }

    #[test]
    fn unscored_questions_count_in_neither_term() {
        let s = score(&[vec![Some(true), None], vec![Some(true)]]);
        assert_eq!((s.correct, s.questions, s.unscored_questions), (2, 2, 1));
        assert_eq!(s.micro, Some(1.0));
        assert_eq!((s.goals, s.goals_all_correct), (1, 1));
        // Nothing scored is no measurement, not a zero.
        let s = score(&[vec![None, None], vec![None]]);
        assert_eq!((s.micro, s.macro_), (None, None));
        assert_eq!(bootstrap(&[vec![None]], 100, 1), (None, None));
    }

    #[test]
    fn bootstrap_intervals() {
        let all_right = goals(&[&[true, true], &[true]]);
        let (Some(micro), Some(macro_)) = bootstrap(&all_right, 200, 1) else {
            panic!("scored goals have intervals");
        };
        assert_eq!(
            (micro.low, micro.high, macro_.low, macro_.high),
            (1.0, 1.0, 1.0, 1.0)
        );
        let mixed: Vec<Vec<Option<bool>>> = (0..30).map(|i| vec![Some(i % 3 != 0), Some(true)]).collect();
        let intervals = bootstrap(&mixed, 500, 7);
        assert_eq!(intervals, bootstrap(&mixed, 500, 7), "deterministic");
        let (Some(micro), Some(macro_)) = intervals else {
            panic!("scored goals have intervals");
        };
        let point = score(&mixed);
        let (point_micro, point_macro) = (point.micro.unwrap(), point.macro_.unwrap());
        assert!(micro.low <= point_micro && point_micro <= micro.high);
        assert!(macro_.low <= point_macro && point_macro <= macro_.high);
        assert!(macro_.low < macro_.high);
    }
}
