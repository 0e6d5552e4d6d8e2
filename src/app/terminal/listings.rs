//! The text of the commands that list or describe something: the plan, the provider batches, a
//! dataset's and a cache's figures, the built-in callbacks.

use std::collections::BTreeMap;
use std::path::Path;

use crate::app::Format;
use crate::app::preview::StageStatus;
use crate::inputs::dataset_stats::{Stats, Summary};
use crate::protocol::Stage;

use super::emit;

/// `gacc plan`'s table (or JSON): jobs, cached and to run, per stage.
pub(in crate::app) fn print_plan(
    status: &BTreeMap<&'static str, StageStatus>,
    bounds: &BTreeMap<String, crate::app::preview::CallBounds>,
    // `--power`'s figures as JSON, and as text.
    power: Option<(serde_json::Value, String)>,
    format: Format,
) {
    if format == Format::Json {
        let mut value = serde_json::to_value(status).unwrap_or_default();
        if !bounds.is_empty() {
            value["endpoints"] = serde_json::to_value(bounds).unwrap_or_default();
        }
        if let Some((power, _)) = power {
            value["power"] = power;
        }
        emit(&crate::files::pretty(&value));
        return;
    }
    let mut text = format!("{:<10} {:>8} {:>8} {:>8}\n", "stage", "jobs", "cached", "to run");
    for stage in Stage::ALL {
        let s = status.get(stage.as_str()).cloned().unwrap_or_default();
        let answered = s.cached + s.skipped;
        text.push_str(&format!(
            "{:<10} {:>8} {:>8} {:>8}\n",
            stage.as_str(),
            s.jobs,
            answered,
            s.jobs - answered
        ));
    }
    let to_run = |stage: Stage| {
        let s = status.get(stage.as_str()).cloned().unwrap_or_default();
        s.jobs - s.cached - s.skipped
    };
    if let Some(calls) = status.get(Stage::Compress.as_str()).and_then(|s| s.calls) {
        text.push_str(&format!(
            "(compress: {} memories from {calls} call(s): a ladder compressor's one call serves every budget of a source, goal and seed)\n",
            to_run(Stage::Compress)
        ));
    }
    let (unread, unjudged) = (to_run(Stage::Read), to_run(Stage::Judge));
    if unread > 0 && unjudged > 0 {
        // A judgement's request holds the answer: until its read is made, it is only possible.
        text.push_str(&format!(
            "(judge: {} of {unjudged} wait on reads not yet made; a read that fails leaves its judgement unmade)\n",
            unread.min(unjudged)
        ));
    }
    if !bounds.is_empty() {
        text.push_str("\nmodel calls the cache does not answer, at most (input counted with cl100k_base, × 1.25 for the provider's tokenizer):\n");
        text.push_str(&format!(
            "{:<16} {:>8} {:>14} {:>14} {:>12}\n",
            "endpoint", "calls", "input tokens", "output tokens", "cost (USD)"
        ));
        for (name, b) in bounds {
            let cost = b.cost_usd.map_or("no price".to_owned(), |c| format!("{c:.4}"));
            text.push_str(&format!(
                "{name:<16} {:>8} {:>14} {:>14} {cost:>12}\n",
                b.calls, b.input_tokens, b.output_tokens
            ));
        }
        for (name, b) in bounds {
            if let (Some(cost), Some(price)) = (b.cost_usd, b.usd_per_million) {
                text.push_str(&format!(
                    "  {name}: {} × {} + {} × {} USD per million tokens = {cost:.4} USD\n",
                    b.input_tokens, price.input, b.output_tokens, price.output
                ));
            }
        }
        text.push_str("\ntime the calls need, per endpoint:\n");
        for (name, b) in bounds {
            let time = match b.seconds {
                Some(seconds) => format!("about {}", crate::clock::human_duration(seconds)),
                None => "unknown".into(),
            };
            let from = if b.seconds.is_some() { "from" } else { "because" };
            text.push_str(&format!("{name:<16} {time}, {from} {}\n", b.time_from));
        }
    }
    if let Some((_, said)) = power {
        text.push_str(&said);
    }
    emit(&text);
}

