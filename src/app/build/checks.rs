//! The checks a written question passes before it is kept (SPEC §16), those that need no
//! call: its evidence is in its source, neither its reference nor its evidence is in its goal,
//! and it is no near-copy of a question kept before it.

use std::collections::BTreeSet;

use crate::builtin::text::{normalize, tokens};
use crate::inputs::evidence::Normalised;

/// Why a question is dropped, in the order the checks run (the first it fails is its reason),
/// and why a goal or a source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Reason {
    /// No evidence span, or one its source does not hold.
    Evidence,
    /// Its reference or a span is in its goal's text, as whole words.
    Leak,
    /// Its words are a near-copy (Jaccard ≥ 0.8) of a question kept before it in its goal.
    Duplicate,
    /// Read with the whole source, the judge finds the answer wrong.
    Ceiling,
    /// Read with an empty memory, the judge finds the answer right.
    ClosedBook,
    /// A goal left with no question.
    NoQuestions,
    /// A source left with no goal.
    NoGoals,
}

impl Reason {
    /// The question's reasons, in the order of the checks.
    pub(super) const QUESTIONS: [Reason; 5] = [
        Reason::Evidence,
        Reason::Leak,
        Reason::Duplicate,
        Reason::Ceiling,
        Reason::ClosedBook,
    ];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            Reason::Evidence => "evidence",
            Reason::Leak => "leak",
            Reason::Duplicate => "duplicate",
            Reason::Ceiling => "ceiling",
            Reason::ClosedBook => "closed-book",
            Reason::NoQuestions => "no-questions",
            Reason::NoGoals => "no-goals",
        }
    }
}

/// The Jaccard similarity at which a question is a near-copy of one kept before it.
pub(super) const DUPLICATE_JACCARD: f64 = 0.8;

/// Whether a question has evidence and its source holds every span (§11's matching). A span
/// that normalises to nothing (punctuation, an article) is no evidence.
pub(super) fn evidence_holds(source: &Normalised, evidence: &[String]) -> bool {
    !evidence.is_empty()
        && evidence.iter().all(|span| {
            let words = normalize(span);
            !words.trim().is_empty() && source.holds_normalised(&words)
        })
}

/// Whether `text`'s normalised words are a contiguous run of `goal`'s normalised words: the goal
/// gives it away. A text of no words leaks nothing.
pub(super) fn leaks(goal: &str, text: &str) -> bool {
    let (goal, text) = (normalize(goal), normalize(text));
    let (goal, text) = (tokens(&goal), tokens(&text));
    !text.is_empty() && goal.windows(text.len()).any(|run| run == text.as_slice())
}

/// The set of a question's normalised words.
pub(super) fn word_set(question: &str) -> BTreeSet<String> {
    tokens(&normalize(question))
        .into_iter()
        .map(str::to_owned)
        .collect()
}

/// |a ∩ b| / |a ∪ b|; two empty sets are the same question.
pub(super) fn jaccard(a: &BTreeSet<String>, b: &BTreeSet<String>) -> f64 {
    let union = a.union(b).count();
    if union == 0 {
        return 1.0;
    }
    a.intersection(b).count() as f64 / union as f64
}

/// The first check a question fails of those that need no call, if it fails one: `kept` are
/// the word sets of the questions of its goal kept before it.
pub(super) fn first_failed(
    source: &Normalised,
    goal: &str,
    question: &crate::protocol::writer::WrittenQuestion,
    kept: &[BTreeSet<String>],
) -> Option<Reason> {
    if !evidence_holds(source, &question.evidence) {
        return Some(Reason::Evidence);
    }
    let spans = std::iter::once(&question.reference).chain(&question.evidence);
    if spans.into_iter().any(|text| leaks(goal, text)) {
        return Some(Reason::Leak);
    }
    let words = word_set(&question.question);
    if kept
        .iter()
        .any(|before| jaccard(&words, before) >= DUPLICATE_JACCARD)
    {
        return Some(Reason::Duplicate);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::writer::WrittenQuestion;

    fn question(question: &str, reference: &str, evidence: &[&str]) -> WrittenQuestion {
        WrittenQuestion {
            question: question.into(),
            reference: reference.into(),
            evidence: evidence.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn evidence_must_be_given_and_in_the_source_as_normalised() {
        let source = Normalised::of("The ferry leaves from Pier 3, at 06:40.");
        assert!(evidence_holds(&source, &["ferry leaves from pier 3".into()]));
        assert!(evidence_holds(&source, &["at 0640".into(), "The ferry".into()]));
        assert!(!evidence_holds(&source, &[]));
        assert!(!evidence_holds(&source, &["ferry leaves from pier 4".into()]));
        assert!(!evidence_holds(&source, &["ferry".into(), "the bus".into()]));
        assert!(
            !evidence_holds(&source, &["the".into()]),
            "an article alone is no evidence"
        );
    }

    #[test]
    fn a_leak_is_a_whole_word_run_of_the_goal() {
        let goal = "plan a ferry trip to the island from pier 3";
        assert!(leaks(goal, "Pier 3"));
        assert!(leaks(goal, "the island"));
        assert!(!leaks(goal, "pier 30"), "30 is not the goal's word 3");
        assert!(!leaks(goal, "pie"), "a piece of a word is no word");
        assert!(!leaks(goal, "island trip"), "not a contiguous run");
        assert!(!leaks(goal, "the"), "a text of no words leaks nothing");
        assert!(leaks("了解票价", "票价"), "each CJK character is a word");
    }

    #[test]
    fn jaccard_of_word_sets_on_a_worked_example() {
        let a = word_set("When does the ferry leave?");
        let b = word_set("When does the ferry leave, today?");
        // {when, does, ferry, leave} against the same and {today}: 4 / 5.
        assert_eq!(jaccard(&a, &b), 0.8);
        assert_eq!(jaccard(&a, &word_set("Who runs the café?")), 0.0);
        assert_eq!(jaccard(&BTreeSet::new(), &BTreeSet::new()), 1.0);
    }

    #[test]
    fn the_first_failed_check_is_the_reason() {
        let source = Normalised::of("The ferry leaves from pier 3 and costs 12 euros.");
        let goal = "take the ferry that costs 12 euros";
        let kept = [word_set("Which pier does the ferry leave from?")];
        let cases = [
            (
                question("Which pier?", "pier 3", &["pier 9"]),
                Some(Reason::Evidence),
            ),
            (
                question("What does it cost?", "12 euros", &["costs 12 euros"]),
                Some(Reason::Leak),
            ),
            (
                question("Which pier?", "pier 3", &["the ferry"]),
                Some(Reason::Leak),
            ),
            (
                question(
                    "Which pier does the ferry leave from, then?",
                    "pier 3",
                    &["from pier 3"],
                ),
                Some(Reason::Duplicate),
            ),
            (
                question("Where does it leave from?", "pier 3", &["from pier 3"]),
                None,
            ),
        ];
        for (question, reason) in cases {
            assert_eq!(
                first_failed(&source, goal, &question, &kept),
                reason,
                "{question:?}"
            );
        }
    }
}
