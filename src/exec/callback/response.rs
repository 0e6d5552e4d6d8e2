//! What a callback writes back: its stdout parsed as one JSON response, the log a framed
//! reply carries taken out, an error it reports read, and its fields checked against its
//! role's response type (SPEC §3).

use serde_json::Value;

use super::FailureKind;
use crate::protocol::messages;
use crate::protocol::{EXIT_TEMPFAIL, Role};

pub(crate) fn parse_response(bytes: &[u8]) -> Result<Value, FailureKind> {
    let text = std::str::from_utf8(bytes).map_err(|_| FailureKind::NotUtf8)?;
    if text.trim().is_empty() {
        return Err(FailureKind::NoOutput);
    }
    let value: Value =
        serde_json::from_str(text).map_err(|error| FailureKind::InvalidJson(not_json(text, &error)))?;
    if !value.is_object() {
        return Err(FailureKind::InvalidJson(format!(
            "expected an object, got {}",
            kind_of(&value)
        )));
    }
    Ok(value)
}

/// Takes a response's `log` out (a text: what the callback wrote while it served this very call,
/// framed with its reply by the Python helper), its last `STDERR_TAIL_BYTES` kept. Not part
/// of the answer: it is the call's log, in place of the stderr a persistent worker's calls share.
pub(crate) fn take_log(response: &mut Value) -> Option<String> {
    let object = response.as_object_mut()?;
    if !object.get("log").is_some_and(Value::is_string) {
        return None;
    }
    let Some(Value::String(log)) = object.remove("log") else {
        return None;
    };
    let keep = crate::protocol::STDERR_TAIL_BYTES;
    if log.len() <= keep {
        return Some(log);
    }
    let mut start = log.len() - keep;
    while !log.is_char_boundary(start) {
        start += 1;
    }
    Some(log[start..].to_owned())
}

/// A parsed response with its framed log taken out: (the response, the log).
pub(crate) fn parse_framed(bytes: &[u8]) -> (Result<Value, FailureKind>, Option<String>) {
    match parse_response(bytes) {
        Ok(mut response) => {
            let log = take_log(&mut response);
            (Ok(response), log)
        }
        Err(kind) => (Err(kind), None),
    }
}

pub(crate) fn reported_error(response: &Value, code: i32) -> Option<FailureKind> {
    let error = response.get("error")?;
    let message = match error {
        Value::String(message) => message.clone(),
        other => other.to_string(),
    };
    let retryable = response
        .get("retryable")
        .and_then(Value::as_bool)
        .unwrap_or(code == EXIT_TEMPFAIL);
    Some(FailureKind::Reported { message, retryable })
}

/// Why stdout is not one JSON object, in the words a callback's author needs: most often a log
/// line printed before (or after) the response.
fn not_json(text: &str, error: &serde_json::Error) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let is_object = |line: &&str| serde_json::from_str::<Value>(line).is_ok_and(|v| v.is_object());
    let shown = |line: &str| {
        let cut: String = line.chars().take(60).collect();
        if cut.len() < line.len() {
            format!("{cut}…")
        } else {
            cut
        }
    };
    match lines.iter().position(is_object) {
        Some(at) if lines.len() > 1 => {
            let other = if at == 0 { lines[1] } else { lines[0] };
            format!(
                "other output came with the response on stdout (`{}`); a callback's logs belong \
                 on stderr",
                shown(other)
            )
        }
        _ => match lines.first() {
            Some(first) => format!("{error} (stdout began `{}`)", shown(first)),
            None => error.to_string(),
        },
    }
}

/// What a value of JSON type `json_type` is called in a message.
fn named(json_type: &str) -> &'static str {
    match json_type {
        "boolean" => "a boolean",
        "number" => "a number",
        "string" => "a string",
        "array" => "an array",
        "object" => "an object",
        _ => "null",
    }
}

fn kind_of(value: &Value) -> &'static str {
    named(json_type(value))
}

/// A field of a role's response, as its type (`messages::*Response`) declares it.
struct Field {
    name: String,
    /// The JSON types it may take (`"string"`, `"boolean"`, `"number"`, `"object"`).
    types: Vec<String>,
    required: bool,
}

/// The fields of `role`'s response, read once from its type's JSON Schema: a field added to
/// the type is checked with no line here.
fn response_fields(role: Role) -> &'static [Field] {
    static FIELDS: std::sync::OnceLock<[Vec<Field>; 3]> = std::sync::OnceLock::new();
    let fields = FIELDS.get_or_init(|| {
        let of = |schema: schemars::Schema| {
            let schema = schema.to_value();
            let required: Vec<&str> = (schema["required"].as_array().into_iter().flatten())
                .filter_map(Value::as_str)
                .collect();
            let properties = schema["properties"].as_object().cloned().unwrap_or_default();
            (properties.into_iter())
                .map(|(name, property)| Field {
                    required: required.contains(&name.as_str()),
                    types: match &property["type"] {
                        Value::String(one) => vec![one.clone()],
                        many => (many.as_array().into_iter().flatten())
                            .filter_map(Value::as_str)
                            .map(str::to_owned)
                            .collect(),
                    },
                    name,
                })
                .collect::<Vec<_>>()
        };
        [
            of(schemars::schema_for!(messages::CompressorResponse)),
            of(schemars::schema_for!(messages::ReaderResponse)),
            of(schemars::schema_for!(messages::JudgeResponse)),
        ]
    });
    &fields[role as usize]
}

