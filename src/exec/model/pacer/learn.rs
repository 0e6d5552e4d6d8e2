//! What a 429 and a reply's announced limits teach a pacer: a 429 measures the rate the
//! provider admitted since the last one (or, the run's first, gives a provisional pace), and
//! each announcement bounds the refill rate from both sides.

use std::time::Duration;

use tokio::time::Instant;

use super::{Heard, PaceState, Pacer, Rates, Sent, Ticket, round};
use crate::exec::model::tuning::TUNING;
use crate::providers::{Allowance, Announced, Exhausted};

impl Allowance {
    /// What this one announcement says of the refill rate. `remaining` is the level rounded
    /// down, so between `limit - remaining - 1` and `limit - remaining` were used, and they
    /// refill in `reset`: the rate lies between the two over `reset`. A full budget says nothing.
    /// Providers round `reset` up to a millisecond: the refill took between `reset` less a
    /// millisecond and `reset`, and a reset of a millisecond bounds nothing.
    fn bounds(&self) -> Option<Bounds> {
        let used = self.limit - self.remaining;
        let seconds = self.reset.as_secs_f64();
        let shortest = seconds - TUNING.pacer.reset_resolution.as_secs_f64();
        (used >= 1.0 && shortest > 0.0).then(|| Bounds {
            low: (used - 1.0) / seconds,
            high: used / shortest,
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
pub(super) struct Bounds {
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

impl Pacer {
    /// A new episode's measure. Two spans end at the refused call: since the last anchor
    /// (exact, the bucket empty at both ends, unless it overflowed while gacc paced below the
    /// rate: then low) and the last `TUNING.pacer.recent` of it (high by what the bucket held when it
    /// began, over its length). The higher, paced just below, wastes neither: a high one is corrected by the
    /// 429 it soon draws. With no anchor yet (the run's first 429), or too few replies since,
    /// nothing is learned: the call backs off and the anchor stays.
    pub(super) fn measure(&self, state: &mut PaceState, ticket: Ticket, exhausted: Exhausted) {
        if state.empty_at.is_empty() {
            provisional(state, ticket, exhausted);
            return;
        }
        // Calls and tokens a second admitted from `from` until the refused call, and how
        // many calls that is.
        let admitted = |from: Instant| {
            let span = ticket
                .at
                .saturating_duration_since(from)
                .max(TUNING.pacer.min_span)
                .as_secs_f64();
            let (count, tokens) = state
                .history
                .iter()
                .filter(|sent| sent.at >= from && sent.at < ticket.at)
                .filter(|sent| sent.heard != Heard::Limited)
                .fold((0usize, 0.0), |(n, t), sent| (n + 1, t + sent.tokens));
            (count as f64 / span, tokens / span, count)
        };
        // Calls refused from `from` until the refused call.
        let refused = |from: Instant| {
            state
                .history
                .iter()
                .filter(|sent| sent.at >= from && sent.at < ticket.at && sent.heard == Heard::Limited)
                .count()
        };
        // The newest anchor with `TUNING.pacer.measured` calls admitted since (after a stretch where the
        // provider refused everything, only what it admitted since counts). Before the first
        // measure, the oldest with at least `TUNING.pacer.min_admitted` will do (the longest span): a rough
        // rate beats a provisional one; after it, a span of a few calls would only add noise.
        let newest = state
            .empty_at
            .iter()
            .rev()
            .copied()
            .find(|&a| admitted(a).2 >= TUNING.pacer.measured);
        let provisional = state.gain > TUNING.pacer.probe_max;
        let oldest = state
            .empty_at
            .front()
            .copied()
            .filter(|&a| provisional && admitted(a).2 >= TUNING.pacer.min_admitted);
        let Some(anchor) = newest.or(oldest) else {
            let oldest = state.empty_at.front().copied();
            state.empty_at.push_back(ticket.at);
            while state.empty_at.len() > TUNING.pacer.max_empty_at
                || state
                    .empty_at
                    .front()
                    .is_some_and(|at| ticket.at.saturating_duration_since(*at) > TUNING.pacer.history)
            {
                state.empty_at.pop_front();
            }
            tracing::debug!(
                ?oldest,
                "a 429 with too few calls admitted to measure: backing off, no rate learned"
            );
            return;
        };
        let since = admitted(anchor);
        // The recent span: back to the tenth call admitted before the refused one, and at
        // least `TUNING.pacer.recent` (after a stretch where the provider refused everything, only what it
        // admitted since counts).
        let first = state.first_start.unwrap_or(anchor);
        let tenth = state
            .history
            .iter()
            .rev()
            .filter(|sent| sent.at < ticket.at && sent.heard != Heard::Limited)
            .nth(9)
            .map_or(first, |sent| sent.at);
        let recent_from = ticket
            .at
            .checked_sub(TUNING.pacer.recent)
            .map_or(tenth, |at| at.min(tenth));
        let recent = admitted(
            first
                .max(recent_from)
                .max(anchor.min(ticket.at.checked_sub(TUNING.pacer.recent).unwrap_or(anchor))),
        );
        let refused = refused(anchor);
        let overshot = refused * 3 >= since.2 + refused;
        let measured = (since.0.max(recent.0), since.1.max(recent.1));
        settle(state, ticket, exhausted, measured, overshot, provisional);
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
            // The newest level the provider announced (by when its call was sent).
            if state.levels[at].is_none_or(|level| level.seq < ticket.seq) {
                let used = (budget.limit - budget.remaining).max(0.0);
                state.levels[at] = Some(super::Level {
                    seq: ticket.seq,
                    announced_at: ticket.at,
                    remaining: budget.remaining,
                    limit: budget.limit,
                    refill: match budget.reset.is_zero() {
                        true => f64::INFINITY,
                        false => used / budget.reset.as_secs_f64(),
                    },
                    room: budget.remaining,
                    last: ticket.at,
                });
                replay_since(state, at);
            }
            if let Some(seen) = budget.bounds() {
                let bounds = state.bounds[at].map_or(seen, |known| known.and(seen));
                state.bounds[at] = Some(bounds);
                let rate = Some(bounds.rate() * TUNING.pacer.below_announced);
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

/// Brings announced budget `which` from its announcement up to the newest call: each call started
/// since (but those refused) takes its share, in order, the budget refilling between them.
fn replay_since(state: &mut PaceState, which: usize) {
    let Some(mut level) = state.levels[which] else {
        return;
    };
    let rate = Pacer::refill(state, which, &level);
    let since = (state.history.iter().rev())
        .take_while(|sent| sent.seq > level.seq)
        .count();
    for sent in state.history.iter().skip(state.history.len() - since) {
        if sent.heard == Heard::Limited {
            continue;
        }
        level.room = if rate.is_finite() {
            level.at(rate, sent.at)
        } else {
            level.limit
        };
        level.room -= [1.0, sent.tokens][which];
        level.last = level.last.max(sent.at);
    }
    state.levels[which] = Some(level);
}

/// Sets the pace from a measure (`measured`: requests and tokens a second the provider admitted
/// up to the refused call), then holds it before the probe grows it again. `overshot`: a third or more of
/// the calls since the anchor were refused; `provisional`: the first measure of the run.
fn settle(
    state: &mut PaceState,
    ticket: Ticket,
    exhausted: Exhausted,
    (requests, tokens): (f64, f64),
    overshot: bool,
    provisional: bool,
) {
    // Both measures read low where the bucket is small (it overflows while gacc paces below
    // the rate, and a 429 comes as soon as the pace passes it): the pace the refused call
    // started at was then just above the rate. It counts, a little below, up to `TUNING.pacer.trust_pace`
    // times the measure.
    //
    // A pace held above the rate since the anchor is another case. Where the bucket holds one
    // call, every other call then finds it not yet refilled, and what it admits reads half the
    // rate, or a little more, wherever the rate lies below the pace: the pace a tenth lower
    // (`TUNING.pacer.overshot`) is tried once. A measure under two fifths of the pace, a second such episode
    // in a row, or the run's first measure (after a provisional pace that grew fourfold a round,
    // far past the rate) is the provider's rate.
    let retry_lower = overshot && !state.overshot && !provisional;
    state.overshot = overshot;
    let estimate = |measured: f64, paced: Option<f64>| {
        let paced = paced.map_or(0.0, |p| {
            if retry_lower && measured * 2.5 >= p {
                TUNING.pacer.overshot * p
            } else {
                (TUNING.pacer.below * p).min(TUNING.pacer.trust_pace * measured)
            }
        });
        Some((TUNING.pacer.below * measured.max(paced)).max(TUNING.pacer.min_rate))
    };
    let before = state.learned;
    if exhausted != Exhausted::Tokens {
        state.learned.requests = estimate(requests, ticket.pace.requests);
    }
    if exhausted != Exhausted::Requests && tokens > 0.0 {
        state.learned.tokens = estimate(tokens, ticket.pace.tokens);
    }
    // A pace at least `TUNING.pacer.steady` of the one the refused call started at agrees with it: the
    // rate holds.
    let agrees = |was: Option<f64>, now: Option<f64>| match (was, now) {
        (Some(was), Some(now)) => now >= TUNING.pacer.steady * was,
        (was, now) => was.is_none() && now.is_none(),
    };
    let steady =
        agrees(before.requests, state.learned.requests) && agrees(before.tokens, state.learned.tokens);
    state.steady = if steady && !provisional {
        (state.steady + 1).min(TUNING.pacer.steady_doublings)
    } else {
        0
    };
    // After the first measure, the rate is still rough: a short hold. After later ones, a
    // longer hold spaces the probes that each cost a 429, and it doubles while paces agree
    // (where the provider's bucket holds one call, a probe costs a call's refill).
    let hold = if provisional {
        TUNING.pacer.probe_hold_first
    } else {
        TUNING.pacer.probe_hold * f64::from(1u32 << state.steady)
    };
    state.empty_at.clear();
    state.empty_at.push_back(ticket.at);
    state.gain = TUNING.pacer.probe_start;
    state.hold_until = Some(Instant::now() + round(state.learned).mul_f64(hold));
    tracing::debug!(requests = ?state.learned.requests, tokens = ?state.learned.tokens, "learned a rate limit");
}

/// The run's first 429: the provider's bucket is empty, and how fast it refills is not known.
/// A provisional pace, what was admitted in the last `TUNING.pacer.recent` over the time it took (high by
/// what the bucket held), probes up fast until the next 429 measures.
fn provisional(state: &mut PaceState, ticket: Ticket, exhausted: Exhausted) {
    state.empty_at.push_back(ticket.at);
    if state.learned == Rates::default() {
        let from = ticket.at.checked_sub(TUNING.pacer.recent);
        let admitted: Vec<&Sent> = state
            .history
            .iter()
            .filter(|sent| from.is_none_or(|from| sent.at >= from) && sent.at < ticket.at)
            .filter(|sent| sent.heard != Heard::Limited)
            .collect();
        // Fewer than `TUNING.pacer.min_admitted` say little: they count over the whole `TUNING.pacer.recent`.
        let earliest = admitted.first().map_or(ticket.at, |sent| sent.at);
        let least = if admitted.len() < TUNING.pacer.min_admitted {
            TUNING.pacer.recent
        } else {
            TUNING.pacer.min_span
        };
        let span = ticket
            .at
            .saturating_duration_since(earliest)
            .max(least)
            .as_secs_f64();
        let tokens: f64 = admitted.iter().map(|sent| sent.tokens).sum();
        let count = admitted.len().max(1) as f64;
        if exhausted != Exhausted::Tokens {
            state.learned.requests = Some(count / span);
        }
        if exhausted != Exhausted::Requests {
            state.learned.tokens = Some(tokens.max(ticket.tokens) / span);
        }
        state.gain = TUNING.pacer.probe_provisional;
        state.hold_until = None;
    }
    tracing::debug!(requests = ?state.learned.requests, "the first 429: a provisional pace until the next measures");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_narrow_the_refill_rate_to_the_providers() {
        // Between one and two of 500 used (a level of 498.9 shows as 498), refilled in 240 ms.
        let budget = Allowance {
            limit: 500.0,
            remaining: 498.0,
            reset: Duration::from_millis(240),
        };
        let bounds = budget.bounds().unwrap();
        // The reset is rounded up to a millisecond: the refill took 239 to 240 ms.
        assert!((bounds.low - 1.0 / 0.24).abs() < 1e-9 && (bounds.high - 2.0 / 0.239).abs() < 1e-9);
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
        assert!((nearly.bounds().unwrap().rate() - 1.0 / 0.049).abs() < 1e-9);
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
}
