//! The rows a run writes: one per memory (`memories.jsonl`) and one per question
//! (`results.jsonl`), in plan order (SPEC §5).

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub(crate) use crate::inputs::evidence::EvidenceBasis;
use crate::protocol::{BudgetRule, CellId, Condition, MemoryId, Ratio, Stage, TruncationMode};

/// The cache entries a row rests on (SPEC §12), each under the kind of entry it is (an audit
/// judge's, `judges.<name>`, is a judge entry): a memory's `compressor` call, its cut `memory`, its
/// `text` and the recount's proven `count` of it; a question's `reader` and `judge` calls and
/// each audit judge's (`judges.<name>`). A row names only entries its run found or wrote: a
/// pack of the run carries exactly these.
///
/// Held as a short list in name order (a row names two to five entries): the order a map
/// would write them in, without a map's allocations for every row of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct CallKeys(Vec<(Cow<'static, str>, String)>);

impl CallKeys {
    pub(crate) fn new() -> CallKeys {
        CallKeys(Vec::new())
    }

    /// Names `key` as the entry `name` rests on (replacing an earlier one of that name).
    pub(crate) fn insert(&mut self, name: impl Into<Cow<'static, str>>, key: String) {
        let name = name.into();
        match self
            .0
            .binary_search_by(|(have, _)| have.as_ref().cmp(name.as_ref()))
        {
            Ok(at) => self.0[at].1 = key,
            Err(at) => self.0.insert(at, (name, key)),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each name and key, in name order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(name, key)| (name.as_ref(), key.as_str()))
    }
}

impl Serialize for CallKeys {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

/// One memory: what the compressor was given, what it generated, and what was kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LedgerRow {
    #[serde(flatten)]
    pub memory_id: MemoryId,
    /// `N`: the source's tokens.
    pub source_tokens: usize,
    /// `L`: `floor(r * N)` for a ratio, `min(b, N)` for a token budget.
    pub budget: usize,
    pub generated_tokens: usize,
    pub retained_tokens: usize,
    /// `L - retained_tokens`.
    pub unused_budget: usize,
    pub truncated: bool,
    /// The memory's tokens when encoded again.
    pub memory_tokens: usize,
    /// Always 0: a short generation is never padded.
    pub padding_tokens: usize,
    pub utf8_split: bool,
    pub truncation: TruncationMode,
    /// `memory_tokens > budget`.
    pub budget_violation: bool,
    /// A model endpoint stopped the compressor at `max_tokens` before it reached `L`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stopped_at_max_tokens: bool,
    /// A secret's value was taken out of the memory (`crate::secrets`): its text is not the
    /// compressor's, byte for byte.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
    pub memory_sha256: String,
    /// The memory job's key in `plan.json`.
    pub key: String,
    /// The compressor call's cache key.
    pub cache_key: String,
    /// Served without calling the compressor in this run.
    pub cached: bool,
    /// The key of the ladder call that made this memory (SPEC §14), when a ladder did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ladder_call: Option<String>,
    /// Whether this memory is a token prefix of the memory of the next larger budget of its
    /// ladder call (absent for the largest, and without a ladder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nested: Option<bool>,
    /// The memory the reader received (shared by rows with the same memory); written once
    /// per distinct memory to `memory_texts.jsonl`, keyed by `memory_sha256`.
    #[serde(skip_serializing, default)]
    pub memory: std::sync::Arc<str>,
}

/// The SHA-256 of what `report.html` reads of each ledger row: every field but `cached` (which
/// a run and its re-run tell apart, and the page does not show), for the page's key. A field the
/// page comes to show must be added here.
pub(crate) fn page_digest(ledger: &[LedgerRow]) -> String {
    crate::files::digest_of(|out| {
        for row in ledger {
            let shown = (
                &row.memory_id,
                (
                    row.source_tokens,
                    row.budget,
                    row.generated_tokens,
                    row.retained_tokens,
                ),
                (
                    row.memory_tokens,
                    row.truncated,
                    row.utf8_split,
                    row.budget_violation,
                ),
                (&row.memory_sha256, &row.key),
            );
            serde_json::to_writer(&mut *out, &shown)?;
        }
        Ok(())
    })
    .unwrap_or_default()
}

/// One distinct memory's text (`memory_texts.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct MemoryText {
    pub sha256: String,
    pub memory: std::sync::Arc<str>,
}

/// Each distinct memory of a ledger once, in the order rows first name it.
pub(crate) fn memory_texts(ledger: &[LedgerRow]) -> Vec<MemoryText> {
    let mut seen = std::collections::HashSet::new();
    ledger
        .iter()
        .filter(|row| seen.insert(row.memory_sha256.as_str()))
        .map(|row| MemoryText {
            sha256: row.memory_sha256.clone(),
            memory: row.memory.clone(),
        })
        .collect()
}

/// One question answered from one memory, and its verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ResultRow {
    pub seed: u64,
    // The cell's fields, not a flattened `CellId`: serde reads a flattened field through a
    // buffer, and results.jsonl is the largest file `gacc report` reads (385k rows at paper
    // scale read 40% slower). `cell()` gives them as one.
    pub compressor: String,
    pub condition: Condition,
    /// The cell's budget: its `ratio`, or its `budget_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<Ratio>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<usize>,
    pub source_id: String,
    pub goal_id: String,
    pub question_id: String,
    pub memory_key: String,
    pub answer: Option<String>,
    /// None when the question could not be answered or judged (see `failure`).
    pub correct: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// A secret's value was taken out of the answer (`crate::secrets`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub redacted: bool,
    /// The judge's reason, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rationale: Option<String>,
    /// The judge's `meta` (SPEC §3): for a model judge, its served model and raw reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_meta: Option<serde_json::Value>,
    /// Per audit judge whose sample holds this answer, its verdict (null: it gave none).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub audits: BTreeMap<String, Option<bool>>,
    /// The share of the question's evidence spans the memory kept (SPEC §11).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_kept: Option<f64>,
    /// Whether those spans are the question's `evidence` or its reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_basis: Option<EvidenceBasis>,
    /// The verdict on the question read with an empty memory (`[anchors] floor`; null: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor_correct: Option<bool>,
    /// The verdict on the question read with its whole source (`[anchors] ceiling`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling_correct: Option<bool>,
    /// Per panel reader whose sample holds this question, the scoring judge's verdict on its
    /// answer from the same memory (null: no verdict).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub panel: BTreeMap<String, Option<bool>>,
}

impl ResultRow {
    /// Whether the memory held every evidence span of the question.
    pub(crate) fn kept_all(&self) -> Option<bool> {
        self.evidence_kept.map(|share| share >= 1.0)
    }
}

impl ResultRow {
    /// The row's cell.
    /// Whether `other` is a row of this row's cell (`cell()`, without making it).
    pub(crate) fn same_cell(&self, other: &ResultRow) -> bool {
        (self.condition, self.ratio, self.budget_tokens)
            == (other.condition, other.ratio, other.budget_tokens)
            && self.compressor == other.compressor
    }

    pub(crate) fn cell(&self) -> CellId {
        CellId {
            compressor: self.compressor.clone(),
            condition: self.condition,
            rule: BudgetRule::of(self.ratio, self.budget_tokens),
        }
    }
}

/// A job that failed, with what a user needs to fix it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub(crate) struct FailureRow {
    pub job: String,
    pub stage: Stage,
    pub callback: String,
    pub reason: String,
    pub attempts: u32,
    pub stderr_tail: String,
    pub seed: u64,
    #[serde(flatten)]
    pub cell: CellId,
    pub source_id: String,
    /// None for a compress job.
    pub question_id: Option<String>,
}
