//! The callbacks of a run, built from the manifest's tables: a model built-in on its endpoint, a
//! rule built-in in process, or a program in its sandbox started by the run's engine; and the
//! model endpoints they share.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::error::{Error, Invalid, Problem, io};
use crate::exec::callback::{Callback, Launcher};
use crate::exec::engine::Engine;
use crate::exec::in_process::InProcess;
use crate::exec::model::{CostGuard, Endpoint, ModelLauncher};
use crate::exec::program::Program;
use crate::exec::sandbox::{self, Confinement, Sandboxing};
use crate::inputs::manifest::{self, CallbackSpec, Loaded};
use crate::inputs::tokenizer::Tokenizer;
use crate::plan;
use crate::protocol::Role;
use crate::runner::Callbacks;

/// The command line a callback runs: a built-in through this executable, or its command
/// with the program found.
pub(super) fn argv(loaded: &Loaded, spec: &CallbackSpec, exe: &Path) -> Vec<String> {
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

pub(super) fn current_exe() -> Result<PathBuf, Error> {
    std::env::current_exe().map_err(io(Path::new("gacc")))
}

/// How each callback runs, by role and key.
pub(in crate::app) type Confinements = Vec<(Role, String, Confinement)>;

/// Turns the manifest's callback settings into callables, each in its sandbox, with how
/// each one runs.
pub(in crate::app) fn callbacks(
    loaded: &Loaded,
    sandboxing: &Sandboxing,
    engine: &Arc<dyn Engine>,
    models: &Models,
) -> Result<(Callbacks, Confinements), Error> {
    let mut builder = Builder::new(loaded, sandboxing, engine, models)?;
    let callbacks = crate::runner::callbacks_of_manifest(&loaded.manifest, |key, role, spec| {
        builder.build(key, role, spec)
    });
    if builder.problems.is_empty() {
        Ok((callbacks, builder.confinements))
    } else {
        Err(Invalid(builder.problems).into())
    }
}

/// One callback table of `loaded`'s file that is not among its manifest's (a dataset build's
/// writer), made as `callbacks` makes those.
pub(in crate::app) fn callback_of(
    loaded: &Loaded,
    (sandboxing, engine, models): (&Sandboxing, &Arc<dyn Engine>, &Models),
    (name, role, spec): (&str, Role, &CallbackSpec),
) -> Result<Callback, Error> {
    let mut builder = Builder::new(loaded, sandboxing, engine, models)?;
    let callback = builder.build(name.to_owned(), role, spec);
    match builder.problems.is_empty() {
        true => Ok(callback),
        false => Err(Invalid(builder.problems).into()),
    }
}

/// What turns the manifest's callback tables into callables: the run's settings, and the
/// problems and confinements found on the way.
pub(super) struct Builder<'a> {
    loaded: &'a Loaded,
    sandboxing: &'a Sandboxing,
    engine: &'a Arc<dyn Engine>,
    models: &'a Models,
    exe: PathBuf,
    problems: Vec<Problem>,
    confinements: Confinements,
}

impl<'a> Builder<'a> {
    fn new(
        loaded: &'a Loaded,
        sandboxing: &'a Sandboxing,
        engine: &'a Arc<dyn Engine>,
        models: &'a Models,
    ) -> Result<Builder<'a>, Error> {
        Ok(Builder {
            loaded,
            sandboxing,
            engine,
            models,
            exe: current_exe()?,
            problems: Vec::new(),
            confinements: Vec::new(),
        })
    }

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
            secrets: crate::secrets::of(&spec.env, &[&spec.secrets, &loaded.manifest.run.secrets]),
            timeout: spec.timeout.0,
            mode: spec.mode,
            sandbox,
            max_inflight: spec.max_inflight.unwrap_or(1).max(1),
        };
        crate::secrets::register_all(&program.passed_secrets());
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

/// How a command opens the endpoints' keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::app) enum Keys {
    /// Every endpoint's key must be set (a run, `gacc callback check`).
    Required,
    /// Keys are not read: calls are only counted and priced (`gacc plan`, `gacc verify`).
    Planning,
    /// Keys where set; an endpoint without one fails the calls it is asked to make
    /// (`gacc run --from`, where the pack answers most).
    IfSet,
}

/// The manifest's model endpoints, their keys read as `keys` says.
pub(in crate::app) fn models(loaded: &Loaded, keys: Keys) -> Result<Models, Error> {
    models_with(loaded, &[], keys)
}

/// The endpoints the manifest's model built-ins name and those `also` name (a dataset build's
/// writer), their keys read as `keys` says.
pub(in crate::app) fn models_with(
    loaded: &Loaded,
    also: &[&CallbackSpec],
    keys: Keys,
) -> Result<Models, Error> {
    let planning = keys == Keys::Planning;
    let mut endpoints = BTreeMap::new();
    let mut problems = Vec::new();
    let named: std::collections::BTreeSet<&str> = (loaded.manifest.callbacks().into_iter())
        .map(|(_, _, spec)| spec)
        .chain(also.iter().copied())
        .filter_map(|spec| spec.model.as_ref().map(|m| m.endpoint.as_str()))
        .collect();
    // The experiment's earlier runs, newest first: read once, when an endpoint first needs them.
    let mut earlier_runs = None;
    for name in named {
        let Some(spec) = loaded.manifest.models.get(name) else {
            continue;
        };
        let endpoint = match keys {
            Keys::Planning => Endpoint::for_planning(name, spec),
            Keys::Required => Endpoint::new(name, spec),
            Keys::IfSet => Endpoint::key_if_set(name, spec),
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
pub(super) fn model_callback(
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
        // The endpoint retries what is worth retrying, honouring Retry-After; a writer's reply
        // that holds no well-formed JSON is tried again as the table says.
        retries: if role == Role::Writer { spec.retries } else { 0 },
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
pub(super) fn rule_callback(
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
pub(super) fn configured(
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
