//! cl100k_base's pre-tokenizer as a scanner, and a token count over it, for gacc's built-in
//! tokenizer. A crate of its own so that a debug build of gacc (its tests, `cargo run`) counts
//! with this code optimised, as the `bpe` crates it sits on are.
//!
//! The pre-tokenizer: the pieces its pattern splits a text into, found a
//! character at a time, and the pieces' tokens counted with a lookup for the pieces that are one
//! token. The pattern (tiktoken's, leftmost-first):
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,3} | ?[^\s\p{L}\p{N}]+[\r\n]*
//!   | \s*[\r\n]+ | \s+(?!\S) | \s+
//! ```
//!
//! The character classes are the `regex` crate's own (`regex-syntax`'s Unicode tables), so a
//! piece here is the piece the pattern matches; `tests` hold the scanner to the regex on every
//! kind of character the pattern tells apart (gacc's `src/inputs/tokenizer/pieces.rs`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::LazyLock;

/// What the pattern tells a character apart by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// `\p{L}`.
    Letter,
    /// `\p{N}`.
    Number,
    /// `\r` or `\n`.
    Newline,
    /// `\s` but `\r` and `\n`.
    Space,
    /// Anything else: `[^\s\p{L}\p{N}]`.
    Other,
}

/// Each class's ranges, and a table of ASCII.
struct Classes {
    ascii: [Class; 128],
    letters: Vec<(u32, u32)>,
    numbers: Vec<(u32, u32)>,
    spaces: Vec<(u32, u32)>,
}

/// The ranges of a Unicode class as the regex crate reads it.
fn ranges(class: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class as HirClass, HirKind};
    let Ok(hir) = regex_syntax::Parser::new().parse(class) else {
        return Vec::new();
    };
    match hir.kind() {
        HirKind::Class(HirClass::Unicode(unicode)) => (unicode.ranges().iter())
            .map(|range| (u32::from(range.start()), u32::from(range.end())))
            .collect(),
        _ => Vec::new(),
    }
}

fn within(ranges: &[(u32, u32)], code: u32) -> bool {
    ranges
        .binary_search_by(|&(start, end)| {
            if end < code {
                std::cmp::Ordering::Less
            } else if start > code {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

impl Classes {
    fn new() -> Classes {
        let mut classes = Classes {
            ascii: [Class::Other; 128],
            letters: ranges(r"\p{L}"),
            numbers: ranges(r"\p{N}"),
            spaces: ranges(r"\s"),
        };
        for byte in 0..128u8 {
            classes.ascii[usize::from(byte)] = classes.slow(u32::from(byte));
        }
        classes
    }

    fn slow(&self, code: u32) -> Class {
        if code == u32::from('\r') || code == u32::from('\n') {
            Class::Newline
        } else if within(&self.letters, code) {
            Class::Letter
        } else if within(&self.numbers, code) {
            Class::Number
        } else if within(&self.spaces, code) {
            Class::Space
        } else {
            Class::Other
        }
    }

    fn of(&self, c: char) -> Class {
        match self.ascii.get(c as usize) {
            Some(class) => *class,
            None => self.slow(u32::from(c)),
        }
    }
}

static CLASSES: LazyLock<Classes> = LazyLock::new(Classes::new);

/// The pieces of `text` in order, as cl100k_base's pattern splits it.
pub fn pieces(text: &str) -> Pieces<'_> {
    Pieces {
        text,
        at: 0,
        classes: &CLASSES,
    }
}

pub struct Pieces<'a> {
    text: &'a str,
    at: usize,
    classes: &'a Classes,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.at >= self.text.len() {
            return None;
        }
        let end = self.end_of_piece(self.at);
        let piece = &self.text[self.at..end];
        self.at = end;
        Some(piece)
    }
}

