//! Per model endpoint: what the calls the results rest on cost, per role, and which models
//! served them (SPEC §8).

use std::collections::BTreeMap;

use serde::Serialize;

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
