//! The dependency rule of `src/lib.rs` ("Floors"), held: every module imports only from its own
//! floor or a lower one (on one floor, only the units listed before it), no `never` line is
//! broken, and no imports form a circle. A module may always use its ancestors' items (the
//! folder it lives in); every other import counts. Test modules (`#[cfg(test)] mod tests`,
//! last in their file by convention) are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module path inside the crate: `exec::slurm::task`.
type Module = String;

/// The rule as `src/lib.rs` writes it.
#[derive(Debug, Default)]
struct Floors {
    /// Each top-level unit's (floor, position on its floor).
    place: BTreeMap<String, (usize, usize)>,
    /// `never a -> b`: no module at or under `a` may import one at or under `b`.
    never: Vec<(String, String)>,
}

fn floors(lib: &str) -> Floors {
    let mut floors = Floors::default();
    for line in lib.lines() {
        let words: Vec<&str> = line.trim_start_matches("//!").split_whitespace().collect();
        match words.as_slice() {
            ["floor", number, units @ ..] => {
                let number: usize = number.parse().expect("a floor's number");
                for (position, unit) in units.iter().enumerate() {
                    floors.place.insert((*unit).to_owned(), (number, position));
                }
            }
            ["never", from, "->", to] => floors.never.push(((*from).to_owned(), (*to).to_owned())),
            _ => {}
        }
    }
    floors
}

/// Every `.rs` file under `src`.
fn rust_files(src: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// Every module of the tree under `src`, with the text of its non-test code.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut out = BTreeMap::new();
    for path in rust_files(src) {
        let relative = path.strip_prefix(src).unwrap().with_extension("");
        let mut parts: Vec<String> = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if parts.last().is_some_and(|p| p == "mod") {
            parts.pop();
        }
        if parts == ["lib"] || parts == ["main"] {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let tests = ["#[cfg(test)]\nmod tests", "#[cfg(test)]\npub(crate) mod tests"];
        let code = match tests.iter().find_map(|start| text.find(start)) {
            Some(end) => text[..end].to_owned(),
            None => text,
        };
        out.insert(parts.join("::"), code);
    }
    out
}

fn is_name(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a module's code names: `crate::a::b…` (and each branch of `crate::{…}`),
/// `super::…`, and `child::…` for a child module declared in it; each as absolute segments.
fn paths(module: &str, code: &str, known: &BTreeSet<Module>) -> Vec<Vec<String>> {
    let code: String = code
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let here: Vec<String> = module.split("::").map(str::to_owned).collect();
    let mut out = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let preceded = i > 0 && (is_name(bytes[i - 1]) || bytes[i - 1] == ':');
        if preceded || !is_name(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_name(bytes[i]) {
            i += 1;
        }
        let word: String = bytes[start..i].iter().collect();
        if bytes.get(i) != Some(&':') || bytes.get(i + 1) != Some(&':') {
            continue;
        }
        let base: Vec<String> = match word.as_str() {
            "crate" => Vec::new(),
            "super" => here[..here.len().saturating_sub(1)].to_vec(),
            "self" => here.clone(),
            child if known.contains(&format!("{module}::{child}")) => {
                let mut base = here.clone();
                base.push(child.to_owned());
                base
            }
            _ => continue,
        };
        for tail in tails(&bytes, i + 2) {
            let mut path = base.clone();
            path.extend(tail);
            out.push(path);
        }
    }
    out
}

/// The segments after `…::` at `at`: one path, or one per branch of a `{…}` group.
fn tails(bytes: &[char], mut at: usize) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    loop {
        if bytes.get(at) == Some(&'{') {
            let mut depth = 0;
            let mut branch_start = at + 1;
            let mut out = Vec::new();
            let mut k = at;
            while k < bytes.len() {
                match bytes[k] {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        for tail in tails(bytes, skip_space(bytes, branch_start)) {
                            let mut path = segments.clone();
                            path.extend(tail);
                            out.push(path);
                        }
                        branch_start = k + 1;
                        if bytes[k] == '}' {
                            break;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
                k += 1;
            }
            return out;
        }
        let start = at;
        while at < bytes.len() && is_name(bytes[at]) {
            at += 1;
        }
        if start == at {
            break;
        }
        segments.push(bytes[start..at].iter().collect());
        if bytes.get(at) == Some(&':') && bytes.get(at + 1) == Some(&':') {
            at += 2;
        } else {
            break;
        }
    }
    vec![segments]
}

fn skip_space(bytes: &[char], mut at: usize) -> usize {
    while at < bytes.len() && bytes[at].is_whitespace() {
        at += 1;
    }
    at
}

/// The longest known module a path starts with.
fn module_of(path: &[String], known: &BTreeSet<Module>) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].join("::"))
        .find(|candidate| known.contains(candidate))
}

