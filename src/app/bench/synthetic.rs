//! The synthetic experiment `gacc bench` runs: sources of seeded random sentences, goals and
//! questions in the paper's numbers, and a manifest of trivial callbacks.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::inputs::tokenizer::{Cl100k, Tokenizer};
use crate::rng::SplitMix64;

use super::Shape;

/// A pronounceable pseudo-word vocabulary, so text tokenizes like prose.
pub(super) fn vocabulary(rng: &mut SplitMix64) -> Vec<String> {
    const SYLLABLES: &[&str] = &[
        "ka", "lo", "mi", "ter", "san", "vo", "ri", "den", "pa", "shu", "mor", "el", "tan", "qui", "bra",
        "zo", "ne", "fal", "dri", "os",
    ];
    (0..3000)
        .map(|_| {
            (0..1 + rng.below(3))
                .map(|_| SYLLABLES[rng.below(SYLLABLES.len())])
                .collect()
        })
        .collect()
}

pub(super) fn sentence(rng: &mut SplitMix64, words: &[String]) -> String {
    let length = 8 + rng.below(14);
    let mut text: Vec<&str> = (0..length)
        .map(|_| words[rng.below(words.len())].as_str())
        .collect();
    let number = rng.below(10_000).to_string();
    let position = rng.below(length);
    text.insert(position, &number);
    let mut sentence = text.join(" ");
    if let Some(first) = sentence.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    sentence.push('.');
    sentence
}

/// Writes `dataset.jsonl` and `bench.toml` for the synthetic experiment.
pub(super) fn generate(folder: &Path, shape: &Shape) -> std::io::Result<PathBuf> {
    let tokenizer = Cl100k::new();
    let mut rng = SplitMix64::new(2026);
    let words = vocabulary(&mut rng);
    let mut lines = Vec::with_capacity(shape.sources);
    let mut goal_number = 0;
    let mut question_number = 0;
    for s in 0..shape.sources {
        let mut text = String::new();
        // Grow by sentences, checking the exact count now and then.
        while tokenizer.count(&text).unwrap_or(0) < shape.source_tokens {
            for _ in 0..40 {
                text.push_str(&sentence(&mut rng, &words));
                text.push(if rng.below(6) == 0 { '\n' } else { ' ' });
            }
        }
        let goals_here = shape.goals / shape.sources + usize::from(s < shape.goals % shape.sources);
        let mut goals = Vec::new();
        for _ in 0..goals_here {
            let questions_here =
                shape.questions / shape.goals + usize::from(goal_number < shape.questions % shape.goals);
            let questions: Vec<Value> = (0..questions_here)
                .map(|_| {
                    question_number += 1;
                    let word = &words[rng.below(words.len())];
                    json!({"id": format!("q{question_number}"), "question": format!("What became of the {word} in part {question_number}?"),
                        "reference": format!("{} {}", words[rng.below(words.len())], rng.below(1000))})
                })
                .collect();
            goal_number += 1;
            goals.push(json!({"id": format!("g{goal_number}"),
                "text": format!("Understand the {} and the {}", words[rng.below(words.len())], words[rng.below(words.len())]),
                "questions": questions}));
        }
        lines.push(json!({"id": format!("s{}", s + 1), "text": text, "goals": goals}).to_string());
    }
    std::fs::write(folder.join("dataset.jsonl"), lines.join("\n") + "\n")?;
    let mut manifest = format!(
        "name = \"bench\"\nseeds = [1]\nratios = [{}]\nconditions = [\"own-goal\", \"no-goal\", \"cross-goal\"]\n\n[dataset]\npath = \"dataset.jsonl\"\n\n",
        shape.ratios.join(", ")
    );
    for c in 0..shape.compressors {
        manifest.push_str(&format!(
            "[compressors.window-{c}]\nbuiltin = \"bench-window\"\nmode = \"persistent\"\nconcurrency = 2\nparams = {{ offset = {c} }}\n\n"
        ));
    }
    manifest.push_str(&format!(
        "[reader]\nbuiltin = \"bench-reader\"\nmode = \"persistent\"\n\n[judge]\nbuiltin = \"bench-judge\"\nmode = \"persistent\"\n\n[run]\nconcurrency = {}\ncache = \"cache\"\n",
        shape.concurrency
    ));
    let path = folder.join("bench.toml");
    std::fs::write(&path, manifest)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs::tokenizer::Tokenizer;

    /// The built-in's count (its scanner) is its encoder's on the bench's texts, the first 12
    /// sources of the paper-scale corpus (all 281 agree too: 2,334,060 tokens, as tiktoken's).
    #[test]
    fn the_count_is_the_encoders_on_the_bench_corpus() {
        let folder = tempfile::tempdir().unwrap();
        let shape = Shape {
            sources: 12,
            ..Shape::default()
        };
        generate(folder.path(), &shape).unwrap();
        let tokenizer = Cl100k::new();
        let dataset = std::fs::read_to_string(folder.path().join("dataset.jsonl")).unwrap();
        for line in dataset.lines() {
            let text = serde_json::from_str::<serde_json::Value>(line).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_owned();
            assert_eq!(
                tokenizer.count(&text).unwrap(),
                tokenizer.encode(&text).unwrap().len()
            );
        }
    }
}
