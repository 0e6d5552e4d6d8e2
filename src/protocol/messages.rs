//! The messages of SPEC §2–3, typed both ways. Requests: one per role, as gacc sends it and as
//! a built-in or a model prompt reads it, borrowing the texts it carries (a source is written
//! out for each attempt, never copied into a JSON value first; read back, a text borrows from
//! the request's bytes where it holds no escape). Each type's fields are declared in the order
//! serde_json writes a map's keys, so a request's bytes are those gacc has always sent; `FIELDS`
//! names them, for the exposure audit and the variables a model built-in's template may read.
//! Read, `protocol`, `role`, `seed` and `params` may be left out (a hand-written probe). Responses:
//! what gacc reads of each role's answer (after `exec::callback::check_response` has named any
//! field that is wrong), and what a built-in writes, and the usage any response may report.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub(crate) use super::ladder::{LadderRequest, LadderResponse};
pub(crate) use super::writer::WriterRequest;
use super::{PROTOCOL, Role, default_compressor as compressor, default_protocol as protocol};

/// A compressor's request: the source, the goal (none under `no-goal`), L and the seed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CompressorRequest<'a> {
    #[serde(borrow)]
    pub context: Cow<'a, str>,
    #[serde(borrow)]
    pub goal: Option<Cow<'a, str>>,
    #[serde(default)]
    pub params: Cow<'a, Value>,
    #[serde(default = "protocol")]
    protocol: Cow<'a, str>,
    #[serde(default = "compressor")]
    role: Role,
    #[serde(default)]
    pub seed: u64,
    pub token_budget: usize,
}

fn reader() -> Role {
    Role::Reader
}

fn judge() -> Role {
    Role::Judge
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
            context: Cow::Borrowed(context),
            goal: goal.map(Cow::Borrowed),
            params: Cow::Borrowed(params),
            protocol: protocol(),
            role: Role::Compressor,
            seed,
            token_budget,
        }
    }

    /// The single-budget request of `ladder`'s `budget`: what a compressor serving no ladder is
    /// asked (SPEC §14).
    pub(crate) fn rung(ladder: &'a LadderRequest, budget: usize) -> Self {
        CompressorRequest::new(
            &ladder.context,
            ladder.goal.as_deref(),
            budget,
            ladder.seed,
            &ladder.params,
        )
    }

    /// The request without its source: what the exposure audit reads (SPEC §5).
    pub(crate) fn without_context(&self) -> CompressorRequest<'_> {
        CompressorRequest {
            context: Cow::Borrowed(""),
            goal: self.goal.as_deref().map(Cow::Borrowed),
            params: Cow::Borrowed(&self.params),
            protocol: protocol(),
            role: Role::Compressor,
            seed: self.seed,
            token_budget: self.token_budget,
        }
    }
}

/// A reader's request: one memory and one question.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ReaderRequest<'a> {
    #[serde(borrow)]
    pub memory: Cow<'a, str>,
    #[serde(default)]
    pub params: Cow<'a, Value>,
    #[serde(default = "protocol")]
    protocol: Cow<'a, str>,
    #[serde(borrow)]
    pub question: Cow<'a, str>,
    #[serde(default = "reader")]
    role: Role,
    #[serde(default)]
    pub seed: u64,
}

impl<'a> ReaderRequest<'a> {
    pub(crate) const FIELDS: &'static [&'static str] =
        &["memory", "params", "protocol", "question", "role", "seed"];

    pub(crate) fn new(memory: &'a str, question: &'a str, seed: u64, params: &'a Value) -> Self {
        ReaderRequest {
            memory: Cow::Borrowed(memory),
            params: Cow::Borrowed(params),
            protocol: protocol(),
            question: Cow::Borrowed(question),
            role: Role::Reader,
            seed,
        }
    }
}