fn under(module: &str, prefix: &str) -> bool {
    module == prefix || module.starts_with(&format!("{prefix}::"))
}

/// Every import between modules that counts: (from, to), ancestors excluded.
fn imports(src: &Path) -> BTreeSet<(Module, Module)> {
    let modules = modules(src);
    let known: BTreeSet<Module> = modules.keys().cloned().collect();
    let mut edges = BTreeSet::new();
    for (module, code) in &modules {
        for path in paths(module, code, &known) {
            if let Some(target) = module_of(&path, &known)
                && target != *module
                && !under(module, &target)
            {
                edges.insert((module.clone(), target));
            }
        }
    }
    edges
}

/// What breaks the rule in the tree under `src`, one line each.
fn violations(src: &Path) -> Vec<String> {
    let rule = floors(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    let edges = imports(src);
    let mut found = Vec::new();
    let unit = |m: &str| m.split("::").next().unwrap_or_default().to_owned();
    for (from, to) in &edges {
        let (a, b) = (unit(from), unit(to));
        if a == b {
            continue;
        }
        match (rule.place.get(&a), rule.place.get(&b)) {
            (Some(&(fa, pa)), Some(&(fb, pb))) => {
                if fb > fa || (fb == fa && pb >= pa) {
                    found.push(format!("{from} imports {to}: floor {fb} is not below floor {fa}"));
                }
            }
            _ => found.push(format!("{from} imports {to}: a unit missing from the floors")),
        }
    }
    for (from, to) in &edges {
        for (a, b) in &rule.never {
            if under(from, a) && under(to, b) {
                found.push(format!("{from} imports {to}: never {a} -> {b}"));
            }
        }
    }
    found.extend(
        circles(&edges)
            .into_iter()
            .map(|c| format!("import circle: {}", c.join(" -> "))),
    );
    found
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(edges: &BTreeSet<(Module, Module)>) -> Vec<Vec<Module>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
        next.entry(b).or_default();
    }
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<Module>>,
    }
    fn visit<'a>(v: &'a str, next: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in &next[v] {
            if !s.index.contains_key(w) {
                visit(w, next, s);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for &v in next.keys() {
        if !state.index.contains_key(v) {
            visit(v, &next, &mut state);
        }
    }
    state.found
}

#[test]
fn src_keeps_to_its_floors_and_has_no_import_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let rule = floors(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    assert!(rule.place.len() >= 10, "the floors of src/lib.rs: {rule:?}");
    let edges = imports(&src);
    // The checker sees the imports there are (a sample of them).
    for (from, to) in [
        ("runner", "exec::callback"),
        ("exec::slurm", "exec::callback"),
        ("app::run", "runner"),
    ] {
        assert!(
            edges.contains(&(from.to_owned(), to.to_owned())),
            "{from} -> {to} not seen"
        );
    }
    let found = violations(&src);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_checker_finds_an_upward_import_a_never_and_a_circle() {
    let root = std::env::temp_dir().join(format!("gacc-layers-{}", std::process::id()));
    let src = root.join("src");
    let write = |path: &str, text: &str| {
        let path = src.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write(
        "lib.rs",
        "//! ```text\n//! floor 2  app\n//! floor 1  exec\n//! floor 0  leaf\n//! never    exec::a -> exec::b\n//! ```\nmod app;\nmod exec;\nmod leaf;\n",
    );
    write(
        "app.rs",
        "use crate::exec::a::Thing;\nuse crate::{leaf, exec::b};\n",
    );
    write("leaf.rs", "pub fn f() {}\n");
    write("exec/mod.rs", "pub mod a;\npub mod b;\nuse a::Thing;\n");
    write("exec/a.rs", "use super::b::Other;\npub struct Thing;\n");
    write("exec/b.rs", "pub struct Other;\nfn g() { super::a::Thing; }\n");
    let clean = violations(&src);
    assert_eq!(clean.len(), 2, "{clean:?}");
    assert!(
        clean.iter().any(|v| v.contains("never exec::a -> exec::b")),
        "{clean:?}"
    );
    assert!(
        clean.iter().any(|v| v == "import circle: exec::a -> exec::b"),
        "{clean:?}"
    );

    // A leaf that reaches up, hidden in a group and a test module that must not count.
    write(
        "leaf.rs",
        "use crate::{app::Run as _};\npub fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::exec::a;\n}\n",
    );
    write("exec/b.rs", "pub struct Other;\n");
    let found = violations(&src);
    assert!(
        found
            .iter()
            .any(|v| v == "leaf imports app: floor 2 is not below floor 0"),
        "{found:?}"
    );
    assert!(
        !found.iter().any(|v| v.starts_with("leaf imports exec")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|v| v.starts_with("import circle: app -> leaf")),
        "{found:?}"
    );
    std::fs::remove_dir_all(&root).unwrap();
}

/// What only a provider's own file (`src/providers/NAME.rs`) may say: the names and the wire
/// details of a model API. Anywhere else, a new provider would need an edit.
const WIRE_WORDS: &[&str] = &[
    "openai-chat",
    "anthropic-messages",
    "OpenaiChat",
    "AnthropicMessages",
    "OPENAI_CHAT",
    "ANTHROPIC_MESSAGES",
    "/chat/completions",
    "/v1/messages",
    "/batches",
    "x-ratelimit-",
    "anthropic-ratelimit",
    "anthropic-version",
    "x-api-key",
    "bearer",
    "\"choices\"",
    "\"stop_reason\"",
    "\"tool_use\"",
    "\"prompt_tokens\"",
    "\"input_file_id\"",
    "\"processing_status\"",
    "insufficient_quota",
];

/// The wire words in code, comments left out.
fn wire_words(code: &str) -> Vec<&'static str> {
    let code: String = code
        .lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase();
    WIRE_WORDS
        .iter()
        .filter(|word| code.contains(&word.to_lowercase()))
        .copied()
        .collect()
}

#[test]
fn only_a_providers_file_speaks_its_wire_format() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (module, code) in modules(&src) {
        // The test kit feeds providers' readers hostile wire bytes: test code, as `mod tests` is.
        if module == "providers" || module.starts_with("providers::") || module.starts_with("testkit") {
            continue;
        }
        for word in wire_words(&code) {
            found.push(format!("{module}: {word}"));
        }
    }
    assert!(found.is_empty(), "outside src/providers/: {found:#?}");
    // Each provider's file is a module of the registry, and the registry lists it.
    let registry = std::fs::read_to_string(src.join("providers/mod.rs")).unwrap();
    let mut files = 0;
    for entry in std::fs::read_dir(src.join("providers")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "mod" || name == "hostile" {
            continue;
        }
        assert!(registry.contains(&format!("mod {name};")), "{name}");
        let code = std::fs::read_to_string(&path).unwrap();
        let provider = code
            .split("impl Provider for ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next());
        if let Some(provider) = provider {
            assert!(
                registry.contains(&format!("&{name}::{provider}")),
                "{name}::{provider} is not in PROVIDERS"
            );
        }
        files += 1;
    }
    assert!(files >= 2, "{files} provider files");
    // The check sees a provider's detail where it does not belong, and passes over comments.
    assert_eq!(
        wire_words("let url = format!(\"{base}/chat/completions\");"),
        ["/chat/completions"]
    );
    assert!(wire_words("// OpenAI's x-ratelimit-* headers").is_empty());
}

/// Where code indexes a request or a response (a binding so named) by one of SPEC §3's field
/// names: `request["memory"]`, `response.get("answer")`, `request.pointer("/goal")`.
fn message_indexing(code: &str) -> Vec<String> {
    const FIELDS: &[&str] = &[
        "context",
        "goal",
        "token_budget",
        "seed",
        "params",
        "memory",
        "question",
        "answer",
        "reference",
        "source",
        "correct",
        "score",
        "rationale",
    ];
    let mut found = Vec::new();
    for line in code.lines() {
        if line.trim_start().starts_with("//") {
            continue;
        }
        for binding in ["request", "response", "reply"] {
            for field in FIELDS {
                for form in [
                    format!("{binding}[\"{field}\"]"),
                    format!("{binding}.get(\"{field}\")"),
                    format!("{binding}.pointer(\"/{field}"),
                ] {
                    if line.contains(&form) {
                        found.push(form);
                    }
                }
            }
        }
    }
    found
}

#[test]
fn only_the_protocol_reads_a_message_by_its_field_names() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for (module, code) in modules(&src) {
        if module == "protocol" || module.starts_with("protocol::") {
            continue;
        }
        for form in message_indexing(&code) {
            found.push(format!("{module}: {form}"));
        }
    }
    assert!(found.is_empty(), "outside src/protocol/: {found:#?}");
    // The check sees an indexed message, and passes over comments.
    assert_eq!(
        message_indexing("let m = response[\"memory\"].as_str();"),
        ["response[\"memory\"]"]
    );
    assert!(message_indexing("// request.get(\"question\")").is_empty());
}

/// The lines of code (comments left out) that name Slurm, in any case.
fn naming_slurm(code: &str) -> Vec<String> {
    code.lines()
        .map(str::trim)
        .filter(|line| !line.starts_with("//"))
        .filter(|line| line.to_lowercase().contains("slurm"))
        .map(str::to_owned)
        .collect()
}

/// Slurm is one engine (`src/exec/slurm/`), registered in `src/exec/mod.rs` by its `mod` line and
/// its entry in the registry, and named nowhere else: the manifest keeps `[run.slurm]` as
/// written and the registry hands it to the engine, which reads and checks it.
#[test]
fn only_the_slurm_folder_and_its_registration_name_slurm() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    // Whole files, their tests included.
    for path in rust_files(&src) {
        let relative = path.strip_prefix(&src).unwrap();
        if relative.starts_with("exec/slurm") || relative == Path::new("exec/mod.rs") {
            continue;
        }
        for line in naming_slurm(&std::fs::read_to_string(&path).unwrap()) {
            found.push(format!("src/{}: {line}", relative.display()));
        }
    }
    assert!(found.is_empty(), "outside src/exec/slurm/: {found:#?}");
    // The registry names it only in its module line and its entry.
    let registry = std::fs::read_to_string(src.join("exec/mod.rs")).unwrap();
    let lines = naming_slurm(&registry);
    assert_eq!(
        lines,
        [
            "mod slurm;",
            "const ENGINES: &[&dyn EngineKind] = &[&slurm::Kind];"
        ],
        "src/exec/mod.rs"
    );
    // The check sees a name in code, whatever its case, and passes over comments.
    assert_eq!(
        naming_slurm("let x = Slurm::new();\n// on Slurm\n/// SLURM_ARRAY_TASK_ID\n"),
        ["let x = Slurm::new();"]
    );
}

