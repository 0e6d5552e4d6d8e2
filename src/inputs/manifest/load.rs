//! Loading a manifest (SPEC §2): the file, then `GACC_` variables, then `--set` overrides,
//! and each model built-in given its endpoint and template texts (SPEC §8).

use std::collections::BTreeMap;
use std::path::Path;

use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};

use super::{CallbackSpec, ENV_PREFIX, Loaded, Manifest, Recorded, check};
use crate::error::{Invalid, Problem};
use crate::inputs::models::ModelSpec;

/// The top-level keys a `GACC_` variable may override; other `GACC_` variables are not ours.
const TOP_LEVEL_KEYS: &[&str] = &[
    "name",
    "description",
    "seeds",
    "ratios",
    "budgets",
    "conditions",
    "truncation",
    "tokenizer",
    "dataset",
    "compressors",
    "reader",
    "judge",
    "judges",
    "readers",
    "audit",
    "anchors",
    "models",
    "run",
];

/// Loads a manifest: file, then `GACC_` variables, then `--set key.path=value` (SPEC §2).
/// An unreadable or mistyped manifest is an error; problems with its values come back
/// beside it, so that the dataset can be checked too and every problem reported at once.
pub(crate) fn load(path: &Path, sets: &[String]) -> Result<(Loaded, Vec<Problem>), Invalid> {
    load_as(path, sets, None)
}

/// `load`, where `recorded` (a run's record of its callbacks, for its replay) gives each
/// callback's script hashes and template texts instead of the files, which need not be here.
pub(crate) fn load_as(
    path: &Path,
    sets: &[String],
    recorded: Option<&Recorded>,
) -> Result<(Loaded, Vec<Problem>), Invalid> {
    let place = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|error| Invalid::one(&place, format!("cannot read the manifest: {error}")))?;
    // The file alone first: toml reports line and column, which figment cannot.
    if let Err(error) = toml::from_str::<Manifest>(&text) {
        return Err(Invalid::one(&place, toml_error(&error)));
    }
    let mut figment =
        Figment::new()
            .merge(Toml::string(&text))
            .merge(Env::prefixed(ENV_PREFIX).split("__").filter(|key| {
                // The filter may see `run__concurrency` or `run.concurrency`.
                let first = key.as_str().split(['.', '_']).next().unwrap_or("");
                TOP_LEVEL_KEYS.contains(&first.to_ascii_lowercase().as_str())
            }));
    for set in sets {
        let (key, value) = parse_set(set)?;
        figment = figment.merge(Serialized::default(&key, value));
    }
    let manifest: Manifest = figment.extract().map_err(|errors| {
        Invalid(
            errors
                .into_iter()
                .map(|error| Problem {
                    place: override_place(&place, &error),
                    message: error.kind.to_string(),
                })
                .collect(),
        )
    })?;
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    // Absolute, so callbacks (which run in this folder) and messages agree on paths.
    let folder = std::fs::canonicalize(folder).unwrap_or_else(|_| folder.to_path_buf());
    let project = super::project_of(&folder, &manifest.name);
    let mut loaded = Loaded {
        manifest,
        path: path.to_path_buf(),
        folder,
        project,
        sources: figment,
    };
    let mut problems = name_rule_judges(&mut loaded);
    problems.extend(check::check(&loaded, recorded.is_some()));
    problems.extend(resolve_models(&mut loaded, recorded));
    match recorded {
        Some(recorded) => {
            for (key, spec) in callback_specs(&mut loaded.manifest) {
                spec.script_files = recorded.scripts.get(&key).cloned().unwrap_or_default();
            }
        }
        None => problems.extend(read_scripts(&mut loaded)),
    }
    Ok((loaded, problems))
}

/// A built-in rule judge that `[audit] judges` names, or a built-in rule reader that `[audit]
/// readers` names, without a `[judges.*]` / `[readers.*]` table of its own gets one
/// (`builtin = NAME`, nothing else), so every audit judge and panel reader is a table from here on.
fn name_rule_judges(loaded: &mut Loaded) -> Vec<Problem> {
    use crate::protocol::Role;
    let path = loaded.path.display().to_string();
    let manifest = &mut loaded.manifest;
    let Some(audit) = &manifest.audit else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    let lists = [
        (
            Role::Judge,
            "judges",
            &audit.judges,
            &mut manifest.judges,
            "judge",
        ),
        (
            Role::Reader,
            "readers",
            &audit.readers,
            &mut manifest.readers,
            "reader",
        ),
    ];
    for (role, key, named, tables, what) in lists {
        let rules: Vec<&str> = crate::builtin::names(role)
            .into_iter()
            .filter(|b| crate::builtin::in_process(b).is_some())
            .collect();
        for name in named {
            if tables.contains_key(name) {
                continue;
            }
            // Parsed, so that every other field takes the default a table would.
            let table = rules
                .contains(&name.as_str())
                .then(|| format!("builtin = \"{name}\""));
            match table.and_then(|table| toml::from_str::<CallbackSpec>(&table).ok()) {
                Some(spec) => {
                    tables.insert(name.clone(), spec);
                }
                None => problems.push(Problem {
                    place: format!("{path}: key `audit.{key}`"),
                    message: format!(
                        "`{name}` is neither a `[{key}.{name}]` table nor a built-in rule {what} ({})",
                        rules.join(", ")
                    ),
                }),
            }
        }
    }
    problems
}

