//! The two wire formats (SPEC §8): a request body from rendered messages, and from a reply its
//! text, the judge's structured verdict, why it stopped, the served model and the usage.

use serde_json::{Map, Value, json};

use crate::inputs::models::{Api, Price};

/// Prompts at least this long (cl100k tokens) mark their memory for Anthropic's prompt cache:
/// the smallest cacheable prefix of Anthropic's models.
pub(crate) const ANTHROPIC_CACHE_MIN_TOKENS: usize = 1024;

/// The JSON Schema of the judge's structured verdict.
pub(crate) fn verdict_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "correct": {"type": "boolean"},
            "rationale": {"type": "string"}
        },
        "required": ["correct", "rationale"],
        "additionalProperties": false
    })
}

/// A call's messages, rendered.
#[derive(Debug)]
pub(crate) struct Prompt {
    pub system: String,
    pub user: String,
    /// Where the user message may be cut into a cached prefix and the rest (Anthropic).
    pub cache_split: Option<usize>,
    pub max_tokens: u64,
    /// Ask for the judge's structured verdict.
    pub verdict: bool,
}

/// The request body: the rendered messages, `max_tokens`, structured output for a judge, the
/// callback's other params as they are, and `seed` as the seed rule says (SPEC §8).
pub(crate) fn body(
    api: Api,
    model: &str,
    prompt: &Prompt,
    params: &Map<String, Value>,
    seed: Option<u64>,
) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("max_tokens".into(), json!(prompt.max_tokens));
    match api {
        Api::OpenaiChat => {
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
        Api::AnthropicMessages => {
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
    }
    // The callback's params go in as they are and win (`response_format`, `temperature`, …);
    // `model` and `structured` are gacc's own, and `seed` is the seed rule's.
    for (key, value) in params {
        match key.as_str() {
            "model" | "structured" => {}
            "seed" => {
                if let Some(seed) = seed {
                    body.insert(key.clone(), json!(seed));
                }
            }
            _ => {
                body.insert(key.clone(), value.clone());
            }
        }
    }
    if let Some(seed) = seed {
        body.entry("seed").or_insert(json!(seed));
    }
    Value::Object(body)
}

/// What a reply says.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Reply {
    /// It came through the provider's batch API (billed at the batch price).
    pub batch: bool,
    pub text: String,
    /// A forced tool call's input (Anthropic's structured verdict).
    pub tool_input: Option<Value>,
    /// The provider stopped at `max_tokens`.
    pub cut_at_max_tokens: bool,
    pub finish_reason: Option<String>,
    pub model: Option<String>,
    pub system_fingerprint: Option<String>,
    pub usage: Tokens,
}

/// A call's tokens, as the provider counted them.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Tokens {
    /// Every input token, cached or not.
    pub input: u64,
    /// Input tokens the provider's prompt cache answered.
    pub cached_input: u64,
    /// Input tokens written to the provider's prompt cache.
    pub cache_write: u64,
    pub output: u64,
}

impl Tokens {
    /// USD at `price` (per million tokens), and what the prompt cache saved.
    pub(crate) fn cost(&self, price: Option<&Price>) -> (f64, f64) {
        let Some(price) = price else {
            return (0.0, 0.0);
        };
        let cached_price = price.cached_input.unwrap_or(price.input);
        let write_price = price.cache_write.unwrap_or(price.input * 1.25);
        let fresh = self.input.saturating_sub(self.cached_input + self.cache_write);
        let cost = fresh as f64 * price.input
            + self.cached_input as f64 * cached_price
            + self.cache_write as f64 * write_price
            + self.output as f64 * price.output;
        let saved = self.cached_input as f64 * (price.input - cached_price);
        (cost / 1e6, saved / 1e6)
    }
}

/// Reads a 200 reply's body, or says what is wrong with it.
pub(crate) fn reply(api: Api, body: &Value) -> Result<Reply, String> {
    let text_of = |value: Option<&Value>| value.and_then(Value::as_str).map(str::to_owned);
    let count = |value: Option<&Value>| value.and_then(Value::as_u64).unwrap_or(0);
    match api {
        Api::OpenaiChat => {
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
            let cached = count(field("prompt_tokens_details").and_then(|d| d.get("cached_tokens")))
                .max(count(field("prompt_cache_hit_tokens")));
            Ok(Reply {
                batch: false,
                cut_at_max_tokens: finish_reason.as_deref() == Some("length"),
                finish_reason,
                text,
                tool_input: None,
                model: text_of(body.get("model")),
                system_fingerprint: text_of(body.get("system_fingerprint")),
                usage: Tokens {
                    input: count(field("prompt_tokens")),
                    cached_input: cached,
                    cache_write: 0,
                    output: count(field("completion_tokens")),
                },
            })
        }
        Api::AnthropicMessages => {
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
            let field = |name: &str| count(usage.and_then(|u| u.get(name)));
            let (read, write) = (
                field("cache_read_input_tokens"),
                field("cache_creation_input_tokens"),
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
                    input: field("input_tokens") + read + write,
                    cached_input: read,
                    cache_write: write,
                    output: field("output_tokens"),
                },
            })
        }
    }
}

