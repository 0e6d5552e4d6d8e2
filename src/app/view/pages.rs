//! `gacc view`'s pages over finished runs: the list, a run, a cell's questions, and two runs
//! compared. Each is plain HTML made on the server (figures are in the DOM as text and as
//! `data-value`), escaped, and passed through the redactor before it is sent.

use std::fmt::Write as _;

use super::site::{Listed, Loaded};
use crate::report::html::escape_html;
use crate::report::stored::{StoredCell, StoredPair, StoredSpread, text};
use crate::review::diff::{CellLabel, Diff};
use crate::review::runs::summarize;

/// The page's frame: its title, the style, a link home, and `body`.
pub(super) fn page(title: &str, body: &str) -> String {
    let page = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · gacc view</title><style>{STYLE}</style></head>\n<body>\
         <nav><a href=\"/\">runs</a></nav>\n<h1>{title}</h1>\n{body}\n</body></html>\n",
        title = escape_html(title),
    );
    crate::secrets::redact(&page).into_owned()
}

const STYLE: &str = "body{font:15px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:72em;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:.8em 0}td,th{border-bottom:1px solid #ddd;padding:.25em .6em;text-align:left;vertical-align:top}\
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}nav{margin-bottom:1em}\
pre{white-space:pre-wrap;background:#f6f6f6;padding:.7em;max-height:30em;overflow:auto}\
mark.evidence{background:#ffe58a}mark.kept{background:#b6efb6}mark.lost{background:#f7c1c1}\
.right{color:#17702a}.wrong{color:#b3261e}.cut{color:#999;text-decoration:line-through}\
.bar{display:inline-block;height:.8em;background:#4a78c2}";

/// `text` as a query value.
pub(super) fn query(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~/".contains(&byte) {
            out.push(byte as char);
        } else {
            let _ = write!(out, "%{byte:02X}");
        }
    }
    out
}

/// A figure as a cell: three decimals shown, the whole value in `data-value`.
fn figure(name: &str, value: Option<f64>) -> String {
    match value {
        Some(v) => format!("<td class=\"n\" data-field=\"{name}\" data-value=\"{v}\">{v:.3}</td>"),
        None => format!("<td class=\"n\" data-field=\"{name}\">n/a</td>"),
    }
}

