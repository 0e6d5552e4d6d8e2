//! The model APIs gacc speaks (SPEC §8, §9), one file each behind `Provider`: a call's URL
//! and body, how it is signed, what a reply says (text, verdict, usage, served model), what a
//! status means (a rate limit, a refused key, an account out of credit) and which limit a 429
//! exhausted, the rate limits a reply announces, and the provider's batch API as data. Nothing here
//! makes a request: `exec::model` sends what a provider describes, so each provider is a pure
//! translation, tested on recorded JSON. A new provider is a file here and a line in
//! `PROVIDERS`.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Map, Value, json};

mod anthropic;
mod openai;
mod openai_responses;

/// Every provider, by the `api` name a manifest gives it.
pub(crate) const PROVIDERS: &[&dyn Provider] = &[
    &openai::OpenaiChat,
    &anthropic::AnthropicMessages,
    &openai_responses::OpenaiResponses,
];

/// One model API's wire format: everything of a call that is not HTTP itself.
pub(crate) trait Provider: Sync {
    /// Its `api` name in a manifest (`openai-chat`).
    fn name(&self) -> &'static str;
    /// Whether its requests take a `seed` (SPEC §8, "Seeds and identical requests").
    fn takes_seed(&self) -> bool;
    /// The URL of one call (with `model` where the API names it in the path).
    fn call_url(&self, base: &str, model: &str) -> String;
    /// Adds the headers that carry the key (and the API's version) to a request.
    fn sign(&self, http: &mut Http, key: Option<&str>);
    /// Where the user message may be cut into a prefix the provider caches and the rest, the
    /// prefix being the text calls share (`tokens` counts it); None where the provider caches
    /// by itself, or not at all.
    fn cache_split(&self, user: &str, prefix: &str, tokens: &dyn Fn(&str) -> usize) -> Option<usize>;
    /// Its messages, the most tokens a reply may write, and the judge's structured output,
    /// into `body` (`model`, the callback's params and the seed are common: see `body`).
    fn fill(&self, prompt: &Prompt, body: &mut Map<String, Value>);
    /// One call as the HTTP client sends it, before `sign`.
    fn request(&self, base: &str, model: &str, body: &Value) -> Http {
        Http::post_json(self.call_url(base, model), body)
    }
    /// What a 200 reply's body says, or what is wrong with it.
    fn reply(&self, body: &Value) -> Result<Reply, String>;
    /// The limits a reply's headers announce (`header` gives a header's value by name).
    fn announced(&self, header: &dyn Fn(&str) -> Option<String>) -> Announced;
    /// What a reply's status and body mean for the call and for the endpoint's later calls
    /// (redirects are refused before a provider is asked).
    fn class(&self, status: u16, _body: &str) -> Class {
        Class::of(status)
    }
    /// Which limit a 429 exhausted: what the headers show at zero, else what its message says.
    fn exhausted(&self, announced: &Announced, message: &str) -> Exhausted {
        let empty = |allowance: Option<Allowance>| allowance.is_some_and(|a| a.remaining < 1.0);
        match (empty(announced.requests), empty(announced.tokens)) {
            (true, false) => Exhausted::Requests,
            (false, true) => Exhausted::Tokens,
            _ => Exhausted::from_message(message),
        }
    }
    /// The batch API: its requests as data, its answers read.
    fn batches(&self) -> &dyn Batches;
    /// Whether a call may write the provider's prompt cache, billed above plain input (an
    /// upper bound of a call's cost prices its input so).
    fn writes_prompt_cache(&self) -> bool {
        false
    }
}

/// What a reply's HTTP status means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// A reply to read.
    Answered,
    /// A rate limit: the call waits and goes again, and the pace slows.
    RateLimited,
    /// Worth another try (a timeout, a conflict, a server error).
    Transient,
    /// The key, the model or the account is refused: every later call would be too.
    Rejected,
    /// This request is refused (a 400, a 413): another try would be refused the same way.
    Refused,
}

