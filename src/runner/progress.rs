//! What a run counts as it goes: jobs done per stage (read by the progress line), calls made
//! or found per role, and the usage callbacks report.

use std::sync::atomic::AtomicUsize;
use std::time::Instant;

use serde::Serialize;
use serde_json::Value;

use crate::protocol::Role;

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
}

impl Usage {
    /// Adds another usage.
    pub(crate) fn plus(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cost_usd += other.cost_usd;
    }

    /// The usage a response reported.
    pub(crate) fn of(response: &Value) -> Usage {
        let mut usage = Usage::default();
        usage.add(response);
        usage
    }

    /// Adds a response's `usage`, if it has one.
    pub(crate) fn add(&mut self, response: &Value) {
        if let Some(usage) = response.get("usage") {
            self.input_tokens += usage.get("input_tokens").and_then(Value::as_u64).unwrap_or(0);
            self.output_tokens += usage.get("output_tokens").and_then(Value::as_u64).unwrap_or(0);
            self.cost_usd += usage.get("cost_usd").and_then(Value::as_f64).unwrap_or(0.0);
        }
    }
}

/// Progress counters, per stage, read by the progress display.
#[derive(Debug)]
pub(crate) struct Progress {
    pub stages: [StageProgress; 3],
    pub started: Instant,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            stages: Default::default(),
            started: Instant::now(),
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct StageProgress {
    pub total: AtomicUsize,
    pub done: AtomicUsize,
    pub cached: AtomicUsize,
    pub failed: AtomicUsize,
}

impl Progress {
    pub(crate) fn stage(&self, role: Role) -> &StageProgress {
        &self.stages[role as usize]
    }
}
