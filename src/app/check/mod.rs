//! `gacc callback check`: each callback of a manifest, sent synthetic requests that cover the
//! protocol's edge cases (never the dataset's questions), in the sandbox, environment and mode
//! of a run; what works, what breaks the protocol, how long it takes, and what the sandbox
//! blocked.

mod text;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::{Error, Invalid, io};
use crate::exec::callback::{Callback, FailureKind};
use crate::exec::engine::{Engine, Here};
use crate::exec::process::ProcessLauncher;
use crate::exec::program::Program;
use crate::exec::sandbox::{self, Protected, Sandboxing};
use crate::inputs::tokenizer::Tokenizer;
use crate::protocol::messages::{
    self, CompressorResponse, LadderRequest, LadderResponse, ReaderResponse, Request,
};
use crate::protocol::{Mode, Role};

use super::Ended;
use super::prepare::{cache_root, callbacks, models, prepare};
use super::terminal::{emit, informative_lines};
use crate::protocol::probes::{Probe, probes};
use text::{advice, describe, millis};

/// How one probe went.
#[derive(Serialize)]
struct Answered {
    request: &'static str,
    ok: bool,
    /// False for a probe not sent after an earlier one timed out.
    sent: bool,
    latency_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    stderr: Vec<String>,
    /// The whole stderr tail of a failed request, where a denied path is looked for.
    #[serde(skip)]
    tail: String,
    /// Things that work but deserve a look (a memory over its budget, an unknown field).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    /// A judge's verdict on the probe's answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    verdict: Option<bool>,
}

/// One callback's verdict.
#[derive(Serialize)]
struct Checked {
    callback: String,
    role: Role,
    mode: Mode,
    sandboxed: bool,
    /// Answered inside gacc, with no process (a rule or model built-in).
    in_process: bool,
    works: bool,
    requests: Vec<Answered>,
    /// When a sandboxed request failed: what the same request did unsandboxed, and what the
    /// sandbox blocked where its stderr says.
    #[serde(skip_serializing_if = "Option::is_none")]
    sandbox: Option<String>,
}

/// `gacc callback check MANIFEST [NAME]`.
pub(crate) fn check(
    manifest: &Path,
    sets: &[String],
    name: Option<&str>,
    json: bool,
) -> Result<Ended, Error> {
    let prepared = prepare(manifest, sets)?;
    let loaded = &prepared.loaded;
    sandbox::protect_self();
    let runs = loaded.project.join("runs").join(&loaded.manifest.name);
    let protected = Protected::of(loaded, &cache_root(loaded), Some(&runs));
    let sandboxing = Sandboxing::new(sandbox::kernel_abi(), protected).map_err(io(&std::env::temp_dir()))?;
    // A check runs here whatever the run's engine: it is about the callback, not the cluster.
    let models = models(loaded, crate::app::prepare::Keys::Required)?;
    let here: Arc<dyn Engine> = Arc::new(Here);
    let (built, confinements) = callbacks(loaded, &sandboxing, &here, &models)?;
    let chosen = chosen(&built, name, manifest)?;
    let runtime = crate::parallel::runtime(None).map_err(crate::error::runtime_error)?;
    let tokenizer = prepared.tokenizer.clone();
    let checked: Vec<Checked> = runtime.block_on(async {
        let mut checked = Vec::new();
        for callback in chosen {
            let confinement = confinements
                .iter()
                .find(|(_, n, _)| n == &callback.name)
                .map(|(_, _, c)| c.sandbox);
            // Answered inside gacc (a rule or model built-in): no process, nothing to confine.
            let in_process = confinement == Some("in-process");
            let sandboxed = !in_process && confinement.is_some_and(|c| c != "off");
            if !json {
                let how = if in_process {
                    "in process".to_owned()
                } else {
                    mode_of(callback).to_string()
                };
                eprintln!("checking {} ({}, {how})…", callback.name, callback.role);
            }
            let ladder = (callback.name.strip_prefix("compressors."))
                .and_then(|name| loaded.manifest.compressors.get(name))
                .is_some_and(|spec| spec.ladder);
            let mut one = check_one(
                (callback, ladder),
                sandboxed,
                tokenizer.as_ref(),
                &sandboxing,
                &loaded.folder,
            )
            .await;
            one.in_process = in_process;
            checked.push(one);
        }
        checked
    });
    runtime.shutdown_background();
    crate::exec::shutdown();
    let works = checked.iter().all(|c| c.works);
    if json {
        let text = serde_json::to_string_pretty(&json!({
            "tokenizer": tokenizer.identity(),
            "callbacks": checked,
        }))
        .unwrap_or_default();
        emit(&format!("{text}\n"));
    } else {
        emit(&describe(&checked, tokenizer.as_ref()));
    }
    Ok(if works { Ended::Success } else { Ended::Failed })
}

