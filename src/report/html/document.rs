//! The page's document: every section of `report.md`, as HTML a reader sees without
//! JavaScript. The page's script only sorts its tables and opens goals.
//!
//! `report.md`'s default template is rendered over the report and turned into HTML, section
//! by section: *Results* gets the richer table below (budget use, evidence bars, floor and
//! ceiling, each cell a sort key), *Charts* the inlined SVGs. The run's own record is left out
//! (`run` is empty), so a page made from the same report is the same page whichever run made it.

use pulldown_cmark::{Event, Options, Parser};
use serde_json::{Value, json};

use super::escape_html;

/// The document's HTML: a header (title, warnings, facts) and one `<section>` per heading of
/// `report.md`, Charts holding `charts`.
pub(super) fn document(report: &Value, charts: &str) -> Result<String, String> {
    let markdown = crate::report::markdown::render(
        crate::report::markdown::DEFAULT_TEMPLATE,
        "report.md.j2",
        report,
        &json!({}),
    )?;
    let mut out = String::with_capacity(markdown.len() * 2);
    let (head, sections) = split(&markdown);
    out.push_str("<header id=\"head\">\n");
    out.push_str(&to_html(head));
    out.push_str("</header>\n<main>\n");
    for (title, body) in sections {
        let id = match title {
            "Results" => "summary".to_owned(),
            "Judge audit" => "audit".to_owned(),
            _ => slug(title),
        };
        out.push_str(&format!(
            "<section id=\"{id}\">\n<h2>{}</h2>\n",
            escape_html(title)
        ));
        match title {
            "Results" => out.push_str(&results(report, body)),
            "Charts" => out.push_str(charts),
            _ => out.push_str(&to_html(body)),
        }
        out.push_str("</section>\n");
    }
    Ok(out)
}

/// The text before the first `## ` heading, and each `## ` heading with its text.
fn split(markdown: &str) -> (&str, Vec<(&str, &str)>) {
    let mut starts: Vec<usize> = Vec::new();
    let mut at = 0;
    let mut fenced = false;
    for line in markdown.split_inclusive('\n') {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with("## ") {
            starts.push(at);
        }
        at += line.len();
    }
    let head = &markdown[..starts.first().copied().unwrap_or(markdown.len())];
    let mut sections = Vec::new();
    for (number, &start) in starts.iter().enumerate() {
        let end = starts.get(number + 1).copied().unwrap_or(markdown.len());
        let text = &markdown[start + 3..end];
        let (title, body) = text.split_once('\n').unwrap_or((text, ""));
        sections.push((title.trim(), body));
    }
    (head, sections)
}

/// Markdown as HTML; HTML in the text (there is none in gacc's, but a template may add some)
/// is shown as text.
fn to_html(markdown: &str) -> String {
    let parser = Parser::new_ext(markdown, Options::ENABLE_TABLES).map(|event| match event {
        Event::Html(text) | Event::InlineHtml(text) => Event::Text(text),
        event => event,
    });
    let mut out = String::new();
    pulldown_cmark::html::push_html(&mut out, parser);
    out
}

fn slug(title: &str) -> String {
    let mut slug = String::new();
    for c in title.chars() {
        if c.is_alphanumeric() {
            slug.extend(c.to_lowercase());
        } else if !slug.ends_with('-') && !slug.is_empty() {
            slug.push('-');
        }
    }
    slug.trim_end_matches('-').to_owned()
}

