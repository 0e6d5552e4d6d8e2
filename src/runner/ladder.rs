//! A budget ladder (SPEC §14): one compressor call serves every budget of a source, goal shown
//! and seed. Each memory it makes is kept under the key a single-budget call for its budget
//! would have, so what follows the call (the cut, the ledger, the reports, a pack, `gacc
//! verify`) is what it would be, and a run without the ladder finds every memory in the cache.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tracing::Instrument;

use super::RunState;
use super::calls::{Answer, Origin, account, refused};
use crate::exec::callback::{Callback, Failure, FailureKind};
use crate::inputs::budget::truncate_to_budget;
use crate::parallel::Locked;
use crate::plan::{MemoryJob, Plan, keys};
use crate::protocol::Role;
use crate::protocol::messages::{self, LadderRequest, LadderResponse};
use crate::store::cache::Kind;
use crate::store::usage::Usage;

/// One budget of a ladder, and the key its memory is kept under.
#[derive(Debug, Clone)]
pub(super) struct Rung {
    budget: usize,
    cache_key: String,
}

/// Each ladder's rungs, by its key: the budgets the plan needs of it, ascending, each once.
pub(super) type Ladders = HashMap<String, Vec<Rung>>;

pub(super) fn ladders(plan: &Plan) -> Ladders {
    let mut ladders: Ladders = HashMap::new();
    for job in &plan.memories {
        let Some(ladder) = &job.ladder else { continue };
        let rungs = ladders.entry(ladder.clone()).or_default();
        if !rungs.iter().any(|rung| rung.budget == job.budget) {
            rungs.push(Rung {
                budget: job.budget,
                cache_key: job.cache_key.clone(),
            });
        }
    }
    for rungs in ladders.values_mut() {
        rungs.sort_by_key(|rung| rung.budget);
    }
    ladders
}

/// What a ladder call says of one memory it made, kept with the memory's entry: the call's key,
/// and whether the memory, cut to its budget, is a token prefix of the cut memory of the next
/// larger budget of the call (none for the largest).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct LadderMark {
    pub call: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested: Option<bool>,
}

impl LadderMark {
    /// The mark an entry keeps, if a ladder made it.
    pub(super) fn of(entry: &Value) -> Option<LadderMark> {
        LadderMark::deserialize(entry.get("ladder")?).ok()
    }
}

/// The answer for `job`'s budget of `ladder`: from the cache, from the ladder's call in flight,
/// or by calling the ladder for every budget of it the cache lacks.
pub(super) async fn obtain_rung(
    shared: &RunState,
    callback: &Callback,
    job: &MemoryJob,
    ladder: &str,
) -> Result<(Answer, Origin), Failure> {
    let role = Role::Compressor;
    let cache = &shared.setup.cache;
    if let Some(found) = cache.get_timed(Kind::Compressor, &job.cache_key) {
        shared.calls.found(role, false);
        return Ok((Answer::of(found), Origin::Cache));
    }
    refused(shared, callback)?;
    let slot = shared.calls.slot(role, ladder);
    let mut origin = Origin::RunState;
    let result = slot
        .get_or_init(|| {
            origin = Origin::Called;
            call(shared, callback, job, ladder)
        })
        .await;
    // Once the cache holds its memories, later jobs of the ladder find them there (a dry run's
    // cache keeps nothing: there, they take them from the call).
    if origin == Origin::Called && !cache.is_read_only() {
        shared.calls.slots.locked().remove(&(role, ladder.to_owned()));
    }
    let (answer, origin) = account(shared, (role, false), result, origin)?;
    if let Some(entry) = answer
        .response
        .pointer("/rungs")
        .and_then(|r| r.get(&job.cache_key))
    {
        let answer = Answer {
            response: entry.clone(),
            wall_ms: answer.wall_ms,
        };
        return Ok((answer, origin));
    }
    // Its budget was in the cache when the call was made (another process put it there).
    match cache.get_timed(Kind::Compressor, &job.cache_key) {
        Some(found) => Ok((Answer::of(found), Origin::Cache)),
        None => Err(Failure {
            kind: FailureKind::Cancelled,
            stderr_tail: String::new(),
            attempts: 0,
        }),
    }
}

