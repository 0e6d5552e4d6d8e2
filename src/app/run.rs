//! The commands over a manifest: validate, plan and run (SPEC §6), and the run folder they
//! write (SPEC §5).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::clock::utc_timestamp;
use crate::error::{Error, io};
use crate::error::{Invalid, Problem};
use crate::exec::callback::Callback;
use crate::exec::process::Process;
use crate::exec::sandbox::{self, Confinement, Protected, Sandboxing};
use crate::exec::slurm::{Slurm, SlurmLauncher};
use crate::files::{pretty, write, write_json_lines, write_with};
use crate::hash::sha256;
use crate::inputs::budget::truncate_to_budget;
use crate::inputs::dataset::{self, Dataset};
use crate::inputs::manifest::{self, CallbackSpec, Loaded};
use crate::inputs::tokenizer::Tokenizer;
use crate::plan::{self, Plan};
use crate::protocol::Role;
use crate::report;
use crate::runner::{self, Callbacks, Progress};
use crate::store::cache::Cache;

/// A manifest and dataset that passed every check, with the tokenizer and plan.
pub struct Prepared {
    pub loaded: Loaded,
    pub dataset: Arc<Dataset>,
    pub tokenizer: Arc<dyn Tokenizer>,
    pub plan: Arc<Plan>,
    /// The resolved manifest as TOML, and its SHA-256.
    pub resolved: String,
    pub resolved_sha256: String,
    /// SHA-256 of the resolved manifest without its `[run]` table (report.json's `manifest_sha256`).
    pub experiment_sha256: String,
}

