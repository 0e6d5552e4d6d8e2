//! Everything a command needs before it calls anything: the manifest and dataset checked
//! (every problem at once), the tokenizer verified, the plan made, and the callbacks built,
//! each in its sandbox and with its launcher.

mod callbacks;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Invalid, Problem};
use crate::exec::engine::Engine;
use crate::exec::sandbox::{self, Protected};
use crate::hash::sha256;
use crate::inputs::dataset::{self, Dataset};
use crate::inputs::labels::{self, Labels};
use crate::inputs::manifest::{self, CallbackSpec, Loaded};
use crate::inputs::tokenizer::Tokenizer;
use crate::plan::{self, Plan};
use crate::store::cache::Cache;

pub(in crate::app) use callbacks::Keys;
pub(crate) use callbacks::Models;
pub(super) use callbacks::{Confinements, callback_of, callbacks, models, models_with};
use callbacks::{argv, current_exe};

/// A manifest and dataset that passed every check, with the tokenizer and plan.
pub(crate) struct Prepared {
    pub loaded: Loaded,
    pub dataset: Arc<Dataset>,
    pub tokenizer: Arc<dyn Tokenizer>,
    pub plan: Arc<Plan>,
    /// The resolved manifest as TOML, and its SHA-256.
    pub resolved: String,
    pub resolved_sha256: String,
    /// SHA-256 of the resolved manifest without its `[run]` table (report.json's `manifest_sha256`).
    pub experiment_sha256: String,
    /// `[audit] labels`, read and checked.
    pub labels: Option<Arc<Labels>>,
}

/// What a command will call, and so what of the caller's environment it needs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Calling<'a> {
    /// Every callback (a run): endpoints' keys and callbacks' `env` variables must be set.
    Everything,
    /// Nothing (`gacc plan`), or only what a pack lacks (`run --from`): keys need not be set.
    WithoutKeys,
    /// A replay of a run (`gacc verify`): only the callbacks `allowed` (the verifier's own) may
    /// call, so nothing of the payer's environment is read for the others, and the callbacks'
    /// files are taken from the run's record.
    Replay {
        recorded: &'a manifest::Recorded,
        allowed: &'a [String],
    },
}

/// Loads and checks everything a run needs, reporting every problem at once.
pub(crate) fn prepare(path: &Path, sets: &[String]) -> Result<Prepared, Error> {
    prepare_with(path, sets, Calling::Everything)
}

/// `prepare` for what calls nothing (`gacc plan`): the endpoints' keys need not be set.
pub(crate) fn prepare_without_keys(path: &Path, sets: &[String]) -> Result<Prepared, Error> {
    prepare_with(path, sets, Calling::WithoutKeys)
}

