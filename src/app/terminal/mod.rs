//! What a person sees on the terminal: the run's progress line and summary, and the text of
//! every command that prints one.

mod listings;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::protocol::Role;
use crate::report;
use crate::runner::{self, Progress};

pub(super) use listings::{
    print_batches, print_builtins, print_cache_stats, print_dataset_stats, print_plan,
};

/// The seconds a run's jobs left need, `seconds` into it: per stage, its jobs left at the pace
/// of the calls it made (not of those the cache or an identical call answered, nor of those
/// with nothing to call); the run ends with its slowest stage. None until each stage with jobs
/// left has made a few calls.
fn time_left(progress: &Progress, seconds: f64) -> Option<f64> {
    let mut remaining = 0.0f64;
    for stage in &progress.stages {
        let load = |counter: &std::sync::atomic::AtomicUsize| counter.load(Ordering::Relaxed);
        let finished = load(&stage.done) + load(&stage.failed);
        let called =
            finished.saturating_sub(load(&stage.cached) + load(&stage.shared) + load(&stage.skipped));
        let left = load(&stage.total).saturating_sub(finished);
        match (left, called) {
            (0, _) => {}
            (_, 0..ETA_AFTER) => return None,
            _ => remaining = remaining.max(left as f64 * seconds / called as f64),
        }
    }
    Some(remaining)
}

/// Calls a stage makes before the progress line's ETA counts on its pace.
const ETA_AFTER: usize = 3;

/// How many failures the terminal summary lists; report.md lists them all.
const LISTED_FAILURES: usize = 10;

/// The terminal's summary of a run; `hints` says, per failure in the report's order, what its
/// sandbox denied (when it can tell).
pub(super) fn summary(
    report: &report::Report,
    (this_run, audit): (&BTreeMap<Role, runner::CallCounts>, &runner::CallCounts),
    paid: &BTreeMap<Role, runner::Usage>,
    hints: &[Option<String>],
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    // A judge that decides nothing heads the summary: every figure below rests on it.
    let mark = match &report.judge_doubt {
        Some(doubt) => {
            out.push_str(&format!("  ‡ warning: {}\n", doubt.sentence));
            " ‡"
        }
        None => "",
    };
    for cell in &report.cells {
        // One seed has no spread to show: its mean alone, not `± 0.000`.
        let shown = |spread: Option<crate::report::stats::Spread>| match (spread, cell.seeds.len()) {
            (Some(spread), 1) => format!("{:.3}{mark}", spread.mean),
            (spread, _) => format!("{}{mark}", crate::report::stats::shown(spread)),
        };
        out.push_str(&format!(
            "  {:<16} {:<10} {:<8} Micro {}  Macro {}{}\n",
            cell.id.compressor,
            cell.id.condition,
            cell.id.rule.to_string(),
            shown(cell.micro),
            shown(cell.macro_),
            if cell.complete { "" } else { "  (incomplete)" }
        ));
    }
    calls_lines(&mut out, this_run, audit);
    cost_lines(&mut out, report, paid);
    let i = &report.integrity;
    out.push_str(&format!(
        "  integrity: exposure {} · budget {} · padding {} · count errors {} · tokenizer {}\n",
        i.exposure_violations,
        i.budget_violations,
        i.padding_tokens,
        i.count_errors,
        if report.tokenizer.identity_verified {
            "verified"
        } else {
            "NOT verified"
        }
    ));
    for dip in &report.monotonicity {
        out.push_str(&format!(
            "  warning: {} {}: Micro falls from {:.3} at {} to {:.3} at {}, beyond a paired 95% bootstrap over goals\n",
            dip.compressor, dip.condition, dip.micro_smaller, dip.smaller, dip.micro_larger, dip.larger
        ));
    }
    failure_lines(&mut out, report, hints);
    if report.cancelled > 0 {
        out.push_str(&format!(
            "  {} jobs not run: the run stopped early (below)\n",
            report.cancelled
        ));
    }
    out.push_str(&format!("  finished in {:.1}s", elapsed.as_secs_f64()));
    out
}

