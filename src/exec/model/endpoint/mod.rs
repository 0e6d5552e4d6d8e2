//! One model endpoint (SPEC §8): its HTTP client and key, the live concurrency limit and the
//! learned pace every call to it shares, and how one request is sent: retried on 429, 408, 5xx,
//! timeouts and broken connections with backoff that honours `Retry-After`, stopped for good
//! by 401, 403 and 404, and by a server that was never reached within seconds.

pub(in crate::exec::model) mod exchange;
mod verdict_format;

use std::borrow::Cow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;

use crate::exec::callback::FailureKind;
use crate::inputs::models::ModelSpec;
use crate::parallel::Locked;
use crate::providers::{Announced, Http, Reply};
use crate::trace::TraceEvent;

use super::batch;
use super::limiter::{Limiter, Live};
use super::pacer::{Pacer, Rates};

use crate::exec::model::tuning::TUNING;
use exchange::Exchange;
pub(crate) use exchange::http_client;
pub(in crate::exec::model) use exchange::{refusal, scrub, without_url};
use verdict_format::{Format, names_format};

/// The most of a reply body gacc reads.
const MAX_REPLY_BYTES: usize = 16 << 20;

/// One `[models.*]` endpoint: its client and key, its live limit and pace, and what it did.
#[derive(Debug)]
pub(crate) struct Endpoint {
    pub name: String,
    pub spec: ModelSpec,
    pub(super) key: Option<String>,
    pub(super) client: reqwest::Client,
    pub limiter: Limiter,
    pub pacer: Pacer,
    /// Set by a 401, 403 or 404: every later call would fail the same way.
    pub(super) rejected: Mutex<Option<FailureKind>>,
    /// Whether the server has ever answered (any status): until it has, a failure to connect
    /// is a wrong address or a server that is down, and stops the endpoint within seconds.
    answered: AtomicBool,
    /// When a call first failed to connect while nothing had answered.
    unreachable_since: Mutex<Option<tokio::time::Instant>>,
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    /// How the judge's verdict is asked for, after what the server refused (a `Format` as a
    /// number): many local servers take `json_object` and no `json_schema`.
    verdict_format: AtomicU8,
    /// Whether a call has been answered in the verdict format in force; until one has, the
    /// calls that ask for one go one at a time (`verdict_probe`), so a server that refuses the
    /// format refuses one request, not every request in flight.
    verdict_proven: AtomicBool,
    verdict_probe: tokio::sync::Mutex<()>,
    /// Its batches, when it has `batch` on and a cache to record them in.
    pub batcher: std::sync::OnceLock<batch::Batcher>,
}

impl Endpoint {
    /// The endpoint, its key read from `api_key_env`.
    pub(crate) fn new(name: &str, spec: &ModelSpec) -> Result<Endpoint, String> {
        Endpoint::with_key(name, spec, true)
    }

    /// The endpoint for a run over a pack (`gacc run --from`): its key when it is set; when it
    /// is not, every call it is asked to make (one the pack does not answer) fails at once,
    /// saying so, while the pack's answers need no key.
    pub(crate) fn key_if_set(name: &str, spec: &ModelSpec) -> Result<Endpoint, String> {
        match Endpoint::with_key(name, spec, true) {
            Ok(endpoint) => Ok(endpoint),
            Err(unset) if spec.api_key_env.is_some() => {
                let endpoint = Endpoint::with_key(name, spec, false)?;
                *endpoint.rejected.locked() = Some(FailureKind::Rejected {
                    endpoint: name.to_owned(),
                    message: format!("{unset}: this call is not in the pack, and making it needs the key"),
                });
                Ok(endpoint)
            }
            Err(error) => Err(error),
        }
    }

    /// Starts the live limit from what the endpoint ended on in an earlier run (`final_limit`
    /// in its `run.json`) where that run drew no 429 (a server without a rate limit, where the
    /// limit is found from latency; with a rate limit the pace sets it): a second run against
    /// a local server starts full, and is cut back within a round trip if the server is
    /// busier now. A server on this machine or its network starts from its earlier limit only
    /// where that run found it computes several calls at once (a limit found otherwise may
    /// have flooded a server that computes one at a time).
    pub(crate) fn resume(&mut self, earlier: &crate::store::run_record::EndpointRecord) {
        let unlimited = earlier.rate_limited == 0 && earlier.pace_rpm.is_none() && earlier.pace_tpm.is_none();
        if !unlimited || earlier.final_limit == 0 {
            return;
        }
        let (max, adaptive) = (self.spec.max_concurrency, self.spec.adaptive);
        // A local server that held more than two found to compute several at once.
        if !self.is_local() || (earlier.local_server && earlier.final_limit > 2) {
            self.limiter = Limiter::resuming(max, adaptive, earlier.final_limit);
        }
    }

