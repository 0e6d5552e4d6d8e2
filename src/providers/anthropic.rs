//! Anthropic's Messages API (`api = "anthropic-messages"`): `POST {base_url}/v1/messages`,
//! long shared prefixes marked for its prompt cache, the judge's verdict as a forced tool
//! call; batches through `/v1/messages/batches`.

use serde_json::{Map, Value, json};

use crate::clock::until_rfc3339;

use super::{
    Allowance, Announced, BatchEnd, Batches, Http, Lost, NewBatch, Prompt, Provider, Reply, ResultLine,
    Tokens, count, header_number, text_of, verdict_schema,
};

/// Prompts at least this long (cl100k tokens) mark their shared prefix for the prompt cache:
/// the smallest cacheable prefix of Anthropic's models.
const CACHE_MIN_TOKENS: usize = 1024;

/// The API version gacc speaks.
const VERSION: &str = "2023-06-01";

pub(super) struct AnthropicMessages;

impl Provider for AnthropicMessages {
    fn name(&self) -> &'static str {
        "anthropic-messages"
    }

    fn takes_seed(&self) -> bool {
        false
    }

    fn call_url(&self, base: &str, _model: &str) -> String {
        format!("{base}/v1/messages")
    }

    fn sign(&self, http: &mut Http, key: Option<&str>) {
        http.headers.push(("anthropic-version", VERSION.to_owned()));
        http.headers.extend(key.map(|key| ("x-api-key", key.to_owned())));
    }

    /// After the line that ends the shared prefix, when the prefix is long enough to cache.
    fn cache_split(&self, user: &str, prefix: &str, tokens: &dyn Fn(&str) -> usize) -> Option<usize> {
        if tokens(prefix) < CACHE_MIN_TOKENS {
            return None;
        }
        user.find(prefix).map(|at| {
            let end = at + prefix.len();
            user[end..].find('\n').map_or(end, |n| end + n + 1)
        })
    }

    fn fill(&self, prompt: &Prompt, body: &mut Map<String, Value>) {
        body.insert("max_tokens".into(), json!(prompt.max_tokens));
        if !prompt.system.is_empty() {
            body.insert("system".into(), json!(prompt.system));
        }
        let content = match prompt.cache_split {
            Some(at) if at > 0 && at < prompt.user.len() => json!([
                {"type": "text", "text": &prompt.user[..at], "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": &prompt.user[at..]},
            ]),
            _ => json!([{"type": "text", "text": prompt.user}]),
        };
        body.insert("messages".into(), json!([{"role": "user", "content": content}]));
        if prompt.verdict {
            body.insert(
                "tools".into(),
                json!([{"name": "verdict", "description": "Record the grade of the answer.", "input_schema": verdict_schema()}]),
            );
            body.insert("tool_choice".into(), json!({"type": "tool", "name": "verdict"}));
        }
    }

    fn reply(&self, body: &Value) -> Result<Reply, String> {
        let blocks = body
            .get("content")
            .and_then(Value::as_array)
            .ok_or("the reply has no `content` list")?;
        let mut text = String::new();
        let mut tool_input = None;
        for block in blocks {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
                Some("tool_use") => tool_input = block.get("input").cloned(),
                _ => {}
            }
        }
        let finish_reason = text_of(body.get("stop_reason"));
        let usage = body.get("usage");
        let field = |name: &str| count(usage.and_then(|u| u.get(name)), name);
        let (read, write) = (
            field("cache_read_input_tokens")?,
            field("cache_creation_input_tokens")?,
        );
        Ok(Reply {
            batch: false,
            cut_at_max_tokens: finish_reason.as_deref() == Some("max_tokens"),
            finish_reason,
            text,
            tool_input,
            model: text_of(body.get("model")),
            system_fingerprint: None,
            usage: Tokens {
                // Anthropic's input_tokens leaves out the cached and the newly cached.
                input: field("input_tokens")?.saturating_add(read).saturating_add(write),
                cached_input: read,
                cache_write: write,
                output: field("output_tokens")?,
            },
            service_ms: None,
        })
    }

    /// `anthropic-ratelimit-*-limit`, `-remaining` and `-reset` (resets as RFC 3339 times).
    fn announced(&self, header: &dyn Fn(&str) -> Option<String>) -> Announced {
        let allowance = |what: &str| {
            let reset =
                header(&format!("anthropic-ratelimit-{what}-reset")).and_then(|t| until_rfc3339(t.trim()))?;
            Some(Allowance {
                limit: header_number(header, &format!("anthropic-ratelimit-{what}-limit"))?,
                remaining: header_number(header, &format!("anthropic-ratelimit-{what}-remaining"))?,
                reset,
            })
        };
        Announced {
            requests: allowance("requests"),
            tokens: allowance("tokens").or_else(|| allowance("input-tokens")),
        }
    }

    fn writes_prompt_cache(&self) -> bool {
        true
    }

    fn batches(&self) -> &dyn Batches {
        self
    }
}

