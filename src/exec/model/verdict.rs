//! The judge's verdict from a model's reply (SPEC §8): a structured one (a forced tool call's
//! input, or a JSON object with a boolean `correct`), else the last `GRADE: C` / `GRADE: I`
//! line. Anything else is no verdict: a failed call, never an incorrect answer.

use serde::Deserialize;
use serde_json::Value;

use crate::providers::Reply;

/// Said of a greedy judge's reply without a verdict: running again sends the same request.
pub(crate) const SAME_AGAIN: &str = "at temperature 0 the same request gets the same reply, so running again fails the same way: change the judge's template or params (a larger `max_tokens`, or `response_format`)";

/// `(correct, rationale)`, or why the reply holds no verdict.
pub(crate) fn verdict(reply: &Reply) -> Result<(bool, Option<String>), String> {
    if let Some(input) = &reply.tool_input {
        return structured(input)
            .ok_or_else(|| "the judge's verdict tool call has no boolean `correct`".into());
    }
    if let Some(found) = json_object(&reply.text).as_ref().and_then(structured) {
        return Ok(found);
    }
    if let Some(correct) = reply.text.lines().rev().find_map(grade_line) {
        return Ok((correct, None));
    }
    let shown: String = reply.text.trim().chars().take(120).collect();
    Err(format!(
        "the judge's reply has no verdict (no JSON `correct`, no GRADE: C/I line): `{shown}`"
    ))
}

/// A structured verdict: the judge response's `correct` (a boolean) and its `rationale` where
/// that is text; a rationale of another kind is passed over, not a lost verdict.
fn structured(value: &Value) -> Option<(bool, Option<String>)> {
    #[derive(serde::Deserialize)]
    struct Structured {
        correct: bool,
        #[serde(default)]
        rationale: Value,
    }
    let found = Structured::deserialize(value).ok()?;
    Some((found.correct, found.rationale.as_str().map(str::to_owned)))
}

/// The reply as one JSON object, also inside a ```json fence.
pub(crate) fn json_object(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    let unfenced = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.trim_end().strip_suffix("```"))
        .unwrap_or(trimmed);
    serde_json::from_str::<Value>(unfenced.trim())
        .ok()
        .filter(Value::is_object)
}

/// `GRADE: C` or `GRADE: I` alone on a line (markup and a final full stop allowed).
fn grade_line(line: &str) -> Option<bool> {
    let line = line
        .trim()
        .trim_matches(|c: char| c == '*' || c == '_' || c == '`')
        .trim();
    let rest = line
        .strip_prefix("GRADE:")
        .or_else(|| line.strip_prefix("Grade:"))?;
    match rest
        .trim()
        .trim_end_matches('.')
        .trim_matches(|c: char| c == '*' || c == '`')
    {
        "C" => Some(true),
        "I" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(text: &str) -> Reply {
        Reply {
            text: text.into(),
            ..Reply::default()
        }
    }

    #[test]
    fn structured_verdicts_come_first() {
        let tool = Reply {
            tool_input: Some(json!({"correct": false, "rationale": "another city"})),
            text: "GRADE: C".into(),
            ..Reply::default()
        };
        assert_eq!(verdict(&tool).unwrap(), (false, Some("another city".into())));
        assert!(
            verdict(&text(r#"{"correct": true, "rationale": "same"}"#))
                .unwrap()
                .0
        );
        assert!(!verdict(&text("```json\n{\"correct\": false}\n```")).unwrap().0);
    }

    #[test]
    fn the_last_grade_line_decides() {
        assert!(!verdict(&text("The answer says Lyon.\nGRADE: I")).unwrap().0);
        assert!(
            verdict(&text("GRADE: I\nOn reflection it matches.\n**GRADE: C**"))
                .unwrap()
                .0
        );
        assert!(verdict(&text("Grade: C.")).unwrap().0);
    }

    #[test]
    fn no_verdict_is_an_error_not_a_wrong_answer() {
        for reply in [
            "I think it is probably right.",
            "GRADE: B",
            "",
            "{\"correct\": \"yes\"}",
            "my GRADE: C is final",
        ] {
            assert!(verdict(&text(reply)).is_err(), "{reply:?}");
        }
        let tool = Reply {
            tool_input: Some(json!({"grade": "C"})),
            ..Reply::default()
        };
        assert!(verdict(&tool).is_err());
    }
}