    /// Whether the endpoint is a server on this machine or its network (SPEC §8,
    /// "Concurrency"): a loopback, private or link-local address, `localhost`, or a host
    /// without a dot.
    pub(crate) fn is_local(&self) -> bool {
        super::limiter::is_local(&self.spec.base_url)
    }

    /// The endpoint for counting and pricing its calls (`gacc plan`), which calls nothing: its
    /// key is not needed, and not read.
    pub(crate) fn for_planning(name: &str, spec: &ModelSpec) -> Result<Endpoint, String> {
        Endpoint::with_key(name, spec, false)
    }

    fn with_key(name: &str, spec: &ModelSpec, needed: bool) -> Result<Endpoint, String> {
        let key = match &spec.api_key_env {
            Some(_) if !needed => None,
            None => None,
            Some(variable) => Some(
                std::env::var(variable)
                    .ok()
                    .filter(|k| !k.is_empty())
                    .ok_or_else(|| format!("`api_key_env` names `{variable}`, which is not set"))?,
            ),
        };
        if let (Some(variable), Some(key)) = (&spec.api_key_env, &key) {
            crate::secrets::register(variable, key);
        }
        let client = http_client(spec.timeout.0)?;
        Ok(Endpoint {
            name: name.to_owned(),
            spec: spec.clone(),
            key,
            client,
            limiter: match super::limiter::is_local(&spec.base_url) {
                true => Limiter::local(spec.max_concurrency, spec.adaptive),
                false => Limiter::new(spec.max_concurrency, spec.adaptive),
            },
            pacer: Pacer::new(spec.rpm, spec.tpm, spec.adaptive),
            rejected: Mutex::new(None),
            answered: AtomicBool::new(false),
            unreachable_since: Mutex::new(None),
            requests: AtomicU64::new(0),
            retries: AtomicU64::new(0),
            verdict_format: AtomicU8::new(Format::Schema as u8),
            verdict_proven: AtomicBool::new(false),
            verdict_probe: tokio::sync::Mutex::new(()),
            batcher: std::sync::OnceLock::new(),
        })
    }

    /// The live limit and pace, for the progress line and `run.json`.
    pub(crate) fn live(&self) -> Live {
        self.limiter.live(self.pacer.pace())
    }

    /// Sends this endpoint's calls through the provider's batch API, recording its batches
    /// in `folder` (its first call re-attaches to those an earlier run left open there).
    pub(crate) fn use_batches(&self, folder: std::path::PathBuf, cache: crate::store::cache::Cache) {
        if let Some(spec) = self.spec.batch.spec() {
            let _ = self.batcher.set(batch::Batcher::new(spec, folder, cache));
        }
    }

    /// Its batches' counts, when it sends batches.
    pub(crate) fn batches(&self) -> Option<batch::BatchCounts> {
        self.batcher.get().map(batch::Batcher::counts)
    }

    pub(super) fn url(&self) -> String {
        self.spec.api.provider().call_url(self.base(), &self.spec.model)
    }

    /// The base URL, without a trailing slash.
    pub(super) fn base(&self) -> &str {
        self.spec.base_url.trim_end_matches('/')
    }

    /// A request a provider describes, signed with the endpoint's key, and the endpoint's own
    /// headers.
    pub(super) fn http(&self, mut http: Http) -> reqwest::RequestBuilder {
        self.spec.api.provider().sign(&mut http, self.key.as_deref());
        let mut request = match http.body {
            Some((content_type, body)) => self
                .client
                .post(http.url)
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(body),
            None => self.client.get(http.url),
        };
        for (name, value) in http.headers {
            request = request.header(name, value);
        }
        for (name, value) in &self.spec.headers {
            request = request.header(name, value);
        }
        request
    }

    /// The limits a reply's headers announce, in its provider's headers.
    pub(super) fn announced(&self, headers: &reqwest::header::HeaderMap) -> Announced {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        self.spec.api.provider().announced(&header)
    }

    pub(super) fn rejected(&self) -> Option<FailureKind> {
        self.rejected.locked().clone()
    }