impl Class {
    /// By the status alone, as HTTP means it.
    pub(crate) fn of(status: u16) -> Class {
        match status {
            200..=299 => Class::Answered,
            429 => Class::RateLimited,
            408 | 409 | 500..=599 => Class::Transient,
            401 | 403 | 404 => Class::Rejected,
            _ => Class::Refused,
        }
    }
}

/// Which limit a 429 was about, as far as the provider said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exhausted {
    Requests,
    Tokens,
    /// It did not say: both rates are learned.
    Unknown,
}

impl Exhausted {
    /// From the 429's message (OpenAI: "… on tokens per min (TPM) …", "… on requests per min").
    pub(crate) fn from_message(message: &str) -> Exhausted {
        let message = message.to_ascii_lowercase();
        match (message.contains("token"), message.contains("request")) {
            (true, false) => Exhausted::Tokens,
            (false, true) => Exhausted::Requests,
            _ => Exhausted::Unknown,
        }
    }
}

/// The bearer token of OpenAI-like APIs.
fn bearer(http: &mut Http, key: Option<&str>) {
    http.headers
        .extend(key.map(|key| ("authorization", format!("Bearer {key}"))));
}

/// A provider's batch API (SPEC §9).
pub(crate) trait Batches: Sync {
    /// A file to upload before the batch is created, if the API wants one.
    fn upload(&self, base: &str, batch: &NewBatch<'_>) -> Option<Http>;
    /// The request that creates the batch (`uploaded`: the upload's reply).
    fn create(&self, base: &str, batch: &NewBatch<'_>, uploaded: Option<&Value>) -> Result<Http, String>;
    /// Where a batch's state is read.
    fn state_url(&self, base: &str, id: &str) -> String;
    /// Once a batch has ended: how it ended and where its result lines are; None while it runs.
    fn ended(&self, base: &str, id: &str, state: &Value) -> Option<BatchEnd>;
    /// One result line: how it came out (`succeeded`, `errored`, `expired` …) and the reply's
    /// body, or `(message, retryable)`; None for a request to submit again.
    fn result(&self, line: &Value) -> ResultLine;
    /// The id a batch's creation (or a listing) gives it.
    fn id(&self, reply: &Value) -> Option<String> {
        text_of(reply.get("id"))
    }
    /// The batches of a listing (`list_url`'s reply).
    fn listed<'a>(&self, list: &'a Value) -> Vec<&'a Value> {
        list.get("data")
            .and_then(Value::as_array)
            .map(|batches| batches.iter().collect())
            .unwrap_or_default()
    }
    /// Where the account's recent batches are listed.
    fn list_url(&self, base: &str) -> String;
    /// Whether a listed batch is the one submitted as `lost` (found after a kill lost its id).
    fn is_lost(&self, listed: &Value, lost: &Lost<'_>) -> bool;
    /// The request that cancels a batch.
    fn cancel_url(&self, base: &str, id: &str) -> String;

    /// The result lines of a results file, by the cache key each answers (its `custom_id`).
    fn result_lines(&self, text: &str) -> HashMap<String, Value> {
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter_map(|line| Some((line.get("custom_id")?.as_str()?.to_owned(), line)))
            .collect()
    }
}

/// Why a request failed, and whether it is worth another try.
pub(crate) type Refusal = (String, bool);

/// How one request of a batch came out (`succeeded`, `errored`, `expired` …), and the reply's
/// body or its refusal; no answer for a request to submit again.
pub(crate) type ResultLine = (&'static str, Option<Result<Value, Refusal>>);

/// A batch about to be submitted: its requests (cache key, body) and its bookkeeping.
#[derive(Debug)]
pub(crate) struct NewBatch<'a> {
    pub requests: Vec<(&'a str, &'a Value)>,
    /// gacc's own name for it (the uploaded file's name).
    pub local: &'a str,
    /// Sent as the batch's metadata where the API keeps any.
    pub submission: &'a str,
    /// The completion window asked for (`24h`).
    pub window: &'a str,
}

/// A recorded batch whose provider id was lost.
#[derive(Debug)]
pub(crate) struct Lost<'a> {
    pub submission: &'a str,
    pub requests: usize,
    /// When it was recorded, RFC 3339.
    pub created: &'a str,
}

