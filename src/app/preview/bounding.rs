//! `gacc plan` as a dry run of the runner: every callback is a `Bounding` launcher, which
//! answers at once with a text not known yet (`plan::unknown`) and, for a model built-in, adds
//! the call's upper bounds (tokens, cost) to a `Book` instead of calling. The runner walks the
//! plan through a read-only cache as a run would; what it finds there is counted as cached, and
//! what it would call is bounded once per distinct call.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;

use super::{CallBounds, UsdPerMillion};
use crate::app::prepare::{Keys, Prepared, models};
use crate::error::Error;
use crate::exec::callback::{Attempt, AttemptFuture, Callback, Launcher};
use crate::exec::model::{ModelLauncher, estimate_upper};
use crate::inputs::tokenizer::{Cl100k, Tokenizer};
use crate::parallel::Locked;
use crate::plan::unknown;
use crate::protocol::Role;
use crate::protocol::messages::Request;
use crate::runner::Callbacks;

/// Calls in flight at once per callback: a bounding call waits on nothing.
const IN_FLIGHT: usize = 64;

/// One model call's upper bounds, in tokens.
#[derive(Debug, Clone, Copy)]
struct Bounded {
    input_tokens: u64,
    output_tokens: u64,
}

/// The model calls a dry run would make, once per distinct call (role and cache key), and the
/// launcher that prices each endpoint's.
#[derive(Debug, Default)]
pub(super) struct Book {
    calls: Mutex<BTreeMap<(Role, String), (String, Bounded)>>,
    pricing: Mutex<BTreeMap<String, Arc<ModelLauncher>>>,
}

impl Book {
    /// Per endpoint, the bounds of its calls. The price is linear in tokens, so the cost is
    /// that of the summed tokens: the same figure however the run's tasks interleaved.
    pub(super) fn bounds(&self) -> BTreeMap<String, CallBounds> {
        let mut bounds: BTreeMap<String, CallBounds> = BTreeMap::new();
        for (endpoint, call) in self.calls.locked().values() {
            let bound = bounds.entry(endpoint.clone()).or_default();
            bound.calls += 1;
            bound.input_tokens += call.input_tokens;
            bound.output_tokens += call.output_tokens;
        }
        let pricing = self.pricing.locked();
        for (endpoint, bound) in &mut bounds {
            let Some(launcher) = pricing.get(endpoint) else {
                continue;
            };
            if launcher.endpoint.spec.price.is_some() {
                bound.cost_usd = Some(launcher.most_cost((bound.input_tokens, bound.output_tokens)));
                bound.usd_per_million = launcher
                    .bound_prices()
                    .map(|(input, output)| UsdPerMillion { input, output });
            }
        }
        bounds
    }
}

/// A callback's launcher in a dry run: no call, an unknown answer, and a model call's bounds.
struct Bounding {
    /// The model built-in it stands for, which renders and bounds its prompts.
    model: Option<Arc<ModelLauncher>>,
    /// Whether some judge is a model built-in, whose bound depends on an answer's length.
    answers_are_bounded: bool,
    tokenizer: Arc<dyn Tokenizer>,
    book: Arc<Book>,
}

impl std::fmt::Debug for Bounding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bounding").field("model", &self.model).finish()
    }
}

impl Launcher for Bounding {
    fn attempt<'a>(&'a self, callback: &'a Callback, key: &'a str, request: &'a [u8]) -> AttemptFuture<'a> {
        let response = self.answer(callback, key, request);
        Box::pin(async move {
            Attempt {
                result: Ok(response),
                stderr_tail: String::new(),
                stderr_of_worker: false,
            }
        })
    }

    fn uses_local_cores(&self) -> bool {
        false
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    /// A request is read only where a bound depends on it: a model built-in's, once per
    /// distinct call, and a rule reader's when a judge is a model (its answer's length).
    fn reads_request(&self, callback: &Callback, key: &str) -> bool {
        match (&self.model, callback.role) {
            (Some(_), role) => self.booked(role, key).is_none(),
            (None, Role::Reader) => self.answers_are_bounded,
            (None, _) => false,
        }
    }
}

impl Bounding {
    /// The unknown answer to a request of `callback`'s role, its bounds booked on the way.
    fn answer(&self, callback: &Callback, key: &str, request: &[u8]) -> Value {
        let role = callback.role;
        if let Some((_, booked)) = self.booked(role, key) {
            return unknown_answer(role, booked.output_tokens, key);
        }
        if request.is_empty() {
            return unknown_answer(role, u64::MAX, key);
        }
        let value: Value = serde_json::from_slice(request).unwrap_or(Value::Null);
        let Ok(mut request) = Request::read(role, &value) else {
            return unknown_answer(role, 0, key);
        };
        // An unknown text it carries is bounded as that many tokens more than an empty one.
        let unknown_tokens = match &mut request {
            Request::Compressor(_) | Request::Writer(_) => 0,
            Request::Reader(read) => take_unknown(&mut read.memory),
            Request::Judge(judged) => take_unknown(&mut judged.answer),
        };
        let tokens = match (&self.model, &request) {
            (Some(model), _) => self.book_model_call(model, callback, key, &request, unknown_tokens),
            // A reader that is not a model: counted as answering with as long a text as its memory.
            (None, Request::Reader(read)) => {
                unknown_tokens + self.tokenizer.count(&read.memory).unwrap_or(0) as u64
            }
            (None, _) => 0,
        };
        unknown_answer(role, tokens, key)
    }

