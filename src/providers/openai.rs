//! OpenAI's Chat Completions (`api = "openai-chat"`): `POST {base_url}/chat/completions`, as
//! served by OpenAI, DeepSeek, Together, Groq, OpenRouter, vLLM, SGLang, llama.cpp and Ollama;
//! batches through `/files` and `/batches`.

use serde_json::{Map, Value, json};

use crate::clock::go_duration;

use super::{
    Allowance, Announced, BatchEnd, Batches, Class, Http, Lost, NewBatch, Prompt, Provider, Reply,
    ResultLine, Tokens, bearer, count, header_number, text_of, verdict_schema,
};

pub(super) struct OpenaiChat;

impl Provider for OpenaiChat {
    fn name(&self) -> &'static str {
        "openai-chat"
    }

    fn takes_seed(&self) -> bool {
        true
    }

    fn call_url(&self, base: &str, _model: &str) -> String {
        format!("{base}/chat/completions")
    }

    fn sign(&self, http: &mut Http, key: Option<&str>) {
        bearer(http, key);
    }

    /// OpenAI-format servers cache shared prefixes by themselves.
    fn cache_split(&self, _user: &str, _prefix: &str, _tokens: &dyn Fn(&str) -> usize) -> Option<usize> {
        None
    }

    fn fill(&self, prompt: &Prompt, body: &mut Map<String, Value>) {
        body.insert("max_tokens".into(), json!(prompt.max_tokens));
        let mut messages = Vec::new();
        if !prompt.system.is_empty() {
            messages.push(json!({"role": "system", "content": prompt.system}));
        }
        messages.push(json!({"role": "user", "content": prompt.user}));
        body.insert("messages".into(), Value::Array(messages));
        if prompt.verdict {
            body.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": "verdict", "strict": true, "schema": verdict_schema()}}),
            );
        }
    }

    fn reply(&self, body: &Value) -> Result<Reply, String> {
        let choice = body
            .get("choices")
            .and_then(|c| c.get(0))
            .ok_or("the reply has no `choices[0]`")?;
        let message = choice
            .get("message")
            .ok_or("the reply's choice has no `message`")?;
        let text = match message.get("content") {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Null) | None => String::new(),
            Some(_) => return Err("the reply's `message.content` is not text".into()),
        };
        let finish_reason = text_of(choice.get("finish_reason"));
        let usage = body.get("usage");
        let field = |name: &str| usage.and_then(|u| u.get(name));
        // OpenAI's cached_tokens; DeepSeek's prompt_cache_hit_tokens.
        let cached = count(
            field("prompt_tokens_details").and_then(|d| d.get("cached_tokens")),
            "prompt_tokens_details.cached_tokens",
        )?
        .max(count(
            field("prompt_cache_hit_tokens"),
            "prompt_cache_hit_tokens",
        )?);
        let (input, output) = (
            count(field("prompt_tokens"), "prompt_tokens")?,
            count(field("completion_tokens"), "completion_tokens")?,
        );
        Ok(Reply {
            batch: false,
            cut_at_max_tokens: finish_reason.as_deref() == Some("length"),
            finish_reason,
            text,
            tool_input: None,
            model: text_of(body.get("model")),
            system_fingerprint: text_of(body.get("system_fingerprint")),
            usage: Tokens {
                input,
                cached_input: cached,
                cache_write: 0,
                output,
            },
            service_ms: None,
        })
    }

    fn announced(&self, header: &dyn Fn(&str) -> Option<String>) -> Announced {
        announced(header)
    }

    fn class(&self, status: u16, body: &str) -> Class {
        class(status, body)
    }

    fn batches(&self) -> &dyn Batches {
        &CHAT_BATCHES
    }
}

/// `x-ratelimit-limit-*`, `-remaining-*` and `-reset-*` (resets as Go durations), as OpenAI's
/// APIs announce them.
pub(super) fn announced(header: &dyn Fn(&str) -> Option<String>) -> Announced {
    let allowance = |what: &str| {
        Some(Allowance {
            limit: header_number(header, &format!("x-ratelimit-limit-{what}"))?,
            remaining: header_number(header, &format!("x-ratelimit-remaining-{what}"))?,
            reset: header(&format!("x-ratelimit-reset-{what}")).and_then(|t| go_duration(t.trim()))?,
        })
    };
    Announced {
        requests: allowance("requests"),
        tokens: allowance("tokens"),
    }
}