/// The callbacks a check is about: the one named (a compressor by its name, with or without
/// `compressors.`), or all, in role order.
fn chosen<'a>(
    built: &'a crate::runner::Callbacks,
    name: Option<&str>,
    manifest: &Path,
) -> Result<Vec<&'a Callback>, Error> {
    let all = || built.compressors.values().chain([&built.reader, &built.judge]);
    let mut chosen: Vec<&Callback> = all()
        .filter(|c| name.is_none_or(|n| c.name == n || c.name.strip_prefix("compressors.") == Some(n)))
        .collect();
    chosen.sort_by_key(|c| c.role);
    if chosen.is_empty() {
        let known: Vec<&str> = all().map(|c| c.name.as_str()).collect();
        return Err(Invalid::one(
            format!("{}", manifest.display()),
            format!(
                "no callback is called `{}`; the manifest's are {}",
                name.unwrap_or_default(),
                known.join(", ")
            ),
        )
        .into());
    }
    Ok(chosen)
}

async fn check_one(
    (callback, ladder): (&Callback, bool),
    sandboxed: bool,
    tokenizer: &dyn Tokenizer,
    sandboxing: &Sandboxing,
    folder: &Path,
) -> Checked {
    let mut requests = Vec::new();
    let mut first_failure = None;
    // A model built-in's calls are paid: it gets the small requests only.
    let probes = probes(callback.role, &callback.params, ladder)
        .into_iter()
        .filter(|p| callback.launcher.uses_local_cores() || !p.what.starts_with("a 1 MB"));
    for probe in probes {
        // A callback that timed out would make every later probe wait as long.
        if matches!(&first_failure, Some((_, FailureKind::Timeout(_)))) {
            requests.push(Answered {
                request: probe.what,
                ok: false,
                sent: false,
                latency_ms: 0.0,
                error: Some("not sent: an earlier request timed out".into()),
                stderr: Vec::new(),
                tail: String::new(),
                notes: Vec::new(),
                verdict: None,
            });
            continue;
        }
        let bytes = probe.request.to_string();
        let started = Instant::now();
        let attempt = callback
            .launcher
            .attempt(callback, probe.what, bytes.as_bytes())
            .await;
        let latency = started.elapsed();
        let answered = judge_attempt(
            &probe,
            &attempt.result,
            &attempt.stderr_tail,
            latency,
            mode_of(callback),
            tokenizer,
        );
        if let (Err(kind), None) = (&attempt.result, &first_failure) {
            first_failure = Some((probe, kind.clone()));
        }
        requests.push(answered);
    }
    // A reply the protocol takes but that answers wrongly (a ladder's count) fails too.
    let works = first_failure.is_none() && requests.iter().all(|r| r.ok);
    let sandbox = match first_failure {
        Some((probe, kind)) if sandboxed && !violation(&kind) && !matches!(kind, FailureKind::Timeout(_)) => {
            Some(unsandboxed(callback, &probe, &requests, sandboxing, folder).await)
        }
        _ => None,
    };
    Checked {
        callback: callback.name.clone(),
        role: callback.role,
        mode: mode_of(callback),
        sandboxed,
        in_process: false,
        works,
        requests,
        sandbox,
    }
}

