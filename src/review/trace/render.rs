//! A trace review as text: the slowest calls, the failures, latency per callback, cache hits per
//! stage, and one job's story (told from the run folder when it made no call).

use serde_json::Value;

use crate::protocol::Stage;
use crate::report::stored::text as shown;
use crate::trace::TraceEvent;

use super::{Filter, Review, text};

/// The review as text for a terminal.
pub(crate) fn render(review: &Review, filter: &Filter) -> String {
    let mut out = format!("{} events\n", review.events);
    if filter.job.is_some() {
        out.push_str(&format!(
            "\njob {} — {} events\n",
            filter.job.as_deref().unwrap_or(""),
            review.story.len()
        ));
        for event in &review.story {
            let time = text(event, "timestamp").unwrap_or_default();
            let message = text(event, "message").unwrap_or_default();
            let mut fields: Vec<String> = event
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| !matches!(k.as_str(), "timestamp" | "message" | "level" | "span" | "spans"))
                .map(|(k, v)| {
                    format!(
                        "{k}={}",
                        v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string())
                    )
                })
                .collect();
            fields.sort();
            out.push_str(&format!("  {time} {message}: {}\n", fields.join(" ")));
        }
        if let Some(stored) = &review.stored {
            out.push_str(&render_stored(stored, review.story.is_empty()));
        }
        return out;
    }
    out.push_str("\ncache hits per stage\n");
    for (stage, hits) in &review.cache {
        out.push_str(&format!(
            "  {stage:<10} {:>8} jobs {:>8} hits  {:>5.1}%\n",
            hits.jobs,
            hits.hits,
            100.0 * hits.rate
        ));
    }
    out.push_str("\nlatency per callback (ms)\n");
    for (name, l) in &review.latency {
        out.push_str(&format!(
            "  {name:<28} {:>7} calls  p50 {:>9.1}  p95 {:>9.1}  max {:>9.1}\n",
            l.calls, l.p50, l.p95, l.max
        ));
    }
    out.push_str(&format!("\nslowest {} calls\n", review.slowest.len()));
    for call in &review.slowest {
        // Named by its job where the rows say; the key's first 12 digits find it (--job).
        let key = call.key.as_deref().unwrap_or("");
        let named = match &call.job {
            Some(job) => format!("{job}  [{}]", key.get(..12).unwrap_or(key)),
            None => key.to_owned(),
        };
        out.push_str(&format!(
            "  {:>9.1} ms  {:<28} attempt {} {}  {}\n",
            call.duration_ms,
            call.callback,
            call.attempt,
            if call.ok { "ok    " } else { "FAILED" },
            crate::secrets::redact(&named)
        ));
    }
    out.push_str(&format!(
        "\nfailures: {} (retries: {})\n",
        review.failures.len(),
        review.retries
    ));
    for failure in &review.failures {
        let TraceEvent::JobFailed {
            job,
            stage,
            callback,
            reason,
            attempts,
            stderr,
        } = TraceEvent::read(failure)
        else {
            continue;
        };
        out.push_str(&format!(
            "  {stage} {callback} job {job}: {reason} (attempts {attempts})\n"
        ));
        for line in stderr.lines().rev().take(3).collect::<Vec<_>>().into_iter().rev() {
            out.push_str(&format!("      stderr: {line}\n"));
        }
    }
    out
}

/// The line of a job's memory, from its ledger row.
pub(super) fn memory_line(ledger: &Value) -> String {
    if ledger.is_object() {
        format!(
            "  memory: {} of L = {} tokens kept (generated {}{}), sha256 {}{}\n",
            ledger["retained_tokens"],
            ledger["budget"],
            ledger["generated_tokens"],
            if ledger["truncated"] == true {
                ", truncated"
            } else {
                ""
            },
            shown(&ledger["memory_sha256"]),
            if ledger["cached"] == true {
                ", served without calling the compressor"
            } else {
                ", made in this run"
            },
        )
    } else {
        "  memory: not made (no ledger row)\n".to_owned()
    }
}

/// A job as the run folder records it, for a terminal.
pub(super) fn render_stored(stored: &Value, no_events: bool) -> String {
    let plan = &stored["plan"];
    let stage = stored["stage"].as_str().and_then(Stage::parse);
    let compress = stage == Some(Stage::Compress);
    let stage = shown(&stored["stage"]);
    let mut out = format!(
        "\n{stage} job {} as the run folder records it\n",
        shown(&stored["job"])
    );
    if no_events {
        out.push_str("  served without a call in this run (from the cache, or an identical call of this run): such a job has no line in the trace\n");
    }
    let budget = match (plan.get("ratio"), plan.get("budget_tokens")) {
        (Some(ratio), _) => format!("ratio {ratio}"),
        (_, Some(tokens)) => format!("budget_tokens {tokens}"),
        _ => String::new(),
    };
    out.push_str(&format!(
        "  compressors.{} seed {} {} {budget} source {} goal {} shown goal {}\n",
        shown(&plan["compressor"]),
        plan["seed"],
        shown(&plan["condition"]),
        shown(&plan["source_id"]),
        shown(&plan["goal_id"]),
        shown(&plan["shown_goal_id"]),
    ));
    out.push_str(&format!(
        "  memory job {}  compressor call {}\n",
        shown(&plan["key"]),
        shown(&plan["cache_key"])
    ));
    if !compress {
        out.push_str(&format!(
            "  question {} of goal {}: read job {}, judge job {}\n",
            shown(&stored["question_id"]),
            shown(&stored["goal_id"]),
            shown(&stored["read_job"]),
            shown(&stored["judge_job"])
        ));
    }
    out.push_str(&memory_line(&stored["ledger"]));
    let results = stored["results"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    if compress {
        let correct = results.iter().filter(|r| r["correct"] == true).count();
        let failed = results.iter().filter(|r| r["failure"].is_string()).count();
        out.push_str(&format!(
            "  questions: {} answered from it, {correct} correct, {failed} failed\n",
            results.len()
        ));
    }
    for row in results.iter().filter(|_| !compress) {
        let verdict = match (&row["correct"], &row["failure"]) {
            (_, Value::String(failure)) => format!("failed: {failure}"),
            (Value::Bool(true), _) => "correct".to_owned(),
            (Value::Bool(false), _) => "incorrect".to_owned(),
            _ => "not judged".to_owned(),
        };
        out.push_str(&format!("  answer {}: {verdict}\n", row["answer"]));
    }
    out
}
