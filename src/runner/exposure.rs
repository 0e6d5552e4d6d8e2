//! The exposure audit (SPEC §5 `exposure_violations`): every compressor request, as sent,
//! checked for fields outside SPEC §3 and for held-out text.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::Value;

use crate::parallel::Locked;
use crate::plan::MemoryJob;
use crate::protocol::messages::CompressorRequest;

/// What the audit found per (source, goal shown, compressor): a request's strings are its goal's
/// text and its compressor's params (its budget and seed are numbers), and the held-out text it
/// is checked against is its source's, so every memory job of one such triple is checked once
/// (a run's 64,050 jobs at paper scale are 2,810 triples).
#[derive(Default)]
pub(super) struct Exposures(Mutex<HashMap<RequestShape, bool>>);

/// A request's source, goal shown (source and goal) and compressor.
type RequestShape = (usize, Option<(usize, usize)>, String);

impl Exposures {
    /// `exposes` for `job`'s request, checked once per (source, goal shown, compressor).
    pub(super) fn of(&self, job: &MemoryJob, request: &CompressorRequest<'_>, held_out: &[String]) -> bool {
        let key = (job.source, job.shown_goal, job.id.cell.compressor.clone());
        if let Some(found) = self.0.locked().get(&key) {
            return *found;
        }
        let found = exposes(request, held_out);
        self.0.locked().insert(key, found);
        found
    }
}

/// True when a compressor request as it is written (all but its `context`, which is the
/// source itself by construction) carries a field outside SPEC §3, or held-out text of its
/// source's goals (a question or reference that the source itself does not contain).
pub(super) fn exposes(request: &CompressorRequest<'_>, held_out: &[String]) -> bool {
    serde_json::to_value(request.without_context())
        .map_or(true, |written| written_exposes(&written, held_out))
}

/// `exposes`, of a request as written.
fn written_exposes(request: &Value, held_out: &[String]) -> bool {
    let Some(fields) = request.as_object() else {
        return true;
    };
    if fields
        .keys()
        .any(|k| !CompressorRequest::FIELDS.contains(&k.as_str()))
    {
        return true;
    }
    let mut visible = Vec::new();
    collect_strings(request, &mut visible);
    held_out
        .iter()
        .any(|text| visible.iter().any(|v| v.contains(text.as_str())))
}

fn collect_strings<'a>(value: &'a Value, out: &mut Vec<&'a str>) {
    match value {
        Value::String(s) => out.push(s),
        Value::Array(items) => items.iter().for_each(|v| collect_strings(v, out)),
        Value::Object(fields) => fields.iter().for_each(|(k, v)| {
            out.push(k);
            collect_strings(v, out)
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn exposure_audit() {
        let exposes = |request: &Value, source: &str, texts: &[&str]| {
            written_exposes(
                request,
                &crate::plan::held_out_texts(source, texts.iter().copied()),
            )
        };
        let request = json!({"protocol": "gacc/1", "role": "compressor", "context": "the sky is blue",
            "goal": "learn colours", "token_budget": 3, "seed": 0, "params": {}});
        assert!(!exposes(
            &request,
            "the sky is blue",
            &["What colour is the sky?", "blue"]
        ));
        let mut leaky = request.clone();
        leaky["goal"] = json!("learn colours: What colour is the sky?");
        assert!(exposes(
            &leaky,
            "the sky is blue",
            &["What colour is the sky?", "blue"]
        ));
        let mut extra = request.clone();
        extra["question_ids"] = json!(["q1"]);
        assert!(exposes(&extra, "the sky is blue", &[]));
        let mut in_params = request.clone();
        in_params["params"] = json!({"hint": "What colour is the sky?"});
        assert!(exposes(
            &in_params,
            "the sky is blue",
            &["What colour is the sky?"]
        ));
        // A typed request is audited as it is written.
        let params = json!({"hint": "What colour is the sky?"});
        let typed = CompressorRequest::new("the sky is blue", Some("learn colours"), 3, 0, &params);
        let held_out =
            crate::plan::held_out_texts("the sky is blue", ["What colour is the sky?"].into_iter());
        assert!(super::exposes(&typed, &held_out));
        let no_params = json!({});
        let typed = CompressorRequest::new("the sky is blue", Some("learn colours"), 3, 0, &no_params);
        assert!(!super::exposes(&typed, &held_out));
    }

    /// A memory job of `source` showing `shown` to `compressor`, at `seed` and `budget`.
    fn job(
        source: usize,
        shown: Option<(usize, usize)>,
        compressor: &str,
        seed: u64,
        budget: usize,
    ) -> MemoryJob {
        use crate::protocol::{BudgetRule, CellId, Condition, MemoryId};
        MemoryJob {
            key: String::new(),
            cache_key: String::new(),
            id: MemoryId {
                seed,
                cell: CellId {
                    compressor: compressor.to_owned(),
                    condition: Condition::OwnGoal,
                    rule: BudgetRule::Tokens(budget),
                },
                source_id: format!("s{source}"),
                goal_id: None,
                shown_goal_id: None,
            },
            source_tokens: 100,
            budget,
            source,
            shown_goal: shown,
            questions: Vec::new(),
            ladder: None,
        }
    }

    #[test]
    fn each_request_shape_is_audited_once_and_finds_what_its_own_audit_finds() {
        let sources = ["the sky is blue", "grass is green"];
        let questions = ["What colour is the sky?", "What colour is grass?"];
        // Source 0's second goal gives its question away; so do the hinted compressor's params
        // for source 1.
        let goals = [
            ["learn colours", "What colour is the sky? learn it"],
            ["learn plants", "learn lawns"],
        ];
        let params = [("plain", json!({})), ("hinted", json!({"hint": questions[1]}))];
        let held_out: Vec<Vec<String>> = (sources.iter().zip(questions))
            .map(|(source, question)| crate::plan::held_out_texts(source, [question].into_iter()))
            .collect();
        let exposures = Exposures::default();
        let (mut found, mut checked) = (0, 0);
        // Twice over, so that the second pass reads every shape's finding from the memo.
        for _ in 0..2 {
            for source in 0..2 {
                // No goal, its own goals, and another source's goal (the other-goal condition).
                let shown = [None, Some((source, 0)), Some((source, 1)), Some((1 - source, 1))];
                for (shown, (compressor, params)) in
                    shown.into_iter().flat_map(|s| params.iter().map(move |p| (s, p)))
                {
                    for (seed, budget) in [(1, 3), (2, 5)] {
                        let goal = shown.map(|(s, g): (usize, usize)| goals[s][g]);
                        let request = CompressorRequest::new(sources[source], goal, budget, seed, params);
                        let job = job(source, shown, compressor, seed, budget);
                        let direct = exposes(&request, &held_out[source]);
                        assert_eq!(
                            exposures.of(&job, &request, &held_out[source]),
                            direct,
                            "source {source}, shown {shown:?}, {compressor}"
                        );
                        found += usize::from(direct);
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 64);
        // Source 0 shown its second goal (2 compressors × 2 seeds), and source 1 hinted under
        // any goal (4 shapes × 2 seeds), twice over.
        assert_eq!(found, 2 * (4 + 8));
    }
}
