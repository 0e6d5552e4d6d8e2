//! A place in an endpoint's limit, held by one call: it waits on the pace, and its reply (a
//! success with its latency, a 429, a failure) is what the limiter learns from; it frees the
//! place when dropped.

use std::time::Duration;

use tokio::sync::SemaphorePermit;
use tokio::time::Instant;

use super::{Limiter, State};
use crate::exec::model::tuning::TUNING;

/// A call's place under the limit; given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot<'a> {
    pub(super) limiter: &'a Limiter,
    pub(super) permit: Option<SemaphorePermit<'a>>,
    pub(super) sent: Instant,
    /// Whether the call is past the pace, in the server.
    pub(super) in_server: bool,
    /// The calls in the server when this one was sent, itself included.
    pub(super) company: usize,
}

impl Slot<'_> {
    /// Waits on `pace` (the pacer's turn) as a call holding a place: while calls do, the limit
    /// does not grow. The call counts as sent when it returns.
    pub(crate) async fn pace<T>(&mut self, pace: impl std::future::Future<Output = T>) -> T {
        struct Pacing<'a>(&'a Limiter);
        impl Drop for Pacing<'_> {
            fn drop(&mut self) {
                self.0.state().pacing -= 1;
            }
        }
        self.limiter.state().pacing += 1;
        let guard = Pacing(self.limiter);
        let turn = pace.await;
        drop(guard);
        self.sent = Instant::now();
        let mut state = self.limiter.state();
        *state.in_server.entry(self.sent).or_default() += 1;
        state.in_server_count += 1;
        self.company = state.in_server_count;
        drop(state);
        self.in_server = true;
        turn
    }

    /// The call was answered after `latency`, by a callback of `class`: the limit grows while
    /// latency holds and calls wait for a place, and is cut once a round trip when latency says
    /// the server is past full.
    pub(crate) fn succeeded(&mut self, class: &str, latency: Duration) {
        let limiter = self.limiter;
        let now = Instant::now();
        let mut state = limiter.state();
        let seconds = latency.as_secs_f64();
        state.mean = match state.mean {
            0.0 => seconds,
            mean => 0.9 * mean + 0.1 * seconds,
        };
        let current = state.cut_at.is_none_or(|cut| self.sent > cut);
        let reading = state.observe(class, latency, self.company, now, current);
        if state.local.is_some() {
            // The call has left the server: a call the limit now lets in is sent without it.
            self.leave_server(&mut state);
            super::local::reply(limiter, &mut state, class, latency, self.company);
            if state.local.is_some() || !current {
                return;
            }
        }
        let load = reading.load;
        if !limiter.adaptive {
            return;
        }
        if !current {
            return;
        }
        if load > TUNING.limiter.cut_above + reading.slack {
            // Toward what the server holds usefully, with room; never below half.
            let settled = (state.useful * TUNING.limiter.settle).max(state.limit as f64 * 0.5);
            let target = settled.floor() as usize;
            limiter.set_limit(&mut state, target);
            state.startup = false;
            state.credit = 0.0;
            state.cut_at = Some(now);
            tracing::debug!(
                limit = state.limit,
                load,
                "latency rose without throughput: fewer calls in flight"
            );
            return;
        }
        // The start ends at the first reply that took longer than the unloaded latency allows
        // (where replies are steady; else when the load average rises past their spread).
        // Growing five times a round trip, the limit is by then far past full: it goes back to
        // what the server held usefully when this call was sent (Little's law: the calls in the
        // server over the latency ratio), with room.
        let risen = if reading.steady {
            reading.ratio >= TUNING.limiter.grow_below
        } else {
            load >= TUNING.limiter.grow_below + reading.slack
        };
        if state.startup && risen {
            // One reply says it where replies are steady; else the average of many.
            let useful = if reading.steady {
                self.company as f64 / reading.ratio
            } else {
                state.useful
            };
            let target = (useful * TUNING.limiter.exit_room).ceil() as usize;
            if target < state.limit {
                limiter.set_limit(&mut state, target);
            }
            state.startup = false;
            state.credit = 0.0;
            state.cut_at = Some(now);
            tracing::debug!(limit = state.limit, "the server is full: calls in flight found");
            return;
        }
        if load >= TUNING.limiter.grow_below + reading.slack {
            state.startup = false;
            return;
        }
        let paused = state.hold_growth_until.is_some_and(|until| until > now);
        if paused || !limiter.bound(&state) || state.limit >= limiter.max {
            return;
        }
        let steady_and_slow = reading.steady && latency >= TUNING.limiter.jump_above;
        self.grow(limiter, &mut state, steady_and_slow);
    }

    /// Grows the limit after a reply at speed while calls wait for a place: at once to
    /// `TUNING.limiter.first_room` times the start's calls where `steady_and_slow`, else by a few places a
    /// reply during the start (never past a few times what replies have shown), then slowly.
    fn grow(&self, limiter: &Limiter, state: &mut State, steady_and_slow: bool) {
        if state.startup {
            state.validated = state.validated.max(self.company);
        }
        // A jump is safe only where replies are steady (one slow reply then says the server is
        // full, within the round trip the jump filled it), and worth it only where they are slow.
        let first_round = state.startup && state.validated <= TUNING.limiter.start && steady_and_slow;
        if first_round {
            // The start's calls came back at speed: it may fill `TUNING.limiter.first_room` times
            // them at once.
            let target = (state.validated * TUNING.limiter.first_room).max(state.limit);
            limiter.set_limit(state, target);
            state.jumped = true;
            return;
        }
        state.credit += if state.startup {
            TUNING.limiter.startup_growth
        } else {
            TUNING.limiter.growth
        };
        let whole = state.credit.floor();
        if whole >= 1.0 {
            state.credit -= whole;
            let mut target = state.limit + whole as usize;
            if state.startup {
                // Never past a few times what a reply has shown the server to hold at speed:
                // the next round trip's calls are sent before any of them can say it is full.
                let room = if state.jumped {
                    TUNING.limiter.room_after_jump
                } else {
                    TUNING.limiter.validated_room
                };
                target = target.min(state.validated * room).max(state.limit);
            }
            limiter.set_limit(state, target);
        }
    }

    /// The provider said 429 after `took`: one halving per episode, never below `needed`
    /// (the calls in flight the learned pace wants) nor the calls the provider took (in the
    /// server longer than a 429 takes to come back), with one place more to learn from; the
    /// pacer, not the limit, holds calls back.
    pub(crate) fn rate_limited(&self, needed: usize, took: Duration) {
        let limiter = self.limiter;
        let mut state = limiter.state();
        state.rate_limited += 1;
        state.refusal = if state.refusal == TUNING.limiter.refusal_unknown {
            took
        } else {
            state.refusal.max(took).mul_f64(0.9).max(took)
        };
        if !limiter.adaptive {
            return;
        }
        if state.cut_at.is_none_or(|cut| self.sent > cut) {
            let taken_before = Instant::now().checked_sub(state.refusal * 2);
            let taken: usize =
                taken_before.map_or(0, |before| state.in_server.range(..before).map(|(_, n)| n).sum());
            let floor = needed.max(taken + 1).min(limiter.max);
            let target = (state.limit / 2).max(floor);
            limiter.set_limit(&mut state, target);
            state.startup = false;
            state.credit = 0.0;
            state.cut_at = Some(Instant::now());
        }
    }

    /// A 5xx, a timeout or a broken connection: growth pauses; the limit stays.
    pub(crate) fn failed(&self) {
        self.limiter.state().hold_growth_until = Some(Instant::now() + TUNING.limiter.growth_pause);
    }
}

impl Slot<'_> {
    /// Counts the call out of the server (once).
    fn leave_server(&mut self, state: &mut State) {
        if !std::mem::take(&mut self.in_server) {
            return;
        }
        if let Some(count) = state.in_server.get_mut(&self.sent) {
            *count -= 1;
            if *count == 0 {
                state.in_server.remove(&self.sent);
            }
            state.in_server_count -= 1;
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let limiter = self.limiter;
        let mut state = limiter.state();
        state.in_flight -= 1;
        self.leave_server(&mut state);
        if let Some(permit) = self.permit.take()
            && state.debt > 0
        {
            state.debt -= 1;
            permit.forget();
        }
    }
}