/// A batch that has ended: its status and the URLs of its result lines.
#[derive(Debug, PartialEq)]
pub(crate) struct BatchEnd {
    pub status: String,
    pub results: Vec<String>,
}

/// A request for the HTTP client: POST when it has a body (content type, bytes), else GET.
/// A provider's `sign` adds its auth headers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Http {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<(String, Vec<u8>)>,
}

impl Http {
    pub(crate) fn get(url: String) -> Http {
        Http {
            url,
            headers: Vec::new(),
            body: None,
        }
    }

    fn post_json(url: String, body: &Value) -> Http {
        Http {
            url,
            headers: Vec::new(),
            body: Some(("application/json".to_owned(), body.to_string().into_bytes())),
        }
    }
}

/// The wire format an endpoint speaks: a registered provider, named as in a manifest.
#[derive(Clone, Copy)]
pub(crate) struct Api(&'static dyn Provider);

impl Api {
    /// The provider named `name`, or the names there are.
    pub(crate) fn named(name: &str) -> Result<Api, String> {
        PROVIDERS
            .iter()
            .find(|p| p.name() == name)
            .map(|p| Api(*p))
            .ok_or_else(|| {
                let names: Vec<String> = PROVIDERS.iter().map(|p| format!("`{}`", p.name())).collect();
                format!("unknown api `{name}`: expected {}", names.join(" or "))
            })
    }

    pub(crate) fn as_str(self) -> &'static str {
        self.0.name()
    }

    pub(crate) fn provider(self) -> &'static dyn Provider {
        self.0
    }
}

