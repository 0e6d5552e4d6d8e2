//! A call made at most once among the gacc processes that share a cache: a lease on its key
//! makes a second process wait, then take the first one's answer from the cache; the answer is
//! cached before the lease is let go. A run's calls and a dataset build's calls go through it.

use serde_json::Value;
use tokio::sync::Semaphore;
use tracing::Instrument;

use super::{Callback, Failure};
use crate::store::cache::Cache;

/// A call's response and where it came from.
#[derive(Debug)]
pub(crate) struct Made {
    pub response: Value,
    /// The wall time of the attempt that made it, where it is known.
    pub wall_ms: Option<u64>,
    /// Made by another gacc process while this one waited on its lease.
    pub cached: bool,
    /// Why its cache entry could not be written, where it could not (a full disk): the answer
    /// is good, but the next run pays for it again.
    pub lost_write: Option<String>,
}

/// `callback`'s call `key`, made unless another gacc process on `cache` holds its lease (then
/// that process's answer, once cached). The caller has looked in the cache already.
pub(crate) async fn call_once(
    callback: &Callback,
    cache: &Cache,
    key: &str,
    description: impl Fn() -> Value,
    request: impl Fn() -> Vec<u8>,
    run_limit: &Semaphore,
) -> Result<Made, Failure> {
    let kind = callback.role.into();
    // An answer made in gacc at once is not worth a lease file.
    let at_once = callback.launcher.answers_at_once();
    let lease = if at_once {
        None
    } else {
        cache.lease(kind, key).await
    };
    if lease.is_some() {
        cache.refresh();
        if let Some((response, wall_ms)) = cache.get_timed(kind, key) {
            return Ok(Made {
                response,
                wall_ms,
                cached: true,
                lost_write: None,
            });
        }
    }
    // What is logged while the call is made (-vvv) names its cache key.
    let span = tracing::info_span!("call", key = %key);
    let (response, took) = callback.call(key, request, run_limit).instrument(span).await?;
    let wall_ms = (!at_once).then_some(took.as_millis() as u64);
    let lost_write = (cache
        .put_timed(kind, key, &description(), &response, wall_ms)
        .err())
    .map(|error| {
        format!(
            "could not write the cache entry of a {} call ({error})",
            callback.name
        )
    });
    drop(lease);
    Ok(Made {
        response,
        wall_ms,
        cached: false,
        lost_write,
    })
}
