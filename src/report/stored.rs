//! `report.json` read back (SPEC §5): what `gacc diff`, `gacc runs`, the charts and
//! `gacc run --json` use of a finished run's report, typed. Every field defaults, so a report
//! that lacks one loads with what it has; the names a cell and a run are compared or
//! shown by are kept as written (`Value`), so two versions of gacc compare by what they wrote.
//! (`report.md`'s template and `report.html` get the whole document: a template may read any
//! field.)

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredReport {
    /// As written; `gacc diff` refuses another schema.
    pub schema: Value,
    pub experiment: StoredExperiment,
    pub tokenizer: StoredTokenizer,
    pub dataset: StoredDataset,
    pub cells: Vec<StoredCell>,
    /// Every pair of compressors of a condition and budget (SPEC §13).
    pub pairs: Vec<StoredPair>,
    /// Every cell as a point of cost against Micro, with its Pareto rank (SPEC §15).
    pub frontier: Vec<StoredPoint>,
    /// Passed on as written (`gacc run --json`).
    pub integrity: Value,
    /// Counted only.
    pub failures: Vec<IgnoredAny>,
    /// Per role, what its calls cost.
    pub usage: BTreeMap<String, StoredUsage>,
    /// The judge audit's agreement per audit judge (SPEC §10), when the run had one.
    pub judge_audit: StoredAudit,
    /// The head line on the scoring judge (`judge_doubt.sentence`), when the run has one.
    #[serde(deserialize_with = "doubt_sentence")]
    pub judge_doubt: Option<String>,
}

fn doubt_sentence<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    let value = Value::deserialize(deserializer)?;
    Ok(value["sentence"].as_str().map(str::to_owned))
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredAudit {
    pub judges: BTreeMap<String, StoredAgreement>,
}

/// An audit judge against the scoring judge.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredAgreement {
    pub compared: u64,
    pub agreement: Option<f64>,
    pub kappa: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredExperiment {
    pub name: Option<String>,
    pub manifest_sha256: String,
    pub gacc_version: Value,
    pub conditions: Vec<Value>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredTokenizer {
    pub name: Value,
    pub revision: Value,
    pub identity_verified: Value,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredDataset {
    pub sha256: Value,
}

/// One cell: its names as written, its scores and where its budget went.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredCell {
    pub compressor: Value,
    pub condition: Value,
    /// A ratio cell's r; null for a token budget's cell.
    pub ratio: Value,
    /// A token budget's cell's L.
    pub budget_tokens: Option<Value>,
    pub complete: bool,
    /// None where nothing was measured (null in report.json).
    pub micro: Option<StoredSpread>,
    #[serde(rename = "macro")]
    pub macro_: Option<StoredSpread>,
    /// The 95% bootstrap intervals over goals, where the run has them.
    pub micro_ci95: Option<StoredInterval>,
    pub macro_ci95: Option<StoredInterval>,
    pub ledger: StoredLedger,
    /// The cell's anchors and attribution (SPEC §11), where the run has them.
    pub floor_micro: Option<f64>,
    pub ceiling_micro: Option<f64>,
    pub gap_closed: Option<f64>,
    pub attribution: Option<StoredAttribution>,
    /// The best and worst rank it can hold in its column (SPEC §13), where the run has them.
    pub rank: Option<StoredRank>,
    /// What its memories cost and when one pays for itself (SPEC §15), where the run has them.
    pub compression: Option<StoredCompression>,
    pub read_cost: Option<StoredReadCost>,
}

/// A cell's compressor calls' cost as report.json writes it (SPEC §15).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredCompression {
    #[serde(deserialize_with = "number")]
    pub usd: f64,
}

/// A cell's reading cost as report.json writes it (SPEC §15): null break-even where none.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredReadCost {
    pub break_even_questions: Option<f64>,
}

/// A cell's rank interval as report.json writes it.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub(crate) struct StoredRank {
    pub best: u64,
    pub worst: u64,
}

/// A cell's answers by evidence kept or lost (SPEC §11).
#[derive(Debug, Clone, Copy, Default, Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(default)]
pub(crate) struct StoredAttribution {
    pub kept_right: u64,
    pub kept_wrong: u64,
    pub lost_right: u64,
    pub lost_wrong: u64,
}

/// A score's mean and spread over seeds.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredSpread {
    #[serde(deserialize_with = "number")]
    pub mean: f64,
    #[serde(deserialize_with = "number")]
    pub std: f64,
}

/// A pair of compressors as report.json writes it (SPEC §13): B − A in a metric, its interval
/// over goals, Holm's p and whether they are separated.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredPair {
    pub condition: Value,
    pub ratio: Option<Value>,
    pub budget_tokens: Option<Value>,
    pub a: Value,
    pub b: Value,
    pub metric: Value,
    #[serde(deserialize_with = "number")]
    pub diff: f64,
    pub ci95: StoredInterval,
    #[serde(deserialize_with = "number")]
    pub p_holm: f64,
    pub separated: bool,
}

/// A point of the cost–quality frontier as report.json writes it (SPEC §15).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredPoint {
    pub condition: Value,
    pub compressor: Value,
    pub ratio: Option<Value>,
    pub budget_tokens: Option<Value>,
    #[serde(deserialize_with = "number")]
    pub usd_per_question: f64,
    #[serde(deserialize_with = "number")]
    pub micro: f64,
    /// 0 where it is not a count.
    #[serde(deserialize_with = "count")]
    pub pareto_rank: u64,
}

