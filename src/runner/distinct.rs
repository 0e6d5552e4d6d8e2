//! The distinct calls the results rest on, per role and per compressor: each key once, with
//! the usage of those that reported any, gathered as memories fold and settled at the end.

use std::collections::BTreeMap;

use crate::parallel::Locked;
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

/// Distinct calls as they are gathered: every call each job rested on, in fold order, made
/// distinct once at the end by sorting (a paper-scale run folds most of a million calls, one
/// at a time on the thread that folds: pushing one is cheaper than hashing it in).
#[derive(Default)]
pub(super) struct Gathering {
    /// Each call: its key, its job's seed, and where its usage is in `usage` (`NO_USAGE`: none).
    calls: Vec<(CallKey, u64, u32)>,
    usage: Vec<Usage>,
}

/// A call that reported no usage (a paper-scale run without usage keeps no usage at all).
const NO_USAGE: u32 = u32::MAX;

impl Gathering {
    pub(super) fn insert(&mut self, key: CallKey, seed: u64, usage: &Usage) {
        let at = match *usage == Usage::default() {
            true => NO_USAGE,
            false => {
                self.usage.push(usage.clone());
                u32::try_from(self.usage.len() - 1).unwrap_or(NO_USAGE)
            }
        };
        self.calls.push((key, seed, at));
    }

    /// Each key once, with the usage its first job reported (in key order, so the same calls
    /// always sum to the same bytes), and the jobs of another seed than that first job's.
    pub(super) fn finish(mut self) -> Distinct {
        // Stable: within a key, the calls stay in fold order.
        self.calls.sort_by_key(|(key, ..)| *key);
        let mut distinct = Distinct::default();
        for calls in self.calls.chunk_by(|a, b| a.0 == b.0) {
            let (_, seed, at) = calls[0];
            distinct.calls += 1;
            distinct.across_seeds += calls[1..].iter().filter(|call| call.1 != seed).count();
            if let Some(usage) = self.usage.get_mut(at as usize) {
                distinct.usage.push(std::mem::take(usage));
            }
        }
        distinct
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
            distinct.calls.entry(role).or_default().calls.reserve(calls);
        }
        distinct
    }
}

/// What the run as a whole comes to, once every memory is folded: this run's calls, what it
/// paid, why it stopped, and the distinct calls the results rest on.
pub(super) fn settle(outcome: &mut super::Outcome, distinct: DistinctCalls, shared: &super::RunState) {
    outcome.this_run = shared.calls.totals();
    outcome.audit_calls = shared.calls.audit.locked().clone();
    outcome.stop = shared.stop.locked().clone();
    outcome.paid = shared.calls.paid.locked().clone();
    // Each role's calls are sorted on a thread of their own (at paper scale, the reader's and
    // the judge's are 385k each), the compressors' meanwhile.
    let DistinctCalls {
        calls,
        compressor_calls,
        costs,
        ..
    } = distinct;
    (outcome.calls, outcome.compressor_calls) = std::thread::scope(|scope| {
        let roles: Vec<_> = (calls.into_iter())
            .map(|(role, calls)| (role, scope.spawn(move || calls.finish())))
            .collect();
        let compressors = (compressor_calls.into_iter())
            .map(|(name, calls)| (name, calls.finish()))
            .collect();
        let roles = (roles.into_iter())
            .map(|(role, sorting)| {
                (
                    role,
                    sorting
                        .join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
                )
            })
            .collect();
        (roles, compressors)
    });
    outcome.cell_costs = costs.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input_tokens: u64) -> Usage {
        Usage {
            input_tokens,
            ..Usage::default()
        }
    }

    #[test]
    fn each_key_counts_once_with_its_first_usage_in_key_order() {
        let mut gathering = Gathering::default();
        let (a, b, c) = ([3; 32], [1; 32], [2; 32]);
        gathering.insert(a, 1, &usage(30));
        gathering.insert(b, 1, &Usage::default());
        gathering.insert(a, 2, &usage(31));
        gathering.insert(c, 2, &usage(20));
        gathering.insert(b, 1, &usage(10));
        gathering.insert(a, 1, &usage(32));
        gathering.insert(b, 3, &Usage::default());
        let distinct = gathering.finish();
        assert_eq!(distinct.calls, 3);
        // a: seeds 1, 2, 1 (one job of another seed); b: 1, 1, 3 (one); c: alone.
        assert_eq!(distinct.across_seeds, 2);
        // In key order (b, c, a), each key's first job's usage: b's first reported none.
        assert_eq!(distinct.usage, vec![usage(20), usage(30)]);
    }
}
