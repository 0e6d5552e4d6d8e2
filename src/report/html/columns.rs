//! The page's data as columns: every source, goal, question, memory and result once, each row
//! naming the others by index, and the memory texts once per distinct text and source.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::error::Error;
use crate::inputs::evidence::Normalised;
use crate::inputs::records::{Question, Source};
use crate::protocol::CellId;
use crate::store::ledger::{LedgerRow, MemoryText, ResultRow};
use crate::store::run_folder::{MEMORIES, MEMORY_TEXTS, REPORT_JSON, RESULTS};

/// The rows as columns. Goals are numbered in dataset order and their questions follow one
/// another, so goal `g` owns questions `question_start[g]..question_start[g + 1]`; results are
/// ordered by goal, then memory, then question, so goal `g` owns results
/// `result_start[g]..result_start[g + 1]`, and a memory's results are consecutive.
#[derive(Debug, Default, Serialize)]
pub(super) struct Index {
    pub(super) sources: Vec<String>,
    pub(super) goals: Goals,
    pub(super) questions: Questions,
    pub(super) memories: Memories,
    pub(super) results: Results,
    /// Each distinct answer once; results refer to it by index.
    pub(super) answers: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct Goals {
    id: Vec<String>,
    text: Vec<String>,
    source: Vec<usize>,
    question_start: Vec<usize>,
    result_start: Vec<usize>,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct Questions {
    id: Vec<String>,
    text: Vec<String>,
    reference: Vec<String>,
    /// Each question's evidence spans (its reference when it has none: `basis` 0).
    spans: Vec<Vec<String>>,
    basis: Vec<u8>,
}

/// One entry per ledger row. `goal` and `shown` are goal indices, -1 for none; `text` indexes
/// the memory's source's chunk of texts.
#[derive(Debug, Default, Serialize)]
pub(super) struct Memories {
    cell: Vec<usize>,
    seed: Vec<u64>,
    source: Vec<usize>,
    goal: Vec<i64>,
    shown: Vec<i64>,
    source_tokens: Vec<usize>,
    budget: Vec<usize>,
    generated: Vec<usize>,
    retained: Vec<usize>,
    memory_tokens: Vec<usize>,
    /// 1 truncated, 2 a multi-byte character split by the cut, 4 over budget.
    flags: Vec<u8>,
    text: Vec<usize>,
}

/// One entry per question answered. `memory` is -1 when no memory was made (its compress job
/// failed); `verdict` is 1 right, 0 wrong, -1 unscored. `unscored` holds, by result index, the
/// cell, seed and failure of each result that has a failure.
#[derive(Debug, Default, Serialize)]
pub(super) struct Results {
    pub(super) memory: Vec<i64>,
    question: Vec<usize>,
    answer: Vec<i64>,
    verdict: Vec<i8>,
    /// Which of its question's first 31 spans the memory kept, bit `i` for span `i`; -1
    /// without a memory.
    kept: Vec<i64>,
    score: std::collections::BTreeMap<usize, f64>,
    unscored: std::collections::BTreeMap<usize, (usize, u64, String)>,
}

pub(super) fn columns(
    folder: &Path,
    report: &Value,
    sources: &[Source],
    ledger: &[LedgerRow],
    texts: &[MemoryText],
    results: &[ResultRow],
) -> Result<(Index, Vec<Vec<String>>), Error> {
    let mut columns = Columns {
        folder,
        index: Index::default(),
        cells: HashMap::new(),
        source_of: HashMap::new(),
        goal_of: HashMap::new(),
        question_of: HashMap::new(),
        memory_of: HashMap::new(),
        asked: Vec::new(),
        memory_text: Vec::new(),
    };
    columns.cells(report)?;
    columns.sources(sources);
    let chunks = columns.memories(ledger, texts, sources.len())?;
    columns.results(results)?;
    Ok((columns.index, chunks))
}

/// The index being built, and where each id went in it.
pub(super) struct Columns<'a> {
    folder: &'a Path,
    index: Index,
    cells: HashMap<String, usize>,
    source_of: HashMap<&'a str, usize>,
    goal_of: HashMap<&'a str, usize>,
    question_of: HashMap<&'a str, usize>,
    memory_of: HashMap<&'a str, usize>,
    /// Each question, by its number.
    asked: Vec<&'a Question>,
    /// Each memory's text, by its number.
    memory_text: Vec<&'a str>,
}

impl<'a> Columns<'a> {
    fn inconsistent(&self, file: &str, message: String) -> Error {
        Error::Io {
            path: self.folder.join(file),
            message,
        }
    }

