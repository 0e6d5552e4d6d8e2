//! The built-in compressors, readers and judges, each a function from a request to a
//! response (the bench-* ones serve `gacc bench`).

use serde_json::{Value, json};

use super::text::{BM25_B, BM25_K1, bm25_with, f1, keyword, normalize, sentences, words};
use super::{budget_of, field, goal_of};

/// The full context: the baseline that truncation alone compresses.
pub(super) fn identity(request: &Value) -> Result<Value, String> {
    Ok(json!({"memory": field(request, "context")?}))
}

/// The source lines that contain the goal's keyword as a word; with no goal, the whole source.
pub(super) fn goal_line(request: &Value) -> Result<Value, String> {
    let context = field(request, "context")?;
    let Some(goal) = goal_of(request)? else {
        return Ok(json!({"memory": context}));
    };
    let Some(keyword) = keyword(goal) else {
        return Ok(json!({"memory": ""}));
    };
    let lines: Vec<&str> = context
        .lines()
        .filter(|line| words(line).any(|w| w == keyword))
        .collect();
    Ok(json!({"memory": lines.join("\n")}))
}

/// `params.k1` and `params.b` of a request, or BM25's usual constants.
fn bm25_params(request: &Value) -> Result<(f64, f64), String> {
    let get = |name: &str, default: f64| match request.pointer(&format!("/params/{name}")) {
        None | Some(Value::Null) => Ok(default),
        Some(value) => value
            .as_f64()
            .filter(|v| *v >= 0.0)
            .ok_or_else(|| format!("params.{name} must be a number ≥ 0, got {value}")),
    };
    Ok((get("k1", BM25_K1)?, get("b", BM25_B)?))
}

/// Keeps sentences in the given order of preference while they fit in `budget` tokens,
/// and returns them in source order, one per line.
fn keep_within_budget(pieces: &[&str], preference: &[usize], budget: usize) -> String {
    let tokenizer = bpe_openai::cl100k_base();
    let mut used = 0;
    let mut kept = Vec::new();
    for &index in preference {
        // One token more for the line break that joins it.
        let cost = tokenizer.count(pieces[index]) + usize::from(!kept.is_empty());
        if used + cost <= budget {
            used += cost;
            kept.push(index);
        }
        if used >= budget {
            break;
        }
    }
    kept.sort_unstable();
    kept.iter().map(|&i| pieces[i]).collect::<Vec<_>>().join("\n")
}

/// The best sentences by BM25 against the goal, in source order, within the budget; with no
/// goal, sentences in source order.
pub(super) fn goal_bm25(request: &Value) -> Result<Value, String> {
    let context = field(request, "context")?;
    let budget = budget_of(request)?;
    let pieces = sentences(context);
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    if let Some(goal) = goal_of(request)? {
        let (k1, b) = bm25_params(request)?;
        let scores = bm25_with(&pieces, goal, k1, b);
        // Stable: equal scores keep source order.
        order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    }
    Ok(json!({"memory": keep_within_budget(&pieces, &order, budget)}))
}

/// Sentences drawn in a seeded random order, kept in source order within the budget.
pub(super) fn random_sentences(request: &Value) -> Result<Value, String> {
    let context = field(request, "context")?;
    let budget = budget_of(request)?;
    let seed = request.get("seed").and_then(Value::as_u64).unwrap_or(0);
    let pieces = sentences(context);
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    let mut rng = crate::rng::SplitMix64::new(seed);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    Ok(json!({"memory": keep_within_budget(&pieces, &order, budget)}))
}

/// Answers with the value of the first `field=value` pair in the memory whose field the
/// question names as a word; an empty answer when there is none.
pub(super) fn field_lookup(request: &Value) -> Result<Value, String> {
    let memory = field(request, "memory")?;
    let question: Vec<String> = words(field(request, "question")?).collect();
    let answer = memory
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, value)| !value.is_empty() && question.contains(&name.to_lowercase()))
        .map(|(_, value)| value.trim_end_matches([',', ';', '.']))
        .unwrap_or("");
    Ok(json!({"answer": answer}))
}

