//! `gacc dataset build BUILD.toml` (SPEC §16): a folder of texts made into a dataset whose every
//! question passed the protocol's checks. The writer writes each source's goals and each goal's
//! questions; the checks drop what a whole source cannot answer, what any reader answers
//! without a memory, what a goal gives away, near-copies and evidence not in the source.

mod calls;
mod checks;
mod file;
mod outputs;
mod run;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::error::{Error, Invalid, io, runtime_error};
use crate::exec::engine::Engine;
use crate::exec::model::ModelLauncher;
use crate::exec::sandbox::{self, Protected, Sandboxing};
use crate::protocol::Role;
use crate::store::cache::Cache;

use super::Ended;
use super::prepare::{Keys, Models, cache_root, callback_of, models_with};
use calls::{Calls, Counted, Stopped};
use run::{Context, SourceOutcome};

/// `gacc dataset build`: builds the dataset, or with `dry_run` says what it would call and
/// cost, calling and writing nothing.
pub fn build(path: &Path, dry_run: bool, quiet: bool) -> Result<Ended, Error> {
    let build = Arc::new(file::read(path)?);
    let loaded = &build.loaded;
    let root = cache_root(loaded);
    // A dry run writes nothing: not even an empty cache where there is none.
    let cache = match (dry_run, Cache::exists(&root)) {
        (true, false) => None,
        (true, true) => Some(Cache::open(&root).map_err(io(&root))?.read_only()),
        (false, _) => {
            let cache = Cache::open(&root).map_err(io(&root))?;
            crate::files::probe_writable(&root.join("segments"))?;
            Some(cache)
        }
    };
    let keys = if dry_run { Keys::Planning } else { Keys::Required };
    let models = models_with(loaded, &[&build.writer], keys)?;
    let context = Arc::new(context(&build, &models, cache.clone(), dry_run)?);
    if let Some(cache) = &cache {
        for endpoint in models.endpoints.values() {
            endpoint.use_batches(root.join(super::run::BATCHES), cache.clone());
        }
    }
    let outcomes = execute(&build, &context, &models, quiet)?;
    let counted = context.calls.counted();
    if dry_run {
        println!("{}", preview(&build, &counted));
        return Ok(Ended::Success);
    }
    let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.failure.as_ref()).collect();
    if let Some(stopped) = context.calls.stopped() {
        eprintln!("{}", stopped_message(&stopped, path, &counted));
        return Ok(match stopped {
            Stopped::CostCap(_) => Ended::CostCap,
            _ => Ended::Failed,
        });
    }
    if !failures.is_empty() {
        for failure in &failures {
            eprintln!("error: {failure}");
        }
        eprintln!(
            "{} source(s) could not be built, so nothing was written; every finished call is cached: run `gacc dataset build {}` again to resume",
            failures.len(),
            path.display()
        );
        return Ok(Ended::Failed);
    }
    write(&build, &outcomes, &counted, quiet)
}

