//! A question's drill-down: the source with its evidence marked, the memory the reader got with
//! the evidence it kept marked, the answer, the reference, and every judge's verdict.
//!
//! A question's spans are its `evidence`, or its reference when it states none (SPEC §11): each
//! place a span occurs (ignoring ASCII case) is marked in the source as evidence, and in the
//! memory as kept when the memory kept it; the page lists each span, kept or lost.

use std::fmt::Write as _;
use std::sync::Arc;

use super::pages::{page, query, verdict};
use super::site::Loaded;
use crate::inputs::evidence::Normalised;
use crate::inputs::records::Question;
use crate::report::html::escape_html;
use crate::store::ledger::LedgerRow;

/// The drill-down of `results.jsonl`'s row `index`, or None when there is no such row.
pub(super) fn question(id: &str, loaded: &Loaded, index: usize) -> Option<String> {
    let row = loaded.results.get(index)?;
    let source = loaded.sources.iter().find(|s| s.id == row.source_id);
    let goal = source.and_then(|s| s.goals.iter().find(|g| g.id == row.goal_id));
    let asked = goal.and_then(|g| g.questions.iter().find(|q| q.id == row.question_id));
    let memory = loaded.ledger.iter().find(|m| m.key == row.memory_key);
    let text = memory.and_then(|m| loaded.texts.get(&m.memory_sha256));
    let reference = asked.map_or("", |q| q.reference.as_str());
    let budget = match (row.ratio, row.budget_tokens) {
        (_, Some(tokens)) => format!("L={tokens}"),
        (Some(ratio), None) => format!("r={}", serde_json::to_string(&ratio).unwrap_or_default()),
        (None, None) => String::new(),
    };
    let condition = serde_json::to_value(row.condition)
        .ok()
        .map(|v| crate::report::stored::text(&v))
        .unwrap_or_default();
    let mut body = format!(
        "<p><a href=\"/run?run={}\">{}</a> · {} · {} · {} · seed {}</p>\n\
         <h2>Question <code>{}</code></h2>\n<p id=\"question\">{}</p>\n\
         <table id=\"verdicts\"><tr><th>reference</th><td id=\"reference\">{}</td></tr>\n\
         <tr><th>answer</th><td id=\"answer\">{}</td></tr>\n\
         <tr><th>judge</th><td id=\"verdict\">{}</td></tr>\n",
        query(id),
        escape_html(id),
        escape_html(&row.compressor),
        escape_html(&condition),
        escape_html(&budget),
        row.seed,
        escape_html(&row.question_id),
        escape_html(asked.map_or("(not in this run's dataset)", |q| q.question.as_str())),
        escape_html(reference),
        escape_html(row.answer.as_deref().unwrap_or("(none)")),
        verdict(row.correct, row.failure.as_deref()),
    );
    if let Some(rationale) = &row.rationale {
        let _ = writeln!(
            body,
            "<tr><th>judge's reason</th><td>{}</td></tr>",
            escape_html(rationale)
        );
    }
    for (judge, said) in &row.audits {
        let _ = writeln!(
            body,
            "<tr data-audit=\"{}\"><th>audit judge {}</th><td>{}</td></tr>",
            escape_html(judge),
            escape_html(judge),
            verdict(*said, Some("gave no verdict")),
        );
    }
    body.push_str("</table>\n");
    body.push_str(&evidence(
        source.map(|s| s.text.as_str()),
        memory.zip(text),
        asked,
    ));
    if let Some(goal) = goal {
        let _ = writeln!(
            body,
            "<h2>Goal <code>{}</code></h2>\n<p>{}</p>",
            escape_html(&goal.id),
            escape_html(&goal.text)
        );
    }
    if let Some(source) = source {
        let spans = asked.map_or_else(Vec::new, |q| q.spans().0);
        let _ = writeln!(
            body,
            "<h2>Source <code>{}</code></h2>\n<pre id=\"source\">{}</pre>",
            escape_html(&source.id),
            marked(&source.text, &spans, |_| "evidence"),
        );
    }
    Some(page(&format!("Question {}", row.question_id), &body))
}