/// The runs list (as `gacc runs list`) and the packs.
pub(super) fn runs(runs: &[Listed], packs: &[String]) -> String {
    let mut body = String::from(
        "<table id=\"runs\"><tr><th>started</th><th>experiment</th><th>label</th><th>manifest</th>\
         <th class=\"n\">cells</th><th class=\"n\">Micro</th><th class=\"n\">Macro</th>\
         <th class=\"n\">failures</th><th class=\"n\">cost USD</th><th class=\"n\">calls made</th>\
         <th class=\"n\">cached</th><th></th></tr>\n",
    );
    for run in runs.iter().rev() {
        let s = summarize(&run.folder);
        let range = |[low, high]: [f64; 2]| format!("{low:.3}–{high:.3}");
        let state = if s.incomplete.is_some() {
            format!(
                "<a href=\"/live?run={}\">in flight or stopped</a>",
                query(&run.id)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            body,
            "<tr data-run=\"{id}\"><td><a href=\"/run?run={q}\">{started}</a></td><td>{name}</td><td>{label}</td>\
             <td><code>{sha}</code></td><td class=\"n\">{cells}</td><td class=\"n\">{micro}</td>\
             <td class=\"n\">{macro_}</td><td class=\"n\">{failures}</td><td class=\"n\">{cost:.4}</td>\
             <td class=\"n\">{made}</td><td class=\"n\">{cached}</td><td>{state}</td></tr>",
            id = escape_html(&run.id),
            q = query(&run.id),
            started = escape_html(if s.started.is_empty() { &run.id } else { &s.started }),
            name = escape_html(&s.name),
            label = escape_html(s.label.as_deref().unwrap_or("")),
            sha = escape_html(s.manifest_sha256.get(..8).unwrap_or("-")),
            cells = s.cells,
            micro = range(s.micro),
            macro_ = range(s.macro_),
            failures = s.failures,
            cost = s.cost_usd,
            made = s.calls_made,
            cached = s.calls_cached,
        );
    }
    body.push_str("</table>\n");
    if runs.is_empty() {
        body.push_str("<p>No runs here yet: <code>gacc run MANIFEST</code> makes one.</p>\n");
    }
    if !packs.is_empty() {
        body.push_str("<h2>Packs</h2>\n<ul id=\"packs\">\n");
        for pack in packs {
            let _ = writeln!(
                body,
                "<li><a href=\"/run?run={}\">{}</a></li>",
                query(pack),
                escape_html(pack)
            );
        }
        body.push_str("</ul>\n");
    }
    page("Runs", &body)
}

/// A cell's name as its report gives it.
fn label(cell: &StoredCell) -> String {
    let budget = match &cell.budget_tokens {
        Some(tokens) => format!("L={}", text(tokens)),
        None => format!("r={}", text(&cell.ratio)),
    };
    format!(
        "{} · {} · {budget}",
        text(&cell.compressor),
        text(&cell.condition)
    )
}

/// A run's page: its cells with their figures (each opening its questions), links to the
/// full report and the trace's live page, and a form to compare it with another run.
pub(super) fn run(id: &str, loaded: &Loaded, others: &[Listed]) -> String {
    let report = &loaded.report;
    let mut body = format!(
        "<p>Manifest <code>{}</code> · gacc {} · tokenizer {} {} · dataset <code>{}</code></p>\n\
         <p><a href=\"/report?run={q}\">the full report</a> · <a href=\"/live?run={q}\">progress and calls</a></p>\n",
        escape_html(report.experiment.manifest_sha256.get(..16).unwrap_or("-")),
        escape_html(&text(&report.experiment.gacc_version)),
        escape_html(&text(&report.tokenizer.name)),
        escape_html(&text(&report.tokenizer.revision)),
        escape_html(&text(&report.dataset.sha256).chars().take(16).collect::<String>()),
        q = query(id),
    );
    body.push_str(
        "<table id=\"cells\"><tr><th>compressor</th><th>condition</th><th>budget</th>\
         <th class=\"n\">questions</th><th class=\"n\">Micro</th><th class=\"n\">± std</th>\
         <th class=\"n\">Macro</th><th class=\"n\">retained tokens</th><th class=\"n\">compression USD</th>\
         <th class=\"n\">break-even questions</th><th></th></tr>\n",
    );
    for (index, cell) in report.cells.iter().enumerate() {
        let questions = rows_of(loaded, cell).count();
        let mean = |s: Option<StoredSpread>| s.map(|s| s.mean);
        let _ = writeln!(
            body,
            "<tr data-cell=\"{index}\"><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{questions}</td>{}{}{}{}{}{}\
             <td><a href=\"/cell?run={}&amp;cell={index}\">questions</a></td></tr>",
            escape_html(&text(&cell.compressor)),
            escape_html(&text(&cell.condition)),
            escape_html(&match &cell.budget_tokens {
                Some(tokens) => format!("L={}", text(tokens)),
                None => format!("r={}", text(&cell.ratio)),
            }),
            figure("micro", mean(cell.micro)),
            figure("micro_std", cell.micro.map(|s| s.std)),
            figure("macro", mean(cell.macro_)),
            figure("retained_tokens", Some(cell.ledger.retained_tokens)),
            figure("compression_usd", cell.compression.map(|c| c.usd)),
            figure(
                "break_even_questions",
                cell.read_cost.and_then(|r| r.break_even_questions)
            ),
            query(id),
        );
    }
    body.push_str("</table>\n");
    body.push_str(&pairs(&report.pairs));
    body.push_str(&frontier(report));
    let _ = writeln!(
        body,
        "<p>{} failures · cost {:.4} USD</p>",
        report.failures.len(),
        report.usage.values().map(|u| u.cost_usd).sum::<f64>()
    );
    if others.iter().any(|o| o.id != id) {
        let _ = write!(
            body,
            "<form action=\"/compare\"><input type=\"hidden\" name=\"a\" value=\"{}\">Compare with \
             <select name=\"b\">",
            escape_html(id)
        );
        for other in others.iter().rev().filter(|o| o.id != id) {
            let _ = write!(body, "<option value=\"{0}\">{0}</option>", escape_html(&other.id));
        }
        body.push_str("</select> <button>compare</button></form>\n");
    }
    page(&format!("Run {id}"), &body)
}

/// The cost–quality frontier (SPEC §15): the chart, and the points on it per condition.
fn frontier(report: &crate::report::stored::StoredReport) -> String {
    let conditions: Vec<String> = report.experiment.conditions.iter().map(text).collect();
    let Ok(Some(svg)) = crate::report::charts::frontier_svg(report, &conditions) else {
        return String::new();
    };
    let mut out = String::from("<h2>Frontier</h2>\n");
    out.push_str(&crate::report::html::figure(
        "Micro against USD per question (log axis); the frontier joined and ringed",
        &svg,
    ));
    out.push_str(
        "<table id=\"frontier\"><tr><th>condition</th><th>compressor</th><th>budget</th>\
         <th class=\"n\">USD / question</th><th class=\"n\">Micro</th><th class=\"n\">Pareto rank</th></tr>\n",
    );
    for point in &report.frontier {
        let _ = writeln!(
            out,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td class=\"n\" data-field=\"usd_per_question\" \
             data-value=\"{usd}\">{usd:.6}</td>{}<td class=\"n\">{}</td></tr>",
            if point.on_frontier() {
                " class=\"front\""
            } else {
                ""
            },
            escape_html(&text(&point.condition)),
            escape_html(&text(&point.compressor)),
            escape_html(&point.budget()),
            figure("frontier_micro", Some(point.micro)),
            point.pareto_rank,
            usd = point.usd_per_question,
        );
    }
    out.push_str("</table>\n");
    out
}

/// A run's pairs of compressors (SPEC §13), each with its verdict: separated, or within noise.
fn pairs(pairs: &[StoredPair]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let mut table = String::from(
        "<h2>Pairs</h2>\n<p>B − A on the goals both scored; goals resampled (a paired bootstrap, a \
         sign-flip permutation), Holm-adjusted over the run's pairs.</p>\n<table id=\"pairs\"><tr>\
         <th>condition</th><th>budget</th><th>A</th><th>B</th><th>metric</th><th class=\"n\">B − A</th>\
         <th class=\"n\">95%</th><th class=\"n\">p (Holm)</th><th>verdict</th></tr>\n",
    );
    for pair in pairs {
        let budget = match (&pair.budget_tokens, &pair.ratio) {
            (Some(tokens), _) => format!("L={}", text(tokens)),
            (None, Some(ratio)) => format!("r={}", text(ratio)),
            (None, None) => String::new(),
        };
        let _ = writeln!(
            table,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{:+.3}</td>\
             <td class=\"n\">[{:+.3}, {:+.3}]</td><td class=\"n\">{:.4}</td><td>{}</td></tr>",
            escape_html(&text(&pair.condition)),
            escape_html(&budget),
            escape_html(&text(&pair.a)),
            escape_html(&text(&pair.b)),
            escape_html(&text(&pair.metric)),
            pair.diff,
            pair.ci95.low,
            pair.ci95.high,
            pair.p_holm,
            if pair.separated {
                "separated"
            } else {
                "within noise"
            },
        );
    }
    table.push_str("</table>\n");
    table
}

/// The result rows of a report's cell, with their place in `results.jsonl`.
pub(super) fn rows_of<'a>(
    loaded: &'a Loaded,
    cell: &StoredCell,
) -> impl Iterator<Item = (usize, &'a crate::store::ledger::ResultRow)> {
    let places = loaded
        .by_cell
        .get(&CellLabel::of(cell))
        .map_or(&[][..], Vec::as_slice);
    places
        .iter()
        .filter_map(|&at| Some((at, loaded.results.get(at)?)))
}

