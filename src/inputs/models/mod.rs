//! Model endpoints and the model built-ins (SPEC §8): `[models.NAME]`, and for each
//! `llm-compressor`, `llm-reader`, `llm-judge` and `llm-writer` the endpoint it names and the text of its
//! templates (the built-in defaults in `templates/prompts/`, or the manifest's files).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::protocol::{Role, Timeout};

mod batch;
pub(crate) mod seed;
pub(crate) use batch::{Batch, BatchSpec};
use seed::seed_problem;
pub(crate) use seed::{KeySeed, SeedRule};

/// The model built-ins, their roles, and the behaviour version bound into their keys.
pub(crate) const MODEL_BUILTINS: &[(&str, Role, &str)] = &[
    ("llm-compressor", Role::Compressor, "1"),
    ("llm-reader", Role::Reader, "1"),
    ("llm-judge", Role::Judge, "1"),
    ("llm-writer", Role::Writer, "1"),
];

/// What `gacc callback` lists for each model built-in.
pub(crate) const MODEL_BUILTIN_HELP: &[(&str, &str)] = &[
    (
        "llm-compressor",
        "a prompted model (params.model names a [models.*] endpoint), told its budget",
    ),
    (
        "llm-reader",
        "a prompted model answering from the memory, the memory first in the prompt",
    ),
    (
        "llm-judge",
        "a prompted model's verdict: structured output, else a last GRADE: C/I line",
    ),
    (
        "llm-writer",
        "a prompted model writing a dataset's goals and questions as JSON (gacc dataset build)",
    ),
];

/// The role of a model built-in, if `name` is one.
pub(crate) fn model_builtin(name: &str) -> Option<Role> {
    MODEL_BUILTINS
        .iter()
        .find(|(n, ..)| *n == name)
        .map(|(_, role, _)| *role)
}

/// The default templates: (user, system) per role.
pub(crate) fn default_templates(role: Role) -> (&'static str, &'static str) {
    match role {
        Role::Compressor => (
            include_str!("../../../templates/prompts/compressor.j2"),
            include_str!("../../../templates/prompts/compressor.system.j2"),
        ),
        Role::Reader => (
            include_str!("../../../templates/prompts/reader.j2"),
            include_str!("../../../templates/prompts/reader.system.j2"),
        ),
        Role::Judge => (
            include_str!("../../../templates/prompts/judge.j2"),
            include_str!("../../../templates/prompts/judge.system.j2"),
        ),
        Role::Writer => (
            include_str!("../../../templates/prompts/writer.j2"),
            include_str!("../../../templates/prompts/writer.system.j2"),
        ),
    }
}

use crate::protocol::messages;
pub(crate) use crate::providers::Api;
use crate::providers::Tokens;

/// USD per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Price {
    #[serde(default)]
    pub input: f64,
    /// Input tokens the provider's prompt cache answered (default: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Input tokens written to the provider's prompt cache (Anthropic; default 1.25 × input).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    #[serde(default)]
    pub output: f64,
    /// Input through the batch API (default: half of `input`; cached and cache-write input
    /// are halved too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_input: Option<f64>,
    /// Output through the batch API (default: half of `output`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_output: Option<f64>,
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

impl Price {
    /// The prices of a call made through the batch API.
    pub(crate) fn for_batch(&self) -> Price {
        let input = self.batch_input.unwrap_or(self.input / 2.0);
        let ratio = if self.input > 0.0 { input / self.input } else { 0.5 };
        Price {
            input,
            cached_input: Some(self.cached_input.unwrap_or(self.input) * ratio),
            cache_write: Some(self.cache_write.unwrap_or(self.input * 1.25) * ratio),
            output: self.batch_output.unwrap_or(self.output / 2.0),
            batch_input: None,
            batch_output: None,
        }
    }
}

