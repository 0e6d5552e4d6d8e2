//! Every rule of SPEC §1 and the test vectors of SPEC §7, against the library.

use gacc::inputs::budget::truncate_to_budget;
use gacc::inputs::tokenizer::{
    CL100K_VOCAB_SHA256, Cl100k, Tokenizer, TokenizerError, first_mismatch, test_vectors,
};
use gacc::protocol::{Ratio, TruncationMode};
use proptest::prelude::*;
use std::sync::LazyLock;

static CL100K: LazyLock<Cl100k> = LazyLock::new(Cl100k::new);

fn ratio(text: &str) -> Ratio {
    text.parse().unwrap()
}

#[test]
fn cl100k_reproduces_every_pinned_vector() {
    for (text, expected) in test_vectors() {
        assert_eq!(CL100K.encode(&text).unwrap(), expected, "encode({text:?})");
        assert_eq!(
            CL100K.decode_bytes(&expected).unwrap(),
            text.as_bytes(),
            "decode of {text:?}"
        );
    }
    assert_eq!(first_mismatch(&*CL100K), None);
}

#[test]
fn the_builtin_identity_is_computed_not_declared() {
    let identity = CL100K.identity();
    assert_eq!(identity.vocabulary_sha256.as_deref(), Some(CL100K_VOCAB_SHA256));
    assert!(identity.identity_verified);
    assert!(identity.builtin);
}

/// A tokenizer that declares cl100k_base but is off by one token on one vector.
struct OffByOne;

impl Tokenizer for OffByOne {
    fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let mut tokens = CL100K.encode(text)?;
        if text == "rer" {
            tokens[0] += 1;
        }
        Ok(tokens)
    }
    fn decode_bytes(&self, tokens: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        CL100K.decode_bytes(tokens)
    }
    fn identity(&self) -> &gacc::inputs::tokenizer::TokenizerIdentity {
        CL100K.identity()
    }
}

#[test]
fn a_tokenizer_off_by_one_token_fails_verification_with_the_vector_shown() {
    let mismatch = first_mismatch(&OffByOne).expect("must fail");
    assert!(
        mismatch.contains("\"rer\"") && mismatch.contains("38150"),
        "{mismatch}"
    );
}

#[test]
fn budget_reads_the_exact_decimal() {
    assert_eq!(ratio("0.29").budget(100), 29);
    assert_eq!(Ratio::try_from(0.29f64).unwrap().budget(100), 29);
    assert_eq!(ratio("0.15").budget(78), 11);
    assert_eq!(ratio("0.15").budget(68), 10);
    assert_eq!(ratio("0").budget(100), 0);
    assert_eq!(ratio("0.01").budget(99), 0, "a short source rounds down to 0");
}

#[test]
fn zero_budget_keeps_an_empty_memory() {
    let t = truncate_to_budget(&*CL100K, "anything at all", 0, TruncationMode::Replace).unwrap();
    assert_eq!(t.memory, "");
    assert_eq!(t.retained_tokens, 0);
    assert!(t.truncated);
}

#[test]
fn a_short_generation_is_not_padded() {
    let t = truncate_to_budget(&*CL100K, "hello world", 10, TruncationMode::Replace).unwrap();
    assert_eq!(t.memory, "hello world");
    assert_eq!((t.generated_tokens, t.retained_tokens), (2, 2));
    assert!(!t.truncated);
    assert_eq!(CL100K.count(&t.memory).unwrap(), 2, "no token was added");
}

#[test]
fn an_over_budget_generation_keeps_exactly_its_prefix() {
    let generation = "How about numbers? 123 45.6 -78.9";
    let t = truncate_to_budget(&*CL100K, generation, 5, TruncationMode::Replace).unwrap();
    // 4438 "How", 922 " about", 5219 " numbers", 30 "?", 220 " " | 4513 "123" ...
    assert_eq!(t.memory, "How about numbers? ");
    assert_eq!(CL100K.encode(&t.memory).unwrap(), vec![4438, 922, 5219, 30, 220]);
    assert_eq!((t.generated_tokens, t.retained_tokens), (14, 5));
    assert!(t.truncated);
    assert!(generation.starts_with(&t.memory));
}

#[test]
fn a_cut_inside_an_emoji_becomes_the_replacement_character() {
    // "I love 🍕" is 40, 3021, 11410, 235, 243: the pizza spans the last three tokens.
    let t = truncate_to_budget(&*CL100K, "I love 🍕", 4, TruncationMode::Replace).unwrap();
    assert_eq!(t.memory, "I love \u{FFFD}");
    assert!(t.utf8_split);
    let t = truncate_to_budget(&*CL100K, "👍", 2, TruncationMode::Replace).unwrap();
    assert_eq!(t.memory, "\u{FFFD}");
    let safe = truncate_to_budget(&*CL100K, "I love 🍕", 4, TruncationMode::Utf8Safe).unwrap();
    assert_eq!(safe.memory, "I love ");
    assert!(safe.utf8_split);
}

#[test]
fn special_token_text_is_ordinary_text() {
    let tokens = CL100K.encode("a <|endoftext|> b").unwrap();
    assert!(!tokens.contains(&100257), "never the special token");
    assert_eq!(
        CL100K.encode("<|endoftext|>").unwrap(),
        vec![27, 91, 8862, 728, 428, 91, 29]
    );
    let t = truncate_to_budget(&*CL100K, "<|endoftext|>", 3, TruncationMode::Replace).unwrap();
    assert_eq!(t.memory, "<|endo", "27 \"<\", 91 \"|\", 8862 \"endo\"");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn truncation_invariants(text in "\\PC{0,80}", budget in 0usize..40) {
        let t = truncate_to_budget(&*CL100K, &text, budget, TruncationMode::Replace).unwrap();
        prop_assert!(t.retained_tokens <= budget);
        prop_assert_eq!(budget - t.retained_tokens, budget.saturating_sub(t.retained_tokens));
        prop_assert_eq!(t.retained_tokens, t.generated_tokens.min(budget));
        prop_assert_eq!(t.truncated, t.generated_tokens > budget);
        if !t.truncated {
            prop_assert_eq!(&t.memory, &text, "never padded or changed");
        }
        // The memory is the decoded prefix: its bytes (before any replacement) start the text.
        let prefix = CL100K.decode_bytes(&CL100K.encode(&text).unwrap()[..t.retained_tokens]).unwrap();
        prop_assert!(text.as_bytes().starts_with(&prefix));
        if !t.utf8_split {
            prop_assert_eq!(t.memory.as_bytes(), &prefix[..]);
        }
    }

    #[test]
    fn budget_is_floor_of_exact_product(numerator in 0u64..=1000, n in 0usize..1_000_000) {
        let r: Ratio = format!("{}.{:03}", numerator / 1000, numerator % 1000).parse().unwrap();
        prop_assert_eq!(r.budget(n), (numerator as usize * n) / 1000);
        prop_assert!(r.budget(n) <= n);
    }
}