/// This run's calls per role, the audit's apart, and what "shared" means where any were.
fn calls_lines(out: &mut String, this_run: &BTreeMap<Role, runner::CallCounts>, audit: &runner::CallCounts) {
    let calls: Vec<String> = [Role::Compressor, Role::Reader, Role::Judge]
        .iter()
        .map(|role| {
            let c = this_run.get(role).cloned().unwrap_or_default();
            let shared = if c.shared > 0 {
                format!(", {} shared", c.shared)
            } else {
                String::new()
            };
            format!("{role} {} made, {} cached{shared}", c.made, c.cached)
        })
        .collect();
    let mut calls = calls;
    // The audit's calls (often free verdicts of a built-in judge) are not the judge's.
    if audit.made + audit.cached + audit.shared > 0 {
        calls.push(format!("audit {} made, {} cached", audit.made, audit.cached));
    }
    out.push_str(&format!("  calls: {}\n", calls.join("; ")));
    if this_run.values().any(|c| c.shared > 0) {
        out.push_str("  (shared: answered by an identical call this run made once, not paid twice)\n");
    }
}

/// What the results cost and what this run paid, and endpoints served by several models.
fn cost_lines(out: &mut String, report: &report::Report, paid: &BTreeMap<Role, runner::Usage>) {
    // Summed from 0.0: an empty f64 sum is -0.0, which prints as "-0.0000".
    let sum = |values: &mut dyn Iterator<Item = f64>| values.fold(0.0, |a, b| a + b);
    let total = sum(&mut report.usage.values().map(|u| u.cost_usd));
    if total > 0.0 || !report.endpoints.is_empty() {
        let paid = sum(&mut paid.values().map(|u| u.cost_usd));
        let saved = sum(&mut report.usage.values().map(|u| u.prompt_cache_saved_usd));
        let batched = sum(&mut report.usage.values().map(|u| u.batch_saved_usd));
        out.push_str(&format!(
            "  cost: {total:.4} USD for the calls these results rest on; this run paid {paid:.4} USD{}\n",
            [
                (saved, "providers' prompt caches saved"),
                (batched, "the batch API saved")
            ]
            .iter()
            .filter(|(usd, _)| *usd > 0.0)
            .map(|(usd, what)| format!("; {what} {usd:.4} USD"))
            .collect::<String>()
        ));
    }
    for (name, endpoint) in &report.endpoints {
        if endpoint.several_models_served {
            let models: Vec<&str> = endpoint.usage.served_models.keys().map(String::as_str).collect();
            out.push_str(&format!(
                "  warning: endpoint `{name}` was served by several models ({}): its results may mix model versions\n",
                models.join(", ")
            ));
        }
    }
}

/// The first failures, each with its cell, its stderr's informative lines and its sandbox's
/// hint. Failures that share their stage, callback, reason and stderr (an endpoint that
/// refused every call) are one line that counts them.
fn failure_lines(out: &mut String, report: &report::Report, hints: &[Option<String>]) {
    let failures = &report.failures;
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (at, failure) in failures.iter().enumerate() {
        let same = |other: &usize| {
            let other = &failures[*other];
            (&other.stage, &other.callback, &other.reason, &other.stderr_tail)
                == (
                    &failure.stage,
                    &failure.callback,
                    &failure.reason,
                    &failure.stderr_tail,
                )
        };
        match groups.iter_mut().find(|group| same(&group[0])) {
            Some(group) => group.push(at),
            None => groups.push(vec![at]),
        }
    }
    for group in groups.iter().take(LISTED_FAILURES) {
        let failure = &failures[group[0]];
        let question = (failure.question_id.as_deref())
            .map(|q| format!(", {q}"))
            .unwrap_or_default();
        let place = format!(
            "{}{question}; {} {} {} seed {}",
            failure.source_id,
            failure.cell.compressor,
            failure.cell.condition,
            failure.cell.rule,
            failure.seed
        );
        let count = match group.len() {
            1 => String::new(),
            n => format!(", {n} calls"),
        };
        let more = if group.len() > 1 { ", …" } else { "" };
        out.push_str(&format!(
            "  FAILED {} {}{count} ({place}{more}): {}\n",
            failure.stage, failure.callback, failure.reason
        ));
        for (line_number, line) in informative_lines(&failure.stderr_tail).iter().enumerate() {
            let label = if line_number == 0 { "stderr:" } else { "       " };
            out.push_str(&format!("         {label} {line}\n"));
        }
        if let Some(Some(hint)) = hints.get(group[0]) {
            out.push_str(&format!("         sandbox: {hint}\n"));
        }
    }
    let unlisted: usize = groups.iter().skip(LISTED_FAILURES).map(Vec::len).sum();
    if unlisted > 0 {
        out.push_str(&format!(
            "  … and {unlisted} more failures (all are listed in report.md and report.json)\n"
        ));
    }
}

