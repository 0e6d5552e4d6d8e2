//! How fast an endpoint starts its calls (SPEC §8, "Rate limits"). The `Pacer` learns the rate
//! a provider admits from its 429s: a 429 says the provider's bucket was empty when the refused
//! call arrived, so what it admitted between two such moments is exactly what it refilled, a
//! measure no burst can inflate. It paces just below that rate, then probes upward by a factor
//! that doubles each second nothing refuses (a limit ten times the estimate is found in a few
//! seconds), and starts again from a new measure at the next 429; the pause before it probes
//! again doubles while measures agree. It paces to the remaining
//! requests and tokens that replies announce, and `rpm`/`tpm` are ceilings. A 429 delays only
//! the call that drew it: nothing freezes the endpoint and then releases a burst.

mod learn;

use learn::Bounds;

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::exec::model::tuning::TUNING;
use crate::parallel::Locked;
use crate::providers::Exhausted;

/// Requests and tokens per second; `None` where nothing limits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Rates {
    pub requests: Option<f64>,
    pub tokens: Option<f64>,
}

impl Rates {
    fn min(self, other: Rates) -> Rates {
        let least = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Rates {
            requests: least(self.requests, other.requests),
            tokens: least(self.tokens, other.tokens),
        }
    }

    /// How long one call of `tokens` occupies the pace.
    fn interval(&self, tokens: f64) -> Duration {
        let of = |rate: Option<f64>, amount: f64| rate.map_or(0.0, |r| amount / r.max(TUNING.pacer.min_rate));
        let seconds = of(self.requests, 1.0).max(of(self.tokens, tokens));
        Duration::from_secs_f64(seconds.min(3600.0))
    }
}

/// A round of the probe: a second, or ten requests at `pace` where that is longer.
fn round(pace: Rates) -> Duration {
    let ten_calls = pace.requests.map_or(0.0, |r| 10.0 / r.max(TUNING.pacer.min_rate));
    Duration::from_secs_f64(ten_calls.clamp(1.0, 60.0))
}

/// A call the pacer started: when, and its size in the pacer's tokens.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub(crate) struct Ticket {
    seq: u64,
    at: Instant,
    tokens: f64,
    /// The pace in force when it started.
    pace: Rates,
}

/// Starts calls no faster than the provider admits (see the module's header).
#[derive(Debug)]
pub(crate) struct Pacer {
    adaptive: bool,
    /// `rpm`/`tpm`, per second.
    ceiling: Rates,
    state: Mutex<PaceState>,
}

/// A call the pacer let go, as the measures of a 429 see it.
#[derive(Debug)]
struct Sent {
    seq: u64,
    at: Instant,
    tokens: f64,
    heard: Heard,
}

/// What became of a sent call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Heard {
    /// In flight: the provider took it, as far as anyone knows.
    Nothing,
    Admitted,
    Limited,
}

/// The newest budget a reply announced (for the call `seq`), of `limit`, kept up to date: what
/// is left of it at `last`, as the provider's bucket would be, refilled at the pace up to the
/// limit, less every call started since (but those refused).
#[derive(Debug, Clone, Copy)]
struct Level {
    seq: u64,
    /// When the announcing call was sent: after `TUNING.pacer.max_announced_hold`, its budget holds no call.
    announced_at: Instant,
    /// What remained when the announcing call arrived.
    remaining: f64,
    limit: f64,
    /// The refill rate the announcement itself implies: what was used, back in `reset`
    /// (infinite where it said the budget is full again at once).
    refill: f64,
    room: f64,
    last: Instant,
}

impl Level {
    /// What is left at `now`, refilled at `rate`.
    fn at(&self, rate: f64, now: Instant) -> f64 {
        (self.room + rate * now.saturating_duration_since(self.last).as_secs_f64()).min(self.limit)
    }
}