/// Calls the ladder for each budget of it the cache lacks, and keeps each memory under its
/// budget's key, with its share of the call's usage and the call's wall time.
async fn call(
    shared: &RunState,
    callback: &Callback,
    job: &MemoryJob,
    ladder: &str,
) -> Result<(Answer, bool), Failure> {
    let setup = &shared.setup;
    let cache = &setup.cache;
    // Another gacc process on this cache may be calling the same ladder: wait for it and take
    // what it made rather than pay again. Held until the memories are cached.
    let lease = match callback.launcher.answers_at_once() {
        false => cache.lease(Kind::Compressor, ladder).await,
        true => None,
    };
    if lease.is_some() {
        cache.refresh();
    }
    let rungs: Vec<Rung> = (shared.ladders.get(ladder).into_iter().flatten())
        .filter(|rung| !cache.contains(Kind::Compressor, &rung.cache_key))
        .cloned()
        .collect();
    if rungs.is_empty() {
        // Another process made every memory meanwhile: each job takes its own from the cache.
        let answer = Answer {
            response: json!({"rungs": {}}),
            wall_ms: None,
        };
        return Ok((answer, true));
    }
    let budgets: Vec<usize> = rungs.iter().map(|rung| rung.budget).collect();
    let call_key = keys::ladder_call(ladder, &budgets);
    let source = &setup.dataset.sources[job.source];
    let goal = job
        .shown_goal
        .map(|(s, g)| setup.dataset.sources[s].goals[g].text.as_str());
    let request = LadderRequest::new(&source.text, goal, budgets.clone(), job.id.seed, &callback.params);
    let span = tracing::info_span!("call", key = %call_key);
    let (response, took) = callback
        .call(&call_key, || messages::to_bytes(&request), &shared.run_limit)
        .instrument(span)
        .await?;
    let failed = |kind| Failure {
        kind,
        stderr_tail: String::new(),
        attempts: 1,
    };
    let memories = memories(&response, &rungs).map_err(failed)?;
    let wall_ms = (!callback.launcher.answers_at_once()).then_some(took.as_millis() as u64);
    let nested = nested(shared, &rungs, &memories).await;
    let shares = shares(&Usage::of(&response), rungs.len());
    let mut made = Map::new();
    for (at, rung) in rungs.iter().enumerate() {
        let mark = LadderMark {
            call: call_key.clone(),
            nested: nested[at],
        };
        let entry = json!({"memory": memories[at], "usage": shares[at], "ladder": mark});
        let description = json!({"job": "compress", "cache_key": rung.cache_key, "ladder_call": call_key});
        if let Err(error) = cache.put_timed(Kind::Compressor, &rung.cache_key, &description, &entry, wall_ms)
        {
            let what = format!(
                "could not write the cache entry of a {} call ({error})",
                callback.name
            );
            shared.lost_write(&what, 1);
        }
        made.insert(rung.cache_key.clone(), entry);
    }
    drop(lease);
    // The whole call's usage at the top: what the run paid for it, counted once.
    let usage = response.get("usage").cloned().unwrap_or(Value::Null);
    let answer = Answer {
        response: json!({"usage": usage, "rungs": made}),
        wall_ms,
    };
    Ok((answer, false))
}

/// A single-budget call's reply that holds a ladder's `memories` in place of its `memory`: a
/// failed call (its manifest entry declares no `ladder = true`).
pub(super) fn no_memories(response: &Value) -> Result<(), Failure> {
    if response.get("memories").is_none() {
        return Ok(());
    }
    Err(Failure {
        kind: FailureKind::MissingField(
            "`memory`: it answered a ladder's `memories`, and its manifest entry declares no `ladder = true`"
                .into(),
        ),
        stderr_tail: String::new(),
        attempts: 1,
    })
}

/// The reply's memories, one per rung; a dry run's unknown answer stands for each of them.
fn memories(response: &Value, rungs: &[Rung]) -> Result<Vec<String>, FailureKind> {
    let budgets: Vec<usize> = rungs.iter().map(|rung| rung.budget).collect();
    if let Some(reply) = messages::read::<LadderResponse>(response) {
        if reply.memories.len() != rungs.len() {
            return Err(FailureKind::MissingField(format!(
                "`memories` holding one memory per budget: {} for the {} budgets {budgets:?}",
                reply.memories.len(),
                rungs.len()
            )));
        }
        return Ok(reply.memories.into_iter().map(|m| m.into_owned()).collect());
    }
    let unknown = messages::read::<messages::CompressorResponse>(response)
        .filter(|reply| crate::plan::unknown::is(&reply.memory));
    match unknown {
        Some(_) => Ok(rungs
            .iter()
            .map(|rung| crate::plan::unknown::text(u64::MAX, &rung.cache_key))
            .collect()),
        None => Err(FailureKind::MissingField(format!(
            "`memories` (a ladder compressor answers its budgets {budgets:?} with a list of memories)"
        ))),
    }
}