/// Rows a cell's page lists at most.
const LISTED: usize = 2000;

/// A cell's questions: each with its verdict and a link to its drill-down.
pub(super) fn cell(id: &str, loaded: &Loaded, index: usize) -> Option<String> {
    let cell = loaded.report.cells.get(index)?;
    let mut body = String::from(
        "<table id=\"questions\"><tr><th class=\"n\">seed</th><th>goal</th><th>question</th>\
         <th>answer</th><th>verdict</th></tr>\n",
    );
    let mut count = 0;
    for (row_index, row) in rows_of(loaded, cell) {
        count += 1;
        if count > LISTED {
            continue;
        }
        let answer: String = row.answer.as_deref().unwrap_or("").chars().take(120).collect();
        let _ = writeln!(
            body,
            "<tr><td class=\"n\">{}</td><td>{}</td><td><a href=\"/question?run={}&amp;row={row_index}\">{}</a></td>\
             <td>{}</td><td>{}</td></tr>",
            row.seed,
            escape_html(&row.goal_id),
            query(id),
            escape_html(&row.question_id),
            escape_html(&answer),
            verdict(row.correct, row.failure.as_deref()),
        );
    }
    body.push_str("</table>\n");
    if count > LISTED {
        let _ = writeln!(
            body,
            "<p>The first {LISTED} of {count} questions; <code>gacc export</code> gives them all.</p>"
        );
    }
    Some(page(&format!("{} — {}", id, label(cell)), &body))
}