    /// Each cell of report.json by its name.
    fn cells(&mut self, report: &Value) -> Result<(), Error> {
        for (number, cell) in report["cells"].as_array().into_iter().flatten().enumerate() {
            let id: CellId = serde_json::from_value(cell.clone()).map_err(|error| {
                self.inconsistent(
                    REPORT_JSON,
                    format!("cells[{number}] lacks a compressor, condition, ratio or budget: {error}"),
                )
            })?;
            self.cells.insert(id.to_string(), number);
        }
        Ok(())
    }

    /// Sources, goals and questions, numbered in dataset order.
    fn sources(&mut self, sources: &'a [Source]) {
        let index = &mut self.index;
        for (s, source) in sources.iter().enumerate() {
            self.source_of.insert(source.id.as_str(), s);
            index.sources.push(source.id.clone());
            for goal in &source.goals {
                self.goal_of.insert(goal.id.as_str(), index.goals.id.len());
                index.goals.id.push(goal.id.clone());
                index.goals.text.push(goal.text.clone());
                index.goals.source.push(s);
                index.goals.question_start.push(index.questions.id.len());
                for question in &goal.questions {
                    self.question_of
                        .insert(question.id.as_str(), index.questions.id.len());
                    index.questions.id.push(question.id.clone());
                    index.questions.text.push(question.question.clone());
                    index.questions.reference.push(question.reference.clone());
                    let (spans, given) = question.spans();
                    index
                        .questions
                        .spans
                        .push(spans.into_iter().map(str::to_owned).collect());
                    index.questions.basis.push(u8::from(given));
                    self.asked.push(question);
                }
            }
        }
        index.goals.question_start.push(index.questions.id.len());
    }

    fn goal_number(&self, id: &Option<String>, what: &str) -> Result<i64, Error> {
        match id {
            None => Ok(-1),
            Some(id) => {
                self.goal_of.get(id.as_str()).map(|&g| g as i64).ok_or_else(|| {
                    self.inconsistent(MEMORIES, format!("{what} `{id}` is not in dataset.jsonl"))
                })
            }
        }
    }

    /// One column entry per ledger row; each source's distinct memory texts, once each.
    fn memories(
        &mut self,
        ledger: &'a [LedgerRow],
        texts: &'a [MemoryText],
        sources: usize,
    ) -> Result<Vec<Vec<String>>, Error> {
        let text_of: HashMap<&str, &str> = texts.iter().map(|t| (t.sha256.as_str(), &*t.memory)).collect();
        let mut chunks: Vec<Vec<String>> = vec![Vec::new(); sources];
        let mut chunk_slot: HashMap<(usize, &str), usize> = HashMap::new();
        for (number, row) in ledger.iter().enumerate() {
            let id = &row.memory_id;
            let key = id.cell.to_string();
            let cell = *self.cells.get(&key).ok_or_else(|| {
                self.inconsistent(
                    MEMORIES,
                    format!("line {}: no cell in report.json for {key}", number + 1),
                )
            })?;
            let source = *self.source_of.get(id.source_id.as_str()).ok_or_else(|| {
                self.inconsistent(
                    MEMORIES,
                    format!(
                        "line {}: source `{}` is not in dataset.jsonl",
                        number + 1,
                        id.source_id
                    ),
                )
            })?;
            let text = *text_of.get(row.memory_sha256.as_str()).ok_or_else(|| {
                self.inconsistent(
                    MEMORY_TEXTS,
                    format!(
                        "no text for memory {} (memories.jsonl line {})",
                        row.memory_sha256,
                        number + 1
                    ),
                )
            })?;
            let slot = *chunk_slot
                .entry((source, row.memory_sha256.as_str()))
                .or_insert_with(|| {
                    chunks[source].push(text.to_owned());
                    chunks[source].len() - 1
                });
            let (goal, shown) = (
                self.goal_number(&id.goal_id, "goal")?,
                self.goal_number(&id.shown_goal_id, "shown goal")?,
            );
            let memories = &mut self.index.memories;
            memories.cell.push(cell);
            memories.seed.push(id.seed);
            memories.source.push(source);
            memories.goal.push(goal);
            memories.shown.push(shown);
            memories.source_tokens.push(row.source_tokens);
            memories.budget.push(row.budget);
            memories.generated.push(row.generated_tokens);
            memories.retained.push(row.retained_tokens);
            memories.memory_tokens.push(row.memory_tokens);
            memories.flags.push(
                u8::from(row.truncated) | u8::from(row.utf8_split) << 1 | u8::from(row.budget_violation) << 2,
            );
            memories.text.push(slot);
            self.memory_text.push(text);
            self.memory_of.insert(row.key.as_str(), number);
        }
        Ok(chunks)
    }

