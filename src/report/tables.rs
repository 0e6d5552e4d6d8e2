//! `gacc report RUN --format latex|csv` (SPEC §15): a run's results as paper tables, from its
//! report.json. Per condition, a booktabs table of Micro and Macro with their 95% intervals over
//! goals, a compressor per row and a ratio (or token budget) per pair of columns; a cell's Micro
//! is bold only where its rank interval is 1–1, that is, where it is separated from every other
//! compressor of its column (SPEC §13), so a bold never marks a best that is within noise. CSV
//! gives the same figures flat, one row per cell.

use std::collections::BTreeMap;

use serde_json::Value;

use super::stored::{StoredCell, StoredPoint, StoredReport};

/// A cell's column: its ratio, or its token budget.
fn column(cell: &StoredCell) -> String {
    match &cell.budget_tokens {
        Some(tokens) => format!("L={tokens}"),
        None => format!("r={}", text(&cell.ratio)),
    }
}

/// A name as report.json writes it: a string's text, else its JSON.
fn text(value: &Value) -> String {
    value.as_str().map_or_else(|| value.to_string(), str::to_owned)
}

/// Whether a cell is the best of its column, separated from every other compressor.
fn separated_best(cell: &StoredCell) -> bool {
    cell.rank.is_some_and(|rank| rank.best == 1 && rank.worst == 1)
}

/// `text` with LaTeX's special characters escaped.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\textbackslash{}"),
            '~' => out.push_str("\\textasciitilde{}"),
            '^' => out.push_str("\\textasciicircum{}"),
            '&' | '%' | '$' | '#' | '_' | '{' | '}' => {
                out.push('\\');
                out.push(c);
            }
            // A line break would end the row.
            '\n' | '\r' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The run's cells by condition, then by column, in the order report.json lists them.
type Grouped<'r> = Vec<(String, Vec<String>, BTreeMap<String, Vec<&'r StoredCell>>)>;

fn grouped(report: &StoredReport) -> Grouped<'_> {
    let mut groups: Grouped = Vec::new();
    for cell in &report.cells {
        let condition = text(&cell.condition);
        let index = match groups.iter().position(|(c, ..)| *c == condition) {
            Some(index) => index,
            None => {
                groups.push((condition, Vec::new(), BTreeMap::new()));
                groups.len() - 1
            }
        };
        let (_, columns, rows) = &mut groups[index];
        let at = column(cell);
        if !columns.contains(&at) {
            columns.push(at);
        }
        rows.entry(text(&cell.compressor)).or_default().push(cell);
    }
    groups
}

/// A score and its interval in LaTeX, `–` where nothing was measured.
fn latex_score(mean: Option<f64>, interval: Option<(f64, f64)>, bold: bool) -> String {
    let Some(mean) = mean else {
        return "--".to_owned();
    };
    let value = match bold {
        true => format!("\\textbf{{{mean:.3}}}"),
        false => format!("{mean:.3}"),
    };
    match interval {
        Some((low, high)) => format!("{value} {{\\scriptsize [{low:.2}, {high:.2}]}}"),
        None => value,
    }
}

/// One booktabs table per condition, ready for `\input{}`.
pub(crate) fn latex(report: &StoredReport) -> String {
    let name = escape(report.experiment.name.as_deref().unwrap_or("gacc"));
    let mut out = format!(
        "% {name}: Micro and Macro with 95% intervals over goals, written by gacc.\n\
         % Bold: the best of its column, separated from every other compressor (rank 1--1).\n\
         % Needs \\usepackage{{booktabs}}.\n"
    );
    for (condition, columns, rows) in grouped(report) {
        let spec = "r".repeat(columns.len() * 2);
        out.push_str(&format!(
            "\n\\begin{{table}}[t]\n\\centering\n\\begin{{tabular}}{{l{spec}}}\n\\toprule\n"
        ));
        let heads: Vec<String> = (columns.iter())
            .map(|c| {
                format!(
                    "\\multicolumn{{2}}{{c}}{{${}$}}",
                    escape(c).replace("L=", "L = ").replace("r=", "r = ")
                )
            })
            .collect();
        out.push_str(&format!("Compressor & {} \\\\\n", heads.join(" & ")));
        let rules: Vec<String> = (0..columns.len())
            .map(|i| format!("\\cmidrule(lr){{{}-{}}}", 2 + 2 * i, 3 + 2 * i))
            .collect();
        out.push_str(&format!("{}\n", rules.join(" ")));
        out.push_str(&format!(
            " & {} \\\\\n\\midrule\n",
            vec!["Micro & Macro"; columns.len()].join(" & ")
        ));
        for (compressor, cells) in &rows {
            let mut row = vec![escape(compressor)];
            for at in &columns {
                let cell = cells.iter().find(|cell| column(cell) == *at);
                let micro = cell.and_then(|c| c.micro.map(|s| s.mean));
                let macro_ = cell.and_then(|c| c.macro_.map(|s| s.mean));
                let bounds = |i: Option<super::stored::StoredInterval>| i.map(|i| (i.low, i.high));
                let bold = cell.is_some_and(|c| separated_best(c));
                row.push(latex_score(micro, cell.and_then(|c| bounds(c.micro_ci95)), bold));
                row.push(latex_score(
                    macro_,
                    cell.and_then(|c| bounds(c.macro_ci95)),
                    false,
                ));
            }
            out.push_str(&format!("{} \\\\\n", row.join(" & ")));
        }
        out.push_str(&format!(
            "\\bottomrule\n\\end{{tabular}}\n\\caption{{{name}, condition {}: Micro and Macro (95\\% intervals over goals).}}\n\\end{{table}}\n",
            escape(&condition)
        ));
    }
    out.push_str(&latex_frontier(report, &name));
    out
}