/// The memory sentence with the highest BM25 score against the question (the first on a tie);
/// an empty answer when no sentence shares a word with it.
pub(super) fn extractive(request: &Value) -> Result<Value, String> {
    let memory = field(request, "memory")?;
    let question = field(request, "question")?;
    let pieces = sentences(memory);
    let (k1, b) = bm25_params(request)?;
    let scores = bm25_with(&pieces, question, k1, b);
    let best = scores.iter().enumerate().filter(|(_, score)| **score > 0.0).fold(
        None,
        |best: Option<(usize, f64)>, (i, &score)| match best {
            Some((_, top)) if top >= score => best,
            _ => Some((i, score)),
        },
    );
    Ok(json!({"answer": best.map_or("", |(i, _)| pieces[i])}))
}

/// Correct when the answer equals the reference, ignoring surrounding white space.
pub(super) fn exact(request: &Value) -> Result<Value, String> {
    let answer = field(request, "answer")?;
    let reference = field(request, "reference")?;
    Ok(json!({"correct": answer.trim() == reference.trim()}))
}

/// About `L` tokens of the context (at roughly four bytes a token), starting `params.offset`
/// eighths of the way in: a compressor that costs nothing to run.
pub(super) fn bench_window(request: &Value) -> Result<Value, String> {
    let context = field(request, "context")?;
    let budget = budget_of(request)?;
    let offset = request
        .pointer("/params/offset")
        .and_then(Value::as_u64)
        .unwrap_or(0) as usize;
    let start = (context.len() * (offset % 8) / 8).min(context.len());
    let start = (start..=context.len())
        .find(|i| context.is_char_boundary(*i))
        .unwrap_or(context.len());
    let mut end = (start + budget * 4).min(context.len());
    while !context.is_char_boundary(end) {
        end -= 1;
    }
    Ok(json!({"memory": &context[start..end]}))
}

pub(super) fn bench_reader(request: &Value) -> Result<Value, String> {
    let digest = crate::hash::sha256(format!(
        "{}\n{}",
        field(request, "memory")?,
        field(request, "question")?
    ));
    Ok(json!({"answer": &digest[..12]}))
}

pub(super) fn bench_judge(request: &Value) -> Result<Value, String> {
    let digest = crate::hash::sha256(format!(
        "{}\n{}",
        field(request, "answer")?,
        field(request, "reference")?
    ));
    Ok(json!({"correct": digest.as_bytes()[0] % 2 == 0}))
}

fn answer_and_reference(request: &Value) -> Result<(String, String), String> {
    Ok((
        normalize(field(request, "answer")?),
        normalize(field(request, "reference")?),
    ))
}

pub(super) fn normalized(request: &Value) -> Result<Value, String> {
    let (answer, reference) = answer_and_reference(request)?;
    Ok(json!({"correct": answer == reference}))
}

pub(super) fn contains(request: &Value) -> Result<Value, String> {
    let (answer, reference) = answer_and_reference(request)?;
    let answer: Vec<&str> = answer.split(' ').collect();
    let reference: Vec<&str> = reference.split(' ').filter(|w| !w.is_empty()).collect();
    let found = !reference.is_empty() && answer.windows(reference.len()).any(|window| window == reference);
    Ok(json!({"correct": found}))
}

/// The F1 a `token-f1` judge needs for "correct" when its params name none.
pub(super) const DEFAULT_F1_THRESHOLD: f64 = 0.5;