/// Loads and checks everything a run needs, reporting every problem at once.
pub fn prepare(path: &Path, sets: &[String]) -> Result<Prepared, Error> {
    let (loaded, mut problems) = manifest::load(path, sets)?;
    let dataset = match dataset::load(&loaded) {
        Ok(dataset) => Some(dataset),
        Err(found) => {
            problems.extend(found);
            None
        }
    };
    for (key, spec) in callback_specs(&loaded) {
        for name in &spec.env {
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
    // What was run, not how: the same experiment run locally or on Slurm, with any
    // concurrency or cache place, has one identity and one report.json.
    let experiment = manifest::Manifest {
        run: manifest::RunSpec::default(),
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
    })
}

fn callback_specs(loaded: &Loaded) -> Vec<(String, &CallbackSpec)> {
    let manifest = &loaded.manifest;
    manifest
        .compressors
        .iter()
        .map(|(name, spec)| (format!("compressors.{name}"), spec))
        .chain([
            ("reader".to_owned(), &manifest.reader),
            ("judge".to_owned(), &manifest.judge),
        ])
        .collect()
}

/// Every callback of a manifest: its key, role and settings.
fn callbacks_with_roles(loaded: &Loaded) -> Vec<(String, Role, &CallbackSpec)> {
    let manifest = &loaded.manifest;
    manifest
        .compressors
        .iter()
        .map(|(name, spec)| (format!("compressors.{name}"), Role::Compressor, spec))
        .chain([
            ("reader".to_owned(), Role::Reader, &manifest.reader),
            ("judge".to_owned(), Role::Judge, &manifest.judge),
        ])
        .collect()
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
    for (key, role, spec) in callbacks_with_roles(loaded) {
        if !sandbox::wanted(role, spec.sandbox.as_ref()) {
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
type Confinements = Vec<(Role, String, Confinement)>;

/// Turns the manifest's callback settings into callables, each in its sandbox, with how
/// each one runs.
fn callbacks(
    loaded: &Loaded,
    sandboxing: &Sandboxing,
    remote: Option<&Arc<Slurm>>,
) -> Result<(Callbacks, Confinements), Error> {
    let exe = current_exe()?;
    let run_concurrency = loaded.manifest.run.concurrency;
    let mut problems = Vec::new();
    let mut confinements = Vec::new();
    let mut build = |name: String, role: Role, spec: &CallbackSpec| -> Callback {
        let argv = argv(loaded, spec, &exe);
        let place = || format!("{}: key `{name}.sandbox`", loaded.path.display());
        let settings = spec.sandbox.as_ref();
        let mut grants = sandbox::Grants::default();
        if sandbox::wanted(role, settings) {
            match sandboxing
                .protected()
                .grants(settings, &argv, spec.builtin.is_some(), &loaded.folder)
            {
                Ok(found) => grants = found,
                Err(found) => problems.extend(found.into_iter().map(|message| Problem {
                    place: place(),
                    message,
                })),
            }
        }
        let sandbox = match sandboxing.confine(role, settings, &grants, spec.builtin.as_deref()) {
            Ok((policy, confinement)) => {
                confinements.push((role, name.clone(), confinement));
                policy
            }
            Err(message) => {
                problems.push(Problem {
                    place: place(),
                    message,
                });
                None
            }
        };
        Callback {
            name,
            role,
            argv,
            cwd: loaded.folder.clone(),
            env: spec
                .env
                .iter()
                .filter_map(|name| std::env::var(name).ok().map(|value| (name.clone(), value)))
                .collect(),
            timeout: spec.timeout.0,
            retries: spec.retries,
            params: spec.params.clone(),
            identity: plan::callback_identity(spec),
            limit: Arc::new(Semaphore::new(spec.concurrency.unwrap_or(run_concurrency).max(1))),
            mode: spec.mode,
            sandbox,
            launcher: match remote {
                Some(slurm) => Arc::new(SlurmLauncher(slurm.clone())),
                None => Arc::new(Process::default()),
            },
        }
    };
    let manifest = &loaded.manifest;
    let callbacks = Callbacks {
        compressors: manifest
            .compressors
            .iter()
            .map(|(name, spec)| {
                (
                    name.clone(),
                    build(format!("compressors.{name}"), Role::Compressor, spec),
                )
            })
            .collect(),
        reader: build("reader".into(), Role::Reader, &manifest.reader),
        judge: build("judge".into(), Role::Judge, &manifest.judge),
    };
    if problems.is_empty() {
        Ok((callbacks, confinements))
    } else {
        Err(Invalid(problems).into())
    }
}

/// The Slurm executor when the manifest asks for it, its commands checked.
fn slurm_executor(loaded: &Loaded) -> Result<Option<Arc<Slurm>>, Error> {
    if loaded.manifest.run.executor != manifest::ExecutorKind::Slurm {
        return Ok(None);
    }
    let spec = loaded.manifest.run.slurm.clone().unwrap_or_default();
    let work = loaded.slurm_work_dir().unwrap_or_default();
    let place = format!("{}: key `run.executor`", loaded.path.display());
    Slurm::new(spec, work)
        .map(|slurm| Some(Arc::new(slurm)))
        .map_err(|message| Invalid::one(place, message).into())
}

fn cache_root(loaded: &Loaded) -> PathBuf {
    match &loaded.manifest.run.cache {
        Some(path) => loaded.resolve(path),
        None => PathBuf::from(".gacc/cache"),
    }
}

/// Starts reading an existing cache on a thread of its own (a re-run's cache is large) while
/// the dataset is loaded and planned; nothing is opened for a manifest with problems.
fn open_cache_early(
    options: &RunOptions,
) -> Option<(PathBuf, std::thread::JoinHandle<std::io::Result<Cache>>)> {
    let (loaded, problems) = manifest::load(&options.manifest, &options.sets).ok()?;
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

fn cache_for(loaded: &Loaded) -> Result<Cache, Error> {
    let root = cache_root(loaded);
    Cache::open(&root).map_err(io(&root))
}

/// `gacc validate`: a one-paragraph summary of a valid manifest.
pub fn validate(path: &Path, sets: &[String]) -> Result<String, Error> {
    let prepared = prepare(path, sets)?;
    let dataset = &prepared.dataset;
    Ok(format!(
        "{}: valid: {} sources, {} goals, {} questions; {} memories, {} questions to read and judge",
        path.display(),
        dataset.sources.len(),
        dataset.goals().count(),
        dataset.question_count(),
        prepared.plan.memories.len(),
        prepared.plan.question_jobs(),
    ))
}

/// `gacc dataset stats`: a dataset given directly, or the one a manifest names.
pub fn dataset_stats(path: &Path) -> Result<(String, dataset::Stats), Error> {
    let is_manifest = path.extension().is_some_and(|e| e == "toml");
    let dataset = if is_manifest {
        let (loaded, _) = manifest::load(path, &[])?;
        dataset::load(&loaded).map_err(Invalid)?
    } else {
        dataset::load_path(path).map_err(Invalid)?
    };
    let stats = dataset::stats(&dataset, &crate::inputs::tokenizer::Cl100k::new())
        .map_err(|message| Invalid::one(manifest::shown(path), message))?;
    Ok((manifest::shown(path), stats))
}

/// Jobs per stage and how many the cache already answers.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct StageStatus {
    pub jobs: usize,
    pub cached: usize,
    /// Jobs that need no call (`L = 0` memories).
    pub skipped: usize,
}

/// `gacc plan`: walks the plan through the cache without calling anything.
pub fn plan_status(path: &Path, sets: &[String]) -> Result<BTreeMap<&'static str, StageStatus>, Error> {
    let prepared = prepare(path, sets)?;
    let cache = cache_for(&prepared.loaded)?;
    let plan = &prepared.plan;
    let mut status: BTreeMap<&'static str, StageStatus> = BTreeMap::new();
    let tokenizer = prepared.tokenizer.as_ref();
    let truncation = prepared.loaded.manifest.truncation;
    for job in &plan.memories {
        let source = &prepared.dataset.sources[job.source];
        let compress = status.entry("compress").or_default();
        compress.jobs += 1;
        status.entry("read").or_default().jobs += job.questions.len();
        status.entry("judge").or_default().jobs += job.questions.len();
        let generation = if job.budget == 0 {
            status.entry("compress").or_default().skipped += 1;
            Some(String::new())
        } else {
            cache
                .get(Role::Compressor.as_str(), &job.cache_key)
                .and_then(|r| r.get("memory").and_then(Value::as_str).map(str::to_owned))
        };
        let Some(generation) = generation else {
            continue;
        };
        if job.budget > 0 {
            status.entry("compress").or_default().cached += 1;
        }
        // The memory as a run measured it, else the generation cut here.
        let measured = cache
            .get(
                "memory",
                &runner::memory_key(job, &plan.tokenizer_identity, truncation),
            )
            .and_then(|entry| {
                entry
                    .get("memory_sha256")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            });
        let memory_sha256 = match measured {
            Some(sha256) => sha256,
            None => match truncate_to_budget(tokenizer, &generation, job.budget, truncation) {
                Ok(cut) => sha256(&cut.memory),
                Err(_) => continue,
            },
        };
        for question_job in &job.questions {
            let question = &source.goals[question_job.goal].questions[question_job.question];
            let key = plan::reader_key(
                &plan.reader_identity,
                &memory_sha256,
                &sha256(&question.question),
                job.seed,
            );
            let Some(answer) = cache
                .get(Role::Reader.as_str(), &key)
                .and_then(|r| r.get("answer").and_then(Value::as_str).map(str::to_owned))
            else {
                continue;
            };
            status.entry("read").or_default().cached += 1;
            let hashes = &plan.question_sha256[job.source][question_job.goal][question_job.question];
            let inputs = plan::JudgeInputs {
                source_sha256: &plan.source_sha256[job.source],
                question_sha256: &hashes.question,
                reference_sha256: &hashes.reference,
                answer: &answer,
            };
            if cache.contains(
                Role::Judge.as_str(),
                &plan::judge_key(&plan.judge_identity, &inputs, job.seed),
            ) {
                status.entry("judge").or_default().cached += 1;
            }
        }
    }
    Ok(status)
}

/// How a run is asked for on the command line.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub manifest: PathBuf,
    pub sets: Vec<String>,
    /// Where run folders go instead of `runs/`.
    pub out: Option<PathBuf>,
    /// A folder whose `report.md.j2` replaces the default template.
    pub templates: Option<PathBuf>,
    pub quiet: bool,
    /// Stop starting calls after the first failure.
    pub fail_fast: bool,
    /// Refuse to run a compressor or reader outside its sandbox.
    pub require_sandbox: bool,
}

/// What a finished run left behind.
#[derive(Debug)]
pub struct Finished {
    pub folder: PathBuf,
    pub failures: usize,
    /// Jobs not run because `--fail-fast` stopped the run.
    pub cancelled: usize,
    pub summary: String,
}

/// `gacc run`: plan, run (resuming from the cache), write the run folder, report.
pub fn run(options: &RunOptions) -> Result<Finished, Error> {
    let started_at = SystemTime::now();
    let started = Instant::now();
    let mut phases = Phases::default();
    let opening = open_cache_early(options);
    let prepared = prepare(&options.manifest, &options.sets)?;
    phases.end("prepare (manifest, dataset, tokenizer check, plan)");
    let recount = report::Recount::start(prepared.tokenizer.clone(), &prepared.dataset);
    let manifest = &prepared.loaded.manifest;
    let runs = options
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs"))
        .join(&manifest.name);
    sandbox::protect_self();
    let abi = sandbox::kernel_abi();
    let protected = Protected::of(&prepared.loaded, &cache_root(&prepared.loaded), Some(&runs));
    let sandboxing = Sandboxing::new(abi, protected).map_err(io(&std::env::temp_dir()))?;
    let slurm = slurm_executor(&prepared.loaded)?;
    let (callbacks, confinements) = callbacks(&prepared.loaded, &sandboxing, slurm.as_ref())?;
    let holdout = hold_out(&confinements, options.require_sandbox)?;
    let root = cache_root(&prepared.loaded);
    let cache = match opening {
        Some((early, reading)) if early == root => reading
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the cache reader stopped unexpectedly")))
            .map_err(io(&root))?,
        _ => cache_for(&prepared.loaded)?,
    };
    let template_path = options
        .templates
        .clone()
        .or_else(|| Some(PathBuf::from("templates")).filter(|p| p.join("report.md.j2").is_file()))
        .map(|folder| folder.join("report.md.j2"));
    let (template, template_name) = report::load_template(template_path.as_deref())
        .map_err(|message| Invalid::one("--templates", message))?;

    let folder = new_run_folder(&runs, started_at, &prepared.resolved_sha256)?;
    let _ = crate::trace::open(&folder.join("trace.jsonl"));
    tracing::info!(manifest = %options.manifest.display(), folder = %folder.display(), "run started");
    write(
        &folder.join("manifest.toml"),
        resolved_manifest(&prepared).as_bytes(),
    )?;
    write_json_lines(&folder.join("dataset.jsonl"), &prepared.dataset.sources)?;
    // The plan file is large at scale: write it while the jobs run.
    let plan_writer = {
        let (plan, dataset, path) = (
            prepared.plan.clone(),
            prepared.dataset.clone(),
            folder.join("plan.json"),
        );
        std::thread::spawn(move || write_with(&path, |out| plan.write_json(&dataset, out)))
    };

    let progress = Arc::new(Progress::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(io(Path::new("tokio runtime")))?;
    let inputs = report::Inputs {
        name: &manifest.name,
        description: manifest.description.as_deref(),
        manifest_sha256: &prepared.experiment_sha256,
        seeds: &manifest.seeds,
        ratios: &manifest.ratios,
        conditions: &manifest.conditions,
        callbacks: callback_identities(&prepared.plan),
        dataset: &prepared.dataset,
        tokenizer: prepared.tokenizer.as_ref(),
    };
    let run = runner::Run {
        plan: prepared.plan.clone(),
        dataset: prepared.dataset.clone(),
        callbacks,
        cache,
        tokenizer: prepared.tokenizer.clone(),
        truncation: manifest.truncation,
        concurrency: manifest.run.concurrency,
        progress: progress.clone(),
        fail_fast: options.fail_fast,
        memories: recount.feed(),
    };
    phases.end("write manifest, dataset and plan");
    let outcome = runtime.block_on(async {
        let display = show_progress(progress.clone(), options.quiet);
        let outcome = tokio::select! {
            outcome = runner::execute(run) => Some(outcome),
            _ = tokio::signal::ctrl_c() => None,
        };
        display.abort();
        outcome
    });
    let Some(outcome) = outcome else {
        crate::exec::shutdown();
        tracing::warn!(folder = %folder.display(), "run interrupted");
        crate::trace::close();
        return Err(Error::Interrupted {
            resume: resume_command(options),
        });
    };
    if !options.quiet {
        print_progress(&progress, std::io::stderr().is_terminal(), true);
    }

    if let Some(slurm) = &slurm {
        slurm.finish();
    }
    phases.end("execute jobs");
    // The rows are written on threads of their own while the report is built.
    let stopped = |path: PathBuf| Error::Io {
        path,
        message: "the writer stopped unexpectedly".into(),
    };
    let texts = crate::store::ledger::memory_texts(&outcome.ledger);
    let (written, mut report) = std::thread::scope(|scope| {
        let results = scope.spawn(|| write_json_lines(&folder.join("results.jsonl"), &outcome.results));
        let ledger = scope.spawn(|| {
            write_json_lines(&folder.join("memories.jsonl"), &outcome.ledger)?;
            write_json_lines(&folder.join("memory_texts.jsonl"), &texts)
        });
        let report = report::build(&inputs, &outcome, recount);
        let written = [
            plan_writer
                .join()
                .unwrap_or_else(|_| Err(stopped(folder.join("plan.json")))),
            ledger
                .join()
                .unwrap_or_else(|_| Err(stopped(folder.join("memories.jsonl")))),
            results
                .join()
                .unwrap_or_else(|_| Err(stopped(folder.join("results.jsonl")))),
        ];
        (written, report)
    });
    for result in written {
        result?;
    }
    report.holdout = holdout;
    phases.end("write ledger and results, build report (with the recount)");
    runtime.shutdown_background();
    let report_json = serde_json::to_value(&report).unwrap_or(Value::Null);
    let mut report_text = serde_json::to_string_pretty(&report).unwrap_or_default();
    report_text.push('\n');
    write(&folder.join("report.json"), report_text.as_bytes())?;
    // Charts are a view of the report: one that cannot be drawn is a warning, not a failure.
    if let Err(error) = crate::report::charts::write(&folder, &report_json) {
        tracing::warn!(%error, "could not draw the charts");
    }
    // So is report.html: the page `gacc report` makes from the rows just written, made from
    // the same rows still in memory.
    let rows = crate::report::html::Rows {
        sources: &prepared.dataset.sources,
        ledger: &outcome.ledger,
        texts: &texts,
        results: &outcome.results,
    };
    if let Err(error) =
        crate::report::html::write_rows(&folder, &report_json, rows, crate::report::html::Packing::Auto)
    {
        tracing::warn!(%error, "could not write report.html");
    }
    // The run's rows are no longer needed: they are freed on a thread of their own.
    let (this_run, paid, failures, cancelled) = (
        outcome.this_run.clone(),
        outcome.paid.clone(),
        outcome.failures.len(),
        outcome.cancelled,
    );
    // Not waited for: a process that ends frees them faster.
    std::thread::spawn(move || drop((outcome, texts)));
    phases.end("draw charts and write report.html");
    let run_record = json!({
        "started": utc_timestamp(started_at, true),
        "seconds": started.elapsed().as_secs_f64(),
        "host": hostname(),
        "gacc_version": env!("CARGO_PKG_VERSION"),
        "manifest": options.manifest.display().to_string(),
        "cache": prepared.loaded.manifest.run.cache.as_ref().map(|p| p.display().to_string()).unwrap_or(".gacc/cache".into()),
        "calls": this_run,
        "paid": paid,
        "failures": failures,
        "phases": phases.seconds,
        "landlock_abi": abi,
    });
    write(&folder.join("run.json"), pretty(&run_record).as_bytes())?;
    let markdown = report::render(&template, &template_name, &report_json, &run_record)
        .map_err(|message| Invalid::one("report template", message))?;
    write(&folder.join("report.md"), markdown.as_bytes())?;
    point_latest(&runs, &folder);
    tracing::info!(folder = %folder.display(), failures, "run finished");
    crate::trace::close();
    Ok(Finished {
        summary: summary(&report, &this_run, started.elapsed()),
        failures,
        cancelled,
        folder,
    })
}

/// Per role, whether the hold-out is enforced. A compressor or reader left unsandboxed for
/// any reason but its own `sandbox = false` is warned about once, and is an error under
/// `--require-sandbox` (as is an opt-out).
fn hold_out(
    confinements: &Confinements,
    require_sandbox: bool,
) -> Result<BTreeMap<Role, sandbox::Holdout>, Error> {
    let unsandboxed: Vec<(&str, &str)> = confinements
        .iter()
        .filter(|(role, _, c)| *role != Role::Judge && !c.sandboxed())
        .map(|(_, name, c)| (name.as_str(), c.why.as_deref().unwrap_or("")))
        .collect();
    if require_sandbox && !unsandboxed.is_empty() {
        return Err(Invalid(
            unsandboxed
                .iter()
                .map(|(name, why)| Problem {
                    place: "--require-sandbox".into(),
                    message: format!("`{name}` would run outside its sandbox: {why}"),
                })
                .collect(),
        )
        .into());
    }
    let unexpected: Vec<String> = unsandboxed
        .iter()
        .filter(|(_, why)| *why != "sandbox = false")
        .map(|(name, why)| format!("{name} ({why})"))
        .collect();
    if !unexpected.is_empty() {
        let message = format!(
            "the hold-out is NOT enforced: {} run unsandboxed; --require-sandbox makes this an error",
            unexpected.join(", ")
        );
        eprintln!("warning: {message}");
    }
    Ok(sandbox::holdout(
        confinements
            .iter()
            .map(|(role, name, c)| (*role, name.as_str(), c)),
    ))
}

/// Where a run's time went, phase by phase, for `run.json`.
struct Phases {
    last: Instant,
    seconds: Vec<(String, f64)>,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            last: Instant::now(),
            seconds: Vec::new(),
        }
    }
}

impl Phases {
    fn end(&mut self, name: &str) {
        let now = Instant::now();
        self.seconds
            .push((name.to_owned(), (now - self.last).as_secs_f64()));
        tracing::info!(
            phase = name,
            seconds = (now - self.last).as_secs_f64(),
            "phase finished"
        );
        self.last = now;
    }
}

/// The command line that runs the same experiment again.
fn resume_command(options: &RunOptions) -> String {
    let mut words = vec![
        "gacc".to_owned(),
        "run".to_owned(),
        options.manifest.display().to_string(),
    ];
    for set in &options.sets {
        words.push("--set".into());
        words.push(format!("'{set}'"));
    }
    if let Some(out) = &options.out {
        words.push(format!("--out {}", out.display()));
    }
    words.join(" ")
}

fn callback_identities(plan: &Plan) -> BTreeMap<String, Value> {
    let mut identities: BTreeMap<String, Value> = plan
        .compressor_identities
        .iter()
        .map(|(name, identity)| (format!("compressors.{name}"), identity.clone()))
        .collect();
    identities.insert("reader".into(), plan.reader_identity.clone());
    identities.insert("judge".into(), plan.judge_identity.clone());
    identities
}

fn resolved_manifest(prepared: &Prepared) -> String {
    format!(
        "# The manifest as run: {} with every override applied.\n# Relative paths are relative to that file's folder.\n{}",
        prepared.loaded.path.display(),
        prepared.resolved
    )
}

/// How many failures the terminal summary lists; report.md lists them all.
const LISTED_FAILURES: usize = 10;

fn summary(
    report: &report::Report,
    this_run: &BTreeMap<Role, runner::CallCounts>,
    elapsed: Duration,
) -> String {
    let mut out = String::new();
    for cell in &report.cells {
        out.push_str(&format!(
            "  {:<16} {:<10} r={:<6} Micro {:.3} ± {:.3}  Macro {:.3} ± {:.3}{}\n",
            cell.compressor,
            cell.condition,
            cell.ratio.to_string(),
            cell.micro.mean,
            cell.micro.std,
            cell.macro_.mean,
            cell.macro_.std,
            if cell.complete { "" } else { "  (incomplete)" }
        ));
    }
    let calls: Vec<String> = [Role::Compressor, Role::Reader, Role::Judge]
        .iter()
        .map(|role| {
            let c = this_run.get(role).cloned().unwrap_or_default();
            format!("{role} {} made, {} cached", c.made, c.cached + c.shared)
        })
        .collect();
    out.push_str(&format!("  calls: {}\n", calls.join("; ")));
    let i = &report.integrity;
    out.push_str(&format!(
        "  integrity: exposure {} · budget {} · padding {} · count errors {} · tokenizer {}\n",
        i.exposure_violations,
        i.budget_violations,
        i.padding_tokens,
        i.count_errors,
        if report.tokenizer.identity_verified {
            "verified"
        } else {
            "NOT verified"
        }
    ));
    for failure in report.failures.iter().take(LISTED_FAILURES) {
        out.push_str(&format!(
            "  FAILED {} {} ({}{}): {}\n",
            failure.stage,
            failure.callback,
            failure.source_id,
            failure
                .question_id
                .as_deref()
                .map(|q| format!(", {q}"))
                .unwrap_or_default(),
            failure.reason
        ));
        if let Some(line) = failure.stderr_tail.lines().rev().find(|l| !l.trim().is_empty()) {
            out.push_str(&format!("         stderr: {line}\n"));
        }
    }
    if report.failures.len() > LISTED_FAILURES {
        out.push_str(&format!(
            "  … and {} more failures (all are listed in report.md and report.json)\n",
            report.failures.len() - LISTED_FAILURES
        ));
    }
    if report.cancelled > 0 {
        out.push_str(&format!(
            "  {} jobs not run: --fail-fast stopped the run\n",
            report.cancelled
        ));
    }
    out.push_str(&format!("  finished in {:.1}s", elapsed.as_secs_f64()));
    out
}

fn show_progress(progress: Arc<Progress>, quiet: bool) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if quiet {
            return;
        }
        let terminal = std::io::stderr().is_terminal();
        let every = if terminal {
            Duration::from_millis(250)
        } else {
            Duration::from_secs(10)
        };
        loop {
            tokio::time::sleep(every).await;
            print_progress(&progress, terminal, false);
        }
    })
}