#[derive(Debug)]
struct PaceState {
    next: Option<Instant>,
    /// Per budget (requests, tokens): the newest announced level, from which no call starts
    /// past what remains, refilled at the announced pace, less the calls started since.
    levels: [Option<Level>; 2],
    learned: Rates,
    announced: Rates,
    /// What the announcements so far say of each refill rate (requests, tokens).
    bounds: [Option<Bounds>; 2],
    /// The probe's growth per second, and until when it holds after a measure.
    gain: f64,
    hold_until: Option<Instant>,
    grown_at: Option<Instant>,
    /// A call last waited on the pace until this instant.
    pressed_at: Option<Instant>,
    /// When the last 429 episode was seen: the 429s of calls started before it belong to it.
    episode: Option<Instant>,
    /// When refused calls started whose 429s began episodes since the last measure (the
    /// newest last): the provider's bucket was empty then, and what it admitted since is what
    /// it refilled.
    empty_at: VecDeque<Instant>,
    /// Measures in a row that agreed with the pace they ended (up to `TUNING.pacer.steady_doublings`).
    steady: u32,
    /// The last measure came after a pace held above the rate (`TUNING.pacer.overshot`).
    overshot: bool,
    /// When the last 429 came: the probe does not grow while every call is refused.
    limited_at: Option<Instant>,
    /// Calls started in the last `TUNING.pacer.history`.
    history: VecDeque<Sent>,
    seq: u64,
    /// Provider input tokens per cl100k token, from the usage replies report.
    correction: f64,
    /// A call's tokens, a moving average of those started.
    call_tokens: f64,
    first_start: Option<Instant>,
    last_admitted: Option<Instant>,
    admitted: u64,
    admitted_tokens: f64,
}

impl PaceState {
    fn heard(&mut self, ticket: Ticket, heard: Heard) {
        if let Some(sent) = self.history.iter_mut().rev().find(|sent| sent.seq == ticket.seq) {
            sent.heard = heard;
        }
    }
}