pub(super) fn show_progress(progress: Arc<Progress>, quiet: bool) -> tokio::task::JoinHandle<()> {
    show_every(quiet, move |terminal| print_progress(&progress, terminal, false))
}

/// Draws a progress line now and then until aborted (none when `quiet`): every 250 ms on a
/// terminal (`draw(true)` redraws in place), every 10 s elsewhere (a line each time).
pub(super) fn show_every(quiet: bool, draw: impl Fn(bool) + Send + 'static) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if quiet {
            return;
        }
        let terminal = std::io::stderr().is_terminal();
        let every = if terminal {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(10)
        };
        loop {
            tokio::time::sleep(every).await;
            draw(terminal);
        }
    })
}

/// Width of the progress bar on a terminal.
const BAR_WIDTH: usize = 24;

/// One progress line: per stage done/total, cache hits and failures; calls per second and the
/// time left. On a terminal it redraws itself with a bar; elsewhere it is a plain line.
pub(super) fn print_progress(progress: &Progress, terminal: bool, last: bool) {
    let (mut finished, mut total, mut made) = (0, 0, 0);
    let seconds = progress.started.elapsed().as_secs_f64().max(1e-3);
    let stages: Vec<String> = [
        ("compress", Role::Compressor),
        ("read", Role::Reader),
        ("judge", Role::Judge),
    ]
    .iter()
    .map(|(name, role)| {
        let s = progress.stage(*role);
        let (done, failed, cached, shared) = (
            s.done.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed),
            s.cached.load(Ordering::Relaxed),
            s.shared.load(Ordering::Relaxed),
        );
        let stage_total = s.total.load(Ordering::Relaxed);
        finished += done + failed;
        total += stage_total;
        made += done.saturating_sub(cached + shared);

        // Shared: answered by an identical call of this run, which was made (not the cache's).
        let shared = if shared > 0 {
            format!(", {shared} shared with an identical call")
        } else {
            String::new()
        };
        // Failed jobs are finished but not done: they are said apart, so a stage whose count
        // is full does not read as complete.
        match failed {
            0 => format!("{name} {done}/{stage_total} ({cached} cached{shared})"),
            _ => format!(
                "{name} {}/{stage_total}: {done} ok ({cached} cached{shared}), {failed} FAILED",
                done + failed
            ),
        }
    })
    .collect();
    let rate = made as f64 / seconds;
    let eta = match time_left(progress, seconds).filter(|_| finished < total) {
        Some(remaining) => {
            let remaining = remaining as u64;
            format!(
                " · ETA {}:{:02}:{:02}",
                remaining / 3600,
                remaining / 60 % 60,
                remaining % 60
            )
        }
        None => String::new(),
    };
    let endpoints: String = progress
        .endpoints
        .iter()
        .map(|endpoint| {
            let live = endpoint.live();
            let waiting = crate::exec::model::describe_pace(&live);
            let batches = match endpoint.batches() {
                Some(b) => format!(
                    " · {} batches: {} in progress ({} requests), {} done",
                    endpoint.name, b.open, b.open_requests, b.done
                ),
                None => String::new(),
            };
            let announced = match endpoint.pacer.announced_budget() {
                Some((limit, remaining)) => {
                    format!(", {remaining:.0} of {limit:.0} requests left (announced)")
                }
                None => String::new(),
            };
            format!(
                " · {} {}/{} in flight, {:.1}/s{announced}{waiting}{batches}",
                endpoint.name, live.in_flight, live.limit, live.throughput
            )
        })
        .collect();
    let audited = progress.audited.load(Ordering::Relaxed);
    let audit = if audited > 0 {
        let cached = progress.audited_cached.load(Ordering::Relaxed);
        format!(" · audit {audited} ({cached} cached)")
    } else {
        String::new()
    };
    // A rate only where calls were made: a run served by its cache made none.
    let rate = match made {
        0 => String::new(),
        _ => format!(" · {rate:.1} calls/s"),
    };
    let line = format!("{}{audit}{rate}{eta}{endpoints}", stages.join(" · "));
    let mut stderr = std::io::stderr().lock();
    let _ = if terminal {
        let filled = (BAR_WIDTH * finished).checked_div(total).unwrap_or(BAR_WIDTH);
        let bar = format!("[{}{}]", "#".repeat(filled), ".".repeat(BAR_WIDTH - filled));
        write!(stderr, "\r\x1b[K{bar} {line}{}", if last { "\n" } else { "" })
    } else {
        writeln!(stderr, "{line}")
    };
    let _ = stderr.flush();
}