impl StoredPoint {
    /// Its budget as a column names it: `r=0.1` or `L=500`.
    pub(crate) fn budget(&self) -> String {
        match &self.budget_tokens {
            Some(tokens) => format!("L={}", text(tokens)),
            None => format!("r={}", self.ratio.as_ref().map_or_else(String::new, text)),
        }
    }

    pub(crate) fn on_frontier(&self) -> bool {
        self.pareto_rank == 1
    }
}

/// An interval as report.json writes it.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredInterval {
    #[serde(deserialize_with = "number")]
    pub low: f64,
    #[serde(deserialize_with = "number")]
    pub high: f64,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredLedger {
    #[serde(deserialize_with = "number")]
    pub retained_tokens: f64,
    #[serde(deserialize_with = "number")]
    pub unused_budget: f64,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StoredUsage {
    #[serde(deserialize_with = "number")]
    pub cost_usd: f64,
}

/// A number as written; anything else (a score of no questions is null) reads as 0.
fn number<'de, D: Deserializer<'de>>(from: D) -> Result<f64, D::Error> {
    Ok(Value::deserialize(from)?.as_f64().unwrap_or(0.0))
}

fn count<'de, D: Deserializer<'de>>(from: D) -> Result<u64, D::Error> {
    Ok(Value::deserialize(from)?.as_u64().unwrap_or(0))
}

/// A name as a person reads it: a string as it is, anything else as JSON.
pub(crate) fn text(value: &Value) -> String {
    value
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| value.to_string())
}

impl StoredReport {
    /// The report in a `report.json` value; what is missing or of another shape reads as its
    /// default.
    pub(crate) fn of(value: &Value) -> StoredReport {
        StoredReport::deserialize(value).unwrap_or_else(|_| lenient(value))
    }
}

/// A report whose fields do not all have the shape this gacc writes: each part read on its own,
/// so one odd field costs only itself.
fn lenient(value: &Value) -> StoredReport {
    fn part<T: for<'a> Deserialize<'a> + Default>(value: &Value, name: &str) -> T {
        value
            .get(name)
            .and_then(|v| T::deserialize(v).ok())
            .unwrap_or_default()
    }
    let cells: Vec<StoredCell> = value
        .get("cells")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|cell| StoredCell::deserialize(cell).unwrap_or_default())
        .collect();
    StoredReport {
        schema: value.get("schema").cloned().unwrap_or_default(),
        experiment: part(value, "experiment"),
        tokenizer: part(value, "tokenizer"),
        dataset: part(value, "dataset"),
        cells,
        pairs: part(value, "pairs"),
        frontier: part(value, "frontier"),
        integrity: value.get("integrity").cloned().unwrap_or_default(),
        failures: part(value, "failures"),
        usage: part(value, "usage"),
        judge_audit: part(value, "judge_audit"),
        judge_doubt: value["judge_doubt"]["sentence"].as_str().map(str::to_owned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_report_reads_back_what_it_has_and_defaults_the_rest() {
        let value = json!({
            "schema": "gacc.report/1",
            "experiment": {"name": "x", "manifest_sha256": "ab", "gacc_version": "0.1.0",
                           "conditions": ["own-goal"]},
            "cells": [{"compressor": "c", "condition": "own-goal", "ratio": 0.5, "complete": true,
                       "micro": {"mean": 0.5, "std": 0.1}, "macro": {"mean": 0.25, "std": 0.0},
                       "ledger": {"retained_tokens": 10, "unused_budget": 2, "other": 1}}],
            "failures": [{"job": "a"}, {"job": "b"}],
            "usage": {"reader": {"cost_usd": 0.5, "input_tokens": 3}}
        });
        let report = StoredReport::of(&value);
        assert_eq!(report.experiment.name.as_deref(), Some("x"));
        assert_eq!(report.cells[0].micro.unwrap().mean, 0.5);
        assert_eq!(report.cells[0].macro_.unwrap().mean, 0.25);
        assert_eq!(report.cells[0].ledger.retained_tokens, 10.0);
        assert_eq!(text(&report.cells[0].ratio), "0.5");
        assert_eq!(report.failures.len(), 2);
        assert_eq!(report.usage["reader"].cost_usd, 0.5);
        assert_eq!(report.tokenizer.name, Value::Null, "missing reads as its default");
        // An older or odd report: a score that is not a number reads 0; a part of another
        // shape costs only that part.
        let odd = json!({"experiment": {"name": "y"}, "dataset": [],
                         "cells": [{"compressor": "c", "micro": {"mean": null, "std": "n/a"}},
                                   {"compressor": "d", "micro": {"mean": 1.0, "std": 0.0}}, 3]});
        let report = StoredReport::of(&odd);
        assert_eq!(report.experiment.name.as_deref(), Some("y"));
        assert_eq!(report.cells.len(), 3);
        assert_eq!(
            (
                report.cells[0].compressor.as_str(),
                report.cells[0].micro.unwrap().mean
            ),
            (Some("c"), 0.0)
        );
        assert_eq!(report.cells[1].micro.unwrap().mean, 1.0);
    }
}
