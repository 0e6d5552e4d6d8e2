//! Provider batch APIs (SPEC §9): the calls of a `batch = true` endpoint are gathered, written
//! as one batch (OpenAI: a JSON Lines file uploaded to `/files`, then `/batches`; Anthropic:
//! `/v1/messages/batches`), polled, and answered from its results. Every batch is recorded in
//! `<cache>/batches/` before gacc waits on it, so a gacc killed at any moment re-attaches on
//! the next run and submits no request twice; results enter the cache (kind `batch`) as they
//! are fetched, keyed by the call's cache key, which is each request's `custom_id`.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::exec::callback::FailureKind;
use crate::inputs::models::BatchSpec;
use crate::parallel::Locked;
use crate::providers::Reply;
use crate::store::cache::{Cache, Kind};

use super::Endpoint;

mod api;
mod record;
pub(crate) use api::cancel;
use api::{create, find_lost, poll};
pub(crate) use record::{BatchState, Record, records};

/// Provider batches this gacc has open, for the message Ctrl-C prints.
static OPEN_BATCHES: AtomicUsize = AtomicUsize::new(0);

/// How many provider batches this process is waiting on.
pub(crate) fn open_batches() -> usize {
    OPEN_BATCHES.load(Ordering::Relaxed)
}

/// Tries of a refused or broken submission before its calls fail.
const SUBMIT_TRIES: u32 = 4;

/// How a batch answered one call: its reply or failure, or "submit it again" (it expired,
/// was cancelled, or met a retryable error), with why.
#[derive(Debug, Clone)]
pub(crate) enum Answer {
    Done(Result<Reply, FailureKind>),
    Again(String),
}

type Waiter = oneshot::Sender<Answer>;

struct Queued {
    key: String,
    body: Value,
    bytes: usize,
}

/// What the progress line shows of an endpoint's batches.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct BatchCounts {
    pub open: usize,
    pub open_requests: usize,
    pub done: usize,
}

#[derive(Default)]
struct State {
    queue: Vec<Queued>,
    /// Calls waiting for their answer, by cache key.
    waiters: HashMap<String, Vec<Waiter>>,
    /// Keys in a batch that is still open, with its local id.
    open: HashMap<String, String>,
    gathering: bool,
    counts: BatchCounts,
}

/// One endpoint's batches.
pub(crate) struct Batcher {
    spec: BatchSpec,
    folder: PathBuf,
    cache: Cache,
    state: Mutex<State>,
    /// Whether this run has taken up the batches an earlier run left open.
    reattached: std::sync::Once,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").field("folder", &self.folder).finish()
    }
}

/// A batch's end, as the provider reported it: each key's result line.
struct BatchResults {
    status: String,
    results: HashMap<String, Value>,
}