/// The steps in order, each one's problems gathered before the next.
pub(crate) fn prepare_with(path: &Path, sets: &[String], calling: Calling) -> Result<Prepared, Error> {
    let (recorded, allowed) = match calling {
        Calling::Replay { recorded, allowed } => (Some(recorded), Some(allowed)),
        _ => (None, None),
    };
    let keys = matches!(calling, Calling::Everything);
    // A replay reads the environment only for the tokenizer and the callbacks allowed to call.
    let called = |key: &str| allowed.is_none_or(|allowed| allowed.iter().any(|a| a == key));
    let (loaded, mut problems) = manifest::load_as(path, sets, recorded)?;
    // `run.executor` and the engines' own tables, which only the engines' registry knows.
    problems.extend(
        crate::exec::engine_problems(&loaded)
            .into_iter()
            .map(|(key, message)| Problem {
                place: loaded.place_of(&key),
                message,
            }),
    );
    if keys {
        problems.extend(key_problems(&loaded));
    }
    let read = match run_folders_copy(&loaded) {
        Some(copy) => dataset::load_path(&copy),
        None => dataset::load(&loaded),
    };
    let dataset = match read {
        Ok(dataset) => Some(dataset),
        Err(found) => {
            problems.extend(found);
            None
        }
    };
    let labels = read_labels(&loaded).unwrap_or_else(|found| {
        problems.extend(found);
        None
    });
    problems.extend(environment_problems(&loaded, &called));
    // The run folders' place is known only to `run`, which checks them too.
    let protected = Protected::of(&loaded, &cache_root(&loaded), None);
    problems.extend(sandbox_problems(&loaded, &protected, &called));
    let (Some(dataset), true) = (dataset, problems.is_empty()) else {
        return Err(Invalid(problems).into());
    };
    let tokenizer = crate::inputs::tokenizer::open(
        &loaded.manifest.tokenizer,
        &loaded.folder,
        &loaded.manifest.run.secrets,
    )
    .map_err(|message| Invalid::one(format!("{}: key `tokenizer`", loaded.path.display()), message))?;
    let plan = plan::plan(&loaded, &dataset, tokenizer.as_ref())?;
    let resolved = toml::to_string(&loaded.manifest).map_err(|error| {
        Invalid::one(
            loaded.path.display().to_string(),
            format!("cannot write the resolved manifest: {error}"),
        )
    })?;
    let resolved_sha256 = sha256(&resolved);
    let experiment_sha256 = experiment_sha256(&loaded);
    Ok(Prepared {
        loaded,
        dataset: Arc::new(dataset),
        tokenizer,
        plan: Arc::new(plan),
        resolved,
        resolved_sha256,
        experiment_sha256,
        labels,
    })
}

/// Every model endpoint a callback uses needs its key (named, never its value).
fn key_problems(loaded: &Loaded) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (name, model) in loaded.manifest.models.iter() {
        if let Some(variable) = &model.api_key_env
            && std::env::var_os(variable).is_none_or(|v| v.is_empty())
        {
            problems.push(Problem {
                place: format!("{}: key `models.{name}`", loaded.path.display()),
                message: format!("`api_key_env` names `{variable}`, which is not set in the environment"),
            });
        }
    }
    problems
}

/// Each variable the tokenizer or a callback that will be called lists must be set.
fn environment_problems(loaded: &Loaded, called: &dyn Fn(&str) -> bool) -> Vec<Problem> {
    let mut problems = Vec::new();
    let tokenizer_env = [("tokenizer".to_owned(), &loaded.manifest.tokenizer.env)];
    let callback_env = loaded
        .manifest
        .callbacks()
        .into_iter()
        .map(|(key, _, spec)| (key, &spec.env));
    for (key, env) in tokenizer_env
        .into_iter()
        .chain(callback_env.filter(|(key, _)| called(key)))
    {
        for name in env {
            if std::env::var_os(name).is_none() {
                problems.push(Problem {
                    place: format!("{}: key `{key}.env`", loaded.path.display()),
                    message: format!("variable `{name}` is listed but not set in the environment"),
                });
            }
        }
    }
    problems
}

/// What was run, not how: the same experiment run here or on a cluster, with any
/// concurrency or cache place, has one identity and one report.json.
fn experiment_sha256(loaded: &Loaded) -> String {
    let how = |spec: &CallbackSpec| CallbackSpec {
        mode: crate::protocol::Mode::default(),
        timeout: manifest::default_timeout(),
        retries: manifest::DEFAULT_RETRIES,
        concurrency: None,
        max_inflight: None,
        secrets: Vec::new(),
        ..spec.clone()
    };
    let experiment = manifest::Manifest {
        run: manifest::RunSpec::default(),
        models: (loaded.manifest.models.iter())
            .map(|(name, model)| (name.clone(), model.without_operations()))
            .collect(),
        compressors: (loaded.manifest.compressors.iter())
            .map(|(name, spec)| (name.clone(), how(spec)))
            .collect(),
        reader: how(&loaded.manifest.reader),
        judge: how(&loaded.manifest.judge),
        ..loaded.manifest.clone()
    };
    sha256(toml::to_string(&experiment).unwrap_or_default())
}