impl Pieces<'_> {
    /// The character at byte `at` and its class, if there is one.
    fn at(&self, at: usize) -> Option<(char, Class)> {
        let byte = *self.text.as_bytes().get(at)?;
        if byte.is_ascii() {
            return Some((char::from(byte), self.classes.ascii[usize::from(byte)]));
        }
        let c = self.text.get(at..)?.chars().next()?;
        Some((c, self.classes.of(c)))
    }

    /// Where the run of characters of `class` that starts at `at` ends, after at most `most`.
    fn run(&self, mut at: usize, class: Class, most: usize) -> usize {
        let mut taken = 0;
        while taken < most
            && let Some((c, found)) = self.at(at)
            && found == class
        {
            at += c.len_utf8();
            taken += 1;
        }
        at
    }

    /// The end of the piece that starts at `start`: the first alternative of the pattern that
    /// matches there.
    fn end_of_piece(&self, start: usize) -> usize {
        let Some((c, class)) = self.at(start) else {
            return self.text.len();
        };
        let next = start + c.len_utf8();
        if c == '\''
            && let Some(length) = contraction(&self.text[next..])
        {
            return next + length;
        }
        match class {
            Class::Letter => return self.run(start, Class::Letter, usize::MAX),
            Class::Number => return self.run(start, Class::Number, 3),
            // `[^\r\n\p{L}\p{N}]\p{L}+`: one character before letters.
            Class::Space | Class::Other if self.at(next).is_some_and(|(_, k)| k == Class::Letter) => {
                return self.run(next, Class::Letter, usize::MAX);
            }
            _ => {}
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
        let others = if c == ' ' { next } else { start };
        if self.at(others).is_some_and(|(_, k)| k == Class::Other) {
            let end = self.run(others, Class::Other, usize::MAX);
            return self.run(end, Class::Newline, usize::MAX);
        }
        self.end_of_spaces(start)
    }

    /// A piece of white space from `start`: `\s*[\r\n]+` (to its last line break), else
    /// `\s+(?!\S)` (all but its last character before a character that is not a space), else `\s+`.
    fn end_of_spaces(&self, start: usize) -> usize {
        let (mut at, mut last_break, mut last_start, mut count) = (start, None, start, 0);
        while let Some((c, class)) = self.at(at) {
            match class {
                Class::Newline => last_break = Some(at + c.len_utf8()),
                Class::Space => {}
                _ => break,
            }
            last_start = at;
            at += c.len_utf8();
            count += 1;
        }
        match last_break {
            Some(end) => end,
            None if at == self.text.len() || count < 2 => at,
            None => last_start,
        }
    }
}

/// The length of a contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`, in any case) at the
/// start of `rest`, the text after an apostrophe. Case-insensitive as the regex crate is: `s`
/// also matches `ſ` (U+017F) and `k`, which no contraction has, the Kelvin sign.
fn contraction(rest: &str) -> Option<usize> {
    let mut chars = rest.chars();
    let first = chars.next()?;
    let second = chars.next();
    let is = |c: Option<char>, letter: char| c.is_some_and(|c| c.eq_ignore_ascii_case(&letter));
    match first.to_ascii_lowercase() {
        's' | 't' | 'm' | 'd' => Some(1),
        'ſ' => Some('ſ'.len_utf8()),
        'r' | 'v' if is(second, 'e') => Some(2),
        'l' if is(second, 'l') => Some(2),
        _ => None,
    }
}

/// FxHash (rustc's): a multiply and a rotate per word, for the short keys a count looks up
/// millions of times.
#[derive(Default, Clone, Copy)]
struct Fx(u64);

impl Fx {
    fn add(&mut self, word: u64) {
        const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for Fx {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.add(word);
    }

    fn write_usize(&mut self, word: usize) {
        self.add(word as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

/// Counts the tokens of `text` a piece at a time, each distinct piece encoded once: in a long
/// text most pieces are words met before, and a lookup costs less than an encoding. (A table
/// of the vocabulary's one-token pieces bought no more than 5% on top of this, and took longer
/// to build than a short text takes to count.)
pub fn count(bpe: &bpe_openai::byte_pair_encoding::BytePairEncoding, text: &str) -> usize {
    let mut seen: FxMap<&str, usize> = FxMap::default();
    pieces(text)
        .map(|piece| *seen.entry(piece).or_insert_with(|| bpe.count(piece.as_bytes())))
        .sum()
}