/// The provider's own words from an error body: `error.message` (both formats), else the
/// body's first characters.
pub(crate) fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("error"))
            .and_then(Value::as_str)
            .map(str::to_owned)
    });
    let text = message.unwrap_or_else(|| body.trim().to_owned());
    let cut: String = text.chars().take(300).collect();
    if cut.len() < text.len() {
        format!("{cut}…")
    } else {
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_in_both_formats_with_their_prompt_caches() {
        let openai = json!({"model": "gpt-x-2025", "system_fingerprint": "fp_1",
            "choices": [{"message": {"content": "Paris"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 64}}});
        let reply = reply(Api::OpenaiChat, &openai).unwrap();
        assert_eq!(
            (reply.text.as_str(), reply.model.as_deref()),
            ("Paris", Some("gpt-x-2025"))
        );
        assert_eq!(
            reply.usage,
            Tokens {
                input: 100,
                cached_input: 64,
                cache_write: 0,
                output: 3
            }
        );
        let deepseek = json!({"choices": [{"message": {"content": "x"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "prompt_cache_hit_tokens": 8, "prompt_cache_miss_tokens": 2}});
        let reply = super::reply(Api::OpenaiChat, &deepseek).unwrap();
        assert!(reply.cut_at_max_tokens);
        assert_eq!(reply.usage.cached_input, 8);
        let anthropic = json!({"model": "claude-x", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "usage": {"input_tokens": 20, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 0, "output_tokens": 7}});
        let reply = super::reply(Api::AnthropicMessages, &anthropic).unwrap();
        assert_eq!(reply.text, "ab");
        assert_eq!(
            reply.usage,
            Tokens {
                input: 1020,
                cached_input: 1000,
                cache_write: 0,
                output: 7
            }
        );
        assert!(super::reply(Api::OpenaiChat, &json!({"choices": []})).is_err());
        assert!(super::reply(Api::AnthropicMessages, &json!({"content": "x"})).is_err());
    }

    #[test]
    fn cost_prices_fresh_cached_written_and_output_tokens() {
        let price = Price {
            input: 1.0,
            cached_input: Some(0.1),
            cache_write: None,
            output: 2.0,
            ..Price::default()
        };
        let tokens = Tokens {
            input: 1_000_000,
            cached_input: 500_000,
            cache_write: 100_000,
            output: 1_000_000,
        };
        let (cost, saved) = tokens.cost(Some(&price));
        // 400k fresh at 1, 500k cached at 0.1, 100k written at 1.25, 1M out at 2.
        assert!((cost - (0.4 + 0.05 + 0.125 + 2.0)).abs() < 1e-12, "{cost}");
        assert!((saved - 0.45).abs() < 1e-12, "{saved}");
        assert_eq!(tokens.cost(None), (0.0, 0.0));
    }

    #[test]
    fn params_go_into_the_body_and_win() {
        let prompt = Prompt {
            system: "s".into(),
            user: "u".into(),
            cache_split: None,
            max_tokens: 10,
            verdict: true,
        };
        let params = json!({"model": "deepseek", "temperature": 0.0, "response_format": {"type": "json_object"}, "max_tokens": 5});
        let body = body(
            Api::OpenaiChat,
            "deepseek-chat",
            &prompt,
            params.as_object().unwrap(),
            None,
        );
        assert_eq!(body["model"], "deepseek-chat");
        assert_eq!(body["max_tokens"], 5);
        assert_eq!(body["response_format"]["type"], "json_object");
        assert_eq!(body["messages"][0]["role"], "system");
        let prompt = Prompt {
            system: String::new(),
            user: "memory|question".into(),
            cache_split: Some(7),
            max_tokens: 10,
            verdict: true,
        };
        let body = super::body(Api::AnthropicMessages, "claude", &prompt, &Map::new(), None);
        assert_eq!(body["messages"][0]["content"][0]["text"], "memory|");
        assert_eq!(
            body["messages"][0]["content"][0]["cache_control"]["type"],
            "ephemeral"
        );
        assert_eq!(body["tool_choice"]["name"], "verdict");
        assert!(body.get("system").is_none());
    }

    #[test]
    fn an_error_body_gives_the_providers_message() {
        assert_eq!(
            error_message(r#"{"error": {"message": "Invalid model", "type": "x"}}"#),
            "Invalid model"
        );
        assert_eq!(error_message("upstream down"), "upstream down");
        assert!(error_message(&"x".repeat(1000)).chars().count() <= 301);
    }
}
