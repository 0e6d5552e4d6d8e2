//! Budget arithmetic and truncation, exactly as SPEC §1 states them.

use crate::inputs::tokenizer::{Tokenizer, TokenizerError};
use crate::protocol::TruncationMode;

/// The memory a reader receives, and the counts the ledger records about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncation {
    pub memory: String,
    pub generated_tokens: usize,
    pub retained_tokens: usize,
    pub truncated: bool,
    /// The cut fell inside a multi-byte character.
    pub utf8_split: bool,
}

/// `M = decode(encode(G)[:L])`: keeps only the prefix, never pads, never regenerates.
pub fn truncate_to_budget(
    tokenizer: &dyn Tokenizer,
    generation: &str,
    budget: usize,
    mode: TruncationMode,
) -> Result<Truncation, TokenizerError> {
    let tokens = tokenizer.encode(generation)?;
    let generated_tokens = tokens.len();
    if generated_tokens <= budget {
        return Ok(Truncation {
            memory: generation.to_owned(),
            generated_tokens,
            retained_tokens: generated_tokens,
            truncated: false,
            utf8_split: false,
        });
    }
    let bytes = tokenizer.decode_bytes(&tokens[..budget])?;
    let (memory, utf8_split) = match String::from_utf8(bytes) {
        Ok(memory) if generation.starts_with(&memory) => (memory, false),
        // An external decoder that replaced a broken tail itself.
        Ok(memory) => match mode {
            TruncationMode::Replace => (memory, true),
            TruncationMode::Utf8Safe => (common_prefix(&memory, generation).to_owned(), true),
        },
        Err(error) => {
            let bytes = error.into_bytes();
            let memory = match mode {
                TruncationMode::Replace => String::from_utf8_lossy(&bytes).into_owned(),
                TruncationMode::Utf8Safe => utf8_safe_prefix(&bytes),
            };
            (memory, true)
        }
    };
    Ok(Truncation {
        memory,
        generated_tokens,
        retained_tokens: budget,
        truncated: true,
        utf8_split,
    })
}

/// The longest common prefix of two texts, ending on a character boundary.
fn common_prefix<'a>(a: &'a str, b: &str) -> &'a str {
    let end = a
        .char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or_else(|| a.len().min(b.len()), |((i, _), _)| i);
    &a[..end]
}

/// The longest valid UTF-8 text made of whole characters of `bytes`, dropping broken ones.
fn utf8_safe_prefix(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid());
    }
    out
}
