//! The reference tokenizer: cl100k_base, embedded, ordinary encoding (SPEC §1, §5, §7).

pub(crate) mod external;

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::inputs::manifest::TokenizerSpec;

/// SHA-256 of the official `cl100k_base.tiktoken` vocabulary file (SPEC §5).
pub const CL100K_VOCAB_SHA256: &str = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7";

/// The tokenizer a manifest names, verified: the built-in cl100k_base, or an external program
/// probed with the SPEC §7 vectors and round trips before any compressor runs. One that declares
/// `cl100k_base` and fails is refused (with the first mismatch) unless `allow_unverified`.
/// `secrets` are the manifest's `[run] secrets`: with the names that say so, the variables of
/// the tokenizer's `env` whose values are taken out of what gacc keeps.
pub(crate) fn open(
    spec: &TokenizerSpec,
    folder: &Path,
    secrets: &Vec<String>,
) -> Result<Arc<dyn Tokenizer>, String> {
    let Some(command) = &spec.command else {
        let builtin = Cl100k::new();
        if let Some(mismatch) = &builtin.identity().first_mismatch {
            return Err(format!(
                "the built-in cl100k_base failed verification: {mismatch}"
            ));
        }
        return Ok(Arc::new(builtin));
    };
    let mut argv = command.clone();
    if let Some(program) = argv
        .first()
        .and_then(|p| crate::inputs::manifest::find_program(p, folder))
    {
        argv[0] = program.display().to_string();
    }
    let revision = spec.revision.clone().unwrap_or_default();
    let env: Vec<(String, String)> = spec
        .env
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|value| (name.clone(), value)))
        .collect();
    crate::secrets::register_all(
        &(env.iter())
            .filter(|(name, _)| crate::secrets::is_secret(name, &[secrets]))
            .cloned()
            .collect::<Vec<_>>(),
    );
    let mut tokenizer = external::External::new(
        argv,
        folder.to_path_buf(),
        (spec.timeout.0, spec.mode),
        env,
        &spec.name,
        &revision,
    );
    let mismatch = first_mismatch(&tokenizer);
    let declares_cl100k = spec.name == "cl100k_base";
    let identity = tokenizer.identity_mut();
    identity.identity_verified = declares_cl100k && mismatch.is_none();
    identity.allow_unverified = spec.allow_unverified;
    identity.first_mismatch = match (&mismatch, declares_cl100k) {
        (Some(mismatch), _) => Some(mismatch.clone()),
        (None, false) => Some(format!("no pinned test vectors for `{}`", spec.name)),
        (None, true) => None,
    };
    if !identity.identity_verified && !spec.allow_unverified {
        let reason = identity.first_mismatch.clone().unwrap_or_default();
        return Err(format!(
            "the tokenizer `{}` (revision `{revision}`) is not verified: {reason}; set `allow_unverified = true` in [tokenizer] to run anyway",
            spec.name
        ));
    }
    Ok(Arc::new(tokenizer))
}

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
#[derive(Debug, Clone, Serialize, PartialEq, schemars::JsonSchema)]
pub struct TokenizerIdentity {
    pub name: String,
    pub revision: String,
    pub builtin: bool,
    pub identity_verified: bool,
    pub vocabulary_sha256: Option<String>,
    /// The first test vector the tokenizer failed, if any.
    pub first_mismatch: Option<String>,
    /// The manifest let an unverified tokenizer run.
    pub allow_unverified: bool,
}

/// A tokenizer that could not answer (an external one that crashed or misbehaved).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("tokenizer: {0}")]
pub struct TokenizerError(pub String);

/// Encodes and decodes text; every implementation encodes ordinarily (no special tokens).
pub trait Tokenizer: Send + Sync {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError>;
    /// The bytes of a token sequence, which may end inside a multi-byte character.
    fn decode_bytes(&self, tokens: &[u32]) -> Result<Vec<u8>, TokenizerError>;
    fn count(&self, text: &str) -> Result<usize, TokenizerError> {
        self.encode(text).map(|tokens| tokens.len())
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
                allow_unverified: false,
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
    fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        Ok(self.inner.encode(text))
    }
    fn decode_bytes(&self, tokens: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        let vocabulary = self.inner.bpe.num_tokens() as u32;
        match tokens.iter().find(|t| **t >= vocabulary) {
            Some(token) => Err(TokenizerError(format!("token {token} is outside the vocabulary"))),
            None => Ok(self.inner.bpe.decode_tokens(tokens)),
        }
    }
    /// Counted by `cl100k-pieces`' scanner, each distinct piece encoded once; the SPEC §7
    /// vectors hold it to `encode` at every start (`first_mismatch`), and `pieces`' tests to
    /// bpe-openai's regex.
    fn count(&self, text: &str) -> Result<usize, TokenizerError> {
        Ok(cl100k_pieces::count(&self.inner.bpe, text))
    }
    fn identity(&self) -> &TokenizerIdentity {
        &self.identity
    }
}

/// Texts whose round trip `decode(encode(text)) == text` every tokenizer must pass.
const ROUND_TRIPS: &[&str] = &[
    "",
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n",
    "Ünïcödé, 中文, العربية, emoji 🧪🔬",
    "<|endoftext|><|fim_prefix|>",
];

/// The first SPEC §7 vector (or round trip) a tokenizer gets wrong, described for a user.
pub fn first_mismatch(tokenizer: &dyn Tokenizer) -> Option<String> {
    for (text, expected) in test_vectors() {
        let shown = if text.len() > 40 {
            format!("{:?}… ({} bytes)", &text[..20], text.len())
        } else {
            format!("{text:?}")
        };
        match tokenizer.encode(&text) {
            Err(error) => return Some(format!("encode({shown}) failed: {error}")),
            Ok(got) if got != expected => {
                let got = if got.len() > 16 {
                    format!("{} tokens", got.len())
                } else {
                    format!("{got:?}")
                };
                let expected = if expected.len() > 16 {
                    format!("{} tokens", expected.len())
                } else {
                    format!("{expected:?}")
                };
                return Some(format!("encode({shown}) gave {got}, expected {expected}"));
            }
            Ok(_) => {}
        }
        match tokenizer.count(&text) {
            Ok(count) if count == expected.len() => {}
            Ok(count) => {
                return Some(format!(
                    "count({shown}) gave {count}, expected {}",
                    expected.len()
                ));
            }
            Err(error) => return Some(format!("count({shown}) failed: {error}")),
        }
        match tokenizer.decode_bytes(&expected) {
            Ok(bytes) if bytes == text.as_bytes() => {}
            Ok(bytes) => {
                return Some(format!(
                    "decode of the tokens of {shown} gave {:?}",
                    String::from_utf8_lossy(&bytes)
                ));
            }
            Err(error) => return Some(format!("decode of the tokens of {shown} failed: {error}")),
        }
    }
    for text in ROUND_TRIPS {
        let round_trip = tokenizer
            .encode(text)
            .and_then(|tokens| tokenizer.decode_bytes(&tokens));
        match round_trip {
            Ok(bytes) if bytes == text.as_bytes() => {}
            Ok(bytes) => {
                return Some(format!(
                    "decode(encode({text:?})) gave {:?}",
                    String::from_utf8_lossy(&bytes)
                ));
            }
            Err(error) => return Some(format!("round trip of {text:?} failed: {error}")),
        }
    }
    None
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

    /// `cl100k-pieces`' scanner held to bpe-openai's regex and encoder.
    mod pieces;

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
