//! Every reader of outside data, fed what an attacker or a careless hand sends: the manifest,
//! the dataset (JSON Lines, CSV, Parquet), a labels file, a callback's stdout, a provider's
//! reply, its rate-limit headers and its batch lines. None may panic; a file that is refused
//! is refused naming itself, and a reply that is read holds only sane numbers.

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::mangle::{edits, hostile_value, mangled, replaced};
use crate::error::Error;
use crate::exec::callback::{check_response, parse_response, reported_error};
use crate::exec::model::pacer::Pacer;
use crate::exec::model::verdict::verdict;
use crate::protocol::Role;
use crate::protocol::messages::MAX_TOKENS;
use crate::providers::{Allowance, Announced, Reply};

/// The fixture experiment with its dataset in one of its forms and a labels file, in a folder
/// of its own.
struct Experiment {
    folder: tempfile::TempDir,
}

const FILES: [&str; 5] = [
    "fixture.toml",
    "data/fixture.jsonl",
    "data/fixture-table.csv",
    "data/fixture-table.parquet",
    "labels.csv",
];

impl Experiment {
    /// `dataset`: which of FILES[1..4] the manifest reads.
    fn new(dataset: &str) -> Experiment {
        let folder = tempfile::tempdir().unwrap();
        let experiments = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments");
        std::fs::create_dir(folder.path().join("data")).unwrap();
        for file in &FILES[1..4] {
            std::fs::copy(experiments.join(file), folder.path().join(file)).unwrap();
        }
        let manifest = std::fs::read_to_string(experiments.join("fixture.toml"))
            .unwrap()
            .replace("data/fixture.jsonl", dataset);
        let audit = "\n[audit]\njudges = [\"contains\"]\nlabels = \"labels.csv\"\n";
        std::fs::write(folder.path().join(FILES[0]), manifest + audit).unwrap();
        let labels = "question_id,answer,correct\r\nplant-reactor-temperature,451,true\r\n\
                      plant-reactor-temperature,\"4,51\",false\r\n";
        std::fs::write(folder.path().join(FILES[4]), labels).unwrap();
        Experiment { folder }
    }

    fn path(&self, file: &str) -> std::path::PathBuf {
        self.folder.path().join(file)
    }
}