/// How many lines of a failed call's stderr the terminal shows.
const INFORMATIVE_LINES: usize = 4;

/// The lines of a stderr tail that say what went wrong: a traceback's last frame (with its code
/// line) and its exception, the lines that name an error (`Fatal Python error: …`,
/// `ModuleNotFoundError: …`, `error: …`), else the last lines written.
pub(super) fn informative_lines(tail: &str) -> Vec<&str> {
    let lines: Vec<&str> = tail
        .lines()
        .map(str::trim_end)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let names_an_error = |line: &str| {
        let line = line.trim_start();
        let head = line.split(':').next().unwrap_or("");
        line.starts_with("Fatal Python error")
            || (line.contains(':')
                && !head.contains(' ')
                && ["Error", "Exception", "error", "panicked", "Interrupt", "Exit"]
                    .iter()
                    .any(|word| head.ends_with(word)))
    };
    let mut shown: Vec<&str> = Vec::new();
    if let Some(start) = lines
        .iter()
        .rposition(|l| l.starts_with("Traceback (most recent call last)"))
    {
        let frames = &lines[start + 1..];
        // The last frame in the callback's own code, else the last frame (the interpreter's
        // library says less about what went wrong).
        let is_frame = |l: &&str| l.trim_start().starts_with("File \"");
        let own = |l: &&str| is_frame(l) && !l.contains("/lib/python");
        if let Some(frame) = frames
            .iter()
            .rposition(own)
            .or_else(|| frames.iter().rposition(is_frame))
        {
            shown.extend(&frames[frame..(frame + 2).min(frames.len())]);
        }
    }
    for line in &lines {
        if names_an_error(line) && !shown.contains(line) {
            shown.push(line);
        }
    }
    if shown.is_empty() {
        shown = lines[lines.len().saturating_sub(2)..].to_vec();
    }
    let excess = shown.len().saturating_sub(INFORMATIVE_LINES);
    shown.drain(..excess);
    shown
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
pub(super) fn emit(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush());
}