/// A judge's request: the source, the question, its reference and the reader's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JudgeRequest<'a> {
    #[serde(borrow)]
    pub answer: Cow<'a, str>,
    #[serde(default)]
    pub params: Cow<'a, Value>,
    #[serde(default = "protocol")]
    protocol: Cow<'a, str>,
    #[serde(borrow)]
    pub question: Cow<'a, str>,
    #[serde(borrow)]
    pub reference: Cow<'a, str>,
    #[serde(default = "judge")]
    role: Role,
    #[serde(default)]
    pub seed: u64,
    #[serde(borrow)]
    pub source: Cow<'a, str>,
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

    /// The request judging `judged`, named field by field: four texts in a row are too easily
    /// passed in the wrong order.
    pub(crate) fn new(judged: Judged<'a>, seed: u64, params: &'a Value) -> Self {
        let Judged {
            source,
            question,
            reference,
            answer,
        } = judged;
        JudgeRequest {
            answer: Cow::Borrowed(answer),
            params: Cow::Borrowed(params),
            protocol: protocol(),
            question: Cow::Borrowed(question),
            reference: Cow::Borrowed(reference),
            role: Role::Judge,
            seed,
            source: Cow::Borrowed(source),
        }
    }
}

/// A request of any role, as read.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub(crate) enum Request<'a> {
    Compressor(CompressorRequest<'a>),
    Reader(ReaderRequest<'a>),
    Judge(JudgeRequest<'a>),
    Writer(WriterRequest<'a>),
}

impl<'a> Request<'a> {
    /// `value` read as a request of `role`.
    pub(crate) fn read(role: Role, value: &'a Value) -> Result<Request<'a>, String> {
        Ok(match role {
            Role::Compressor => Request::Compressor(request(value, role)?),
            Role::Reader => Request::Reader(request(value, role)?),
            Role::Judge => Request::Judge(request(value, role)?),
            Role::Writer => Request::Writer(request(value, role)?),
        })
    }

    pub(crate) fn role(&self) -> Role {
        match self {
            Request::Compressor(_) => Role::Compressor,
            Request::Reader(_) => Role::Reader,
            Request::Judge(_) => Role::Judge,
            Request::Writer(_) => Role::Writer,
        }
    }

    /// The text that the calls of one source or memory share, first: a compressor's, a
    /// judge's and a writer's source, a reader's memory.
    pub(crate) fn shared(&self) -> &str {
        match self {
            Request::Compressor(request) => &request.context,
            Request::Reader(request) => &request.memory,
            Request::Judge(request) => &request.source,
            Request::Writer(request) => &request.source,
        }
    }

    pub(crate) fn seed(&self) -> u64 {
        match self {
            Request::Compressor(request) => request.seed,
            Request::Reader(request) => request.seed,
            Request::Judge(request) => request.seed,
            Request::Writer(request) => request.seed,
        }
    }
}

/// What a judge is asked about: the source, the question, its reference and the reader's answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Judged<'a> {
    pub source: &'a str,
    pub question: &'a str,
    pub reference: &'a str,
    pub answer: &'a str,
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

/// A tokenizer's request as a built-in tokenizer reads it.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub(crate) enum TokenizerRequest<'a> {
    Encode {
        #[serde(borrow)]
        text: Cow<'a, str>,
    },
    Decode {
        tokens: Vec<u32>,
    },
}

/// The role a tokenizer's requests name.
const TOKENIZER_ROLE: &str = "tokenizer";

/// The fields of a role's request.
pub(crate) fn request_fields(role: Role) -> &'static [&'static str] {
    match role {
        Role::Compressor => CompressorRequest::FIELDS,
        Role::Reader => ReaderRequest::FIELDS,
        Role::Judge => JudgeRequest::FIELDS,
        Role::Writer => WriterRequest::FIELDS,
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

/// A compressor's response: its generation, before the cut to L.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct CompressorResponse<'a> {
    #[serde(borrow)]
    pub memory: Cow<'a, str>,
}

/// A reader's response.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct ReaderResponse<'a> {
    #[serde(borrow)]
    pub answer: Cow<'a, str>,
}

/// A judge's response: the verdict, and what it may add.
#[derive(Debug, Clone, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct JudgeResponse<'a> {
    pub correct: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    #[serde(default, borrow, skip_serializing_if = "Option::is_none")]
    pub rationale: Option<Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Map<String, Value>>,
}

impl CompressorResponse<'_> {
    /// A response holding `memory`.
    pub(crate) fn new(memory: impl Into<String>) -> CompressorResponse<'static> {
        CompressorResponse {
            memory: Cow::Owned(memory.into()),
        }
    }
}

