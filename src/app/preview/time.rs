//! How long an endpoint's uncached calls need (`gacc plan`): from `rpm`/`tpm`, from the pace
//! an earlier run sustained, or before any run from their tokens at a stated pace.

use std::path::Path;

use super::CallBounds;

/// The time an endpoint's uncached calls need: from `rpm`/`tpm` where set, else from the
/// pace it sustained in the last run of this experiment that used it (`run.json`).
pub(super) fn estimate_time(
    bound: &mut CallBounds,
    name: &str,
    spec: &crate::inputs::models::ModelSpec,
    runs: &Path,
) {
    if spec.batch.spec().is_some() {
        bound.time_from = "a provider batch: its completion window".into();
        return;
    }
    let time = |rpm: f64, tpm: f64| {
        let of = |amount: f64, per_minute: f64| (per_minute > 0.0).then(|| amount / per_minute * 60.0);
        let requests = of(bound.calls as f64, rpm);
        let tokens = of((bound.input_tokens + bound.output_tokens) as f64, tpm);
        requests.into_iter().chain(tokens).reduce(f64::max)
    };
    if let Some(seconds) = time(f64::from(spec.rpm), spec.tpm as f64) {
        bound.seconds = Some(to_hundredths(seconds));
        bound.time_from = "rpm/tpm".into();
        return;
    }
    for (folder, run) in crate::store::run_record::newest_first(runs) {
        let sustained = run
            .endpoints
            .get(name)
            .and_then(|e| e.sustained_rpm)
            .unwrap_or(0.0);
        // The tokens it sustained were the estimates gacc paced on, as these bounds are.
        if let Some(seconds) = time(sustained, 0.0) {
            bound.seconds = Some(to_hundredths(seconds));
            bound.time_from = format!("the last run ({})", folder.display());
            return;
        }
    }
    // No measure yet: the tokens at a stated pace, the first run measuring the real one.
    let in_flight = match crate::exec::model::limiter::is_local(&spec.base_url) {
        true => 1,
        false => ASSUMED_IN_FLIGHT.min(spec.max_concurrency.max(1)),
    };
    let serial = bound.input_tokens as f64 / ASSUMED_READ + bound.output_tokens as f64 / ASSUMED_WRITE;
    bound.seconds = Some(to_hundredths(serial / in_flight as f64));
    bound.time_from = format!(
        "an assumption (no run of this experiment has used it yet, and it sets no `rpm` or `tpm`): \
         {in_flight} call(s) in flight, each reading {ASSUMED_READ} prompt tokens and writing {ASSUMED_WRITE} \
         tokens a second, over the upper bounds above; the first run measures its pace"
    );
}

/// An estimate to the hundredth of a second: 238 calls at 6,000 a minute take 2.38 s, not the
/// 2.3800000000000003 the division gives.
fn to_hundredths(seconds: f64) -> f64 {
    (seconds * 100.0).round() / 100.0
}

/// The first run's time, before any run has measured an endpoint's pace: calls in flight
/// (one for a server on this machine or its network, which may compute one at a time), and
/// each call's prompt tokens read and tokens written a second.
const ASSUMED_IN_FLIGHT: usize = 8;
const ASSUMED_READ: f64 = 1000.0;
const ASSUMED_WRITE: f64 = 30.0;
