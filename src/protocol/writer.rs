//! A writer's messages (SPEC §16): asked for a source's goals, or for a goal's questions with
//! their references and evidence; and what gacc accepts back.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Role, default_protocol as protocol};

/// What a writer is asked to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum WriterOp {
    /// A source's goals: information needs, never answers.
    Goals,
    /// A goal's questions, each with its reference and evidence spans.
    Questions,
}

fn writer() -> Role {
    Role::Writer
}

/// A writer's request: the source, the goal (for questions only), how many items and the seed.
/// Fields in the order serde_json writes a map's keys.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WriterRequest<'a> {
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<Cow<'a, str>>,
    pub n: usize,
    pub op: WriterOp,
    #[serde(default)]
    pub params: Cow<'a, Value>,
    #[serde(default = "protocol")]
    protocol: Cow<'a, str>,
    #[serde(default = "writer")]
    role: Role,
    #[serde(default)]
    pub seed: u64,
    #[serde(borrow)]
    pub source: Cow<'a, str>,
}

impl<'a> WriterRequest<'a> {
    pub(crate) const FIELDS: &'static [&'static str] =
        &["goal", "n", "op", "params", "protocol", "role", "seed", "source"];

    /// Asks for `n` goals of `source`.
    pub(crate) fn goals(source: &'a str, n: usize, seed: u64, params: &'a Value) -> Self {
        WriterRequest {
            goal: None,
            n,
            op: WriterOp::Goals,
            params: Cow::Borrowed(params),
            protocol: protocol(),
            role: Role::Writer,
            seed,
            source: Cow::Borrowed(source),
        }
    }

    /// Asks for `n` questions of `goal` about `source`.
    pub(crate) fn questions(source: &'a str, goal: &'a str, n: usize, seed: u64, params: &'a Value) -> Self {
        WriterRequest {
            goal: Some(Cow::Borrowed(goal)),
            op: WriterOp::Questions,
            ..WriterRequest::goals(source, n, seed, params)
        }
    }
}

/// A question as a writer wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct WrittenQuestion {
    pub question: String,
    pub reference: String,
    #[serde(default)]
    pub evidence: Vec<String>,
}

/// The fields a writer's reply holds: one of them, by its request's `op`.
pub(crate) const RESPONSE_FIELDS: &[&str] = &["goals", "questions"];

/// A writer's reply read for `op`: its items, the first `n` (SPEC §16: a reply with more items
/// than asked keeps the first `n`). What is missing, mistyped or blank is named.
pub(crate) fn read_goals(response: &Value, n: usize) -> Result<Vec<String>, String> {
    let items = items(response, "goals")?;
    let mut goals = Vec::new();
    for (at, item) in items.iter().enumerate().take(n) {
        match item.as_str() {
            Some(goal) if !goal.trim().is_empty() => goals.push(goal.trim().to_owned()),
            Some(_) => return Err(format!("`goals[{at}]` is blank")),
            None => return Err(format!("`goals[{at}]` as a text (got {})", kind(item))),
        }
    }
    Ok(goals)
}

/// The questions of a writer's reply, the first `n`.
pub(crate) fn read_questions(response: &Value, n: usize) -> Result<Vec<WrittenQuestion>, String> {
    let items = items(response, "questions")?;
    let mut questions = Vec::new();
    for (at, item) in items.iter().enumerate().take(n) {
        let place = format!("questions[{at}]");
        if !item.is_object() {
            return Err(format!("`{place}` as an object (got {})", kind(item)));
        }
        let text = |name: &str| match item.get(name) {
            Some(Value::String(text)) if !text.trim().is_empty() => Ok(text.trim().to_owned()),
            Some(Value::String(_)) => Err(format!("`{place}.{name}` is blank")),
            Some(other) => Err(format!("`{place}.{name}` as a text (got {})", kind(other))),
            None => Err(format!("`{place}.{name}`")),
        };
        let evidence = match item.get("evidence") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(span)) => vec![span.clone()],
            Some(Value::Array(spans)) => (spans.iter())
                .map(|span| span.as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| format!("`{place}.evidence` as a list of texts"))?,
            Some(other) => {
                return Err(format!(
                    "`{place}.evidence` as a list of texts (got {})",
                    kind(other)
                ));
            }
        };
        questions.push(WrittenQuestion {
            question: text("question")?,
            reference: text("reference")?,
            evidence,
        });
    }
    Ok(questions)
}

