//! A question's drill-down: the source with its evidence marked, the memory the reader got with
//! the evidence it kept marked, the answer, the reference, and every judge's verdict.
//!
//! A dataset that states no evidence spans has its reference as the span (SPEC §11): each
//! place the reference occurs (ignoring ASCII case) is marked, in the source as evidence and
//! in the memory as kept; the page says whether the memory kept it.

use std::fmt::Write as _;
use std::sync::Arc;

use super::pages::{esc, page, query, verdict};
use super::site::Loaded;
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
        esc(id),
        esc(&row.compressor),
        esc(&condition),
        esc(&budget),
        row.seed,
        esc(&row.question_id),
        esc(asked.map_or("(not in this run's dataset)", |q| q.question.as_str())),
        esc(reference),
        esc(row.answer.as_deref().unwrap_or("(none)")),
        verdict(row.correct, row.failure.as_deref()),
    );
    if let Some(rationale) = &row.rationale {
        let _ = writeln!(
            body,
            "<tr><th>judge's reason</th><td>{}</td></tr>",
            esc(rationale)
        );
    }
    for (judge, said) in &row.audits {
        let _ = writeln!(
            body,
            "<tr data-audit=\"{}\"><th>audit judge {}</th><td>{}</td></tr>",
            esc(judge),
            esc(judge),
            verdict(*said, Some("gave no verdict")),
        );
    }
    body.push_str("</table>\n");
    body.push_str(&evidence(
        source.map(|s| s.text.as_str()),
        memory.zip(text),
        reference,
    ));
    if let Some(goal) = goal {
        let _ = writeln!(
            body,
            "<h2>Goal <code>{}</code></h2>\n<p>{}</p>",
            esc(&goal.id),
            esc(&goal.text)
        );
    }
    if let Some(source) = source {
        let _ = writeln!(
            body,
            "<h2>Source <code>{}</code></h2>\n<pre id=\"source\">{}</pre>",
            esc(&source.id),
            marked(&source.text, reference, "evidence"),
        );
    }
    Some(page(&format!("Question {}", row.question_id), &body))
}

/// Whether the memory kept the reference, and the memory with what it kept marked.
fn evidence(source: Option<&str>, memory: Option<(&LedgerRow, &Arc<str>)>, reference: &str) -> String {
    let mut body = String::new();
    let in_source = source.map_or(0, |s| occurrences(s, reference).len());
    let in_memory = memory.map_or(0, |(_, t)| occurrences(t, reference).len());
    let kept = match (in_source, in_memory) {
        (0, _) => "The reference does not occur in the source word for word.",
        (_, 0) => "The memory lost the evidence: the reference occurs in the source but not in the memory.",
        _ => "The memory kept the evidence: the reference occurs in it.",
    };
    let _ = writeln!(
        body,
        "<h2>Evidence</h2>\n<p id=\"evidence\" data-source=\"{in_source}\" data-memory=\"{in_memory}\">\
         This dataset states no evidence spans, so the reference is the span. {kept}</p>"
    );
    if let Some((memory, text)) = memory {
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
            marked(text, reference, "kept"),
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

/// `text` escaped, each occurrence of `needle` in a `<mark class="{class}">`.
fn marked(text: &str, needle: &str, class: &str) -> String {
    let mut out = String::with_capacity(text.len() + 64);
    let mut at = 0;
    for (start, end) in occurrences(text, needle) {
        out.push_str(&esc(&text[at..start]));
        let _ = write!(out, "<mark class=\"{class}\">{}</mark>", esc(&text[start..end]));
        at = end;
    }
    out.push_str(&esc(&text[at..]));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_marked_whatever_its_case_and_the_rest_escaped() {
        assert_eq!(
            marked("<b>Paris</b> and paris", "PARIS", "kept"),
            "&lt;b&gt;<mark class=\"kept\">Paris</mark>&lt;/b&gt; and <mark class=\"kept\">paris</mark>"
        );
        assert_eq!(
            marked("naïve café", "café", "kept"),
            "naïve <mark class=\"kept\">café</mark>"
        );
        assert_eq!(occurrences("aaaa", "aa"), vec![(0, 2), (2, 4)]);
        assert!(occurrences("text", "  ").is_empty());
    }
}
