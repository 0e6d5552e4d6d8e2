//! The text algorithms of the built-in callbacks: words and sentences, BM25, and SQuAD's
//! answer normalisation and token F1.

/// The goal's keyword: its last word, lowercased, letters and digits only.
pub(super) fn keyword(goal: &str) -> Option<String> {
    goal.split(|c: char| !c.is_alphanumeric())
        .rfind(|word| !word.is_empty())
        .map(str::to_lowercase)
}

pub(super) fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
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
pub(super) const STOPWORDS: &[&str] = &[
    "a", "an", "and", "are", "as", "at", "be", "by", "did", "do", "does", "for", "from", "how", "in", "is",
    "it", "its", "of", "on", "or", "that", "the", "their", "this", "to", "was", "were", "what", "when",
    "where", "which", "who", "why", "with",
];

pub(super) fn terms(text: &str) -> Vec<String> {
    words(text).filter(|w| !STOPWORDS.contains(&w.as_str())).collect()
}

/// BM25's usual term-saturation and length-normalisation constants.
pub(crate) const BM25_K1: f64 = 1.2;

pub(crate) const BM25_B: f64 = 0.75;

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

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn squad_normalisation() {
        assert_eq!(normalize("The  Quick, brown fox!"), "quick brown fox");
        assert_eq!(normalize("An apple a day"), "apple day");
        assert_eq!(normalize("14,382 tonnes."), "14382 tonnes");
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
}
