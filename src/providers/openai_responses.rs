//! OpenAI's Responses API (`api = "openai-responses"`): `POST {base_url}/responses`, the
//! system prompt as `instructions`, the most tokens as `max_output_tokens`, the judge's verdict
//! as a JSON Schema `text.format`; nothing stored at the provider (`store = false`, which a
//! callback's params may override); batches through `/files` and `/batches` as for chat
//! completions. It takes no seed.

use serde_json::{Map, Value, json};

use super::openai::{self, OpenaiBatches};
use super::{
    Announced, Batches, Class, Http, Prompt, Provider, Reply, Tokens, bearer, count, text_of, verdict_schema,
};

pub(super) struct OpenaiResponses;

const BATCHES: OpenaiBatches = OpenaiBatches {
    path: "/v1/responses",
};

impl Provider for OpenaiResponses {
    fn name(&self) -> &'static str {
        "openai-responses"
    }

    fn takes_seed(&self) -> bool {
        false
    }

    fn call_url(&self, base: &str, _model: &str) -> String {
        format!("{base}/responses")
    }

    fn sign(&self, http: &mut Http, key: Option<&str>) {
        bearer(http, key);
    }

    /// OpenAI caches shared prefixes by itself.
    fn cache_split(&self, _user: &str, _prefix: &str, _tokens: &dyn Fn(&str) -> usize) -> Option<usize> {
        None
    }

    fn fill(&self, prompt: &Prompt, body: &mut Map<String, Value>) {
        body.insert("max_output_tokens".into(), json!(prompt.max_tokens));
        if !prompt.system.is_empty() {
            body.insert("instructions".into(), json!(prompt.system));
        }
        body.insert(
            "input".into(),
            json!([{"role": "user", "content": [{"type": "input_text", "text": prompt.user}]}]),
        );
        body.insert("store".into(), json!(false));
        if prompt.verdict {
            body.insert(
                "text".into(),
                json!({"format": {"type": "json_schema", "name": "verdict", "strict": true, "schema": verdict_schema()}}),
            );
        }
    }

    /// The text of every `output_text` of the `message` items (reasoning items are not the
    /// answer); a refusal is no text. A response that `failed` is an unreadable reply.
    fn reply(&self, body: &Value) -> Result<Reply, String> {
        let status = text_of(body.get("status"));
        if status.as_deref() == Some("failed") {
            let why = body
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("no reason given");
            return Err(format!("the response failed: {why}"));
        }
        let items = body
            .get("output")
            .and_then(Value::as_array)
            .ok_or("the reply has no `output` list")?;
        let mut text = String::new();
        for item in items
            .iter()
            .filter(|i| i.get("type").and_then(Value::as_str) == Some("message"))
        {
            let parts = item
                .get("content")
                .and_then(Value::as_array)
                .ok_or("a message of the reply's `output` has no `content` list")?;
            for part in parts {
                if part.get("type").and_then(Value::as_str) == Some("output_text") {
                    match part.get("text") {
                        Some(Value::String(piece)) => text.push_str(piece),
                        _ => return Err("an `output_text` of the reply has no text".into()),
                    }
                }
            }
        }
        let incomplete = text_of(body.pointer("/incomplete_details/reason"));
        let usage = body.get("usage");
        let field = |path: &str| count(usage.and_then(|u| u.pointer(path)), &path[1..].replace('/', "."));
        Ok(Reply {
            batch: false,
            cut_at_max_tokens: incomplete.as_deref() == Some("max_output_tokens"),
            finish_reason: incomplete.or(status),
            text,
            tool_input: None,
            model: text_of(body.get("model")),
            system_fingerprint: None,
            usage: Tokens {
                input: field("/input_tokens")?,
                cached_input: field("/input_tokens_details/cached_tokens")?,
                cache_write: 0,
                output: field("/output_tokens")?,
            },
            service_ms: None,
        })
    }

    fn announced(&self, header: &dyn Fn(&str) -> Option<String>) -> Announced {
        openai::announced(header)
    }

    fn class(&self, status: u16, body: &str) -> Class {
        openai::class(status, body)
    }

    fn batches(&self) -> &dyn Batches {
        &BATCHES
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::{Api, body};

    fn prompt(verdict: bool) -> Prompt {
        Prompt {
            system: "Answer briefly.".into(),
            user: "<memory>\nx\n</memory>\nQuestion: y".into(),
            cache_split: None,
            max_tokens: 64,
            verdict,
        }
    }

    #[test]
    fn a_call_is_a_response_with_instructions_input_and_a_schema_for_a_verdict() {
        let api = Api::named("openai-responses").unwrap();
        let params = json!({"model": "mock", "temperature": 0.0, "seed": 3, "max_tokens": 64});
        let sent = body(api, "gpt-x", &prompt(true), params.as_object().unwrap(), None);
        assert_eq!(
            sent,
            json!({
                "model": "gpt-x",
                "max_output_tokens": 64,
                "instructions": "Answer briefly.",
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "<memory>\nx\n</memory>\nQuestion: y"}]}],
                "store": false,
                "text": {"format": {"type": "json_schema", "name": "verdict", "strict": true, "schema": verdict_schema()}},
                "temperature": 0.0,
            }),
            "no seed (the API takes none), and `max_tokens` under the API's name"
        );
        let no_system = Prompt {
            system: String::new(),
            ..prompt(false)
        };
        let sent = body(api, "gpt-x", &no_system, &Map::new(), None);
        assert!(sent.get("instructions").is_none() && sent.get("text").is_none());
        let mut http = api.provider().request("http://h/v1", "gpt-x", &sent);
        api.provider().sign(&mut http, Some("k"));
        assert_eq!(http.url, "http://h/v1/responses");
        assert_eq!(http.headers, [("authorization", "Bearer k".to_owned())]);
    }

    #[test]
    fn a_reply_is_read_from_its_message_items_with_usage_and_a_cut() {
        let provider = OpenaiResponses;
        let done = json!({
            "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-x-2026",
            "output": [
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": "Par", "annotations": []},
                    {"type": "output_text", "text": "is", "annotations": []}]}
            ],
            "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64},
                      "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 105}
        });
        let reply = provider.reply(&done).unwrap();
        assert_eq!(reply.text, "Paris");
        assert_eq!(reply.model.as_deref(), Some("gpt-x-2026"));
        assert_eq!(
            reply.usage,
            Tokens {
                input: 100,
                cached_input: 64,
                cache_write: 0,
                output: 5
            }
        );
        assert!(!reply.cut_at_max_tokens);
        let cut = json!({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"},
            "output": [{"type": "message", "content": [{"type": "output_text", "text": "Pa"}]}]});
        let reply = provider.reply(&cut).unwrap();
        assert!(reply.cut_at_max_tokens);
        assert_eq!(reply.finish_reason.as_deref(), Some("max_output_tokens"));
        // A refusal is no text; nothing but reasoning is an empty answer.
        let refused = json!({"status": "completed",
            "output": [{"type": "message", "content": [{"type": "refusal", "refusal": "I can't."}]}]});
        assert_eq!(provider.reply(&refused).unwrap().text, "");
    }

    #[test]
    fn a_hostile_reply_is_unreadable_not_a_panic_or_an_absurd_count() {
        let provider = OpenaiResponses;
        for (body, says) in [
            (
                json!({"status": "failed", "error": {"code": "server_error", "message": "boom"}}),
                "boom",
            ),
            (json!({"status": "completed"}), "`output`"),
            (json!({"output": "text"}), "`output`"),
            (json!({"output": [{"type": "message"}]}), "`content`"),
            (
                json!({"output": [{"type": "message", "content": [{"type": "output_text", "text": 5}]}]}),
                "no text",
            ),
            (
                json!({"output": [], "usage": {"input_tokens": -1}}),
                "input_tokens",
            ),
            (
                json!({"output": [], "usage": {"input_tokens_details": {"cached_tokens": u64::MAX}}}),
                "input_tokens_details.cached_tokens",
            ),
            (
                json!({"output": [], "usage": {"output_tokens": 1.5}}),
                "output_tokens",
            ),
        ] {
            let error = provider.reply(&body).unwrap_err();
            assert!(error.contains(says), "{body}: {error}");
        }
    }

    #[test]
    fn batches_name_the_responses_path_and_limits_and_classing_are_openais() {
        let provider = OpenaiResponses;
        let requests = [("k1", json!({"model": "m"}))];
        let new = crate::providers::NewBatch {
            requests: requests.iter().map(|(k, v)| (*k, v)).collect(),
            local: "local",
            submission: "0123456789abcdef0123456789abcdef",
            window: "24h",
        };
        let upload = provider.batches().upload("http://h/v1", &new).unwrap();
        let form = String::from_utf8(upload.body.unwrap().1).unwrap();
        assert!(form.contains(r#""url":"/v1/responses""#), "{form}");
        let create = provider
            .batches()
            .create("http://h/v1", &new, Some(&json!({"id": "file-1"})))
            .unwrap();
        let created: Value = serde_json::from_slice(&create.body.unwrap().1).unwrap();
        assert_eq!(created["endpoint"], "/v1/responses");
        let header = |name: &str| match name {
            "x-ratelimit-limit-requests" => Some("60".to_owned()),
            "x-ratelimit-remaining-requests" => Some("0".to_owned()),
            "x-ratelimit-reset-requests" => Some("1s".to_owned()),
            _ => None,
        };
        assert_eq!(provider.announced(&header).requests.map(|a| a.limit), Some(60.0));
        let quota = r#"{"error": {"type": "insufficient_quota", "code": "insufficient_quota"}}"#;
        assert_eq!(provider.class(429, quota), Class::Rejected);
        assert_eq!(provider.class(429, "{}"), Class::RateLimited);
    }
}
