//! How many calls an endpoint has in flight (SPEC §8, "Concurrency"). The `Limiter` finds it,
//! `max_concurrency` being only a ceiling. It grows while calls wait for a place and latency holds:
//! by four per reply at first (five times as many a round trip, so a server that batches hundreds
//! of sequences is full within a few round trips), then by a quarter per reply. The start ends at
//! the first reply slower than the unloaded latency allows, and the limit goes back to what the
//! server holds usefully (Little's law). Latency is compared per callback with the least it has
//! been (its unloaded latency), so a server whose batch is full shows itself by latency that rises
//! without throughput: past `TUNING.limiter.grow_below` times the unloaded latency growth stops,
//! past `TUNING.limiter.cut_above` the limit is cut back toward `TUNING.limiter.settle` (once per
//! round trip). A 429 halves it once per episode, never below the calls in flight the learned pace
//! needs (pace × latency); a 5xx or a timeout pauses growth. While calls wait on the pace rather
//! than for a place, the limit does not grow: the pace, not the limit, holds them back.

mod local;
mod slot;

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::parallel::Locked;

use super::pacer::Rates;
use crate::exec::model::tuning::TUNING;

pub(crate) use local::is_local;
pub(crate) use slot::Slot;

/// The live concurrency limit of one endpoint.
#[derive(Debug)]
pub(crate) struct Limiter {
    max: usize,
    adaptive: bool,
    /// One permit per place under the limit; a lowered limit forgets permits as they return.
    places: Semaphore,
    /// Calls waiting for a place.
    waiting: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    limit: usize,
    /// Permits to forget as they come back (the limit was lowered while they were held).
    debt: usize,
    /// Growth not yet a whole place.
    credit: f64,
    in_flight: usize,
    /// Calls holding a place that wait on the pace.
    pacing: usize,
    /// Until latency or a 429 first says the server is full, growth is fast.
    startup: bool,
    hold_growth_until: Option<Instant>,
    /// Calls sent before this instant belong to the last cut (a 429 episode or a latency cut):
    /// what they say does not cut again.
    cut_at: Option<Instant>,
    rate_limited: u64,
    /// Each callback's latency: recent (a moving average) and the least that average has been.
    latency: HashMap<String, Latency>,
    /// Seconds of a reply of any callback, a moving average (0 before the first): how long the
    /// calls in flight a pace needs are counted to take.
    mean: f64,
    /// Recent latency over unloaded latency, a moving average over part of a round trip, and
    /// the last reply's.
    load: f64,
    last_ratio: f64,
    /// What the server holds usefully (Little's law: the calls in the server as a reply's
    /// call was sent, over its latency ratio), a moving average as `load` is.
    useful: f64,
    /// The most calls in the server a reply answered at speed has shown (during the start).
    validated: usize,
    /// The start jumped to `TUNING.limiter.first_room` times its calls.
    jumped: bool,
    /// Replies in the current and the last throughput windows.
    replies: [u64; 2],
    window_start: Option<Instant>,
    /// The most calls in flight at once.
    peak: usize,
    /// When each call in the server (past the pace) was sent, with how many sent then.
    in_server: std::collections::BTreeMap<Instant, usize>,
    /// How many calls that map holds.
    in_server_count: usize,
    /// How long a 429 takes to come back (the longest lately).
    refusal: Duration,
    /// For a server on this machine or its network: the queue its replies show (`local`).
    local: Option<local::Local>,
}

#[derive(Debug, Clone, Copy)]
struct Latency {
    /// The mean over the last `TUNING.limiter.recent` replies (all of them, before), and over the
    /// last `TUNING.limiter.long`.
    mean: f64,
    long: f64,
    replies: u32,
    /// The least the long mean has been once `TUNING.limiter.known` replies were in it: the unloaded latency.
    least: f64,
    /// The mean squared deviation of a reply from that mean, relative to it.
    spread: f64,
}

/// What one reply says of the load.
#[derive(Debug, Clone, Copy)]
struct Reading {
    /// The moving average of latency over unloaded latency.
    load: f64,
    /// This reply's.
    ratio: f64,
    /// How far the replies' own spread moves that average.
    slack: f64,
    /// Whether replies vary little enough that one reply's latency says the server is full.
    steady: bool,
}

