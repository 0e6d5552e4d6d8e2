//! What a run counts as it goes: jobs done per stage (read by the progress line), calls made
//! or found per role, and the usage callbacks report.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::protocol::Role;
use crate::protocol::messages::{self, ReportedUsage};
use crate::store::run_record::{EndpointLive, LiveProgress, RunStatus, StageCounts};

/// CallBook made, served from the cache, shared and failed, per role, in this run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct CallCounts {
    pub made: usize,
    pub cached: usize,
    pub shared: usize,
    pub failed: usize,
}

/// Token and cost usage reported by callbacks.
#[derive(Debug, Clone, Default, Serialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    /// Input tokens a provider's prompt cache answered (model endpoints).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_input_tokens: u64,
    /// What the provider's prompt cache saved, at the endpoint's price.
    #[serde(default, skip_serializing_if = "is_nothing")]
    pub prompt_cache_saved_usd: f64,
    /// What the provider's batch API saved against its online price.
    #[serde(default, skip_serializing_if = "is_nothing")]
    pub batch_saved_usd: f64,
    /// The model ids that served the calls, with how many each served.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub served_models: BTreeMap<String, u64>,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

fn is_nothing(value: &f64) -> bool {
    *value == 0.0
}

impl Usage {
    /// Adds another usage; sums saturate, whatever the parts say.
    pub(crate) fn plus(&mut self, other: &Usage) {
        let cost = |sum: &mut f64, part: f64| {
            if part.is_finite() && part > 0.0 {
                *sum = (*sum + part).min(f64::MAX);
            }
        };
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cached_input_tokens = self.cached_input_tokens.saturating_add(other.cached_input_tokens);
        cost(&mut self.cost_usd, other.cost_usd);
        cost(&mut self.prompt_cache_saved_usd, other.prompt_cache_saved_usd);
        cost(&mut self.batch_saved_usd, other.batch_saved_usd);
        for (model, calls) in &other.served_models {
            let count = self.served_models.entry(model.clone()).or_default();
            *count = count.saturating_add(*calls);
        }
    }

    /// The usage a response reported.
    pub(crate) fn of(response: &Value) -> Usage {
        let mut usage = Usage::default();
        usage.add(response);
        usage
    }

    /// Adds a response's `usage`, if it has one.
    pub(crate) fn add(&mut self, response: &Value) {
        if let Some(usage) = response.get("usage").and_then(messages::read::<ReportedUsage>) {
            // As a cached memory entry stores them.
            self.plus(&Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                cost_usd: usage.cost_usd,
                cached_input_tokens: usage.cached_input_tokens,
                prompt_cache_saved_usd: usage.prompt_cache_saved_usd,
                batch_saved_usd: usage.batch_saved_usd,
                served_models: usage.served_models,
            });
        }
        // A model endpoint's reply names the model that served it.
        if let Some(model) = response.pointer("/meta/model").and_then(Value::as_str)
            && response.pointer("/meta/endpoint").is_some()
        {
            let count = self.served_models.entry(model.to_owned()).or_default();
            *count = count.saturating_add(1);
        }
    }
}

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
