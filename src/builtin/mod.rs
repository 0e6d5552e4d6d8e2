//! Built-in callbacks, served over the same protocol as any other (`gacc callback NAME`).

use std::io::Write;

use serde_json::{Value, json};

use crate::protocol::Role;

/// A built-in callback: its name, role, and behaviour version (part of its cache identity).
struct Builtin {
    name: &'static str,
    role: Role,
    revision: &'static str,
    summary: &'static str,
    respond: fn(&Value) -> Result<Value, String>,
}

const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "identity",
        role: Role::Compressor,
        revision: "1",
        summary: "the whole context (at r = 1, the full-context baseline)",
        respond: identity,
    },
    Builtin {
        name: "prefix",
        role: Role::Compressor,
        revision: "1",
        summary: "the source itself, so truncation keeps its first L tokens",
        respond: identity,
    },
    Builtin {
        name: "goal-line",
        role: Role::Compressor,
        revision: "1",
        summary: "the source lines containing the goal's keyword (its last word)",
        respond: goal_line,
    },
    Builtin {
        name: "goal-bm25",
        role: Role::Compressor,
        revision: "1",
        summary: "the source's sentences ranked by BM25 (params k1, b) against the goal, the best kept in source order until L tokens are used",
        respond: goal_bm25,
    },
    Builtin {
        name: "random-sentences",
        role: Role::Compressor,
        revision: "1",
        summary: "source sentences drawn at random (seeded), kept in source order until L tokens are used",
        respond: random_sentences,
    },
    Builtin {
        name: "field-lookup",
        role: Role::Reader,
        revision: "1",
        summary: "the value of the first field=value pair in the memory whose field the question names",
        respond: field_lookup,
    },
    Builtin {
        name: "extractive",
        role: Role::Reader,
        revision: "1",
        summary: "the memory sentence that best matches the question by BM25 (params k1, b)",
        respond: extractive,
    },
    Builtin {
        name: "exact",
        role: Role::Judge,
        revision: "1",
        summary: "the answer equals the reference, ignoring surrounding white space",
        respond: exact,
    },
    Builtin {
        name: "normalized",
        role: Role::Judge,
        revision: "1",
        summary: "equal after SQuAD normalisation (lowercase, no punctuation or articles, single spaces)",
        respond: normalized,
    },
    Builtin {
        name: "contains",
        role: Role::Judge,
        revision: "1",
        summary: "the normalised reference's words appear, in order and together, in the normalised answer",
        respond: contains,
    },
    Builtin {
        name: "token-f1",
        role: Role::Judge,
        revision: "1",
        summary: "SQuAD token F1 of answer and reference at least `threshold` (param, default 0.5); the F1 is the score",
        respond: token_f1,
    },
    Builtin {
        name: "bench-window",
        role: Role::Compressor,
        revision: "1",
        summary: "for gacc bench: about L tokens (4 bytes each) of the context, from an offset set by params.offset",
        respond: bench_window,
    },
    Builtin {
        name: "bench-reader",
        role: Role::Reader,
        revision: "1",
        summary: "for gacc bench: an answer that differs per memory and question",
        respond: bench_reader,
    },
    Builtin {
        name: "bench-judge",
        role: Role::Judge,
        revision: "1",
        summary: "for gacc bench: a verdict that differs per answer",
        respond: bench_judge,
    },
];

/// The built-in callbacks that can play `role`.
pub(crate) fn names(role: Role) -> Vec<&'static str> {
    BUILTINS
        .iter()
        .filter(|b| b.role == role)
        .map(|b| b.name)
        .collect()
}

/// The behaviour version of a built-in, bound into its cache keys.
pub(crate) fn revision(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|b| b.name == name).map(|b| b.revision)
}

/// Answers one request as the built-in `name` would, in process (for tests and tools).
pub fn respond(name: &str, request: &Value) -> Result<Value, String> {
    match BUILTINS.iter().find(|b| b.name == name) {
        Some(builtin) => (builtin.respond)(request),
        None if name == TOKENIZER => tokenize(request),
        None => Err(format!("unknown built-in `{name}`")),
    }
}

/// Every built-in: (name, role, what it does).
pub(crate) fn catalogue() -> Vec<(&'static str, Role, &'static str)> {
    BUILTINS.iter().map(|b| (b.name, b.role, b.summary)).collect()
}