/// Tries the first failed request again without the sandbox, to tell the callback's own
/// failures from what the sandbox blocked. It is a synthetic request: nothing of the dataset
/// is in it, and its answer is only compared, never kept.
async fn unsandboxed(
    callback: &Callback,
    probe: &Probe,
    requests: &[Answered],
    sandboxing: &Sandboxing,
    folder: &Path,
) -> String {
    let Some(program) = callback.program() else {
        return "it runs inside gacc, with no sandbox to leave".into();
    };
    let open = Callback {
        retries: 0,
        launcher: Arc::new(ProcessLauncher::new(Program {
            sandbox: None,
            ..program.clone()
        })),
        ..callback.clone()
    };
    let bytes = probe.request.to_string();
    let attempt = open.launcher.attempt(&open, probe.what, bytes.as_bytes()).await;
    let stderr: String = requests
        .iter()
        .filter(|r| !r.ok)
        .map(|r| r.tail.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let denied = sandbox::denial_hint(&stderr, sandboxing.protected(), folder);
    match (attempt.result, denied) {
        (Ok(_), Some(hint)) => format!("the same request works unsandboxed: {hint}"),
        (Ok(_), None) => "the same request works unsandboxed, so the sandbox blocks something it needs; \
                          its stderr names no path (run `gacc run -v` and look for the file it opens)"
            .into(),
        (Err(_), Some(hint)) => {
            format!("it fails unsandboxed too, but the sandbox also denied a file: {hint}")
        }
        (Err(kind), None) => format!("it fails unsandboxed too ({kind}): the failure is the callback's own"),
    }
}

/// A ladder probe's verdict (none for another probe).
fn ladder_answered(
    probe: &Probe,
    response: &Value,
    latency: Duration,
    tokenizer: &dyn Tokenizer,
) -> Option<Answered> {
    let asked = messages::read::<LadderRequest>(&probe.request)?;
    let (error, notes) = ladder_verdict(&asked.token_budgets, response, tokenizer);
    Some(Answered {
        request: probe.what,
        ok: error.is_none(),
        sent: true,
        latency_ms: millis(latency),
        error,
        stderr: Vec::new(),
        tail: String::new(),
        notes,
        verdict: None,
    })
}

/// A ladder's reply (SPEC §14): a memory per budget, in order, or what is wrong with it; and
/// a note for each memory longer than its budget.
fn ladder_verdict(
    budgets: &[usize],
    response: &Value,
    tokenizer: &dyn Tokenizer,
) -> (Option<String>, Vec<String>) {
    let Some(reply) = messages::read::<LadderResponse>(response) else {
        let error = "answered without `memories`: a compressor with `ladder = true` answers `token_budgets` with a list of memories, one per budget, in order (the Python helper: @compressor(ladder=True))";
        return (Some(error.into()), Vec::new());
    };
    if reply.memories.len() != budgets.len() {
        let got = reply.memories.len();
        let error = format!(
            "answered {got} {} for the {} budgets {budgets:?}: one per budget, in order",
            if got == 1 { "memory" } else { "memories" },
            budgets.len()
        );
        return (Some(error), Vec::new());
    }
    let notes = (reply.memories.iter().zip(budgets))
        .filter_map(|(memory, &budget)| {
            let tokens = tokenizer.count(memory).ok()?;
            (tokens > budget).then(|| {
                format!("the memory for budget {budget} is {tokens} tokens: gacc cuts it to {budget}")
            })
        })
        .collect();
    (None, notes)
}

/// Turns an attempt into a verdict, with notes on what works but looks wrong.
fn judge_attempt(
    probe: &Probe,
    result: &Result<Value, FailureKind>,
    stderr_tail: &str,
    latency: Duration,
    mode: Mode,
    tokenizer: &dyn Tokenizer,
) -> Answered {
    let stderr = |shown: bool| {
        if shown {
            informative_lines(stderr_tail)
                .into_iter()
                .map(str::to_owned)
                .collect()
        } else {
            Vec::new()
        }
    };
    let response = match result {
        Err(kind) => {
            return Answered {
                request: probe.what,
                ok: false,
                sent: true,
                latency_ms: millis(latency),
                error: Some(advice(kind, mode)),
                stderr: stderr(true),
                tail: stderr_tail.to_owned(),
                notes: Vec::new(),
                verdict: None,
            };
        }
        Ok(response) => response,
    };
    if let Some(answered) = ladder_answered(probe, response, latency, tokenizer) {
        return answered;
    }
    let mut notes = unknown_fields(probe.role, response);
    let text = match probe.role {
        Role::Compressor => messages::read::<CompressorResponse>(response).map(|r| r.memory),
        Role::Reader => messages::read::<ReaderResponse>(response).map(|r| r.answer),
        Role::Judge | Role::Writer => None,
    };
    // A judge's verdict is shown, with its score and the start of its reason.
    let judged = (probe.role == Role::Judge).then(|| verdict(response)).flatten();
    notes.extend(judged.as_ref().map(|(_, note)| note.clone()));
    let request = Request::read(probe.role, &probe.request).ok();
    // The text the reply was made from: a compressor's context, a reader's memory.
    let asked = request.as_ref().map_or("", Request::shared);
    if let Some(text) = text {
        if text.contains('\u{FFFD}') && !asked.contains('\u{FFFD}') {
            notes.push(
                "the reply holds U+FFFD where the request had none: read stdin and write stdout as UTF-8"
                    .into(),
            );
        }
        if let Some(Request::Compressor(compress)) = &request {
            let budget = compress.token_budget as u64;
            match tokenizer.count(&text) {
                Ok(tokens) if tokens as u64 > budget => notes.push(format!(
                    "the memory is {tokens} tokens for a budget of {budget}: gacc cuts it to {budget}"
                )),
                Ok(0) if !asked.is_empty() => notes.push("the memory is empty".into()),
                _ => {}
            }
        }
    }
    Answered {
        request: probe.what,
        ok: true,
        sent: true,
        latency_ms: millis(latency),
        error: None,
        stderr: stderr(false),
        tail: String::new(),
        notes,
        verdict: judged.map(|(correct, _)| correct),
    }
}

/// A note for each field of a response its role does not know (it is ignored).
fn unknown_fields(role: Role, response: &Value) -> Vec<String> {
    let known = messages::response_fields(role);
    (response.as_object().into_iter().flatten())
        .map(|(key, _)| key.as_str())
        .filter(|key| !known.contains(key) && !messages::SHARED_RESPONSE_FIELDS.contains(key))
        .map(|key| format!("unknown field `{key}` (ignored)"))
        .collect()
}

/// A judge's verdict, and the note that shows it with its score and the start of its reason.
fn verdict(response: &Value) -> Option<(bool, String)> {
    let judged = messages::read::<messages::JudgeResponse>(response)?;
    let score = judged
        .score
        .map(|s| format!(" (score {s:.2})"))
        .unwrap_or_default();
    let reason: String = judged
        .rationale
        .as_deref()
        .unwrap_or("")
        .chars()
        .take(80)
        .collect();
    let reason = if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    };
    let said = if judged.correct { "correct" } else { "wrong" };
    Some((judged.correct, format!("verdict: {said}{score}{reason}")))
}

/// A response that breaks the protocol: the sandbox has nothing to do with it.
fn violation(kind: &FailureKind) -> bool {
    matches!(
        kind,
        FailureKind::InvalidJson(_)
            | FailureKind::NotUtf8
            | FailureKind::NoOutput
            | FailureKind::MissingField(_)
            | FailureKind::TooLarge(_)
    )
}

/// How a callback's program serves its calls (a built-in answered in gacc: one at a time).
fn mode_of(callback: &Callback) -> Mode {
    callback.program().map_or(Mode::Oneshot, |program| program.mode)
}
