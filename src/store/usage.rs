//! What a run's calls came to, per role, as run.json records them (`calls`, `paid`): how many
//! were made, found and shared, and the usage callbacks reported.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::Role;
use crate::protocol::messages::{self, ReportedUsage};

/// Calls made, served from the cache, shared and failed (of one role, in one run).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default)]
pub(crate) struct CallCounts {
    pub made: usize,
    pub cached: usize,
    pub shared: usize,
    pub failed: usize,
}

/// Token and cost usage reported by callbacks.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
#[serde(default)]
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
        // Looked up field by field: a JSON pointer copies each of its steps (twice per call).
        let meta = response.get("meta");
        if let Some(model) = meta.and_then(|meta| meta.get("model")).and_then(Value::as_str)
            && meta.and_then(|meta| meta.get("endpoint")).is_some()
        {
            let count = self.served_models.entry(model.to_owned()).or_default();
            *count = count.saturating_add(1);
        }
    }
}

impl CallCounts {
    /// Whether it counts no call at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.made + self.cached + self.shared + self.failed == 0
    }
}

/// A run's calls per role, and the audit's (audit judges and panel readers) apart.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunCalls {
    #[serde(flatten)]
    pub roles: BTreeMap<Role, CallCounts>,
    #[serde(default, skip_serializing_if = "CallCounts::is_empty")]
    pub audit: CallCounts,
}

impl RunCalls {
    /// Calls of every role and the audit's, summed by `count`.
    pub(crate) fn total(&self, count: impl Fn(&CallCounts) -> usize) -> usize {
        self.roles.values().chain([&self.audit]).map(count).sum()
    }
}

/// How long a cell's compressor calls took, each as its cache entry records it: the median and
/// 95th percentile (nearest rank) in seconds, null when no call's time is recorded.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub(crate) struct CallTimes {
    pub(crate) p50_s: Option<f64>,
    pub(crate) p95_s: Option<f64>,
}

impl CallTimes {
    /// The times of calls that took `wall_ms` milliseconds each.
    pub(crate) fn of(wall_ms: &[u64]) -> CallTimes {
        let mut times = wall_ms.to_vec();
        times.sort_unstable();
        CallTimes {
            p50_s: nearest_rank(&times, 0.5),
            p95_s: nearest_rank(&times, 0.95),
        }
    }
}

/// The `p`-th percentile of `sorted` by nearest rank: the value at rank `ceil(p·n)`.
fn nearest_rank(sorted: &[u64], p: f64) -> Option<f64> {
    let n = sorted.len();
    let rank = ((p * n as f64).ceil() as usize).clamp(1, n.max(1));
    sorted.get(rank - 1).map(|&ms| ms as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_in_seconds() {
        let times: Vec<u64> = (1..=20).map(|n| n * 10).collect();
        assert_eq!(nearest_rank(&times, 0.5), Some(0.1));
        assert_eq!(nearest_rank(&times, 0.95), Some(0.19));
        assert_eq!(nearest_rank(&[150], 0.95), Some(0.15));
        assert_eq!(nearest_rank(&[], 0.5), None);
    }
}