/// Serves requests from stdin until it closes: one JSON value in, one JSON line out, flushed,
/// so the same program serves oneshot and persistent mode. Returns the exit status.
pub(crate) fn serve(name: &str) -> i32 {
    let respond = if name == TOKENIZER {
        tokenize
    } else if let Some(builtin) = BUILTINS.iter().find(|b| b.name == name) {
        builtin.respond
    } else {
        let all: Vec<_> = BUILTINS.iter().map(|b| b.name).collect();
        eprintln!(
            "gacc callback: unknown built-in `{name}`: expected one of {}",
            all.join(", ")
        );
        return 2;
    };
    let stdin = std::io::stdin().lock();
    let mut requests = serde_json::Deserializer::from_reader(stdin).into_iter::<Value>();
    let mut stdout = std::io::stdout().lock();
    let mut status = 0;
    let mut served = 0;
    loop {
        let (response, stop) = match requests.next() {
            None if served > 0 => break,
            None => (Err("no request on stdin".to_owned()), true),
            Some(Err(error)) => (Err(format!("the request is not JSON: {error}")), true),
            Some(Ok(request)) => (respond(&request), false),
        };
        served += 1;
        let response = response.unwrap_or_else(|message| {
            eprintln!("{name}: {message}");
            status = 1;
            json!({"error": message, "retryable": false})
        });
        if writeln!(stdout, "{response}")
            .and_then(|_| stdout.flush())
            .is_err()
        {
            return 1;
        }
        if stop {
            break;
        }
    }
    status
}

/// The built-in cl100k_base served over the tokenizer role, for external tokenizers that
/// wrap it (and for testing external tokenizer support).
pub(crate) const TOKENIZER: &str = "cl100k_base";

fn tokenize(request: &Value) -> Result<Value, String> {
    let tokenizer = bpe_openai::cl100k_base();
    match request.get("op").and_then(Value::as_str) {
        Some("encode") => Ok(json!({"tokens": tokenizer.encode(field(request, "text")?)})),
        Some("decode") => {
            let tokens: Vec<u32> = request
                .get("tokens")
                .and_then(Value::as_array)
                .and_then(|t| {
                    t.iter()
                        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                        .collect()
                })
                .ok_or("the request has no `tokens` list of token ids")?;
            let vocabulary = tokenizer.bpe.num_tokens() as u32;
            if let Some(token) = tokens.iter().find(|t| **t >= vocabulary) {
                return Err(format!("token {token} is outside the vocabulary"));
            }
            let bytes = tokenizer.bpe.decode_tokens(&tokens);
            Ok(json!({"text": String::from_utf8_lossy(&bytes)}))
        }
        _ => Err("`op` must be \"encode\" or \"decode\"".into()),
    }
}

fn field<'a>(request: &'a Value, name: &str) -> Result<&'a str, String> {
    request
        .get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the request has no string field `{name}`"))
}

fn goal_of(request: &Value) -> Result<Option<&str>, String> {
    match request.get("goal") {
        Some(Value::String(goal)) => Ok(Some(goal.as_str())),
        Some(Value::Null) | None => Ok(None),
        Some(_) => Err("`goal` must be a string or null".into()),
    }
}

fn budget_of(request: &Value) -> Result<usize, String> {
    request
        .get("token_budget")
        .and_then(Value::as_u64)
        .map(|b| b as usize)
        .ok_or_else(|| "the request has no whole-number field `token_budget`".to_owned())
}

/// The full context: the baseline that truncation alone compresses.
fn identity(request: &Value) -> Result<Value, String> {
    Ok(json!({"memory": field(request, "context")?}))
}

/// The goal's keyword: its last word, lowercased, letters and digits only.
fn keyword(goal: &str) -> Option<String> {
    goal.split(|c: char| !c.is_alphanumeric())
        .rfind(|word| !word.is_empty())
        .map(str::to_lowercase)
}

fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// The source lines that contain the goal's keyword as a word; with no goal, the whole source.
fn goal_line(request: &Value) -> Result<Value, String> {
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

/// Splits text into sentences: after `.`, `!` or `?` followed by white space, and at line breaks.
pub(crate) fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let next_is_space = chars.peek().is_some_and(|(_, n)| n.is_whitespace());
        let end = match c {
            '\n' => Some(i),
            '.' | '!' | '?' if next_is_space => Some(i + c.len_utf8()),
            _ => None,
        };
        if let Some(end) = end {
            let sentence = text[start..end].trim();
            if !sentence.is_empty() {
                out.push(sentence);
            }
            start = end;
        }
    }
    let rest = text[start..].trim();
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// Words too common to tell sentences apart.
const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "how", "in", "is",
    "it", "its", "of", "on", "or", "that", "the", "their", "this", "to", "was", "were", "what", "when",
    "where", "which", "who", "why", "with",
];

fn terms(text: &str) -> Vec<String> {
    words(text).filter(|w| !STOPWORDS.contains(&w.as_str())).collect()
}

/// BM25's usual term-saturation and length-normalisation constants.
pub(crate) const BM25_K1: f64 = 1.2;
pub(crate) const BM25_B: f64 = 0.75;

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