/// A verdict as a word in its colour.
pub(super) fn verdict(correct: Option<bool>, failure: Option<&str>) -> String {
    match (correct, failure) {
        (Some(true), _) => "<span class=\"right\" data-correct=\"true\">right</span>".into(),
        (Some(false), _) => "<span class=\"wrong\" data-correct=\"false\">wrong</span>".into(),
        (None, Some(why)) => format!("<span data-correct=\"null\">failed: {}</span>", escape_html(why)),
        (None, None) => "<span data-correct=\"null\">not judged</span>".into(),
    }
}

/// Two runs compared, as `gacc diff` compares them.
pub(super) fn compare(diff: &Diff, ids: (&str, &str)) -> String {
    let mut body = format!(
        "<p>A: <a href=\"/run?run={}\">{}</a><br>B: <a href=\"/run?run={}\">{}</a></p>\n",
        query(ids.0),
        escape_html(ids.0),
        query(ids.1),
        escape_html(ids.1)
    );
    if !diff.settings.is_empty() {
        body.push_str(
            "<h2>Settings</h2>\n<table id=\"settings\"><tr><th>key</th><th>A</th><th>B</th></tr>\n",
        );
        for s in &diff.settings {
            let shown = |v: &Option<String>| escape_html(v.as_deref().unwrap_or("(unset)"));
            let _ = writeln!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape_html(&s.key),
                shown(&s.a),
                shown(&s.b)
            );
        }
        body.push_str("</table>\n");
    }
    body.push_str(
        "<h2>Cells</h2>\n<p>Micro: paired sign-flip permutation over the goals both runs scored \
         (a goal's questions share one memory); McNemar over questions, which counts them as \
         independent, is shown and decides nothing. Macro: paired bootstrap over goals, 95% \
         interval of B − A.</p>\n\
         <table id=\"compare\"><tr><th>compressor</th><th>condition</th><th>budget</th>\
         <th class=\"n\">Micro A</th><th class=\"n\">Micro B</th><th class=\"n\">Δ Micro</th>\
         <th class=\"n\">goal p</th><th class=\"n\">right→wrong</th><th class=\"n\">wrong→right</th><th class=\"n\">McNemar p (questions)</th>\
         <th class=\"n\">Macro A</th><th class=\"n\">Macro B</th><th class=\"n\">Δ Macro</th><th>95% interval</th><th></th></tr>\n",
    );
    for c in &diff.cells {
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td>{}{}{}{}<td class=\"n\">{}</td><td class=\"n\">{}</td>{}{}{}{}\
             <td>[{:+.3}, {:+.3}]</td><td>{}</td></tr>",
            escape_html(&c.cell.compressor),
            escape_html(&c.cell.condition),
            escape_html(&c.cell.ratio),
            figure("micro_a", c.micro_a),
            figure("micro_b", c.micro_b),
            figure("micro_delta", c.micro_delta),
            figure("goal_p", Some(c.micro_test.p_value)),
            c.mcnemar.right_to_wrong,
            c.mcnemar.wrong_to_right,
            figure("mcnemar_p", Some(c.mcnemar.p_value)),
            figure("macro_a", c.macro_a),
            figure("macro_b", c.macro_b),
            figure("macro_delta", c.macro_delta),
            c.macro_bootstrap.ci95_low,
            c.macro_bootstrap.ci95_high,
            match c.verdict {
                "worse" => format!("<span class=\"wrong\">{}</span>", escape_html(&c.verdict_text())),
                _ => escape_html(&c.verdict_text()),
            },
        );
    }
    body.push_str("</table>\n");
    let _ = writeln!(
        body,
        "<h2>Flipped questions</h2>\n<p id=\"flipped\" data-value=\"{}\">{} questions flipped.</p>",
        diff.flipped.len(),
        diff.flipped.len()
    );
    body.push_str(&flips(diff));
    page("Two runs compared", &body)
}

/// The flipped questions' table (the first `LISTED`).
fn flips(diff: &Diff) -> String {
    let mut body = String::new();
    if !diff.flipped.is_empty() {
        body.push_str("<table id=\"flips\"><tr><th>cell</th><th class=\"n\">seed</th><th>question</th><th></th><th>answer A</th><th>answer B</th></tr>\n");
        for f in diff.flipped.iter().take(LISTED) {
            let clip = |s: &str| escape_html(&s.chars().take(120).collect::<String>());
            let _ = writeln!(
                body,
                "<tr><td>{} · {} · {}</td><td class=\"n\">{}</td><td>{} <code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape_html(&f.cell.compressor),
                escape_html(&f.cell.condition),
                escape_html(&f.cell.ratio),
                f.seed,
                clip(&f.question),
                escape_html(&f.question_id),
                escape_html(f.direction.as_str()),
                clip(&f.answer_a),
                clip(&f.answer_b),
            );
        }
        body.push_str("</table>\n");
    }
    body
}
