//! A text not known yet: what `gacc plan`'s dry run of the runner has in place of a memory or an
//! answer that only a call would make. It says how many tokens the text holds at most and which
//! call would make it, so that two unknowns are the same exactly when their calls are, and a
//! request that carries one is bounded as if it held that many tokens.
//!
//! The runner leaves an unknown memory uncut (its bound is its budget already) and counts an
//! unknown answer or memory into every audit and panel sample (which only its text would
//! decide): what it bounds is then at most what a run makes.

/// What starts every unknown text; no memory or answer a callback makes holds a NUL.
const HEAD: &str = "\u{0}gacc-unknown ";

/// An unknown text of at most `tokens` tokens, made by the call `key`.
pub(crate) fn text(tokens: u64, key: &str) -> String {
    format!("{HEAD}{tokens} {key}\u{0}")
}

/// An unknown text's most tokens and the key of the call that made it.
fn parse(text: &str) -> Option<(u64, &str)> {
    let rest = text.strip_prefix(HEAD)?.strip_suffix('\u{0}')?;
    let (tokens, key) = rest.split_once(' ')?;
    Some((tokens.parse().ok()?, key))
}

/// The most tokens `text` holds, when it is an unknown text.
pub(crate) fn tokens(text: &str) -> Option<u64> {
    parse(text).map(|(tokens, _)| tokens)
}

/// `text`, when it is an unknown text, of at most `most` tokens (the call that made it may not
/// have known its budget).
pub(crate) fn capped(text: &str, most: u64) -> Option<String> {
    let (tokens, key) = parse(text)?;
    Some(self::text(tokens.min(most), key))
}

/// Whether `text` is an unknown text.
pub(crate) fn is(text: &str) -> bool {
    tokens(text).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_text_says_its_tokens_and_differs_by_its_call() {
        let a = text(120, "ab12");
        assert_eq!(tokens(&a), Some(120));
        assert!(is(&a));
        assert_ne!(a, text(120, "cd34"));
        assert_ne!(a, text(121, "ab12"));
        assert_eq!(capped(&a, 100), Some(text(100, "ab12")));
        assert_eq!(capped(&a, 500), Some(a.clone()));
        assert_eq!(capped("known", 5), None);
        for known in [
            "",
            "120 ab12",
            "\u{0}gacc-unknown x ab12\u{0}",
            "\u{0}gacc-unknown 5 k",
        ] {
            assert!(!is(known), "{known:?}");
        }
    }
}
