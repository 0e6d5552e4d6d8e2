//! How many calls an endpoint has in flight and how fast it starts them (SPEC §8, "Rate
//! limits"). The `Limiter` finds the concurrency: slow start, then additive increase; a 429
//! episode halves it once, never below what the learned rate needs. The `Pacer` finds the rate:
//! it learns what the provider admitted between 429 episodes and paces just below it, probing
//! upward slowly; it paces to the remaining requests and tokens that replies announce; and
//! `rpm`/`tpm` are ceilings. A 429 delays only the call that drew it: nothing freezes the
//! endpoint and then releases a burst.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::parallel::Locked;
use crate::providers::{Allowance, Announced};

/// How long growth pauses after a 5xx or a timeout.
const GROWTH_PAUSE: Duration = Duration::from_secs(5);
/// The most a wait re-checks the limit (a missed wake-up costs at most this).
const RECHECK: Duration = Duration::from_millis(500);

/// The pace is this share of the rate the provider admitted (or announced).
const BELOW: f64 = 0.95;
const BELOW_ANNOUNCED: f64 = 0.97;
/// Growth of a learned rate per second while calls wait on it: fast until the first
/// episode under pacing has measured the provider, then slow probing.
const PROBE_FAST: f64 = 0.5;
const PROBE_SLOW: f64 = 0.03;
/// A measurement spans at least this long, and looks back this far at the most.
const MIN_SPAN: Duration = Duration::from_secs(1);
const LOOK_BACK: Duration = Duration::from_secs(3);
/// What the pacer remembers of the calls it started.
const HISTORY: Duration = Duration::from_secs(30);
/// A learned rate never falls below one request (or token) a minute.
const MIN_RATE: f64 = 1.0 / 60.0;
/// A measure needs at least this many replies admitted within its window: a 429 among the
/// first calls of a run, or after the provider refused everything for a while, has too little
/// to measure, and the call only backs off.
const MIN_REPLIES: usize = 3;
/// Growth needs calls that waited on the pace this recently.
const PRESSURE: Duration = Duration::from_secs(1);

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
    hold_growth_until: Option<Instant>,
    /// Calls started before this instant belong to the last 429 episode: their 429s do not
    /// lower the limit again.
    episode_started: Option<Instant>,
    rate_limited: u64,
}

/// What the progress line and `run.json` show of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Live {
    pub limit: usize,
    pub in_flight: usize,
    pub rate_limited: u64,
    /// The pace in force: learned, announced or set, per second.
    pub pace: Rates,
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
                hold_growth_until: None,
                episode_started: None,
                rate_limited: 0,
            }),
            notify: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Waits for a place under the live limit.
    pub(crate) async fn acquire(&self) -> Slot<'_> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut state = self.state();
                if state.in_flight < state.limit.floor().max(1.0) as usize {
                    state.in_flight += 1;
                    return Slot {
                        limiter: self,
                        started: Instant::now(),
                    };
                }
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
    }

    /// The live limit and 429 count; the pace is the pacer's.
    pub(crate) fn live(&self, pace: Rates) -> Live {
        let state = self.state();
        Live {
            limit: state.limit.floor().max(1.0) as usize,
            in_flight: state.in_flight,
            rate_limited: state.rate_limited,
            pace,
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

    /// The provider said 429: one halving per episode, never below `needed` (the calls in
    /// flight the learned rate wants); the pacer, not the limit, holds calls back.
    pub(crate) fn rate_limited(&self, needed: usize) {
        let limiter = self.limiter;
        let mut state = limiter.state();
        state.rate_limited += 1;
        if !limiter.adaptive {
            return;
        }
        let new_episode = state.episode_started.is_none_or(|e| self.started > e);
        if new_episode {
            let floor = (needed.min(limiter.max)) as f64;
            state.limit = (state.limit / 2.0).max(floor).max(1.0);
            state.slow_start = false;
            state.episode_started = Some(Instant::now());
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
        let of = |rate: Option<f64>, amount: f64| rate.map_or(0.0, |r| amount / r.max(MIN_RATE));
        let seconds = of(self.requests, 1.0).max(of(self.tokens, tokens));
        Duration::from_secs_f64(seconds.min(3600.0))
    }
}

/// Which limit a 429 was about, as far as the provider said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exhausted {
    Requests,
    Tokens,
    /// It did not say: both rates are learned.
    Unknown,
}

impl Exhausted {
    /// From the 429's message (OpenAI: "… on tokens per min (TPM) …", "… on requests per min").
    pub(crate) fn from_message(message: &str) -> Exhausted {
        let message = message.to_ascii_lowercase();
        match (message.contains("token"), message.contains("request")) {
            (true, false) => Exhausted::Tokens,
            (false, true) => Exhausted::Requests,
            _ => Exhausted::Unknown,
        }
    }
}

impl Allowance {
    /// What this one announcement says of the refill rate. `remaining` is the level rounded
    /// down, so between `limit - remaining - 1` and `limit - remaining` were used, and they
    /// refill in `reset`: the rate lies between the two over `reset`. A full budget says nothing.
    fn bounds(&self) -> Option<Bounds> {
        let used = self.limit - self.remaining;
        let seconds = self.reset.as_secs_f64();
        (used >= 1.0 && seconds > 0.0).then(|| Bounds {
            low: (used - 1.0) / seconds,
            high: used / seconds,
        })
    }

    /// How long until one more unit is there at `rate`, when the level, `limit` less what
    /// `reset` refills at that rate (within what `remaining` allows), is below one.
    fn until(&self, rate: f64) -> Option<Duration> {
        let level =
            (self.limit - self.reset.as_secs_f64() * rate).clamp(self.remaining, self.remaining + 1.0);
        (level < 1.0 && rate > 0.0).then(|| Duration::from_secs_f64(((1.0 - level) / rate).min(60.0)))
    }
}

/// A refill rate known to lie between `low` and `high`, per second.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Bounds {
    low: f64,
    high: f64,
}

