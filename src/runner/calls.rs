//! How the runner gets a call's answer: from the cache, from an identical call of this run
//! still in flight, or by calling; and what it counts of each.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::sync::OnceCell;

use super::progress::{CallCounts, StageProgress, Usage};
use super::{RunState, Stop};
use crate::exec::callback::{Callback, Failure, FailureKind, call_once};
use crate::parallel::Locked;
use crate::protocol::Role;

/// Where a call's answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    Called,
    Cache,
    /// Another job of this run needed the identical call.
    RunState,
    /// `L = 0`: nothing to call.
    Skipped,
}

/// A call's response, and the wall time in milliseconds of the attempt that made it where it
/// is known (an entry written before gacc recorded it has none).
#[derive(Debug, Clone)]
pub(super) struct Answer {
    pub(super) response: Value,
    pub(super) wall_ms: Option<u64>,
}

impl Answer {
    pub(super) fn of((response, wall_ms): (Value, Option<u64>)) -> Answer {
        Answer { response, wall_ms }
    }
}

/// A call in flight: its answer and whether it came from the cache, or its failure, once known.
pub(super) type InFlight = Arc<OnceCell<Result<(Answer, bool), Failure>>>;

/// The run's calls: identical calls in flight share one entry, so each is made once; and
/// what was made, found and paid, per role.
#[derive(Default)]
pub(super) struct CallBook {
    pub(super) slots: Mutex<HashMap<(Role, String), InFlight>>,
    pub(super) counts: Mutex<BTreeMap<Role, CallCounts>>,
    /// Calls the cache answered at once, per role (a re-run's every call: counted without a
    /// lock, added to `counts` when the run is over).
    pub(super) cached: [std::sync::atomic::AtomicUsize; 3],
    pub(super) paid: Mutex<BTreeMap<Role, Usage>>,
    /// The audit's calls (audit judges and panel readers), apart from the roles'.
    pub(super) audit: Mutex<CallCounts>,
}

impl CallBook {
    pub(super) fn slot(&self, role: Role, key: &str) -> InFlight {
        let mut slots = self.slots.locked();
        slots.entry((role, key.to_owned())).or_default().clone()
    }

    /// Counts a call of `role`, or of the audit where it `audits`.
    pub(super) fn count(&self, role: Role, audits: bool, update: impl FnOnce(&mut CallCounts)) {
        if audits {
            update(&mut self.audit.locked());
            return;
        }
        let mut counts = self.counts.locked();
        update(counts.entry(role).or_default());
    }