/// A status as HTTP means it, but a 429 for an account out of credit (`insufficient_quota`)
/// is no rate limit: no wait brings the credit back, so the endpoint stops, as for a refused
/// key.
pub(super) fn class(status: u16, body: &str) -> Class {
    if status == 429 && out_of_credit(body) {
        Class::Rejected
    } else {
        Class::of(status)
    }
}

/// Whether an error body says the account has no credit left (OpenAI's `insufficient_quota`,
/// as its `code` or its `type`).
fn out_of_credit(body: &str) -> bool {
    let Ok(value) = serde_json::from_str::<Value>(body) else {
        return false;
    };
    ["/error/code", "/error/type"]
        .iter()
        .any(|at| value.pointer(at).and_then(Value::as_str) == Some("insufficient_quota"))
}

/// OpenAI's batch API (`/files` and `/batches`) for the calls of one endpoint path.
pub(super) struct OpenaiBatches {
    /// The path each request line names (`/v1/chat/completions`).
    pub(super) path: &'static str,
}

const CHAT_BATCHES: OpenaiBatches = OpenaiBatches {
    path: "/v1/chat/completions",
};

impl Batches for OpenaiBatches {
    /// The requests as a JSON Lines file, uploaded as multipart form data.
    fn upload(&self, base: &str, batch: &NewBatch<'_>) -> Option<Http> {
        let mut lines = String::new();
        for (key, body) in &batch.requests {
            let line = json!({"custom_id": key, "method": "POST", "url": self.path, "body": body});
            lines.push_str(&line.to_string());
            lines.push('\n');
        }
        let boundary = format!("gacc-{}", batch.submission.get(..16).unwrap_or(batch.submission));
        let mut form = Vec::new();
        form.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n")
                .as_bytes(),
        );
        form.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{}.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n",
                batch.local
            )
            .as_bytes(),
        );
        form.extend_from_slice(lines.as_bytes());
        form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        Some(Http {
            url: format!("{base}/files"),
            headers: Vec::new(),
            body: Some((format!("multipart/form-data; boundary={boundary}"), form)),
        })
    }

    fn create(&self, base: &str, batch: &NewBatch<'_>, uploaded: Option<&Value>) -> Result<Http, String> {
        let file_id = uploaded
            .and_then(|file| file.get("id"))
            .and_then(Value::as_str)
            .ok_or("the upload's reply has no id")?;
        let body = json!({
            "input_file_id": file_id,
            "endpoint": self.path,
            "completion_window": batch.window,
            "metadata": {"gacc_submission": batch.submission},
        });
        Ok(Http::post_json(format!("{base}/batches"), &body))
    }

    fn state_url(&self, base: &str, id: &str) -> String {
        format!("{base}/batches/{id}")
    }

    fn ended(&self, base: &str, _id: &str, state: &Value) -> Option<BatchEnd> {
        let status = state.get("status").and_then(Value::as_str).unwrap_or("");
        if !matches!(status, "completed" | "expired" | "cancelled" | "failed") {
            return None;
        }
        let results = ["output_file_id", "error_file_id"]
            .iter()
            .filter_map(|field| state.get(*field).and_then(Value::as_str))
            .map(|file| format!("{base}/files/{file}/content"))
            .collect();
        Some(BatchEnd {
            status: status.to_owned(),
            results,
        })
    }

    fn result(&self, line: &Value) -> ResultLine {
        let status = line
            .pointer("/response/status_code")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        match (status, line.pointer("/response/body")) {
            (200, Some(body)) => ("succeeded", Some(Ok(body.clone()))),
            _ => {
                let message = line
                    .pointer("/error/message")
                    .or_else(|| line.pointer("/response/body/error/message"))
                    .and_then(Value::as_str)
                    .unwrap_or("the batch answered this request with an error")
                    .to_owned();
                let retryable = status == 429 || status >= 500;
                ("errored", Some(Err((format!("{status}: {message}"), retryable))))
            }
        }
    }

    fn list_url(&self, base: &str) -> String {
        format!("{base}/batches?limit=100")
    }

    /// By the metadata gacc sent with it.
    fn is_lost(&self, listed: &Value, lost: &Lost<'_>) -> bool {
        listed
            .pointer("/metadata/gacc_submission")
            .and_then(Value::as_str)
            == Some(lost.submission)
    }

    fn cancel_url(&self, base: &str, id: &str) -> String {
        format!("{base}/batches/{id}/cancel")
    }
}
