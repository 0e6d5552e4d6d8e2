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
}
