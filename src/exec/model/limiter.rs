//! How many calls an endpoint takes at once, found as the run goes (SPEC §8): slow start, then
//! additive increase while calls succeed; a 429 episode halves the limit once and holds every
//! new call for as long as the provider said; 5xx and timeouts pause growth without shrinking
//! it. And optional pacing to a number of requests and tokens per minute.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// How long growth pauses after a 5xx or a timeout.
const GROWTH_PAUSE: Duration = Duration::from_secs(5);
/// Spacing between starts below this is dropped; above `MAX_GAP` it does not grow.
const MIN_GAP: Duration = Duration::from_millis(1);
const MAX_GAP: Duration = Duration::from_secs(10);
/// Each success narrows the spacing by this factor.
const GAP_NARROWING: f64 = 0.97;
/// The most a wait re-checks the limit (a missed wake-up costs at most this).
const RECHECK: Duration = Duration::from_millis(500);

/// The live concurrency limit of one endpoint.
#[derive(Debug)]
pub(crate) struct Limiter {
    max: usize,
    adaptive: bool,
    state: Mutex<State>,
    notify: Notify,
}

#[derive(Debug)]
struct State {
    limit: f64,
    in_flight: usize,
    /// Until a 429 first lowers it, the limit grows by one per success (slow start).
    slow_start: bool,
    /// No call starts before this (a 429's Retry-After, or its reset headers).
    cooldown_until: Option<Instant>,
    hold_growth_until: Option<Instant>,
    /// Calls started before this instant belong to the last 429 episode: their 429s do not
    /// lower the limit again.
    episode_started: Option<Instant>,
    rate_limited: u64,
    /// Spacing between call starts, once a single call at a time is still too fast for the
    /// provider (fast replies under a per-minute limit).
    gap: Duration,
    next_start: Option<Instant>,
}

/// What the progress line shows of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Live {
    pub limit: usize,
    pub in_flight: usize,
    /// How long new calls still wait on a rate limit, if they do.
    pub cooling: Option<Duration>,
    pub rate_limited: u64,
}

/// A call's place under the limit; given back when dropped.
#[derive(Debug)]
pub(crate) struct Slot<'a> {
    limiter: &'a Limiter,
    started: Instant,
}

impl Limiter {
    pub(crate) fn new(max: usize, adaptive: bool) -> Limiter {
        let max = max.max(1);
        let start = if adaptive { max.min(4) } else { max };
        Limiter {
            max,
            adaptive,
            state: Mutex::new(State {
                limit: start as f64,
                in_flight: 0,
                slow_start: adaptive,
                cooldown_until: None,
                hold_growth_until: None,
                episode_started: None,
                rate_limited: 0,
                gap: Duration::ZERO,
                next_start: None,
            }),
            notify: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a place under the live limit and outside any cooldown.
    pub(crate) async fn acquire(&self) -> Slot<'_> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wait_until = {
                let mut state = self.state();
                let now = Instant::now();
                let hold = match (state.cooldown_until, state.next_start) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    (a, b) => a.or(b),
                };
                match hold {
                    Some(until) if until > now => Some(until),
                    _ if state.in_flight < state.limit.floor().max(1.0) as usize => {
                        state.in_flight += 1;
                        if !state.gap.is_zero() {
                            state.next_start = Some(now + state.gap);
                        }
                        return Slot {
                            limiter: self,
                            started: now,
                        };
                    }
                    _ => None,
                }
            };
            let recheck = Instant::now() + RECHECK;
            let until = wait_until.map_or(recheck, |u| u.min(recheck));
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(until) => {}
            }
        }
    }

    /// The live state, for the progress line.
    pub(crate) fn live(&self) -> Live {
        let state = self.state();
        let now = Instant::now();
        Live {
            limit: state.limit.floor().max(1.0) as usize,
            in_flight: state.in_flight,
            cooling: state.cooldown_until.filter(|u| *u > now).map(|u| u - now),
            rate_limited: state.rate_limited,
        }
    }

    fn release(&self) {
        self.state().in_flight -= 1;
        self.notify.notify_one();
    }
}