/// Width of the progress bar on a terminal.
const BAR_WIDTH: usize = 24;

/// One progress line: per stage done/total, cache hits and failures; calls per second and the
/// time left. On a terminal it redraws itself with a bar; elsewhere it is a plain line.
fn print_progress(progress: &Progress, terminal: bool, last: bool) {
    let (mut finished, mut total, mut made) = (0, 0, 0);
    let stages: Vec<String> = [
        ("compress", Role::Compressor),
        ("read", Role::Reader),
        ("judge", Role::Judge),
    ]
    .iter()
    .map(|(name, role)| {
        let s = progress.stage(*role);
        let (done, failed, cached) = (
            s.done.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed),
            s.cached.load(Ordering::Relaxed),
        );
        let stage_total = s.total.load(Ordering::Relaxed);
        finished += done + failed;
        total += stage_total;
        made += done.saturating_sub(cached);
        let failed = if failed > 0 {
            format!(", {failed} failed")
        } else {
            String::new()
        };
        format!(
            "{name} {}/{stage_total} ({cached} cached{failed})",
            done + s.failed.load(Ordering::Relaxed)
        )
    })
    .collect();
    let seconds = progress.started.elapsed().as_secs_f64().max(1e-3);
    let rate = made as f64 / seconds;
    let left = total.saturating_sub(finished);
    let eta = if finished == 0 || left == 0 {
        String::new()
    } else {
        let remaining = (left as f64 * seconds / finished as f64) as u64;
        format!(
            " · ETA {}:{:02}:{:02}",
            remaining / 3600,
            remaining / 60 % 60,
            remaining % 60
        )
    };
    let line = format!("{} · {rate:.1} calls/s{eta}", stages.join(" · "));
    let mut stderr = std::io::stderr().lock();
    let _ = if terminal {
        let filled = (BAR_WIDTH * finished).checked_div(total).unwrap_or(BAR_WIDTH);
        let bar = format!("[{}{}]", "#".repeat(filled), ".".repeat(BAR_WIDTH - filled));
        write!(stderr, "\r\x1b[K{bar} {line}{}", if last { "\n" } else { "" })
    } else {
        writeln!(stderr, "{line}")
    };
    let _ = stderr.flush();
}

