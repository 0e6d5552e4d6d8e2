//! The built-in compressors, readers and judges, each a function from its role's request to
//! its role's response (the bench-* ones serve `gacc bench`).

use serde_json::Value;

use super::text::{BM25_B, BM25_K1, bm25_with, f1, keyword, normalize, sentences, tokens, words};
use crate::protocol::messages::{
    CompressorRequest as Compress, CompressorResponse as Memory, JudgeRequest as Judge,
    JudgeResponse as Verdict, ReaderRequest as Read, ReaderResponse as Answer,
};

type Reply<T> = Result<T, String>;

/// The full context: the baseline that truncation alone compresses.
pub(super) fn identity(request: &Compress) -> Reply<Memory<'static>> {
    Ok(Memory::new(request.context.as_ref()))
}

/// The source lines that contain the goal's keyword as a word; with no goal, the whole source.
pub(super) fn goal_line(request: &Compress) -> Reply<Memory<'static>> {
    let context = &request.context;
    let Some(goal) = &request.goal else {
        return Ok(Memory::new(context.as_ref()));
    };
    let Some(keyword) = keyword(goal) else {
        return Ok(Memory::new(""));
    };
    let lines: Vec<&str> = context
        .lines()
        .filter(|line| words(line).any(|w| w == keyword))
        .collect();
    Ok(Memory::new(lines.join("\n")))
}

/// `params.k1` and `params.b` of a request, or BM25's usual constants.
fn bm25_params(params: &Value) -> Result<(f64, f64), String> {
    let get = |name: &str, default: f64| match params.get(name) {
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
pub(super) fn goal_bm25(request: &Compress) -> Reply<Memory<'static>> {
    let pieces = sentences(&request.context);
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    if let Some(goal) = &request.goal {
        let (k1, b) = bm25_params(&request.params)?;
        let scores = bm25_with(&pieces, goal, k1, b);
        // Stable: equal scores keep source order.
        order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    }
    Ok(Memory::new(keep_within_budget(
        &pieces,
        &order,
        request.token_budget,
    )))
}

/// Sentences drawn in a seeded random order, kept in source order within the budget.
pub(super) fn random_sentences(request: &Compress) -> Reply<Memory<'static>> {
    let pieces = sentences(&request.context);
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    let mut rng = crate::rng::SplitMix64::new(request.seed);
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    Ok(Memory::new(keep_within_budget(
        &pieces,
        &order,
        request.token_budget,
    )))
}

/// Answers with the value of the first `field=value` pair in the memory whose field the
/// question names as a word; an empty answer when there is none.
pub(super) fn field_lookup(request: &Read) -> Reply<Answer<'static>> {
    let question: Vec<String> = words(&request.question).collect();
    let answer = request
        .memory
        .split_whitespace()
        .filter_map(|pair| pair.split_once('='))
        .find(|(name, value)| !value.is_empty() && question.contains(&name.to_lowercase()))
        .map(|(_, value)| value.trim_end_matches([',', ';', '.']))
        .unwrap_or("");
    Ok(Answer::new(answer))
}

/// The memory sentence with the highest BM25 score against the question (the first on a tie);
/// an empty answer when no sentence shares a word with it.
pub(super) fn extractive(request: &Read) -> Reply<Answer<'static>> {
    let pieces = sentences(&request.memory);
    let (k1, b) = bm25_params(&request.params)?;
    let scores = bm25_with(&pieces, &request.question, k1, b);
    let best = scores.iter().enumerate().filter(|(_, score)| **score > 0.0).fold(
        None,
        |best: Option<(usize, f64)>, (i, &score)| match best {
            Some((_, top)) if top >= score => best,
            _ => Some((i, score)),
        },
    );
    Ok(Answer::new(best.map_or("", |(i, _)| pieces[i])))
}

/// Correct when the answer equals the reference, ignoring surrounding white space.
pub(super) fn exact(request: &Judge) -> Reply<Verdict<'static>> {
    Ok(Verdict::verdict(
        request.answer.trim() == request.reference.trim(),
    ))
}

/// About `L` tokens of the context (at roughly four bytes a token), starting `params.offset`
/// eighths of the way in: a compressor that costs nothing to run.
pub(super) fn bench_window(request: &Compress) -> Reply<Memory<'static>> {
    let context = &request.context;
    let offset = request.params.get("offset").and_then(Value::as_u64).unwrap_or(0) as usize;
    let start = (context.len() * (offset % 8) / 8).min(context.len());
    let start = (start..=context.len())
        .find(|i| context.is_char_boundary(*i))
        .unwrap_or(context.len());
    let mut end = (start + request.token_budget.saturating_mul(4)).min(context.len());
    while !context.is_char_boundary(end) {
        end -= 1;
    }
    Ok(Memory::new(&context[start..end]))
}

pub(super) fn bench_reader(request: &Read) -> Reply<Answer<'static>> {
    let digest = crate::hash::sha256(format!("{}\n{}", request.memory, request.question));
    Ok(Answer::new(&digest[..12]))
}

pub(super) fn bench_judge(request: &Judge) -> Reply<Verdict<'static>> {
    let digest = crate::hash::sha256(format!("{}\n{}", request.answer, request.reference));
    Ok(Verdict::verdict(digest.as_bytes()[0] % 2 == 0))
}