    /// The results, ordered (goal, memory, question) so that each goal's are one run of rows.
    fn results(&mut self, results: &'a [ResultRow]) -> Result<(), Error> {
        let mut order = Vec::with_capacity(results.len());
        for (number, row) in results.iter().enumerate() {
            let place = |what: &str, id: &str| {
                self.inconsistent(
                    RESULTS,
                    format!("line {}: {what} `{id}` is not in dataset.jsonl", number + 1),
                )
            };
            let goal = *self
                .goal_of
                .get(row.goal_id.as_str())
                .ok_or_else(|| place("goal", &row.goal_id))?;
            let question = *self
                .question_of
                .get(row.question_id.as_str())
                .ok_or_else(|| place("question", &row.question_id))?;
            let memory = self
                .memory_of
                .get(row.memory_key.as_str())
                .map_or(usize::MAX, |&m| m);
            order.push((goal, memory, question, number));
        }
        order.sort_unstable();
        let index = &mut self.index;
        let mut answers = HashMap::new();
        let mut next_goal = 0;
        // Rows of one memory follow one another: its text is normalised once.
        let mut normalised: Option<(usize, Normalised)> = None;
        for (position, &(goal, memory, question, number)) in order.iter().enumerate() {
            while next_goal <= goal {
                index.goals.result_start.push(position);
                next_goal += 1;
            }
            let row = &results[number];
            let out = &mut index.results;
            out.memory
                .push(if memory == usize::MAX { -1 } else { memory as i64 });
            out.question.push(question);
            out.answer.push(match &row.answer {
                None => -1,
                Some(answer) => *answers.entry(answer.as_str()).or_insert_with(|| {
                    index.answers.push(answer.clone());
                    index.answers.len() as i64 - 1
                }),
            });
            out.verdict.push(match row.correct {
                Some(true) => 1,
                Some(false) => 0,
                None => -1,
            });
            let spans = (&self.memory_text[..], self.asked[question]);
            out.kept
                .push(kept_bits(spans, memory, row.evidence_kept, &mut normalised));
            if let Some(score) = row.score {
                out.score.insert(position, score);
            }
            if memory == usize::MAX || row.failure.is_some() {
                let cell = self
                    .cells
                    .get(&row.cell().to_string())
                    .copied()
                    .unwrap_or(usize::MAX);
                let failure = row
                    .failure
                    .clone()
                    .unwrap_or_else(|| "no memory was made".to_owned());
                out.unscored.insert(position, (cell, row.seed, failure));
            }
        }
        while next_goal <= index.goals.id.len() {
            index.goals.result_start.push(order.len());
            next_goal += 1;
        }
        Ok(())
    }
}

/// Which of the question's first 31 spans `memory` keeps, bit `i` for span `i`; -1 when there
/// is no such memory. The row's share kept says it when it is all or none; otherwise the spans
/// are looked for, `normalised` holding the last memory's normalised text, reused while rows of
/// the same memory follow one another.
fn kept_bits(
    (texts, question): (&[&str], &Question),
    memory: usize,
    share: Option<f64>,
    normalised: &mut Option<(usize, Normalised)>,
) -> i64 {
    let Some(text) = texts.get(memory) else {
        return -1;
    };
    let (spans, _) = question.spans();
    let all = (1i64 << spans.len().min(31)) - 1;
    match share {
        Some(share) if share >= 1.0 => return all,
        Some(share) if share <= 0.0 => return 0,
        _ => {}
    }
    if normalised.as_ref().is_none_or(|(m, _)| *m != memory) {
        *normalised = Some((memory, Normalised::of(text)));
    }
    let held = normalised.as_ref().map(|(_, n)| n);
    (spans.iter().take(31).enumerate())
        .filter(|(_, span)| held.is_some_and(|n| n.holds(span)))
        .fold(0, |bits, (i, _)| bits | 1 << i)
}
