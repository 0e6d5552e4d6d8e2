//! `gacc verify`'s spot checks (SPEC §12): a seeded share of the run's judge or reader calls
//! made again with the verifier's own callbacks, reported as the judge audit reports (§10).
//!
//! The verifier's callbacks are a built-in, a `[judges.NAME]` of the run's manifest, or a
//! `[judges.NAME]` / `[readers.NAME]` of a TOML file of theirs (`--callbacks FILE`, which may
//! also hold the `[models.*]` endpoints they call). Each check replays the run from the pack's
//! entries with only its own callbacks allowed to call.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::replay_folder;
use crate::app::run::{Layer, RunOptions};
use crate::error::{Error, Invalid, io};
use crate::report::audit::{Agreement, agreement};
use crate::review::diff::{CellLabel, cell_of};
use crate::store::ledger::ResultRow;
use crate::store::run_folder::{DATASET, RESULTS, RunFolder};

/// The spot checks asked for.
#[derive(Debug, Clone, Default)]
pub struct SpotChecks {
    /// Re-judge a share of the answers with this judge.
    pub rejudge: Option<String>,
    /// Re-read a share of the questions with this reader (the run's judge judges the answers).
    pub reread: Option<String>,
    /// The share, in (0, 1].
    pub fraction: f64,
    /// The verifier's own callback tables.
    pub callbacks: Option<PathBuf>,
}

/// The verifier's callbacks file, read: `--set` lines for its endpoints, and its tables.
struct Theirs {
    endpoints: Vec<String>,
    table: toml::Value,
}

impl Theirs {
    fn read(path: Option<&Path>) -> Result<Theirs, Error> {
        let Some(path) = path else {
            return Ok(Theirs {
                endpoints: Vec::new(),
                table: toml::Value::Table(toml::Table::new()),
            });
        };
        let text = std::fs::read_to_string(path).map_err(io(path))?;
        let table: toml::Value = toml::from_str(&text).map_err(|error| {
            Invalid::one(
                path.display().to_string(),
                format!("is not TOML: {}", error.message()),
            )
        })?;
        let endpoints = (table
            .get("models")
            .and_then(toml::Value::as_table)
            .into_iter()
            .flatten())
        .map(|(name, spec)| format!("models.{name}={spec}"))
        .collect();
        Ok(Theirs { endpoints, table })
    }

    /// `[kind.name]` of the file, as an inline TOML table.
    fn callback(&self, kind: &str, name: &str) -> Option<String> {
        self.table.get(kind)?.get(name).map(ToString::to_string)
    }
}

/// Runs the checks asked for; a line for each.
pub(super) fn run_checks(
    work: &Path,
    stated: &Path,
    dataset: Option<&Path>,
    layer: &Path,
    checks: &SpotChecks,
) -> Result<Vec<String>, Error> {
    let asked = checks.rejudge.is_some() || checks.reread.is_some();
    if asked && !(checks.fraction > 0.0 && checks.fraction <= 1.0) {
        let message = format!(
            "is {}: a share must be more than 0 and at most 1",
            checks.fraction
        );
        return Err(Invalid::one(String::from("--fraction"), message).into());
    }
    let theirs = Theirs::read(checks.callbacks.as_deref())?;
    let mut lines = Vec::new();
    if let Some(judge) = &checks.rejudge {
        let folder = work.join("rejudge");
        lines.push(rejudge(
            &folder,
            stated,
            dataset,
            layer,
            (judge, checks.fraction),
            &theirs,
        )?);
    }
    if let Some(reader) = &checks.reread {
        let folder = work.join("reread");
        lines.push(reread(
            &folder,
            stated,
            dataset,
            layer,
            (reader, checks.fraction),
            &theirs,
        )?);
    }
    Ok(lines)
}

/// Replays the run with `judge` as its one audit judge (§10), the only callback allowed to
/// call; its agreement with the run's verdicts and Cohen's κ, as a line.
fn rejudge(
    folder: &Path,
    stated: &Path,
    dataset: Option<&Path>,
    layer: &Path,
    (judge, fraction): (&str, f64),
    theirs: &Theirs,
) -> Result<String, Error> {
    let manifest = replay_folder(folder, stated, dataset)?;
    audit_only_with(&manifest, judge, fraction)?;
    let mut sets = theirs.endpoints.clone();
    if let Some(table) = theirs.callback("judges", judge) {
        sets.push(format!("judges.{judge}={table}"));
    }
    let rows = replayed(
        folder,
        stated,
        manifest,
        sets,
        layer,
        vec![format!("judges.{judge}")],
    )?;
    let pairs = rows
        .iter()
        .filter_map(|row| Some((row.correct, *row.audits.get(judge)?)));
    let shown = format!("rejudged by `{judge}` ({fraction} of answers)");
    Ok(line(
        &shown,
        &agreement(pairs),
        &format!("run's judge right and `{judge}` not"),
    ))
}