impl Batcher {
    pub(crate) fn new(spec: BatchSpec, folder: PathBuf, cache: Cache) -> Batcher {
        Batcher {
            spec,
            folder,
            cache,
            state: Mutex::new(State::default()),
            reattached: std::sync::Once::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    pub(crate) fn counts(&self) -> BatchCounts {
        self.state().counts
    }

    /// A batch is open: its keys are answered by it, not by a new one.
    fn opened(&self, record: &Record) {
        let mut state = self.state();
        for key in &record.keys {
            state.open.insert(key.clone(), record.local.clone());
        }
        state.counts.open += 1;
        state.counts.open_requests += record.keys.len();
        OPEN_BATCHES.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn online_retry(&self) -> bool {
        self.spec.online_retry
    }

    /// Re-attaches to the batches an earlier run left open on this endpoint (once a run).
    fn reattach(endpoint: &Arc<Endpoint>) {
        let Some(batcher) = endpoint.batcher.get() else {
            return;
        };
        // Every call waits until this is done: none may be queued before the keys of the
        // batches already open are known.
        batcher.reattached.call_once(|| {
            for record in records(&batcher.folder) {
                let ours = record.endpoint == endpoint.name
                    && record.base_url == endpoint.spec.base_url
                    && record.api == endpoint.spec.api;
                if !ours || !record.in_flight() {
                    continue;
                }
                batcher.opened(&record);
                tracing::info!(endpoint = %endpoint.name, batch = ?record.batch_id, requests = record.keys.len(), "re-attached to a batch");
                let endpoint = endpoint.clone();
                tokio::spawn(async move { follow(&endpoint, record).await });
            }
        });
    }

    /// The call's answer through the batch API: from the cache of fetched results, from a
    /// batch already open with it, or from the next batch.
    pub(crate) async fn reply(endpoint: &Arc<Endpoint>, key: &str, body: Value) -> Answer {
        let Some(batcher) = endpoint.batcher.get() else {
            return Answer::Done(Err(FailureKind::Provider {
                endpoint: endpoint.name.clone(),
                message: "the endpoint has no batches".into(),
            }));
        };
        Batcher::reattach(endpoint);
        if let Some(reply) = batcher.fetched(endpoint, key) {
            return Answer::Done(reply);
        }
        let (sender, receiver) = oneshot::channel();
        let start_gathering = {
            let mut state = batcher.state();
            // A result may have arrived since the look above: look again under the lock.
            if !state.open.contains_key(key)
                && let Some(reply) = batcher.fetched(endpoint, key)
            {
                return Answer::Done(reply);
            }
            state.waiters.entry(key.to_owned()).or_default().push(sender);
            if state.open.contains_key(key) {
                false
            } else {
                let bytes = body.to_string().len();
                state.queue.push(Queued {
                    key: key.to_owned(),
                    body,
                    bytes,
                });
                !std::mem::replace(&mut state.gathering, true)
            }
        };
        if start_gathering {
            let endpoint = endpoint.clone();
            tokio::spawn(async move { gather(&endpoint).await });
        }
        receiver
            .await
            .unwrap_or_else(|_| Answer::Again("the batch that held it ended without answering it".into()))
    }

    /// A fetched result, if the cache has one.
    fn fetched(&self, endpoint: &Endpoint, key: &str) -> Option<Result<Reply, FailureKind>> {
        let body = self.cache.get(Kind::Batch, key)?;
        Some(batch_reply(endpoint, &body))
    }

    fn answer(&self, key: &str, result: Answer) {
        let waiters = {
            let mut state = self.state();
            state.open.remove(key);
            state.waiters.remove(key).unwrap_or_default()
        };
        for waiter in waiters {
            let _ = waiter.send(result.clone());
        }
    }
}

/// A batch result's body read as its provider's reply, billed at the batch price.
fn batch_reply(endpoint: &Endpoint, body: &Value) -> Result<Reply, FailureKind> {
    let mut reply = endpoint
        .spec
        .api
        .provider()
        .reply(body)
        .map_err(|message| FailureKind::Provider {
            endpoint: endpoint.name.clone(),
            message: format!("an unreadable batch result: {message}"),
        })?;
    reply.batch = true;
    Ok(reply)
}

/// Gathers ready calls for `gather`, then submits them in batches within the limits, until
/// no call is waiting.
async fn gather(endpoint: &Arc<Endpoint>) {
    let Some(batcher) = endpoint.batcher.get() else {
        return;
    };
    loop {
        tokio::time::sleep(batcher.spec.gather.0).await;
        let taken = {
            let mut state = batcher.state();
            if state.queue.is_empty() {
                state.gathering = false;
                return;
            }
            let mut bytes = 0;
            let count = state
                .queue
                .iter()
                .take_while(|q| {
                    bytes += q.bytes;
                    bytes <= batcher.spec.max_bytes.0 as usize
                })
                .count()
                .clamp(1, batcher.spec.max_requests);
            let count = count.min(state.queue.len());
            state.queue.drain(..count).collect::<Vec<_>>()
        };
        let endpoint = endpoint.clone();
        tokio::spawn(async move { submit(&endpoint, taken).await });
    }
}

/// Records, submits and follows one batch.
async fn submit(endpoint: &Arc<Endpoint>, requests: Vec<Queued>) {
    let Some(batcher) = endpoint.batcher.get() else {
        return;
    };
    let now = SystemTime::now();
    let submission = crate::hash::sha256(format!("{:?}{}{}", now, std::process::id(), requests[0].key));
    let mut record = Record {
        local: format!("{}-{}", crate::clock::utc_timestamp(now, false), &submission[..8]),
        endpoint: endpoint.name.clone(),
        api: endpoint.spec.api,
        base_url: endpoint.spec.base_url.clone(),
        model: endpoint.spec.model.clone(),
        api_key_env: endpoint.spec.api_key_env.clone(),
        created: crate::clock::utc_timestamp(now, true),
        state: BatchState::Submitting,
        batch_id: None,
        submission: submission[..32].to_owned(),
        keys: requests.iter().map(|q| q.key.clone()).collect(),
        outcome: BTreeMap::new(),
    };
    batcher.opened(&record);
    // Recorded before it is sent: a kill from here on finds it on the next run.
    if let Err(error) = record.save(&batcher.folder) {
        fail_batch(
            endpoint,
            &mut record,
            &format!("cannot record the batch in {}: {error}", batcher.folder.display()),
        );
        return;
    }
    let mut tries = 0;
    let id = loop {
        tries += 1;
        match create(endpoint, &record, &requests).await {
            Ok(id) => break id,
            Err((message, retryable)) if retryable && tries < SUBMIT_TRIES => {
                tracing::warn!(endpoint = %endpoint.name, tries, %message, "retrying a batch submission");
                tokio::time::sleep(Duration::from_secs(1 << tries)).await;
            }
            Err((message, _)) => {
                fail_batch(
                    endpoint,
                    &mut record,
                    &format!("the batch was refused: {message}"),
                );
                return;
            }
        }
    };
    record.batch_id = Some(id);
    record.state = BatchState::Open;
    if let Err(error) = record.save(&batcher.folder) {
        tracing::error!(endpoint = %endpoint.name, %error, "could not record a submitted batch");
    }
    tracing::info!(endpoint = %endpoint.name, batch = ?record.batch_id, requests = record.keys.len(), "submitted a batch");
    follow(endpoint, record).await;
}

/// Every call of a batch that could not be submitted fails with the reason.
fn fail_batch(endpoint: &Endpoint, record: &mut Record, message: &str) {
    let Some(batcher) = endpoint.batcher.get() else {
        return;
    };
    record.state = BatchState::Refused;
    let _ = record.save(&batcher.folder);
    close(batcher, record);
    for key in &record.keys {
        batcher.answer(
            key,
            Answer::Done(Err(FailureKind::Provider {
                endpoint: endpoint.name.clone(),
                message: message.to_owned(),
            })),
        );
    }
}

fn close(batcher: &Batcher, record: &Record) {
    let mut state = batcher.state();
    state.counts.open = state.counts.open.saturating_sub(1);
    state.counts.open_requests = state.counts.open_requests.saturating_sub(record.keys.len());
    state.counts.done += 1;
    OPEN_BATCHES.fetch_sub(1, Ordering::Relaxed);
}

/// Polls a batch until it ends, then answers its calls and records how it ended.
async fn follow(endpoint: &Arc<Endpoint>, mut record: Record) {
    let Some(batcher) = endpoint.batcher.get() else {
        return;
    };
    if record.batch_id.is_none() {
        // Killed between submitting and recording the id: find it by its metadata.
        match find_lost(endpoint, &record).await {
            Some(id) => {
                record.batch_id = Some(id);
                record.state = BatchState::Open;
                let _ = record.save(&batcher.folder);
            }
            None => {
                // Never accepted: its calls go into the next batch.
                tracing::warn!(endpoint = %endpoint.name, local = %record.local, "a recorded batch was never accepted; its calls are submitted again");
                record.state = BatchState::Refused;
                let _ = record.save(&batcher.folder);
                close(batcher, &record);
                requeue(endpoint, &record.keys, &HashMap::new());
                return;
            }
        }
    }
    let ended = loop {
        tokio::time::sleep(batcher.spec.poll.0).await;
        match poll(endpoint, &record).await {
            Ok(Some(ended)) => break ended,
            Ok(None) => {}
            Err(message) => {
                tracing::warn!(endpoint = %endpoint.name, batch = ?record.batch_id, %message, "could not poll a batch")
            }
        }
    };
    let mut outcome: BTreeMap<String, usize> = BTreeMap::new();
    let mut again = Vec::new();
    for key in &record.keys {
        let (kind, result) = match ended.results.get(key) {
            None => ("unanswered", None),
            Some(line) => endpoint.spec.api.provider().batches().result(line),
        };
        *outcome.entry(kind.to_owned()).or_default() += 1;
        match result {
            Some(Ok(mut body)) => {
                // A provider that echoes the key in a result line: cached without it.
                crate::secrets::redact_json(&mut body);
                if let Err(error) = batcher.cache.put(
                    Kind::Batch,
                    key,
                    &json!({"job": "batch", "batch": record.batch_id}),
                    &body,
                ) {
                    tracing::error!(%key, %error, "could not write a batch result to the cache");
                }
                batcher.answer(key, Answer::Done(batch_reply(endpoint, &body)));
            }
            Some(Err((message, retryable))) => {
                if retryable {
                    again.push((key.clone(), message));
                } else {
                    batcher.answer(
                        key,
                        Answer::Done(Err(FailureKind::Provider {
                            endpoint: endpoint.name.clone(),
                            message,
                        })),
                    );
                }
            }
            None => again.push((
                key.clone(),
                format!("the batch ended {} without answering it", ended.status),
            )),
        }
    }
    record.state = BatchState::Ended;
    record.outcome = outcome;
    if let Err(error) = record.save(&batcher.folder) {
        tracing::error!(endpoint = %endpoint.name, %error, "could not record an ended batch");
    }
    close(batcher, &record);
    tracing::info!(endpoint = %endpoint.name, batch = ?record.batch_id, status = %ended.status, outcome = ?record.outcome, "a batch ended");
    let reasons: HashMap<String, String> = again.iter().cloned().collect();
    let keys: Vec<String> = again.into_iter().map(|(key, _)| key).collect();
    requeue(endpoint, &keys, &reasons);
}

/// Tells the calls waiting on these keys to submit themselves again (their callers hold
/// what to send, and submit each again once).
fn requeue(endpoint: &Arc<Endpoint>, keys: &[String], reasons: &HashMap<String, String>) {
    let Some(batcher) = endpoint.batcher.get() else {
        return;
    };
    for key in keys {
        let reason = reasons.get(key).cloned().unwrap_or_else(|| "unanswered".into());
        batcher.answer(key, Answer::Again(reason));
    }
}
