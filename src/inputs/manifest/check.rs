//! Every check of a manifest's values that its types cannot express (SPEC §2), each problem
//! naming the file and key.

use std::path::Path;

use crate::builtin;
use crate::error::Problem;
use crate::inputs::manifest::{CallbackSpec, Loaded, find_program};
use crate::protocol::{Mode, Role};

/// Names a manifest's `name` may take: `[a-z0-9][a-z0-9_-]*`.
fn valid_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'0'..=b'9'))
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
}

/// What a manifest asks that gacc will not do, but that is no error: a persistent callback
/// that wants more calls in flight than `[run] concurrency` lets it have, and a process's
/// settings on a rule built-in, which gacc answers in process.
pub(crate) fn warnings(loaded: &Loaded) -> Vec<String> {
    let file = loaded.path.display();
    let manifest = &loaded.manifest;
    let run = manifest.run.concurrency;
    let specs = manifest
        .compressors
        .iter()
        .map(|(name, spec)| (format!("compressors.{name}"), spec))
        .chain([
            ("reader".to_owned(), &manifest.reader),
            ("judge".to_owned(), &manifest.judge),
        ]);
    let mut warnings = Vec::new();
    for (key, spec) in specs {
        if let Some(name) = spec
            .builtin
            .as_deref()
            .filter(|name| builtin::in_process(name).is_some())
        {
            let settings = [
                ("mode", spec.mode != Mode::Oneshot),
                ("max_inflight", spec.max_inflight.is_some()),
                ("sandbox", spec.sandbox.is_some()),
            ];
            for (field, _) in settings.iter().filter(|(_, set)| *set) {
                warnings.push(format!(
                    "{file}: key `{key}.{field}` has no effect: the rule built-in `{name}` runs inside gacc, not as a process (`command = [\"gacc\", \"callback\", \"{name}\"]` runs it as one)"
                ));
            }
            continue;
        }
        if spec.mode != Mode::Persistent {
            continue;
        }
        for (field, asked) in [
            ("max_inflight", spec.max_inflight),
            ("concurrency", spec.concurrency),
        ] {
            if let Some(asked) = asked.filter(|asked| *asked > run) {
                warnings.push(format!(
                    "{file}: key `{key}.{field}` asks for {asked} calls in flight, but `run.concurrency` is {run}: at most {run} run at once (raise `run.concurrency` to use them)"
                ));
            }
        }
    }
    warnings
}

/// Every problem of a loaded manifest, in the order of its keys.
/// A replay (`replay`: `gacc verify`) runs none of the manifest's programs, which need not be
/// on the reviewer's machine: they are not looked for.
pub(super) fn check(loaded: &Loaded, replay: bool) -> Vec<Problem> {
    let file = loaded.path.display().to_string();
    let mut problems = Vec::new();
    let mut problem = |key: &str, message: String| {
        problems.push(Problem {
            place: format!("{file}: key `{key}`"),
            message,
        })
    };
    check_lists(loaded, &mut problem);
    check_tokenizer_and_dataset(loaded, &mut problem);
    check_callbacks(loaded, replay, &mut problem);
    check_audit(loaded, &mut problem);
    check_anchors(loaded, &mut problem);
    check_panel(loaded, &mut problem);
    check_run(loaded, &mut problem);
    problems
}

type Report<'a> = dyn FnMut(&str, String) + 'a;

