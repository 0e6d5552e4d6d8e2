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
