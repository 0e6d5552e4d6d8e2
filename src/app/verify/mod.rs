//! `gacc verify PACK|RUN` (SPEC §12): every figure a run states, recomputed from its cache
//! entries and its dataset, and compared.
//!
//! The run is replayed from its own manifest with no call allowed: every answer comes from
//! the entries the pack (or the run's cache) holds, and everything else is recomputed as a run
//! computes it: each source's `N`, each `L`, each cut and re-encoded count with the declared
//! tokenizer, the ledger, every row's verdict from its judge entry, every metric, interval and
//! integrity counter. A pack's members are checked against its `SHA256SUMS` first. Each
//! stated figure that differs from the recomputed one is listed: file, field, stated,
//! recomputed.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

mod spot;

pub use spot::SpotChecks;

use super::Ended;
use super::run::{Layer, RunOptions};
use crate::error::{Error, io};
use crate::inputs::manifest::Recorded;
use crate::store::pack;
use crate::store::run_folder::{DATASET, MANIFEST, MEMORIES, REPORT_JSON, RESULTS, RUN, RunFolder, resolve};
use crate::store::run_record::RunRecord;

/// At most this many differences are printed (all are counted).
const SHOWN: usize = 40;

/// A stated figure that does not follow from the entries and the dataset.
#[derive(Debug, Clone, PartialEq)]
struct Figure {
    file: String,
    field: String,
    stated: String,
    recomputed: String,
}

/// `gacc verify TARGET`: exit 0 printing "verified", or 1 listing every figure that does not
/// follow. Works in a scratch folder of its own, removed after.
pub fn verify(
    runs: &Path,
    target: &Path,
    dataset: Option<&Path>,
    cache: Option<&Path>,
    checks: &SpotChecks,
) -> Result<Ended, Error> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let work = std::env::temp_dir().join(format!("gacc-verify-{}-{nanos}", std::process::id()));
    let result = verify_in(&work, runs, target, dataset, cache, checks);
    let _ = std::fs::remove_dir_all(&work);
    let (figures, checked, failed) = result?;
    for line in checked {
        println!("{}", crate::secrets::redact(&line));
    }
    if figures.is_empty() {
        println!("verified");
        if failed > 0 {
            println!(
                "({failed} job(s) failed in the run and are taken as it recorded them: a failed call is never cached, and their questions are left out of its scores)"
            );
        }
        return Ok(Ended::Success);
    }
    for figure in figures.iter().take(SHOWN) {
        // Stated values come from files a run wrote from answers: through the one redactor.
        let line = format!(
            "{}: {}: stated {}, recomputed {}",
            figure.file, figure.field, figure.stated, figure.recomputed
        );
        println!("{}", printable(&crate::secrets::redact(&line)));
    }
    if figures.len() > SHOWN {
        println!("… and {} more", figures.len() - SHOWN);
    }
    eprintln!(
        "{} figure(s) do not follow from the entries and the dataset",
        figures.len()
    );
    Ok(Ended::Failed)
}