/// What the progress line and `run.json` show of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Live {
    pub limit: usize,
    pub in_flight: usize,
    pub peak: usize,
    pub rate_limited: u64,
    /// Replies a second over the last few seconds.
    pub throughput: f64,
    /// Recent latency over unloaded latency.
    pub load: f64,
    /// The pace in force: learned, announced or set, per second.
    pub pace: Rates,
}

impl Limiter {
    pub(crate) fn new(max: usize, adaptive: bool) -> Limiter {
        Limiter::starting_at(max, adaptive, TUNING.limiter.start, true, None)
    }

    /// A limiter for a server on this machine or its network (`local`): it starts from one
    /// call, and finds whether the server computes one request at a time before more.
    pub(crate) fn local(max: usize, adaptive: bool) -> Limiter {
        Limiter::starting_at(max, adaptive, 1, true, Some(local::Local::default()))
    }

    /// A limiter that starts from the limit an earlier run `ended` on, less the room that
    /// limit keeps over what the server held usefully (the first round trip's replies then
    /// show the server's unloaded latency, not a loaded one taken for it), and grows from there
    /// as after a start: slowly.
    pub(crate) fn resuming(max: usize, adaptive: bool, ended: usize) -> Limiter {
        Limiter::starting_at(
            max,
            adaptive,
            (ended as f64 / TUNING.limiter.settle).floor() as usize,
            false,
            None,
        )
    }

