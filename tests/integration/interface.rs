//! What a user sees of gacc's interface stays put under refactoring: `gacc --help`, every
//! subcommand's help, and `gacc plan --json` on every manifest under experiments/ (with an empty
//! cache, and for the fixture with a full and a partly full one), each against a snapshot.
//! A change of the interface is then a deliberate snapshot update, never a side effect.

use crate::common;

/// The subcommands listed under "Commands:" in a help text (without `help`).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

fn help(scratch: &common::Scratch, path: &[String]) -> String {
    let output = scratch
        .gacc()
        .args(path)
        .arg("--help")
        .env("COLUMNS", "100")
        .output()
        .unwrap();
    assert!(output.status.success(), "gacc {path:?} --help failed");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn every_help_text_is_unchanged() {
    let scratch = common::Scratch::empty();
    let mut all = String::new();
    let mut queue = vec![Vec::<String>::new()];
    while let Some(path) = queue.pop() {
        let text = help(&scratch, &path);
        for name in subcommands(&text).into_iter().rev() {
            let mut next = path.clone();
            next.push(name);
            queue.push(next);
        }
        all.push_str(&format!("==== gacc {} --help\n{text}\n", path.join(" ")));
    }
    assert!(all.matches("==== gacc").count() >= 22, "{all}");
    insta::assert_snapshot!(all);
}

fn plan(scratch: &common::Scratch, manifest: &str) -> String {
    let output = scratch
        .gacc()
        .args(["plan", "--json", manifest])
        .output()
        .unwrap();
    assert!(output.status.success(), "gacc plan --json {manifest} failed");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn plan_json_on_every_manifest_is_unchanged() {
    let scratch = common::Scratch::new();
    std::fs::create_dir_all(scratch.path("python")).unwrap();
    let mut manifests: Vec<_> = std::fs::read_dir(scratch.path("experiments"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".toml"))
        .collect();
    manifests.sort();
    assert!(manifests.len() >= 4, "{manifests:?}");
    let mut all = String::new();
    for name in &manifests {
        let manifest = format!("experiments/{name}");
        all.push_str(&format!(
            "==== {manifest}, empty cache\n{}\n",
            plan(&scratch, &manifest)
        ));
    }
    // Part of the fixture cached: a run of the same experiment with one seed of three.
    let fixture = std::fs::read_to_string(scratch.path("experiments/fixture.toml")).unwrap();
    scratch.write(
        "experiments/one-seed.toml",
        &fixture.replace("seeds = [42, 43, 44]", "seeds = [43]"),
    );
    let (status, _, stderr) = scratch.run("experiments/one-seed.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    all.push_str(&format!(
        "==== experiments/fixture.toml, after a run of one of its seeds\n{}\n",
        plan(&scratch, "experiments/fixture.toml")
    ));
    let (status, _, stderr) = scratch.run("experiments/fixture.toml", &[]);
    assert_eq!(status, 0, "{stderr}");
    all.push_str(&format!(
        "==== experiments/fixture.toml, after its run\n{}\n",
        plan(&scratch, "experiments/fixture.toml")
    ));
    insta::assert_snapshot!(all);
}

/// The fixture on model built-ins at the mock, priced and paced, with an audit judge, a reader
/// panel and both anchors: `gacc plan --json`'s bounds of the calls the cache does not answer,
/// with an empty cache, after a run of one of its seeds and after its run.
#[test]
fn plan_json_with_model_builtins_audits_panel_and_anchors_is_unchanged() {
    use common::mock_api::{Behaviour, Format, KEY, MockApi, PRICE, llm_manifest};
    let scratch = common::Scratch::new();
    let api = MockApi::start(Format::OpenAi, Behaviour::default());
    let manifest = llm_manifest(&api.url, Format::OpenAi, &format!("{PRICE}\nrpm = 6000"), "")
        .replace("ratios = [0.15]", "ratios = [0.0, 0.15]")
        + "\n[judges.second]\nbuiltin = \"llm-judge\"\nparams = { model = \"mock\", temperature = 0.0 }\n\
           \n[readers.small]\nbuiltin = \"llm-reader\"\nparams = { model = \"mock\", max_tokens = 64 }\n\
           \n[audit]\njudges = [\"second\"]\nfraction = 0.5\nreaders = [\"small\"]\nreader_fraction = 0.5\n\
           \n[anchors]\nfloor = true\nceiling = true\n";
    scratch.write("experiments/llm.toml", &manifest);
    scratch.write(
        "experiments/llm-one-seed.toml",
        &manifest.replace("seeds = [42, 43, 44]", "seeds = [43]"),
    );
    let env = [("MOCK_API_KEY", KEY)];
    let plan = || scratch.json_with_env(["plan", "--json", "experiments/llm.toml"], &env);
    let shown = |plan: &serde_json::Value| serde_json::to_string_pretty(plan).unwrap();
    // What a run then asks of the mock, and what it reports it paid, are within the bounds.
    let within = |plan: &serde_json::Value, folder: &std::path::Path, requests: u64| {
        let bound = &plan["endpoints"]["mock"];
        assert!(bound["calls"].as_u64().unwrap() >= requests, "{bound} {requests}");
        // run.json's `paid`: per role, what this run's calls cost.
        let paid = common::read_json(&folder.join("run.json"))["paid"].clone();
        let sum = |field: &str| -> f64 {
            let roles = paid.as_object().unwrap().values();
            roles.map(|usage| usage[field].as_f64().unwrap_or(0.0)).sum()
        };
        for field in ["input_tokens", "output_tokens", "cost_usd"] {
            assert!(
                bound[field].as_f64().unwrap() >= sum(field),
                "{field}: {bound} {paid}"
            );
        }
        assert!(sum("cost_usd") > 0.0, "{paid}");
    };
    let before = plan();
    let mut all = format!("==== llm.toml, empty cache\n{}\n", shown(&before));
    let (status, folder, stderr) = scratch.run_with_env("experiments/llm-one-seed.toml", &[], &env);
    assert_eq!(status, 0, "{stderr}");
    within(&before, &folder, api.requests());
    let (made, part) = (api.requests(), plan());
    all.push_str(&format!(
        "==== llm.toml, after a run of one of its seeds\n{}\n",
        shown(&part)
    ));
    let (status, folder, stderr) = scratch.run_with_env("experiments/llm.toml", &[], &env);
    assert_eq!(status, 0, "{stderr}");
    within(&part, &folder, api.requests() - made);
    all.push_str(&format!("==== llm.toml, after its run\n{}\n", shown(&plan())));
    insta::assert_snapshot!(all);
}
