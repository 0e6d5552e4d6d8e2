//! Seeds and identical requests (SPEC §8): a greedy model callback sends one request for all
//! the run's seeds, made once; a sampled one on an API with a `seed` sends each seed's; on an
//! API without one, each seed is its own call. The mock counts every request body.

use crate::common;

use common::mock_api::{Behaviour, Format, MockApi, llm_manifest};
use common::{Scratch, read_json};
use serde_json::Value;

const KEY: &str = "sk-test-seeds";

/// The three-seed fixture with every role on a model built-in at `temperature`.
fn manifest(scratch: &Scratch, api: &MockApi, format: Format, temperature: &str) -> String {
    let text = llm_manifest(&api.url, format, "", "")
        .replace("temperature = 0.0", &format!("temperature = {temperature}"))
        .replace(
            "params = { model = \"mock\" }",
            &format!("params = {{ model = \"mock\", temperature = {temperature} }}"),
        );
    scratch.write("experiments/llm.toml", &text);
    "experiments/llm.toml".into()
}

fn run(scratch: &Scratch, manifest: &str) -> std::path::PathBuf {
    let (status, folder, stderr) = scratch.run_with_env(manifest, &[], &[("MOCK_API_KEY", KEY)]);
    assert_eq!(status, 0, "{stderr}");
    folder
}

/// Per seed: (seed, micro, macro) of every cell.
fn per_seed(folder: &std::path::Path) -> Vec<(u64, String, String)> {
    let report = read_json(&folder.join("report.json"));
    let cells = report["cells"].as_array().unwrap();
    cells
        .iter()
        .flat_map(|cell| cell["seeds"].as_array().unwrap().clone())
        .map(|s| {
            (
                s["seed"].as_u64().unwrap(),
                s["micro"].to_string(),
                s["macro"].to_string(),
            )
        })
        .collect()
}

#[test]
fn greedy_model_callbacks_send_each_distinct_request_once_for_all_seeds() {
    let scratch = Scratch::new();
    let (status, builtin, stderr) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    for format in [Format::OpenAi, Format::Anthropic] {
        let api = MockApi::start(format, Behaviour::default());
        let manifest = manifest(&scratch, &api, format, "0.0");
        let plan = scratch.json_with_env(["plan", &manifest, "--json"], &[("MOCK_API_KEY", KEY)]);
        // 4 memories, 12 reads, 12 judgements: one request each, whatever the seed.
        assert_eq!(plan["endpoints"]["mock"]["calls"], 4 + 12 + 12, "{plan}");
        let folder = run(&scratch, &manifest);
        let counts = api.counts();
        assert_eq!(counts.get(&counts.compressor), 4, "{format:?}");
        assert_eq!(counts.get(&counts.reader), 12, "{format:?}");
        assert_eq!(counts.get(&counts.judge), 12, "{format:?}");
        assert_eq!(api.repeated(), 0, "{format:?}: a request was sent twice");
        assert!(
            api.bodies().keys().all(|body| !body.contains("\"seed\"")),
            "a greedy request carries no seed"
        );
        // Every seed's rows rest on those calls, with the metrics they always had.
        assert_eq!(per_seed(&folder), per_seed(&builtin), "{format:?}");
        assert_eq!(common::read_lines(&folder.join("results.jsonl.gz")).len(), 36);
        assert_eq!(common::read_lines(&folder.join("memories.jsonl.gz")).len(), 12);
        let report = read_json(&folder.join("report.json"));
        assert_eq!(report["calls"]["compressor"]["made"], 4);
        assert_eq!(report["calls"]["compressor"]["shared_across_seeds"], 8);
        assert_eq!(report["calls"]["reader"]["shared_across_seeds"], 24);
        let markdown = std::fs::read_to_string(folder.join("report.md")).unwrap();
        assert!(markdown.contains("Seeds shared calls: 56 jobs"), "{markdown}");
        // Another cache, another format: start afresh.
        std::fs::remove_dir_all(scratch.path(".gacc")).unwrap();
    }
}

#[test]
fn sampled_openai_requests_carry_each_seed_and_anthropic_ones_are_each_their_own_call() {
    // The Responses API takes no seed either.
    for format in [Format::OpenAi, Format::Anthropic, Format::OpenAiResponses] {
        let scratch = Scratch::new();
        let api = MockApi::start(format, Behaviour::default());
        let manifest = manifest(&scratch, &api, format, "0.7");
        let folder = run(&scratch, &manifest);
        let counts = api.counts();
        assert_eq!(counts.get(&counts.compressor), 12, "{format:?}");
        assert_eq!(counts.get(&counts.reader), 36, "{format:?}");
        assert_eq!(counts.get(&counts.judge), 36, "{format:?}");
        let bodies = api.bodies();
        match format {
            Format::OpenAi => {
                // Distinct bodies, each with its run's seed.
                assert_eq!(api.repeated(), 0);
                for body in bodies.keys() {
                    let body: Value = serde_json::from_str(body).unwrap();
                    let seed = body["seed"].as_u64().expect("a sampled request sends its seed");
                    assert!([42, 43, 44].contains(&seed), "{body}");
                }
            }
            Format::Anthropic | Format::OpenAiResponses => {
                // No seed on the wire: the same body once per seed, as three independent calls.
                assert!(bodies.keys().all(|b| !b.contains("\"seed\"")));
                assert!(bodies.values().all(|n| *n == 3), "{bodies:?}");
            }
        }
        let report = read_json(&folder.join("report.json"));
        assert!(report["calls"]["reader"].get("shared_across_seeds").is_none());
        // A re-run is answered by the cache: no call twice.
        let before = api.requests();
        run(&scratch, &manifest);
        assert_eq!(api.requests(), before, "{format:?}");
    }
}

#[test]
fn params_seed_fixes_or_drops_the_seed_and_anthropic_refuses_one() {
    let scratch = Scratch::new();
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let sampled = manifest(&scratch, &api, Format::OpenAi, "0.7");
    let text = std::fs::read_to_string(scratch.path(&sampled))
        .unwrap()
        .replace("temperature = 0.7", "temperature = 0.7, seed = 9");
    scratch.write("experiments/fixed.toml", &text);
    run(&scratch, "experiments/fixed.toml");
    // One seed for all: one request per distinct prompt.
    let counts = api.counts();
    assert_eq!(counts.get(&counts.compressor), 4);
    assert_eq!(api.repeated(), 0);
    assert!(api.bodies().keys().all(|b| b.contains("\"seed\":9")));

    let anthropic = MockApi::start(Format::Anthropic, Behaviour::default());
    let manifest = llm_manifest(&anthropic.url, Format::Anthropic, "", "")
        .replace("temperature = 0.0", "temperature = 0.7, seed = true");
    scratch.write("experiments/anthropic.toml", &manifest);
    let output = scratch
        .gacc()
        .args(["validate", "experiments/anthropic.toml"])
        .env("MOCK_API_KEY", KEY)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("compressors.summarise") && stderr.contains("takes no seed"),
        "{stderr}"
    );
    assert_eq!(anthropic.requests(), 0);
}