pub(super) fn token_f1(request: &Value) -> Result<Value, String> {
    let (answer, reference) = answer_and_reference(request)?;
    let threshold = match request.get("params").and_then(|p| p.get("threshold")) {
        None | Some(Value::Null) => DEFAULT_F1_THRESHOLD,
        Some(value) => value
            .as_f64()
            .filter(|t| (0.0..=1.0).contains(t))
            .ok_or_else(|| format!("params.threshold must be a number from 0 to 1, got {value}"))?,
    };
    let score = f1(&answer, &reference);
    Ok(json!({"correct": score >= threshold, "score": score}))
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn goal_line_keeps_lines_with_the_keyword() {
        let request =
            json!({"context": "intro\nreactor: temp=1 status=ok\npump: flow=2", "goal": "Check the reactor"});
        assert_eq!(
            goal_line(&request).unwrap(),
            json!({"memory": "reactor: temp=1 status=ok"})
        );
        let request = json!({"context": "a\nb", "goal": null});
        assert_eq!(goal_line(&request).unwrap(), json!({"memory": "a\nb"}));
    }

    #[test]
    fn field_lookup_answers_only_from_the_memory() {
        let request = json!({"memory": "reactor: temp=451, status=ok", "question": "What is the temp?"});
        assert_eq!(field_lookup(&request).unwrap(), json!({"answer": "451"}));
        let request = json!({"memory": "reactor: temp=451", "question": "What is the status?"});
        assert_eq!(field_lookup(&request).unwrap(), json!({"answer": ""}));
    }

    fn verdict(respond: fn(&Value) -> Result<Value, String>, answer: &str, reference: &str) -> bool {
        respond(&json!({"answer": answer, "reference": reference, "params": {}})).unwrap()["correct"]
            .as_bool()
            .unwrap()
    }

    #[test]
    fn normalized_judge() {
        assert!(verdict(normalized, "The Eiffel Tower.", "eiffel tower"));
        assert!(!verdict(normalized, "the Eiffel Tower in Paris", "eiffel tower"));
    }

    #[test]
    fn contains_judge_matches_whole_words_in_order() {
        assert!(verdict(
            contains,
            "It was built by Orla Venn in 1911.",
            "orla venn"
        ));
        assert!(!verdict(contains, "Venn, Orla", "orla venn"));
        assert!(!verdict(contains, "It cost 14 dollars", "4"), "not inside a word");
        assert!(
            !verdict(contains, "anything", "the"),
            "an empty normalised reference matches nothing"
        );
    }

    #[test]
    fn token_f1_judge_by_hand() {
        // answer {paris, france}, reference {paris}: precision 1/2, recall 1, F1 2/3.
        assert!((f1("paris france", "paris") - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(f1("london", "paris"), 0.0);
        assert_eq!(f1("a b", "b a"), 1.0);
        let response =
            token_f1(&json!({"answer": "Paris, France", "reference": "Paris", "params": {"threshold": 0.7}}))
                .unwrap();
        assert_eq!(response["correct"], false);
        assert!((response["score"].as_f64().unwrap() - 2.0 / 3.0).abs() < 1e-12);
        let response =
            token_f1(&json!({"answer": "Paris, France", "reference": "Paris", "params": {}})).unwrap();
        assert_eq!(response["correct"], true);
        assert!(token_f1(&json!({"answer": "x", "reference": "x", "params": {"threshold": 2}})).is_err());
    }

    #[test]
    fn extractive_reader_answers_with_the_best_sentence() {
        let request = json!({"memory": "The pump failed. The reactor status is green. Lunch was late.", "question": "What is the reactor status?"});
        assert_eq!(
            extractive(&request).unwrap()["answer"],
            "The reactor status is green."
        );
        let request = json!({"memory": "Lunch was late.", "question": "What is the reactor status?"});
        assert_eq!(extractive(&request).unwrap()["answer"], "");
    }

    #[test]
    fn goal_bm25_keeps_goal_sentences_in_source_order_within_budget() {
        let context =
            "Filler about lunch. The reactor runs hot. More filler here. The reactor status is green.";
        let request = json!({"context": context, "goal": "reactor", "token_budget": 12, "seed": 0});
        assert_eq!(
            goal_bm25(&request).unwrap()["memory"],
            "The reactor runs hot.\nThe reactor status is green."
        );
        let request = json!({"context": context, "goal": null, "token_budget": 5, "seed": 0});
        assert_eq!(goal_bm25(&request).unwrap()["memory"], "Filler about lunch.");
        let request = json!({"context": context, "goal": "reactor", "token_budget": 0, "seed": 0});
        assert_eq!(goal_bm25(&request).unwrap()["memory"], "");
    }

    #[test]
    fn random_sentences_is_seeded() {
        let context = (0..20)
            .map(|i| format!("Sentence number {i}."))
            .collect::<Vec<_>>()
            .join(" ");
        let draw = |seed: u64| {
            random_sentences(&json!({"context": context, "token_budget": 20, "seed": seed})).unwrap()
        };
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn exact_ignores_only_surrounding_space() {
        let check = |answer, reference| {
            exact(&json!({"answer": answer, "reference": reference})).unwrap()["correct"].clone()
        };
        assert_eq!(check("451\n", "451"), json!(true));
        assert_eq!(check("451", "45"), json!(false));
        assert_eq!(check("Ok", "ok"), json!(false));
    }
}