/// Which of the question's evidence spans the memory kept (SPEC §11: its normalised text occurs
/// in the memory's), each listed; the memory with the spans it kept marked.
fn evidence(
    source: Option<&str>,
    memory: Option<(&LedgerRow, &Arc<str>)>,
    asked: Option<&Question>,
) -> String {
    let mut body = String::new();
    let (spans, given) = asked.map_or((Vec::new(), false), Question::spans);
    let held = memory.map(|(_, text)| Normalised::of(text));
    let kept: Vec<bool> = (spans.iter())
        .map(|span| held.as_ref().is_some_and(|m| m.holds(span)))
        .collect();
    let count = kept.iter().filter(|k| **k).count();
    let basis = if given { "evidence" } else { "reference" };
    let note = if given {
        ""
    } else {
        "This question states no evidence spans, so its reference is the span. "
    };
    let _ = writeln!(
        body,
        "<h2>Evidence</h2>\n<p id=\"evidence\" data-basis=\"{basis}\" data-spans=\"{}\" data-kept=\"{count}\">\
         {note}The memory kept {count} of {} span{}.</p>\n<ul id=\"spans\">",
        spans.len(),
        spans.len(),
        if spans.len() == 1 { "" } else { "s" },
    );
    for (span, kept) in spans.iter().zip(&kept) {
        let (class, word) = if *kept { ("kept", "kept") } else { ("lost", "lost") };
        let in_source = source.map_or(0, |s| occurrences(s, span).len());
        let _ = writeln!(
            body,
            "<li class=\"{class}\" data-in-source=\"{in_source}\"><b>{word}</b> {}</li>",
            escape_html(span)
        );
    }
    body.push_str("</ul>\n");
    if let Some((memory, text)) = memory {
        let kept_spans: Vec<&str> = (spans.iter().zip(&kept))
            .filter(|(_, k)| **k)
            .map(|(s, _)| *s)
            .collect();
        let _ = writeln!(
            body,
            "<h2>Memory</h2>\n<p id=\"ledger\">N={} · L={} · generated {} · retained {} tokens{}</p>\n\
             <pre id=\"memory\">{}</pre>",
            memory.source_tokens,
            memory.budget,
            memory.generated_tokens,
            memory.retained_tokens,
            if memory.truncated {
                " · cut to the budget"
            } else {
                ""
            },
            marked(text, &kept_spans, |_| "kept"),
        );
    }
    body
}

/// Where `needle` occurs in `text`, ignoring ASCII case, as byte ranges that do not overlap.
fn occurrences(text: &str, needle: &str) -> Vec<(usize, usize)> {
    let needle = needle.trim();
    if needle.is_empty() {
        return Vec::new();
    }
    let (haystack, needle) = (text.to_ascii_lowercase(), needle.to_ascii_lowercase());
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = haystack[from..].find(&needle) {
        let start = from + at;
        found.push((start, start + needle.len()));
        from = start + needle.len();
    }
    found
}

/// `text` escaped, each occurrence of each of `needles` (the first to start wins an overlap) in
/// a `<mark>` of the class `class` gives its needle.
fn marked<'n>(text: &str, needles: &[&'n str], class: impl Fn(&'n str) -> &'static str) -> String {
    let mut found: Vec<(usize, usize, &str)> = (needles.iter())
        .flat_map(|needle| {
            occurrences(text, needle)
                .into_iter()
                .map(move |(s, e)| (s, e, *needle))
        })
        .collect();
    found.sort_unstable_by_key(|(start, end, _)| (*start, std::cmp::Reverse(*end)));
    let mut out = String::with_capacity(text.len() + 64);
    let mut at = 0;
    for (start, end, needle) in found {
        if start < at {
            continue;
        }
        out.push_str(&escape_html(&text[at..start]));
        let _ = write!(
            out,
            "<mark class=\"{}\">{}</mark>",
            class(needle),
            escape_html(&text[start..end])
        );
        at = end;
    }
    out.push_str(&escape_html(&text[at..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_marked_whatever_its_case_and_the_rest_escaped() {
        assert_eq!(
            marked("<b>Paris</b> and paris", &["PARIS"], |_| "kept"),
            "&lt;b&gt;<mark class=\"kept\">Paris</mark>&lt;/b&gt; and <mark class=\"kept\">paris</mark>"
        );
        assert_eq!(
            marked("naïve café", &["café"], |_| "kept"),
            "naïve <mark class=\"kept\">café</mark>"
        );
        assert_eq!(
            marked("a long span", &["span", "long span"], |n| if n == "span" {
                "a"
            } else {
                "b"
            }),
            "a <mark class=\"b\">long span</mark>"
        );
        assert_eq!(occurrences("aaaa", "aa"), vec![(0, 2), (2, 4)]);
        assert!(occurrences("text", "  ").is_empty());
    }
}
