//! Every number the pacer, the limiter and a model request's retries are tuned by, in one
//! value: what each is and why is said beside it. The simulator (`testkit::simulate`) runs
//! the controllers these tune against simulated servers; docs/guide/models.md gives the
//! comparison with a plain AIMD controller that keeps them.

use std::time::Duration;

/// The tuning of an endpoint's controllers.
pub(crate) struct Tuning {
    /// The pace (requests and tokens a second) learned from 429s and announced budgets.
    pub pacer: PacerTuning,
    /// The live limit on calls in flight, found from latency.
    pub limiter: LimiterTuning,
    /// The start of an endpoint on this machine or its network.
    pub local: LocalTuning,
    /// A model request's retries and how long an endpoint waits.
    pub retry: RetryTuning,
}

/// The tuning of the pace (requests and tokens a second) learned from 429s and announced budgets.
pub(crate) struct PacerTuning {
    /// The pace is this share of the rate the provider admitted (or announced).
    pub below: f64,
    pub below_announced: f64,
    /// After a measure, the pace holds this many rounds (`round`), then grows by `probe_start` a
    /// round, a growth that doubles each round calls keep waiting on the pace, up to `probe_max`.
    pub probe_hold: f64,
    pub probe_hold_first: f64,
    /// A measure at least this share of the pace it ends agrees with the last; the hold doubles
    /// with each in a row that agrees, up to this many times.
    pub steady: f64,
    pub steady_doublings: u32,
    pub probe_start: f64,
    pub probe_max: f64,
    /// A provisional pace (from the run's first 429, before anything measured) grows fourfold a
    /// round until the next 429 measures.
    pub probe_provisional: f64,
    /// The recent measure spans at least this long, and ten calls (it guards the measure since the
    /// anchor, which reads low when the provider's bucket overflowed while gacc paced below it).
    pub recent: Duration,
    /// The most moments the bucket was empty (`empty_at`) kept between measures.
    pub max_empty_at: usize,
    /// How finely providers announce when their budget is full again.
    pub reset_resolution: Duration,
    /// How late a turn may be taken and still count from when it was due.
    pub catch_up: Duration,
    /// The pace a refused call started at counts up to this many times the measure.
    pub trust_pace: f64,
    /// After a measure that a pace held above the rate halved, the pace tried is this share of it.
    pub overshot: f64,
    /// A measure spans at least this long.
    pub min_span: Duration,
    /// What the pacer remembers of the calls it started.
    pub history: Duration,
    /// A learned rate never falls below one request (or token) a minute.
    pub min_rate: f64,
    /// A measure needs at least this many calls admitted since the moment it starts from (replied,
    /// or in flight: a refusal comes back sooner than an answer, so a call sent before the refused
    /// one and not refused yet was taken): too few say the provider refused, not how fast it
    /// refills, and the call only backs off.
    pub min_admitted: usize,
    /// A measure after the first spans at least this many admitted calls.
    pub measured: usize,
    /// The longest a call waits on an announced budget before it is tried again (a 429 corrects a
    /// budget read too high).
    pub max_announced_wait: Duration,
    /// An announcement holds calls for a minute at most, whatever its `reset` says.
    pub max_announced_hold: Duration,
    /// Growth needs calls that waited on the pace this recently.
    pub pressure: Duration,
}

/// The tuning of the live limit on calls in flight, found from latency.
pub(crate) struct LimiterTuning {
    /// The live limit a run starts from (below the ceiling).
    pub start: usize,
    /// Growth per reply while the endpoint is being found, and after.
    pub startup_growth: f64,
    pub growth: f64,
    /// Latency over the unloaded latency: below this the limit may grow; above `cut_above` it is
    /// cut toward `settle`.
    pub grow_below: f64,
    pub cut_above: f64,
    pub settle: f64,
    /// How far past what replies have shown the server to hold at speed the start may grow.
    pub validated_room: usize,
    /// The first round trip's room: where replies are steady, the first that shows the start's
    /// calls answered at speed lets the limit grow to this many times them at once (4 → 64).
    pub first_room: usize,
    /// After that jump, the room past what replies have shown (the server may be full already).
    pub room_after_jump: usize,
    /// The jump saves round trips, which matter only when they are long (a model generating
    /// tokens); a server that answers faster is found in milliseconds without it, and a rate
    /// limit that answers at once is not sent a burst it would refuse.
    pub jump_above: Duration,
    /// Room over what the server held usefully when the start ends.
    pub exit_room: f64,
    /// A callback's latency is averaged over the last `recent` and `long` replies, and its unloaded
    /// latency known after `known` (three, where they are steady).
    pub recent: f64,
    pub long: f64,
    pub known: u32,
    /// Replies whose latency varies by less than this (relative standard deviation) are steady.
    pub steady: f64,
    /// How long growth pauses after a 5xx or a timeout.
    pub growth_pause: Duration,
    /// How long a 429 is taken to come back before one has.
    pub refusal_unknown: Duration,
    /// The window throughput is counted over.
    pub throughput_window: Duration,
}