/// `[models.NAME]`: one endpoint, shared by every callback that names it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelSpec {
    pub api: Api,
    pub base_url: String,
    /// Sent as the request's `model`.
    pub model: String,
    /// The environment variable holding the key (none for a local server); its value is
    /// never written anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// More request headers (not secrets: they are written in the resolved manifest).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// The ceiling of calls in flight; the live limit adapts below it.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    /// Requests per minute (0: no pacing).
    #[serde(default)]
    pub rpm: u32,
    /// Tokens per minute, estimated with cl100k_base (0: no pacing).
    #[serde(default)]
    pub tpm: u64,
    #[serde(default = "default_model_timeout")]
    pub timeout: Timeout,
    /// Retries of 429, 408, 5xx, timeouts and connection errors.
    #[serde(default = "default_model_retries")]
    pub retries: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub price: Option<Price>,
    /// Adapt the live limit to the provider's rate limits (false: always `max_concurrency`).
    #[serde(default = "yes", skip_serializing_if = "Clone::clone")]
    pub adaptive: bool,
    /// The provider's batch API (SPEC §9): `true`, or a table of its limits.
    #[serde(default, skip_serializing_if = "Batch::is_off")]
    pub batch: Batch,
}

fn yes() -> bool {
    true
}

/// The default ceiling on an endpoint's calls in flight: above the 256 sequences vLLM batches
/// by default (and the 1,024 some of its configurations do), and what a hosted API's pace ×
/// latency needs for most tiers (10,000 requests a minute at 6 s a reply); the live limit is
/// found below it.
pub(crate) const DEFAULT_MAX_CONCURRENCY: usize = 1024;

fn default_max_concurrency() -> usize {
    DEFAULT_MAX_CONCURRENCY
}

fn default_model_timeout() -> Timeout {
    Timeout(std::time::Duration::from_secs(120))
}

fn default_model_retries() -> u32 {
    6
}

impl ModelSpec {
    /// The price a call is billed at: the batch price for a batch endpoint.
    pub(crate) fn billed_price(&self) -> Option<Price> {
        match (self.price, self.batch.spec()) {
            (Some(price), Some(_)) => Some(price.for_batch()),
            (price, None) => price,
            (None, Some(_)) => None,
        }
    }

    /// What of an endpoint determines its answers (SPEC §8): the rest is operational.
    pub(crate) fn identity(&self) -> Value {
        json!({"api": self.api.as_str(), "base_url": self.base_url, "model": self.model})
    }

    /// This endpoint with its operational settings at their defaults, for the experiment's
    /// identity (the same experiment with another concurrency or price is the same experiment).
    pub(crate) fn without_operations(&self) -> ModelSpec {
        ModelSpec {
            api: self.api,
            base_url: self.base_url.clone(),
            model: self.model.clone(),
            api_key_env: None,
            headers: BTreeMap::new(),
            max_concurrency: default_max_concurrency(),
            rpm: 0,
            tpm: 0,
            timeout: default_model_timeout(),
            retries: default_model_retries(),
            price: None,
            adaptive: true,
            batch: Batch::default(),
        }
    }
}

/// A model built-in as the manifest resolves it: its endpoint and the text of its templates.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelCall {
    pub builtin: &'static str,
    pub role: Role,
    pub revision: &'static str,
    /// The `[models.*]` key of its endpoint.
    pub endpoint: String,
    pub spec: ModelSpec,
    pub template: String,
    pub system_template: String,
    /// A template reads `seed`: the seed is in the prompt, so every seed is its own request.
    pub reads_seed: bool,
}

impl ModelCall {
    /// Its part of the callback's identity (SPEC §8): the endpoint's api, base_url and model,
    /// and the templates' text.
    pub(crate) fn identity(&self) -> Value {
        json!({
            "endpoint": self.spec.identity(),
            "template": self.template,
            "system_template": self.system_template,
        })
    }
}

/// What is wrong with the params gacc itself reads (the rest go into the request body as
/// they are): `max_tokens` and a judge's `structured`.
fn params_problems(params: &Value, builtin: &str, role: Role) -> Vec<String> {
    let mut problems = Vec::new();
    match params.get("max_tokens") {
        Some(value) if value.as_u64().is_none_or(|n| n < 1) => {
            problems.push(format!(
                "`params.max_tokens` must be a whole number ≥ 1, got {value}"
            ));
        }
        _ => {}
    }
    match params.get("structured") {
        Some(value) if role != Role::Judge => {
            problems.push(format!(
                "`params.structured` is for a judge's verdict; `{builtin}` is a {role} (got {value})"
            ));
        }
        Some(value) if !value.is_boolean() => {
            problems.push(format!("`params.structured` must be true or false, got {value}"));
        }
        _ => {}
    }
    problems
}

