//! What explains each shared cell's score in both runs (SPEC §11): its answers by evidence kept
//! or lost, and the share of the floor-to-ceiling gap it closed.

use serde::Serialize;

use super::CellLabel;
use crate::report::stored::{StoredAttribution, StoredCell, StoredPoint, StoredReport};

/// The cost–quality frontier's change (SPEC §15): the points on B's frontier that were not on
/// A's, and those on A's that are not on B's (a point in one run only counts as off the other's).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub(crate) struct FrontierDiff {
    pub joined: Vec<CellLabel>,
    pub left: Vec<CellLabel>,
}

impl FrontierDiff {
    pub(super) fn of(a: &StoredReport, b: &StoredReport) -> FrontierDiff {
        let on = |report: &StoredReport| -> Vec<CellLabel> {
            (report.frontier.iter())
                .filter(|point| point.on_frontier())
                .map(label)
                .collect()
        };
        let (on_a, on_b) = (on(a), on(b));
        FrontierDiff {
            joined: on_b.iter().filter(|c| !on_a.contains(c)).cloned().collect(),
            left: on_a.iter().filter(|c| !on_b.contains(c)).cloned().collect(),
        }
    }

    /// As a Markdown section (nothing when the frontier did not change).
    pub(super) fn table(&self) -> String {
        if self.joined.is_empty() && self.left.is_empty() {
            return String::new();
        }
        let mut out = String::from(
            "\n## Frontier\n\nThe settings no other beats on both USD per question and Micro (SPEC §15), A → B.\n\n",
        );
        for (what, cells) in [
            ("joined the frontier", &self.joined),
            ("left the frontier", &self.left),
        ] {
            for c in cells {
                out.push_str(&format!(
                    "- {} · {} · {}: {what}\n",
                    c.compressor, c.condition, c.ratio
                ));
            }
        }
        out
    }
}

/// A frontier point named as its cell is.
fn label(point: &StoredPoint) -> CellLabel {
    CellLabel::new(
        &point.compressor,
        &point.condition,
        point.ratio.as_ref().unwrap_or(&serde_json::Value::Null),
        point.budget_tokens.as_ref(),
    )
}

/// One cell's attribution and gap closed, A beside B.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct WhyDiff {
    #[serde(flatten)]
    pub cell: CellLabel,
    pub attribution_a: Option<StoredAttribution>,
    pub attribution_b: Option<StoredAttribution>,
    pub gap_closed_a: Option<f64>,
    pub gap_closed_b: Option<f64>,
}

impl WhyDiff {
    pub(super) fn of(cell: CellLabel, a: &StoredCell, b: &StoredCell) -> WhyDiff {
        WhyDiff {
            cell,
            attribution_a: a.attribution,
            attribution_b: b.attribution,
            gap_closed_a: a.gap_closed,
            gap_closed_b: b.gap_closed,
        }
    }
}

/// The cells' attribution and gap closed side by side, as a Markdown section (nothing when
/// neither run counted them).
pub(super) fn table(cells: &[WhyDiff]) -> String {
    let counted = |c: &WhyDiff| c.attribution_a.is_some() || c.attribution_b.is_some();
    if !cells.iter().any(counted) {
        return String::new();
    }
    let mut out = String::from(
        "\n## Why\n\nEach cell's answers by whether the memory kept every evidence span, A → B, and the share of the floor-to-ceiling gap it closed.\n\n\
         | compressor | condition | ratio | kept · right | kept · wrong | lost · right | lost · wrong | gap closed A | gap closed B |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    let count = |a: Option<StoredAttribution>, pick: fn(&StoredAttribution) -> u64| {
        a.as_ref().map_or("—".to_owned(), |a| pick(a).to_string())
    };
    let number = |v: Option<f64>| v.map_or("—".to_owned(), |v| format!("{v:.3}"));
    let picks: [fn(&StoredAttribution) -> u64; 4] = [
        |a| a.kept_right,
        |a| a.kept_wrong,
        |a| a.lost_right,
        |a| a.lost_wrong,
    ];
    for c in cells.iter().filter(|c| counted(c)) {
        let counts: Vec<String> = picks
            .iter()
            .map(|pick| {
                format!(
                    "{} → {}",
                    count(c.attribution_a, *pick),
                    count(c.attribution_b, *pick)
                )
            })
            .collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            c.cell.compressor,
            c.cell.condition,
            c.cell.ratio,
            counts.join(" | "),
            number(c.gap_closed_a),
            number(c.gap_closed_b),
        ));
    }
    out
}