/// Gives each model built-in its endpoint and template texts (SPEC §8).
/// Every callback of the manifest, by its key, to be filled in.
fn callback_specs(manifest: &mut Manifest) -> impl Iterator<Item = (String, &mut CallbackSpec)> {
    manifest
        .compressors
        .iter_mut()
        .map(|(name, spec)| (format!("compressors.{name}"), spec))
        .chain([
            ("reader".to_owned(), &mut manifest.reader),
            ("judge".to_owned(), &mut manifest.judge),
        ])
        .chain(
            manifest
                .judges
                .iter_mut()
                .map(|(name, spec)| (format!("judges.{name}"), spec)),
        )
        .chain(
            manifest
                .readers
                .iter_mut()
                .map(|(name, spec)| (format!("readers.{name}"), spec)),
        )
}

/// Each command callback's files, hashed into its identity (see `scripts`).
fn read_scripts(loaded: &mut Loaded) -> Vec<Problem> {
    let mut problems = Vec::new();
    let folder = loaded.folder.clone();
    for (key, spec) in callback_specs(&mut loaded.manifest) {
        let place = format!("{}: key `{key}`", loaded.path.display());
        match super::scripts::files(spec, &folder, &place) {
            Ok(files) => spec.script_files = files,
            Err(problem) => problems.push(problem),
        }
    }
    problems
}

/// Why `ladder = true` cannot be served by the callback at `key`, if it cannot (SPEC §14).
fn ladder_problem(key: &str, spec: &CallbackSpec) -> Option<String> {
    if !spec.ladder {
        return None;
    }
    if !key.starts_with("compressors.") {
        return Some("`ladder` is for compressors: a reader or a judge has no budget".into());
    }
    let model = (spec.builtin.as_deref()).is_some_and(|b| crate::inputs::models::model_builtin(b).is_some());
    model.then(|| {
        "`ladder` is for compressors that serve every budget from one pass; a model built-in writes one text for one budget (drop `ladder`)".into()
    })
}

fn resolve_models(loaded: &mut Loaded, recorded: Option<&Recorded>) -> Vec<Problem> {
    let mut problems = Vec::new();
    let manifest = &mut loaded.manifest;
    let models = manifest.models.clone();
    let specs = callback_specs(manifest);
    for (key, spec) in specs {
        let place = format!("{}: key `{key}`", loaded.path.display());
        if let Some(message) = ladder_problem(&key, spec) {
            problems.push(Problem {
                place: place.clone(),
                message,
            });
        }
        let Some(builtin) = spec
            .builtin
            .as_deref()
            .filter(|b| crate::inputs::models::model_builtin(b).is_some())
        else {
            for (field, set) in [
                ("template", spec.template.is_some()),
                ("system_template", spec.system_template.is_some()),
            ] {
                if set {
                    problems.push(Problem {
                        place: place.clone(),
                        message: format!(
                            "`{field}` is for the model built-ins (llm-compressor, llm-reader, llm-judge)"
                        ),
                    });
                }
            }
            continue;
        };
        match crate::inputs::models::resolve(
            builtin,
            &spec.params,
            spec.template.as_deref(),
            spec.system_template.as_deref(),
            &models,
            &loaded.folder,
            recorded.map(|r| &r.templates),
        ) {
            Ok(call) => spec.model = Some(call),
            Err(found) => problems.extend(found.into_iter().map(|message| Problem {
                place: place.clone(),
                message,
            })),
        }
    }
    problems.extend(check_endpoints(&loaded.path, &loaded.manifest.models));
    if let Some(cap) = loaded.manifest.run.max_cost_usd
        && (!cap.is_finite() || cap < 0.0)
    {
        problems.push(Problem {
            place: format!("{}: key `run.max_cost_usd`", loaded.path.display()),
            message: "must be a non-negative number of US dollars".into(),
        });
    }
    if let Some(stop) = &loaded.manifest.run.stop {
        let compressors = |name: &str| loaded.manifest.compressors.contains_key(name);
        problems.extend(stop.problems(compressors).into_iter().map(|message| Problem {
            place: format!("{}: key `run.stop`", loaded.path.display()),
            message,
        }));
    }
    problems
}

