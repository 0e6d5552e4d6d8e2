//! The scanner of `cl100k-pieces` (crates/) held to bpe-openai's regex and encoder: the pieces
//! of every kind of character cl100k's pattern tells apart, and counts in every script.

use cl100k_pieces::{count, pieces};

/// The pieces bpe-openai's regex makes of `text`.
fn by_regex(text: &str) -> Vec<&str> {
    bpe_openai::cl100k_base().split(text).collect()
}

#[test]
fn the_scanner_splits_as_the_pattern_on_every_kind_of_character() {
    // Each kind of character the pattern tells apart, and the ones its case folding joins.
    let alphabet: Vec<char> = [
        ' ', ' ', ' ', '\t', '\r', '\n', '\u{a0}', '\u{3000}', '\u{2028}', '\u{85}', '\'', '\'', 's', 'S',
        'ſ', 't', 'T', 'r', 'R', 'e', 'v', 'l', 'L', 'm', 'd', 'K', 'k', 'a', 'é', 'ж', '中', '😀', '1', '2',
        '٣', 'Ⅻ', '½', '\u{301}', '.', ',', '(', '-', '_', '"', '/', '\u{200b}', '\u{feff}', '𝔸', '\u{0}',
    ]
    .into();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut random = |below: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % below as u64) as usize
    };
    for _ in 0..40_000 {
        let length = random(16);
        let text: String = (0..length).map(|_| alphabet[random(alphabet.len())]).collect();
        assert_eq!(pieces(&text).collect::<Vec<_>>(), by_regex(&text), "{text:?}");
    }
    for (text, _) in crate::inputs::tokenizer::test_vectors() {
        assert_eq!(pieces(&text).collect::<Vec<_>>(), by_regex(&text), "{text:?}");
    }
}

#[test]
fn a_count_is_the_encoders_on_text_in_every_script() {
    let bpe = &bpe_openai::cl100k_base().bpe;
    let texts = [
        include_str!("../../../../experiments/data/fixture.jsonl"),
        "Der Hafenmeister notiert jedes Schiff — 港の船はすべて記録される. naïve café, Ελληνικά, עברית, 😀👍🏽.\r\n\r\n  x",
        "电池的容量是 4,000 mAh；充电时间约 2 小时。I'll say it's   done\n\n\n   ",
    ];
    for text in texts {
        assert_eq!(
            count(bpe, text),
            bpe_openai::cl100k_base().count(text),
            "{text:?}"
        );
    }
    for (text, tokens) in crate::inputs::tokenizer::test_vectors() {
        assert_eq!(count(bpe, &text), tokens.len(), "{text:?}");
    }
}