fn check_lists(loaded: &Loaded, problem: &mut Report) {
    let manifest = &loaded.manifest;
    if !valid_name(&manifest.name) {
        problem(
            "name",
            format!(
                "`{}` is not a valid name: expected [a-z0-9][a-z0-9_-]*",
                manifest.name
            ),
        );
    }
    for (key, empty, duplicate) in [
        (
            "seeds",
            manifest.seeds.is_empty(),
            has_duplicates(&manifest.seeds),
        ),
        (
            "ratios",
            manifest.ratios.is_empty() && manifest.budgets.is_empty(),
            has_duplicates(&manifest.ratios),
        ),
        ("budgets", false, has_duplicates(&manifest.budgets)),
        (
            "conditions",
            manifest.conditions.is_empty(),
            has_duplicates(&manifest.conditions),
        ),
    ] {
        if empty && key == "ratios" {
            problem(
                key,
                "must list at least one value (or give `budgets` in tokens)".into(),
            );
        } else if empty {
            problem(key, "must list at least one value".into());
        }
        if duplicate {
            problem(key, "lists a value twice".into());
        }
    }
}

fn check_tokenizer_and_dataset(loaded: &Loaded, problem: &mut Report) {
    let manifest = &loaded.manifest;
    match &manifest.tokenizer.command {
        None if manifest.tokenizer.name != "cl100k_base" => problem(
            "tokenizer.name",
            format!(
                "`{}` is not built in: expected `cl100k_base`, or a `command` for an external tokenizer",
                manifest.tokenizer.name
            ),
        ),
        Some(command) => match command.first() {
            None => problem(
                "tokenizer.command",
                "is empty: expected [program, args...]".into(),
            ),
            Some(program) if find_program(program, &loaded.folder).is_none() => problem(
                "tokenizer.command",
                format!("program `{program}` not found (searched the manifest's folder and PATH)"),
            ),
            Some(_) => {}
        },
        None => {}
    }
    match (&manifest.dataset.path, &manifest.dataset.sources) {
        (None, None) => problem("dataset", "expected `path` or `[[dataset.sources]]`".into()),
        (Some(_), Some(_)) => problem(
            "dataset",
            "expected `path` or `[[dataset.sources]]`, not both".into(),
        ),
        _ => {}
    }
}

fn check_callbacks(loaded: &Loaded, replay: bool, problem: &mut Report) {
    let manifest = &loaded.manifest;
    if manifest.compressors.is_empty() {
        problem(
            "compressors",
            "expected at least one compressor, e.g. [compressors.mine]".into(),
        );
    }
    for (key, role, spec) in manifest.callbacks() {
        for message in check_callback(spec, role, &loaded.folder, replay) {
            problem(&key, message);
        }
    }
    for name in manifest.compressors.keys() {
        if !valid_name(name) {
            problem(
                &format!("compressors.{name}"),
                "is not a valid compressor name: expected [a-z0-9][a-z0-9_-]*".into(),
            );
        }
    }
}

/// `[audit]` and `[judges.*]` (SPEC §10): each judge named once, shares in (0, 1], and every
/// `[judges.*]` table audited.
fn check_audit(loaded: &Loaded, problem: &mut Report) {
    let manifest = &loaded.manifest;
    let named: Vec<&String> = manifest.audit.iter().flat_map(|a| &a.judges).collect();
    for name in manifest.judges.keys() {
        if !valid_name(name) {
            problem(
                &format!("judges.{name}"),
                "is not a valid judge name: expected [a-z0-9][a-z0-9_-]*".into(),
            );
        }
        if !named.contains(&name) {
            problem(
                &format!("judges.{name}"),
                format!("is not named by `audit.judges`: add \"{name}\" there to audit with it"),
            );
        }
    }
    let Some(audit) = &manifest.audit else {
        return;
    };
    if has_duplicates(&audit.judges) {
        problem("audit.judges", "lists a judge twice".into());
    }
    let share = |value: f64| value > 0.0 && value <= 1.0;
    if !share(audit.fraction) {
        problem("audit.fraction", "must be more than 0 and at most 1".into());
    }
    for (name, fraction) in &audit.fractions {
        if !audit.judges.contains(name) {
            problem(
                &format!("audit.fractions.{name}"),
                format!("names `{name}`, which `audit.judges` does not list"),
            );
        } else if !share(*fraction) {
            problem(
                &format!("audit.fractions.{name}"),
                "must be more than 0 and at most 1".into(),
            );
        }
    }
    if let Some(labels) = &audit.labels
        && !loaded.folder.join(labels).is_file()
    {
        problem("audit.labels", format!("no file `{}`", labels.display()));
    }
}