/// The Results section: report.md's words, then one row per cell with a sort key in each
/// column (`data-key`), the cell's number in `data-cell`.
fn results(report: &Value, body: &str) -> String {
    // The words before the table.
    let words: String = body
        .lines()
        .take_while(|line| !line.starts_with('|'))
        .map(|line| format!("{line}\n"))
        .collect();
    let mut out = to_html(&words);
    let cells = report["cells"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    table(&mut out, &columns(report, cells), cells);
    out
}

/// The results table's columns: floor, ceiling and gap closed where a cell has them.
fn columns(report: &Value, cells: &[Value]) -> Vec<Column> {
    let one_seed = report["experiment"]["seeds"]
        .as_array()
        .is_some_and(|s| s.len() == 1);
    // Figures that rest on a judge in doubt are marked, as report.md marks them.
    let doubt = report.get("judge_doubt").is_some();
    let has = |field: &str| cells.iter().any(|c| c.get(field).is_some());
    let mut columns: Vec<Column> = vec![
        Column::text("compressor", |c| text(&c["compressor"])),
        Column::text("condition", |c| text(&c["condition"])),
        Column::num("budget", budget, |c| match c.get("budget_tokens") {
            Some(l) => l.as_f64().map(|l| l + 1e9),
            None => c["ratio"].as_f64(),
        }),
        Column::num(
            "Micro",
            move |c| spread(&c["micro"], one_seed, doubt),
            |c| c["micro"]["mean"].as_f64(),
        ),
        Column::num(
            "Micro 95%",
            |c| interval(&c["micro_ci95"]),
            |c| c["micro_ci95"]["low"].as_f64(),
        ),
        Column::num(
            "rank",
            |c| match (c["rank"]["best"].as_u64(), c["rank"]["worst"].as_u64()) {
                (Some(best), Some(worst)) if best == worst => best.to_string(),
                (Some(best), Some(worst)) => format!("{best}–{worst}"),
                _ => "n/a".to_owned(),
            },
            |c| c["rank"]["best"].as_f64(),
        )
        .titled(
            "the best and worst place its Micro can hold, given the compressors it is separated from (Pairs)",
        ),
        Column::num(
            "Macro",
            move |c| spread(&c["macro"], one_seed, doubt),
            |c| c["macro"]["mean"].as_f64(),
        ),
        Column::num(
            "Macro 95%",
            |c| interval(&c["macro_ci95"]),
            |c| c["macro_ci95"]["low"].as_f64(),
        ),
        Column::num(
            "correct / questions",
            |c| format!("{} / {}", seeds_sum(c, "correct"), seeds_sum(c, "questions")),
            |c| Some(seeds_sum(c, "correct") / seeds_sum(c, "questions").max(1.0)),
        ),
    ];
    columns.extend(memory_columns());
    for (field, name, title) in [
        ("floor_micro", "floor", "Micro with an empty memory"),
        ("ceiling_micro", "ceiling", "Micro with the whole source"),
        ("gap_closed", "gap closed", "(Micro − floor) / (ceiling − floor)"),
    ] {
        if has(field) {
            columns
                .push(Column::num(name, move |c| fixed(&c[field]), move |c| c[field].as_f64()).titled(title));
        }
    }
    columns.push(
        Column::text("complete", |c| {
            if c["complete"] == true { "✓" } else { "✗" }.to_owned()
        })
        .keyed(|c| Some(if c["complete"] == true { 1.0 } else { 0.0 })),
    );

    columns
}

/// The columns of what the cell's memories kept: budget use, truncation, evidence.
fn memory_columns() -> [Column; 3] {
    [
        Column::num(
            "budget use",
            |c| {
                let (kept, budget) = (&c["ledger"]["retained_tokens"], &c["ledger"]["budget"]);
                let share = match (kept.as_f64(), budget.as_f64()) {
                    (Some(kept), Some(budget)) if budget > 0.0 => {
                        format!("{:.1}%", 100.0 * kept / budget)
                    }
                    _ => "—".to_owned(),
                };
                format!("{share} ({} / {})", text(kept), text(budget))
            },
            |c| {
                let budget = c["ledger"]["budget"].as_f64().filter(|b| *b > 0.0)?;
                Some(c["ledger"]["retained_tokens"].as_f64()? / budget)
            },
        )
        .titled("tokens retained / budget tokens, over the cell's memories"),
        Column::num(
            "truncated",
            |c| format!("{} / {}", text(&c["ledger"]["truncated"]), text(&c["ledger"]["memories"])),
            |c| {
                let memories = c["ledger"]["memories"].as_f64().filter(|m| *m > 0.0)?;
                Some(c["ledger"]["truncated"].as_f64()? / memories)
            },
        ),
        Column {
            raw: true,
            ..Column::text("evidence", |c| attribution(&c["attribution"]))
        }
        .keyed(|c| c["attribution"]["evidence_kept"].as_f64())
        .titled("answers by whether the memory kept every evidence span: kept · right (green), kept · wrong (amber), lost · right (light blue), lost · wrong (red)"),
    ]
}

/// The table of `cells` under `columns`, each cell's number in `data-cell`.
fn table(out: &mut String, columns: &[Column], cells: &[Value]) {
    out.push_str("<table id=\"cells\" class=\"sortable\"><thead><tr>");
    for column in columns {
        out.push_str(&format!(
            "<th scope=\"col\"{}{}>{}</th>",
            if column.numeric { " class=\"num\"" } else { "" },
            column
                .title
                .map(|t| format!(" title=\"{}\"", escape_html(t)))
                .unwrap_or_default(),
            escape_html(column.name)
        ));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for (number, cell) in cells.iter().enumerate() {
        out.push_str(&format!("<tr data-cell=\"{number}\">"));
        for column in columns {
            let key = match &column.key {
                Some(key) => key(cell).map(|k| k.to_string()).unwrap_or_default(),
                None => (column.show)(cell),
            };
            let shown = (column.show)(cell);
            out.push_str(&format!(
                "<td{} data-key=\"{}\">{}</td>",
                if column.numeric { " class=\"num\"" } else { "" },
                escape_html(&key),
                if column.raw { shown } else { escape_html(&shown) }
            ));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
}

type Show = Box<dyn Fn(&Value) -> String>;
type Key = Box<dyn Fn(&Value) -> Option<f64>>;

/// A column of the results table: its name, what a cell shows, and what it sorts by (the
/// text itself when None).
struct Column {
    name: &'static str,
    title: Option<&'static str>,
    numeric: bool,
    /// `show` is HTML, not text.
    raw: bool,
    show: Show,
    key: Option<Key>,
}

impl Column {
    fn text(name: &'static str, show: impl Fn(&Value) -> String + 'static) -> Self {
        Column {
            name,
            title: None,
            numeric: false,
            raw: false,
            show: Box::new(show),
            key: None,
        }
    }

    fn num(
        name: &'static str,
        show: impl Fn(&Value) -> String + 'static,
        key: impl Fn(&Value) -> Option<f64> + 'static,
    ) -> Self {
        Column {
            numeric: true,
            ..Column::text(name, show).keyed(key)
        }
    }

    fn keyed(self, key: impl Fn(&Value) -> Option<f64> + 'static) -> Self {
        Column {
            key: Some(Box::new(key)),
            ..self
        }
    }

    fn titled(self, title: &'static str) -> Self {
        Column {
            title: Some(title),
            ..self
        }
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "?".to_owned(),
        value => value.to_string(),
    }
}

fn fixed(value: &Value) -> String {
    value
        .as_f64()
        .map(|v| format!("{v:.3}"))
        .unwrap_or_else(|| "n/a".to_owned())
}

fn budget(cell: &Value) -> String {
    match cell.get("budget_tokens") {
        Some(l) => format!("L={}", text(l)),
        None => format!("r={}", text(&cell["ratio"])),
    }
}

/// The mean ± the standard deviation over seeds; the mean alone with one seed; ‡ after it
/// when the judge is in doubt.
fn spread(stat: &Value, one_seed: bool, doubt: bool) -> String {
    let mark = if doubt { " ‡" } else { "" };
    match (stat.is_object(), one_seed) {
        (false, _) => "n/a".to_owned(),
        (true, true) => format!("{}{mark}", fixed(&stat["mean"])),
        (true, false) => format!("{} ± {}{mark}", fixed(&stat["mean"]), fixed(&stat["std"])),
    }
}

fn interval(ci: &Value) -> String {
    if ci.is_object() {
        format!("[{}, {}]", fixed(&ci["low"]), fixed(&ci["high"]))
    } else {
        "n/a".to_owned()
    }
}

fn seeds_sum(cell: &Value, field: &str) -> f64 {
    cell["seeds"]
        .as_array()
        .map(|seeds| seeds.iter().filter_map(|s| s[field].as_f64()).sum())
        .unwrap_or(0.0)
}

/// A cell's answers by evidence kept or lost and right or wrong, as one stacked bar (HTML).
fn attribution(a: &Value) -> String {
    if !a.is_object() {
        return "n/a".to_owned();
    }
    let parts = [
        ("kept-right", "kept · right", &a["kept_right"]),
        ("kept-wrong", "kept · wrong", &a["kept_wrong"]),
        ("lost-right", "lost · right", &a["lost_right"]),
        ("lost-wrong", "lost · wrong", &a["lost_wrong"]),
    ];
    let count = |v: &Value| v.as_u64().unwrap_or(0);
    let total: u64 = parts.iter().map(|p| count(p.2)).sum();
    let label = parts
        .iter()
        .map(|p| format!("{} {}", p.1, count(p.2)))
        .collect::<Vec<_>>()
        .join(", ");
    let counts = parts
        .iter()
        .map(|p| count(p.2).to_string())
        .collect::<Vec<_>>()
        .join(",");
    let mut bar = format!(
        "<div class=\"attribution\" role=\"img\" aria-label=\"{label}\" title=\"{label}\" data-attribution=\"{counts}\">"
    );
    for (class, _, value) in parts {
        let n = count(value);
        if n > 0 {
            bar.push_str(&format!(
                "<span class=\"{class}\" data-count=\"{n}\" style=\"width:{:.2}%\"></span>",
                100.0 * n as f64 / total as f64
            ));
        }
    }
    bar.push_str("</div>");
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_split_at_second_level_headings_outside_code() {
        let (head, sections) =
            split("# t\n\nintro\n\n## One\n\na\n\n```text\n## not a heading\n```\n## Two\nb\n");
        assert_eq!(head, "# t\n\nintro\n\n");
        let titles: Vec<&str> = sections.iter().map(|s| s.0).collect();
        assert_eq!(titles, ["One", "Two"]);
        assert!(sections[0].1.contains("## not a heading"));
    }

    #[test]
    fn html_in_the_text_is_shown_as_text() {
        let html = to_html("a <script>alert(1)</script> b\n\n<img src=x onerror=y>\n");
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<img"), "{html}");
        assert!(html.contains("&lt;script&gt;"), "{html}");
    }

    #[test]
    fn slugs_are_ids() {
        assert_eq!(slug("Goal conditioning"), "goal-conditioning");
        assert_eq!(slug("Cost and usage"), "cost-and-usage");
    }
}