/// `text` with each control character escaped: a pack's names and lists are anyone's bytes,
/// and must not move the terminal's cursor or colour what follows.
fn printable(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

fn verify_in(
    work: &Path,
    runs: &Path,
    target: &Path,
    dataset: Option<&Path>,
    cache: Option<&Path>,
    checks: &SpotChecks,
) -> Result<(Vec<Figure>, Vec<String>, usize), Error> {
    let mut figures = Vec::new();
    let (stated, layer) = if target.is_file() {
        let members = pack::read_members(target)?;
        figures.extend(pack::disagreements(&members).into_iter().map(|d| Figure {
            file: d.member,
            field: "sha256".into(),
            stated: d.stated,
            recomputed: d.recomputed,
        }));
        let unpacked = work.join("pack");
        pack::write_members(&members, &unpacked)?;
        (unpacked.join(pack::RUN), unpacked.join("cache"))
    } else {
        let folder = resolve(target, runs)?.path().to_path_buf();
        let cache = match cache {
            Some(cache) => cache.to_path_buf(),
            None => crate::store::run_folder::cache_of(&folder)?,
        };
        (folder, cache)
    };
    let manifest = replay_folder(&work.join("replay"), &stated, dataset)?;
    let failures = recorded_failures(&stated);
    let failed = failures.len();
    let options = RunOptions {
        manifest,
        out: Some(work.join("replay").join("runs")),
        quiet: true,
        layer: Some(Layer::Replay {
            cache: layer.clone(),
            allowed: Vec::new(),
        }),
        recorded: Some(recorded(&stated)?),
        replayed_failures: failures,
        ..RunOptions::default()
    };
    let finished = super::run::run(&options)?;
    let replayed = finished.folder;
    let damaged = finished.summary_json["cache_damaged"].as_u64().unwrap_or(0);
    figures.extend(compare_json(&stated, &replayed, REPORT_JSON)?);
    for file in [MEMORIES, RESULTS] {
        figures.extend(compare_rows(&stated, &replayed, file)?);
    }
    let mut checked = spot::run_checks(work, &stated, dataset, &layer, checks)?;
    if damaged > 0 {
        checked.insert(
            0,
            format!("the cache has {damaged} entr{} that failed {} checksum: not used (the figures that rest on them do not follow)", if damaged == 1 { "y" } else { "ies" }, if damaged == 1 { "its" } else { "their" }),
        );
    }
    Ok((figures, checked, failed))
}

/// The failures the run at `stated` recorded (its report's): a replay fails those jobs as they
/// failed, since a failed call is never cached. A report that lists none, or cannot be read
/// (the comparison names it), gives none.
fn recorded_failures(stated: &Path) -> Vec<Value> {
    let Ok(text) = std::fs::read_to_string(stated.join(REPORT_JSON)) else {
        return Vec::new();
    };
    let report: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    report["failures"].as_array().cloned().unwrap_or_default()
}

/// What the run at `stated` recorded of its callbacks' files: its replay's identities.
pub(super) fn recorded(stated: &Path) -> Result<std::sync::Arc<Recorded>, Error> {
    let path = stated.join(RUN);
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    let record = RunRecord::parse(&text).ok_or_else(|| Error::Io {
        path: path.clone(),
        message: format!(
            "is not a run record of this gacc's format ({})",
            crate::store::run_record::RUN_SCHEMA
        ),
    })?;
    Ok(std::sync::Arc::new(Recorded {
        scripts: record.scripts,
        templates: record.templates,
    }))
}

/// A folder holding the run's manifest and run record, and the dataset to verify against (the
/// run's copy, or `dataset` converted to the run folder's form); the manifest's path.
pub(super) fn replay_folder(replay: &Path, stated: &Path, dataset: Option<&Path>) -> Result<PathBuf, Error> {
    let run = replay.join("run");
    // The replay's own project: its cache starts empty and only the layer answers.
    let marker = replay.join(crate::inputs::manifest::PROJECT_MARKER);
    std::fs::create_dir_all(&marker).map_err(io(&marker))?;
    std::fs::create_dir_all(replay.join("runs")).map_err(io(replay))?;
    std::fs::create_dir_all(&run).map_err(io(&run))?;
    for name in [MANIFEST, RUN] {
        std::fs::copy(stated.join(name), run.join(name)).map_err(io(&stated.join(name)))?;
    }
    match dataset {
        Some(path) => {
            let loaded = crate::inputs::dataset::load_path(path).map_err(crate::error::Invalid)?;
            crate::files::write(&run.join(DATASET), &crate::inputs::dataset::nested_jsonl(&loaded))?;
        }
        None => {
            let copy = stated.join(DATASET);
            if !copy.is_file() {
                return Err(Error::Io {
                    path: copy,
                    message:
                        "the run holds no dataset (packed with --no-dataset?): give it with --dataset PATH"
                            .into(),
                });
            }
            std::fs::copy(&copy, run.join(DATASET)).map_err(io(&copy))?;
        }
    }
    Ok(run.join(MANIFEST))
}

/// Every field of `file` (JSON) that differs between the stated and the replayed run.
fn compare_json(stated: &Path, replayed: &Path, file: &str) -> Result<Vec<Figure>, Error> {
    let read = |folder: &Path| -> Result<Value, Error> {
        let path = folder.join(file);
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    };
    let mut figures = Vec::new();
    differences(file, "", &read(stated)?, &read(replayed)?, &mut figures);
    Ok(figures)
}

/// Every field of every row of `file` (JSON Lines) that differs, row by row in plan order.
/// A ledger row's `cached` says where this run found its memory, not a figure: left out.
fn compare_rows(stated: &Path, replayed: &Path, file: &str) -> Result<Vec<Figure>, Error> {
    let read = |folder: &Path| -> Result<Vec<Value>, Error> {
        let folder = RunFolder::open(folder);
        let path = folder.file(file);
        let mut rows = Vec::new();
        for line in folder.open_lines(file)?.lines() {
            let line = line.map_err(io(&path))?;
            if line.trim().is_empty() {
                continue;
            }
            let mut row: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if let Some(row) = row.as_object_mut() {
                row.remove("cached");
            }
            rows.push(row);
        }
        Ok(rows)
    };
    let (stated, replayed) = (read(stated)?, read(replayed)?);
    let mut figures = Vec::new();
    if stated.len() != replayed.len() {
        figures.push(Figure {
            file: file.into(),
            field: "rows".into(),
            stated: stated.len().to_string(),
            recomputed: replayed.len().to_string(),
        });
    }
    for (at, (left, right)) in stated.iter().zip(&replayed).enumerate() {
        differences(&format!("{file} line {}", at + 1), "", left, right, &mut figures);
    }
    Ok(figures)
}

/// Adds each leaf where `stated` and `recomputed` differ, named by its path (`cells[0].micro.mean`).
fn differences(file: &str, path: &str, stated: &Value, recomputed: &Value, out: &mut Vec<Figure>) {
    match (stated, recomputed) {
        (Value::Object(left), Value::Object(right)) => {
            let keys: std::collections::BTreeSet<&String> = left.keys().chain(right.keys()).collect();
            for key in keys {
                let inner = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                let (l, r) = (
                    left.get(key).unwrap_or(&Value::Null),
                    right.get(key).unwrap_or(&Value::Null),
                );
                differences(file, &inner, l, r, out);
            }
        }
        (Value::Array(left), Value::Array(right)) if left.len() == right.len() => {
            for (at, (l, r)) in left.iter().zip(right).enumerate() {
                differences(file, &format!("{path}[{at}]"), l, r, out);
            }
        }
        (left, right) if left != right => out.push(Figure {
            file: file.into(),
            field: if path.is_empty() {
                "(whole)".into()
            } else {
                path.into()
            },
            stated: left.to_string(),
            recomputed: right.to_string(),
        }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_control_character_is_printed_escaped_and_the_rest_as_is() {
        assert_eq!(
            super::printable("run/\u{1b}[2J \"x\" é\n"),
            "run/\\u{1b}[2J \"x\" é\\n"
        );
    }
}