/// The lines of a file before its test module.
fn before_tests(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i] == "#[cfg(test)]"
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.starts_with("mod tests") || l.starts_with("pub(crate) mod tests"))
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// Each function longer than `most` lines: (name, lines).
fn long_functions(lines: &[&str], most: usize) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start();
        let signature = ["fn ", "pub fn ", "async fn ", "pub(crate) fn ", "pub(super) fn "]
            .iter()
            .chain(&["pub(crate) async fn ", "pub(super) async fn ", "pub async fn "])
            .find_map(|start| trimmed.strip_prefix(start));
        let Some(rest) = signature else {
            i += 1;
            continue;
        };
        let indent = &line[..line.len() - trimmed.len()];
        let close = format!("{indent}}}");
        let Some(end) = (i..lines.len()).find(|&j| lines[j] == close) else {
            break;
        };
        let length = end - i + 1;
        if length > most {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            found.push((name, length));
        }
        i = end + 1;
    }
    found
}

/// The functions allowed over 80 lines, each with the reason its length is the clearest
/// shape: (file under src/, function, reason). An entry that no longer applies fails too.
#[rustfmt::skip]
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[
    ("app/run/mod.rs", "run", "a run's steps in order, each a named call; the locals pass from one to the next"),
    ("exec/model/endpoint/mod.rs", "send", "the retry loop: each outcome's arm says how long this call waits, the budget is checked once below"),
    ("report/mod.rs", "build", "report.json's sections in the order they are written"),
    ("inputs/models/mod.rs", "resolve", "one endpoint's settings resolved key by key, each error naming its key"),
    ("runner/question.rs", "run_question", "read then judge one question, each step's cache, sharing and failure in order"),
    ("app/terminal/mod.rs", "print_progress", "the progress line's parts in the order they are shown"),
    ("exec/process/mod.rs", "oneshot", "one process from spawn to reaped: input, output, stderr, timeout and kill in one place"),
    ("inputs/parquet.rs", "read_rows", "the Parquet record reader's column types, one arm each"),
    ("exec/model/endpoint/exchange.rs", "exchange", "one HTTP exchange classified: every status and failure to one outcome"),
    ("review/trace/render.rs", "render", "the trace review's sections in the order they are printed"),
    ("review/diff/render.rs", "render", "the diff's sections in the order they are printed"),
    ("review/trace/mod.rs", "review", "one pass over the trace's events, one arm per kind"),
    ("exec/model/pacer/learn.rs", "measure", "one measurement of the pace, each case of a reply in order"),
    ("exec/model/batch/mod.rs", "follow", "one provider batch from submitted to collected, each state an arm"),
    ("report/charts.rs", "metric_chart", "one chart's parts drawn in order"),
    ("runner/mod.rs", "execute", "the three stages' streams joined in one place"),
];

