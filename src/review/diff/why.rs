//! What explains each shared cell's score in both runs (SPEC §11): its answers by evidence kept
//! or lost, and the share of the floor-to-ceiling gap it closed.

use serde::Serialize;

use super::CellLabel;
use crate::report::stored::{StoredAttribution, StoredCell};

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