/// Makes the replay's manifest at `path` audit with `judge` alone at `fraction`: the run's own
/// audit judges (and its labels, which a reviewer need not have) are left out, not merged in.
fn audit_only_with(path: &Path, judge: &str, fraction: f64) -> Result<(), Error> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let mut manifest: toml::Table = toml::from_str(&text).map_err(|error| Error::Io {
        path: path.to_path_buf(),
        message: format!("is not the run's manifest: {}", error.message()),
    })?;
    if let Some(toml::Value::Table(judges)) = manifest.get_mut("judges") {
        judges.retain(|name, _| name == judge);
    }
    let audit = manifest
        .entry("audit")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(audit) = audit {
        audit.remove("labels");
        audit.insert("judges".into(), toml::Value::Array(vec![judge.into()]));
        audit.insert("fraction".into(), toml::Value::Float(fraction));
    }
    crate::files::write(path, toml::to_string(&manifest).unwrap_or(text).as_bytes())
}

/// Replays the run on a seeded share of its questions with `reader` as its reader (the run's
/// judge judges its answers; both may call); how often its verdicts agree with the run's.
fn reread(
    folder: &Path,
    stated: &Path,
    dataset: Option<&Path>,
    layer: &Path,
    (reader, fraction): (&str, f64),
    theirs: &Theirs,
) -> Result<String, Error> {
    let manifest = replay_folder(folder, stated, dataset)?;
    let share = keep_a_share(&manifest.with_file_name(DATASET), fraction)?;
    let table = theirs
        .callback("readers", reader)
        .unwrap_or_else(|| format!("{{ builtin = {} }}", toml::Value::String(reader.to_owned())));
    let mut sets = theirs.endpoints.clone();
    sets.push(format!("reader={table}"));
    let again = replayed(
        folder,
        stated,
        manifest,
        sets,
        layer,
        vec!["reader".into(), "judge".into()],
    )?;
    let run: Vec<ResultRow> = RunFolder::open(stated).read_rows(RESULTS)?;
    let key = |row: &ResultRow| {
        (
            cell_of(row),
            row.seed,
            row.goal_id.clone(),
            row.question_id.clone(),
        )
    };
    let stated: HashMap<(CellLabel, u64, String, String), Option<bool>> =
        run.iter().map(|row| (key(row), row.correct)).collect();
    let pairs = (again.iter())
        .filter(|row| share.contains(&row.question_id))
        .filter_map(|row| Some((*stated.get(&key(row))?, row.correct)));
    let shown = format!("reread by `{reader}` ({fraction} of questions)");
    Ok(line(
        &shown,
        &agreement(pairs),
        &format!("run's reader right and `{reader}` not"),
    ))
}

/// The rows of a replay of `manifest` (with `sets`) over the pack's entries, where only the
/// callbacks `allowed` may call.
fn replayed(
    folder: &Path,
    stated: &Path,
    manifest: PathBuf,
    sets: Vec<String>,
    layer: &Path,
    allowed: Vec<String>,
) -> Result<Vec<ResultRow>, Error> {
    let options = RunOptions {
        manifest,
        sets,
        out: Some(folder.join("runs")),
        quiet: true,
        layer: Some(Layer::Replay {
            cache: layer.to_path_buf(),
            allowed,
        }),
        recorded: Some(super::recorded(stated)?),
        ..RunOptions::default()
    };
    let finished = crate::app::run::run(&options)?;
    RunFolder::open(&finished.folder).read_rows(RESULTS)
}

/// Keeps in the dataset file at `path` (nested JSON Lines) a seeded share of each goal's
/// questions: those whose id `audited` picks at `fraction`, the same in every check; returns
/// their ids. Sources and goals stay, so the memories' requests do not change: a goal none of
/// whose questions is in the share keeps its first (read, but not counted).
fn keep_a_share(path: &Path, fraction: f64) -> Result<HashSet<String>, Error> {
    let text = std::fs::read_to_string(path).map_err(io(path))?;
    let mut out = String::with_capacity(text.len());
    let mut share = HashSet::new();
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        let mut source: Value = serde_json::from_str(line).map_err(|error| Error::Io {
            path: path.to_path_buf(),
            message: format!("not a dataset line: {error}"),
        })?;
        for goal in source
            .get_mut("goals")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            let Some(questions) = goal.get_mut("questions").and_then(Value::as_array_mut) else {
                continue;
            };
            let id = |q: &Value| q.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
            let first = questions.first().cloned();
            questions.retain(|q| crate::plan::audited(0, &id(q), "", fraction));
            share.extend(questions.iter().map(id));
            if questions.is_empty() {
                questions.extend(first);
            }
        }
        out.push_str(&source.to_string());
        out.push('\n');
    }
    crate::files::write(path, out.as_bytes())?;
    Ok(share)
}

/// A check's line: what was compared, agreement and κ with its interval, and the two ways
/// the verdicts differ.
fn line(shown: &str, agreement: &Agreement, one_way: &str) -> String {
    let number = |value: Option<f64>| value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.3}"));
    format!(
        "{shown}: {} compared, agreement {}, kappa {} (95% {} to {}), {one_way} {}, the reverse {}",
        agreement.compared,
        number(agreement.agreement),
        number(agreement.kappa),
        number(agreement.kappa_95.map(|i| i.low)),
        number(agreement.kappa_95.map(|i| i.high)),
        agreement.scoring_only,
        agreement.audit_only,
    )
}
