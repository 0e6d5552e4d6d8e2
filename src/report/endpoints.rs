//! What the calls the results rest on came to: per role, and per model endpoint with the
//! models that served them (SPEC §8).

use std::collections::BTreeMap;

use serde::Serialize;

use super::Calls;
use crate::protocol::Role;
use crate::runner::{Outcome, Usage};

/// One endpoint's account.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct EndpointUsage {
    pub(crate) api: String,
    pub(crate) model: String,
    /// Distinct calls the results rest on (made in this run or answered by gacc's cache).
    pub(crate) calls: usize,
    pub(crate) usage: Usage,
    pub(crate) by_role: BTreeMap<Role, Usage>,
    /// More than one model id served this endpoint's calls.
    pub(crate) several_models_served: bool,
}

/// Which endpoint each model callback calls: (role, callback key, endpoint, api, model).
pub(crate) type ModelCallbacks = Vec<(Role, String, String, String, String)>;

/// Each endpoint's usage, from the distinct calls of the callbacks that name it.
pub(super) fn endpoints(
    model_callbacks: &ModelCallbacks,
    outcome: &Outcome,
) -> BTreeMap<String, EndpointUsage> {
    let mut endpoints: BTreeMap<String, EndpointUsage> = BTreeMap::new();
    for (role, key, endpoint, api, model) in model_callbacks {
        let calls = match role {
            Role::Compressor => outcome
                .compressor_calls
                .get(key.strip_prefix("compressors.").unwrap_or(key)),
            _ => outcome.calls.get(role),
        };
        let account = endpoints
            .entry(endpoint.clone())
            .or_insert_with(|| EndpointUsage {
                api: api.clone(),
                model: model.clone(),
                calls: 0,
                usage: Usage::default(),
                by_role: BTreeMap::new(),
                several_models_served: false,
            });
        let Some(calls) = calls.filter(|c| c.calls > 0) else {
            continue;
        };
        account.calls += calls.calls;
        let by_role = account.by_role.entry(*role).or_default();
        for usage in &calls.usage {
            account.usage.plus(usage);
            by_role.plus(usage);
        }
    }
    for account in endpoints.values_mut() {
        account.several_models_served = account.usage.served_models.len() > 1;
    }
    endpoints
}

/// Per role, its jobs and the calls made, cached and shared, and the usage they reported.
pub(super) fn calls_and_usage(outcome: &Outcome) -> (BTreeMap<Role, Calls>, BTreeMap<Role, Usage>) {
    let mut calls = BTreeMap::new();
    let mut usage = BTreeMap::new();
    for role in [Role::Compressor, Role::Reader, Role::Judge] {
        let distinct = outcome.calls.get(&role);
        let made = distinct.map_or(0, |c| c.calls);
        let jobs = outcome.jobs.get(&role).copied().unwrap_or(0);
        let failed = outcome.failures.iter().filter(|f| f.stage.role() == role).count();
        calls.insert(
            role,
            Calls {
                jobs,
                made,
                cached: jobs.saturating_sub(made + failed),
                shared_across_seeds: distinct.map_or(0, |c| c.across_seeds),
            },
        );
        let mut sum = Usage::default();
        for usage in distinct.into_iter().flat_map(|c| &c.usage) {
            sum.plus(usage);
        }
        usage.insert(role, sum);
    }
    (calls, usage)
}
