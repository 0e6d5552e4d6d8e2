//! The start against a server on this machine or its network (a llama.cpp, vLLM, SGLang or
//! Ollama server), which may compute one request at a time and queue the rest: two calls in
//! flight then keep it busy, and every call more only waits. The limit starts at one call
//! (its reply is the unloaded latency) and goes to two; while replies with two in the server
//! take twice as long as those sent alone, the server computes one at a time and the limit
//! stays at two. Once replies with two in the server come back about as fast as those sent
//! alone, the server computes several at once, and the limit is found as for any server
//! (`Slot::succeeded`). Replies vary in length, so where they vary that verdict rests on the
//! mean log ratio of several replies, and every few replies one call goes alone again to
//! refine the unloaded latency (which costs a one-at-a-time server only the round trip to
//! this machine).

use std::collections::HashMap;
use std::time::Duration;

use super::{Limiter, State};
use crate::exec::model::tuning::TUNING;

/// What the start knows.
#[derive(Debug, Default)]
pub(super) struct Local {
    /// Per callback: the mean latency of its calls sent alone, and how many there were.
    alone: HashMap<String, (f64, u32)>,
    /// The least and the most latency of calls sent alone, over their mean: replies that vary
    /// less than `TUNING.local.steady` are steady, and one with two in the server is then a verdict.
    spread: (f64, f64),
    /// The mean log ratio of replies sent with another call in the server over those sent
    /// alone, and how many there were.
    paired: (f64, u32),
    /// Replies at two since the last call sent alone, and the limit to go back to after one.
    held: u32,
    probing: bool,
}

/// Counts the reply of a call of `class` sent with `company` calls in the server (itself
/// included) and answered after `latency`, and moves the limit; hands the limiter over to the
/// usual search once the server has shown it computes several calls at once.
pub(super) fn reply(limiter: &Limiter, state: &mut State, class: &str, latency: Duration, company: usize) {
    let bound = limiter.bound(state);
    let Some(local) = state.local.as_mut() else {
        return;
    };
    let seconds = latency.as_secs_f64().max(1e-6);
    let alone = local.alone.entry(class.to_owned()).or_insert((0.0, 0));
    if company <= 1 {
        alone.1 += 1;
        let weight = (1.0 / f64::from(alone.1)).max(1.0 / TUNING.local.recent);
        alone.0 = (1.0 - weight) * alone.0 + weight * seconds;
        let relative = seconds / alone.0;
        local.spread = match alone.1 {
            1 => (1.0, 1.0),
            _ => (local.spread.0.min(relative), local.spread.1.max(relative)),
        };
    } else if alone.1 > 0 {
        let ratio = (seconds / alone.0).ln();
        local.paired.1 += 1;
        let weight = (1.0 / f64::from(local.paired.1)).max(1.0 / TUNING.local.recent);
        local.paired.0 = (1.0 - weight) * local.paired.0 + weight * ratio;
    }
    if !limiter.adaptive {
        return;
    }
    let steady =
        local.alone.values().all(|(_, n)| *n >= 2) && local.spread.1 - local.spread.0 < TUNING.local.steady;
    let (paired, mean) = (local.paired.1, local.paired.0.exp());
    let parallel = (steady && paired >= 1 && mean < TUNING.local.parallel_below)
        || (paired >= TUNING.local.verdict_after && mean < TUNING.local.parallel_varied);
    if parallel {
        // Two at once came back at speed: the usual search from here, as after a start
        // whose calls were answered at speed.
        state.local = None;
        state.validated = 2;
        tracing::debug!("the server computes several calls at once");
        limiter.set_limit(state, TUNING.limiter.start);
        return;
    }
    let target = if state.limit <= 1 && company <= 1 {
        // The call went alone (the first, or a probe): two from here.
        local.probing = false;
        Some(2)
    } else {
        local.held += 1;
        let probe = local.held >= TUNING.local.probe_every && !local.probing && bound;
        probe.then(|| {
            local.held = 0;
            local.probing = true;
            1
        })
    };
    if let Some(target) = target {
        limiter.set_limit(state, target);
    }
}

/// Whether an endpoint at `base_url` is a server on this machine or its network: a loopback,
/// private or link-local address, `localhost`, or a host name without a dot (a machine of the
/// cluster, `gpu07`).
pub(crate) fn is_local(base_url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(base_url) else {
        return false;
    };
    let Some(host) = url.host_str() else {
        return false;
    };
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::IpAddr>()
    {
        Ok(std::net::IpAddr::V4(ip)) => ip.is_loopback() || ip.is_private() || ip.is_link_local(),
        Ok(std::net::IpAddr::V6(ip)) => {
            let first = ip.segments()[0];
            ip.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        }
        Err(_) => {
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost") || !name.contains('.')
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_on_this_machine_or_network_are_local() {
        for url in [
            "http://127.0.0.1:8080/v1",
            "http://localhost:11434/v1",
            "http://[::1]:8000/v1",
            "http://10.1.2.3:8000/v1",
            "http://192.168.0.7/v1",
            "http://172.20.0.2:8000",
            "http://gpu07:8000/v1",
            "http://[fd00::2]:8000/v1",
        ] {
            assert!(is_local(url), "{url}");
        }
        for url in [
            "https://api.openai.com/v1",
            "https://api.deepseek.com/v1",
            "http://8.8.8.8/v1",
            "http://172.32.0.1/v1",
            "not a url",
        ] {
            assert!(!is_local(url), "{url}");
        }
    }
}