/// The build's callbacks, made as a run's are, and what every source shares.
fn context(
    build: &file::Build,
    models: &Models,
    cache: Option<Cache>,
    dry_run: bool,
) -> Result<Context, Error> {
    let loaded = &build.loaded;
    sandbox::protect_self();
    let protected = Protected::of(loaded, &cache_root(loaded), None);
    let sandboxing = Sandboxing::new(sandbox::kernel_abi(), protected).map_err(io(&std::env::temp_dir()))?;
    // The writer and the checks run here: a build is no cluster's work.
    let here: Arc<dyn Engine> = Arc::new(crate::exec::engine::Here);
    let made = (&sandboxing, &here, models);
    let manifest = &loaded.manifest;
    let writer = callback_of(loaded, made, ("build.writer", Role::Writer, &build.writer))?;
    let reader = callback_of(
        loaded,
        made,
        ("build.check.reader", Role::Reader, &manifest.reader),
    )?;
    let judge = callback_of(loaded, made, ("build.check.judge", Role::Judge, &manifest.judge))?;
    let mut pricing = BTreeMap::new();
    for (callback, spec) in [
        (&writer, &build.writer),
        (&reader, &manifest.reader),
        (&judge, &manifest.judge),
    ] {
        let launcher = spec.model.as_ref().and_then(|call| {
            let endpoint = models.endpoints.get(&call.endpoint)?.clone();
            let tokenizer = Arc::new(crate::inputs::tokenizer::Cl100k::new());
            ModelLauncher::new(endpoint, call.clone(), models.costs.clone(), tokenizer).ok()
        });
        if let Some(launcher) = launcher {
            pricing.insert(callback.name.clone(), Arc::new(launcher));
        }
    }
    let seed_term = |spec| crate::plan::keys::seed_rule(spec).key_term(build.seed);
    let writer_seed = serde_json::from_str(&seed_term(&build.writer).to_string()).unwrap_or_default();
    Ok(Context {
        calls: Calls::new(cache, dry_run, manifest.run.concurrency, pricing),
        read_as: (reader.identity.to_string(), seed_term(&manifest.reader)),
        judge_as: (judge.identity.to_string(), seed_term(&manifest.judge)),
        writer_seed,
        writer,
        reader,
        judge,
        seed: build.seed,
        goals_per_source: build.goals_per_source,
        questions_per_goal: build.questions_per_goal,
        keep_closed_book: build.keep_closed_book,
        finished: Default::default(),
    })
}

/// Every source written and checked, a progress line on stderr meanwhile; Ctrl-C or SIGTERM
/// ends the calls in flight (finished ones are cached) and is `Error::Interrupted`.
fn execute(
    build: &Arc<file::Build>,
    context: &Arc<Context>,
    models: &Models,
    quiet: bool,
) -> Result<Vec<SourceOutcome>, Error> {
    let runtime = crate::parallel::runtime(None).map_err(runtime_error)?;
    let total = build.sources.len();
    let outcomes = runtime.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for (at, source) in build.sources.iter().enumerate() {
            let (context, source) = (context.clone(), Arc::new(source.clone()));
            tasks.spawn(async move { (at, run::source(context, source).await) });
        }
        let display = show_progress(context.clone(), models.costs.clone(), total, quiet);
        let all = async {
            let mut outcomes: Vec<Option<SourceOutcome>> = (0..total).map(|_| None).collect();
            while let Some(joined) = tasks.join_next().await {
                if let Ok((at, outcome)) = joined {
                    outcomes[at] = Some(outcome);
                }
            }
            outcomes
        };
        let outcomes = tokio::select! {
            outcomes = all => Some(outcomes),
            _ = tokio::signal::ctrl_c() => None,
            _ = crate::parallel::terminated() => None,
        };
        display.abort();
        outcomes
    });
    runtime.shutdown_background();
    let Some(outcomes) = outcomes else {
        crate::exec::shutdown();
        return Err(Error::Interrupted {
            resume: format!("gacc dataset build {}", build.loaded.path.display()),
        });
    };
    if !quiet && !context.calls.is_dry() && std::io::stderr().is_terminal() {
        eprintln!();
    }
    let missing = || SourceOutcome {
        goals: Vec::new(),
        failure: Some("a source's task ended without its outcome".into()),
    };
    Ok(outcomes.into_iter().map(|o| o.unwrap_or_else(missing)).collect())
}

/// The progress line: sources finished, calls made and cached per role, the cost so far.
fn show_progress(
    context: Arc<Context>,
    costs: Arc<crate::exec::model::CostGuard>,
    total: usize,
    quiet: bool,
) -> tokio::task::JoinHandle<()> {
    let quiet = quiet || context.calls.is_dry();
    super::terminal::show_every(quiet, move |terminal| {
        let counted = context.calls.counted();
        let calls: Vec<String> = [Role::Writer, Role::Reader, Role::Judge]
            .into_iter()
            .map(|role| {
                let c = counted.get(&role).cloned().unwrap_or_default();
                format!("{role} {} made, {} cached", c.made, c.cached)
            })
            .collect();
        let line = format!(
            "build: sources {}/{total} · {} · ${:.4}",
            context.finished.load(Ordering::Relaxed),
            calls.join(" · "),
            costs.paid()
        );
        match terminal {
            true => eprint!("\r\x1b[2K{line}"),
            false => eprintln!("{line}"),
        }
    })
}

