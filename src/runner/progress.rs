//! What a run counts as it goes: jobs done per stage (read by the progress line), calls made
//! or found per role, and the usage callbacks report.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::protocol::Role;
use crate::store::run_record::{EndpointLive, LiveProgress, RunStatus, StageCounts};
pub(crate) use crate::store::usage::{CallCounts, Usage};

/// Progress counters, per stage, read by the progress display.
#[derive(Debug)]
pub(crate) struct Progress {
    pub stages: [StageProgress; 3],
    pub started: Instant,
    /// The model endpoints, whose live limits the progress line shows.
    pub endpoints: Vec<std::sync::Arc<crate::exec::model::Endpoint>>,
    /// What the model calls of this run have cost so far.
    pub costs: Option<std::sync::Arc<crate::exec::model::CostGuard>>,
    /// Audit judgements given (SPEC §10), and how many of them the cache answered: their
    /// number is known only as the answers come, so they have no total.
    pub audited: AtomicUsize,
    pub audited_cached: AtomicUsize,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            stages: Default::default(),
            started: Instant::now(),
            endpoints: Vec::new(),
            costs: None,
            audited: AtomicUsize::new(0),
            audited_cached: AtomicUsize::new(0),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct StageProgress {
    pub total: AtomicUsize,
    pub done: AtomicUsize,
    pub cached: AtomicUsize,
    /// Answered by an identical call of this run (made once, shared).
    pub shared: AtomicUsize,
    /// Done with nothing to call (`L = 0`).
    pub skipped: AtomicUsize,
    pub failed: AtomicUsize,
}

impl Progress {
    pub(crate) fn stage(&self, role: Role) -> &StageProgress {
        &self.stages[role as usize]
    }

    /// What the run has done so far, as `run.json` shows it while the run goes.
    pub(crate) fn live(&self, state: RunStatus) -> LiveProgress {
        let load = |counter: &AtomicUsize| counter.load(Ordering::Relaxed);
        let stages = crate::protocol::Stage::ALL
            .into_iter()
            .map(|stage| {
                let counts = self.stage(stage.role());
                let failed = load(&counts.failed);
                let counts = StageCounts {
                    cached: load(&counts.cached),
                    finished: load(&counts.done) + failed,
                    failed,
                    planned: load(&counts.total),
                    shared: load(&counts.shared),
                    skipped: load(&counts.skipped),
                };
                (stage.as_str().to_owned(), counts)
            })
            .collect();
        let endpoints = (self.endpoints.iter())
            .map(|endpoint| {
                let live = endpoint.live();
                let announced = endpoint.pacer.announced_budget();
                let state = EndpointLive {
                    announced_limit: announced.map(|(limit, _)| limit),
                    announced_remaining: announced.map(|(_, remaining)| remaining),
                    in_flight: live.in_flight,
                    limit: live.limit,
                    pace_rpm: live.pace.requests.map(|r| (r * 600.0).round() / 10.0),
                    peak_in_flight: live.peak,
                    rate_limited: live.rate_limited,
                    throughput: (live.throughput * 10.0).round() / 10.0,
                };
                (endpoint.name.clone(), state)
            })
            .collect();
        LiveProgress {
            audited: load(&self.audited),
            cost_usd: self.costs.as_ref().map_or(0.0, |costs| costs.paid()),
            endpoints,
            seconds: self.started.elapsed().as_secs_f64(),
            stages,
            state,
            updated: crate::clock::utc_timestamp(std::time::SystemTime::now(), true),
            pid: std::process::id(),
        }
    }
}
