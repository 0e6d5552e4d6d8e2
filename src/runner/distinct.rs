//! The distinct calls the results rest on, per role and per compressor: each key once, with
//! the usage of those that reported any, gathered as memories fold.

use std::collections::BTreeMap;

use crate::hash::DigestMap;
use crate::plan::Plan;
use crate::protocol::Role;
use crate::store::usage::Usage;

/// A call's cache key as its 32 bytes (sorted as its hex is).
pub(crate) type CallKey = [u8; 32];

/// The distinct calls of a role (or of one compressor) that the results rest on: how many, and
/// the usage of those that reported any, in the order of their keys (so the same calls always
/// sum to the same bytes).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Distinct {
    pub calls: usize,
    pub usage: Vec<Usage>,
    /// Jobs of one seed that rest on a call another seed made (SPEC §8: identical requests).
    pub across_seeds: usize,
}

/// Distinct calls as they are gathered: each key once, and the usage of those with any (a
/// paper-scale run without usage keeps no usage at all).
#[derive(Default)]
pub(super) struct Gathering {
    /// Each key, with the seed of the first job that rested on it.
    keys: DigestMap<CallKey, u64>,
    usage: Vec<(CallKey, Usage)>,
    across_seeds: usize,
}

impl Gathering {
    pub(super) fn insert(&mut self, key: CallKey, seed: u64, usage: &Usage) {
        match self.keys.entry(key) {
            std::collections::hash_map::Entry::Occupied(first) => {
                self.across_seeds += usize::from(*first.get() != seed);
            }
            std::collections::hash_map::Entry::Vacant(place) => {
                place.insert(seed);
                if *usage != Usage::default() {
                    self.usage.push((key, usage.clone()));
                }
            }
        }
    }

    pub(super) fn finish(mut self) -> Distinct {
        self.usage.sort_unstable_by_key(|(key, _)| *key);
        Distinct {
            calls: self.keys.len(),
            usage: self.usage.into_iter().map(|(_, usage)| usage).collect(),
            across_seeds: self.across_seeds,
        }
    }
}

/// The distinct calls the results rest on, gathered with the outcomes: hashed, then sorted
/// once at the end.
#[derive(Default)]
pub(super) struct DistinctCalls {
    pub(super) calls: BTreeMap<Role, Gathering>,
    pub(super) compressor_calls: BTreeMap<String, Gathering>,
    pub(super) costs: super::costs::CostGathering,
    /// Memory texts handed over already, by address (rows of one memory share its `Arc`).
    pub(super) memories: std::collections::HashSet<usize>,
}

impl DistinctCalls {
    /// Sized once for the plan: a paper-scale run folds most of a million calls.
    pub(super) fn sized_for(plan: &Plan) -> DistinctCalls {
        let mut distinct = DistinctCalls::default();
        let questions = plan.question_jobs();
        for (role, calls) in [
            (Role::Compressor, plan.memories.len()),
            (Role::Reader, questions),
            (Role::Judge, questions),
        ] {
            distinct.calls.entry(role).or_default().keys.reserve(calls);
        }
        distinct
    }
}