/// Two sinks: the terminal (errors and the summary by default; `-v` retries and failed jobs,
/// `-vv` every job, `-vvv` every attempt; `RUST_LOG` overrides) and the run's `trace.jsonl`
/// (everything at debug, one JSON object per event).
pub fn init_tracing(verbose: u8, quiet: bool) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "error",
        (false, 1) => "gacc=warn,error",
        (false, 2) => "gacc=info,warn",
        (false, _) => "gacc=debug,info",
    };
    crate::trace::show_notices(!quiet);
    let terminal = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(level))
        .add_directive(
            format!("{}=off", crate::trace::NOTICE_TARGET)
                .parse()
                .expect("a valid directive"),
        );
    let trace = tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_target(false)
        .with_writer(crate::trace::TRACE_SINK)
        // Typed events reach the trace file directly (trace::record).
        .with_filter(EnvFilter::new(format!(
            "gacc=debug,{}=off",
            crate::trace::EVENT_TARGET
        )));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(crate::trace::TERMINAL_SINK)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_filter(terminal);
    let _ = tracing_subscriber::registry().with(trace).with(stderr).try_init();
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_eta_counts_on_calls_made_not_on_the_cache() {
        let progress = Progress::default();
        let set = |role: Role, total: usize, done: usize, cached: usize| {
            let stage = progress.stage(role);
            stage.total.store(total, Ordering::Relaxed);
            stage.done.store(done, Ordering::Relaxed);
            stage.cached.store(cached, Ordering::Relaxed);
        };
        // 100 reads in 10 s, 90 of them from the cache: 10 calls made, a call a second; 100
        // left need 100 s, not the 10 s that all 100 finished would say.
        set(Role::Compressor, 10, 10, 10);
        set(Role::Reader, 200, 100, 90);
        set(Role::Judge, 0, 0, 0);
        assert_eq!(time_left(&progress, 10.0), Some(100.0));
        // A stage with jobs left and fewer than three calls made has no pace yet.
        set(Role::Judge, 200, 2, 0);
        assert_eq!(time_left(&progress, 10.0), None);
        // The slowest stage: 197 judgements left at 3 calls in 10 s.
        set(Role::Judge, 200, 3, 0);
        assert_eq!(time_left(&progress, 10.0), Some(197.0 * 10.0 / 3.0));
    }

    use super::*;

    #[test]
    fn a_traceback_shows_its_last_frame_and_its_exception() {
        let tail = "loading model\nTraceback (most recent call last):\n  File \"/x/compress.py\", line 30, in <module>\n    main()\n  File \"/x/compress.py\", line 12, in main\n    import helpers\nModuleNotFoundError: No module named 'helpers'\n";
        assert_eq!(
            informative_lines(tail),
            [
                "  File \"/x/compress.py\", line 12, in main",
                "    import helpers",
                "ModuleNotFoundError: No module named 'helpers'"
            ]
        );
    }

    #[test]
    fn the_frame_shown_is_the_callbacks_own_not_the_librarys() {
        let tail = "Traceback (most recent call last):\n  File \"/x/k.py\", line 2, in <module>\n    keywords = pathlib.Path(\"m.txt\").read_text()\n  File \"/usr/lib/python3.11/pathlib.py\", line 1044, in open\n    return io.open(self)\nPermissionError: [Errno 13] Permission denied: 'm.txt'\n";
        assert_eq!(
            informative_lines(tail)[0],
            "  File \"/x/k.py\", line 2, in <module>"
        );
    }

    #[test]
    fn a_fatal_interpreter_error_is_not_hidden_behind_its_last_line() {
        let tail = "Python path configuration:\n  PYTHONHOME = (not set)\nFatal Python error: init_fs_encoding: failed to get the Python codec of the filesystem encoding\nPython runtime state: core initialized\nModuleNotFoundError: No module named 'encodings'\n\nCurrent thread 0x00007f (most recent call first):\n  <no Python frame>\n";
        assert_eq!(
            informative_lines(tail),
            [
                "Fatal Python error: init_fs_encoding: failed to get the Python codec of the filesystem encoding",
                "ModuleNotFoundError: No module named 'encodings'"
            ]
        );
    }

    #[test]
    fn other_programs_show_their_error_lines_or_their_last_lines() {
        assert_eq!(
            informative_lines("step 1\nerror: model server said no\nbye\n"),
            ["error: model server said no"]
        );
        assert_eq!(informative_lines("a\nb\nc\n"), ["b", "c"]);
        assert!(informative_lines("\n\n").is_empty());
    }
}
