//! The reference tokenizer: cl100k_base, embedded, ordinary encoding (SPEC §1, §5, §7).

use serde::Serialize;
use sha2::{Digest, Sha256};

/// SHA-256 of the official `cl100k_base.tiktoken` vocabulary file (SPEC §5).
pub const CL100K_VOCAB_SHA256: &str = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7";

/// The pinned cl100k_base test vectors of SPEC §7 (text, tokens).
pub fn test_vectors() -> Vec<(String, Vec<u32>)> {
    let mut vectors: Vec<(String, Vec<u32>)> = vec![
        ("hello world".into(), vec![15339, 1917]),
        ("rer".into(), vec![38149]),
        ("'rer".into(), vec![2351, 81]),
        ("today\n ".into(), vec![31213, 198, 220]),
        ("today\n \n".into(), vec![31213, 27907]),
        ("today\n  \n".into(), vec![31213, 14211]),
        ("👍".into(), vec![9468, 239, 235]),
        ("Hello world!".into(), vec![9906, 1917, 0]),
        ("こんにちは世界".into(), vec![90115, 3574, 244, 98220]),
        ("I love 🍕".into(), vec![40, 3021, 11410, 235, 243]),
        (
            "How about numbers? 123 45.6 -78.9".into(),
            vec![
                4438, 922, 5219, 30, 220, 4513, 220, 1774, 13, 21, 482, 2495, 13, 24,
            ],
        ),
        (
            "line1\r\nline2\r\nline3".into(),
            vec![1074, 16, 319, 1074, 17, 319, 1074, 18],
        ),
        ("<|endoftext|>".into(), vec![27, 91, 8862, 728, 428, 91, 29]),
    ];
    vectors.push(("a".repeat(1000), vec![70540; 125]));
    vectors
}

/// What a report says about the tokenizer in use (SPEC §5).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenizerIdentity {
    pub name: String,
    pub revision: String,
    pub builtin: bool,
    pub identity_verified: bool,
    pub vocabulary_sha256: Option<String>,
    /// The first test vector the tokenizer failed, if any.
    pub first_mismatch: Option<String>,
}

/// Encodes and decodes text; every implementation encodes ordinarily (no special tokens).
pub trait Tokenizer: Send + Sync {
    fn encode(&self, text: &str) -> Vec<u32>;
    /// The bytes of a token sequence, which may end inside a multi-byte character.
    fn decode_bytes(&self, tokens: &[u32]) -> Vec<u8>;
    fn count(&self, text: &str) -> usize {
        self.encode(text).len()
    }
    fn identity(&self) -> &TokenizerIdentity;
}

/// The built-in cl100k_base tokenizer, with its identity checked on construction.
pub struct Cl100k {
    inner: &'static bpe_openai::Tokenizer,
    identity: TokenizerIdentity,
}

impl Cl100k {
    pub fn new() -> Self {
        let inner = bpe_openai::cl100k_base();
        let vocabulary_sha256 = vocabulary_sha256(&inner.bpe);
        let mut this = Cl100k {
            inner,
            identity: TokenizerIdentity {
                name: "cl100k_base".into(),
                revision: format!("bpe-openai {}", BPE_OPENAI_VERSION),
                builtin: true,
                identity_verified: false,
                vocabulary_sha256: Some(vocabulary_sha256.clone()),
                first_mismatch: None,
            },
        };
        let mismatch = first_mismatch(&this);
        this.identity.identity_verified = mismatch.is_none() && vocabulary_sha256 == CL100K_VOCAB_SHA256;
        this.identity.first_mismatch = mismatch.or_else(|| {
            (vocabulary_sha256 != CL100K_VOCAB_SHA256)
                .then(|| format!("vocabulary SHA-256 {vocabulary_sha256}"))
        });
        this
    }
}

impl Default for Cl100k {
    fn default() -> Self {
        Self::new()
    }
}

const BPE_OPENAI_VERSION: &str = "0.3";

impl Tokenizer for Cl100k {
    fn encode(&self, text: &str) -> Vec<u32> {
        self.inner.encode(text)
    }
    fn decode_bytes(&self, tokens: &[u32]) -> Vec<u8> {
        self.inner.bpe.decode_tokens(tokens)
    }
    fn count(&self, text: &str) -> usize {
        self.inner.count(text)
    }
    fn identity(&self) -> &TokenizerIdentity {
        &self.identity
    }
}

/// The first SPEC §7 vector a tokenizer gets wrong, described for a user.
pub fn first_mismatch(tokenizer: &dyn Tokenizer) -> Option<String> {
    test_vectors().into_iter().find_map(|(text, expected)| {
        let got = tokenizer.encode(&text);
        (got != expected).then(|| format!("encode({text:?}) gave {got:?}, expected {expected:?}"))
    })
}

/// Rebuilds the `.tiktoken` file (base64 token, space, rank, newline) and hashes it.
fn vocabulary_sha256(bpe: &bpe_openai::byte_pair_encoding::BytePairEncoding) -> String {
    let mut hasher = Sha256::new();
    let mut line = String::new();
    for rank in 0..bpe.num_tokens() as u32 {
        line.clear();
        base64_encode(bpe.token_bytes(rank), &mut line);
        line.push(' ');
        line.push_str(&rank.to_string());
        line.push('\n');
        hasher.update(line.as_bytes());
    }
    crate::hash::hex(&hasher.finalize())
}

fn base64_encode(bytes: &[u8], out: &mut String) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            let mut out = String::new();
            base64_encode(input.as_bytes(), &mut out);
            assert_eq!(out, expected);
        }
    }
}