impl ReaderResponse<'_> {
    /// A response holding `answer`.
    pub(crate) fn new(answer: impl Into<String>) -> ReaderResponse<'static> {
        ReaderResponse {
            answer: Cow::Owned(answer.into()),
        }
    }
}

impl JudgeResponse<'_> {
    /// A bare verdict.
    pub(crate) fn verdict(correct: bool) -> JudgeResponse<'static> {
        JudgeResponse {
            correct,
            ..JudgeResponse::default()
        }
    }
}

/// A request's role type read from a JSON value, with the message a built-in reports for one
/// that does not hold it.
pub(crate) fn request<'a, T: Deserialize<'a>>(request: &'a Value, role: Role) -> Result<T, String> {
    T::deserialize(request).map_err(|error| format!("the request is not a {role} request: {error}"))
}

impl CompressorResponse<'_> {
    pub(crate) const FIELDS: &'static [&'static str] = &["memory"];
}

impl ReaderResponse<'_> {
    pub(crate) const FIELDS: &'static [&'static str] = &["answer"];
}

impl JudgeResponse<'_> {
    pub(crate) const FIELDS: &'static [&'static str] = &["correct", "score", "rationale"];
}

/// The fields any response may carry besides its role's.
pub(crate) const SHARED_RESPONSE_FIELDS: &[&str] = &["usage", "meta"];

/// The fields of a role's response.
pub(crate) fn response_fields(role: Role) -> &'static [&'static str] {
    match role {
        Role::Compressor => CompressorResponse::FIELDS,
        Role::Reader => ReaderResponse::FIELDS,
        Role::Judge => JudgeResponse::FIELDS,
        Role::Writer => super::writer::RESPONSE_FIELDS,
    }
}

/// What gacc reads of a response, or `None` where it does not hold it (a response that passed
/// `check_response` always does).
pub(crate) fn read<'a, T: Deserialize<'a>>(response: &'a Value) -> Option<T> {
    T::deserialize(response).ok()
}

/// The most tokens one call may report in one count: no model reads or writes a trillion
/// tokens in one call, so a larger count is a broken reply, never summed.
pub(crate) const MAX_TOKENS: u64 = 1_000_000_000_000;
/// The most one call may report it cost, in USD.
pub(crate) const MAX_COST_USD: f64 = 1_000_000.0;

/// What a response's `usage` reported (SPEC §3); a cached memory's entry adds what its call
/// saved and the models that served it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ReportedUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    pub cached_input_tokens: u64,
    pub prompt_cache_saved_usd: f64,
    pub batch_saved_usd: f64,
    pub served_models: std::collections::BTreeMap<String, u64>,
}

/// The `usage` a model call's response carries, as gacc writes it (SPEC §3): what it read and
/// wrote and cost, and where the provider's prompt cache or batch price saved, what it saved.
/// Read back as `ReportedUsage`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    /// With `prompt_cache_saved_usd`, where the prompt cache served part of the input.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub cached: Option<CachedInput>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_saved_usd: Option<f64>,
}

/// The input a provider's prompt cache served, and what that saved.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CachedInput {
    pub cached_input_tokens: u64,
    pub prompt_cache_saved_usd: f64,
}

/// An external tokenizer's answer to `encode`.
#[derive(Debug, Deserialize)]
pub(crate) struct EncodeResponse {
    pub tokens: Vec<u32>,
}