/// The tuning of the start of an endpoint on this machine or its network.
pub(crate) struct LocalTuning {
    /// Replies with two calls in the server over replies sent alone, in the mean (geometric):
    /// below this the server computes several at once (two at once: 1; one at a time: 2), where
    /// replies are steady; where they vary, below `parallel_varied` after `verdict_after` replies.
    pub parallel_below: f64,
    pub parallel_varied: f64,
    pub verdict_after: u32,
    /// Calls sent alone whose latencies vary by less than this (relative) are steady.
    pub steady: f64,
    /// Replies at two between calls sent alone.
    pub probe_every: u32,
    /// The log ratios are averaged over about this many recent replies.
    pub recent: f64,
}

/// The tuning of a model request's retries and how long an endpoint waits.
pub(crate) struct RetryTuning {
    pub model_backoff_base: Duration,
    /// How long one call keeps waiting on a provider's rate limits before it fails.
    pub rate_limit_patience: Duration,
    pub max_rate_limited: u32,
    /// How long an endpoint keeps trying to connect, nothing answering, before it stops: a closed
    /// port, a name that does not resolve or a failed TLS handshake is the commonest first mistake,
    /// a local server that exited the commonest mid-run, and every later call would meet either.
    pub unreachable_patience: Duration,
    /// The longest wait between connection attempts while the endpoint has never answered.
    pub unreachable_backoff: Duration,
    pub model_backoff_max: Duration,
    /// The longest backoff of a 429 the provider gave no longer `Retry-After` for.
    pub limited_backoff_max: Duration,
}

/// gacc's tuning.
pub(crate) const TUNING: Tuning = Tuning {
    pacer: PacerTuning {
        below: 0.98,
        below_announced: 0.97,
        probe_hold: 1.5,
        probe_hold_first: 0.5,
        steady: 0.95,
        steady_doublings: 2,
        probe_start: 0.05,
        probe_max: 1.0,
        probe_provisional: 3.0,
        recent: Duration::from_millis(500),
        max_empty_at: 64,
        reset_resolution: Duration::from_millis(1),
        catch_up: Duration::from_millis(5),
        trust_pace: 1.3,
        overshot: 0.9,
        min_span: Duration::from_millis(10),
        history: Duration::from_secs(120),
        min_rate: 1.0 / 60.0,
        min_admitted: 3,
        measured: 10,
        max_announced_wait: Duration::from_secs(1),
        max_announced_hold: Duration::from_secs(60),
        pressure: Duration::from_secs(1),
    },
    limiter: LimiterTuning {
        start: 4,
        startup_growth: 4.0,
        growth: 0.25,
        grow_below: 1.2,
        cut_above: 1.6,
        settle: 1.3,
        validated_room: 3,
        first_room: 16,
        room_after_jump: 2,
        jump_above: Duration::from_millis(50),
        exit_room: 1.15,
        recent: 32.0,
        long: 256.0,
        known: 16,
        steady: 0.1,
        growth_pause: Duration::from_secs(5),
        refusal_unknown: Duration::from_millis(100),
        throughput_window: Duration::from_secs(5),
    },
    local: LocalTuning {
        parallel_below: std::f64::consts::SQRT_2,
        parallel_varied: 1.25,
        verdict_after: 6,
        steady: 0.1,
        probe_every: 4,
        recent: 16.0,
    },
    retry: RetryTuning {
        model_backoff_base: Duration::from_millis(500),
        rate_limit_patience: Duration::from_secs(15 * 60),
        max_rate_limited: 1000,
        unreachable_patience: Duration::from_secs(4),
        unreachable_backoff: Duration::from_secs(1),
        model_backoff_max: Duration::from_secs(60),
        limited_backoff_max: Duration::from_secs(4),
    },
};
