//! What a build writes (SPEC §16): the dataset of the questions kept (§2's nested form, ids
//! `<source>-g<i>-q<j>` by the writer's order, so a question keeps its id whatever else is
//! dropped), `<stem>.dropped.jsonl` with each dropped question, goal and source and its reason,
//! and `<stem>.report.md` counting them per source. Each is the same bytes for the same
//! build file and cache.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::json;

use super::calls::Counted;
use super::checks::Reason;
use super::file::{Build, Text};
use super::run::{SourceOutcome, Verdict};
use crate::inputs::records::{Evidence, Goal, Question, SourceRecord};
use crate::protocol::Role;

fn goal_id(source: &str, goal: usize) -> String {
    format!("{source}-g{}", goal + 1)
}

fn question_id(source: &str, goal: usize, question: usize) -> String {
    format!("{}-q{}", goal_id(source, goal), question + 1)
}

/// The kept goals of a source, each with its kept questions.
fn kept_goals(source: &Text, outcome: &SourceOutcome) -> Vec<Goal> {
    let mut goals = Vec::new();
    for (g, goal) in outcome.goals.iter().enumerate() {
        let questions: Vec<Question> = (goal.questions.iter().enumerate())
            .filter(|(_, q)| matches!(q.verdict, Verdict::Kept))
            .map(|(q, question)| Question {
                id: question_id(&source.id, g, q),
                question: question.written.question.clone(),
                reference: question.written.reference.clone(),
                evidence: Some(Evidence::Many(question.written.evidence.clone())),
                tags: Vec::new(),
            })
            .collect();
        if !questions.is_empty() {
            goals.push(Goal {
                id: goal_id(&source.id, g),
                text: goal.text.clone(),
                questions,
                tags: Vec::new(),
            });
        }
    }
    goals
}

/// The dataset: one line per source with a goal kept.
pub(super) fn dataset(build: &Build, outcomes: &[SourceOutcome]) -> Vec<u8> {
    let mut out = Vec::new();
    for (source, outcome) in build.sources.iter().zip(outcomes) {
        let goals = kept_goals(source, outcome);
        if goals.is_empty() {
            continue;
        }
        let record = SourceRecord {
            id: source.id.clone(),
            text: Some(source.text.clone()),
            path: None,
            goals,
            tags: Vec::new(),
        };
        out.extend(serde_json::to_vec(&record).unwrap_or_default());
        out.push(b'\n');
    }
    out
}

/// Every dropped question with its reason and, where a read decided it, the reader's answer;
/// every goal left with no question; every source left with no goal.
pub(super) fn dropped(build: &Build, outcomes: &[SourceOutcome]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut line = |value: serde_json::Value| {
        out.extend(value.to_string().into_bytes());
        out.push(b'\n');
    };
    for (source, outcome) in build.sources.iter().zip(outcomes) {
        for (g, goal) in outcome.goals.iter().enumerate() {
            for (q, question) in goal.questions.iter().enumerate() {
                let Verdict::Dropped(reason, answer) = &question.verdict else {
                    continue;
                };
                let mut row = json!({
                    "reason": reason,
                    "source": source.id,
                    "goal": goal_id(&source.id, g),
                    "id": question_id(&source.id, g, q),
                    "question": question.written.question,
                    "reference": question.written.reference,
                    "evidence": question.written.evidence,
                });
                if let Some(answer) = answer {
                    row["answer"] = json!(answer);
                }
                line(row);
            }
            if !goal.questions.iter().any(|q| matches!(q.verdict, Verdict::Kept)) {
                line(
                    json!({"reason": Reason::NoQuestions, "source": source.id, "goal": goal_id(&source.id, g), "text": goal.text}),
                );
            }
        }
        if kept_goals(source, outcome).is_empty() {
            line(json!({"reason": Reason::NoGoals, "source": source.id}));
        }
    }
    out
}

/// Counts of one source, or of all.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Counts {
    pub goals_written: usize,
    pub goals_kept: usize,
    pub written: usize,
    pub kept: usize,
    pub dropped: BTreeMap<Reason, usize>,
}

impl Counts {
    fn of(outcome: &SourceOutcome) -> Counts {
        let mut counts = Counts {
            goals_written: outcome.goals.len(),
            ..Counts::default()
        };
        for goal in &outcome.goals {
            let kept = goal
                .questions
                .iter()
                .filter(|q| matches!(q.verdict, Verdict::Kept))
                .count();
            counts.written += goal.questions.len();
            counts.kept += kept;
            counts.goals_kept += usize::from(kept > 0);
            for question in &goal.questions {
                if let Verdict::Dropped(reason, _) = question.verdict {
                    *counts.dropped.entry(reason).or_default() += 1;
                }
            }
        }
        counts
    }