/// Per condition, a booktabs table of every point of cost against Micro by Pareto rank, the
/// frontier (rank 1) first and starred (SPEC §15).
fn latex_frontier(report: &StoredReport, name: &str) -> String {
    let mut out = String::new();
    let mut conditions: Vec<String> = Vec::new();
    for point in &report.frontier {
        let condition = text(&point.condition);
        if !conditions.contains(&condition) {
            conditions.push(condition);
        }
    }
    for condition in conditions {
        let mut points: Vec<&StoredPoint> = (report.frontier.iter())
            .filter(|p| text(&p.condition) == condition)
            .collect();
        points.sort_by(|a, b| {
            (a.pareto_rank.cmp(&b.pareto_rank)).then(a.usd_per_question.total_cmp(&b.usd_per_question))
        });
        out.push_str(
            "\n\\begin{table}[t]\n\\centering\n\\begin{tabular}{llrrr}\n\\toprule\n\
             Compressor & Budget & USD / question & Micro & Pareto rank \\\\\n\\midrule\n",
        );
        for point in points {
            let star = if point.on_frontier() { "$\\star$ " } else { "" };
            out.push_str(&format!(
                "{star}{} & ${}$ & {:.6} & {:.3} & {} \\\\\n",
                escape(&text(&point.compressor)),
                escape(&point.budget())
                    .replace("L=", "L = ")
                    .replace("r=", "r = "),
                point.usd_per_question,
                point.micro,
                point.pareto_rank,
            ));
        }
        out.push_str(&format!(
            "\\bottomrule\n\\end{{tabular}}\n\\caption{{{name}, condition {}: cost per question (compression and reading) against Micro; $\\star$ on the frontier (no other setting costs no more and scores no less).}}\n\\end{{table}}\n",
            escape(&condition)
        ));
    }
    out
}

/// The same figures flat: one row per cell (written by the `csv` crate, as `gacc export` is).
pub(crate) fn csv(report: &StoredReport) -> String {
    let mut csv = csv::WriterBuilder::new()
        .quote_style(csv::QuoteStyle::Necessary)
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    let header = [
        "condition",
        "compressor",
        "ratio",
        "budget_tokens",
        "micro",
        "micro_low",
        "micro_high",
        "macro",
        "macro_low",
        "macro_high",
        "rank_best",
        "rank_worst",
        "separated_best",
        "usd_per_question",
        "pareto_rank",
    ];
    let number = |value: Option<f64>| value.map_or_else(String::new, |v| format!("{v}"));
    let mut rows = vec![header.map(str::to_owned)];
    for cell in &report.cells {
        let (micro_ci, macro_ci) = (cell.micro_ci95, cell.macro_ci95);
        let point = (report.frontier.iter()).find(|p| {
            p.compressor == cell.compressor
                && p.condition == cell.condition
                && p.budget_tokens == cell.budget_tokens
                && (cell.budget_tokens.is_some() || p.ratio.as_ref() == Some(&cell.ratio))
        });
        rows.push([
            text(&cell.condition),
            text(&cell.compressor),
            match cell.budget_tokens {
                Some(_) => String::new(),
                None => text(&cell.ratio),
            },
            cell.budget_tokens.as_ref().map_or_else(String::new, text),
            number(cell.micro.map(|s| s.mean)),
            number(micro_ci.map(|i| i.low)),
            number(micro_ci.map(|i| i.high)),
            number(cell.macro_.map(|s| s.mean)),
            number(macro_ci.map(|i| i.low)),
            number(macro_ci.map(|i| i.high)),
            cell.rank.map_or_else(String::new, |r| r.best.to_string()),
            cell.rank.map_or_else(String::new, |r| r.worst.to_string()),
            separated_best(cell).to_string(),
            number(point.map(|p| p.usd_per_question)),
            point.map_or_else(String::new, |p| p.pareto_rank.to_string()),
        ]);
    }
    for row in rows {
        // Writing to memory cannot fail.
        let _ = csv.write_record(&row);
    }
    let bytes = csv.into_inner().unwrap_or_default();
    String::from_utf8(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_named_with_specials_is_quoted_in_csv_escaped_in_latex_and_bold_only_at_rank_1_1() {
        let cell = |name: &str, micro: f64, best: u64, worst: u64| {
            serde_json::json!({"compressor": name, "condition": "own-goal", "ratio": 0.5,
                "micro": {"mean": micro, "std": 0.0}, "macro": {"mean": micro, "std": 0.0},
                "micro_ci95": {"low": micro - 0.1, "high": micro}, "rank": {"best": best, "worst": worst}})
        };
        let report = StoredReport::of(&serde_json::json!({
            "experiment": {"name": "my_run"},
            "cells": [cell("a,b \"c\"", 0.9, 1, 1), cell("top_k", 0.5, 2, 2)],
        }));
        let csv = csv(&report);
        assert!(csv.contains("own-goal,\"a,b \"\"c\"\"\",0.5,,0.9,"), "{csv}");
        assert_eq!(csv.lines().count(), 3);
        let latex = latex(&report);
        assert!(
            latex.contains("top\\_k & 0.500") && latex.contains("my\\_run"),
            "{latex}"
        );
        assert_eq!(latex.matches("\\textbf{0.900}").count(), 1, "{latex}");
        assert_eq!(latex.matches("\\textbf").count(), 1, "{latex}");
    }

    #[test]
    fn names_are_escaped_for_latex() {
        assert_eq!(
            escape("a_b & 50% {x} #1 $ ~ ^ \\"),
            "a\\_b \\& 50\\% \\{x\\} \\#1 \\$ \\textasciitilde{} \\textasciicircum{} \\textbackslash{}"
        );
        assert_eq!(escape("two\nlines"), "two lines");
    }
}
