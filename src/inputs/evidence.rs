//! Which of a question's evidence spans a memory kept (SPEC §11): a span is kept when its
//! SQuAD-normalised text (the `normalized` judge's) occurs in the memory's normalised text.

use crate::builtin::text::normalize;
use crate::inputs::records::Question;
use serde::{Deserialize, Serialize};

use crate::error::Problem;

/// What a row's evidence spans are (SPEC §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EvidenceBasis {
    /// The question's own `evidence`.
    Evidence,
    /// The question has none: its reference stands for it.
    Reference,
}

/// A memory's normalised text. Normalising drops punctuation without a space in its place
/// (`status=green` becomes `statusgreen`), so a span is looked for as a substring, as SPEC §11
/// says: `green` is kept there, and so is `1` by `10`, which is why a dataset states evidence
/// spans longer than a number.
pub(crate) struct Normalised(String);

impl Normalised {
    pub(crate) fn of(memory: &str) -> Normalised {
        Normalised(normalize(memory))
    }

    /// Whether the memory holds `span`'s normalised text. A span that normalises to nothing
    /// (only punctuation or articles) is held by every memory.
    pub(crate) fn holds(&self, span: &str) -> bool {
        self.holds_normalised(&normalize(span))
    }

    /// Whether the memory holds a span already normalised. memchr's SIMD search: a run looks
    /// for every row's spans in memories of thousands of tokens.
    pub(crate) fn holds_normalised(&self, words: &str) -> bool {
        memchr::memmem::find(self.0.as_bytes(), words.as_bytes()).is_some()
    }
}

/// A question's spans, normalised and made searchers once for every memory they are looked
/// for in (a paper-scale run looks for them in 385,000 rows' memories).
#[derive(Debug, Clone)]
pub(crate) struct Spans {
    finders: Vec<memchr::memmem::Finder<'static>>,
    basis: EvidenceBasis,
}

impl Spans {
    pub(crate) fn of(question: &Question) -> Spans {
        let (spans, given) = question.spans();
        Spans {
            finders: (spans.into_iter())
                .map(|span| memchr::memmem::Finder::new(normalize(span).as_bytes()).into_owned())
                .collect(),
            basis: match given {
                true => EvidenceBasis::Evidence,
                false => EvidenceBasis::Reference,
            },
        }
    }

    /// Every question's spans, by [source][goal][question].
    pub(crate) fn of_sources(sources: &[crate::inputs::records::Source]) -> Vec<Vec<Vec<Spans>>> {
        let goal = |g: &crate::inputs::records::Goal| g.questions.iter().map(Spans::of).collect();
        (sources.iter())
            .map(|s| s.goals.iter().map(goal).collect())
            .collect()
    }
}

/// Each of `spans`' share kept by the memory whose normalised text (`normalize_into`'s bytes)
/// is `normalised`, and what they are.
pub(crate) fn kept_each<'s>(
    normalised: &[u8],
    spans: impl Iterator<Item = &'s Spans>,
) -> Vec<(f64, EvidenceBasis)> {
    (spans.map(|spans| {
        let kept = (spans.finders.iter())
            .filter(|words| words.find(normalised).is_some())
            .count();
        (kept as f64 / spans.finders.len().max(1) as f64, spans.basis)
    }))
    .collect()
}

/// A question's evidence (SPEC §11): at least one span, each found verbatim in its source.
/// (A source that could not be read has had its problem already.)
pub(crate) fn check_evidence(question: &Question, source: &str, place: &str, problems: &mut Vec<Problem>) {
    let (spans, given) = question.spans();
    if !given {
        return;
    }
    let mut problem = |message: String| {
        problems.push(Problem {
            place: place.to_owned(),
            message,
        })
    };
    if spans.is_empty() {
        problem("`evidence` is an empty list; give a span, or leave `evidence` out".into());
    }
    for span in spans {
        if span.trim().is_empty() {
            problem("`evidence` holds an empty span".into());
        } else if normalize(span).is_empty() {
            problem(format!(
                "evidence span {} has no words once normalised (punctuation and articles are dropped), so every memory would keep it: give the words the answer rests on",
                quoted(span)
            ));
        } else if !source.is_empty() && !source.contains(span) {
            problem(format!(
                "evidence span {} is not in the source (a span is copied verbatim from it)",
                quoted(span)
            ));
        }
    }
}

/// Tags are names: none empty, none given twice.
pub(crate) fn check_tags(tags: &[String], place: &str, problems: &mut Vec<Problem>) {
    for (at, tag) in tags.iter().enumerate() {
        let message = if tag.trim().is_empty() {
            "a tag is empty".to_owned()
        } else if tags[..at].contains(tag) {
            format!("tag `{tag}` is given twice")
        } else {
            continue;
        };
        problems.push(Problem {
            place: place.to_owned(),
            message,
        });
    }
}

/// A span as an error message shows it: quoted, escaped, and cut after 80 characters.
fn quoted(span: &str) -> String {
    let cut: String = span.chars().take(80).collect();
    let more = if cut.len() < span.len() { "…" } else { "" };
    format!("{:?}{more}", cut)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::records::Evidence;

    /// The share of `question`'s spans `memory` holds, and what the spans are.
    fn kept(question: &Question, memory: &Normalised) -> (f64, EvidenceBasis) {
        kept_each(memory.0.as_bytes(), std::iter::once(&Spans::of(question)))[0]
    }

    fn question(evidence: Option<Evidence>) -> Question {
        Question {
            id: "q".into(),
            question: "When?".into(),
            reference: "1912".into(),
            evidence,
            tags: Vec::new(),
        }
    }

    #[test]
    fn a_span_is_kept_where_its_normalised_text_occurs() {
        let memory = Normalised::of("The ship sank in April, 1912; the Captain died. status=green");
        assert!(memory.holds("April 1912"));
        assert!(memory.holds("the captain DIED"));
        assert!(memory.holds("green"), "a key=value line keeps its value");
        assert!(!memory.holds("April 1913"));
        assert!(!memory.holds("captain lived"));
        assert!(memory.holds("..."));
        assert!(!Normalised::of("").holds("x"));
    }

    #[test]
    fn the_share_kept_and_its_basis() {
        let memory = Normalised::of("In 1912 the ship sank.");
        let spans = Some(Evidence::Many(vec!["ship sank".into(), "iceberg".into()]));
        assert_eq!(kept(&question(spans), &memory), (0.5, EvidenceBasis::Evidence));
        assert_eq!(kept(&question(None), &memory), (1.0, EvidenceBasis::Reference));
        let one = Some(Evidence::One("iceberg".into()));
        assert_eq!(kept(&question(one), &memory), (0.0, EvidenceBasis::Evidence));
        let each = [question(None), question(Some(Evidence::One("sank".into())))].map(|q| Spans::of(&q));
        let kept = kept_each(normalize("In 1912 the ship SANK.").as_bytes(), each.iter());
        assert_eq!(
            kept,
            vec![(1.0, EvidenceBasis::Reference), (1.0, EvidenceBasis::Evidence)]
        );
    }
}