impl PartialEq for Api {
    fn eq(&self, other: &Api) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Api {}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for Api {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Api {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Api, D::Error> {
        let name = String::deserialize(deserializer)?;
        Api::named(&name).map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for Api {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Api".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let names: Vec<&str> = PROVIDERS.iter().map(|p| p.name()).collect();
        schemars::json_schema!({
            "description": "The wire format an endpoint speaks.",
            "type": "string",
            "enum": names,
        })
    }
}

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
    /// Where the user message may be cut into a cached prefix and the rest.
    pub cache_split: Option<usize>,
    pub max_tokens: u64,
    /// Ask for the judge's structured verdict.
    pub verdict: bool,
}

/// The request body: the model, what the provider fills in (messages, the most tokens,
/// structured output for a judge), the callback's other params as they are, and `seed` as the
/// seed rule says (SPEC §8).
pub(crate) fn body(
    api: Api,
    model: &str,
    prompt: &Prompt,
    params: &Map<String, Value>,
    seed: Option<u64>,
) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    api.provider().fill(prompt, &mut body);
    // The callback's params go in as they are and win (`response_format`, `temperature`, …);
    // `model` and `structured` are gacc's own, `max_tokens` is the prompt's (checked when the
    // manifest is loaded, and written by the provider under its API's name), and `seed` is
    // the seed rule's.
    for (key, value) in params {
        match key.as_str() {
            "model" | "structured" | "max_tokens" => {}
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
    /// A forced tool call's input (a structured verdict given as a tool call).
    pub tool_input: Option<Value>,
    /// The provider stopped at `max_tokens`.
    pub cut_at_max_tokens: bool,
    pub finish_reason: Option<String>,
    pub model: Option<String>,
    pub system_fingerprint: Option<String>,
    pub usage: Tokens,
    /// How long the server took, from the request sent to its reply (the endpoint's place
    /// and pace waited for before are not in it).
    pub service_ms: Option<u64>,
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

/// One limit as a reply announced it: its size, what remains, and how long until it is full.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Allowance {
    pub limit: f64,
    pub remaining: f64,
    pub reset: Duration,
}

/// What a reply's rate-limit headers announced.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Announced {
    pub requests: Option<Allowance>,
    pub tokens: Option<Allowance>,
}

/// A header's number: finite, not negative.
fn header_number(header: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<f64> {
    header(name)
        .and_then(|text| text.trim().parse::<f64>().ok())
        .filter(|n| n.is_finite() && *n >= 0.0)
}

/// A string field of a JSON value.
fn text_of(value: Option<&Value>) -> Option<String> {
    value.and_then(Value::as_str).map(str::to_owned)
}

/// A whole-number field of a JSON value, 0 when absent.
/// A token count a reply's usage gives under `name`: absent or null is 0; anything but a whole
/// number from 0 to `MAX_TOKENS` (a negative, a fraction, text, 2^64 − 1) makes the reply
/// unreadable, so that no absurd count is summed or priced.
fn count(value: Option<&Value>, name: &str) -> Result<u64, String> {
    match value {
        None | Some(Value::Null) => Ok(0),
        Some(number) => number
            .as_u64()
            .filter(|n| *n <= crate::protocol::messages::MAX_TOKENS)
            .ok_or_else(|| format!("its usage's `{name}` is not a token count: {number}")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The two formats most tests speak.
    pub(crate) const OPENAI_CHAT: Api = Api(&openai::OpenaiChat);
    pub(crate) const ANTHROPIC_MESSAGES: Api = Api(&anthropic::AnthropicMessages);

    fn reply(api: Api, body: &Value) -> Result<Reply, String> {
        api.provider().reply(body)
    }

    #[test]
    fn usage_is_read_in_both_formats_with_their_prompt_caches() {
        let openai = json!({"model": "gpt-x-2025", "system_fingerprint": "fp_1",
            "choices": [{"message": {"content": "Paris"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 64}}});
        let reply = super::tests::reply(tests::OPENAI_CHAT, &openai).unwrap();
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
        let reply = super::tests::reply(tests::OPENAI_CHAT, &deepseek).unwrap();
        assert!(reply.cut_at_max_tokens);
        assert_eq!(reply.usage.cached_input, 8);
        let anthropic = json!({"model": "claude-x", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "usage": {"input_tokens": 20, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 0, "output_tokens": 7}});
        let reply = super::tests::reply(tests::ANTHROPIC_MESSAGES, &anthropic).unwrap();
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
        assert!(super::tests::reply(tests::OPENAI_CHAT, &json!({"choices": []})).is_err());
        assert!(super::tests::reply(tests::ANTHROPIC_MESSAGES, &json!({"content": "x"})).is_err());
    }

    #[test]
    fn params_go_into_the_body_and_win() {
        // The prompt's `max_tokens` is the callback's `params.max_tokens` where it is set.
        let prompt = Prompt {
            system: "s".into(),
            user: "u".into(),
            cache_split: None,
            max_tokens: 5,
            verdict: true,
        };
        let params = json!({"model": "deepseek", "temperature": 0.0, "response_format": {"type": "json_object"}, "max_tokens": 5});
        let body = body(
            tests::OPENAI_CHAT,
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
        let body = super::body(tests::ANTHROPIC_MESSAGES, "claude", &prompt, &Map::new(), None);
        assert_eq!(body["messages"][0]["content"][0]["text"], "memory|");
        assert_eq!(
            body["messages"][0]["content"][0]["cache_control"]["type"],
            "ephemeral"
        );
        assert_eq!(body["tool_choice"]["name"], "verdict");
        assert!(body.get("system").is_none());
    }

    #[test]
    fn a_429_says_which_limit_it_is_by_its_headers_else_its_message() {
        let openai =
            "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000";
        assert_eq!(Exhausted::from_message(openai), Exhausted::Tokens);
        assert_eq!(
            Exhausted::from_message("Rate limit reached for requests"),
            Exhausted::Requests
        );
        assert_eq!(
            Exhausted::from_message("Too Many Requests; tokens exhausted"),
            Exhausted::Unknown
        );
        assert_eq!(Exhausted::from_message("slow down"), Exhausted::Unknown);
        let empty = Allowance {
            limit: 10.0,
            remaining: 0.0,
            reset: Duration::from_secs(1),
        };
        let requests_empty = Announced {
            requests: Some(empty),
            tokens: Some(Allowance {
                remaining: 5.0,
                ..empty
            }),
        };
        for provider in PROVIDERS {
            // The headers win over the message.
            assert_eq!(provider.exhausted(&requests_empty, openai), Exhausted::Requests);
            assert_eq!(
                provider.exhausted(&Announced::default(), openai),
                Exhausted::Tokens
            );
        }
    }

    #[test]
    fn a_status_is_classed_and_an_account_out_of_credit_is_no_rate_limit() {
        let quota = r#"{"error": {"message": "You exceeded your current quota, please check your plan and billing details.", "type": "insufficient_quota", "code": "insufficient_quota"}}"#;
        let busy = r#"{"error": {"message": "Rate limit reached for requests", "type": "requests"}}"#;
        for provider in PROVIDERS {
            assert_eq!(provider.class(200, ""), Class::Answered);
            assert_eq!(provider.class(429, busy), Class::RateLimited);
            assert_eq!(provider.class(429, "not json"), Class::RateLimited);
            assert_eq!(provider.class(503, ""), Class::Transient);
            assert_eq!(provider.class(401, ""), Class::Rejected);
            assert_eq!(provider.class(400, ""), Class::Refused);
        }
        assert_eq!(tests::OPENAI_CHAT.provider().class(429, quota), Class::Rejected);
        // Anthropic has no such 429: its word for it is a 400 or a 403.
        assert_eq!(
            tests::ANTHROPIC_MESSAGES.provider().class(429, quota),
            Class::RateLimited
        );
    }

    #[test]
    fn a_request_is_signed_by_its_provider() {
        let body = json!({"model": "m"});
        let mut openai = tests::OPENAI_CHAT.provider().request("http://h/v1", "m", &body);
        tests::OPENAI_CHAT.provider().sign(&mut openai, Some("k"));
        assert_eq!(openai.url, "http://h/v1/chat/completions");
        assert_eq!(openai.headers, [("authorization", "Bearer k".to_owned())]);
        let mut anthropic = tests::ANTHROPIC_MESSAGES
            .provider()
            .request("http://h", "m", &body);
        tests::ANTHROPIC_MESSAGES.provider().sign(&mut anthropic, None);
        assert_eq!(anthropic.url, "http://h/v1/messages");
        assert_eq!(
            anthropic.headers,
            [("anthropic-version", "2023-06-01".to_owned())],
            "no key, no key header"
        );
        let (content_type, bytes) = anthropic.body.unwrap();
        assert_eq!(content_type, "application/json");
        assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), body);
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

    #[test]
    fn an_api_is_named_as_in_a_manifest_and_an_unknown_one_lists_the_known() {
        for provider in PROVIDERS {
            let api = Api::named(provider.name()).unwrap();
            assert_eq!(api.as_str(), provider.name());
            let text = serde_json::to_string(&api).unwrap();
            assert_eq!(serde_json::from_str::<Api>(&text).unwrap(), api);
        }
        let unknown = Api::named("gemini").unwrap_err();
        assert!(
            unknown.contains("`openai-chat` or `anthropic-messages`"),
            "{unknown}"
        );
    }

    #[test]
    fn announced_limits_are_read_in_each_providers_headers() {
        let headers = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        let openai = headers(&[
            ("x-ratelimit-limit-requests", "1200"),
            ("x-ratelimit-remaining-requests", "1199"),
            ("x-ratelimit-reset-requests", "50ms"),
            ("x-ratelimit-limit-tokens", "NaN"),
        ]);
        let announced = tests::OPENAI_CHAT.provider().announced(&openai);
        assert_eq!(
            announced.requests,
            Some(Allowance {
                limit: 1200.0,
                remaining: 1199.0,
                reset: Duration::from_millis(50)
            })
        );
        assert_eq!(announced.tokens, None, "a limit that is not a number is none");
        // Each provider reads its own headers only.
        assert_eq!(
            tests::ANTHROPIC_MESSAGES.provider().announced(&openai),
            Announced::default()
        );
        let anthropic = headers(&[
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "0"),
            ("anthropic-ratelimit-input-tokens-reset", "2000-01-01T00:00:00Z"),
        ]);
        let announced = tests::ANTHROPIC_MESSAGES.provider().announced(&anthropic);
        assert_eq!(
            announced.tokens.map(|a| (a.remaining, a.reset)),
            Some((0.0, Duration::ZERO))
        );
    }

    fn batch<'a>(requests: &'a [(&'a str, Value)]) -> NewBatch<'a> {
        NewBatch {
            requests: requests.iter().map(|(k, v)| (*k, v)).collect(),
            local: "20261202T000000Z-abcd1234",
            submission: "0123456789abcdef0123456789abcdef",
            window: "24h",
        }
    }

    #[test]
    fn an_openai_batch_is_a_file_then_a_batch_and_its_results_are_read_back() {
        let batches = tests::OPENAI_CHAT.provider().batches();
        let requests = [("k1", json!({"model": "m"})), ("k2", json!({"model": "m"}))];
        let new = batch(&requests);
        let upload = batches.upload("http://h/v1", &new).expect("a file first");
        assert_eq!(upload.url, "http://h/v1/files");
        let (content_type, form) = upload.body.unwrap();
        assert!(content_type.starts_with("multipart/form-data; boundary=gacc-0123456789abcdef"));
        let form = String::from_utf8(form).unwrap();
        assert!(
            form.contains(
                r#"{"body":{"model":"m"},"custom_id":"k1","method":"POST","url":"/v1/chat/completions"}"#
            ),
            "{form}"
        );
        assert!(
            batches.create("http://h/v1", &new, Some(&json!({}))).is_err(),
            "no file id"
        );
        let create = batches
            .create(
                "http://h/v1",
                &new,
                Some(&json!({"id": "file-1", "object": "file"})),
            )
            .unwrap();
        let body: Value = serde_json::from_slice(&create.body.unwrap().1).unwrap();
        assert_eq!(body["input_file_id"], "file-1");
        assert_eq!(body["metadata"]["gacc_submission"], new.submission);
        // A batch's state as the API returns it, running and then ended.
        let running = json!({"id": "batch_1", "status": "in_progress", "output_file_id": null});
        assert_eq!(batches.ended("http://h/v1", "batch_1", &running), None);
        let done = json!({"id": "batch_1", "status": "completed", "output_file_id": "file-2", "error_file_id": "file-3"});
        assert_eq!(
            batches.ended("http://h/v1", "batch_1", &done),
            Some(BatchEnd {
                status: "completed".into(),
                results: vec![
                    "http://h/v1/files/file-2/content".into(),
                    "http://h/v1/files/file-3/content".into()
                ],
            })
        );
        let lines = batches.result_lines(concat!(
            r#"{"id": "r1", "custom_id": "k1", "response": {"status_code": 200, "body": {"choices": []}}, "error": null}"#, "\n",
            r#"{"id": "r2", "custom_id": "k2", "response": {"status_code": 429, "body": {"error": {"message": "slow down"}}}, "error": null}"#, "\n",
            "not json\n"
        ));
        assert_eq!(lines.len(), 2);
        assert_eq!(
            batches.result(&lines["k1"]),
            ("succeeded", Some(Ok(json!({"choices": []}))))
        );
        assert_eq!(
            batches.result(&lines["k2"]),
            ("errored", Some(Err(("429: slow down".into(), true))))
        );
        let lost = Lost {
            submission: new.submission,
            requests: 2,
            created: "2026-12-02T00:00:00Z",
        };
        assert!(batches.is_lost(
            &json!({"id": "b", "metadata": {"gacc_submission": new.submission}}),
            &lost
        ));
        assert!(!batches.is_lost(&json!({"id": "b", "metadata": {}}), &lost));
        assert_eq!(
            batches.cancel_url("http://h/v1", "b"),
            "http://h/v1/batches/b/cancel"
        );
    }

    #[test]
    fn an_anthropic_batch_is_one_request_and_its_results_are_read_back() {
        let batches = tests::ANTHROPIC_MESSAGES.provider().batches();
        let requests = [("k1", json!({"model": "m"}))];
        let new = batch(&requests);
        assert!(batches.upload("http://h", &new).is_none());
        let create = batches.create("http://h", &new, None).unwrap();
        assert_eq!(create.url, "http://h/v1/messages/batches");
        let body: Value = serde_json::from_slice(&create.body.unwrap().1).unwrap();
        assert_eq!(
            body,
            json!({"requests": [{"custom_id": "k1", "params": {"model": "m"}}]})
        );
        let running = json!({"id": "msgbatch_1", "processing_status": "in_progress"});
        assert_eq!(batches.ended("http://h", "msgbatch_1", &running), None);
        let ended =
            json!({"id": "msgbatch_1", "processing_status": "ended", "results_url": "http://h/results/1"});
        assert_eq!(
            batches.ended("http://h", "msgbatch_1", &ended).unwrap().results,
            ["http://h/results/1"]
        );
        let no_url = json!({"processing_status": "ended"});
        assert_eq!(
            batches.ended("http://h", "msgbatch_1", &no_url).unwrap().results,
            ["http://h/v1/messages/batches/msgbatch_1/results"]
        );
        let line = |result: Value| json!({"custom_id": "k1", "result": result});
        let message = json!({"content": [{"type": "text", "text": "a"}]});
        assert_eq!(
            batches.result(&line(json!({"type": "succeeded", "message": message}))),
            ("succeeded", Some(Ok(message)))
        );
        let overloaded = json!({"type": "errored", "error": {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}});
        assert_eq!(
            batches.result(&line(overloaded)),
            ("errored", Some(Err(("busy".into(), true))))
        );
        let invalid =
            json!({"type": "errored", "error": {"type": "invalid_request_error", "message": "bad"}});
        assert_eq!(
            batches.result(&line(invalid)),
            ("errored", Some(Err(("bad".into(), false))))
        );
        assert_eq!(
            batches.result(&line(json!({"type": "expired"}))),
            ("expired", None)
        );
        assert_eq!(
            batches.result(&line(json!({"type": "canceled"}))),
            ("canceled", None)
        );
        let lost = Lost {
            submission: "s",
            requests: 3,
            created: "2026-12-02T00:00:00Z",
        };
        let listed = |total: u64, at: &str| json!({"id": "b", "created_at": at, "request_counts": {"processing": total, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}});
        assert!(batches.is_lost(&listed(3, "2026-12-02T00:00:05Z"), &lost));
        assert!(
            !batches.is_lost(&listed(2, "2026-12-02T00:00:05Z"), &lost),
            "another size"
        );
        assert!(
            !batches.is_lost(&listed(3, "2026-12-01T23:59:00Z"), &lost),
            "made before it"
        );
        assert!(!batches.is_lost(&json!({"id": "b"}), &lost));
    }
}
