//! What run.json records of a run: its endpoints, its phases, and its progress while it runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::app::prepare::Prepared;
use crate::files::pretty;
use crate::runner::Progress;
use crate::store::run_folder::{RUN, RunFolder};
use crate::store::run_record::{EndpointRecord, RunRecord, RunStatus};
use crate::trace::TraceEvent;

use super::RunOptions;

/// What each model endpoint did in this run: HTTP requests, retries, 429s, its last limit.
pub(super) fn endpoint_record(models: &crate::app::prepare::Models) -> BTreeMap<String, EndpointRecord> {
    models
        .endpoints
        .iter()
        .map(|(name, endpoint)| {
            let live = endpoint.live();
            let per_minute = |rate: Option<f64>| rate.map(|r| (r * 60.0 * 10.0).round() / 10.0);
            let sustained = endpoint.pacer.sustained().unwrap_or_default();
            let record = EndpointRecord {
                requests: endpoint.requests.load(std::sync::atomic::Ordering::Relaxed),
                retries: endpoint.retries.load(std::sync::atomic::Ordering::Relaxed),
                rate_limited: live.rate_limited,
                final_limit: live.limit,
                local_server: endpoint.is_local(),
                peak_in_flight: live.peak,
                // The pace the endpoint ended on (learned, announced or set), and what it
                // sustained: `gacc plan` estimates the next run's time from it.
                pace_rpm: per_minute(live.pace.requests),
                pace_tpm: per_minute(live.pace.tokens),
                sustained_rpm: per_minute(sustained.requests),
                sustained_tpm: per_minute(sustained.tokens),
                batches: endpoint.batches().map(|b| b.done),
                announced_limit: endpoint.pacer.announced_budget().map(|(limit, _)| limit),
                verdict_format: endpoint.verdict_format().map(str::to_owned),
            };
            (name.clone(), record)
        })
        .collect()
}

/// The cache's place as the manifest wrote it, for `run.json`.
pub(super) fn cache_shown(prepared: &Prepared) -> String {
    match &prepared.loaded.manifest.run.cache {
        Some(path) => path.display().to_string(),
        None => ".gacc/cache".into(),
    }
}

/// `run.json` while a run is in flight: its record so far, with its progress.
#[derive(Clone)]
pub(super) struct LiveRecord {
    pub(super) folder: RunFolder,
    pub(super) record: RunRecord,
    pub(super) progress: Arc<Progress>,
}

impl LiveRecord {
    /// Writes `run.json` now and then every `LIVE_EVERY` until aborted.
    pub(super) async fn follow(self) {
        loop {
            self.write(RunStatus::Running);
            tokio::time::sleep(LIVE_EVERY).await;
        }
    }

    /// Writes `run.json` with the progress so far (whole: a reader never sees half of one).
    pub(super) fn write(&self, status: RunStatus) {
        let record = RunRecord {
            progress: Some(self.progress.live(status)),
            seconds: self.progress.started.elapsed().as_secs_f64(),
            ..self.record.clone()
        };
        if let Err(error) = self.folder.write(RUN, pretty(&record).as_bytes()) {
            tracing::warn!(%error, "could not write the run's progress");
        }
    }
}

/// How often `run.json` shows a run in flight anew.
pub(super) const LIVE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Where a run's time went, phase by phase, for `run.json`.
pub(super) struct Phases {
    last: Instant,
    pub(super) seconds: Vec<(String, f64)>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            last: Instant::now(),
            seconds: Vec::new(),
        }
    }
}

impl Phases {
    pub(super) fn end(&mut self, name: &str) {
        let now = Instant::now();
        self.seconds
            .push((name.to_owned(), (now - self.last).as_secs_f64()));
        crate::trace::record(&TraceEvent::PhaseFinished {
            phase: std::borrow::Cow::Borrowed(name),
            seconds: (now - self.last).as_secs_f64(),
        });
        self.last = now;
    }
}

/// The command line that runs the same experiment again.
pub(super) fn resume_command(options: &RunOptions) -> String {
    let mut words = vec![
        "gacc".to_owned(),
        "run".to_owned(),
        options.manifest.display().to_string(),
    ];
    for set in &options.sets {
        words.push("--set".into());
        words.push(format!("'{set}'"));
    }
    if let Some(out) = &options.out {
        words.push(format!("--out {}", out.display()));
    }
    words.join(" ")
}

/// Per cell of `report`, in its order, its compressor calls as run.json keeps them (SPEC §15):
/// how many, those found in the cache, and how long they took by their cache entries.
pub(super) fn compression(
    report: &crate::report::Report,
    outcome: &crate::runner::Outcome,
) -> Vec<crate::store::run_record::CompressionRecord> {
    let none = crate::runner::CellCost::default();
    (report.cells.iter())
        .map(|cell| {
            let cost = outcome.cell_costs.get(&cell.id).unwrap_or(&none);
            crate::store::run_record::CompressionRecord {
                cell: cell.id.clone(),
                calls: cost.calls,
                cached: cost.cached,
                times: crate::store::usage::CallTimes::of(&cost.wall_ms),
            }
        })
        .collect()
}
