//! Every provider's readers, fed what a hostile or broken server sends: a reply, a batch's
//! state or result lines, an error body, rate-limit headers. None may panic; what is read holds
//! only sane numbers.

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::mangle::{edits, header_text, hostile_value, mangled, replaced};
use crate::clock::{go_duration, until_rfc3339};
use crate::protocol::messages::MAX_TOKENS;
use crate::providers::{Api, Lost, PROVIDERS, error_message};

/// Replies as each provider sends them, to be broken.
fn replies() -> [(Api, Value); 3] {
    [
        (
            crate::providers::tests::OPENAI_CHAT,
            json!({"model": "gpt-x", "system_fingerprint": "fp",
                "choices": [{"message": {"content": "{\"correct\": true}"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 3,
                          "prompt_tokens_details": {"cached_tokens": 64},
                          "prompt_cache_hit_tokens": 1}}),
        ),
        (
            crate::providers::tests::ANTHROPIC_MESSAGES,
            json!({"model": "claude-x", "stop_reason": "tool_use",
                "content": [{"type": "text", "text": "GRADE: C"},
                            {"type": "tool_use", "input": {"correct": false, "rationale": "r"}}],
                "usage": {"input_tokens": 20, "cache_read_input_tokens": 10,
                          "cache_creation_input_tokens": 0, "output_tokens": 7}}),
        ),
        (
            Api::named("openai-responses").expect("a registered provider"),
            json!({"model": "gpt-x", "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "output": [{"type": "reasoning", "summary": []},
                           {"type": "message", "content": [{"type": "output_text", "text": "a"}]}],
                "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 64},
                          "output_tokens": 3}}),
        ),
    ]
}

/// A batch's result line and its state, in each provider's shape.
fn batch_lines() -> [(Api, Value); 4] {
    [
        (
            crate::providers::tests::OPENAI_CHAT,
            json!({"custom_id": "k", "response": {"status_code": 200, "body": {"choices": []}},
                "error": null}),
        ),
        (
            crate::providers::tests::OPENAI_CHAT,
            json!({"id": "b", "status": "completed", "output_file_id": "f", "error_file_id": "e",
                "metadata": {"gacc_submission": "s"}, "request_counts": {"total": 3}}),
        ),
        (
            crate::providers::tests::ANTHROPIC_MESSAGES,
            json!({"custom_id": "k", "result": {"type": "errored",
                "error": {"type": "error", "error": {"type": "overloaded_error", "message": "m"}}}}),
        ),
        (
            crate::providers::tests::ANTHROPIC_MESSAGES,
            json!({"id": "b", "processing_status": "ended", "results_url": "https://x/r",
                "request_counts": {"processing": 0, "succeeded": 3},
                "created_at": "2026-12-01T20:44:34Z"}),
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A reply with any field replaced by any value is read or refused; what is read holds
    /// token counts gacc can sum and price.
    #[test]
    fn a_broken_reply_is_read_with_sane_counts_or_refused(
        which in 0..3usize,
        at in 0..24usize,
        with in hostile_value(),
    ) {
        let (api, original) = &replies()[which];
        let broken = replaced(original, at, &with);
        if let Ok(reply) = api.provider().reply(&broken) {
            let usage = reply.usage;
            for count in [usage.input, usage.cached_input, usage.cache_write, usage.output] {
                // Anthropic's input is the sum of three counts, each within bounds.
                prop_assert!(count <= 3 * MAX_TOKENS, "{broken}: {usage:?}");
            }
        }
    }

    /// A batch's state or result lines, broken anywhere, are read or ignored.
    #[test]
    fn a_broken_batch_line_is_read_or_ignored(
        which in 0..4usize,
        at in 0..24usize,
        with in hostile_value(),
        edits in edits(),
    ) {
        let (api, original) = &batch_lines()[which];
        let batches = api.provider().batches();
        let broken = replaced(original, at, &with);
        let _ = batches.result(&broken);
        let _ = batches.ended("http://127.0.0.1:1", "b", &broken);
        let lost = Lost { submission: "s", requests: 3, created: "2026-12-01T20:44:34Z" };
        let _ = batches.is_lost(&broken, &lost);
        let text = String::from_utf8_lossy(&mangled(broken.to_string().as_bytes(), &edits)).into_owned();
        let _ = batches.result_lines(&format!("{text}\n{broken}\r\n{text}"));
        let _ = error_message(&text);
    }

    /// Rate-limit headers of any text (huge, negative, not numbers, far-off dates) announce
    /// finite, non-negative limits reset within an hour, or nothing.
    #[test]
    fn rate_limit_headers_of_any_text_announce_sane_limits_or_nothing(
        texts in prop::collection::vec(header_text(), 7),
    ) {
        // Each header, by the length of its name, gets one of the texts.
        let header = |name: &str| Some(texts[name.len() % texts.len()].clone());
        for provider in PROVIDERS {
            let announced = provider.announced(&header);
            for allowance in [announced.requests, announced.tokens].into_iter().flatten() {
                prop_assert!(allowance.limit.is_finite() && allowance.limit >= 0.0, "{allowance:?}");
                prop_assert!(
                    allowance.remaining.is_finite() && allowance.remaining >= 0.0,
                    "{allowance:?}"
                );
                prop_assert!(allowance.reset <= Duration::from_secs(3600), "{allowance:?}");
            }
        }
        for text in &texts {
            prop_assert!(go_duration(text).is_none_or(|d| d <= Duration::from_secs(3600)));
            prop_assert!(until_rfc3339(text).is_none_or(|d| d <= Duration::from_secs(3600)));
        }
    }
}

/// What the properties above once found: sums and times past i64 and u64.
#[test]
fn counts_and_times_past_the_integers_are_refused_not_wrapped() {
    let listed = json!({"request_counts": {"processing": u64::MAX, "succeeded": 4}, "created_at": "2027"});
    let lost = Lost {
        submission: "s",
        requests: 3,
        created: "2026",
    };
    assert!(
        !crate::providers::tests::ANTHROPIC_MESSAGES
            .provider()
            .batches()
            .is_lost(&listed, &lost)
    );
    for text in [
        "0-12-00T0:-2562047788015216:00.5+0:00",
        "99999999999999999-12-01T00:00:00Z",
        "2026-12-01T99999999999999:00:00Z",
        "2026-12-01T00:00:00+9999999999999999:00",
    ] {
        assert_eq!(until_rfc3339(text), None, "{text}");
    }
}