/// No file's code (its tests aside) passes 500 lines; no function passes 80 unless listed in
/// `LONG_FUNCTIONS` with its reason, and at most two pass 100. Test-only modules (`mod tests`,
/// and files declared under `#[cfg(test)]`) are not counted.
#[test]
fn files_and_functions_stay_short_or_are_listed_with_a_reason() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let test_only = test_only_files(&src);
    let (mut long_files, mut unlisted, mut found, mut over_100) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for path in rust_files(&src) {
        let shown = path.strip_prefix(&src).unwrap().display().to_string();
        if test_only.iter().any(|folder| path.starts_with(folder)) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines = before_tests(&text);
        if lines.len() > 500 {
            long_files.push(format!("{shown}: {} lines", lines.len()));
        }
        for (name, length) in long_functions(&lines, 80) {
            if length > 100 {
                over_100.push(format!("{shown}: fn {name}, {length} lines"));
            }
            match LONG_FUNCTIONS
                .iter()
                .any(|(file, function, _)| *file == shown && *function == name)
            {
                true => found.push((shown.clone(), name)),
                false => unlisted.push(format!("{shown}: fn {name}, {length} lines")),
            }
        }
    }
    assert!(long_files.is_empty(), "{long_files:#?}");
    assert!(
        unlisted.is_empty(),
        "long functions not in LONG_FUNCTIONS: {unlisted:#?}"
    );
    let stale: Vec<_> = LONG_FUNCTIONS
        .iter()
        .filter(|(file, function, _)| !found.iter().any(|(f, n)| f == file && n == function))
        .collect();
    assert!(
        stale.is_empty(),
        "no longer over 80 lines, take them off: {stale:#?}"
    );
    assert!(over_100.len() <= 2, "over 100 lines: {over_100:#?}");
    // The check sees a long function, whatever its doc says.
    let mut long = String::from("/// Does things. (One function: the steps in order.)\nfn long() {\n");
    long.push_str(&"    x();\n".repeat(90));
    long.push_str("}\n");
    assert_eq!(
        long_functions(&long.lines().collect::<Vec<_>>(), 80),
        [("long".to_owned(), 92)]
    );
}

