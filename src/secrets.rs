//! The one place secrets are taken out. Every value gacc must never write (a model endpoint's
//! key; a variable passed through a callback's `env` whose name says it is a secret or that the
//! manifest declares one, `is_secret`) is registered here once it is read, and
//! everything gacc keeps or prints passes through [`redact`]: trace events and terminal lines
//! (at their writers), callback responses and failure texts (as they come in, before they are
//! hashed or cached), so a key a server or a callback echoes is replaced wherever it appears.

use std::borrow::Cow;
use std::sync::RwLock;

use serde_json::Value;

/// Values shorter than this are not secrets worth the name (`CUDA_VISIBLE_DEVICES=0` passed
/// through `env`): replacing them would mangle every number in a trace line.
pub(crate) const MIN_SECRET: usize = 8;

/// The shortest piece of a secret at either end of a text that is still redacted: a shorter
/// one (`mode` of `…/alphabetical-mode`) is as likely an ordinary word.
const SECRET_PIECE: usize = MIN_SECRET;

/// Words of a variable's name that make it a secret: `MY_API_KEY`, `HF_TOKEN`, `DB_PASSWORD`.
const SECRET_WORDS: &[&str] = &[
    "KEY",
    "KEYS",
    "TOKEN",
    "TOKENS",
    "SECRET",
    "SECRETS",
    "PASSWORD",
    "PASS",
    "PASSWD",
    "CREDENTIAL",
    "CREDENTIALS",
    "AUTH",
];

/// Whether the variable `name` holds a secret: a word of its name (split at `_`, `-` and `.`,
/// any case) is one of `SECRET_WORDS`, or the manifest lists it in `declared`.
pub(crate) fn is_secret(name: &str, declared: &[&Vec<String>]) -> bool {
    declared.iter().any(|names| names.iter().any(|d| d == name))
        || name.split(['_', '-', '.']).any(|word| {
            SECRET_WORDS
                .iter()
                .any(|secret| word.eq_ignore_ascii_case(secret))
        })
}

/// The names of `env` that are secrets (`is_secret`).
pub(crate) fn of(env: &[String], declared: &[&Vec<String>]) -> Vec<String> {
    env.iter()
        .filter(|name| is_secret(name, declared))
        .cloned()
        .collect()
}

/// Whether a text gacc keeps had a secret taken out of it: it holds the redactor's marker.
/// Asked of every memory and answer of a run (a paper-scale one holds 64,050 memories of a few
/// kilobytes): searched with SIMD, several times faster than `str::contains`.
pub(crate) fn was_redacted(text: &str) -> bool {
    memchr::memmem::find(text.as_bytes(), b"[redacted:").is_some()
}

/// Registered secrets, (variable name, value), longest value first.
static SECRETS: RwLock<Vec<(String, String)>> = RwLock::new(Vec::new());

/// From now on, `value` (named by its variable `name`) is replaced wherever gacc writes it.
pub(crate) fn register(name: &str, value: &str) {
    if value.len() < MIN_SECRET {
        return;
    }
    let mut secrets = SECRETS.write().unwrap_or_else(std::sync::PoisonError::into_inner);
    if secrets.iter().any(|(_, known)| known == value) {
        return;
    }
    secrets.push((name.to_owned(), value.to_owned()));
    secrets.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
}

/// Registers each (name, value).
pub(crate) fn register_all(secrets: &[(String, String)]) {
    for (name, value) in secrets {
        register(name, value);
    }
}

/// `text` with every registered secret replaced by `[redacted:NAME]`, borrowed when it holds none.
pub(crate) fn redact(text: &str) -> Cow<'_, str> {
    let secrets = SECRETS.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    if secrets.is_empty() {
        return Cow::Borrowed(text);
    }
    redact_with(text, &secrets)
}

/// `text` redacted in place.
pub(crate) fn redact_string(text: &mut String) {
    if let Cow::Owned(clean) = redact(text) {
        *text = clean;
    }
}

/// Every string in `value` (keys included) redacted; true when anything was replaced.
pub(crate) fn redact_json(value: &mut Value) -> bool {
    match value {
        Value::String(text) => match redact(text) {
            Cow::Owned(clean) => {
                *text = clean;
                true
            }
            Cow::Borrowed(_) => false,
        },
        Value::Array(items) => items.iter_mut().fold(false, |any, item| redact_json(item) | any),
        Value::Object(map) => {
            let mut any = false;
            let dirty: Vec<String> = map
                .keys()
                .filter(|key| matches!(redact(key), Cow::Owned(_)))
                .cloned()
                .collect();
            for key in dirty {
                if let Some(item) = map.remove(&key) {
                    map.insert(redact(&key).into_owned(), item);
                    any = true;
                }
            }
            map.values_mut().fold(any, |any, item| redact_json(item) | any)
        }
        _ => false,
    }
}

