//! `[run] stop` (SPEC §13, "Stopping early"): the run's goals in a seeded order, cut into
//! batches of `every`, and the check between batches that stops the run once every listed pair
//! is decided; what the report then says of the goals read and the work not done.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::app::prepare::Prepared;
use crate::hash::sha256;
use crate::inputs::manifest::StopSpec;
use crate::parallel::Locked;
use crate::report::sequence::{PairCheck, StoppedEarly, Verdict, check_pairs};
use crate::runner::{Batches, Outcome};

/// How far a run with `[run] stop` read: the goals read when it stopped, and the checks then.
#[derive(Debug, Default)]
pub(super) struct Read {
    pub goals: AtomicUsize,
    pub checks: Mutex<Vec<PairCheck>>,
}

/// Every goal of the dataset in reading order: by the SHA-256 of its source's and its own id
/// (a fixed pseudo-random order, the same on every run and whatever the dataset's order).
fn reading_order(prepared: &Prepared) -> Vec<(usize, usize)> {
    let sources = &prepared.dataset.sources;
    let mut goals: Vec<(String, (usize, usize))> = (sources.iter().enumerate())
        .flat_map(|(s, source)| {
            (source.goals.iter().enumerate()).map(move |(g, goal)| {
                (
                    sha256(serde_json::json!([source.id, goal.id]).to_string()),
                    (s, g),
                )
            })
        })
        .collect();
    goals.sort();
    goals.into_iter().map(|(_, at)| at).collect()
}

/// The plan's memory jobs in batches of `spec.every` goals, and the check between batches.
/// A job joins the batch of the first of its goals to be read (a no-goal memory serves every
/// goal of its source).
pub(super) fn batches(prepared: &Prepared, spec: &StopSpec, quiet: bool, read: &Arc<Read>) -> Batches {
    let order = reading_order(prepared);
    let every = spec.every.max(1);
    let position: HashMap<(usize, usize), usize> =
        (order.iter().enumerate()).map(|(i, at)| (*at, i)).collect();
    let batch_count = order.len().div_ceil(every).max(1);
    let mut jobs = vec![Vec::new(); batch_count];
    for (index, job) in prepared.plan.memories.iter().enumerate() {
        let first = (job.questions.iter())
            .filter_map(|q| position.get(&(job.source, q.goal)))
            .min()
            .copied()
            .unwrap_or(0);
        jobs[first / every].push(index);
    }
    let sources = &prepared.dataset.sources;
    let ids: Vec<String> = (order.iter())
        .map(|&(s, g)| sources[s].goals[g].id.clone())
        .collect();
    let (spec, read, total) = (spec.clone(), read.clone(), order.len());
    let pairs: Vec<(String, String)> = (spec.pairs.iter()).map(|[a, b]| (a.clone(), b.clone())).collect();
    let check = move |rows: &[crate::store::ledger::ResultRow], batches: usize| -> Option<String> {
        let goals = (batches * spec.every).min(total);
        read.goals.store(goals, Ordering::Relaxed);
        if goals < spec.min_goals {
            return None;
        }
        let positions: HashMap<String, usize> = (ids.iter().take(goals).enumerate())
            .map(|(i, id)| (id.clone(), i))
            .collect();
        let checks = check_pairs(
            rows,
            &pairs,
            &positions,
            total,
            spec.min_goals as f64,
            spec.margin,
        );
        if !quiet {
            // On a terminal, over the progress line, which is drawn again below.
            use std::io::IsTerminal;
            let clear = if std::io::stderr().is_terminal() {
                "\r\x1b[K"
            } else {
                ""
            };
            eprintln!("{clear}stop check after {goals} of {total} goals:");
            for check in &checks {
                eprintln!("  {}", shown(check));
            }
        }
        let decided = !checks.is_empty() && checks.iter().all(|c| c.verdict != Verdict::Undecided);
        *read.checks.locked() = checks;
        decided.then(|| format!("every listed pair was decided after {goals} of {total} goals"))
    };
    Batches {
        jobs,
        check: Box::new(check),
    }
}

/// One pair's check, as the terminal and report.md say it.
pub(super) fn shown(check: &PairCheck) -> String {
    format!(
        "{} vs {} · {}: {} − {} in [{:+.3}, {:+.3}] over {} goals, {}",
        check.a,
        check.b,
        check.cell,
        check.b,
        check.a,
        check.interval.low,
        check.interval.high,
        check.goals,
        check.verdict.as_str()
    )
}

/// What a run stopped by its check read and left, from its plan and outcome.
pub(super) fn stopped_early(prepared: &Prepared, outcome: &Outcome, read: &Read, why: &str) -> StoppedEarly {
    let plan = &prepared.plan;
    let run = outcome.ledger.len();
    let memories_not_run = plan.memories.len().saturating_sub(run);
    let questions_not_run = plan.question_jobs().saturating_sub(outcome.results.len());
    let made: usize = outcome.this_run.values().map(|c| c.made).sum();
    let paid: f64 = outcome.paid.values().map(|u| u.cost_usd).sum();
    let usd_not_paid = (paid > 0.0 && made > 0).then(|| {
        let calls_not_made = memories_not_run + 2 * questions_not_run;
        paid / made as f64 * calls_not_made as f64
    });
    StoppedEarly {
        goals_read: read.goals.load(Ordering::Relaxed),
        goals: prepared.dataset.goals().count(),
        why: why.to_owned(),
        pairs: read.checks.locked().iter().map(shown).collect(),
        memories_not_run,
        questions_not_run,
        usd_not_paid,
    }
}