/// Whether `value` is a list of strings.
fn is_texts(value: &Value) -> bool {
    value
        .as_array()
        .is_some_and(|items| items.iter().all(Value::is_string))
}

/// The JSON type of `value`, as a schema names it.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Checks a response against its role's fields (SPEC §3), as its type declares them, and
/// the `meta` and `usage` any response may carry.
pub(crate) fn check_response(role: Role, response: &Value) -> Result<(), FailureKind> {
    let require = |name: &str, is: fn(&Value) -> bool, what: &str| match response.get(name) {
        None => Err(FailureKind::MissingField(format!("the field `{name}`"))),
        Some(value) if is(value) => Ok(()),
        Some(value) => Err(FailureKind::MissingField(format!(
            "`{name}` as {what} (got {})",
            kind_of(value)
        ))),
    };
    let optional = |name: &str, is: fn(&Value) -> bool, what: &str| match response.get(name) {
        None | Some(Value::Null) => Ok(()),
        Some(_) => require(name, is, what),
    };
    // A writer's reply (SPEC §16): goals or questions, by its request's op.
    if role == Role::Writer {
        crate::protocol::writer::check(response).map_err(FailureKind::MissingField)?;
    }
    // A ladder compressor's reply (SPEC §14): a memory per budget, counted by the runner.
    let ladder = role == Role::Compressor && response.get("memories").is_some();
    if ladder {
        require("memories", is_texts, "a list of texts, one memory per budget")?;
    }
    let fields = match role {
        Role::Writer => &[],
        _ => response_fields(role),
    };
    for field in fields.iter().filter(|_| !ladder) {
        let name = &field.name;
        let value = match response.get(name) {
            None | Some(Value::Null) if !field.required => continue,
            None => return Err(FailureKind::MissingField(format!("the field `{name}`"))),
            Some(value) => value,
        };
        if !field.types.iter().any(|t| t == json_type(value)) {
            let wanted = field
                .types
                .iter()
                .find(|t| *t != "null")
                .map_or("null", String::as_str);
            let what = named(wanted);
            return Err(FailureKind::MissingField(format!(
                "`{name}` as {what} (got {})",
                kind_of(value)
            )));
        }
    }
    optional("meta", Value::is_object, "an object")?;
    check_usage(response)
}

/// Checks the `usage` any response may carry: each count and cost in bounds, and readable.
fn check_usage(response: &Value) -> Result<(), FailureKind> {
    if let Some(usage) = response.get("usage").filter(|u| !u.is_null()) {
        let Some(usage) = usage.as_object() else {
            return Err(FailureKind::MissingField("`usage` as an object".into()));
        };
        let count = |v: &Value| v.as_u64().is_some_and(|n| n <= messages::MAX_TOKENS);
        let cost = |v: &Value| {
            v.as_f64()
                .is_some_and(|c| c.is_finite() && (0.0..=messages::MAX_COST_USD).contains(&c))
        };
        for (name, is_valid, what) in [
            ("input_tokens", &count as &dyn Fn(&Value) -> bool, "a token count"),
            ("output_tokens", &count, "a token count"),
            ("cached_input_tokens", &count, "a token count"),
            ("cost_usd", &cost, "a cost in USD"),
        ] {
            if let Some(value) = usage.get(name).filter(|v| !is_valid(v)) {
                let bounds = match what {
                    "a token count" => format!("a whole number from 0 to {}", messages::MAX_TOKENS),
                    _ => format!("a number from 0 to {}", messages::MAX_COST_USD),
                };
                return Err(FailureKind::MissingField(format!(
                    "`usage.{name}` as {what}, {bounds} (got {value})"
                )));
            }
        }
        // What gacc reads of it (the fields above, and those its own model calls add).
        if messages::read::<messages::ReportedUsage>(&response["usage"]).is_none() {
            return Err(FailureKind::MissingField(
                "`usage` with a number in each of its counts".into(),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_fields_checked_are_those_each_response_type_declares() {
        let shown = |role| -> Vec<String> {
            (response_fields(role).iter())
                .map(|f| format!("{} {} {}", f.name, f.types.join("|"), f.required))
                .collect()
        };
        assert_eq!(shown(Role::Compressor), ["memory string true"]);
        assert_eq!(shown(Role::Reader), ["answer string true"]);
        assert_eq!(
            shown(Role::Judge),
            [
                "correct boolean true",
                "meta object|null false",
                "rationale string|null false",
                "score number|null false"
            ]
        );
        let refused = |role, response: Value| check_response(role, &response).unwrap_err().to_string();
        assert_eq!(
            refused(Role::Reader, json!({})),
            "answered without the field `answer`"
        );
        assert_eq!(
            refused(Role::Judge, json!({"correct": true, "score": "high"})),
            "answered without `score` as a number (got a string)"
        );
        assert_eq!(
            refused(Role::Compressor, json!({"memory": 3})),
            "answered without `memory` as a string (got a number)"
        );
        check_response(
            Role::Judge,
            &json!({"correct": false, "score": null, "rationale": "r"}),
        )
        .unwrap();
    }
}