/// Per rung, whether its memory cut to its budget is a token prefix of the next rung's cut
/// memory: none for the last, or where a text is not known or cannot be cut.
async fn nested(shared: &RunState, rungs: &[Rung], memories: &[String]) -> Vec<Option<bool>> {
    let tokenizer = shared.setup.tokenizer.clone();
    let mode = shared.setup.truncation;
    let budgets: Vec<usize> = rungs.iter().map(|rung| rung.budget).collect();
    let memories = memories.to_vec();
    let _cpu = shared.tokenizing.acquire().await;
    let cut = tokio::task::spawn_blocking(move || {
        (memories.iter().zip(&budgets))
            .map(|(memory, &budget)| {
                if crate::plan::unknown::is(memory) {
                    return None;
                }
                let kept = truncate_to_budget(tokenizer.as_ref(), memory, budget, mode).ok()?;
                tokenizer.encode(&kept.memory).ok()
            })
            .collect::<Vec<Option<Vec<u32>>>>()
    })
    .await
    .unwrap_or_default();
    (0..rungs.len())
        .map(|at| match (cut.get(at), cut.get(at + 1)) {
            (Some(Some(this)), Some(Some(next))) => Some(next.starts_with(this)),
            _ => None,
        })
        .collect()
}

/// A call's usage shared among its `k` memories: counts and costs split evenly (what remains of
/// a count to the first), the models that served it named once, on the first.
fn shares(usage: &Usage, k: usize) -> Vec<Usage> {
    let k64 = k.max(1) as u64;
    let split = |total: u64, at: usize| total / k64 + u64::from((at as u64) < total % k64);
    let cost = |total: f64| total / k.max(1) as f64;
    (0..k)
        .map(|at| Usage {
            input_tokens: split(usage.input_tokens, at),
            output_tokens: split(usage.output_tokens, at),
            cost_usd: cost(usage.cost_usd),
            cached_input_tokens: split(usage.cached_input_tokens, at),
            prompt_cache_saved_usd: cost(usage.prompt_cache_saved_usd),
            batch_saved_usd: cost(usage.batch_saved_usd),
            served_models: if at == 0 {
                usage.served_models.clone()
            } else {
                Default::default()
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_s_usage_is_shared_evenly_and_sums_to_itself() {
        let usage = Usage {
            input_tokens: 10,
            output_tokens: 3,
            cost_usd: 0.009,
            ..Usage::default()
        };
        let shares = shares(&usage, 3);
        let inputs: Vec<u64> = shares.iter().map(|u| u.input_tokens).collect();
        assert_eq!(inputs, [4, 3, 3]);
        assert_eq!(shares.iter().map(|u| u.output_tokens).sum::<u64>(), 3);
        assert!((shares.iter().map(|u| u.cost_usd).sum::<f64>() - 0.009).abs() < 1e-15);
    }

    #[test]
    fn a_reply_with_a_memory_too_few_or_none_is_refused() {
        let rungs: Vec<Rung> = [10, 20, 30]
            .map(|budget| Rung {
                budget,
                cache_key: format!("k{budget}"),
            })
            .into();
        let two = json!({"memories": ["a", "b"]});
        let refused = memories(&two, &rungs).unwrap_err().to_string();
        assert!(refused.contains("2 for the 3 budgets [10, 20, 30]"), "{refused}");
        let single = json!({"memory": "a"});
        assert!(memories(&single, &rungs).is_err());
        let three = json!({"memories": ["a", "b", "c"]});
        assert_eq!(memories(&three, &rungs).unwrap(), ["a", "b", "c"]);
        // And a single budget's call answered as a ladder is refused, naming the field.
        let refused = no_memories(&three).unwrap_err().kind.to_string();
        assert!(refused.contains("declares no `ladder = true`"), "{refused}");
        assert!(no_memories(&single).is_ok());
    }
}