    /// A call booked already, with its endpoint and bounds.
    fn booked(&self, role: Role, key: &str) -> Option<(String, Bounded)> {
        self.book.calls.locked().get(&(role, key.to_owned())).cloned()
    }

    /// Books a model call's bounds, once per distinct call; the most tokens it answers with.
    fn book_model_call(
        &self,
        model: &Arc<ModelLauncher>,
        callback: &Callback,
        key: &str,
        request: &Request,
        unknown_tokens: u64,
    ) -> u64 {
        let empty = Map::new();
        let params = callback.params.as_object().unwrap_or(&empty);
        let Ok(prompt) = model.prompt(request, params) else {
            return 0;
        };
        let (input, output) = model.most_tokens(&prompt);
        let input = input + estimate_upper(unknown_tokens);
        let bounded = Bounded {
            input_tokens: input,
            output_tokens: output,
        };
        let endpoint = &model.endpoint.name;
        (self.book.pricing.locked())
            .entry(endpoint.clone())
            .or_insert_with(|| model.clone());
        let mut calls = self.book.calls.locked();
        calls
            .entry((callback.role, key.to_owned()))
            .or_insert_with(|| (endpoint.clone(), bounded));
        output
    }
}

/// The tokens of an unknown text in `field`, which is emptied; 0 for a known one.
fn take_unknown(field: &mut std::borrow::Cow<'_, str>) -> u64 {
    match unknown::tokens(field) {
        Some(tokens) => {
            *field = std::borrow::Cow::Borrowed("");
            tokens
        }
        None => 0,
    }
}

/// A response of `role` whose text is not known: a memory or an answer of at most `tokens`
/// tokens, made by the call `key` (a memory of any length: the runner caps it at its budget);
/// a judge's verdict, which no count depends on.
fn unknown_answer(role: Role, tokens: u64, key: &str) -> Value {
    match role {
        // Its budget, not its max_tokens (counted by another tokenizer), bounds a memory.
        Role::Compressor => json!({"memory": unknown::text(u64::MAX, key)}),
        Role::Reader => json!({"answer": unknown::text(tokens, key)}),
        Role::Judge => json!({"correct": false}),
        // No run calls a writer (SPEC §16).
        Role::Writer => json!({"goals": []}),
    }
}

/// Every callback of the manifest as a bounding launcher, booking into `book`.
pub(super) fn callbacks(prepared: &Prepared, book: &Arc<Book>) -> Result<Callbacks, Error> {
    let models = models(&prepared.loaded, Keys::Planning)?;
    let tokenizer: Arc<dyn Tokenizer> = Arc::new(Cl100k::new());
    let manifest = &prepared.loaded.manifest;
    let mut answers_are_bounded = false;
    manifest.callback_set().map(|_, role, spec| {
        answers_are_bounded |= role == Role::Judge && spec.model.is_some();
    });
    Ok(crate::runner::callbacks_of_manifest(
        manifest,
        |name, role, spec| {
            let model = spec.model.as_ref().and_then(|call| {
                let endpoint = models.endpoints.get(&call.endpoint)?.clone();
                ModelLauncher::new(endpoint, call.clone(), models.costs.clone(), tokenizer.clone())
                    .ok()
                    .map(Arc::new)
            });
            let launcher = Bounding {
                model,
                answers_are_bounded,
                tokenizer: tokenizer.clone(),
                book: book.clone(),
            };
            Callback {
                params: spec.params.clone(),
                identity: crate::plan::keys::callback_identity(spec),
                limit: Arc::new(Semaphore::new(IN_FLIGHT)),
                ..Callback::new(name, role, Arc::new(launcher))
            }
        },
    ))
}