/// `text` with each of `secrets` replaced by `[redacted:NAME]`; a text that starts with the end
/// of a secret, or ends with its start (a tail cut through it), has that piece redacted too.
pub(crate) fn redact_with<'t>(text: &'t str, secrets: &[(String, String)]) -> Cow<'t, str> {
    let mut secrets: Vec<&(String, String)> =
        secrets.iter().filter(|(_, v)| v.len() >= SECRET_PIECE).collect();
    // Longest first, so a secret containing another is replaced whole.
    secrets.sort_by_key(|(_, value)| std::cmp::Reverse(value.len()));
    let mut text = Cow::Borrowed(text);
    for (name, value) in &secrets {
        if text.contains(value.as_str()) {
            text = Cow::Owned(text.replace(value.as_str(), &format!("[redacted:{name}]")));
        }
    }
    for (name, value) in &secrets {
        let marker = format!("[redacted:{name}]");
        let cuts = || (1..value.len()).filter(|cut| value.is_char_boundary(*cut));
        if let Some(cut) =
            cuts().find(|cut| value.len() - cut >= SECRET_PIECE && text.starts_with(&value[*cut..]))
        {
            text.to_mut().replace_range(..value.len() - cut, &marker);
        }
        if let Some(cut) = cuts()
            .rev()
            .find(|cut| *cut >= SECRET_PIECE && text.ends_with(&value[..*cut]))
        {
            let start = text.len() - cut;
            text.to_mut().replace_range(start.., &marker);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_redacted_whole_and_in_pieces_at_either_end() {
        let secrets = vec![
            ("KEY".to_owned(), "sk-0123456789".to_owned()),
            ("LONGER".to_owned(), "sk-0123456789-extra".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ];
        let redact = |text| redact_with(text, &secrets).into_owned();
        assert_eq!(
            redact("using sk-0123456789 and sk-0123456789-extra"),
            "using [redacted:KEY] and [redacted:LONGER]"
        );
        // A tail cut through a secret at its start, or a stream that ended inside one.
        assert_eq!(redact("456789-extra failed"), "[redacted:LONGER] failed");
        assert_eq!(redact("23456789 failed"), "[redacted:KEY] failed");
        // Ambiguous pieces are named after the longest secret they may belong to.
        assert_eq!(redact("key was sk-0123456"), "key was [redacted:LONGER]");
        // Pieces shorter than SECRET_PIECE are left alone: they may be ordinary words.
        assert_eq!(redact("3456789 apples"), "3456789 apples");
        assert_eq!(redact("key was sk-0123"), "key was sk-0123");
        assert_eq!(redact("nothing to hide"), "nothing to hide");
    }

    #[test]
    fn a_variable_is_a_secret_by_a_word_of_its_name_or_by_declaration() {
        let none: &[&Vec<String>] = &[];
        for name in [
            "MY_API_KEY",
            "hf_token",
            "DB_PASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "GH-AUTH",
            "SMTP_PASS",
        ] {
            assert!(is_secret(name, none), "{name}");
        }
        // A word, not a part of one: these are data.
        for name in [
            "DATA_MODE",
            "KEYWORDS_FILE",
            "TOKENIZER_PATH",
            "AUTHOR",
            "PASSAGE_DIR",
            "MONKEY",
        ] {
            assert!(!is_secret(name, none), "{name}");
        }
        let declared = vec!["DATA_MODE".to_owned()];
        assert!(is_secret("DATA_MODE", &[&declared]));
        let env = vec![
            "DATA_MODE".to_owned(),
            "MY_API_KEY".to_owned(),
            "HOME_DIR".to_owned(),
        ];
        assert_eq!(of(&env, none), ["MY_API_KEY"]);
    }

    #[test]
    fn a_value_ending_in_an_ordinary_word_does_not_redact_that_word() {
        let secrets = vec![("MY_API_KEY".to_owned(), "sk-live-0123456789-mode".to_owned())];
        let redact = |text| redact_with(text, &secrets).into_owned();
        assert_eq!(
            redact("mode=fast key=sk-live-0123456789-mode"),
            "mode=fast key=[redacted:MY_API_KEY]"
        );
        assert_eq!(redact("mode"), "mode");
        assert_eq!(redact("9-mode"), "9-mode");
    }

    #[test]
    fn registered_secrets_leave_every_string_of_a_json_value_and_short_values_are_not_secrets() {
        register("GACC_TEST_SECRET", "sk-registered-0123456789");
        register("GACC_TEST_SHORT", "0");
        let mut reply = json!({
            "text": "the key is Bearer sk-registered-0123456789, really",
            "model": "sk-registered-0123456789",
            "n": [0, 10, "0"],
            "sk-registered-0123456789": true,
        });
        assert!(redact_json(&mut reply));
        assert_eq!(
            reply,
            json!({
                "text": "the key is Bearer [redacted:GACC_TEST_SECRET], really",
                "model": "[redacted:GACC_TEST_SECRET]",
                "n": [0, 10, "0"],
                "[redacted:GACC_TEST_SECRET]": true,
            })
        );
        assert!(!redact_json(&mut json!({"clean": "text"})));
        assert!(matches!(redact("{\"n\":0}"), Cow::Borrowed(_)));
    }
}
