//! A build's calls (SPEC §16): each answered from the cache, else made once (a lease keeps two
//! gacc processes on one cache from paying twice) and kept at once; counted and priced per
//! role. In a dry run no call is made: what the cache lacks is counted, and priced at most.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::{Map, Value};
use tokio::sync::Semaphore;

use crate::exec::callback::{Callback, Failure, FailureKind, call_once};
use crate::exec::model::ModelLauncher;
use crate::parallel::Locked;
use crate::protocol::Role;
use crate::protocol::messages::{self, Request};
use crate::store::cache::Cache;

/// The calls of one role.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Counted {
    /// Made by this build.
    pub made: usize,
    /// Answered by the cache.
    pub cached: usize,
    /// Not in the cache, so not made (a dry run), or needed once the calls before are made.
    pub wanted: usize,
    /// What the calls the dataset rests on cost, cached or not (their responses' `usage`).
    pub usd: f64,
    /// What this build paid.
    pub paid_usd: f64,
    /// At most what the wanted calls would cost, where the callback is a priced model.
    pub most_usd: f64,
}

/// What made a build stop before its calls were all made.
#[derive(Debug, Clone)]
pub(super) enum Stopped {
    CostCap(f64),
    Refused(String),
    LostWrite(String),
}

/// The build's calls: the cache, the concurrency shared by its callbacks, and the counts.
pub(super) struct Calls {
    cache: Option<Cache>,
    dry: bool,
    limit: Semaphore,
    counted: Mutex<BTreeMap<Role, Counted>>,
    stopped: AtomicBool,
    why: Mutex<Option<Stopped>>,
    /// A model callback's launcher by its name, to price what a dry run would send.
    pricing: BTreeMap<String, Arc<ModelLauncher>>,
}

impl Calls {
    pub(super) fn new(
        cache: Option<Cache>,
        dry: bool,
        concurrency: usize,
        pricing: BTreeMap<String, Arc<ModelLauncher>>,
    ) -> Calls {
        Calls {
            cache,
            dry,
            limit: Semaphore::new(concurrency.max(1)),
            counted: Mutex::new(BTreeMap::new()),
            stopped: AtomicBool::new(false),
            why: Mutex::new(None),
            pricing,
        }
    }

    pub(super) fn is_dry(&self) -> bool {
        self.dry
    }

    /// Every role's counts.
    pub(super) fn counted(&self) -> BTreeMap<Role, Counted> {
        self.counted.locked().clone()
    }

    /// Why the build stopped early, if it did.
    pub(super) fn stopped(&self) -> Option<Stopped> {
        self.why.locked().clone()
    }

    fn stop(&self, why: Stopped) {
        self.why.locked().get_or_insert(why);
        self.stopped.store(true, Ordering::Relaxed);
    }

    /// A call needed once the calls before it are made (a dry run cannot know its request).
    pub(super) fn wanted(&self, callback: &Callback, request: Option<&[u8]>) {
        let most = request.map_or(0.0, |bytes| self.most_usd(callback, bytes));
        let mut counted = self.counted.locked();
        let counted = counted.entry(callback.role).or_default();
        counted.wanted += 1;
        counted.most_usd += most;
    }

    /// The most a call of `callback` with this request can cost, at its endpoint's price.
    fn most_usd(&self, callback: &Callback, bytes: &[u8]) -> f64 {
        let Some(launcher) = self.pricing.get(&callback.name) else {
            return 0.0;
        };
        let value: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
        let Ok(request) = Request::read(callback.role, &value) else {
            return 0.0;
        };
        let empty = Map::new();
        let params = callback.params.as_object().unwrap_or(&empty);
        launcher
            .prompt(&request, params)
            .map_or(0.0, |prompt| launcher.most_cost(launcher.most_tokens(&prompt)))
    }

    /// The call's response: from the cache, else made and kept. None in a dry run where the
    /// cache lacks it (counted as wanted, with its most cost).
    pub(super) async fn call(
        &self,
        callback: &Callback,
        key: &str,
        description: &Value,
        request: &[u8],
    ) -> Result<Option<Value>, Failure> {
        let kind = callback.role.into();
        if let Some(found) = self.cache.as_ref().and_then(|cache| cache.get(kind, key)) {
            self.count(callback.role, |c| c.cached += 1, &found, false);
            return Ok(Some(found));
        }
        if self.dry {
            self.wanted(callback, Some(request));
            return Ok(None);
        }
        let Some(cache) = &self.cache else {
            return Err(failure(FailureKind::Cancelled));
        };
        if self.stopped.load(Ordering::Relaxed) {
            return Err(failure(FailureKind::Cancelled));
        }
        let made = call_once(
            callback,
            cache,
            key,
            || description.clone(),
            || request.to_vec(),
            &self.limit,
        );
        let made = match made.await {
            Ok(made) => made,
            Err(failure) => {
                match &failure.kind {
                    FailureKind::CostCap { cap } => self.stop(Stopped::CostCap(*cap)),
                    FailureKind::Rejected { .. } => self.stop(Stopped::Refused(failure.kind.to_string())),
                    _ => {}
                }
                return Err(failure);
            }
        };
        let response = made.response;
        if made.cached {
            self.count(callback.role, |c| c.cached += 1, &response, false);
            return Ok(Some(response));
        }
        if let Some(what) = made.lost_write {
            self.stop(Stopped::LostWrite(what.clone()));
            return Err(failure(FailureKind::Submit(what)));
        }
        self.count(callback.role, |c| c.made += 1, &response, true);
        Ok(Some(response))
    }

    fn count(&self, role: Role, update: impl FnOnce(&mut Counted), response: &Value, paid: bool) {
        let usd = response
            .get("usage")
            .and_then(messages::read::<messages::ReportedUsage>)
            .map_or(0.0, |usage| usage.cost_usd);
        let mut counted = self.counted.locked();
        let counted = counted.entry(role).or_default();
        update(counted);
        counted.usd += usd;
        if paid {
            counted.paid_usd += usd;
        }
    }
}

fn failure(kind: FailureKind) -> Failure {
    Failure {
        kind,
        stderr_tail: String::new(),
        attempts: 0,
    }
}
