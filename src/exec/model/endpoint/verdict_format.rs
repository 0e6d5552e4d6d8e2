//! How an endpoint asks a judge for its verdict, and what a server that refuses it says.

use serde_json::Value;

/// How a judge's verdict is asked for, from the most exact to what any server takes. An
/// endpoint that refuses one moves to the next, once, for the rest of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub(super) enum Format {
    /// `response_format: json_schema` with the verdict's schema.
    Schema = 0,
    /// `response_format: json_object`.
    JsonObject = 1,
    /// No `response_format`: the prompt's JSON or `GRADE:` line is read.
    Prompted = 2,
}

impl Format {
    pub(super) fn of(number: u8) -> Format {
        match number {
            0 => Format::Schema,
            1 => Format::JsonObject,
            _ => Format::Prompted,
        }
    }

    /// The format `body` asks for: None when it names no `response_format` (a provider that
    /// asks otherwise, or a request that is not a judge's).
    pub(super) fn asked(body: &Value) -> Option<Format> {
        match body.get("response_format")?.get("type")?.as_str()? {
            "json_schema" => Some(Format::Schema),
            "json_object" => Some(Format::JsonObject),
            _ => None,
        }
    }

    /// `body` asking for no more than this format.
    pub(super) fn apply(self, body: &mut Value) {
        let Some(asked) = Format::asked(body) else {
            return;
        };
        if asked >= self {
            return;
        }
        match (self, body.as_object_mut()) {
            (Format::JsonObject, Some(fields)) => {
                fields.insert(
                    "response_format".into(),
                    serde_json::json!({"type": "json_object"}),
                );
            }
            (_, Some(fields)) => {
                fields.remove("response_format");
            }
            (_, None) => {}
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Format::Schema => "response_format json_schema",
            Format::JsonObject => "response_format json_object",
            Format::Prompted => "no response_format (the prompt's JSON or GRADE line)",
        }
    }
}

/// Whether an error names the response format: the server cannot give the format asked for,
/// and would refuse every request that asks for it (llama.cpp answers a `json_schema` it cannot
/// compile with a 500).
pub(super) fn names_format(message: &str) -> bool {
    let message = message.to_ascii_lowercase();
    [
        "response_format",
        "json_schema",
        "json schema",
        "json_object",
        "grammar",
    ]
    .iter()
    .any(|word| message.contains(word))
}