/// `gacc batches list`.
pub(in crate::app) fn print_batches(
    cache: &Path,
    records: &[crate::exec::model::batch::Record],
    format: Format,
) {
    if format == Format::Json {
        let rows: Vec<serde_json::Value> = records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "local": r.local, "endpoint": r.endpoint, "api": r.api, "model": r.model,
                    "batch_id": r.batch_id, "state": r.state, "requests": r.keys.len(),
                    "created": r.created, "outcome": r.outcome,
                })
            })
            .collect();
        emit(&crate::files::pretty(&rows));
        return;
    }
    if records.is_empty() {
        emit(&format!("{}: no provider batches\n", cache.display()));
        return;
    }
    let mut text = format!(
        "{:<28} {:<12} {:<34} {:<10} {:>8}  outcome\n",
        "created", "endpoint", "batch", "state", "requests"
    );
    for r in records {
        let outcome: Vec<String> = r.outcome.iter().map(|(k, n)| format!("{n} {k}")).collect();
        text.push_str(&format!(
            "{:<28} {:<12} {:<34} {:<10} {:>8}  {}\n",
            r.created,
            r.endpoint,
            r.batch_id.as_deref().unwrap_or("(not accepted yet)"),
            r.state,
            r.keys.len(),
            outcome.join(", ")
        ));
    }
    let in_flight = records.iter().filter(|r| r.in_flight()).count();
    let cancellable = records.iter().filter(|r| r.cancellable()).count();
    if in_flight > 0 {
        text.push_str(&format!("{in_flight} in flight: `gacc run` collects them"));
        if cancellable > 0 {
            text.push_str(&format!(
                "; `gacc batches cancel {}` cancels the {cancellable} the provider accepted",
                cache.display()
            ));
        }
        if cancellable < in_flight {
            text.push_str(&format!(
                "; {} not yet known to the provider cannot be cancelled until a run re-attaches to them",
                in_flight - cancellable
            ));
        }
        text.push('\n');
    }
    emit(&text);
}

/// `gacc dataset stats`.
pub(in crate::app) fn print_dataset_stats(shown: &str, stats: &Stats, format: Format) {
    if format == Format::Json {
        emit(&crate::files::pretty(stats));
        return;
    }
    let line = |name: &str, s: &Summary| {
        format!(
            "{name:<20} min {:>6}  median {:>8}  max {:>6}  total {:>8}\n",
            s.min, s.median, s.max, s.total
        )
    };
    let mixed: Vec<&crate::inputs::dataset_stats::SourceShare> =
        stats.cjk_share.iter().filter(|s| s.share > 0.0).collect();
    let scripts = match mixed.len() {
        0 => "scripts             no source has Chinese, Japanese or Korean text\n".to_owned(),
        n => {
            let mut text = format!(
                "scripts             {n} of {} sources have Chinese, Japanese or Korean text (their characters are words one by one; sentences end at 。！？)\n",
                stats.sources
            );
            for source in mixed.iter().take(20) {
                text.push_str(&format!(
                    "  {:<30} {:>5.1}% CJK letters\n",
                    source.id,
                    100.0 * source.share
                ));
            }
            if n > 20 {
                text.push_str(&format!("  … and {} more (--json lists them all)\n", n - 20));
            }
            text
        }
    };
    emit(&format!(
        "{shown}: {} sources, {} goals, {} questions\n{}{}{}{scripts}",
        stats.sources,
        stats.goals,
        stats.questions,
        line("tokens per source", &stats.tokens),
        line("goals per source", &stats.goals_per_source),
        line("questions per goal", &stats.questions_per_goal),
    ));
}

/// `gacc cache stats`.
pub(in crate::app) fn print_cache_stats(path: &Path, stats: &crate::store::cache::Stats, format: Format) {
    if format == Format::Json {
        emit(&crate::files::pretty(stats));
        return;
    }
    let mut text = format!(
        "{}: {} segments, {} bytes\n",
        path.display(),
        stats.segments,
        stats.bytes
    );
    for (kind, count) in &stats.entries {
        text.push_str(&format!("  {kind:<12} {count:>10} entries\n"));
    }
    if stats.torn_lines > 0 {
        text.push_str(&format!(
            "  {} torn lines (from interrupted writes; ignored)\n",
            stats.torn_lines
        ));
    }
    if stats.damaged > 0 {
        text.push_str(&format!(
            "  {} damaged entries (their payload is not the one their checksum states; ignored)\n",
            stats.damaged
        ));
    }
    emit(&text);
}

/// `gacc callback` with no name: every built-in with its role and what it does.
pub(in crate::app) fn print_builtins() {
    let mut list = String::new();
    for (name, role, summary) in crate::builtin::catalogue() {
        list.push_str(&format!("{name:<18} {:<11} {summary}\n", role.as_str()));
    }
    for ((name, role, _), (_, summary)) in crate::inputs::models::MODEL_BUILTINS
        .iter()
        .zip(crate::inputs::models::MODEL_BUILTIN_HELP)
    {
        list.push_str(&format!("{name:<18} {:<11} {summary}\n", role.as_str()));
    }
    list.push_str(&format!(
        "{:<18} {:<11} the embedded tokenizer\n",
        crate::builtin::TOKENIZER,
        "tokenizer"
    ));
    emit(&list);
}
