//! Goals read in batches (SPEC §13, "Stopping early"): memory jobs start in the order of their
//! goals' batches, each batch finished before the next starts, and a check after each batch may
//! stop the run there. Without batches, jobs start in plan order, as one batch.

use super::MemoryOutcome;
use crate::store::ledger::ResultRow;

/// A run's goals in batches, and what decides after each whether to read on.
pub(crate) struct Batches {
    /// Each batch's memory jobs (indices into the plan's memories), in reading order.
    pub jobs: Vec<Vec<usize>>,
    /// Asked after each batch but the last, with every result row so far and the batches read:
    /// `Some(why)` stops the run there.
    pub check: Check,
}

/// The check between batches.
pub(crate) type Check = Box<dyn FnMut(&[ResultRow], usize) -> Option<String> + Send + Sync>;

/// Where a run is in its reading order.
pub(super) struct Reading {
    order: Vec<usize>,
    /// Where each batch ends in `order`.
    ends: Vec<usize>,
    batch: usize,
    check: Option<Check>,
    /// The rows of every memory finished, for the check.
    seen: Vec<ResultRow>,
}

impl Reading {
    pub(super) fn of(batches: Option<Batches>, total: usize) -> Reading {
        let Some(Batches { jobs, check }) = batches else {
            return Reading {
                order: (0..total).collect(),
                ends: vec![total],
                batch: 0,
                check: None,
                seen: Vec::new(),
            };
        };
        let ends = (jobs.iter())
            .scan(0, |end, batch| {
                *end += batch.len();
                Some(*end)
            })
            .collect();
        Reading {
            order: jobs.into_iter().flatten().collect(),
            ends,
            batch: 0,
            check: Some(check),
            seen: Vec::new(),
        }
    }

    /// The memory job that starts `nth`.
    pub(super) fn job(&self, nth: usize) -> usize {
        self.order[nth]
    }

    /// How many jobs may have started before the current batch is read.
    pub(super) fn limit(&self) -> usize {
        self.ends.get(self.batch).copied().unwrap_or(self.order.len())
    }

    /// Every job of the reading order.
    pub(super) fn total(&self) -> usize {
        self.order.len()
    }

    /// A memory job finished.
    pub(super) fn saw(&mut self, memory: &MemoryOutcome) {
        if self.check.is_some() {
            self.seen
                .extend(memory.results.iter().map(|(row, _)| row.clone()));
        }
    }

    /// The current batch is read: why the run stops here, or None to read the next.
    pub(super) fn batch_read(&mut self) -> Option<String> {
        self.batch += 1;
        let check = self.check.as_mut()?;
        check(&self.seen, self.batch)
    }
}
