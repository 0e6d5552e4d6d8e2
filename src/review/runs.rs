//! Past runs (`gacc runs list|show`): each run folder under `runs/` summed up from its
//! `report.json` and `run.json`.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::Error;
use crate::report::stored::{StoredCell, StoredReport, text};
use crate::store::run_folder::{REPORT_JSON, RUN, RunFolder, all_runs};
use crate::store::run_record::RunRecord;

/// One run, as `gacc runs` lists it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RunSummary {
    pub folder: PathBuf,
    pub name: String,
    /// Its `--label`, if it was given one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// When it started (UTC), from `run.json`.
    pub started: String,
    /// The experiment's identity (`report.json`'s manifest SHA-256, without `[run]`).
    pub manifest_sha256: String,
    pub cells: usize,
    /// The lowest and highest mean Micro (and Macro) over its cells.
    pub micro: [f64; 2],
    #[serde(rename = "macro")]
    pub macro_: [f64; 2],
    pub failures: usize,
    /// What its results rest on cost, summed over roles (`report.json` usage).
    pub cost_usd: f64,
    /// Calls this run made and took from the cache (or an identical call), summed over roles.
    pub calls_made: u64,
    pub calls_cached: u64,
    /// Why the scoring judge's verdicts are in doubt (`report.json`'s `judge_doubt`): its
    /// Micro and Macro are marked ‡.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub judge_doubt: Option<String>,
    /// Why the summary is partial (the folder lacks or has a broken `report.json`), if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
}

/// The runs under `runs`, oldest first.
pub(crate) fn list(runs: &Path) -> Vec<RunSummary> {
    all_runs(runs).iter().map(summarize).collect()
}

/// One run's summary; a folder without a readable `report.json` (a run still going, or
/// stopped before its report) is listed with what it has.
pub(crate) fn summarize(folder: &RunFolder) -> RunSummary {
    let run = folder
        .read_text(RUN)
        .ok()
        .and_then(|text| RunRecord::parse(&text))
        .unwrap_or_default();
    let (report, incomplete) = match folder.read_json(REPORT_JSON) {
        Ok(report) => (StoredReport::of(&report), None),
        Err(error) => (StoredReport::default(), Some(error.to_string())),
    };
    let range = |metric: fn(&StoredCell) -> Option<f64>| {
        let values = report.cells.iter().filter_map(metric);
        values.fold([f64::INFINITY, f64::NEG_INFINITY], |[low, high], v| {
            [low.min(v), high.max(v)]
        })
    };
    let nothing = |[low, high]: [f64; 2]| if low > high { [0.0, 0.0] } else { [low, high] };
    RunSummary {
        folder: folder.path().to_path_buf(),
        name: report
            .experiment
            .name
            .clone()
            .or_else(|| {
                folder
                    .path()
                    .parent()?
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .unwrap_or_default(),
        label: run.label.clone(),
        started: run.started,
        manifest_sha256: report.experiment.manifest_sha256.clone(),
        cells: report.cells.len(),
        micro: nothing(range(|c| c.micro.map(|s| s.mean))),
        macro_: nothing(range(|c| c.macro_.map(|s| s.mean))),
        failures: report.failures.len(),
        cost_usd: report.usage.values().map(|role| role.cost_usd).sum(),
        calls_made: run.calls.total(|c| c.made) as u64,
        calls_cached: run.calls.total(|c| c.cached + c.shared) as u64,
        judge_doubt: report.judge_doubt.clone(),
        incomplete,
    }
}

/// A label as the table shows it: `-` for none, control characters escaped.
fn shown_label(label: Option<&str>) -> String {
    match label {
        None => "-".into(),
        Some(label) => label
            .chars()
            .flat_map(|c| match c.is_control() {
                true => c.escape_default().collect::<Vec<_>>(),
                false => vec![c],
            })
            .collect(),
    }
}

/// `gacc runs list`'s table.
pub(crate) fn render_list(runs: &[RunSummary]) -> String {
    if runs.is_empty() {
        return "no runs yet\n".into();
    }
    let mut out = format!(
        "{:<4} {:<20} {:<16} {:<12} {:<8} {:>5} {:>13} {:>13} {:>8} {:>10} {:>14}\n",
        "",
        "started",
        "experiment",
        "label",
        "manifest",
        "cells",
        "Micro",
        "Macro",
        "failures",
        "cost USD",
        "calls made/hit"
    );
    for (back, run) in runs.iter().rev().enumerate() {
        let doubt = if run.judge_doubt.is_some() { " ‡" } else { "" };
        let range = |[low, high]: [f64; 2]| format!("{low:.3}–{high:.3}{doubt}");
        out.push_str(&format!(
            "{:<4} {:<20} {:<16} {:<12} {:<8} {:>5} {:>13} {:>13} {:>8} {:>10.4} {:>14}{}\n",
            format!("-{}", back + 1),
            run.started,
            run.name,
            shown_label(run.label.as_deref()),
            run.manifest_sha256.get(..8).unwrap_or("-"),
            run.cells,
            range(run.micro),
            range(run.macro_),
            run.failures,
            run.cost_usd,
            format!("{}/{}", run.calls_made, run.calls_cached),
            if run.incomplete.is_some() {
                "  (no report)"
            } else {
                ""
            },
        ));
    }
    if runs.iter().any(|r| r.judge_doubt.is_some()) {
        out.push_str("‡ the scoring judge's verdicts are in doubt (`gacc runs show RUN` says why)\n");
    }
    out.push_str(
        "(-1 is `latest`; any of these, or a label, names a run for diff, report, trace and export)\n",
    );
    out
}

/// `gacc runs show RUN`: the summary, then every cell.
pub(crate) fn render_show(folder: &RunFolder) -> Result<String, Error> {
    let summary = summarize(folder);
    let report = StoredReport::of(&folder.read_json(REPORT_JSON)?);
    let mut out = format!(
        "{}\n  experiment {} (manifest {})\n  started {}\n  {} failures · cost {:.4} USD · calls {} made, {} cached\n",
        summary.folder.display(),
        summary.name,
        summary.manifest_sha256.get(..8).unwrap_or("-"),
        summary.started,
        summary.failures,
        summary.cost_usd,
        summary.calls_made,
        summary.calls_cached,
    );
    if let Some(doubt) = &summary.judge_doubt {
        out.push_str(&format!("  ‡ {doubt}\n"));
    }
    let mark = if summary.judge_doubt.is_some() { " ‡" } else { "" };
    for cell in &report.cells {
        out.push_str(&format!(
            "  {:<16} {:<10} r={:<6} Micro {}{mark}  Macro {}{mark}\n",
            text(&cell.compressor),
            text(&cell.condition),
            text(&cell.ratio),
            shown(cell.micro),
            shown(cell.macro_),
        ));
    }
    Ok(out)
}

/// `0.667 ± 0.012`, or `n/a` where nothing was measured.
fn shown(spread: Option<crate::report::stored::StoredSpread>) -> String {
    spread.map_or("n/a".to_owned(), |s| format!("{:.3} ± {:.3}", s.mean, s.std))
}