impl Pacer {
    pub(crate) fn new(rpm: u32, tpm: u64, adaptive: bool) -> Pacer {
        let per_second = |per_minute: f64| (per_minute > 0.0).then_some(per_minute / 60.0);
        Pacer {
            adaptive,
            ceiling: Rates {
                requests: per_second(f64::from(rpm)),
                tokens: per_second(tpm as f64),
            },
            state: Mutex::new(PaceState {
                next: None,
                levels: [None, None],
                learned: Rates::default(),
                announced: Rates::default(),
                bounds: [None, None],
                gain: TUNING.pacer.probe_start,
                hold_until: None,
                grown_at: None,
                pressed_at: None,
                episode: None,
                empty_at: VecDeque::new(),
                overshot: false,
                steady: 0,
                limited_at: None,
                history: VecDeque::new(),
                seq: 0,
                correction: 1.0,
                call_tokens: 0.0,
                first_start: None,
                last_admitted: None,
                admitted: 0,
                admitted_tokens: 0.0,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PaceState> {
        self.state.locked()
    }

    /// The pace in force, per second.
    pub(crate) fn pace(&self) -> Rates {
        let state = self.state();
        self.in_force(&state)
    }

    fn in_force(&self, state: &PaceState) -> Rates {
        state.learned.min(state.announced).min(self.ceiling)
    }

    /// The newest requests budget a reply announced: its limit, and what remained of it.
    pub(crate) fn announced_budget(&self) -> Option<(f64, f64)> {
        let state = self.state();
        state.levels[0].map(|level| (level.limit, level.remaining))
    }

    /// What the endpoint sustained: admitted requests and tokens per second, from its first
    /// call to its last success.
    pub(crate) fn sustained(&self) -> Option<Rates> {
        let state = self.state();
        let span = state.last_admitted? - state.first_start?;
        let seconds = span.as_secs_f64().max(1.0);
        Some(Rates {
            requests: Some(state.admitted as f64 / seconds),
            tokens: Some(state.admitted_tokens / seconds),
        })
    }

    /// Waits for this call's turn: `input` is its prompt in cl100k tokens, `output` its
    /// `max_tokens`. The ticket names it when its reply comes.
    pub(crate) async fn wait(&self, input: u64, output: u64) -> Ticket {
        loop {
            let wait_until = {
                let mut state = self.state();
                let now = Instant::now();
                self.grow(&mut state, now);
                let tokens = input as f64 * state.correction + output as f64;
                let turn = state.next.max(self.announced_room(&state, now, tokens));
                match turn {
                    Some(next) if next > now => {
                        // The call presses on the pace until its turn.
                        state.pressed_at = Some(state.pressed_at.map_or(next, |at| at.max(next)));
                        next
                    }
                    _ => {
                        // The next turn follows this one's, not the time this call woke (timers
                        // wake up to a millisecond late, a fifth of the interval at 200 calls a
                        // second), unless the pace was idle: no burst after a pause.
                        state.call_tokens = if state.call_tokens == 0.0 {
                            tokens
                        } else {
                            0.95 * state.call_tokens + 0.05 * tokens
                        };
                        let interval = self.in_force(&state).interval(tokens);
                        let due = state
                            .next
                            .filter(|due| now.saturating_duration_since(*due) < TUNING.pacer.catch_up);
                        state.next = (!interval.is_zero()).then(|| due.unwrap_or(now) + interval);
                        state.seq += 1;
                        let seq = state.seq;
                        state.history.push_back(Sent {
                            seq,
                            at: now,
                            tokens,
                            heard: Heard::Nothing,
                        });
                        while state
                            .history
                            .front()
                            .is_some_and(|sent| now - sent.at > TUNING.pacer.history)
                        {
                            state.history.pop_front();
                        }
                        state.first_start.get_or_insert(now);
                        Self::take_announced(&mut state, now, tokens);
                        let pace = self.in_force(&state);
                        return Ticket {
                            seq,
                            at: now,
                            tokens,
                            pace,
                        };
                    }
                }
            };
            tokio::time::sleep_until(wait_until).await;
        }
    }

    /// The refill rate of announced budget `which` (0 requests, 1 tokens): the pace's, or where
    /// none is known yet (a reset of a millisecond bounds nothing) the announcement's own, so
    /// the budget is full again by its `reset`.
    fn refill(state: &PaceState, which: usize, level: &Level) -> f64 {
        let announced = [state.announced.requests, state.announced.tokens][which];
        announced.unwrap_or(0.0).max(level.refill)
    }

    /// When the newest announced budgets have room for one more call of `tokens` (None: now
    /// or never known): a provider's `remaining` is never overdrawn, from the first reply on,
    /// whatever the concurrency.
    fn announced_room(&self, state: &PaceState, now: Instant, tokens: f64) -> Option<Instant> {
        let mut until: Option<Instant> = None;
        for (which, level) in state.levels.iter().enumerate() {
            let Some(level) = level else { continue };
            let rate = Self::refill(state, which, level);
            if !rate.is_finite()
                || now.saturating_duration_since(level.announced_at) >= TUNING.pacer.max_announced_hold
            {
                continue;
            }
            // A call larger than the whole budget waits only for a full one.
            let needed = [1.0, tokens][which].min(level.limit);
            let room = level.at(rate, now);
            if room >= needed || rate <= 0.0 {
                continue;
            }
            let wait = ((needed - room) / rate).min(TUNING.pacer.max_announced_wait.as_secs_f64());
            let due = (now + Duration::from_secs_f64(wait))
                .min(level.announced_at + TUNING.pacer.max_announced_hold);
            until = Some(until.map_or(due, |u| u.max(due)));
        }
        until
    }

    /// A call of `tokens` starts now: it takes its share of each announced budget.
    fn take_announced(state: &mut PaceState, now: Instant, tokens: f64) {
        for which in 0..2 {
            let Some(level) = state.levels[which] else {
                continue;
            };
            let rate = Self::refill(state, which, &level);
            let room = if rate.is_finite() {
                level.at(rate, now)
            } else {
                level.limit
            };
            state.levels[which] = Some(Level {
                room: room - [1.0, tokens][which],
                last: now,
                ..level
            });
        }
    }

    /// A learned rate grows while calls wait on it, after a hold, by a factor a second that
    /// doubles each second: a limit that was raised, or one measured low, is found in seconds;
    /// the next 429 measures again.
    fn grow(&self, state: &mut PaceState, now: Instant) {
        let since = state.grown_at.map_or(Duration::ZERO, |at| now - at);
        state.grown_at = Some(now);
        let pressed = state
            .pressed_at
            .is_some_and(|at| now.saturating_duration_since(at) < TUNING.pacer.pressure);
        let held = state.hold_until.is_some_and(|until| now < until);
        // Calls refused lately and none admitted: the provider refuses everything for now (an
        // outage, a storm), and a pace grown now would flood it when it is back.
        let lately = |at: Option<Instant>| {
            at.is_some_and(|at| now.saturating_duration_since(at) < round(state.learned))
        };
        let refused = lately(state.limited_at) && !lately(state.last_admitted);
        if !self.adaptive || !pressed || held || refused || since.is_zero() {
            return;
        }
        // Growth is counted in rounds: a second, or ten calls at the pace where that is longer.
        let round = if state.gain > TUNING.pacer.probe_max {
            Duration::from_secs(1)
        } else {
            round(state.learned)
        };
        let rounds = since.as_secs_f64().min(5.0) / round.as_secs_f64();
        let factor = (1.0 + state.gain).powf(rounds);
        state.gain = (state.gain * 2f64.powf(rounds)).min(TUNING.pacer.probe_max.max(state.gain));
        for value in [&mut state.learned.requests, &mut state.learned.tokens]
            .into_iter()
            .flatten()
        {
            *value *= factor;
        }
    }

    /// The call's reply was admitted (not a 429): `reported` is the input tokens its usage
    /// reported, `estimated` the cl100k count it was paced on.
    pub(crate) fn admitted(&self, ticket: Ticket, reported: u64, estimated: u64) {
        let mut state = self.state();
        state.admitted += 1;
        state.admitted_tokens += ticket.tokens;
        let now = Instant::now();
        state.last_admitted = Some(now);
        state.heard(ticket, Heard::Admitted);
        if reported > 0 && estimated > 0 {
            let ratio = (reported as f64 / estimated as f64).clamp(0.25, 4.0);
            state.correction = 0.8 * state.correction + 0.2 * ratio;
        }
    }

    /// The call drew a 429. The first of an episode marks the provider's bucket empty when the
    /// call started, and measures what it admitted since the last such moment: requests and
    /// tokens a second, paced just below. Returns the calls in flight the new pace wants.
    pub(crate) fn limited(&self, ticket: Ticket, exhausted: Exhausted, latency: Duration) -> usize {
        let mut state = self.state();
        state.heard(ticket, Heard::Limited);
        // A refused call took nothing of the budgets announced before it started.
        for (which, level) in state.levels.iter_mut().enumerate() {
            if let Some(level) = level.as_mut().filter(|level| ticket.seq > level.seq) {
                level.room = (level.room + [1.0, ticket.tokens][which]).min(level.limit);
            }
        }
        if !self.adaptive {
            return 0;
        }
        state.limited_at = Some(Instant::now());
        let new_episode = state.episode.is_none_or(|e| ticket.at > e);
        if new_episode {
            state.episode = Some(Instant::now());
            self.measure(&mut state, ticket, exhausted);
        }
        self.needed_at(&state, latency)
    }

    /// The calls in flight the pace in force wants at `latency`, with room for its spread.
    pub(crate) fn needed(&self, latency: Duration) -> usize {
        let state = self.state();
        self.needed_at(&state, latency)
    }

    fn needed_at(&self, state: &PaceState, latency: Duration) -> usize {
        let pace = self.in_force(state);
        // Calls a second: the request pace, or the token pace over a call's tokens.
        let by_tokens = pace.tokens.map(|t| t / state.call_tokens.max(1.0));
        let calls = match (pace.requests, by_tokens) {
            (Some(r), Some(t)) => Some(r.min(t)),
            (r, t) => r.or(t),
        };
        calls.map_or(0, |r| (r * latency.as_secs_f64() * 1.5).ceil() as usize + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pacing_spaces_requests_and_tokens() {
        let pacer = Pacer::new(60, 0, true);
        let start = Instant::now();
        for _ in 0..3 {
            let _ = pacer.wait(0, 0).await;
        }
        assert_eq!(Instant::now() - start, Duration::from_secs(2));
        let pacer = Pacer::new(0, 6000, true);
        let start = Instant::now();
        let _ = pacer.wait(1000, 0).await;
        let _ = pacer.wait(1000, 0).await;
        let _ = pacer.wait(1000, 0).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(20));
    }

    #[tokio::test(start_paused = true)]
    async fn no_call_starts_past_the_newest_announced_remaining_less_the_calls_since() {
        use crate::providers::{Allowance, Announced};
        let pacer = Pacer::new(0, 0, true);
        // Three calls start at once (nothing is known yet); the first's reply says one of ten
        // remained when it arrived, refilled at one a second (9 used, full again in 9 s).
        let first = pacer.wait(10, 10).await;
        let _second = pacer.wait(10, 10).await;
        let _third = pacer.wait(10, 10).await;
        tokio::time::advance(Duration::from_millis(300)).await;
        let budget = Allowance {
            limit: 10.0,
            remaining: 1.0,
            reset: Duration::from_secs(9),
        };
        pacer.announced(
            first,
            Announced {
                requests: Some(budget),
                tokens: None,
            },
        );
        pacer.admitted(first, 10, 10);
        // The two calls since took that one and one more: the next waits for two to refill.
        let start = Instant::now();
        let fourth = pacer.wait(10, 10).await;
        let waited = Instant::now() - start;
        assert!(
            waited >= Duration::from_millis(1500),
            "the fourth call started after {waited:?}"
        );
        // A refused call takes nothing: the budget it was counted against is given back.
        pacer.limited(fourth, Exhausted::Requests, Duration::from_millis(300));
        let start = Instant::now();
        let _fifth = pacer.wait(10, 10).await;
        assert!(Instant::now() - start < Duration::from_millis(1500));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_429_sets_a_provisional_pace_and_the_next_measures_from_it() {
        let pacer = Pacer::new(0, 0, true);
        // The run's first calls: four sent 10 ms apart, the last three refused before the
        // first answered. One admitted says little: a provisional pace of one call over
        // `TUNING.pacer.recent`, no more, however many refusals follow.
        let mut tickets = Vec::new();
        for _ in 0..4 {
            tickets.push(pacer.wait(10, 10).await);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        for ticket in tickets.split_off(1) {
            pacer.limited(ticket, Exhausted::Requests, Duration::from_millis(100));
        }
        let provisional = pacer.pace().requests.unwrap();
        assert!((provisional - 2.0).abs() < 1e-9, "{provisional}");
        // A provisional pace grows fourfold a round while calls wait on it and are admitted.
        let before = Instant::now();
        while Instant::now() - before < Duration::from_secs(2) {
            let ticket = pacer.wait(10, 10).await;
            pacer.admitted(ticket, 10, 10);
        }
        let grown = pacer.pace().requests.unwrap();
        assert!(grown > 8.0 * provisional, "{provisional} → {grown}");
        // While every call is refused (an outage, a storm), it does not grow.
        let refused = pacer.wait(10, 10).await;
        pacer.limited(refused, Exhausted::Requests, Duration::from_millis(100));
        let before = Instant::now();
        while Instant::now() - before < Duration::from_secs(1) {
            let ticket = pacer.wait(10, 10).await;
            pacer.limited(ticket, Exhausted::Requests, Duration::from_millis(100));
        }
        assert!(pacer.pace().requests.unwrap() <= grown, "grew while refused");
        // The bucket was empty at the first 429: calls admitted since, over the time since,
        // are its refill. Ten a second for two seconds, then a 429: paced just below ten.
        let pacer = Pacer::new(0, 0, true);
        let first = pacer.wait(10, 10).await;
        tokio::time::advance(Duration::from_millis(1)).await;
        let refused = pacer.wait(10, 10).await;
        pacer.admitted(first, 10, 10);
        pacer.limited(refused, Exhausted::Requests, Duration::from_millis(100));
        tokio::time::advance(Duration::from_millis(99)).await;
        let mut tickets = Vec::new();
        for _ in 0..20 {
            let ticket = pacer.wait(10, 10).await;
            tokio::time::advance(Duration::from_millis(100)).await;
            tickets.push(ticket);
        }
        for ticket in tickets {
            pacer.admitted(ticket, 10, 10);
        }
        let refused = pacer.wait(10, 10).await;
        pacer.limited(refused, Exhausted::Requests, Duration::from_millis(100));
        // The refused call started at a pace far above ten: it counts, up to `TUNING.pacer.trust_pace`
        // times the measure.
        let learned = pacer.pace().requests.unwrap();
        let (low, high) = (
            TUNING.pacer.below * 10.0 * 0.95,
            TUNING.pacer.below * 10.0 * TUNING.pacer.trust_pace * 1.05,
        );
        assert!(
            (low..=high).contains(&learned),
            "learned {learned}/s from ten a second"
        );
    }
}
