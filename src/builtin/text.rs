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
///
/// One pass over the bytes into one buffer, runs of plain ASCII copied whole: every memory of a
/// run is normalised (SPEC §11's evidence), half a gigabyte in a paper-scale re-run, and the
/// four-step form (lowercase, filter, split, join) took a fifth of its time. A text with a
/// capital sigma, whose lowercase depends on where in a word it stands, takes the four steps.
pub(crate) fn normalize(text: &str) -> String {
    let mut out = Vec::new();
    normalize_into(text, &mut out);
    String::from_utf8(out).unwrap_or_else(|bytes| String::from_utf8_lossy(bytes.as_bytes()).into_owned())
}

/// `normalize`, into `buffer` (emptied first): UTF-8, though bytes. A caller that normalises
/// text after text reuses one buffer rather than ask the allocator for fresh pages each time.
pub(crate) fn normalize_into(text: &str, buffer: &mut Vec<u8>) {
    buffer.clear();
    if text.is_ascii() {
        normalize_ascii(text.as_bytes(), buffer);
        return;
    }
    if text.contains('Σ') {
        buffer.extend_from_slice(normalize_in_steps(text).as_bytes());
        return;
    }
    let bytes = text.as_bytes();
    buffer.reserve(bytes.len());
    let mut out = Words {
        out: buffer,
        word: None,
    };
    let mut at = 0;
    while at < bytes.len() {
        let byte = bytes[at];
        match ASCII[usize::from(byte)] {
            Ascii::Plain => {
                out.push(&[]);
                while let Some(&byte) = bytes.get(at)
                    && ASCII[usize::from(byte)] == Ascii::Plain
                {
                    out.out.push(byte.to_ascii_lowercase());
                    at += 1;
                }
            }
            Ascii::Space => {
                out.end_word();
                at += 1;
            }
            Ascii::Punctuation => at += 1,
            Ascii::Not => {
                let Some(c) = text.get(at..).and_then(|rest| rest.chars().next()) else {
                    break;
                };
                at += c.len_utf8();
                if c.is_whitespace() {
                    out.end_word();
                    continue;
                }
                for lower in c.to_lowercase().filter(|l| !l.is_ascii_punctuation()) {
                    out.push(lower.encode_utf8(&mut [0; 4]).as_bytes());
                }
            }
        }
    }
    out.end_word();
}

/// `normalize_into` of ASCII text (most memories): one pass writing through an index into a
/// buffer of the text's length, the word being written kept in registers, not in a `Vec`'s
/// length. Normalising never lengthens ASCII: a word's separating space stands for at least
/// one white-space byte read.
fn normalize_ascii(bytes: &[u8], buffer: &mut Vec<u8>) {
    buffer.resize(bytes.len(), 0);
    let out = buffer.as_mut_slice();
    let article = |word: &[u8]| matches!(word, b"a" | b"an" | b"the");
    // Bytes written, and where the word being written starts.
    let (mut written, mut word) = (0, None::<usize>);
    for &byte in bytes {
        match ASCII[usize::from(byte)] {
            Ascii::Plain => {
                if word.is_none() {
                    if written > 0 {
                        out[written] = b' ';
                        written += 1;
                    }
                    word = Some(written);
                }
                out[written] = byte.to_ascii_lowercase();
                written += 1;
            }
            Ascii::Space => {
                if let Some(start) = word.take()
                    && article(&out[start..written])
                {
                    written = start.saturating_sub(1);
                }
            }
            Ascii::Punctuation | Ascii::Not => {}
        }
    }
    if let Some(start) = word
        && article(&out[start..written])
    {
        written = start.saturating_sub(1);
    }
    buffer.truncate(written);
}

/// What `normalize` does with a byte.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ascii {
    /// Kept, lowercased: a letter, a digit, a control character.
    Plain,
    /// `char::is_whitespace`: tab, line feed, vertical tab, form feed, carriage return, space.
    Space,
    Punctuation,
    /// Not ASCII: the first byte of a character read whole.
    Not,
}

const ASCII: [Ascii; 256] = {
    let mut table = [Ascii::Not; 256];
    let mut byte = 0;
    while byte < 128 {
        let b = byte as u8;
        table[byte] = if matches!(b, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ') {
            Ascii::Space
        } else if b.is_ascii_punctuation() {
            Ascii::Punctuation
        } else {
            Ascii::Plain
        };
        byte += 1;
    }
    table
};

/// Normalised words being written: the bytes, and where the word being written starts and
/// where its separating space was.
struct Words<'b> {
    out: &'b mut Vec<u8>,
    word: Option<(usize, usize)>,
}

impl Words<'_> {
    /// Appends `bytes` to the word being written (starting one when none is).
    fn push(&mut self, bytes: &[u8]) {
        if self.word.is_none() {
            let separator = self.out.len();
            if !self.out.is_empty() {
                self.out.push(b' ');
            }
            self.word = Some((separator, self.out.len()));
        }
        self.out.extend_from_slice(bytes);
    }

    /// Ends the word being written, dropping it (and its space) when it is an article.
    fn end_word(&mut self) {
        if let Some((separator, start)) = self.word.take()
            && matches!(&self.out[start..], b"a" | b"an" | b"the")
        {
            self.out.truncate(separator);
        }
    }
}

/// `normalize`, step by step.
fn normalize_in_steps(text: &str) -> String {
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
        assert_eq!(normalize("the - a, THE. an"), "");
        assert_eq!(normalize("ΣΟΦΟΣ Σ"), normalize_in_steps("ΣΟΦΟΣ Σ"));
    }

    proptest::proptest! {
        /// One pass gives what the four steps give, whatever the text.
        #[test]
        fn normalising_in_one_pass_is_normalising_in_steps(text in r"(?s)[ aAnNtThHeE.,:;!?'\\\n\t\x0b\x1c\x7f\u{85}\u{a0}\u{2003}ÉéİßΣσ0-9x-]{0,40}") {
            proptest::prop_assert_eq!(normalize(&text), normalize_in_steps(&text));
        }

        /// ASCII text takes a path of its own: articles at either end, runs of punctuation
        /// and white space, control characters.
        #[test]
        fn and_on_ascii_text(text in r"(?s)[ aAnNtThHeExX.,:;!?'\\\n\t\r\x0b\x0c\x1c\x7f\x00-]{0,60}") {
            proptest::prop_assert_eq!(normalize(&text), normalize_in_steps(&text));
        }

        #[test]
        fn and_on_any_text(text in "\\PC{0,60}") {
            proptest::prop_assert_eq!(normalize(&text), normalize_in_steps(&text));
        }
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