    /// Sends one request, retrying 429, 408, 5xx, timeouts, broken connections and unreadable
    /// replies with backoff that honours the provider's `Retry-After`. `estimate` is the
    /// call's (input, output) tokens, for the pace.
    pub(super) async fn send(
        &self,
        body: &Value,
        estimate: (u64, u64),
        label: &str,
    ) -> Result<Reply, FailureKind> {
        let mut attempt = 0u32;
        // 429s are retried for as long as the provider keeps the call waiting, up to a
        // patience; other failures `retries` times.
        let (mut failed, mut limited, mut waited) = (0u32, 0u32, Duration::ZERO);
        let mut body = std::borrow::Cow::Borrowed(body);
        loop {
            attempt += 1;
            // Until the server has answered a verdict format, one call at a time asks for it.
            let probing = match Format::asked(&body).is_some() && !self.verdict_proven.load(Ordering::Relaxed)
            {
                true => Some(self.verdict_probe.lock().await),
                false => None,
            };
            let probing = probing.filter(|_| !self.verdict_proven.load(Ordering::Relaxed));
            // As the endpoint now asks for a verdict (another call may have found the server
            // refuses what this body asks for).
            let format = Format::of(self.verdict_format.load(Ordering::Relaxed));
            if Format::asked(&body).is_some_and(|asked| asked < format) {
                format.apply(body.to_mut());
            }
            let body = &*body;
            if let Some(rejected) = self.rejected() {
                return Err(rejected);
            }
            let needed = self.pacer.needed(self.limiter.pace_latency());
            let mut slot = self.limiter.acquire(needed).await;
            let ticket = slot.pace(self.pacer.wait(estimate.0, estimate.1)).await;
            self.limiter
                .keep_up(self.pacer.needed(self.limiter.pace_latency()));
            if let Some(rejected) = self.rejected() {
                return Err(rejected);
            }
            self.requests.fetch_add(1, Ordering::Relaxed);
            let started = tokio::time::Instant::now();
            let outcome = self.exchange(body).await;
            // A refusal of the response format is no transient failure: the server refuses it
            // every time. The endpoint asks for the next format from now on, and this call
            // goes again at once, not counted as a failure.
            if let Exchange::Transient { why: message, .. } | Exchange::Refused { message, .. } = &outcome
                && let Some(asked) = Format::asked(body)
                && names_format(message)
            {
                self.format_refused(asked, message, label);
                continue;
            }
            let (wait, why, status) = match outcome {
                Exchange::Answered(mut reply, announced) => {
                    if probing.is_some() {
                        self.verdict_proven.store(true, Ordering::Relaxed);
                    }
                    let latency = started.elapsed();
                    reply.service_ms = Some(latency.as_millis() as u64);
                    self.pacer.announced(ticket, announced);
                    self.pacer.admitted(ticket, reply.usage.input, estimate.0);
                    slot.succeeded(label, latency);
                    return Ok(reply);
                }
                Exchange::RateLimited {
                    wait,
                    message,
                    announced,
                } => {
                    limited += 1;
                    self.pacer.announced(ticket, announced);
                    let exhausted = self.spec.api.provider().exhausted(&announced, &message);
                    let needed = self.pacer.limited(ticket, exhausted, self.limiter.pace_latency());
                    slot.rate_limited(needed, started.elapsed());
                    // Only this call waits the provider's word, and a jittered backoff that
                    // grows a little each time, so that retries do not arrive together. It
                    // stays short: the retry waits its turn on the pace like any call, and a
                    // call refused all through a storm is back within seconds of its end.
                    let backoff = limited_backoff(limited);
                    (
                        wait.map_or(backoff, |told| told.max(backoff)),
                        format!("429 rate limited: {message}"),
                        Some(429),
                    )
                }
                // Nothing answers at the address: a wrong address or a server that is down
                // (before it ever answered), or one that went away mid-run. Either way every
                // later call would meet the same: within seconds the endpoint stops.
                Exchange::Unreachable(why) => {
                    failed += 1;
                    slot.failed();
                    let since = *self
                        .unreachable_since
                        .locked()
                        .get_or_insert_with(tokio::time::Instant::now);
                    let answered = self.answered.load(Ordering::Relaxed);
                    if since.elapsed() >= TUNING.retry.unreachable_patience
                        || (!answered && failed > self.spec.retries)
                    {
                        return Err(self.unreachable(&why, answered));
                    }
                    (backoff(failed).min(TUNING.retry.unreachable_backoff), why, None)
                }
                Exchange::Transient { wait, status, why } => {
                    failed += 1;
                    slot.failed();
                    (wait.unwrap_or_default().max(backoff(failed)), why, status)
                }
                Exchange::Rejected { status, message } => return Err(self.reject(status, &message)),
                Exchange::Refused { status, message } => {
                    return Err(FailureKind::Provider {
                        endpoint: self.name.clone(),
                        message: format!("{status}: {message}"),
                    });
                }
            };
            drop(slot);
            waited += wait;
            let patient =
                waited <= TUNING.retry.rate_limit_patience && limited <= TUNING.retry.max_rate_limited;
            if failed > self.spec.retries || (limited > 0 && !patient) {
                return Err(FailureKind::Provider {
                    endpoint: self.name.clone(),
                    message: format!("{why} (gave up after {attempt} attempts)"),
                });
            }
            self.retries.fetch_add(1, Ordering::Relaxed);
            crate::trace::record(&TraceEvent::Retrying {
                callback: Cow::Borrowed(label),
                attempt,
                reason: Cow::Borrowed(&why),
                endpoint: Some(Cow::Borrowed(&self.name)),
                status,
                wait_ms: Some(wait.as_millis() as u64),
            });
            tokio::time::sleep(wait).await;
        }
    }