impl Batches for AnthropicMessages {
    fn upload(&self, _base: &str, _batch: &NewBatch<'_>) -> Option<Http> {
        None
    }

    fn create(&self, base: &str, batch: &NewBatch<'_>, _uploaded: Option<&Value>) -> Result<Http, String> {
        let items: Vec<Value> = batch
            .requests
            .iter()
            .map(|(key, body)| json!({"custom_id": key, "params": body}))
            .collect();
        Ok(Http::post_json(
            format!("{base}/v1/messages/batches"),
            &json!({"requests": items}),
        ))
    }

    fn state_url(&self, base: &str, id: &str) -> String {
        format!("{base}/v1/messages/batches/{id}")
    }

    fn ended(&self, base: &str, id: &str, state: &Value) -> Option<BatchEnd> {
        if state.get("processing_status").and_then(Value::as_str) != Some("ended") {
            return None;
        }
        let results = state
            .get("results_url")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .unwrap_or_else(|| format!("{base}/v1/messages/batches/{id}/results"));
        Some(BatchEnd {
            status: "ended".into(),
            results: vec![results],
        })
    }

    fn result(&self, line: &Value) -> ResultLine {
        match line.pointer("/result/type").and_then(Value::as_str) {
            Some("succeeded") => match line.pointer("/result/message") {
                Some(message) => ("succeeded", Some(Ok(message.clone()))),
                None => (
                    "errored",
                    Some(Err(("a result without its message".into(), false))),
                ),
            },
            Some("errored") => {
                let error = line
                    .pointer("/result/error/error")
                    .or_else(|| line.pointer("/result/error"));
                let message = error
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("the batch answered this request with an error")
                    .to_owned();
                let kind = error
                    .and_then(|e| e.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let retryable = matches!(kind, "overloaded_error" | "api_error" | "rate_limit_error");
                ("errored", Some(Err((message, retryable))))
            }
            Some("expired") => ("expired", None),
            Some("canceled") => ("canceled", None),
            _ => ("unanswered", None),
        }
    }

    fn list_url(&self, base: &str) -> String {
        format!("{base}/v1/messages/batches?limit=100")
    }

    /// Its batches carry no metadata: by its size, and created since it was recorded.
    fn is_lost(&self, listed: &Value, lost: &Lost<'_>) -> bool {
        let Some(counts) = listed.get("request_counts") else {
            return false;
        };
        // Summed without overflow: a listing is the server's word, and any count may be absurd.
        let total = ["processing", "succeeded", "errored", "canceled", "expired"]
            .iter()
            .filter_map(|k| counts.get(*k).and_then(Value::as_u64))
            .try_fold(0u64, u64::checked_add);
        total == Some(lost.requests as u64)
            && listed
                .get("created_at")
                .and_then(Value::as_str)
                .is_some_and(|at| at >= lost.created)
    }

    fn cancel_url(&self, base: &str, id: &str) -> String {
        format!("{base}/v1/messages/batches/{id}/cancel")
    }
}