    /// Counts a call the cache answered at once.
    pub(super) fn found(&self, role: Role, audits: bool) {
        match audits {
            true => self.audit.locked().cached += 1,
            false => _ = self.cached[role as usize].fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Every count, those made without a lock included.
    pub(super) fn totals(&self) -> BTreeMap<Role, CallCounts> {
        let mut counts = self.counts.locked().clone();
        for role in [Role::Compressor, Role::Reader, Role::Judge] {
            let found = self.cached[role as usize].load(Ordering::Relaxed);
            if found > 0 {
                counts.entry(role).or_default().cached += found;
            }
        }
        counts
    }
}

pub(super) fn note_done(progress: &StageProgress, origin: Origin) {
    progress.done.fetch_add(1, Ordering::Relaxed);
    match origin {
        Origin::Cache => {
            progress.cached.fetch_add(1, Ordering::Relaxed);
        }
        Origin::RunState => {
            progress.shared.fetch_add(1, Ordering::Relaxed);
        }
        Origin::Skipped => {
            progress.skipped.fetch_add(1, Ordering::Relaxed);
        }
        Origin::Called => {}
    }
}

/// Answers a call from the cache, from an identical call of this run, or by calling.
pub(super) async fn obtain(
    shared: &RunState,
    callback: &Callback,
    key: &str,
    description: impl Fn() -> Value,
    request: impl Fn() -> Vec<u8>,
) -> Result<(Value, Origin), Failure> {
    let (answer, origin) = obtain_answer(shared, callback, key, description, request).await?;
    Ok((answer.response, origin))
}

/// `obtain`, with the wall time of the call that made the answer (SPEC §15).
pub(super) async fn obtain_answer(
    shared: &RunState,
    callback: &Callback,
    key: &str,
    description: impl Fn() -> Value,
    request: impl Fn() -> Vec<u8>,
) -> Result<(Answer, Origin), Failure> {
    let role = callback.role;
    if let Some(found) = shared.setup.cache.get_timed(role.into(), key) {
        shared.calls.found(role, callback.audits());
        return Ok((Answer::of(found), Origin::Cache));
    }
    refused(shared, callback)?;
    let slot = shared.calls.slot(role, key);
    let mut origin = Origin::RunState;
    let result = slot
        .get_or_init(|| {
            origin = Origin::Called;
            async {
                let cache = &shared.setup.cache;
                if let Some(found) = cache.get_timed(role.into(), key) {
                    return Ok((Answer::of(found), true));
                }
                let made = call_once(callback, cache, key, description, request, &shared.run_limit).await?;
                if let Some(what) = &made.lost_write {
                    shared.lost_write(what, 1);
                }
                Ok((Answer::of((made.response, made.wall_ms)), made.cached))
            }
        })
        .await;
    if origin == Origin::Called {
        // Later identical calls find the cache; only calls in flight need the slot.
        shared.calls.slots.locked().remove(&(role, key.to_owned()));
    }
    account(shared, (role, callback.audits()), result, origin)
}

/// A call that may not start: the run is stopping, or a replay allows no call of `callback`.
pub(super) fn refused(shared: &RunState, callback: &Callback) -> Result<(), Failure> {
    let offline = (shared.setup.offline.as_ref()).is_some_and(|allowed| !allowed.contains(&callback.name));
    if shared.stopped.load(Ordering::Relaxed) || offline {
        return Err(Failure {
            kind: FailureKind::Cancelled,
            stderr_tail: String::new(),
            attempts: 0,
        });
    }
    Ok(())
}

/// Counts a call that went through its slot (made, found by the call that made it, or shared
/// with it) and what it paid; a failure may stop the run.
pub(super) fn account(
    shared: &RunState,
    (role, audits): (Role, bool),
    result: &Result<(Answer, bool), Failure>,
    mut origin: Origin,
) -> Result<(Answer, Origin), Failure> {
    let result: Result<Answer, Failure> = match (result, origin) {
        (Ok((answer, from_cache)), Origin::Called) => {
            if *from_cache {
                origin = Origin::Cache;
                shared.calls.count(role, audits, |c| c.cached += 1);
            } else {
                shared.calls.count(role, audits, |c| c.made += 1);
                let mut paid = shared.calls.paid.locked();
                paid.entry(role).or_default().add(&answer.response);
            }
            Ok(answer.clone())
        }
        (Ok((answer, _)), _) => {
            shared.calls.count(role, audits, |c| c.shared += 1);
            Ok(answer.clone())
        }
        (Err(failure), origin) => {
            // A call the spending cap kept from starting is not a failure: its job is not run.
            if let FailureKind::CostCap { cap } = failure.kind {
                shared.stop(Stop::CostCap(cap));
                return Err(Failure {
                    kind: FailureKind::Cancelled,
                    ..failure.clone()
                });
            }
            if origin == Origin::Called {
                shared.calls.count(role, audits, |c| c.failed += 1);
                if let FailureKind::Rejected { .. } = &failure.kind {
                    shared.stop(Stop::Rejected(failure.kind.to_string()));
                } else if shared.setup.fail_fast && failure.kind != FailureKind::Cancelled {
                    shared.stop(Stop::FailFast);
                }
            }
            Err(failure.clone())
        }
    };
    result.map(|response| (response, origin))
}

/// In a replay (`gacc verify`), a job whose call failed in the run it replays (and so was
/// never cached) fails as that run recorded it, not as a call the replay may not make.
pub(super) fn as_recorded(shared: &RunState, job_key: &str, failure: Failure) -> Failure {
    if failure.kind != FailureKind::Cancelled {
        return failure;
    }
    match shared.setup.replayed_failures.get(job_key) {
        Some(row) => Failure {
            kind: FailureKind::Recorded(row.reason.clone()),
            stderr_tail: row.stderr_tail.clone(),
            attempts: row.attempts,
        },
        None => failure,
    }
}