impl Slot<'_> {
    /// The call succeeded: the limit grows (by one in slow start, else by one per limit's
    /// worth of successes), unless growth is paused.
    pub(crate) fn succeeded(&self) {
        let limiter = self.limiter;
        if !limiter.adaptive {
            return;
        }
        let grew = {
            let mut state = limiter.state();
            // Spacing narrows as calls succeed, and goes once it is negligible.
            state.gap = state.gap.mul_f64(GAP_NARROWING);
            if state.gap < MIN_GAP {
                state.gap = Duration::ZERO;
            }
            let paused = state.hold_growth_until.is_some_and(|u| u > Instant::now());
            if paused || state.limit >= limiter.max as f64 {
                false
            } else {
                let before = state.limit.floor();
                let step = if state.slow_start { 1.0 } else { 1.0 / state.limit };
                state.limit = (state.limit + step).min(limiter.max as f64);
                state.limit.floor() > before
            }
        };
        if grew {
            limiter.notify.notify_one();
        }
    }

    /// The provider said 429: one halving per episode, and no call starts until `wait` ends.
    pub(crate) fn rate_limited(&self, wait: Duration) {
        let limiter = self.limiter;
        let mut state = limiter.state();
        let now = Instant::now();
        state.rate_limited += 1;
        let until = now + wait;
        state.cooldown_until = Some(state.cooldown_until.map_or(until, |u| u.max(until)));
        if !limiter.adaptive {
            return;
        }
        let new_episode = state.episode_started.is_none_or(|e| self.started > e);
        if new_episode {
            // At one call at a time, calls are too fast for the provider: space them.
            if state.limit < 2.0 || !state.gap.is_zero() {
                state.gap = (state.gap * 2).max(MIN_GAP * 10).min(MAX_GAP);
            }
            state.limit = (state.limit / 2.0).max(1.0);
            state.slow_start = false;
            state.episode_started = Some(now);
        }
    }

    /// A 5xx, a timeout or a broken connection: growth pauses; the limit stays.
    pub(crate) fn failed(&self) {
        self.limiter.state().hold_growth_until = Some(Instant::now() + GROWTH_PAUSE);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.limiter.release();
    }
}

/// Spaces calls to at most `rpm` requests and `tpm` estimated tokens a minute.
#[derive(Debug)]
pub(crate) struct Pacer {
    rpm: u32,
    tpm: u64,
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    pub(crate) fn new(rpm: u32, tpm: u64) -> Pacer {
        Pacer {
            rpm,
            tpm,
            next: Mutex::new(None),
        }
    }

    /// Waits for this call's turn; `tokens` is its estimated size.
    pub(crate) async fn wait(&self, tokens: u64) {
        if self.rpm == 0 && self.tpm == 0 {
            return;
        }
        let per_request = if self.rpm > 0 {
            Duration::from_secs_f64(60.0 / f64::from(self.rpm))
        } else {
            Duration::ZERO
        };
        let per_tokens = if self.tpm > 0 {
            Duration::from_secs_f64(60.0 * tokens as f64 / self.tpm as f64)
        } else {
            Duration::ZERO
        };
        let start = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            let start = next.map_or(now, |n| n.max(now));
            *next = Some(start + per_request.max(per_tokens));
            start
        };
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_limit_grows_on_success_and_halves_once_per_429_episode() {
        let limiter = Limiter::new(32, true);
        assert_eq!(limiter.live().limit, 4);
        // Slow start: one more per success.
        for _ in 0..8 {
            limiter.acquire().await.succeeded();
        }
        assert_eq!(limiter.live().limit, 12);
        // Three calls in flight meet 429s: one episode, one halving.
        let slots = [
            limiter.acquire().await,
            limiter.acquire().await,
            limiter.acquire().await,
        ];
        for slot in &slots {
            slot.rate_limited(Duration::from_secs(2));
        }
        assert_eq!(limiter.live().limit, 6);
        assert!(limiter.live().cooling.is_some());
        drop(slots);
        // Nothing starts during the cooldown.
        let before = Instant::now();
        let slot = limiter.acquire().await;
        assert!(Instant::now() - before >= Duration::from_secs(2));
        // After slow start: additive increase, about one per limit's worth of successes.
        slot.succeeded();
        drop(slot);
        for _ in 0..6 {
            limiter.acquire().await.succeeded();
        }
        assert_eq!(limiter.live().limit, 7);
        // A 5xx pauses growth but keeps the limit.
        limiter.acquire().await.failed();
        for _ in 0..20 {
            limiter.acquire().await.succeeded();
        }
        assert_eq!(limiter.live().limit, 7);
    }

    #[tokio::test(start_paused = true)]
    async fn one_call_at_a_time_still_rate_limited_spaces_its_starts() {
        let limiter = Limiter::new(1, true);
        let slot = limiter.acquire().await;
        slot.rate_limited(Duration::from_millis(100));
        drop(slot);
        let first = limiter.acquire().await;
        let started = Instant::now();
        drop(first);
        let _second = limiter.acquire().await;
        assert!(Instant::now() - started >= MIN_GAP * 10, "starts are spaced");
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_limit_never_moves_and_waits_are_bounded_by_it() {
        let limiter = Limiter::new(3, false);
        let held = [
            limiter.acquire().await,
            limiter.acquire().await,
            limiter.acquire().await,
        ];
        held[0].rate_limited(Duration::from_millis(10));
        assert_eq!(limiter.live().limit, 3);
        let waiting = tokio::time::timeout(Duration::from_secs(1), limiter.acquire()).await;
        assert!(waiting.is_err(), "a fourth call waited for a place");
        drop(held);
        assert_eq!(limiter.live().in_flight, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn pacing_spaces_requests_and_tokens() {
        let pacer = Pacer::new(60, 0);
        let start = Instant::now();
        for _ in 0..3 {
            pacer.wait(0).await;
        }
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        let pacer = Pacer::new(0, 6000);
        let start = Instant::now();
        pacer.wait(1000).await;
        pacer.wait(1000).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(10));
    }
}