/// `[audit] labels`, read and checked. A labels file that is missing is the manifest check's
/// problem; one that is wrong, this one's.
fn read_labels(loaded: &Loaded) -> Result<Option<Arc<Labels>>, Vec<Problem>> {
    let path = loaded.manifest.audit.as_ref().and_then(|a| a.labels.as_ref());
    match path.filter(|path| loaded.folder.join(path).is_file()) {
        Some(path) => {
            labels::read(&loaded.folder.join(path), &path.display().to_string()).map(|l| Some(Arc::new(l)))
        }
        None => Ok(None),
    }
}

/// What each sandboxed callback's settings would expose of the experiment's files.
fn sandbox_problems(loaded: &Loaded, protected: &Protected, called: &dyn Fn(&str) -> bool) -> Vec<Problem> {
    let Ok(exe) = current_exe() else {
        return Vec::new();
    };
    let mut problems = Vec::new();
    for (key, role, spec) in loaded.manifest.callbacks() {
        let in_process = spec
            .builtin
            .as_deref()
            .and_then(crate::builtin::in_process)
            .is_some();
        if in_process || !sandbox::wanted(role, spec.sandbox.as_ref()) || !called(&key) {
            continue;
        }
        let argv = argv(loaded, spec, &exe);
        if let Err(found) = protected.grants(
            spec.sandbox.as_ref(),
            &argv,
            spec.builtin.is_some(),
            &loaded.folder,
        ) {
            problems.extend(found.into_iter().map(|message| Problem {
                place: format!("{}: key `{key}.sandbox`", loaded.path.display()),
                message,
            }));
        }
    }
    problems
}

/// The engine `run.executor` names, its commands checked.
pub(super) fn engine(loaded: &Loaded) -> Result<Arc<dyn Engine>, Error> {
    crate::exec::engine_of(loaded).map_err(|message| {
        let place = format!("{}: key `run.executor`", loaded.path.display());
        Invalid::one(place, message).into()
    })
}

/// A run folder's `manifest.toml` names the dataset where it was when the run was made; run
/// again from the folder (an unpacked pack, SPEC §12), it reads the folder's own copy,
/// `dataset.jsonl` (the sources as run, nested JSON Lines), when the named path is not there.
/// The manifest is left as it was, so its SHA-256 in the report is the run's.
fn run_folders_copy(loaded: &Loaded) -> Option<PathBuf> {
    use crate::store::run_folder::{DATASET, MANIFEST, RUN};
    let path = loaded.manifest.dataset.path.as_ref()?;
    let folder = loaded.path.parent()?;
    let copy = folder.join(DATASET);
    let in_run_folder = loaded.path.file_name()? == MANIFEST && folder.join(RUN).is_file() && copy.is_file();
    (in_run_folder && !loaded.resolve(path).exists()).then_some(copy)
}

pub(in crate::app) fn cache_root(loaded: &Loaded) -> PathBuf {
    match &loaded.manifest.run.cache {
        Some(path) => loaded.resolve(path),
        None => loaded
            .project
            .join(crate::inputs::manifest::PROJECT_MARKER)
            .join("cache"),
    }
}

/// A cache being read on a thread of its own, and its folder.
pub(super) type EarlyCache = Option<(PathBuf, std::thread::JoinHandle<std::io::Result<Cache>>)>;

/// Starts reading an existing cache on a thread of its own (a re-run's cache is large) while
/// the dataset is loaded and planned; nothing is opened for a manifest with problems.
pub(super) fn open_cache_early(manifest: &Path, sets: &[String]) -> EarlyCache {
    let (loaded, problems) = manifest::load(manifest, sets).ok()?;
    let root = cache_root(&loaded);
    if !problems.is_empty() || !Cache::exists(&root) {
        return None;
    }
    let reading = {
        let root = root.clone();
        std::thread::spawn(move || Cache::open(&root))
    };
    Some((root, reading))
}

pub(super) fn cache_for(loaded: &Loaded) -> Result<Cache, Error> {
    let root = cache_root(loaded);
    Cache::open(&root).map_err(cache_error(loaded, &root))
}