/// Resolves a model built-in's endpoint and templates, or says what is wrong.
pub(crate) fn resolve(
    builtin: &str,
    params: &Value,
    template: Option<&Path>,
    system_template: Option<&Path>,
    models: &BTreeMap<String, ModelSpec>,
    folder: &Path,
    recorded: Option<&BTreeMap<String, String>>,
) -> Result<Arc<ModelCall>, Vec<String>> {
    let Some(&(builtin, role, revision)) = MODEL_BUILTINS.iter().find(|(n, ..)| *n == builtin) else {
        return Err(vec![format!("`{builtin}` is not a model built-in")]);
    };
    let mut problems = Vec::new();
    let endpoint = match params.get("model") {
        Some(Value::String(name)) => Some(name.clone()),
        Some(_) => {
            problems.push("`params.model` must be the name of a [models.*] table".into());
            None
        }
        None => {
            problems.push(format!(
                "`{builtin}` needs `params.model`, the name of a [models.*] table{}",
                known(models)
            ));
            None
        }
    };
    let spec = endpoint.as_ref().and_then(|name| match models.get(name) {
        Some(spec) => Some(spec.clone()),
        None => {
            problems.push(format!(
                "`params.model` names `{name}`, which is no [models.*] table{}",
                known(models)
            ));
            None
        }
    });
    problems.extend(params_problems(params, builtin, role));
    let (default_user, default_system) = default_templates(role);
    // A replay takes the texts its run recorded (the files need not be where it runs).
    let recorded = |path: &Path| recorded?.get(&path.to_string_lossy().into_owned()).cloned();
    let mut read = |path: Option<&Path>, default: &str, key: &str| match path {
        None => default.to_owned(),
        Some(path) => match recorded(path).map_or_else(|| std::fs::read_to_string(folder.join(path)), Ok) {
            Ok(text) => {
                if let Err(error) = check_template(&text, role) {
                    problems.push(format!("`{key}` {}: {error}", path.display()));
                }
                text
            }
            Err(error) => {
                problems.push(format!(
                    "`{key}` {} cannot be read ({error}; paths are relative to the manifest's folder)",
                    path.display()
                ));
                String::new()
            }
        },
    };
    let template = read(template, default_user, "template");
    let system_template = read(system_template, default_system, "system_template");
    if let Some(problem) = spec
        .as_ref()
        .and_then(|spec| seed_problem(spec.api, params.get("seed")))
    {
        problems.push(problem);
    }
    let reads_seed = [&template, &system_template]
        .iter()
        .any(|text| reads_variable(text, "seed"));
    match (endpoint, spec, problems.is_empty()) {
        (Some(endpoint), Some(spec), true) => Ok(Arc::new(ModelCall {
            builtin,
            role,
            revision,
            endpoint,
            spec,
            template,
            system_template,
            reads_seed,
        })),
        _ => Err(problems),
    }
}

fn known(models: &BTreeMap<String, ModelSpec>) -> String {
    if models.is_empty() {
        " (the manifest has none)".into()
    } else {
        format!(
            " (the manifest has {})",
            models.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    }
}

/// The variables a role's template may use: its request's fields (SPEC §3) but for `protocol`
/// and `role`, nothing else of the experiment (and, for the judge, the fence derived from the
/// answer).
pub(crate) fn template_variables(role: Role) -> Vec<&'static str> {
    let mut variables: Vec<&'static str> = messages::request_fields(role)
        .iter()
        .copied()
        .filter(|field| !matches!(*field, "protocol" | "role"))
        .collect();
    if role == Role::Judge {
        variables.push("answer_fence");
    }
    variables
}

/// Whether a template (one that parses) reads the variable `name`.
fn reads_variable(text: &str, name: &str) -> bool {
    let environment = minijinja::Environment::new();
    environment
        .template_from_str(text)
        .is_ok_and(|template| template.undeclared_variables(false).contains(name))
}