    fn starting_at(
        max: usize,
        adaptive: bool,
        start: usize,
        startup: bool,
        local: Option<local::Local>,
    ) -> Limiter {
        let max = max.max(1);
        let floor = if local.is_some() { 1 } else { TUNING.limiter.start };
        let start = if adaptive { max.min(start.max(floor)) } else { max };
        Limiter {
            max,
            adaptive,
            places: Semaphore::new(start),
            waiting: AtomicUsize::new(0),
            state: Mutex::new(State {
                limit: start,
                debt: 0,
                credit: 0.0,
                in_flight: 0,
                pacing: 0,
                startup: adaptive && startup,
                hold_growth_until: None,
                cut_at: None,
                rate_limited: 0,
                latency: HashMap::new(),
                mean: 0.0,
                load: 1.0,
                last_ratio: 1.0,
                useful: 0.0,
                validated: 0,
                jumped: false,
                replies: [0, 0],
                window_start: None,
                peak: 0,
                in_server: std::collections::BTreeMap::new(),
                in_server_count: 0,
                refusal: TUNING.limiter.refusal_unknown,
                local,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.locked()
    }

    /// Waits for a place under the live limit, which is at least `needed` (see `keep_up`).
    pub(crate) async fn acquire(&self, needed: usize) -> Slot<'_> {
        self.keep_up(needed);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        // The semaphore is never closed; were it, the call would go on without a place.
        let permit = self.places.acquire().await.ok();
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        let mut state = self.state();
        state.in_flight += 1;
        state.peak = state.peak.max(state.in_flight);
        Slot {
            limiter: self,
            permit,
            sent: Instant::now(),
            in_server: false,
            company: state.in_flight,
        }
    }

    /// The live limit, calls in flight, throughput and 429 count; the pace is the pacer's.
    pub(crate) fn live(&self, pace: Rates) -> Live {
        let mut state = self.state();
        let throughput = state.throughput(Instant::now());
        Live {
            limit: state.limit,
            in_flight: state.in_flight,
            peak: state.peak,
            rate_limited: state.rate_limited,
            throughput,
            load: state.load,
            pace,
        }
    }

    /// Moves the limit to `target` (within 1 and the ceiling): new permits, or permits
    /// forgotten now and as they come back.
    fn set_limit(&self, state: &mut State, target: usize) {
        let target = target.clamp(1, self.max);
        if target > state.limit {
            let more = target - state.limit;
            let repaid = more.min(state.debt);
            state.debt -= repaid;
            self.places.add_permits(more - repaid);
        } else if target < state.limit {
            let fewer = state.limit - target;
            let forgotten = self.places.forget_permits(fewer);
            state.debt += fewer - forgotten;
        }
        state.limit = target;
    }

    /// Raises the limit to `needed`, the calls in flight the pace in force wants (pace ×
    /// latency, with room): with a pace, the pace holds calls back, not the limit. Called as
    /// calls start, and as the pace lets one go (it may have grown).
    pub(crate) fn keep_up(&self, needed: usize) {
        if self.adaptive && needed > 0 {
            let mut state = self.state();
            if needed > state.limit {
                self.set_limit(&mut state, needed);
            }
        }
    }

    /// How long the oldest call in the server has been there: a floor on its latency before
    /// any reply says what it is.
    /// The latency the pace's calls in flight are counted with: the mean of replies, and at
    /// least the age of the oldest call in the server (before any reply says what it is).
    pub(crate) fn pace_latency(&self) -> Duration {
        let mean = Duration::from_secs_f64(self.state().mean);
        mean.max(self.oldest())
    }

    fn oldest(&self) -> Duration {
        let state = self.state();
        state
            .in_server
            .keys()
            .next()
            .map_or(Duration::ZERO, |sent| sent.elapsed())
    }

    /// Whether calls wait for a place rather than on the pace: only then would more places
    /// start more calls.
    fn bound(&self, state: &State) -> bool {
        self.waiting.load(Ordering::Relaxed) > 0 && state.pacing <= 1
    }
}

impl State {
    /// Counts a reply, and returns its latency over its callback's unloaded latency.
    /// Counts a reply of `class` after `latency`, sent with `company` calls in the server.
    /// A reply to a call sent before the last cut describes the load before it (and, after a
    /// cut, the slowest calls are the last to come back): it does not move the load average.
    fn observe(
        &mut self,
        class: &str,
        latency: Duration,
        company: usize,
        now: Instant,
        current: bool,
    ) -> Reading {
        self.count_reply(now);
        let seconds = latency.as_secs_f64().max(1e-6);
        let seen = self.latency.entry(class.to_owned()).or_insert(Latency {
            mean: seconds,
            long: seconds,
            replies: 0,
            least: f64::INFINITY,
            spread: 0.0,
        });
        // The spread before this reply: what this one is measured against.
        let spread = seen.spread.sqrt();
        let steady = seen.replies >= 3 && spread < TUNING.limiter.steady;
        seen.replies += 1;
        let first = 1.0 / f64::from(seen.replies);
        let deviation = seconds / seen.mean - 1.0;
        let recent = first.max(1.0 / TUNING.limiter.recent);
        seen.spread = (1.0 - recent) * seen.spread + recent * deviation * deviation;
        seen.mean = (1.0 - recent) * seen.mean + recent * seconds;
        let long = first.max(1.0 / TUNING.limiter.long);
        seen.long = (1.0 - long) * seen.long + long * seconds;
        // The least the long mean has been, each time raised by how far it may be below the
        // true mean with the replies it holds (two standard errors): noise alone does not
        // drag it down.
        let held = f64::from(seen.replies).min(TUNING.limiter.long);
        let unsure = 2.0 * seen.spread.sqrt() / held.sqrt();
        if seen.replies >= TUNING.limiter.known
            || (seen.replies >= 3 && seen.spread.sqrt() < TUNING.limiter.steady)
        {
            seen.least = seen.least.min(seen.long * (1.0 + unsure));
        }
        // Until a callback's unloaded latency is known, its replies say nothing of load.
        let ratio = if seen.least.is_finite() {
            seconds / seen.least
        } else {
            1.0
        };
        // A quarter of a round trip's replies (the limit's worth) within 8 and 32: a full
        // batch shows within the round trip that filled it.
        let weight = if current {
            1.0 / (self.limit as f64 / 4.0).clamp(8.0, 32.0)
        } else {
            0.0
        };
        self.load = (1.0 - weight) * self.load + weight * ratio;
        self.last_ratio = ratio;
        let useful = company as f64 / ratio.max(1.0);
        self.useful = if self.useful == 0.0 && current {
            useful
        } else {
            (1.0 - weight) * self.useful + weight * useful
        };
        Reading {
            load: self.load,
            ratio,
            // What the replies' own spread moves the load average by (two standard deviations
            // of a moving average of this weight): only a rise past it is the server's doing.
            slack: 2.0 * spread * (weight / (2.0 - weight)).sqrt(),
            steady,
        }
    }

    fn count_reply(&mut self, now: Instant) {
        let start = *self.window_start.get_or_insert(now);
        let windows = ((now - start).as_secs_f64() / TUNING.limiter.throughput_window.as_secs_f64()) as u32;
        if windows >= 2 {
            self.replies = [0, 0];
            self.window_start = Some(now);
        } else if windows == 1 {
            self.replies = [0, self.replies[0]];
            self.window_start = Some(start + TUNING.limiter.throughput_window);
        }
        self.replies[0] += 1;
    }

    /// Replies a second: the last full window and what of the current one has passed.
    fn throughput(&mut self, now: Instant) -> f64 {
        let Some(start) = self.window_start else {
            return 0.0;
        };
        let into = (now - start).as_secs_f64();
        let window = TUNING.limiter.throughput_window.as_secs_f64();
        if into >= 2.0 * window {
            return 0.0;
        }
        if into >= window {
            return self.replies[0] as f64 / into.max(window);
        }
        (self.replies[0] + self.replies[1]) as f64 / (into + window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RTT: Duration = Duration::from_millis(100);

    /// A call that waits for a place while `others` wait too, and is answered after `latency`.
    async fn reply(limiter: &Limiter, latency: Duration) {
        let mut slot = limiter.acquire(0).await;
        // Sent with the limit's worth of calls in the server.
        slot.company = limit(limiter);
        tokio::time::advance(latency).await;
        slot.succeeded("reader", latency);
    }

    fn limit(limiter: &Limiter) -> usize {
        limiter.live(Rates::default()).limit
    }

    #[tokio::test(start_paused = true)]
    async fn the_limit_grows_only_while_calls_wait_for_a_place() {
        let limiter = Limiter::new(1024, true);
        assert_eq!(limit(&limiter), TUNING.limiter.start);
        // Nobody waits: answers alone grow nothing.
        for _ in 0..10 {
            reply(&limiter, RTT).await;
        }
        assert_eq!(limit(&limiter), TUNING.limiter.start);
        // A call waiting for a place: the first reply that shows the start's calls answered at
        // speed (steady replies) makes it `TUNING.limiter.first_room` times the start; each after grows it by
        // `TUNING.limiter.startup_growth`.
        limiter.waiting.fetch_add(1, Ordering::Relaxed);
        reply(&limiter, RTT).await;
        assert_eq!(limit(&limiter), TUNING.limiter.start * TUNING.limiter.first_room);
        for _ in 0..9 {
            reply(&limiter, RTT).await;
        }
        let grown =
            TUNING.limiter.start * TUNING.limiter.first_room + 9 * TUNING.limiter.startup_growth as usize;
        assert_eq!(limit(&limiter), grown);
        // Calls waiting on the pace hold their places: the limit does not grow then.
        let mut pacing = limiter.acquire(0).await;
        let mut also = limiter.acquire(0).await;
        let both = async {
            tokio::join!(
                pacing.pace(tokio::time::sleep(Duration::from_secs(1))),
                also.pace(tokio::time::sleep(Duration::from_secs(1))),
                async {
                    tokio::task::yield_now().await;
                    for _ in 0..5 {
                        reply(&limiter, RTT).await;
                    }
                }
            )
        };
        both.await;
        assert_eq!(limit(&limiter), grown);
        limiter.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    #[tokio::test(start_paused = true)]
    async fn only_slow_steady_replies_let_the_start_jump() {
        for (latency, jumped) in [(RTT, true), (Duration::from_millis(5), false)] {
            let limiter = Limiter::new(1024, true);
            for _ in 0..4 {
                reply(&limiter, latency).await;
            }
            limiter.waiting.fetch_add(1, Ordering::Relaxed);
            reply(&limiter, latency).await;
            let expected = if jumped {
                TUNING.limiter.start * TUNING.limiter.first_room
            } else {
                TUNING.limiter.start + TUNING.limiter.startup_growth as usize
            };
            assert_eq!(limit(&limiter), expected, "replies of {latency:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn latency_past_the_unloaded_cuts_once_a_round_trip_and_stops_growth() {
        let limiter = Limiter::new(1024, true);
        limiter.waiting.fetch_add(1, Ordering::Relaxed);
        for _ in 0..40 {
            reply(&limiter, RTT).await;
        }
        let grown = limit(&limiter);
        assert_eq!(
            grown,
            TUNING.limiter.start + 40 * TUNING.limiter.startup_growth as usize
        );
        // The server is past full: replies sent with the whole limit in the server take three
        // times as long. The first ends the start: the limit goes back to what the server held
        // usefully (a third of those calls), with room, once: the replies sent before the cut
        // say nothing more.
        let mut slots: Vec<_> = futures_lite(&limiter, 30).await;
        for slot in &mut slots {
            slot.company = grown;
            slot.succeeded("reader", RTT * 3);
        }
        let cut = limit(&limiter);
        assert_eq!(
            cut,
            (grown as f64 / 3.0 * TUNING.limiter.exit_room).ceil() as usize,
            "{grown} → {cut}"
        );
        drop(slots);
        // Past the start, a round trip of slow replies cuts toward what the server holds
        // usefully, and only once.
        let mut slots: Vec<_> = futures_lite(&limiter, 40).await;
        for slot in &mut slots {
            slot.company = cut;
            slot.succeeded("reader", RTT * 2);
        }
        let again = limit(&limiter);
        assert!(again < cut && again >= cut / 2, "{cut} → {again}");
        drop(slots);
        // A slow callback of its own class is not load: its unloaded latency is its own.
        for _ in 0..20 {
            tokio::time::advance(Duration::from_millis(1)).await;
            let mut slot = limiter.acquire(0).await;
            slot.succeeded("compressor", RTT * 50);
        }
        assert!(
            limiter.live(Rates::default()).load < TUNING.limiter.cut_above,
            "{:?}",
            limiter.live(Rates::default())
        );
        limiter.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// `n` places, taken one after another a millisecond apart.
    async fn futures_lite(limiter: &Limiter, n: usize) -> Vec<Slot<'_>> {
        let mut slots = Vec::new();
        for _ in 0..n {
            slots.push(limiter.acquire(0).await);
            tokio::time::advance(Duration::from_millis(1)).await;
        }
        slots
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_episode_halves_once_never_below_what_the_pace_needs() {
        let limiter = Limiter::new(128, true);
        limiter.waiting.fetch_add(1, Ordering::Relaxed);
        for _ in 0..16 {
            reply(&limiter, RTT).await;
        }
        assert_eq!(
            limit(&limiter),
            TUNING.limiter.start + 16 * TUNING.limiter.startup_growth as usize
        );
        let slots = futures_lite(&limiter, 3).await;
        for slot in &slots {
            slot.rate_limited(0, Duration::ZERO);
        }
        assert_eq!(
            limit(&limiter),
            (TUNING.limiter.start + 16 * TUNING.limiter.startup_growth as usize) / 2,
            "three 429s of one episode halve once"
        );
        drop(slots);
        tokio::time::advance(Duration::from_millis(1)).await;
        limiter.acquire(0).await.rate_limited(20, Duration::ZERO);
        assert_eq!(limit(&limiter), 20, "never below what the pace needs");
        // A lowered limit holds: 20 places and no more, though more permits were out.
        let held = futures_lite(&limiter, 20).await;
        let more = tokio::time::timeout(Duration::from_secs(1), limiter.acquire(0)).await;
        assert!(more.is_err(), "a 21st call waited");
        drop(held);
        assert_eq!(limiter.live(Rates::default()).in_flight, 0);
        limiter.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_limit_never_moves() {
        let limiter = Limiter::new(3, false);
        let mut held = futures_lite(&limiter, 3).await;
        held[0].rate_limited(0, Duration::ZERO);
        held[1].succeeded("reader", RTT * 10);
        assert_eq!(limit(&limiter), 3);
        let waiting = tokio::time::timeout(Duration::from_secs(1), limiter.acquire(0)).await;
        assert!(waiting.is_err(), "a fourth call waited for a place");
        drop(held);
        assert_eq!(limiter.live(Rates::default()).in_flight, 0);
    }
}