/// Okapi BM25 of each document against a query, with the given constants.
pub(crate) fn bm25_with(documents: &[&str], query: &str, k1: f64, b: f64) -> Vec<f64> {
    let documents: Vec<Vec<String>> = documents.iter().map(|d| terms(d)).collect();
    let count = documents.len() as f64;
    let average = documents.iter().map(Vec::len).sum::<usize>() as f64 / count.max(1.0);
    let mut query: Vec<String> = terms(query);
    query.sort();
    query.dedup();
    let idf: Vec<f64> = query
        .iter()
        .map(|term| {
            let df = documents.iter().filter(|d| d.contains(term)).count() as f64;
            (1.0 + (count - df + 0.5) / (df + 0.5)).ln()
        })
        .collect();
    documents
        .iter()
        .map(|document| {
            let length = document.len() as f64;
            query
                .iter()
                .zip(&idf)
                .map(|(term, idf)| {
                    let tf = document.iter().filter(|t| *t == term).count() as f64;
                    idf * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * length / average.max(1.0)))
                })
                .sum()
        })
        .collect()
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
fn goal_bm25(request: &Value) -> Result<Value, String> {
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
fn random_sentences(request: &Value) -> Result<Value, String> {
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
fn field_lookup(request: &Value) -> Result<Value, String> {
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
fn extractive(request: &Value) -> Result<Value, String> {
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
fn exact(request: &Value) -> Result<Value, String> {
    let answer = field(request, "answer")?;
    let reference = field(request, "reference")?;
    Ok(json!({"correct": answer.trim() == reference.trim()}))
}

/// About `L` tokens of the context (at roughly four bytes a token), starting `params.offset`
/// eighths of the way in: a compressor that costs nothing to run.
fn bench_window(request: &Value) -> Result<Value, String> {
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

fn bench_reader(request: &Value) -> Result<Value, String> {
    let digest = crate::hash::sha256(format!(
        "{}\n{}",
        field(request, "memory")?,
        field(request, "question")?
    ));
    Ok(json!({"answer": &digest[..12]}))
}

fn bench_judge(request: &Value) -> Result<Value, String> {
    let digest = crate::hash::sha256(format!(
        "{}\n{}",
        field(request, "answer")?,
        field(request, "reference")?
    ));
    Ok(json!({"correct": digest.as_bytes()[0] % 2 == 0}))
}

/// SQuAD's answer normalisation: lowercase, drop ASCII punctuation, drop the articles
/// a, an and the, and collapse white space.
pub(crate) fn normalize(text: &str) -> String {
    let lower = text.to_lowercase();
    let no_punctuation: String = lower.chars().filter(|c| !c.is_ascii_punctuation()).collect();
    no_punctuation
        .split_whitespace()
        .filter(|w| !matches!(*w, "a" | "an" | "the"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn answer_and_reference(request: &Value) -> Result<(String, String), String> {
    Ok((
        normalize(field(request, "answer")?),
        normalize(field(request, "reference")?),
    ))
}

fn normalized(request: &Value) -> Result<Value, String> {
    let (answer, reference) = answer_and_reference(request)?;
    Ok(json!({"correct": answer == reference}))
}

fn contains(request: &Value) -> Result<Value, String> {
    let (answer, reference) = answer_and_reference(request)?;
    let answer: Vec<&str> = answer.split(' ').collect();
    let reference: Vec<&str> = reference.split(' ').filter(|w| !w.is_empty()).collect();
    let found = !reference.is_empty() && answer.windows(reference.len()).any(|window| window == reference);
    Ok(json!({"correct": found}))
}

/// The SQuAD token F1 of two normalised texts.
pub(crate) fn f1(answer: &str, reference: &str) -> f64 {
    let answer: Vec<&str> = answer.split_whitespace().collect();
    let reference: Vec<&str> = reference.split_whitespace().collect();
    let mut remaining = reference.clone();
    let mut same = 0usize;
    for word in &answer {
        if let Some(position) = remaining.iter().position(|r| r == word) {
            remaining.swap_remove(position);
            same += 1;
        }
    }
    if same == 0 {
        return 0.0;
    }
    let precision = same as f64 / answer.len() as f64;
    let recall = same as f64 / reference.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// The F1 a `token-f1` judge needs for "correct" when its params name none.
const DEFAULT_F1_THRESHOLD: f64 = 0.5;

fn token_f1(request: &Value) -> Result<Value, String> {
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
    fn squad_normalisation() {
        assert_eq!(normalize("The  Quick, brown fox!"), "quick brown fox");
        assert_eq!(normalize("An apple a day"), "apple day");
        assert_eq!(normalize("14,382 tonnes."), "14382 tonnes");
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
    fn sentences_split_on_end_marks_and_lines() {
        assert_eq!(
            sentences(
                "One. Two! Three?
Four 4.5 five

Six"
            ),
            ["One.", "Two!", "Three?", "Four 4.5 five", "Six"]
        );
    }

    #[test]
    fn bm25_prefers_matching_sentences() {
        let docs = [
            "The pump failed.",
            "The reactor status is green.",
            "Lunch was late.",
        ];
        let scores = bm25_with(&docs, "reactor status", BM25_K1, BM25_B);
        assert!(scores[1] > scores[0] && scores[1] > scores[2]);
        assert_eq!(scores[2], 0.0);
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