#[test]
fn the_experiment_as_written_prepares() {
    for dataset in &FILES[1..4] {
        let experiment = Experiment::new(dataset);
        let prepared = crate::app::prepare::prepare(&experiment.path(FILES[0]), &[]);
        assert!(
            prepared.is_ok(),
            "{dataset}: {:?}",
            prepared.err().map(|e| e.to_string())
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// A mangled manifest, dataset or labels file is read or refused, never a panic; a refusal
    /// names the file it is about (or the manifest, which named that file).
    #[test]
    fn a_mangled_file_is_read_or_refused_naming_it(
        dataset in 1..4usize,
        target in 0..FILES.len(),
        edits in edits(),
    ) {
        let experiment = Experiment::new(FILES[dataset]);
        let file = FILES[target];
        let original = std::fs::read(experiment.path(file)).unwrap();
        std::fs::write(experiment.path(file), mangled(&original, &edits)).unwrap();
        match crate::app::prepare::prepare(&experiment.path(FILES[0]), &[]) {
            Ok(_) => {}
            Err(Error::Invalid(invalid)) => {
                // A problem with a file the manifest names (a dataset path cut short) names
                // that file, which the manifest named.
                let folder = experiment.folder.path().to_str().unwrap();
                let named = |problem: &crate::error::Problem| {
                    let name = Path::new(file).file_name().unwrap().to_str().unwrap();
                    problem.place.contains(name)
                        || problem.place.contains(FILES[0])
                        || (target == 0 && problem.place.contains(folder))
                };
                prop_assert!(!invalid.0.is_empty());
                for problem in &invalid.0 {
                    prop_assert!(named(problem), "{file}: {problem}");
                    prop_assert!(!problem.message.is_empty(), "{file}: {problem}");
                }
            }
            Err(other) => prop_assert!(false, "{file}: not a refusal: {other}"),
        }
    }
}

/// A callback's reply, to be broken.
fn callback_reply() -> Value {
    json!({"memory": "m", "answer": "a", "correct": true, "rationale": "r",
        "usage": {"input_tokens": 1, "output_tokens": 2, "cost_usd": 0.5},
        "model": "local", "error": null, "retryable": false})
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A callback's reply with any field replaced by any value is a failure or passes its
    /// role's check; one that passes has a usage gacc can sum and price.
    #[test]
    fn a_broken_callback_reply_is_a_failure_or_sane(at in 0..16usize, with in hostile_value()) {
        let broken = replaced(&callback_reply(), at, &with);
        let Ok(response) = parse_response(broken.to_string().as_bytes()) else {
            return Ok(());
        };
        let _ = reported_error(&response, 75);
        for role in [Role::Compressor, Role::Reader, Role::Judge] {
            if check_response(role, &response).is_ok() {
                let usage = response.get("usage");
                let number = |name: &str| usage.and_then(|u| u.get(name)).and_then(Value::as_f64);
                for name in ["input_tokens", "output_tokens"] {
                    let n = number(name).unwrap_or(0.0);
                    prop_assert!((0.0..=MAX_TOKENS as f64).contains(&n), "{role:?} {broken}");
                }
                let cost = number("cost_usd").unwrap_or(0.0);
                prop_assert!(cost.is_finite() && cost >= 0.0, "{role:?} {broken}");
            }
        }
    }

    /// A callback's stdout, cut or spliced anywhere, is a reply or a failure.
    #[test]
    fn a_mangled_callback_stdout_is_a_reply_or_a_failure(edits in edits()) {
        let original = callback_reply().to_string().into_bytes();
        if let Ok(response) = parse_response(&mangled(&original, &edits)) {
            for role in [Role::Compressor, Role::Reader, Role::Judge] {
                let _ = check_response(role, &response);
            }
        }
    }

    /// A judge model's reply of any text or tool input is a verdict or no verdict.
    #[test]
    fn a_judge_reply_of_anything_is_a_verdict_or_none(
        text in prop_oneof![
            ".{0,40}",
            Just("{\"correct\": \"yes\"}\nGRADE: C".to_owned()),
            Just("```json\n{\"correct\": true, \"rationale\": 1}\n```".to_owned()),
            Just("{\"correct\": true".to_owned()),
            Just("GRADE: \u{feff}C\r\nGRADE: I".to_owned()),
        ],
        tool_input in prop::option::of(hostile_value()),
    ) {
        let reply = Reply { text, tool_input, ..Reply::default() };
        let _ = verdict(&reply);
    }

    /// Whatever limits a reply announces (the provider's reader keeps them finite and within
    /// an hour), the pace holds the next call a minute at most.
    #[test]
    fn announced_limits_of_any_size_hold_a_call_a_minute_at_most(
        numbers in prop::collection::vec(
            prop_oneof![Just(0.0), Just(1.0), Just(1e300), Just(f64::MAX), 0.0..1e6f64],
            4,
        ),
        resets in prop::collection::vec(0..3_600_000_000_000u64, 2),
    ) {
        let allowance = |at: usize| Allowance {
            limit: numbers[at],
            remaining: numbers[at + 1],
            reset: Duration::from_nanos(resets[at / 2]),
        };
        let announced = Announced { requests: Some(allowance(0)), tokens: Some(allowance(2)) };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let waited = runtime.block_on(async {
            let pacer = Pacer::new(0, 0, true);
            let ticket = pacer.wait(10, 10).await;
            pacer.announced(ticket, announced);
            let start = tokio::time::Instant::now();
            let _ = pacer.wait(10, 10).await;
            start.elapsed()
        });
        prop_assert!(waited <= Duration::from_secs(61), "{announced:?}: {waited:?}");
    }
}