/// Each `[models.*]` table's own values: its URL, limits, batch settings, key and prices.
pub(crate) fn check_endpoints(path: &Path, models: &BTreeMap<String, ModelSpec>) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (name, model) in models {
        let place = format!("{}: key `models.{name}`", path.display());
        let mut problem = |message: String| {
            problems.push(Problem {
                place: place.clone(),
                message,
            })
        };
        if !model.base_url.starts_with("http://") && !model.base_url.starts_with("https://") {
            problem(format!(
                "`base_url` `{}` must start with http:// or https://",
                model.base_url
            ));
        }
        if model.max_concurrency == 0 {
            problem("`max_concurrency` must be at least 1".into());
        }
        if let Some(batch) = model.batch.spec() {
            if batch.max_requests == 0 || batch.max_bytes.0 == 0 {
                problem("`batch.max_requests` and `batch.max_bytes` must be at least 1".into());
            }
            if batch.poll.0.is_zero() {
                problem("`batch.poll` must be longer than 0".into());
            }
        }
        let prices = model
            .price
            .map(|p| [Some(p.input), p.cached_input, p.cache_write, Some(p.output)]);
        if prices.is_some_and(|p| p.iter().flatten().any(|v| !v.is_finite() || *v < 0.0)) {
            problem("`price` values must be non-negative numbers (USD per million tokens)".into());
        }
    }
    problems
}

/// Checks and readies a callback table of a file that is not a manifest (a dataset build's
/// writer, reader and judge, SPEC §16) as a manifest's are: its command or built-in for its
/// role, a model built-in's endpoint and templates, the files its command runs. `key` is its
/// key in the file at `path`.
pub(crate) fn ready_callback(
    (path, folder): (&Path, &Path),
    key: &str,
    role: crate::protocol::Role,
    spec: &mut CallbackSpec,
    models: &BTreeMap<String, ModelSpec>,
) -> Vec<Problem> {
    let place = format!("{}: key `{key}`", path.display());
    let mut problems: Vec<Problem> = (super::check::check_callback(spec, role, folder, false).into_iter())
        .map(|message| Problem {
            place: place.clone(),
            message,
        })
        .collect();
    if let Some(builtin) =
        (spec.builtin.as_deref()).filter(|b| crate::inputs::models::model_builtin(b) == Some(role))
    {
        let resolved = crate::inputs::models::resolve(
            builtin,
            &spec.params,
            spec.template.as_deref(),
            spec.system_template.as_deref(),
            models,
            folder,
            None,
        );
        match resolved {
            Ok(call) => spec.model = Some(call),
            Err(found) => problems.extend(found.into_iter().map(|message| Problem {
                place: place.clone(),
                message,
            })),
        }
    }
    match super::scripts::files(spec, folder, &place) {
        Ok(files) => spec.script_files = files,
        Err(problem) => problems.push(problem),
    }
    problems
}

pub(crate) fn toml_error(error: &toml::de::Error) -> String {
    // toml's message spans several lines with a source excerpt; keep it, indented.
    error.to_string().trim_end().replace('\n', "\n    ")
}

fn override_place(file: &str, error: &figment::Error) -> String {
    let path: Vec<&str> = error.path.iter().map(String::as_str).collect();
    place(file, &path, error.metadata.as_ref())
}

/// Where the value at `path` was given: the manifest's key, the `GACC_` variable or the
/// `--set` override, as `metadata` (figment's record of the source) says.
pub(super) fn place(file: &str, path: &[&str], metadata: Option<&figment::Metadata>) -> String {
    let key = path.join(".");
    let Some(metadata) = metadata else {
        return if key.is_empty() {
            file.to_owned()
        } else {
            format!("{file}: key `{key}`")
        };
    };
    match &metadata.source {
        Some(figment::Source::File(_)) | None if metadata.name.contains("environment") => {
            format!(
                "environment variable {ENV_PREFIX}{}",
                path.join("__").to_uppercase()
            )
        }
        Some(figment::Source::Code(_)) => format!("--set {key}"),
        _ if key.is_empty() => file.to_owned(),
        _ => format!("{file}: key `{key}`"),
    }
}

/// Splits `key.path=value`; the value is read as TOML, or taken as a string if it isn't.
fn parse_set(set: &str) -> Result<(String, figment::value::Value), Invalid> {
    let place = format!("--set {set}");
    let Some((key, value)) = set.split_once('=') else {
        return Err(Invalid::one(place, "expected key.path=value"));
    };
    let key = key.trim();
    if key.is_empty() || key.split('.').any(|part| part.is_empty()) {
        return Err(Invalid::one(place, "expected a dotted key path before `=`"));
    }
    let value = match toml::from_str::<toml::Table>(&format!("v = {value}")) {
        Ok(mut table) => table.remove("v").unwrap_or(toml::Value::String(value.to_owned())),
        Err(_) => toml::Value::String(value.to_owned()),
    };
    let value =
        figment::value::Value::serialize(&value).map_err(|error| Invalid::one(&place, error.to_string()))?;
    Ok((key.to_owned(), value))
}