    /// The server refused the verdict format `asked`: the endpoint asks for the next one from
    /// now on, said once per step (another call in flight may have moved it already).
    fn format_refused(&self, asked: Format, message: &str, label: &str) {
        let next = Format::of(asked as u8 + 1);
        let moved = self.verdict_format.fetch_max(next as u8, Ordering::Relaxed) < next as u8;
        if moved {
            crate::trace::notice(&format!(
                "`models.{}` refused {} ({}); asking for {} from now on (for `{label}` and every \
                 later judge call; a judge's `params.structured = false` asks for a GRADE line from the start)",
                self.name,
                asked.name(),
                message.chars().take(200).collect::<String>(),
                next.name()
            ));
        }
    }

    /// The verdict format the endpoint ended on, when a refusal moved it (for `run.json`).
    pub(crate) fn verdict_format(&self) -> Option<&'static str> {
        match Format::of(self.verdict_format.load(Ordering::Relaxed)) {
            Format::Schema => None,
            Format::JsonObject => Some("json_object"),
            Format::Prompted => Some("prompted"),
        }
    }

    /// The provider refused the key or the endpoint (401, 403, 404): every later call of this
    /// endpoint fails the same way, at once.
    fn reject(&self, status: u16, message: &str) -> FailureKind {
        let variable = self.spec.api_key_env.as_deref().unwrap_or("(no api_key_env)");
        let kind = FailureKind::Rejected {
            endpoint: self.name.clone(),
            message: format!(
                "{status} from {}: {message} (check `models.{}`: its base_url, model, and the key in {variable})",
                self.url(),
                self.name
            ),
        };
        *self.rejected.locked() = Some(kind.clone());
        kind
    }

    /// Nothing at the endpoint's address has answered within `TUNING.retry.unreachable_patience`: every
    /// later call of this endpoint fails at once, as for a refused key.
    fn unreachable(&self, why: &str, answered: bool) -> FailureKind {
        let kind = FailureKind::Rejected {
            endpoint: self.name.clone(),
            message: format!(
                "{why} (nothing answered there in {} s{}: check `models.{}.base_url`, and that the server is up)",
                TUNING.retry.unreachable_patience.as_secs(),
                if answered { ", after it had answered" } else { "" },
                self.name
            ),
        };
        *self.rejected.locked() = Some(kind.clone());
        kind
    }
}

/// The pace in force, for the progress line: `, pace 19.4 req/s 51k tok/min`, or nothing.
pub(crate) fn describe_pace(live: &Live) -> String {
    let Rates { requests, tokens } = live.pace;
    let mut text = String::new();
    if let Some(rate) = requests {
        text.push_str(&format!(" {rate:.1} req/s"));
    }
    if let Some(rate) = tokens {
        text.push_str(&format!(" {:.0}k tok/min", rate * 60.0 / 1000.0));
    }
    match (text.is_empty(), live.rate_limited) {
        (true, 0) => String::new(),
        (true, n) => format!(", {n} × 429"),
        (false, 0) => format!(", pace{text}"),
        (false, n) => format!(", pace{text} ({n} × 429)"),
    }
}

/// Exponential backoff with jitter, capped.
fn backoff(attempt: u32) -> Duration {
    crate::exec::callback::jittered_backoff(
        TUNING.retry.model_backoff_base,
        TUNING.retry.model_backoff_max,
        attempt,
    )
}

/// The backoff of a call's `attempt`th 429, beside the provider's `Retry-After`.
pub(crate) fn limited_backoff(attempt: u32) -> Duration {
    crate::exec::callback::jittered_backoff(
        TUNING.retry.model_backoff_base,
        TUNING.retry.limited_backoff_max,
        attempt,
    )
}