/// The files and folders of modules declared under `#[cfg(test)]` (other than `mod tests`).
fn test_only_files(src: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for path in rust_files(src) {
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let folder = match path
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs")
        {
            true => path.parent().unwrap().to_path_buf(),
            false => path.with_extension(""),
        };
        for pair in lines.windows(2) {
            let declared = pair[1]
                .trim_start()
                .strip_prefix("mod ")
                .and_then(|m| m.strip_suffix(';'));
            if pair[0].trim() == "#[cfg(test)]"
                && let Some(name) = declared
            {
                found.push(folder.join(format!("{name}.rs")));
                found.push(folder.join(name));
            }
        }
    }
    found
}

/// Test-only code is marked once, on its module (`mod tests`, or the crate's `testkit`);
/// HTML is escaped by one function (report/html's `escape_html`, which `gacc view` uses too);
/// and no formats of an earlier gacc are read behind the user's back.
#[test]
fn test_code_html_escaping_and_formats_each_have_one_place() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (mut marked, mut escapes, mut earlier) = (Vec::new(), Vec::new(), Vec::new());
    for path in rust_files(&src) {
        let shown = path.strip_prefix(&src).unwrap().display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let next = lines.get(i + 1).map_or("", |l| l.trim_start());
            let module = ["mod tests", "pub(crate) mod tests", "mod testkit"];
            if line.trim() == "#[cfg(test)]" && !module.iter().any(|m| next.starts_with(m)) {
                marked.push(format!("{shown}:{}: {next}", i + 2));
            }
            if line.contains("\"&quot;\"") {
                escapes.push(shown.clone());
            }
            let lower = line.to_lowercase();
            if ["legacy", "earlier gacc", "older gacc"]
                .iter()
                .any(|w| lower.contains(w))
            {
                earlier.push(format!("{shown}:{}", i + 1));
            }
        }
    }
    assert!(
        marked.is_empty(),
        "#[cfg(test)] on other than a test module: {marked:#?}"
    );
    assert_eq!(
        escapes,
        ["report/html/mod.rs"],
        "HTML escaped in more than one place"
    );
    assert!(earlier.is_empty(), "an earlier gacc's formats read: {earlier:#?}");
}