fn answer_and_reference(request: &Judge) -> (String, String) {
    (normalize(&request.answer), normalize(&request.reference))
}

pub(super) fn normalized(request: &Judge) -> Reply<Verdict<'static>> {
    let (answer, reference) = answer_and_reference(request);
    Ok(Verdict::verdict(answer == reference))
}

pub(super) fn contains(request: &Judge) -> Reply<Verdict<'static>> {
    let (answer, reference) = answer_and_reference(request);
    let answer: Vec<&str> = tokens(&answer);
    let reference: Vec<&str> = tokens(&reference);
    let found = !reference.is_empty() && answer.windows(reference.len()).any(|window| window == reference);
    Ok(Verdict::verdict(found))
}

/// The F1 a `token-f1` judge needs for "correct" when its params name none.
pub(super) const DEFAULT_F1_THRESHOLD: f64 = 0.5;

pub(super) fn token_f1(request: &Judge) -> Reply<Verdict<'static>> {
    let (answer, reference) = answer_and_reference(request);
    let threshold = match request.params.get("threshold") {
        None | Some(Value::Null) => DEFAULT_F1_THRESHOLD,
        Some(value) => value
            .as_f64()
            .filter(|t| (0.0..=1.0).contains(t))
            .ok_or_else(|| format!("params.threshold must be a number from 0 to 1, got {value}"))?,
    };
    let score = f1(&answer, &reference);
    Ok(Verdict {
        score: Some(score),
        ..Verdict::verdict(score >= threshold)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compress(
        respond: fn(&Compress) -> Reply<Memory<'static>>,
        context: &str,
        goal: Option<&str>,
        budget: usize,
        seed: u64,
    ) -> String {
        let params = json!({});
        respond(&Compress::new(context, goal, budget, seed, &params))
            .unwrap()
            .memory
            .into_owned()
    }

    fn read(respond: fn(&Read) -> Reply<Answer<'static>>, memory: &str, question: &str) -> String {
        respond(&Read::new(memory, question, 0, &json!({})))
            .unwrap()
            .answer
            .into_owned()
    }

    fn judge(
        respond: fn(&Judge) -> Reply<Verdict<'static>>,
        answer: &str,
        reference: &str,
        params: Value,
    ) -> Reply<Verdict<'static>> {
        let judged = crate::protocol::messages::Judged {
            source: "s",
            question: "q",
            reference,
            answer,
        };
        respond(&Judge::new(judged, 0, &params))
    }

    fn verdict(respond: fn(&Judge) -> Reply<Verdict<'static>>, answer: &str, reference: &str) -> bool {
        judge(respond, answer, reference, json!({})).unwrap().correct
    }

    #[test]
    fn goal_line_keeps_lines_with_the_keyword() {
        let context = "intro\nreactor: temp=1 status=ok\npump: flow=2";
        assert_eq!(
            compress(goal_line, context, Some("Check the reactor"), 100, 0),
            "reactor: temp=1 status=ok"
        );
        assert_eq!(compress(goal_line, "a\nb", None, 100, 0), "a\nb");
    }

    #[test]
    fn field_lookup_answers_only_from_the_memory() {
        assert_eq!(
            read(field_lookup, "reactor: temp=451, status=ok", "What is the temp?"),
            "451"
        );
        assert_eq!(read(field_lookup, "reactor: temp=451", "What is the status?"), "");
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
        let response = judge(token_f1, "Paris, France", "Paris", json!({"threshold": 0.7})).unwrap();
        assert!(!response.correct);
        assert!((response.score.unwrap() - 2.0 / 3.0).abs() < 1e-12);
        assert!(
            judge(token_f1, "Paris, France", "Paris", json!({}))
                .unwrap()
                .correct
        );
        assert!(judge(token_f1, "x", "x", json!({"threshold": 2})).is_err());
    }

    #[test]
    fn extractive_reader_answers_with_the_best_sentence() {
        let memory = "The pump failed. The reactor status is green. Lunch was late.";
        assert_eq!(
            read(extractive, memory, "What is the reactor status?"),
            "The reactor status is green."
        );
        assert_eq!(
            read(extractive, "Lunch was late.", "What is the reactor status?"),
            ""
        );
    }

    #[test]
    fn goal_bm25_keeps_goal_sentences_in_source_order_within_budget() {
        let context =
            "Filler about lunch. The reactor runs hot. More filler here. The reactor status is green.";
        assert_eq!(
            compress(goal_bm25, context, Some("reactor"), 12, 0),
            "The reactor runs hot.\nThe reactor status is green."
        );
        assert_eq!(compress(goal_bm25, context, None, 5, 0), "Filler about lunch.");
        assert_eq!(compress(goal_bm25, context, Some("reactor"), 0, 0), "");
    }

    #[test]
    fn random_sentences_is_seeded() {
        let context = (0..20)
            .map(|i| format!("Sentence number {i}."))
            .collect::<Vec<_>>()
            .join(" ");
        let draw = |seed: u64| compress(random_sentences, &context, None, 20, seed);
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
    }

    #[test]
    fn exact_ignores_only_surrounding_space() {
        assert!(verdict(exact, "451\n", "451"));
        assert!(!verdict(exact, "451", "45"));
        assert!(!verdict(exact, "Ok", "ok"));
    }
}
