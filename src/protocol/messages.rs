//! The requests of SPEC §3, typed: one per role as gacc sends it, borrowing the texts it
//! carries (a source is written out for each attempt, never copied into a JSON value first).
//! Each type's fields are declared in the order serde_json writes a map's keys, so a request's
//! bytes are those gacc has always sent; `FIELDS` names them, for the exposure audit and the
//! variables a model built-in's template may read.

use serde::Serialize;
use serde_json::Value;

use super::{PROTOCOL, Role};

/// A compressor's request: the source, the goal (none under `no-goal`), L and the seed.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct CompressorRequest<'a> {
    pub context: &'a str,
    pub goal: Option<&'a str>,
    pub params: &'a Value,
    protocol: &'static str,
    role: Role,
    pub seed: u64,
    pub token_budget: usize,
}

impl<'a> CompressorRequest<'a> {
    pub(crate) const FIELDS: &'static [&'static str] = &[
        "context",
        "goal",
        "params",
        "protocol",
        "role",
        "seed",
        "token_budget",
    ];

    pub(crate) fn new(
        context: &'a str,
        goal: Option<&'a str>,
        token_budget: usize,
        seed: u64,
        params: &'a Value,
    ) -> Self {
        CompressorRequest {
            context,
            goal,
            params,
            protocol: PROTOCOL,
            role: Role::Compressor,
            seed,
            token_budget,
        }
    }

    /// The request without its source: what the exposure audit reads (SPEC §5).
    pub(crate) fn without_context(&self) -> Self {
        CompressorRequest { context: "", ..*self }
    }
}

/// A reader's request: one memory and one question.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct ReaderRequest<'a> {
    pub memory: &'a str,
    pub params: &'a Value,
    protocol: &'static str,
    pub question: &'a str,
    role: Role,
    pub seed: u64,
}

impl<'a> ReaderRequest<'a> {
    pub(crate) const FIELDS: &'static [&'static str] =
        &["memory", "params", "protocol", "question", "role", "seed"];

    pub(crate) fn new(memory: &'a str, question: &'a str, seed: u64, params: &'a Value) -> Self {
        ReaderRequest {
            memory,
            params,
            protocol: PROTOCOL,
            question,
            role: Role::Reader,
            seed,
        }
    }
}

/// A judge's request: the source, the question, its reference and the reader's answer.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct JudgeRequest<'a> {
    pub answer: &'a str,
    pub params: &'a Value,
    protocol: &'static str,
    pub question: &'a str,
    pub reference: &'a str,
    role: Role,
    pub seed: u64,
    pub source: &'a str,
}

impl<'a> JudgeRequest<'a> {
    pub(crate) const FIELDS: &'static [&'static str] = &[
        "answer",
        "params",
        "protocol",
        "question",
        "reference",
        "role",
        "seed",
        "source",
    ];

    pub(crate) fn new(
        source: &'a str,
        question: &'a str,
        reference: &'a str,
        answer: &'a str,
        seed: u64,
        params: &'a Value,
    ) -> Self {
        JudgeRequest {
            answer,
            params,
            protocol: PROTOCOL,
            question,
            reference,
            role: Role::Judge,
            seed,
            source,
        }
    }
}

/// An external tokenizer's request (SPEC §2): `encode` a text.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct EncodeRequest<'a> {
    op: &'static str,
    protocol: &'static str,
    role: &'static str,
    pub text: &'a str,
}

impl<'a> EncodeRequest<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        EncodeRequest {
            op: "encode",
            protocol: PROTOCOL,
            role: TOKENIZER_ROLE,
            text,
        }
    }
}

/// An external tokenizer's request: `decode` token ids.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct DecodeRequest<'a> {
    op: &'static str,
    protocol: &'static str,
    role: &'static str,
    pub tokens: &'a [u32],
}

impl<'a> DecodeRequest<'a> {
    pub(crate) fn new(tokens: &'a [u32]) -> Self {
        DecodeRequest {
            op: "decode",
            protocol: PROTOCOL,
            role: TOKENIZER_ROLE,
            tokens,
        }
    }
}

/// The role a tokenizer's requests name.
const TOKENIZER_ROLE: &str = "tokenizer";

/// The fields of a role's request.
pub(crate) fn request_fields(role: Role) -> &'static [&'static str] {
    match role {
        Role::Compressor => CompressorRequest::FIELDS,
        Role::Reader => ReaderRequest::FIELDS,
        Role::Judge => JudgeRequest::FIELDS,
    }
}

/// A request's bytes as sent: one JSON object.
pub(crate) fn to_bytes(request: &impl Serialize) -> Vec<u8> {
    // Serialising borrowed strings, numbers and a JSON value cannot fail.
    serde_json::to_vec(request).unwrap_or_default()
}

/// A request as a JSON value (for a model built-in's cost preview and the callback probes).
pub(crate) fn to_value(request: &impl Serialize) -> Value {
    serde_json::to_value(request).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(value: Value) -> Vec<String> {
        value.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn each_request_is_what_its_fields_say_in_the_bytes_of_a_json_map() {
        let params = json!({"k1": 1.2});
        let compressor = CompressorRequest::new("the sky is blue", None, 3, 42, &params);
        let reader = ReaderRequest::new("m", "q?", 42, &params);
        let judge = JudgeRequest::new("s", "q?", "r", "a", 42, &params);
        for (bytes, fields, role) in [
            (to_bytes(&compressor), CompressorRequest::FIELDS, Role::Compressor),
            (to_bytes(&reader), ReaderRequest::FIELDS, Role::Reader),
            (to_bytes(&judge), JudgeRequest::FIELDS, Role::Judge),
        ] {
            let value: Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(keys(value.clone()), fields, "{role}");
            assert_eq!(request_fields(role), fields);
            // The bytes of the same request built as a JSON value (keys in its map's order).
            assert_eq!(String::from_utf8(bytes).unwrap(), value.to_string(), "{role}");
            assert_eq!(value["protocol"], PROTOCOL);
            assert_eq!(value["role"], role.as_str());
        }
        let value: Value = serde_json::from_slice(&to_bytes(&compressor)).unwrap();
        assert_eq!(value["goal"], Value::Null, "no goal is null");
        let encode = to_bytes(&EncodeRequest::new("héllo"));
        let value: Value = serde_json::from_slice(&encode).unwrap();
        assert_eq!(
            value,
            json!({"op": "encode", "protocol": PROTOCOL, "role": "tokenizer", "text": "héllo"})
        );
        assert_eq!(String::from_utf8(encode).unwrap(), value.to_string());
        let decode = to_bytes(&DecodeRequest::new(&[1, 2]));
        let value: Value = serde_json::from_slice(&decode).unwrap();
        assert_eq!(
            value,
            json!({"op": "decode", "protocol": PROTOCOL, "role": "tokenizer", "tokens": [1, 2]})
        );
        assert_eq!(String::from_utf8(decode).unwrap(), value.to_string());
    }
}
