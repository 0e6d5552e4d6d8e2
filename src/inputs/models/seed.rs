//! How a model callback's calls carry the run's seed (SPEC §8, "Seeds and identical requests"):
//! what is sent, and what each call's cache key holds of it.

use serde_json::Value;

use super::{Api, ModelCall};

/// How a call's request and cache key carry the run's seed (SPEC §4, §8 "Seeds and identical
/// requests").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SeedRule {
    /// A program's request carries the seed, which it may use: every seed is its own call.
    EachSeed,
    /// A model call: the seed its body carries, and whether each run seed is still a call of
    /// its own (sampling with no seed sent, or a template that reads `seed`).
    Model { sent: SentSeed, per_seed: bool },
}

/// The `seed` a model request's body carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SentSeed {
    None,
    /// The run's seed.
    Run,
    /// `params.seed = N`.
    Fixed(u64),
}

impl SeedRule {
    /// The rule of a callback: a program's, or a model built-in's with these params.
    pub(crate) fn of(call: Option<&ModelCall>, params: &Value) -> SeedRule {
        let Some(call) = call else {
            return SeedRule::EachSeed;
        };
        // Sampling unless `temperature` is a number no greater than 0.
        let sampling = params
            .get("temperature")
            .and_then(Value::as_f64)
            .is_none_or(|t| t > 0.0);
        let asked = params.get("seed");
        let sent = match (call.spec.api.provider().takes_seed(), asked) {
            (false, _) => SentSeed::None,
            (true, Some(Value::Bool(false))) => SentSeed::None,
            (true, Some(Value::Bool(true))) => SentSeed::Run,
            (true, Some(value)) => value.as_u64().map_or(SentSeed::None, SentSeed::Fixed),
            (true, None) if sampling => SentSeed::Run,
            (true, None) => SentSeed::None,
        };
        SeedRule::Model {
            sent,
            per_seed: call.reads_seed || (sampling && sent == SentSeed::None),
        }
    }

    /// The seed the request body carries for run seed `seed`, if any.
    pub(crate) fn sent(&self, seed: u64) -> Option<u64> {
        match self {
            SeedRule::Model {
                sent: SentSeed::Run, ..
            } => Some(seed),
            SeedRule::Model {
                sent: SentSeed::Fixed(fixed),
                ..
            } => Some(*fixed),
            _ => None,
        }
    }

    /// The seed term of a cache key, as canonical JSON: the run seed for a program (the
    /// keys gacc has always made), else what the body sends and whether seeds stay apart.
    pub(crate) fn key_term(&self, seed: u64) -> KeySeed {
        KeySeed { rule: *self, seed }
    }
}

/// A cache key's seed term, written as canonical JSON.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeySeed {
    rule: SeedRule,
    seed: u64,
}

impl std::fmt::Display for KeySeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let or_null = |value: Option<u64>| value.map_or("null".to_owned(), |v| v.to_string());
        match self.rule {
            SeedRule::EachSeed => write!(f, "{}", self.seed),
            SeedRule::Model { per_seed, .. } => write!(
                f,
                r#"{{"per_seed":{},"sent":{}}}"#,
                or_null(per_seed.then_some(self.seed)),
                or_null(self.rule.sent(self.seed))
            ),
        }
    }
}

/// What is wrong with `params.seed`, if anything: `true`, `false` or a whole number, and none
/// on an API that takes no seed.
pub(super) fn seed_problem(api: Api, seed: Option<&Value>) -> Option<String> {
    match (api.provider().takes_seed(), seed?) {
        (_, Value::Bool(false)) => None,
        (false, _) => Some(format!(
            "`params.seed`: an {} endpoint takes no seed (each seed of a sampled call is made on its own; `seed = false` is the only value it allows)",
            api.as_str()
        )),
        (true, Value::Bool(true)) => None,
        (true, value) if value.is_u64() => None,
        (true, value) => Some(format!(
            "`params.seed` is {value}: expected true (send the run's seed), false (send none) or a whole number (send that one)"
        )),
    }
}