/// An error opening the cache at `root`, naming the key that put it there.
pub(super) fn cache_error<'a>(
    loaded: &'a Loaded,
    root: &'a Path,
) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |error| {
        let key = match loaded.manifest.run.cache {
            Some(_) => format!(
                "`[run] cache` in {}",
                crate::inputs::manifest::shown(&loaded.path)
            ),
            None => "the default cache (`[run] cache` moves it)".to_owned(),
        };
        Error::Io {
            path: root.to_path_buf(),
            message: format!("cannot open the cache, {key}: {error}"),
        }
    }
}

/// Per callback (its manifest key), the files hashed into its identity.
pub(super) fn scripts(loaded: &Loaded) -> BTreeMap<String, BTreeMap<String, String>> {
    (loaded.manifest.callbacks().into_iter())
        .filter(|(_, _, spec)| !spec.script_files.is_empty())
        .map(|(key, _, spec)| (key, spec.script_files.clone()))
        .collect()
}

/// Per template path, as the manifest writes it, the text a model built-in read.
pub(super) fn templates(loaded: &Loaded) -> BTreeMap<String, String> {
    let mut texts = BTreeMap::new();
    for (_, _, spec) in loaded.manifest.callbacks() {
        let Some(model) = &spec.model else { continue };
        for (path, text) in [
            (&spec.template, &model.template),
            (&spec.system_template, &model.system_template),
        ] {
            if let Some(path) = path {
                texts.insert(path.to_string_lossy().into_owned(), text.clone());
            }
        }
    }
    texts
}

/// What changed in the callbacks' files since the last run of this experiment, one line per
/// callback: (whether its calls run again, the line). A callback whose `revision` is pinned and
/// unchanged keeps its cached calls, as asked: its line says so, since its answers may be stale.
pub(super) fn changed_scripts(loaded: &Loaded) -> Vec<(bool, String)> {
    let latest = (loaded.project.join("runs"))
        .join(&loaded.manifest.name)
        .join("latest");
    let Some(before) = std::fs::read_to_string(latest.join("run.json"))
        .ok()
        .and_then(|text| crate::store::run_record::RunRecord::parse(&text))
    else {
        return Vec::new();
    };
    // The revisions the last run pinned, from its manifest.
    let then_manifest: Option<toml::Table> = std::fs::read_to_string(latest.join("manifest.toml"))
        .ok()
        .and_then(|text| toml::from_str(&text).ok());
    let revision_then = |key: &str| -> String {
        let mut value = then_manifest.as_ref().map(|t| toml::Value::Table(t.clone()));
        for part in key.splitn(2, '.') {
            value = value.and_then(|v| v.get(part).cloned());
        }
        (value.and_then(|v| v.get("revision").and_then(|r| r.as_str().map(str::to_owned))))
            .unwrap_or_default()
    };
    let specs: BTreeMap<String, &CallbackSpec> = (loaded.manifest.callbacks().into_iter())
        .map(|(key, _, spec)| (key, spec))
        .collect();
    let mut lines = Vec::new();
    for (key, now) in scripts(loaded) {
        let Some(then) = before.scripts.get(&key) else {
            continue;
        };
        let changed: Vec<&str> = (now.keys().chain(then.keys()))
            .filter(|file| now.get(*file) != then.get(*file))
            .map(String::as_str)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if changed.is_empty() {
            continue;
        }
        let revision = specs.get(&key).map_or("", |spec| spec.revision.as_str());
        if revision.is_empty() {
            lines.push((
                true,
                format!(
                    "`{key}`: {} changed since the last run, so its calls run again (`revision` pins a callback)",
                    changed.join(", ")
                ),
            ));
        } else if revision == revision_then(&key) {
            lines.push((
                false,
                format!(
                    "`{key}`: {} changed since the last run, but `revision = \"{revision}\"` is pinned, so its cached answers are kept and may be stale: change `revision` (or remove it) to run its calls again",
                    changed.join(", ")
                ),
            ));
        }
    }
    lines
}
