//! Everything a command needs before it calls anything: the manifest and dataset checked
//! (every problem at once), the tokenizer verified, the plan made, and the callbacks built,
//! each in its sandbox and with its launcher.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::error::{Error, Invalid, Problem, io};
use std::collections::BTreeMap;

use crate::exec::callback::{Callback, Launcher};
use crate::exec::engine::Engine;
use crate::exec::in_process::InProcess;
use crate::exec::model::{CostGuard, Endpoint, ModelLauncher};
use crate::exec::program::Program;
use crate::exec::sandbox::{self, Confinement, Protected, Sandboxing};
use crate::hash::sha256;
use crate::inputs::dataset::{self, Dataset};
use crate::inputs::labels::{self, Labels};
use crate::inputs::manifest::{self, CallbackSpec, Loaded};
use crate::inputs::tokenizer::Tokenizer;
use crate::plan::{self, Plan};
use crate::protocol::Role;
use crate::runner::Callbacks;
use crate::store::cache::Cache;

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

/// Loads and checks everything a run needs, reporting every problem at once.
pub(crate) fn prepare(path: &Path, sets: &[String]) -> Result<Prepared, Error> {
    prepare_with(path, sets, true)
}

/// `prepare` for what calls nothing (`gacc plan`): the endpoints' keys need not be set.
pub(crate) fn prepare_without_keys(path: &Path, sets: &[String]) -> Result<Prepared, Error> {
    prepare_with(path, sets, false)
}