/// An external tokenizer's answer to `decode`.
#[derive(Debug, Deserialize)]
pub(crate) struct DecodeResponse<'a> {
    pub text: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_usage_a_model_call_writes_reads_back_as_reported() {
        let usage = Usage {
            input_tokens: 1200,
            output_tokens: 80,
            cost_usd: 0.0125,
            cached: Some(CachedInput {
                cached_input_tokens: 1024,
                prompt_cache_saved_usd: 0.002,
            }),
            batch_saved_usd: Some(0.006),
        };
        let written = serde_json::to_value(&usage).unwrap();
        assert_eq!(
            written,
            json!({"input_tokens": 1200, "output_tokens": 80, "cost_usd": 0.0125,
                   "cached_input_tokens": 1024, "prompt_cache_saved_usd": 0.002, "batch_saved_usd": 0.006})
        );
        let read = ReportedUsage::deserialize(&written).unwrap();
        assert_eq!(
            (read.input_tokens, read.output_tokens, read.cached_input_tokens),
            (1200, 80, 1024)
        );
        assert_eq!(
            (read.cost_usd, read.prompt_cache_saved_usd, read.batch_saved_usd),
            (0.0125, 0.002, 0.006)
        );
        // Without a prompt cache or a batch: the three counts only.
        let plain = Usage {
            cached: None,
            batch_saved_usd: None,
            ..usage
        };
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            json!({"input_tokens": 1200, "output_tokens": 80, "cost_usd": 0.0125})
        );
    }

    fn keys(value: Value) -> Vec<String> {
        value.as_object().unwrap().keys().cloned().collect()
    }

    #[test]
    fn each_request_is_what_its_fields_say_in_the_bytes_of_a_json_map() {
        let params = json!({"k1": 1.2});
        let compressor = CompressorRequest::new("the sky is blue", None, 3, 42, &params);
        let reader = ReaderRequest::new("m", "q?", 42, &params);
        let judge = JudgeRequest::new(
            Judged {
                source: "s",
                question: "q?",
                reference: "r",
                answer: "a",
            },
            42,
            &params,
        );
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

    #[test]
    fn responses_are_read_borrowed_from_their_json() {
        let memory = json!({"memory": "kept \"text\"", "usage": {"input_tokens": 3}});
        let read_memory: CompressorResponse = read(&memory).unwrap();
        assert_eq!(read_memory.memory, "kept \"text\"");
        let verdict = json!({"correct": true, "score": 1, "rationale": null, "meta": {"m": 1}});
        let judged: JudgeResponse = read(&verdict).unwrap();
        assert_eq!(
            (judged.correct, judged.score, judged.rationale),
            (true, Some(1.0), None)
        );
        assert_eq!(judged.meta.unwrap()["m"], 1);
        assert!(read::<ReaderResponse>(&json!({"answer": null})).is_none());
        let usage: ReportedUsage =
            serde_json::from_value(json!({"input_tokens": 5, "served_models": {"m": 2}})).unwrap();
        assert_eq!(
            (usage.input_tokens, usage.cost_usd, usage.served_models["m"]),
            (5, 0.0, 2)
        );
        let tokens: EncodeResponse = serde_json::from_value(json!({"tokens": [1, 2]})).unwrap();
        assert_eq!(tokens.tokens, [1, 2]);
        assert!(serde_json::from_value::<EncodeResponse>(json!({"tokens": [-1]})).is_err());
        let text = json!({"text": "hé"});
        assert_eq!(read::<DecodeResponse>(&text).unwrap().text, "hé");
    }

    /// The Python helper builds requests (`python -m gacc_callback try`) and names each role's
    /// response field: both are held to these types.
    #[test]
    fn the_python_helper_speaks_these_types() {
        let script = r#"
import json, sys, types
sys.path.insert(0, sys.argv[1])
import gacc_callback as g
out = {"fields": g._FIELD}
for role in ("compressor", "reader", "judge"):
    options = types.SimpleNamespace(role=role, seed=7, params="{}", context=None, goal="a goal", budget=12,
                                    memory=None, question="q?", source=None, reference="r", answer="a")
    out[role] = g._try_request(options)
print(json.dumps(out))
"#;
        let python = concat!(env!("CARGO_MANIFEST_DIR"), "/python");
        let ran = std::process::Command::new("python3")
            .args(["-c", script, python])
            .output();
        let Some(ran) = ran.ok().filter(|ran| ran.status.success()) else {
            assert!(
                std::env::var_os("GACC_REQUIRE_PYTHON").is_none(),
                "python3 is required and did not run the helper"
            );
            eprintln!("skipped: python3 did not run");
            return;
        };
        let out: Value = serde_json::from_slice(&ran.stdout).unwrap();
        for role in [Role::Compressor, Role::Reader, Role::Judge] {
            let request = &out[role.as_str()];
            assert_eq!(keys(request.clone()), request_fields(role), "{role}");
            let read = Request::read(role, request).unwrap();
            assert_eq!((read.role(), read.seed()), (role, 7));
            assert_eq!(out["fields"][role.as_str()], response_fields(role)[0], "{role}");
        }
    }
}