/// Checks a writer's reply as a callback's response is checked (SPEC §3): it holds `goals` or
/// `questions`, each well formed. Which one its request asked for is checked when it is read.
pub(crate) fn check(response: &Value) -> Result<(), String> {
    match (response.get("goals"), response.get("questions")) {
        (Some(_), _) => read_goals(response, usize::MAX).map(drop),
        (None, Some(_)) => read_questions(response, usize::MAX).map(drop),
        (None, None) => Err("the field `goals` or `questions`".to_owned()),
    }
}

fn items<'v>(response: &'v Value, field: &str) -> Result<&'v Vec<Value>, String> {
    match response.get(field) {
        Some(Value::Array(items)) => Ok(items),
        Some(other) => Err(format!("`{field}` as a list (got {})", kind(other))),
        None => Err(format!("the field `{field}`")),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a text",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_names_its_op_and_leaves_out_a_goal_it_has_not() {
        let params = json!({});
        let goals = serde_json::to_value(WriterRequest::goals("text", 2, 7, &params)).unwrap();
        assert_eq!(
            goals,
            json!({"n": 2, "op": "goals", "params": {}, "protocol": "gacc/1", "role": "writer", "seed": 7, "source": "text"})
        );
        let questions = WriterRequest::questions("text", "plan a trip", 5, 7, &params);
        let questions = serde_json::to_value(questions).unwrap();
        assert_eq!(questions["goal"], "plan a trip");
        assert_eq!(questions["op"], "questions");
        let fields: Vec<&str> = questions
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(fields, WriterRequest::FIELDS);
    }

    #[test]
    fn a_reply_keeps_its_first_n_items_and_names_what_is_wrong() {
        let reply = json!({"goals": ["a", " b ", "c"]});
        assert_eq!(read_goals(&reply, 2).unwrap(), ["a", "b"]);
        assert!(
            read_goals(&json!({"goals": ["a", ""]}), 5)
                .unwrap_err()
                .contains("goals[1]")
        );
        assert!(
            read_goals(&json!({"goals": "a"}), 5)
                .unwrap_err()
                .contains("as a list")
        );
        assert!(
            read_goals(&json!({"questions": []}), 5)
                .unwrap_err()
                .contains("`goals`")
        );
        let reply = json!({"questions": [
            {"question": "Q1?", "reference": "r1", "evidence": ["span one"]},
            {"question": "Q2?", "reference": "r2", "evidence": "span two"},
            {"question": "Q3?", "reference": "r3"},
        ]});
        let read = read_questions(&reply, 3).unwrap();
        assert_eq!(read[1].evidence, ["span two"]);
        assert!(read[2].evidence.is_empty());
        assert_eq!(read_questions(&reply, 1).unwrap().len(), 1);
        for (bad, named) in [
            (
                json!({"questions": [{"question": "Q?"}]}),
                "questions[0].reference",
            ),
            (
                json!({"questions": [{"question": "Q?", "reference": 3}]}),
                "questions[0].reference",
            ),
            (
                json!({"questions": [{"question": " ", "reference": "r"}]}),
                "blank",
            ),
            (
                json!({"questions": [{"question": "Q?", "reference": "r", "evidence": [1]}]}),
                "evidence",
            ),
            (json!({"questions": ["Q?"]}), "as an object"),
        ] {
            let error = read_questions(&bad, 5).unwrap_err();
            assert!(error.contains(named), "{error}");
            assert!(check(&bad).is_err());
        }
        assert!(check(&json!({"goals": ["g"]})).is_ok());
        assert!(check(&json!({"answer": "g"})).is_err());
    }
}