    fn add(&mut self, other: &Counts) {
        self.goals_written += other.goals_written;
        self.goals_kept += other.goals_kept;
        self.written += other.written;
        self.kept += other.kept;
        for (reason, n) in &other.dropped {
            *self.dropped.entry(*reason).or_default() += n;
        }
    }
}

/// Every source's counts, and their sum.
pub(super) fn counts(outcomes: &[SourceOutcome]) -> (Vec<Counts>, Counts) {
    let each: Vec<Counts> = outcomes.iter().map(Counts::of).collect();
    let mut all = Counts::default();
    for counts in &each {
        all.add(counts);
    }
    (each, all)
}

/// What each reason of a dropped question means, in the order of the checks.
fn legend(out: &mut String, keep_closed_book: bool) {
    for (reason, says) in [
        (
            Reason::Evidence,
            "it has no evidence span, or one its source does not hold",
        ),
        (
            Reason::Leak,
            "its reference or a span is in its goal, as whole words",
        ),
        (
            Reason::Duplicate,
            "its words are a near-copy (Jaccard ≥ 0.8) of a question kept before it in its goal",
        ),
        (
            Reason::Ceiling,
            "read with the whole source, the judge found the answer wrong",
        ),
        (
            Reason::ClosedBook,
            "read with an empty memory, the judge found the answer right",
        ),
    ] {
        let skipped = reason == Reason::ClosedBook && keep_closed_book;
        let note = if skipped {
            " (skipped: `keep_closed_book = true`)"
        } else {
            ""
        };
        let _ = writeln!(out, "- `{}`: {says}{note}", reason.as_str());
    }
}

/// The report: kept and dropped per reason, per source and in all; and what the calls the
/// dataset rests on cost (the same whether this build made them or found them cached).
pub(super) fn report(build: &Build, outcomes: &[SourceOutcome], counted: &BTreeMap<Role, Counted>) -> String {
    let (each, all) = counts(outcomes);
    let mut out = String::new();
    let name = build
        .out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let _ = writeln!(out, "# Dataset build: {name}\n");
    let _ = writeln!(
        out,
        "{} of {} questions kept, in {} of {} goals, from {} of {} sources. A question is kept when it passes every check, in this order; the first it fails is its reason (SPEC §16):\n",
        all.kept,
        all.written,
        all.goals_kept,
        all.goals_written,
        each.iter().filter(|c| c.kept > 0).count(),
        each.len()
    );
    legend(&mut out, build.keep_closed_book);
    let header: Vec<&str> = Reason::QUESTIONS.iter().map(|r| r.as_str()).collect();
    let _ = writeln!(
        out,
        "\n| source | goals kept | questions | kept | {} |",
        header.join(" | ")
    );
    let _ = writeln!(out, "|---|---:|---:|---:|{}", "---:|".repeat(header.len()));
    let row = |out: &mut String, name: &str, counts: &Counts| {
        let dropped: Vec<String> = (Reason::QUESTIONS.iter())
            .map(|r| counts.dropped.get(r).copied().unwrap_or(0).to_string())
            .collect();
        let _ = writeln!(
            out,
            "| {name} | {} of {} | {} | {} | {} |",
            counts.goals_kept,
            counts.goals_written,
            counts.written,
            counts.kept,
            dropped.join(" | ")
        );
    };
    for (source, counts) in build.sources.iter().zip(&each) {
        row(&mut out, &format!("`{}`", source.id.replace('|', "\\|")), counts);
    }
    row(&mut out, "**all**", &all);
    let _ = writeln!(
        out,
        "\nGoals left with no question are dropped (`no-questions`), and sources left with no goal (`no-goals`); every dropped question, goal and source is in `{}` with its reason.\n",
        build
            .beside(super::file::DROPPED)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    );
    let _ = writeln!(
        out,
        "## What the calls cost\n\n| role | calls | USD |\n|---|---:|---:|"
    );
    for role in [Role::Writer, Role::Reader, Role::Judge] {
        let counted = counted.get(&role).cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "| {role} | {} | {:.6} |",
            counted.made + counted.cached,
            counted.usd
        );
    }
    out
}
