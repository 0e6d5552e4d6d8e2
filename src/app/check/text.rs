//! What `gacc callback check` prints: each callback's probes, what broke the protocol and what to
//! do about it, latency, and what the sandbox blocked.

use std::fmt::Write as _;
use std::time::Duration;

use crate::exec::callback::FailureKind;
use crate::inputs::tokenizer::Tokenizer;
use crate::protocol::Mode;

use super::Checked;

/// A failure, with what to do about the protocol violations a callback's author meets most.
pub(super) fn advice(kind: &FailureKind, mode: Mode) -> String {
    let fix = match kind {
        FailureKind::Timeout(_) if mode == Mode::Persistent => {
            " — a persistent callback must answer each request line as it arrives: one that reads \
             stdin to its end (sys.stdin.read()) waits forever"
        }
        FailureKind::InvalidJson(reason) if reason.contains("other output") => {
            " — protocol violation: only the response may be on stdout (print to sys.stderr, or use \
             the helper's serve(), which moves fd 1 to stderr)"
        }
        FailureKind::InvalidJson(_) | FailureKind::NotUtf8 | FailureKind::NoOutput => {
            " — protocol violation: stdout must be one JSON object (one line per request when persistent)"
        }
        FailureKind::MissingField(_) => " — protocol violation: see the role's response fields in SPEC §3",
        FailureKind::TooLarge(_) => " — protocol violation: the response is over the size limit",
        _ => "",
    };
    format!("{kind}{fix}")
}

pub(super) fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e4).round() / 10.0
}

/// The report, top to bottom as it is printed.
pub(super) fn describe(checked: &[Checked], tokenizer: &dyn Tokenizer) -> String {
    let mut out = String::new();
    let identity = tokenizer.identity();
    let _ = writeln!(
        out,
        "tokenizer {} ({}): verified against the cl100k_base test vectors",
        identity.name, identity.revision
    );
    for callback in checked {
        let mut latencies: Vec<f64> = callback
            .requests
            .iter()
            .filter(|r| r.sent)
            .map(|r| r.latency_ms)
            .collect();
        latencies.sort_by(f64::total_cmp);
        let median = latencies.get(latencies.len() / 2).copied().unwrap_or(0.0);
        let max = latencies.last().copied().unwrap_or(0.0);
        let passed = callback.requests.iter().filter(|r| r.ok).count();
        let _ = writeln!(
            out,
            "\n{} ({}, {}): {} — {passed}/{} requests answered, latency median {median:.0} ms, max {max:.0} ms",
            callback.callback,
            callback.role,
            if callback.in_process {
                "in process".to_owned()
            } else if callback.sandboxed {
                format!("{}, sandboxed", callback.mode)
            } else {
                format!("{}, unsandboxed", callback.mode)
            },
            if callback.works { "works" } else { "FAILS" },
            callback.requests.len(),
        );
        describe_requests(&mut out, callback);
        // A judge that says the same of a right and a wrong answer decides nothing.
        let verdict_on = |what: &str| {
            (callback.requests.iter())
                .find(|r| r.request == what)
                .and_then(|r| r.verdict)
        };
        if let (Some(right), Some(wrong)) = (verdict_on("a right answer"), verdict_on("a wrong answer"))
            && right == wrong
        {
            let _ = writeln!(
                out,
                "  warning: it said {} to both a right and a wrong answer: it may not be deciding",
                if right { "correct" } else { "wrong" }
            );
        }
        if let Some(sandbox) = &callback.sandbox {
            let _ = writeln!(out, "  sandbox: {sandbox}");
        }
    }
    let failing = checked.iter().filter(|c| !c.works).count();
    let _ = writeln!(
        out,
        "\n{}",
        if failing == 0 {
            match checked.len() {
                1 => "the callback works".to_owned(),
                n => format!("all {n} callbacks work"),
            }
        } else {
            format!("{failing} of {} callbacks fail", checked.len())
        }
    );
    out
}

/// A line per request of one callback: ok or FAIL and its latency, then its error (said once
/// when every request shares it), its stderr and its notes.
fn describe_requests(out: &mut String, callback: &Checked) {
    let mut said = None;
    for request in &callback.requests {
        if !request.sent {
            let _ = writeln!(
                out,
                "  --   {:<28} not sent: an earlier request timed out",
                request.request
            );
            continue;
        }
        let mark = if request.ok { "ok  " } else { "FAIL" };
        let _ = writeln!(
            out,
            "  {mark} {:<28} {:>8.1} ms",
            request.request, request.latency_ms
        );
        if let Some(error) = &request.error {
            // A failure every request shares is said once.
            if said == Some((error, &request.stderr)) {
                let _ = writeln!(out, "       (the same)");
                continue;
            }
            said = Some((error, &request.stderr));
            let _ = writeln!(out, "       {error}");
        }
        for (number, line) in request.stderr.iter().enumerate() {
            let label = if number == 0 { "stderr:" } else { "       " };
            let _ = writeln!(out, "       {label} {line}");
        }
        for note in &request.notes {
            let _ = writeln!(out, "       note: {note}");
        }
    }
}