impl Bounds {
    /// Narrowed by one more announcement; a new start when they disagree (the limit changed).
    fn and(self, other: Bounds) -> Bounds {
        let narrowed = Bounds {
            low: self.low.max(other.low),
            high: self.high.min(other.high),
        };
        if narrowed.low <= narrowed.high {
            narrowed
        } else {
            other
        }
    }

    /// The rate to pace on: the high bound. It is exact when a call found the budget full (one
    /// unit used, refilled in `reset`), which is what a pace below the rate leaves; a pace above
    /// the rate empties the budget, and the announcements at low levels pull the bound down.
    /// (The low bound rises only while the budget is low, so a pace on it would stay low.)
    fn rate(self) -> f64 {
        self.high
    }
}

/// A call the pacer started: when, and its size in the pacer's tokens.
#[derive(Debug, Clone, Copy)]
#[must_use]
pub(crate) struct Ticket {
    seq: u64,
    at: Instant,
    tokens: f64,
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

#[derive(Debug)]
struct PaceState {
    next: Option<Instant>,
    learned: Rates,
    announced: Rates,
    /// What the announcements so far say of each refill rate (requests, tokens).
    bounds: [Option<Bounds>; 2],
    /// Fast growth until an episode under pacing has measured the provider.
    fast: bool,
    grown_at: Option<Instant>,
    /// A call last waited on the pace at this instant.
    pressed_at: Option<Instant>,
    /// When the last 429 episode was seen: the 429s of calls started before it belong to it.
    episode: Option<Instant>,
    /// Calls started in the last `HISTORY`.
    history: VecDeque<Sent>,
    seq: u64,
    /// Provider input tokens per cl100k token, from the usage replies report.
    correction: f64,
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
                learned: Rates::default(),
                announced: Rates::default(),
                bounds: [None, None],
                fast: true,
                grown_at: None,
                pressed_at: None,
                episode: None,
                history: VecDeque::new(),
                seq: 0,
                correction: 1.0,
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
                match state.next {
                    Some(next) if next > now => {
                        state.pressed_at = Some(now);
                        next
                    }
                    _ => {
                        let interval = self.in_force(&state).interval(tokens);
                        state.next = (!interval.is_zero()).then_some(now + interval);
                        state.seq += 1;
                        let seq = state.seq;
                        state.history.push_back(Sent {
                            seq,
                            at: now,
                            tokens,
                            heard: Heard::Nothing,
                        });
                        while state.history.front().is_some_and(|sent| now - sent.at > HISTORY) {
                            state.history.pop_front();
                        }
                        state.first_start.get_or_insert(now);
                        return Ticket { seq, at: now, tokens };
                    }
                }
            };
            tokio::time::sleep_until(wait_until).await;
        }
    }

    /// A learned rate grows while calls wait on it: fast until the provider is measured,
    /// then slowly, to find a limit that was raised.
    fn grow(&self, state: &mut PaceState, now: Instant) {
        let since = state.grown_at.map_or(Duration::ZERO, |at| now - at);
        state.grown_at = Some(now);
        let pressed = state.pressed_at.is_some_and(|at| now - at < PRESSURE);
        if !self.adaptive || !pressed || since.is_zero() {
            return;
        }
        let rate = if state.fast { PROBE_FAST } else { PROBE_SLOW };
        let factor = (1.0 + rate).powf(since.as_secs_f64().min(1.0));
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

    /// The call drew a 429. The first of an episode measures what the provider admitted
    /// since the last one (the bucket empty at both ends), or over the last seconds, and
    /// paces just below it. The call number of the calls in flight the new pace wants.
    pub(crate) fn limited(&self, ticket: Ticket, exhausted: Exhausted, latency: Duration) -> usize {
        let mut state = self.state();
        state.heard(ticket, Heard::Limited);
        if !self.adaptive {
            return 0;
        }
        let new_episode = state.episode.is_none_or(|e| ticket.at > e);
        if new_episode {
            // Two measures, each low in one case: since the last episode (exact when the
            // provider's bucket was empty at both ends, low when gacc sent below the limit for a
            // while) and the last seconds (high by what the bucket held when they began). The
            // higher one, paced just below, wastes neither.
            let first = state.first_start.unwrap_or(ticket.at);
            let look_back = first.max(ticket.at.checked_sub(LOOK_BACK).unwrap_or(first));
            let since = match state.episode {
                Some(e) if ticket.at - e >= MIN_SPAN && !state.fast => e,
                _ => look_back,
            };
            // Calls and tokens a second admitted from `from` until the refused call, and how
            // many of those calls have replied.
            let admitted = |from: Instant| {
                let span = (ticket.at - from).max(MIN_SPAN).as_secs_f64();
                let (count, tokens, replied) = state
                    .history
                    .iter()
                    .filter(|sent| sent.at >= from && sent.at < ticket.at)
                    .filter(|sent| sent.heard != Heard::Limited)
                    .fold((0.0, 0.0, 0), |(n, t, r), sent| {
                        (
                            n + 1.0,
                            t + sent.tokens,
                            r + usize::from(sent.heard == Heard::Admitted),
                        )
                    });
                (count / span, tokens / span, replied)
            };
            let (a, b) = (admitted(since), admitted(look_back));
            let (requests, tokens) = (a.0.max(b.0), a.1.max(b.1));
            // No rate is learned from nothing. Calls still in flight count as admitted in a
            // measure (the provider took them), but a run's first measure needs MIN_REPLIES
            // calls in its window that replied: a 429 among the run's first calls says the
            // provider refused, not how fast it refills, however many replies came in before
            // it was read. Later measures need one reply in the last seconds. Otherwise the
            // call backs off, and a later episode measures.
            let paced = state.learned != Rates::default();
            let too_few = if paced {
                state.last_admitted.is_none_or(|at| at < look_back)
            } else {
                a.2.max(b.2) < MIN_REPLIES
            };
            if requests == 0.0 || too_few {
                tracing::debug!(
                    replied = a.2.max(b.2),
                    "a 429 with too few calls admitted to measure: backing off, no rate learned"
                );
                return 0;
            }
            let measured = |admitted: f64| Some((BELOW * admitted).max(MIN_RATE));
            if exhausted != Exhausted::Tokens {
                state.learned.requests = measured(requests);
            }
            if exhausted != Exhausted::Requests {
                state.learned.tokens = measured(tokens);
            }
            if paced {
                state.fast = false;
            }
            state.episode = Some(Instant::now());
            tracing::debug!(requests = ?state.learned.requests, tokens = ?state.learned.tokens, "learned a rate limit");
        }
        let pace = self.in_force(&state);
        pace.requests
            .map_or(0, |r| (r * latency.as_secs_f64() * 1.5).ceil() as usize + 1)
    }

    /// A reply announced its provider's remaining requests and tokens, as they were when its
    /// call (`ticket`) arrived: each announcement narrows what the refill rate can be; pace just
    /// below it, and hold the next call until one more is there.
    pub(crate) fn announced(&self, ticket: Ticket, announced: Announced) {
        if announced == Announced::default() {
            return;
        }
        let mut state = self.state();
        let state = &mut *state;
        let budgets = [announced.requests, announced.tokens];
        let mut hold = None;
        for (at, budget) in budgets.into_iter().enumerate() {
            let Some(budget) = budget else { continue };
            if let Some(seen) = budget.bounds() {
                let bounds = state.bounds[at].map_or(seen, |known| known.and(seen));
                state.bounds[at] = Some(bounds);
                let rate = Some(bounds.rate() * BELOW_ANNOUNCED);
                match at {
                    0 => state.announced.requests = rate,
                    _ => state.announced.tokens = rate,
                }
            }
            let rate = state.bounds[at].map_or(0.0, Bounds::rate);
            hold = hold.max(budget.until(rate));
        }
        if let Some(hold) = hold {
            let until = ticket.at + hold;
            state.next = Some(state.next.map_or(until, |n| n.max(until)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_limit_grows_on_success_and_halves_once_per_429_episode() {
        let limiter = Limiter::new(32, true);
        assert_eq!(limiter.live(Rates::default()).limit, 4);
        // Slow start: one more per success.
        for _ in 0..8 {
            limiter.acquire().await.succeeded();
        }
        assert_eq!(limiter.live(Rates::default()).limit, 12);
        // Three calls in flight meet 429s: one episode, one halving.
        let slots = [
            limiter.acquire().await,
            limiter.acquire().await,
            limiter.acquire().await,
        ];
        for slot in &slots {
            slot.rate_limited(0);
        }
        assert_eq!(limiter.live(Rates::default()).limit, 6);
        drop(slots);
        // Nothing is frozen: the next call starts at once.
        let before = Instant::now();
        let slot = limiter.acquire().await;
        assert_eq!(Instant::now(), before);
        // After slow start: additive increase, about one per limit's worth of successes.
        slot.succeeded();
        drop(slot);
        for _ in 0..6 {
            limiter.acquire().await.succeeded();
        }
        assert_eq!(limiter.live(Rates::default()).limit, 7);
        // A 5xx pauses growth but keeps the limit.
        limiter.acquire().await.failed();
        for _ in 0..20 {
            limiter.acquire().await.succeeded();
        }
        assert_eq!(limiter.live(Rates::default()).limit, 7);
        // A halving never goes below what the learned rate needs in flight.
        tokio::time::advance(Duration::from_millis(1)).await;
        limiter.acquire().await.rate_limited(6);
        assert_eq!(limiter.live(Rates::default()).limit, 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_limit_never_moves_and_waits_are_bounded_by_it() {
        let limiter = Limiter::new(3, false);
        let held = [
            limiter.acquire().await,
            limiter.acquire().await,
            limiter.acquire().await,
        ];
        held[0].rate_limited(0);
        assert_eq!(limiter.live(Rates::default()).limit, 3);
        let waiting = tokio::time::timeout(Duration::from_secs(1), limiter.acquire()).await;
        assert!(waiting.is_err(), "a fourth call waited for a place");
        drop(held);
        assert_eq!(limiter.live(Rates::default()).in_flight, 0);
    }

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
    async fn a_429_before_anything_was_admitted_learns_no_rate() {
        let pacer = Pacer::new(0, 0, true);
        // The run's first calls: four in flight, and the last three refused while the first
        // has not answered yet.
        let mut tickets = Vec::new();
        for _ in 0..4 {
            tickets.push(pacer.wait(10, 10).await);
            tokio::time::advance(Duration::from_millis(10)).await;
        }
        for ticket in tickets.split_off(1) {
            let needed = pacer.limited(ticket, Exhausted::Requests, Duration::from_millis(100));
            assert_eq!(needed, 0);
        }
        assert_eq!(pacer.pace(), Rates::default(), "no pace from nothing admitted");
        // One reply beside a 429 is no rate either (what a run's first second can show).
        let first = pacer.wait(10, 10).await;
        let refused = pacer.wait(10, 10).await;
        pacer.admitted(first, 10, 10);
        pacer.limited(refused, Exhausted::Requests, Duration::from_millis(100));
        assert_eq!(pacer.pace(), Rates::default(), "no pace from one reply");
        // Nor are the run's first calls refused, however many replies came in before their
        // refusals were read: the calls started before them have not replied.
        let pacer = Pacer::new(0, 0, true);
        let mut tickets = Vec::new();
        for _ in 0..8 {
            tickets.push(pacer.wait(10, 10).await);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        tokio::time::advance(Duration::from_millis(300)).await;
        let refused = tickets.drain(1..4).collect::<Vec<_>>();
        for ticket in tickets {
            pacer.admitted(ticket, 10, 10);
        }
        for ticket in refused.into_iter().rev() {
            pacer.limited(ticket, Exhausted::Requests, Duration::from_millis(300));
        }
        assert_eq!(
            pacer.pace(),
            Rates::default(),
            "no pace from the first calls' refusals"
        );
        // Once calls are admitted, the next episode measures them.
        tokio::time::advance(Duration::from_secs(2)).await;
        for _ in 0..10 {
            let ticket = pacer.wait(10, 10).await;
            pacer.admitted(ticket, 10, 10);
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        let ticket = pacer.wait(10, 10).await;
        pacer.limited(ticket, Exhausted::Requests, Duration::from_millis(100));
        let learned = pacer.pace().requests.unwrap();
        assert!(learned > 3.0, "learned {learned}/s from ten calls in a second");
    }

    #[test]
    fn a_429_says_which_limit_it_is() {
        let openai =
            "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000";
        assert_eq!(Exhausted::from_message(openai), Exhausted::Tokens);
        assert_eq!(
            Exhausted::from_message("Rate limit reached for requests"),
            Exhausted::Requests
        );
        assert_eq!(
            Exhausted::from_message("Too Many Requests; tokens exhausted"),
            Exhausted::Unknown
        );
        assert_eq!(Exhausted::from_message("slow down"), Exhausted::Unknown);
    }

    #[test]
    fn announcements_narrow_the_refill_rate_to_the_providers() {
        // Between one and two of 500 used (a level of 498.9 shows as 498), refilled in 240 ms.
        let budget = Allowance {
            limit: 500.0,
            remaining: 498.0,
            reset: Duration::from_millis(240),
        };
        let bounds = budget.bounds().unwrap();
        assert!((bounds.low - 1.0 / 0.24).abs() < 1e-9 && (bounds.high - 2.0 / 0.24).abs() < 1e-9);
        assert_eq!(budget.until(bounds.rate()), None, "498 left: no wait");
        // A full budget says nothing; one seen only nearly full is paced on its high bound.
        let full = Allowance {
            limit: 5.0,
            remaining: 5.0,
            reset: Duration::ZERO,
        };
        assert_eq!(full.bounds(), None);
        let nearly = Allowance {
            limit: 5.0,
            remaining: 4.0,
            reset: Duration::from_millis(50),
        };
        assert_eq!(nearly.bounds().unwrap().rate(), 20.0);
        // A bucket of 5 refilled at 20 a second, seen at levels between 0 and 2: each
        // announcement alone is up to a quarter off; together they close on 20.
        let mut known: Option<Bounds> = None;
        for level in [0.1, 0.35, 0.6, 0.85, 1.2, 1.95] {
            let seen = Allowance {
                limit: 5.0,
                remaining: f64::floor(level),
                reset: Duration::from_secs_f64((5.0 - level) / 20.0),
            };
            let seen = seen.bounds().unwrap();
            assert!(seen.low <= 20.0 && 20.0 <= seen.high, "{seen:?}");
            known = Some(known.map_or(seen, |k| k.and(seen)));
        }
        let rate = known.unwrap().rate();
        assert!((rate - 20.0).abs() < 0.5, "{rate}");
        // The limit doubled: the bounds start again from what the provider says now.
        let doubled = Bounds {
            low: 38.0,
            high: 42.0,
        };
        assert_eq!(known.unwrap().and(doubled), doubled);
        // Empty at a level of 0.5 (4.5 used, 225 ms to full at 20 a second): the next unit
        // is there in 25 ms.
        let empty = Allowance {
            limit: 5.0,
            remaining: 0.0,
            reset: Duration::from_millis(225),
        };
        let wait = empty.until(20.0).unwrap();
        assert!((wait.as_secs_f64() - 0.025).abs() < 1e-9, "{wait:?}");
    }

    /// A provider in virtual time: a token bucket of `rate` a second holding `burst`, which
    /// answers 429 when empty and otherwise after `latency`.
    struct Bucket {
        rate: f64,
        burst: f64,
        level: f64,
        at: Instant,
    }

    impl Bucket {
        fn take(&mut self, amount: f64) -> bool {
            let now = Instant::now();
            self.level = (self.level + (now - self.at).as_secs_f64() * self.rate).min(self.burst);
            self.at = now;
            if self.level >= amount {
                self.level -= amount;
                true
            } else {
                false
            }
        }
    }

    /// Drives `calls` calls of `tokens` through a limiter and pacer against a bucket (of
    /// requests, or of tokens when `by_tokens`), each 429 retried after a second; the goodput
    /// (admitted per second over the rate) and the share of calls that drew a 429. With
    /// `announce`, every reply announces the bucket as OpenAI's headers do (its level rounded
    /// down, the time to full rounded up to a millisecond).
    async fn drive(
        calls: usize,
        tokens: u64,
        latency: Duration,
        by_tokens: bool,
        rate: f64,
        burst: f64,
        announce: bool,
    ) -> (f64, f64) {
        use std::sync::Arc;
        let limiter = Arc::new(Limiter::new(16, true));
        let pacer = Arc::new(Pacer::new(0, 0, true));
        let bucket = Arc::new(Mutex::new(Bucket {
            rate,
            burst,
            level: burst,
            at: Instant::now(),
        }));
        let limited = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        let queue = Arc::new(tokio::sync::Semaphore::new(32));
        for _ in 0..calls {
            let (limiter, pacer, bucket, limited, queue) = (
                limiter.clone(),
                pacer.clone(),
                bucket.clone(),
                limited.clone(),
                queue.clone(),
            );
            tasks.spawn(async move {
                let _turn = queue.acquire().await;
                loop {
                    let slot = limiter.acquire().await;
                    let ticket = pacer.wait(tokens, 0).await;
                    let amount = if by_tokens { tokens as f64 } else { 1.0 };
                    let (admitted, announced) = {
                        let mut bucket = bucket.lock().unwrap();
                        let admitted = bucket.take(amount);
                        let reset = ((bucket.burst - bucket.level) / bucket.rate * 1000.0).ceil();
                        let allowance = Allowance {
                            limit: bucket.burst,
                            remaining: bucket.level.floor(),
                            reset: Duration::from_millis(reset as u64),
                        };
                        (
                            admitted,
                            Announced {
                                requests: Some(allowance),
                                tokens: None,
                            },
                        )
                    };
                    if announce {
                        pacer.announced(ticket, announced);
                    }
                    if admitted {
                        tokio::time::sleep(latency).await;
                        pacer.admitted(ticket, tokens, tokens);
                        slot.succeeded();
                        return;
                    }
                    limited.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let exhausted = if by_tokens {
                        Exhausted::Tokens
                    } else {
                        Exhausted::Requests
                    };
                    let needed = pacer.limited(ticket, exhausted, latency);
                    slot.rate_limited(needed);
                    drop(slot);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        let seconds = (Instant::now() - start).as_secs_f64();
        let admitted = if by_tokens {
            (calls as u64 * tokens) as f64
        } else {
            calls as f64
        };
        let share = limited.load(std::sync::atomic::Ordering::Relaxed) as f64 / calls as f64;
        (admitted / seconds / rate, share)
    }

    #[tokio::test(start_paused = true)]
    async fn an_untold_rate_limit_is_found_and_used_almost_whole() {
        // 20 requests a second, a burst of 5, instant replies.
        let (goodput, share) = drive(1500, 10, Duration::from_millis(1), false, 20.0, 5.0, false).await;
        eprintln!("goodput {goodput:.3}, 429s per call {share:.3}");
        assert!(goodput >= 0.9, "goodput {goodput:.3}");
        // The same with 300 ms replies.
        let (goodput, share) = drive(1500, 10, Duration::from_millis(300), false, 20.0, 5.0, false).await;
        eprintln!("goodput {goodput:.3}, 429s per call {share:.3}");
        assert!(goodput >= 0.9, "goodput {goodput:.3}");
        // 20,000 tokens a second, 2,000 a call, a burst of 10,000.
        let (goodput, share) = drive(
            600,
            2000,
            Duration::from_millis(200),
            true,
            20_000.0,
            10_000.0,
            false,
        )
        .await;
        eprintln!("goodput {goodput:.3}, 429s per call {share:.3}");
        assert!(goodput >= 0.9, "goodput {goodput:.3}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_announced_rate_limit_is_paced_to_with_few_429s() {
        // 20 requests a second, a burst of 5, 300 ms replies that announce the bucket.
        let (goodput, share) = drive(1500, 10, Duration::from_millis(300), false, 20.0, 5.0, true).await;
        eprintln!("goodput {goodput:.3}, 429s per call {share:.3}");
        assert!(goodput >= 0.93, "goodput {goodput:.3}");
        assert!(share <= 0.01, "429s per call {share:.3}");
        // A large budget (600 a minute, 10 a second), instant replies.
        let (goodput, share) = drive(600, 10, Duration::from_millis(1), false, 10.0, 600.0, true).await;
        eprintln!("goodput {goodput:.3}, 429s per call {share:.3}");
        assert!(share <= 0.01, "429s per call {share:.3}");
    }
}