fn prepare_with(path: &Path, sets: &[String], keys: bool) -> Result<Prepared, Error> {
    let (loaded, mut problems) = manifest::load(path, sets)?;
    // Every model endpoint a callback uses needs its key (named, never its value).
    for (name, model) in loaded.manifest.models.iter().filter(|_| keys) {
        if let Some(variable) = &model.api_key_env
            && std::env::var_os(variable).is_none_or(|v| v.is_empty())
        {
            problems.push(Problem {
                place: format!("{}: key `models.{name}`", loaded.path.display()),
                message: format!("`api_key_env` names `{variable}`, which is not set in the environment"),
            });
        }
    }
    let dataset = match dataset::load(&loaded) {
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
    let tokenizer_env = [("tokenizer".to_owned(), &loaded.manifest.tokenizer.env)];
    let callback_env = loaded
        .manifest
        .callbacks()
        .into_iter()
        .map(|(key, _, spec)| (key, &spec.env));
    for (key, env) in tokenizer_env.into_iter().chain(callback_env) {
        for name in env {
            if std::env::var_os(name).is_none() {
                problems.push(Problem {
                    place: format!("{}: key `{key}.env`", loaded.path.display()),
                    message: format!("variable `{name}` is listed but not set in the environment"),
                });
            }
        }
    }
    // The run folders' place is known only to `run`, which checks them too.
    let protected = Protected::of(&loaded, &cache_root(&loaded), None);
    problems.extend(sandbox_problems(&loaded, &protected));
    let (Some(dataset), true) = (dataset, problems.is_empty()) else {
        return Err(Invalid(problems).into());
    };
    let tokenizer = crate::inputs::tokenizer::open(&loaded.manifest.tokenizer, &loaded.folder)
        .map_err(|message| Invalid::one(format!("{}: key `tokenizer`", loaded.path.display()), message))?;
    let plan = plan::plan(&loaded, &dataset, tokenizer.as_ref())?;
    let resolved = toml::to_string(&loaded.manifest).map_err(|error| {
        Invalid::one(
            loaded.path.display().to_string(),
            format!("cannot write the resolved manifest: {error}"),
        )
    })?;
    let resolved_sha256 = sha256(&resolved);
    // What was run, not how: the same experiment run here or on a cluster, with any
    // concurrency or cache place, has one identity and one report.json.
    let how = |spec: &CallbackSpec| CallbackSpec {
        mode: crate::protocol::Mode::default(),
        timeout: manifest::default_timeout(),
        retries: manifest::DEFAULT_RETRIES,
        concurrency: None,
        max_inflight: None,
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
    let experiment_sha256 = sha256(toml::to_string(&experiment).unwrap_or_default());
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

/// The command line a callback runs: a built-in through this executable, or its command
/// with the program found.
fn argv(loaded: &Loaded, spec: &CallbackSpec, exe: &Path) -> Vec<String> {
    match (&spec.builtin, &spec.command) {
        (Some(builtin), _) => vec![exe.display().to_string(), "callback".into(), builtin.clone()],
        (None, Some(command)) if !command.is_empty() => {
            let mut argv = command.clone();
            if let Some(program) = manifest::find_program(&command[0], &loaded.folder) {
                argv[0] = program.display().to_string();
            }
            argv
        }
        (None, _) => Vec::new(),
    }
}

fn current_exe() -> Result<PathBuf, Error> {
    std::env::current_exe().map_err(io(Path::new("gacc")))
}

/// What each sandboxed callback's settings would expose of the experiment's files.
fn sandbox_problems(loaded: &Loaded, protected: &Protected) -> Vec<Problem> {
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
        if in_process || !sandbox::wanted(role, spec.sandbox.as_ref()) {
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

/// How each callback runs, by role and key.
pub(super) type Confinements = Vec<(Role, String, Confinement)>;

/// Turns the manifest's callback settings into callables, each in its sandbox, with how
/// each one runs.
pub(super) fn callbacks(
    loaded: &Loaded,
    sandboxing: &Sandboxing,
    engine: &Arc<dyn Engine>,
    models: &Models,
) -> Result<(Callbacks, Confinements), Error> {
    let mut builder = Builder {
        loaded,
        sandboxing,
        engine,
        models,
        exe: current_exe()?,
        problems: Vec::new(),
        confinements: Vec::new(),
    };
    let callbacks = crate::runner::callbacks_of_manifest(&loaded.manifest, |key, role, spec| {
        builder.build(key, role, spec)
    });
    if builder.problems.is_empty() {
        Ok((callbacks, builder.confinements))
    } else {
        Err(Invalid(builder.problems).into())
    }
}

/// What turns the manifest's callback tables into callables: the run's settings, and the
/// problems and confinements found on the way.
struct Builder<'a> {
    loaded: &'a Loaded,
    sandboxing: &'a Sandboxing,
    engine: &'a Arc<dyn Engine>,
    models: &'a Models,
    exe: PathBuf,
    problems: Vec<Problem>,
    confinements: Confinements,
}

impl Builder<'_> {
    /// One callback: a model built-in on its endpoint, a rule built-in in process, or a program.
    fn build(&mut self, name: String, role: Role, spec: &CallbackSpec) -> Callback {
        let loaded = self.loaded;
        if let Some(call) = &spec.model {
            match model_callback(&name, role, spec, call, self.models) {
                Ok((callback, confinement)) => {
                    self.confinements.push((role, name, confinement));
                    return callback;
                }
                Err(message) => self.problems.push(Problem {
                    place: format!("{}: key `{name}`", loaded.path.display()),
                    message,
                }),
            }
        }
        if let Some(launcher) = spec.builtin.as_deref().and_then(InProcess::of) {
            let (callback, confinement) = rule_callback(name.clone(), role, spec, launcher, loaded);
            self.confinements.push((role, name, confinement));
            return callback;
        }
        self.program(name, role, spec)
    }

    /// A callback that is a program: in its sandbox, started by the run's engine.
    fn program(&mut self, name: String, role: Role, spec: &CallbackSpec) -> Callback {
        let (loaded, sandboxing) = (self.loaded, self.sandboxing);
        let argv = argv(loaded, spec, &self.exe);
        let place = || format!("{}: key `{name}.sandbox`", loaded.path.display());
        let settings = spec.sandbox.as_ref();
        let mut grants = sandbox::Grants::default();
        if sandbox::wanted(role, settings) {
            match sandboxing
                .protected()
                .grants(settings, &argv, spec.builtin.is_some(), &loaded.folder)
            {
                Ok(found) => grants = found,
                Err(found) => self.problems.extend(found.into_iter().map(|message| Problem {
                    place: place(),
                    message,
                })),
            }
        }
        let sandbox = match sandboxing.confine(role, settings, &grants, spec.builtin.as_deref()) {
            Ok((policy, confinement)) => {
                self.confinements.push((role, name.clone(), confinement));
                policy
            }
            Err(message) => {
                self.problems.push(Problem {
                    place: place(),
                    message,
                });
                None
            }
        };
        let program = Program {
            argv,
            cwd: loaded.folder.clone(),
            env: spec.env.clone(),
            timeout: spec.timeout.0,
            mode: spec.mode,
            sandbox,
            max_inflight: spec.max_inflight.unwrap_or(1).max(1),
        };
        crate::secrets::register_all(&program.passed());
        let launcher = self.engine.launcher(program);
        let run_concurrency = loaded.manifest.run.concurrency;
        configured(name, role, spec, launcher, run_concurrency)
    }
}

/// The model endpoints of a run (one per `[models.*]` table, shared by every callback that
/// names it), the run's spending cap, and the tokenizer that estimates prompts.
pub(crate) struct Models {
    pub endpoints: BTreeMap<String, Arc<Endpoint>>,
    pub costs: Arc<CostGuard>,
    /// cl100k_base, when there is an endpoint.
    estimator: Option<Arc<dyn Tokenizer>>,
}

/// Opens the endpoints the manifest's model built-ins name.
/// The manifest's model endpoints; `planning` builds them to count and price calls only
/// (`gacc plan`), without their keys.
pub(super) fn models(loaded: &Loaded, planning: bool) -> Result<Models, Error> {
    let mut endpoints = BTreeMap::new();
    let mut problems = Vec::new();
    let named: std::collections::BTreeSet<&str> = loaded
        .manifest
        .callbacks()
        .into_iter()
        .filter_map(|(_, _, spec)| spec.model.as_ref().map(|m| m.endpoint.as_str()))
        .collect();
    // The experiment's earlier runs, newest first: read once, when an endpoint first needs them.
    let mut earlier_runs = None;
    for name in named {
        let Some(spec) = loaded.manifest.models.get(name) else {
            continue;
        };
        let endpoint = if planning {
            Endpoint::for_planning(name, spec)
        } else {
            Endpoint::new(name, spec)
        };
        match endpoint {
            Ok(mut endpoint) => {
                if !planning {
                    let earlier = earlier_runs
                        .get_or_insert_with(|| {
                            let runs = loaded.project.join("runs").join(&loaded.manifest.name);
                            crate::store::run_record::newest_first(&runs)
                        })
                        .iter()
                        .find_map(|(_, run)| run.endpoints.get(name).filter(|e| e.requests > 0));
                    if let Some(earlier) = earlier {
                        endpoint.resume(earlier);
                    }
                }
                endpoints.insert(name.to_owned(), Arc::new(endpoint));
            }
            Err(message) => problems.push(Problem {
                place: format!("{}: key `models.{name}`", loaded.path.display()),
                message,
            }),
        }
    }
    if !problems.is_empty() {
        return Err(Invalid(problems).into());
    }
    let estimator = (!endpoints.is_empty())
        .then(|| Arc::new(crate::inputs::tokenizer::Cl100k::new()) as Arc<dyn Tokenizer>);
    Ok(Models {
        endpoints,
        costs: Arc::new(CostGuard::new(loaded.manifest.run.max_cost_usd)),
        estimator,
    })
}

/// A model built-in: made in process over HTTP, on its endpoint's shared limit. Only the
/// rendered template of its request's fields leaves gacc, so its hold-out holds by
/// construction and it needs no sandbox.
fn model_callback(
    name: &str,
    role: Role,
    spec: &CallbackSpec,
    call: &Arc<crate::inputs::models::ModelCall>,
    models: &Models,
) -> Result<(Callback, sandbox::Confinement), String> {
    let endpoint = models
        .endpoints
        .get(&call.endpoint)
        .ok_or_else(|| format!("endpoint `{}` is not open", call.endpoint))?;
    let estimator = models
        .estimator
        .clone()
        .unwrap_or_else(|| Arc::new(crate::inputs::tokenizer::Cl100k::new()));
    let launcher = ModelLauncher::new(endpoint.clone(), call.clone(), models.costs.clone(), estimator)?;
    // Its calls are bounded by its endpoint's concurrency, not the run's.
    let mut callback = Callback {
        // The endpoint retries what is worth retrying, honouring Retry-After.
        retries: 0,
        ..configured(
            name.to_owned(),
            role,
            spec,
            Arc::new(launcher),
            endpoint.spec.max_concurrency,
        )
    };
    // A call waiting on a provider batch holds no slot: batches gather every ready call.
    if endpoint.spec.batch.spec().is_some() {
        callback.limit = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
    }
    let confinement = sandbox::Confinement {
        sandbox: "in-process",
        network: Some(true),
        why: Some(format!(
            "a model built-in: gacc sends only its template rendered from the request's fields to `models.{}`",
            call.endpoint
        )),
    };
    Ok((callback, confinement))
}

/// A rule built-in, answered by gacc itself from the request alone: no process, no sandbox
/// needed, on any executor (a string comparison is not worth a process, let alone a cluster
/// task). Its calls use this machine's cores, so the run's concurrency bounds them.
fn rule_callback(
    name: String,
    role: Role,
    spec: &CallbackSpec,
    launcher: InProcess,
    loaded: &Loaded,
) -> (Callback, sandbox::Confinement) {
    let callback = configured(
        name,
        role,
        spec,
        Arc::new(launcher),
        loaded.manifest.run.concurrency,
    );
    let confinement = sandbox::Confinement {
        sandbox: "in-process",
        network: Some(false),
        why: Some("a rule built-in: gacc answers it itself, from the request alone".to_owned()),
    };
    (callback, confinement)
}

/// A callback as the manifest configures it: its retries, params, identity and concurrency
/// (`concurrency`, else `run_concurrency`), made by `launcher`.
fn configured(
    name: String,
    role: Role,
    spec: &CallbackSpec,
    launcher: Arc<dyn Launcher>,
    run_concurrency: usize,
) -> Callback {
    Callback {
        retries: spec.retries,
        params: spec.params.clone(),
        identity: plan::keys::callback_identity(spec),
        limit: Arc::new(Semaphore::new(spec.concurrency.unwrap_or(run_concurrency).max(1))),
        ..Callback::new(name, role, launcher)
    }
}

/// The engine `run.executor` names, its commands checked.
pub(super) fn engine(loaded: &Loaded) -> Result<Arc<dyn Engine>, Error> {
    crate::exec::engine_of(loaded).map_err(|message| {
        let place = format!("{}: key `run.executor`", loaded.path.display());
        Invalid::one(place, message).into()
    })
}

pub(super) fn cache_root(loaded: &Loaded) -> PathBuf {
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

/// What changed in the callbacks' files since the last run of this experiment, one line per
/// callback: its calls run again (a pinned `revision` would have kept them).
pub(super) fn changed_scripts(loaded: &Loaded) -> Vec<String> {
    let latest = (loaded.project.join("runs"))
        .join(&loaded.manifest.name)
        .join("latest")
        .join("run.json");
    let Some(before) = std::fs::read_to_string(latest)
        .ok()
        .and_then(|text| crate::store::run_record::RunRecord::parse(&text))
    else {
        return Vec::new();
    };
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
        if !changed.is_empty() {
            lines.push(format!(
                "`{key}`: {} changed since the last run, so its calls run again (`revision` pins a callback)",
                changed.join(", ")
            ));
        }
    }
    lines
}