/// A template must parse, and use only its role's variables.
fn check_template(text: &str, role: Role) -> Result<(), String> {
    let mut environment = minijinja::Environment::new();
    environment.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    let template = environment
        .template_from_str(text)
        .map_err(|error| format!("is not a valid template: {error}"))?;
    let allowed = template_variables(role);
    let unknown: Vec<String> = template
        .undeclared_variables(false)
        .into_iter()
        .filter(|name| !allowed.contains(&name.as_str()))
        .collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "uses {}, which a {role} template is not given (it has {})",
            unknown.join(", "),
            allowed.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(api: Api, template: Option<&str>) -> Arc<ModelCall> {
        let folder = tempfile::tempdir().unwrap();
        if let Some(text) = template {
            std::fs::write(folder.path().join("t.j2"), text).unwrap();
        }
        let spec: ModelSpec = toml::from_str(&format!(
            "api = \"{}\"\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"",
            api.as_str()
        ))
        .unwrap();
        let models = BTreeMap::from([("m".to_owned(), spec)]);
        let template = template.map(|_| Path::new("t.j2"));
        resolve(
            "llm-reader",
            &json!({"model": "m"}),
            template,
            None,
            &models,
            folder.path(),
            None,
        )
        .unwrap()
    }

    /// (sent for run seed 7, per seed) of a reader with `params`.
    fn rule(api: Api, template: Option<&str>, params: Value) -> (Option<u64>, bool) {
        let rule = SeedRule::of(Some(&call(api, template)), &params);
        let SeedRule::Model { per_seed, .. } = rule else {
            panic!("a model call has a model rule");
        };
        (rule.sent(7), per_seed)
    }

    #[test]
    fn the_seed_reaches_the_model_only_where_it_should() {
        let (open_ai, anthropic) = (
            crate::providers::tests::OPENAI_CHAT,
            crate::providers::tests::ANTHROPIC_MESSAGES,
        );
        let greedy = json!({"model": "m", "temperature": 0});
        let sampled = json!({"model": "m", "temperature": 0.7});
        let default = json!({"model": "m"});
        // Greedy: no seed, and seeds share.
        assert_eq!(rule(open_ai, None, greedy.clone()), (None, false));
        assert_eq!(rule(anthropic, None, greedy.clone()), (None, false));
        // Sampling (temperature above 0 or absent) on OpenAI's format sends the run's seed.
        assert_eq!(rule(open_ai, None, sampled.clone()), (Some(7), false));
        assert_eq!(rule(open_ai, None, default), (Some(7), false));
        // Anthropic takes no seed: each seed its own call.
        assert_eq!(rule(anthropic, None, sampled.clone()), (None, true));
        // params.seed overrides.
        let with = |seed: Value| {
            let mut params = sampled.clone();
            params["seed"] = seed;
            params
        };
        assert_eq!(rule(open_ai, None, with(json!(false))), (None, true));
        assert_eq!(rule(open_ai, None, with(json!(true))), (Some(7), false));
        assert_eq!(rule(open_ai, None, with(json!(5))), (Some(5), false));
        let mut forced = greedy.clone();
        forced["seed"] = json!(true);
        assert_eq!(rule(open_ai, None, forced), (Some(7), false));
        // A template that reads the seed puts it in the prompt.
        let reads = "{{ memory }} {{ question }} {{ seed }}";
        assert_eq!(rule(open_ai, Some(reads), greedy), (None, true));
        // A program's keys are what they always were.
        assert_eq!(SeedRule::of(None, &sampled).key_term(7).to_string(), "7");
        let rule = SeedRule::of(Some(&call(open_ai, None)), &sampled);
        assert_eq!(rule.key_term(7).to_string(), r#"{"per_seed":null,"sent":7}"#);
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
    fn a_seed_an_api_cannot_take_is_refused() {
        assert!(seed_problem(crate::providers::tests::ANTHROPIC_MESSAGES, Some(&json!(3))).is_some());
        assert!(seed_problem(crate::providers::tests::ANTHROPIC_MESSAGES, Some(&json!(true))).is_some());
        assert!(seed_problem(crate::providers::tests::ANTHROPIC_MESSAGES, Some(&json!(false))).is_none());
        assert!(seed_problem(crate::providers::tests::OPENAI_CHAT, Some(&json!(-1))).is_some());
        assert!(seed_problem(crate::providers::tests::OPENAI_CHAT, Some(&json!("7"))).is_some());
        assert!(seed_problem(crate::providers::tests::OPENAI_CHAT, Some(&json!(7))).is_none());
        assert!(seed_problem(crate::providers::tests::OPENAI_CHAT, None).is_none());
    }
}