/// `[readers.*]` and `[audit] readers` (SPEC §11): each reader named once and every
/// `[readers.*]` table in the panel, the share in (0, 1].
fn check_panel(loaded: &Loaded, problem: &mut Report) {
    let manifest = &loaded.manifest;
    let named: Vec<&String> = manifest.audit.iter().flat_map(|a| &a.readers).collect();
    for name in manifest.readers.keys() {
        if !valid_name(name) {
            problem(
                &format!("readers.{name}"),
                "is not a valid reader name: expected [a-z0-9][a-z0-9_-]*".into(),
            );
        }
        if !named.contains(&name) {
            problem(
                &format!("readers.{name}"),
                format!("is not named by `audit.readers`: add \"{name}\" there to read with it"),
            );
        }
    }
    let Some(audit) = &manifest.audit else {
        return;
    };
    if has_duplicates(&audit.readers) {
        problem("audit.readers", "lists a reader twice".into());
    }
    if !(audit.reader_fraction > 0.0 && audit.reader_fraction <= 1.0) {
        problem(
            "audit.reader_fraction",
            "must be more than 0 and at most 1".into(),
        );
    }
}

/// `[anchors] targets`: shares above 0, finite, each once.
fn check_anchors(loaded: &Loaded, problem: &mut Report) {
    let Some(anchors) = &loaded.manifest.anchors else {
        return;
    };
    if anchors.targets.iter().any(|t| !t.is_finite() || *t <= 0.0) {
        problem(
            "anchors.targets",
            "each target is a share above 0, e.g. [0.9]".into(),
        );
    }
    let mut sorted = anchors.targets.clone();
    sorted.sort_by(f64::total_cmp);
    if sorted.windows(2).any(|w| w[0] == w[1]) {
        problem("anchors.targets", "lists a target twice".into());
    }
}

fn check_run(loaded: &Loaded, problem: &mut Report) {
    let run = &loaded.manifest.run;
    if run.concurrency == 0 {
        problem("run.concurrency", "must be at least 1".into());
    }
}

/// Whether a value stands twice, in O(n log n): a manifest may list a million seeds.
fn has_duplicates<T: PartialOrd>(values: &[T]) -> bool {
    // Values unequal to themselves (a NaN ratio, refused elsewhere) are no one's duplicate;
    // without them the order is total.
    #[allow(clippy::eq_op)]
    let mut sorted: Vec<&T> = values.iter().filter(|v| v == v).collect();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    sorted.windows(2).any(|pair| pair[0] == pair[1])
}