/// `runs/<name>/<UTC time>-<hash8>`, made new (a suffix keeps two runs in one second apart).
fn new_run_folder(runs: &Path, at: SystemTime, manifest_sha256: &str) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(runs).map_err(io(runs))?;
    let base = format!("{}-{}", utc_timestamp(at, false), &manifest_sha256[..8]);
    for attempt in 0..1000 {
        let name = if attempt == 0 {
            base.clone()
        } else {
            format!("{base}-{attempt}")
        };
        let folder = runs.join(name);
        match std::fs::create_dir(&folder) {
            Ok(()) => return Ok(folder),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(io(&folder)(error)),
        }
    }
    Err(Error::Io {
        path: runs.to_path_buf(),
        message: "could not make a new run folder".into(),
    })
}

/// Points `runs/<name>/latest` at a run folder, replacing the link in one step.
fn point_latest(runs: &Path, folder: &Path) {
    let Some(name) = folder.file_name() else {
        return;
    };
    let temp = runs.join(format!(".latest-{}", std::process::id()));
    let _ = std::fs::remove_file(&temp);
    if std::os::unix::fs::symlink(name, &temp).is_ok() && std::fs::rename(&temp, runs.join("latest")).is_err()
    {
        let _ = std::fs::remove_file(&temp);
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}