/// The dry run's preview: the calls the cache lacks, per role, and the most they would cost.
fn preview(build: &file::Build, counted: &BTreeMap<Role, Counted>) -> String {
    let mut out = format!(
        "dry run of {}: {} source(s), {} goal(s) each, {} question(s) a goal; nothing called, nothing written\n",
        build.loaded.path.display(),
        build.sources.len(),
        build.goals_per_source,
        build.questions_per_goal
    );
    let mut most = 0.0;
    for role in [Role::Writer, Role::Reader, Role::Judge] {
        let c = counted.get(&role).cloned().unwrap_or_default();
        most += c.most_usd;
        out.push_str(&format!(
            "  {role}: {} call(s) to make at most, {} in the cache (at most ${:.4})\n",
            c.wanted, c.cached, c.most_usd
        ));
    }
    out.push_str(&format!(
        "  at most ${most:.4} at the [models.*] prices (reads and judgements counted for every question, as if each passed the checks before)"
    ));
    out
}

fn stopped_message(stopped: &Stopped, path: &Path, counted: &BTreeMap<Role, Counted>) -> String {
    let paid: f64 = counted.values().map(|c| c.paid_usd).sum();
    let why = match stopped {
        Stopped::CostCap(cap) => format!(
            "stopped: the next calls could take the build past max_cost_usd = {cap} (${paid:.4} paid)"
        ),
        Stopped::Refused(why) => format!("stopped: {why}"),
        Stopped::LostWrite(why) => format!("stopped: {why}"),
    };
    format!(
        "{why}\nnothing was written; every finished call is cached: run `gacc dataset build {}` again to resume",
        path.display()
    )
}

/// Writes the report, the dropped rows and then the dataset, and says what was built.
fn write(
    build: &file::Build,
    outcomes: &[SourceOutcome],
    counted: &BTreeMap<Role, Counted>,
    quiet: bool,
) -> Result<Ended, Error> {
    if let Some(folder) = build.out.parent() {
        std::fs::create_dir_all(folder).map_err(io(folder))?;
    }
    let (report, dropped) = (build.beside(file::REPORT), build.beside(file::DROPPED));
    crate::files::write(&report, outputs::report(build, outcomes, counted).as_bytes())?;
    crate::files::write(&dropped, &outputs::dropped(build, outcomes))?;
    let (_, all) = outputs::counts(outcomes);
    // A dataset of no question is no dataset: the report and the dropped rows say why.
    if all.kept > 0 {
        crate::files::write(&build.out, &outputs::dataset(build, outcomes))?;
    }
    let made: usize = counted.values().map(|c| c.made).sum();
    let cached: usize = counted.values().map(|c| c.cached).sum();
    let paid: f64 = counted.values().map(|c| c.paid_usd).sum();
    if !quiet {
        let reasons: Vec<String> = (all.dropped.iter())
            .map(|(r, n)| format!("{n} {}", r.as_str()))
            .collect();
        eprintln!(
            "built {}: {} of {} questions kept in {} goals (dropped: {}); {made} call(s) made, {cached} cached, ${paid:.4} paid\nreport: {}",
            build.out.display(),
            all.kept,
            all.written,
            all.goals_kept,
            if reasons.is_empty() {
                "none".to_owned()
            } else {
                reasons.join(", ")
            },
            report.display()
        );
    }
    if all.kept == 0 {
        return Err(Invalid::one(
            build.out.display().to_string(),
            format!(
                "no question passed the checks, so no dataset was written: {} says why each was dropped",
                dropped.display()
            ),
        )
        .into());
    }
    println!("{}", build.out.display());
    Ok(Ended::Success)
}