pub(super) fn check_callback(spec: &CallbackSpec, role: Role, folder: &Path, replay: bool) -> Vec<String> {
    let mut problems = Vec::new();
    match (&spec.command, &spec.builtin) {
        (None, None) => problems.push("expected `command = [...]` or `builtin = \"NAME\"`".into()),
        (Some(_), Some(_)) => problems.push("expected `command` or `builtin`, not both".into()),
        (Some(command), None) if !replay => match command.first() {
            None => problems.push("`command` is empty: expected [program, args...]".into()),
            Some(program) => {
                if find_program(program, folder).is_none() {
                    problems.push(format!(
                        "program `{program}` not found (searched the manifest's folder and PATH)"
                    ));
                }
                problems.extend(missing_scripts(command, folder).into_iter().map(|script| {
                    format!(
                        "script `{script}` not found at {} (paths are relative to the manifest's folder)",
                        folder.join(script).display()
                    )
                }));
            }
        },
        (Some(_), None) => {}
        (None, Some(name)) => {
            let model = crate::inputs::models::model_builtin(name);
            if let Some(model_role) = model.filter(|r| *r != role) {
                problems.push(format!("`{name}` is a {model_role}, not a {role}"));
            } else if model.is_none() && !builtin::names(role).contains(&name.as_str()) {
                let mut names = builtin::names(role);
                names.extend(
                    crate::inputs::models::MODEL_BUILTINS
                        .iter()
                        .filter(|m| m.1 == role)
                        .map(|m| m.0),
                );
                problems.push(format!(
                    "`{name}` is not a built-in {role}: expected one of {}",
                    names.join(", ")
                ));
            } else if model.is_none() {
                problems.extend(builtin::param_problems(name, &spec.params));
            }
        }
    }
    for name in spec.secrets.iter().filter(|name| !spec.env.contains(name)) {
        problems.push(format!(
            "`secrets` names `{name}`, which `env` does not pass through: list it in `env` too"
        ));
    }
    if spec.concurrency == Some(0) {
        problems.push("`concurrency` must be at least 1".into());
    }
    match spec.max_inflight {
        Some(0) => problems.push("`max_inflight` must be at least 1".into()),
        Some(n) if n > 1 && spec.mode != Mode::Persistent => problems.push(format!(
            "`max_inflight = {n}` pipelines a persistent worker's requests: it needs `mode = \"persistent\"`"
        )),
        _ => {}
    }
    if !spec.params.is_object() {
        problems.push("`params` must be a table".into());
    }
    if let Some(sandbox) = &spec.sandbox {
        for (key, paths) in [("read", &sandbox.read), ("write", &sandbox.write)] {
            for path in paths.iter().filter(|p| !folder.join(p).exists()) {
                problems.push(format!(
                    "`sandbox.{key}` path `{}` does not exist (paths are relative to the manifest's folder; create it first)",
                    path.display()
                ));
            }
        }
    }
    problems
}

/// File endings of the scripts an interpreter runs: an argument ending so names a file.
const SCRIPT_ENDINGS: &[&str] = &[
    ".py", ".sh", ".bash", ".js", ".mjs", ".ts", ".rb", ".pl", ".r", ".jl", ".lua", ".php",
];

/// The arguments of `command` (after the program) that name a script file that is not there:
/// `["python3", "callbacks/overlapp.py"]` would fail every call. An argument after `-c`, `-e`
/// or `-m` is code or a module, not a file.
fn missing_scripts<'c>(command: &'c [String], folder: &Path) -> Vec<&'c str> {
    let mut missing = Vec::new();
    let mut code_next = false;
    for argument in command.iter().skip(1) {
        if std::mem::take(&mut code_next) {
            continue;
        }
        if matches!(argument.as_str(), "-c" | "-e" | "-m") {
            code_next = true;
            continue;
        }
        let lower = argument.to_ascii_lowercase();
        let script = !argument.starts_with('-')
            && !argument.contains(char::is_whitespace)
            && SCRIPT_ENDINGS.iter().any(|ending| lower.ends_with(ending));
        if script && !folder.join(argument).exists() {
            missing.push(argument.as_str());
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_script_is_found_and_code_or_modules_are_not_taken_for_files() {
        let folder = tempfile::tempdir().unwrap();
        std::fs::write(folder.path().join("there.py"), "").unwrap();
        let command = |words: &[&str]| words.iter().map(|w| (*w).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            missing_scripts(
                &command(&["python3", "overlapp.py", "there.py", "--out", "x.sh"]),
                folder.path()
            ),
            ["overlapp.py", "x.sh"]
        );
        assert!(
            missing_scripts(
                &command(&["python3", "-c", "import a.py", "-m", "pkg.py", "--log=a.py"]),
                folder.path()
            )
            .is_empty()
        );
    }

    #[test]
    fn names() {
        assert!(valid_name("fixture"));
        assert!(valid_name("0a_b-c"));
        for bad in ["", "Fixture", "-a", "_a", "a b", "a.b"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
