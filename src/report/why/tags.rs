//! Scores per tag (SPEC §11): Micro per tag of a source, goal or question, and Macro for the
//! tags of sources and goals (whose goals are whole), per cell.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::{by_seed, grouped_by_goal};
use crate::inputs::dataset::Dataset;
use crate::protocol::CellId;
use crate::report::{Cell, metrics};
use crate::store::ledger::ResultRow;

/// One tag's scores, a score per cell in the report's order of cells.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct TagScores {
    /// What carries the tag: `source`, `goal` or `question`.
    pub on: String,
    pub tag: String,
    /// How many of the dataset's sources, goals or questions carry it.
    pub carriers: usize,
    pub cells: Vec<TagScore>,
}

/// One tag's scores in one cell.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct TagScore {
    #[serde(flatten)]
    pub cell: CellId,
    /// Mean over seeds, as a cell's Micro.
    pub micro: Option<f64>,
    /// For source and goal tags; mean over seeds.
    #[serde(rename = "macro", skip_serializing_if = "Option::is_none")]
    pub macro_: Option<f64>,
    /// Rows with the tag (every seed).
    pub rows: usize,
}

/// Every tag's scores in every cell, by what carries it, then tag.
pub(crate) fn by_tag(
    dataset: &Dataset,
    cells: &[Cell],
    rows: &HashMap<CellId, Vec<&ResultRow>>,
) -> Vec<TagScores> {
    // (on, tag) -> the ids that carry it
    let mut tagged: BTreeMap<(&str, &str), Vec<&str>> = BTreeMap::new();
    for source in &dataset.sources {
        for tag in &source.tags {
            tagged.entry(("source", tag)).or_default().push(&source.id);
        }
        for goal in &source.goals {
            for tag in &goal.tags {
                tagged.entry(("goal", tag)).or_default().push(&goal.id);
            }
            for question in &goal.questions {
                for tag in &question.tags {
                    tagged.entry(("question", tag)).or_default().push(&question.id);
                }
            }
        }
    }
    let mut out = Vec::new();
    for ((on, tag), ids) in tagged {
        let ids: std::collections::HashSet<&str> = ids.into_iter().collect();
        let mut scores = TagScores {
            on: on.to_owned(),
            tag: tag.to_owned(),
            carriers: ids.len(),
            cells: Vec::new(),
        };
        let carries = |row: &ResultRow| {
            let id = match on {
                "source" => &row.source_id,
                "goal" => &row.goal_id,
                _ => &row.question_id,
            };
            ids.contains(id.as_str())
        };
        for cell in cells {
            let chosen: Vec<&ResultRow> = (rows.get(&cell.id).into_iter().flatten())
                .copied()
                .filter(|r| carries(r))
                .collect();
            let seeds: Vec<metrics::Score> = by_seed(&chosen)
                .values()
                .map(|rows| {
                    let goals: Vec<Vec<Option<bool>>> = (grouped_by_goal(rows).iter())
                        .map(|g| {
                            g.iter()
                                .map(|r| if r.failure.is_some() { None } else { r.correct })
                                .collect()
                        })
                        .collect();
                    metrics::score(&goals)
                })
                .collect();
            let mean = |values: Vec<f64>| {
                (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
            };
            scores.cells.push(TagScore {
                cell: cell.id.clone(),
                micro: mean(seeds.iter().filter_map(|s| s.micro).collect()),
                macro_: (on != "question")
                    .then(|| mean(seeds.iter().filter_map(|s| s.macro_).collect()))
                    .flatten(),
                rows: chosen.len(),
            });
        }
        out.push(scores);
    }
    out
}
