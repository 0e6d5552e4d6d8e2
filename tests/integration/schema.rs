//! `gacc schema`: the JSON Schemas of a manifest and of report.json, checked with a JSON
//! Schema validator (not by string matching) against every shipped manifest, manifests that
//! use every key, manifests with mistakes, and a real report.json.

use crate::common;

use common::Scratch;
use serde_json::Value;

fn schema(which: &str) -> jsonschema::Validator {
    let scratch = Scratch::empty();
    let schema = scratch.json(["schema", which]);
    assert_eq!(schema["$schema"], "https://json-schema.org/draft/2020-12/schema");
    jsonschema::validator_for(&schema).unwrap()
}

fn as_json(toml_text: &str) -> Value {
    let value: toml::Value = toml::from_str(toml_text).unwrap();
    serde_json::to_value(value).unwrap()
}

fn errors(validator: &jsonschema::Validator, manifest: &str) -> Vec<String> {
    validator
        .iter_errors(&as_json(manifest))
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// A manifest that sets every key a manifest may have.
const EVERY_KEY: &str = r#"
name = "every-key"
description = "sets every key"
seeds = [1, 2]
ratios = [0.1, "0.25", 1]
conditions = ["own-goal", "no-goal", "cross-goal"]
truncation = "utf8-safe"

[tokenizer]
name = "tiktoken-cl100k"
command = ["python3", "tok.py"]
revision = "tiktoken 0.14.0"
mode = "persistent"
timeout = 30
allow_unverified = true
env = ["TIKTOKEN_CACHE_DIR"]

[[dataset.sources]]
id = "s1"
text = "the sky is blue"
goals = [{ id = "g1", text = "colours", questions = [{ id = "q1", question = "What colour is the sky?", reference = "blue" }] }]

[[dataset.sources]]
id = "s2"
path = "sources/s2.txt"

[compressors.mine]
command = ["python3", "compress.py"]
revision = 3
mode = "persistent"
timeout = "2m"
retries = 5
concurrency = 4
env = ["OPENAI_API_KEY"]
params = { temperature = 0.0, nested = { list = [1, 2] } }
sandbox = { read = ["models/"], write = ["out/"], network = true }

[compressors.open]
builtin = "identity"
sandbox = false

[compressors.summarise]
builtin = "llm-compressor"
params = { model = "deepseek", temperature = 0.0 }
template = "prompts/summarise.j2"
system_template = "prompts/system.j2"

[models.deepseek]
api = "openai-chat"
base_url = "https://api.deepseek.com/v1"
model = "deepseek-chat"
api_key_env = "DEEPSEEK_API_KEY"
headers = { "X-Team" = "gacc" }
max_concurrency = 32
rpm = 600
tpm = 1000000
timeout = "120s"
retries = 6
adaptive = true
price = { input = 0.27, cached_input = 0.07, cache_write = 0.3, output = 1.10 }
batch = false

[reader]
builtin = "field-lookup"
sandbox = true

[judge]
builtin = "exact"

[run]
concurrency = 16
max_cost_usd = 25.0
executor = "slurm"
cache = ".gacc/cache"

[run.slurm]
work_dir = "/shared/gacc"
partition = "gpu"
account = "lab"
time = "1h"
array_limit = 500
calls_per_task = 8
gather = "2s"
poll = "5s"
sbatch_args = ["--qos=normal"]
gacc = "/opt/gacc/bin/gacc"

[run.slurm.compressor]
cpus = 4
memory = "16G"
gres = "gpu:1"
partition = "gpu"
time = "30m"
parallel = 2
"#;

#[test]
fn every_shipped_manifest_and_one_with_every_key_validate() {
    let validator = schema("manifest");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for folder in ["experiments", "templates/init"] {
        for entry in std::fs::read_dir(root.join(folder)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap().replace("{{name}}", "x");
                assert_eq!(
                    errors(&validator, &text),
                    Vec::<String>::new(),
                    "{}",
                    path.display()
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 4, "{checked} manifests");
    assert_eq!(errors(&validator, EVERY_KEY), Vec::<String>::new());
    // The loader reads every one of those keys too (what it refuses is the missing files and
    // programs, not the manifest's shape).
    let scratch = Scratch::new();
    scratch.write("experiments/every.toml", EVERY_KEY);
    let output = scratch
        .gacc()
        .args(["validate", "experiments/every.toml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("problem"), "{stderr}");
    for shape in ["unknown field", "invalid type", "line "] {
        assert!(!stderr.contains(shape), "{stderr}");
    }
}

#[test]
fn mistakes_fail_the_schema_as_they_fail_the_loader() {
    let validator = schema("manifest");
    let fixture =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/fixture.toml")).unwrap();
    let mistakes = [
        ("a typo'd top-level key", fixture.replace("ratios =", "ratioz =")),
        (
            "a typo'd callback key",
            fixture.replace("[reader]\nbuiltin", "[reader]\nbuiltn"),
        ),
        (
            "a typo'd run key",
            fixture.replace("concurrency = 4", "concurency = 4"),
        ),
        (
            "a ratio that is text",
            fixture.replace("ratios = [0.15]", "ratios = [\"a lot\"]"),
        ),
        (
            "a ratio above 1",
            fixture.replace("ratios = [0.15]", "ratios = [1.5]"),
        ),
        ("an unknown condition", fixture.replace("own-goal", "some-goal")),
        (
            "a timeout with no unit it knows",
            fixture.replace("[reader]\n", "[reader]\ntimeout = \"soon\"\n"),
        ),
        (
            "a sandbox given as text",
            fixture.replace("[reader]\n", "[reader]\nsandbox = \"yes\"\n"),
        ),
        (
            "no judge",
            fixture.replace("[judge]\nbuiltin = \"exact\"\nrevision = \"1\"\n", ""),
        ),
    ];
    let scratch = Scratch::new();
    for (what, manifest) in mistakes {
        assert_ne!(manifest, fixture, "{what}: the fixture changed");
        assert!(
            !errors(&validator, &manifest).is_empty(),
            "{what} passed the schema"
        );
        // The loader refuses it too.
        scratch.write("experiments/mistake.toml", &manifest);
        let output = scratch
            .gacc()
            .args(["validate", "experiments/mistake.toml"])
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{what}: gacc validate accepted it");
    }
}

#[test]
fn a_report_json_validates_against_the_report_schema() {
    let validator = schema("report");
    let scratch = Scratch::new();
    let (status, folder, stderr) = scratch.run("experiments/baselines.toml", &["-q"]);
    assert_eq!(status, 0, "{stderr}");
    let report = common::read_json(&folder.join("report.json"));
    let found: Vec<String> = validator.iter_errors(&report).map(|e| e.to_string()).collect();
    assert_eq!(found, Vec::<String>::new());
    // And one with token budgets beside its ratio.
    let (status, folder, stderr) = scratch.run("experiments/fixture.toml", &["-q", "--set", "budgets=[64]"]);
    assert_eq!(status, 0, "{stderr}");
    let budgets = common::read_json(&folder.join("report.json"));
    assert_eq!(budgets["cells"][1]["budget_tokens"], 64);
    let found: Vec<String> = validator.iter_errors(&budgets).map(|e| e.to_string()).collect();
    assert_eq!(found, Vec::<String>::new());
    let mut broken = report.clone();
    broken["cells"][0]["micro"] = Value::from("high");
    assert!(!validator.is_valid(&broken));
}
