//! The size of a dataset, and which scripts its sources are written in: what
//! `gacc dataset stats` prints.

use serde::Serialize;

use super::dataset::Dataset;

/// The size of a dataset: what `gacc dataset stats` prints.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Stats {
    pub sources: usize,
    pub goals: usize,
    pub questions: usize,
    /// cl100k_base tokens per source.
    pub tokens: Summary,
    pub goals_per_source: Summary,
    pub questions_per_goal: Summary,
    /// Per source, the share of its letters that are of scripts written without spaces
    /// (Chinese, Japanese, Korean), whose characters the text rules take one by one.
    pub cjk_share: Vec<SourceShare>,
}

/// One source's share of something.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct SourceShare {
    pub id: String,
    pub share: f64,
}

/// Minimum, median, maximum and total of a list of counts.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub(crate) struct Summary {
    pub min: usize,
    pub median: f64,
    pub max: usize,
    pub total: usize,
}

impl Summary {
    pub(crate) fn of(mut values: Vec<usize>) -> Summary {
        values.sort_unstable();
        let n = values.len();
        let median = match n {
            0 => 0.0,
            _ if n % 2 == 1 => values[n / 2] as f64,
            _ => (values[n / 2 - 1] + values[n / 2]) as f64 / 2.0,
        };
        Summary {
            min: values.first().copied().unwrap_or(0),
            median,
            max: values.last().copied().unwrap_or(0),
            total: values.iter().sum(),
        }
    }
}

/// Counts a dataset's sources, goals, questions and tokens.
pub(crate) fn stats(
    dataset: &Dataset,
    tokenizer: &dyn crate::inputs::tokenizer::Tokenizer,
    is_cjk: fn(char) -> bool,
) -> Result<Stats, String> {
    // Every source on every core: a paper-scale dataset is hundreds of long texts.
    let tokens = crate::parallel::map_in_parallel(&dataset.sources, |s| {
        tokenizer
            .count(&s.text)
            .map_err(|e| format!("source `{}`: {e}", s.id))
    })
    .into_iter()
    .collect::<Result<Vec<_>, _>>()?;
    Ok(Stats {
        sources: dataset.sources.len(),
        goals: dataset.goals().count(),
        questions: dataset.question_count(),
        tokens: Summary::of(tokens),
        goals_per_source: Summary::of(dataset.sources.iter().map(|s| s.goals.len()).collect()),
        questions_per_goal: Summary::of(dataset.goals().map(|(_, g)| g.questions.len()).collect()),
        cjk_share: (dataset.sources.iter())
            .map(|source| {
                // Text in ASCII has no CJK character.
                if source.text.is_ascii() {
                    return SourceShare {
                        id: source.id.clone(),
                        share: 0.0,
                    };
                }
                let letters = source.text.chars().filter(|c| c.is_alphanumeric());
                let (cjk, all) = letters.fold((0usize, 0usize), |(cjk, all), c| {
                    (cjk + usize::from(!c.is_ascii() && is_cjk(c)), all + 1)
                });
                SourceShare {
                    id: source.id.clone(),
                    share: if all == 0 { 0.0 } else { cjk as f64 / all as f64 },
                }
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        assert_eq!(
            Summary::of(vec![3, 1, 2]),
            Summary {
                min: 1,
                median: 2.0,
                max: 3,
                total: 6
            }
        );
        assert_eq!(
            Summary::of(vec![4, 1, 2, 3]),
            Summary {
                min: 1,
                median: 2.5,
                max: 4,
                total: 10
            }
        );
        assert_eq!(
            Summary::of(vec![]),
            Summary {
                min: 0,
                median: 0.0,
                max: 0,
                total: 0
            }
        );
    }
}
