//! `gacc trace RUN_DIR`: the tracing log reviewed without jq — the slowest calls, every
//! failure, latency percentiles per callback, cache hits per stage, and one job's whole story
//! (for a job served without a call, which has no line in the trace, told from the run
//! folder's plan, ledger and results).

mod render;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::hash::sha256;
use crate::protocol::Stage;
use crate::report::stats::percentile;
use crate::store::run_folder::{MEMORIES, PLAN, RESULTS, RunFolder, TRACE};
use crate::trace::TraceEvent;

pub(crate) use render::render;

/// How many of the slowest calls a review lists.
pub(crate) const SLOWEST: usize = 10;

/// What to look at.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub stage: Option<String>,
    pub callback: Option<String>,
    /// A job or cache key, or a prefix of one.
    pub job: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Review {
    pub events: usize,
    pub slowest: Vec<Call>,
    pub failures: Vec<Value>,
    pub retries: usize,
    pub latency: BTreeMap<String, Latency>,
    pub cache: BTreeMap<String, CacheHits>,
    /// With `--job`: every event of that job, in order.
    pub story: Vec<Value>,
    /// With `--job`: the job as the run folder's files record it (its plan entry, and its
    /// ledger row or result row), whether or not the trace has events of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Call {
    pub callback: String,
    pub duration_ms: f64,
    pub ok: bool,
    pub attempt: u64,
    pub key: Option<String>,
    pub request_bytes: Option<u64>,
    /// The job the call served, as the run's rows name it (source, goal or question,
    /// condition, budget, seed), where a row names its key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

/// Call latency of one callback, in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Latency {
    pub calls: usize,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct CacheHits {
    pub jobs: usize,
    pub hits: usize,
    pub rate: f64,
}

fn text(event: &Value, field: &str) -> Option<String> {
    event.get(field).and_then(|v| v.as_str().map(str::to_owned))
}

/// One line of the trace: as written (for a job's story, which shows every field of every
/// event) and as read.
struct Recorded {
    line: Value,
    event: TraceEvent<'static>,
}

impl Recorded {
    fn of(line: Value) -> Recorded {
        Recorded {
            event: TraceEvent::read(&line),
            line,
        }
    }

    /// The call key of a call attempt.
    fn call_key(&self) -> Option<String> {
        match &self.event {
            TraceEvent::CallbackAttempt { key: Some(key), .. } => Some(key.to_string()),
            _ => None,
        }
    }

    /// A call attempt whose key is only in the span it ran in.
    fn keyed_in_a_span(&self) -> bool {
        matches!(self.event, TraceEvent::CallbackAttempt { key: None, .. })
            && self.line.pointer("/span/key").is_some()
    }

    /// Whether the event is of job (or key) `prefix`.
    fn is_of(&self, prefix: &str) -> bool {
        let named = match &self.event {
            TraceEvent::JobFinished { job, cache_key, .. } => {
                [Some(job.to_string()), Some(cache_key.to_string())]
            }
            TraceEvent::JobFailed { job, .. } => [Some(job.to_string()), None],
            // Free text names its job as it likes.
            _ => [text(&self.line, "job"), text(&self.line, "cache_key")],
        };
        (named.into_iter().chain([self.call_key()]))
            .flatten()
            .any(|key| key.starts_with(prefix))
    }
}

/// The stage and the callback an event is of, where it names them.
fn stage_and_callback(event: &TraceEvent) -> (Option<Stage>, Option<String>) {
    match event {
        TraceEvent::CallbackAttempt { callback, .. } | TraceEvent::Retrying { callback, .. } => {
            (None, Some(callback.to_string()))
        }
        TraceEvent::JobFailed { stage, callback, .. } => (Some(*stage), Some(callback.to_string())),
        TraceEvent::JobFinished {
            stage, compressor, ..
        } => (Some(*stage), Some(format!("compressors.{compressor}"))),
        TraceEvent::StageFinished { stage, .. } => (Some(*stage), None),
        _ => (None, None),
    }
}

fn matches(event: &TraceEvent, filter: &Filter) -> bool {
    let (stage, callback) = stage_and_callback(event);
    let stage_ok = (filter.stage.as_ref()).is_none_or(|s| stage.is_none_or(|e| e.as_str() == s));
    let callback_ok = (filter.callback.as_ref()).is_none_or(|c| callback.is_none_or(|e| &e == c));
    stage_ok && callback_ok
}

/// The gacc that reviews a trace written before events were typed.
const READS_UNTYPED: &str = "gacc 0.1.0 at commit 8c6c977 or earlier";

/// Reviews `trace.jsonl` in a run folder.
pub(crate) fn review(folder: &Path, filter: &Filter) -> Result<Review, Error> {
    let text_of = RunFolder::open(folder).read_text(TRACE)?;
    let events: Vec<Recorded> = text_of
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .map(Recorded::of)
        .collect();
    let mut calls: Vec<Call> = Vec::new();
    let mut failures = Vec::new();
    let mut retries = 0;
    let mut cache: BTreeMap<String, CacheHits> = BTreeMap::new();
    let mut story = Vec::new();
    // Call attempts that name their key only in a span: a trace of the format before events
    // were typed, whose review this gacc does not give.
    if events.iter().any(Recorded::keyed_in_a_span) {
        return Err(Error::Io {
            path: folder.join(TRACE),
            message: format!("written by a gacc before trace events were typed: {READS_UNTYPED} reviews it"),
        });
    }
    for recorded in &events {
        if let Some(job) = &filter.job
            && recorded.is_of(job)
        {
            story.push(recorded.line.clone());
        }
        if !matches(&recorded.event, filter) {
            continue;
        }
        match &recorded.event {
            TraceEvent::CallbackAttempt {
                callback,
                attempt,
                duration_ms,
                request_bytes,
                ok,
                ..
            } => calls.push(Call {
                callback: callback.to_string(),
                duration_ms: *duration_ms as f64,
                ok: *ok,
                attempt: u64::from(*attempt),
                key: recorded.call_key(),
                request_bytes: Some(*request_bytes),
                job: None,
            }),
            TraceEvent::JobFailed { .. } => failures.push(recorded.line.clone()),
            TraceEvent::Retrying { .. } => retries += 1,
            TraceEvent::StageFinished {
                stage,
                finished,
                cached,
                ..
            } => {
                let hits = cache.entry(stage.as_str().to_owned()).or_default();
                hits.jobs += *finished as usize;
                hits.hits += *cached as usize;
            }
            _ => {}
        }
    }
    for hits in cache.values_mut() {
        hits.rate = if hits.jobs == 0 {
            0.0
        } else {
            hits.hits as f64 / hits.jobs as f64
        };
    }
    let latency = latency_by_callback(&calls);
    calls.sort_by(|a, b| b.duration_ms.total_cmp(&a.duration_ms));
    calls.truncate(SLOWEST);
    name_jobs(&RunFolder::open(folder), &mut calls);
    let stored = match &filter.job {
        Some(job) if !job.is_empty() => stored_job(&RunFolder::open(folder), job)?,
        _ => None,
    };
    Ok(Review {
        events: events.len(),
        slowest: calls,
        failures,
        retries,
        latency,
        cache,
        story,
        stored,
    })
}

/// Each callback's latency over its calls: median, 95th percentile and most.
fn latency_by_callback(calls: &[Call]) -> BTreeMap<String, Latency> {
    let mut by_callback: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for call in calls {
        by_callback
            .entry(call.callback.clone())
            .or_default()
            .push(call.duration_ms);
    }
    by_callback
        .into_iter()
        .map(|(name, mut durations)| {
            durations.sort_by(f64::total_cmp);
            let latency = Latency {
                calls: durations.len(),
                p50: percentile(&durations, 0.5),
                p95: percentile(&durations, 0.95),
                max: durations.last().copied().unwrap_or(0.0),
            };
            (name, latency)
        })
        .collect()
}

/// The job whose key (a compress, read or judge job's, or a compressor call's cache key)
/// Names each call's job from the run's rows that rest on its key (a row's `calls`).
fn name_jobs(folder: &RunFolder, calls: &mut [Call]) {
    let wanted: std::collections::HashSet<String> = calls.iter().filter_map(|c| c.key.clone()).collect();
    if wanted.is_empty() {
        return;
    }
    let mut named: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for file in [MEMORIES, RESULTS] {
        // Ten keys among a paper-scale run's rows: the results file is read only if needed.
        if named.len() == wanted.len() {
            break;
        }
        let Ok(rows) = folder.read_rows::<Value>(file) else {
            continue;
        };
        for row in rows {
            let Some(keys) = row.get("calls").and_then(Value::as_object) else {
                continue;
            };
            for key in keys.values().filter_map(Value::as_str) {
                if wanted.contains(key) && !named.contains_key(key) {
                    named.insert(key.to_owned(), describe_row(&row));
                }
            }
        }
    }
    for call in calls {
        call.job = call.key.as_ref().and_then(|key| named.get(key).cloned());
    }
}

/// A row's job in words: `source/goal (question) · condition · r=0.3 · seed 1`.
fn describe_row(row: &Value) -> String {
    let text = |field: &str| row.get(field).and_then(Value::as_str).map(str::to_owned);
    let mut what = text("source_id").unwrap_or_default();
    if let Some(goal) = text("goal_id") {
        what = format!("{what}/{goal}");
    }
    if let Some(question) = text("question_id") {
        what = format!("{what} ({question})");
    }
    let budget = match (row.get("ratio"), row.get("budget_tokens")) {
        (Some(ratio), _) if !ratio.is_null() => format!("r={ratio}"),
        (_, Some(tokens)) if !tokens.is_null() => format!("L={tokens}"),
        _ => String::new(),
    };
    let condition = text("condition").unwrap_or_default();
    let seed = row.get("seed").map(ToString::to_string).unwrap_or_default();
    format!("{what} · {condition} · {budget} · seed {seed}")
}

/// starts with `prefix`, as the run folder's files record it: its plan entry, its ledger row
/// (a compress job) or result row (a read or judge job). None when the plan has no such job
/// (or the folder predates `plan.json.gz`).
fn stored_job(folder: &RunFolder, prefix: &str) -> Result<Option<Value>, Error> {
    if !folder.file(PLAN).is_file() {
        return Ok(None);
    }
    let Some((entry, stage, question)) = plan_job(folder, prefix)? else {
        return Ok(None);
    };
    let memory_key = entry["key"].as_str().unwrap_or_default().to_owned();
    let mut stored = serde_json::json!({"stage": stage.as_str(), "plan": entry});
    if let Some((goal_id, question_id, read, judge)) = &question {
        stored["job"] = Value::from(if stage == Stage::Read {
            read.as_str()
        } else {
            judge.as_str()
        });
        stored["read_job"] = Value::from(read.as_str());
        stored["judge_job"] = Value::from(judge.as_str());
        stored["goal_id"] = Value::from(goal_id.as_str());
        stored["question_id"] = Value::from(question_id.as_str());
    } else {
        stored["job"] = Value::from(memory_key.as_str());
    }
    // Rows name their memory job's key: a line without it is not parsed.
    let rows = |name: &str| -> Result<Vec<Value>, Error> {
        let mut found = Vec::new();
        for line in std::io::BufRead::lines(folder.open_lines(name)?) {
            let line = line.map_err(|error| Error::Io {
                path: folder.file(name),
                message: format!("cannot read: {error}"),
            })?;
            if line.contains(memory_key.as_str())
                && let Ok(row) = serde_json::from_str::<Value>(&line)
            {
                found.push(row);
            }
        }
        Ok(found)
    };
    stored["ledger"] = rows(MEMORIES)
        .unwrap_or_default()
        .into_iter()
        .find(|row| row["key"] == memory_key.as_str())
        .unwrap_or(Value::Null);
    let results: Vec<Value> = rows(RESULTS)
        .unwrap_or_default()
        .into_iter()
        .filter(|row| row["memory_key"] == memory_key.as_str())
        .filter(|row| {
            question.as_ref().is_none_or(|(goal, id, _, _)| {
                row["goal_id"] == goal.as_str() && row["question_id"] == id.as_str()
            })
        })
        .collect();
    stored["results"] = Value::from(results);
    Ok(Some(stored))
}

/// A read or judge job's question: goal id, question id, read job key, judge job key.
type QuestionKeys = (String, String, String, String);

/// A plan entry, the stage of the job found in it, and (a read or judge job) its question.
type PlanJob = (Value, Stage, Option<QuestionKeys>);

/// The plan entry of the job `prefix` names, its stage, and (a read or judge job) its question.
fn plan_job(folder: &RunFolder, prefix: &str) -> Result<Option<PlanJob>, Error> {
    for line in std::io::BufRead::lines(folder.open_lines(PLAN)?) {
        let line = line.map_err(|error| Error::Io {
            path: folder.file(PLAN),
            message: format!("cannot read: {error}"),
        })?;
        // One memory job a line, after the header's and before the closing line.
        let Ok(entry) = serde_json::from_str::<Value>(line.trim_end_matches(',')) else {
            continue;
        };
        let Some(key) = entry["key"].as_str() else {
            continue;
        };
        if key.starts_with(prefix) || entry["cache_key"].as_str().is_some_and(|k| k.starts_with(prefix)) {
            return Ok(Some((entry, Stage::Compress, None)));
        }
        for (goal, ids) in entry["questions"].as_object().into_iter().flatten() {
            for id in ids.as_array().into_iter().flatten().filter_map(Value::as_str) {
                let read = sha256(format!("read\n{key}\n{id}"));
                let judge = sha256(format!("judge\n{read}"));
                let stage = if read.starts_with(prefix) {
                    Stage::Read
                } else if judge.starts_with(prefix) {
                    Stage::Judge
                } else {
                    continue;
                };
                let question = (goal.clone(), id.to_owned(), read, judge);
                return Ok(Some((entry.clone(), stage, Some(question))));
            }
        }
    }
    Ok(None)
}
