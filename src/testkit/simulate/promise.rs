//! What a simulated cell must show (SPEC §8's promise for the calls in flight and the pace),
//! and why a cell cannot, whatever the limiter does.

use super::{Cell, Outcome, Server, ideal};
use crate::exec::model::tuning::TUNING;

/// Whether an outcome meets SPEC §8's promise: goodput at least 0.9, the server 90% used
/// within 5 s or 5% of the run's ideal time, at most 2% of calls refused where the server
/// announces its limits, median latency at most twice the unloaded; a one-at-a-time server
/// holds at most two calls in flight (one computed, one waiting: its latency is twice).
pub(super) fn meets(cell: &Cell, outcome: &Outcome) -> Result<(), String> {
    let ideal = ideal(cell);
    let mut missed = Vec::new();
    if outcome.goodput < 0.9 {
        missed.push(format!("goodput {:.2}", outcome.goodput));
    }
    if outcome.to_90 > (0.05 * ideal).max(5.0) {
        missed.push(format!("90% used after {:.1} s", outcome.to_90));
    }
    if let Server::Bucket { headers: true, .. } = cell.server
        && outcome.share_429 > 0.02
    {
        missed.push(format!("{:.1}% of calls drew a 429", outcome.share_429 * 100.0));
    }
    if let Server::Fifo { .. } = cell.server {
        if outcome.peak > 2 {
            missed.push(format!("{} calls in flight", outcome.peak));
        }
    } else if outcome.latency > 2.0 {
        missed.push(format!("median latency {:.1}× unloaded", outcome.latency));
    }
    if missed.is_empty() {
        Ok(())
    } else {
        Err(missed.join(", "))
    }
}

/// Why a cell cannot meet the promise whatever the limiter does, if it cannot.
pub(super) fn cannot(cell: &Cell) -> Option<String> {
    let (capacity, amount) = cell.server.capacity(cell.tokens);
    let ideal = ideal(cell);
    // The limit grows on replies only (a server that is not there yet, or small, is never
    // flooded): `TUNING.limiter.startup_growth + 1` times as many calls a round trip from `TUNING.limiter.start`, and no
    // more than `TUNING.limiter.validated_room` times what the last round trip's replies showed.
    let latency = cell.server.unloaded().as_secs_f64();
    let needed = (capacity / amount * latency).max(1.0) * 0.9;
    let growth = (TUNING.limiter.startup_growth + 1.0).min(TUNING.limiter.validated_room as f64);
    // A local server: a call alone and a few with two in the server first.
    let first = if cell.local { 2.0 } else { 0.0 };
    let rounds = first + (needed / TUNING.limiter.start as f64).log(growth).ceil().max(0.0);
    let slow_growth = (rounds * latency > (0.05 * ideal).max(5.0)).then(|| {
        format!("{needed:.0} calls in flight are needed and growth waits on replies: {rounds} round trips of {latency} s")
    });
    // A local server's start: a call alone and a pair, to tell one that computes one request
    // at a time; where the run is under fifty round trips, they alone cost 4% of it.
    let local_start = (cell.local && 2.0 * latency > 0.02 * ideal).then(|| {
        format!(
            "the run is {:.0} round trips of {latency} s, and a local server's start takes two",
            ideal / latency
        )
    });
    let reason = match cell.server {
        Server::Bucket {
            rate,
            burst,
            latency,
            tokens,
            retry_after,
            ..
        } => {
            let calls_a_second = if tokens { rate / cell.tokens as f64 } else { rate };
            if burst < 2.0 * amount && calls_a_second > 500.0 {
                return Some(format!(
                    "a bucket of one call refilled every {:.1} ms: timers wake to a millisecond, and two calls closer than that draw a 429",
                    1000.0 / calls_a_second
                ));
            }
            let needed = calls_a_second * latency.as_secs_f64();
            if needed > cell.ceiling as f64 * 0.9 {
                return Some(format!(
                    "the pace needs {needed:.0} calls in flight (pace × latency), above max_concurrency = {}",
                    cell.ceiling
                ));
            }
            if let Some(wait) = retry_after.filter(|&w| w as f64 > 0.1 * ideal) {
                return Some(format!(
                    "a 429 holds its call {wait} s (Retry-After), more than a tenth of the run's {ideal:.0} s"
                ));
            }
            None
        }
        Server::Saturating { capacity, .. } if capacity > cell.ceiling => Some(format!(
            "the server batches {capacity} sequences, above max_concurrency = {}",
            cell.ceiling
        )),
        Server::Saturating { .. } | Server::Storm { .. } | Server::Fifo { .. } => None,
    };
    reason.or(slow_growth).or(local_start)
}
