//! The simpler controller the pacer and limiter are compared with (docs/guide/models.md,
//! "Simulated first"): slow start and AIMD on the calls in flight, as TCP does (one more call
//! a reply below the threshold, one more a round trip above it; half on a 429, at most once a
//! round trip), and an announced budget waited out when it is spent. No latency signal, no
//! learned pace, no anchors, episodes or overshoot.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Arrival, Cell, Outcome, REFUSAL, Served, outcome, reply};
use crate::exec::model::endpoint::limited_backoff;
use crate::providers::Announced;

/// The controller's state.
struct Aimd {
    /// Calls allowed in flight (fractional while it grows by one a round trip).
    window: f64,
    /// Below it, the window grows by one a reply (slow start).
    threshold: f64,
    in_flight: usize,
    peak: usize,
    ceiling: f64,
    /// No call is sent before this (an announced budget spent, until its reset).
    not_before: Instant,
    /// When the window was last halved, and the mean latency (seconds).
    halved_at: Instant,
    latency: f64,
}

impl Aimd {
    /// What a reply's headers announced: a budget spent holds calls until its reset.
    fn heard(&mut self, announced: Announced, now: Instant) {
        for allowance in [announced.requests, announced.tokens].into_iter().flatten() {
            if allowance.remaining < 1.0 {
                let reset = allowance.reset.min(Duration::from_secs(60));
                self.not_before = self.not_before.max(now + reset);
            }
        }
    }
}

/// Runs a cell with the AIMD controller in virtual time (the caller's runtime must start
/// paused).
pub(super) async fn simulate(cell: Cell) -> Outcome {
    let start = Instant::now();
    let control = Arc::new(Mutex::new(Aimd {
        window: 4.0_f64.min(cell.ceiling as f64),
        threshold: f64::INFINITY,
        in_flight: 0,
        peak: 0,
        ceiling: cell.ceiling as f64,
        not_before: start,
        halved_at: start,
        latency: 0.0,
    }));
    let freed = Arc::new(Notify::new());
    let served = Arc::new(Mutex::new(Served::new(&cell, start)));
    let next = Arc::new(AtomicUsize::new(0));
    let (_, amount) = cell.server.capacity(cell.tokens);
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..cell.ceiling.min(cell.calls) {
        let (control, freed, served, next) = (control.clone(), freed.clone(), served.clone(), next.clone());
        workers.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < cell.calls {
                let mut limited = 0;
                loop {
                    // A place under the window, then the announced budget's reset.
                    let not_before = loop {
                        let notified = freed.notified();
                        {
                            let mut state = control.lock().unwrap();
                            if (state.in_flight as f64) < state.window.floor().max(1.0) {
                                state.in_flight += 1;
                                state.peak = state.peak.max(state.in_flight);
                                break state.not_before;
                            }
                        }
                        notified.await;
                    };
                    tokio::time::sleep_until(not_before).await;
                    let arrival = cell
                        .server
                        .arrive(&mut served.lock().unwrap(), amount, start, cell.jitter);
                    match arrival {
                        Arrival::Admitted(latency, announced) => {
                            let latency = reply(&cell, &served, latency).await;
                            let mut state = control.lock().unwrap();
                            state.in_flight -= 1;
                            state.latency = match state.latency {
                                0.0 => latency.as_secs_f64(),
                                mean => 0.9 * mean + 0.1 * latency.as_secs_f64(),
                            };
                            let growth = match state.window < state.threshold {
                                true => 1.0,
                                false => 1.0 / state.window,
                            };
                            state.window = (state.window + growth).min(state.ceiling);
                            state.heard(announced, Instant::now());
                            freed.notify_waiters();
                            break;
                        }
                        Arrival::Refused(told, announced) => {
                            tokio::time::sleep(REFUSAL).await;
                            limited += 1;
                            {
                                let mut state = control.lock().unwrap();
                                state.in_flight -= 1;
                                let now = Instant::now();
                                // Once a round trip: the refusals of one burst are one signal.
                                let round_trip = Duration::from_secs_f64(state.latency).max(REFUSAL);
                                if now - state.halved_at >= round_trip {
                                    state.window = (state.window / 2.0).max(1.0);
                                    state.threshold = state.window;
                                    state.halved_at = now;
                                }
                                state.heard(announced, now);
                                freed.notify_waiters();
                            }
                            let backoff = limited_backoff(limited);
                            tokio::time::sleep(told.map_or(backoff, |told| told.max(backoff))).await;
                        }
                    }
                }
            }
        });
    }
    while workers.join_next().await.is_some() {}
    let peak = control.lock().unwrap().peak;
    outcome(&cell, &served.lock().unwrap(), start, peak)
}
