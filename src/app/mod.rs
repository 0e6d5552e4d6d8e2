//! The commands, one function each over the stages below: what `main` calls. Each prints what
//! its command prints and says how it ended; errors are `Error`, which `main` turns into a
//! message and an exit status.

pub mod bench;
pub mod build;
mod check;
mod confinement;
mod init;
mod power;
pub(crate) mod prepare;
mod preview;
mod report;
mod run;
mod terminal;
mod travel;
mod verify;
mod view;

use std::path::Path;

use crate::error::{Error, io};
pub use crate::exec::sandbox::SANDBOX_EXEC;
use crate::review::trace::Filter;
use crate::store::run_folder::resolve;

pub use power::{PowerAsked, plan};
pub use report::{Tables, report, report_tables};
pub use run::{Layer, RunOptions};
pub use terminal::init_tracing;
pub use travel::{pack, unpack};
pub use verify::{SpotChecks, verify};
pub use view::{Address, view};

/// How a command that did its work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Exit status 0.
    Success,
    /// Exit status 1: a run finished with failed jobs, or `diff --fail-on-regression` found one.
    Failed,
    /// Exit status 3: `[run] max_cost_usd` stopped the run (SPEC §8).
    CostCap,
}

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// Raises the soft limit on open files to the hard limit (at most 65,536): each call in flight
/// to a model endpoint holds a connection, and `max_concurrency` defaults to 1,024, the soft
/// limit of many systems.
fn raise_open_files() {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit read and write only the struct passed.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
                let wanted = limit.rlim_max.min(65_536);
                if limit.rlim_cur < wanted {
                    limit.rlim_cur = wanted;
                    let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
                }
            }
        }
    }
}

/// Where past runs are looked for when `--runs` is not given.
pub fn default_runs() -> std::path::PathBuf {
    crate::inputs::manifest::default_runs()
}

/// `gacc run`: prints the summary on stderr (unless quiet) and the run folder on stdout.
pub fn run(options: &RunOptions) -> Result<Ended, Error> {
    raise_open_files();
    let finished = run::run(options)?;
    if !options.quiet {
        eprintln!("{}", finished.summary);
    }
    if options.json {
        print!("{}", crate::files::pretty(&finished.summary_json));
    } else {
        println!("{}", finished.folder.display());
    }
    finished.views?;
    match &finished.stop {
        // Said when it happened, with what was kept.
        Some(crate::runner::Stop::LostWrite { .. }) => return Ok(Ended::Failed),
        Some(stop @ crate::runner::Stop::CostCap(_)) => {
            eprintln!("{stop}");
            return Ok(Ended::CostCap);
        }
        Some(stop) => eprintln!("{stop}"),
        None => {}
    }
    if finished.failures + finished.cancelled > 0 {
        // A greedy judge's reply without a verdict comes back the same: no re-run fixes it.
        let repeating = match finished.repeating {
            0 => String::new(),
            n if n == finished.failures => format!(
                " (each a judge's reply without a verdict at temperature 0: {})",
                crate::exec::model::verdict::SAME_AGAIN
            ),
            n => format!(
                " ({n} of them a judge's reply without a verdict at temperature 0: {})",
                crate::exec::model::verdict::SAME_AGAIN
            ),
        };
        eprintln!(
            "{} job(s) failed{repeating}; finished work is cached: fix the callback and run the same command again to finish the rest",
            finished.failures
        );
        return Ok(Ended::Failed);
    }
    Ok(Ended::Success)
}

/// `gacc validate`.
pub fn validate(manifest: &Path, sets: &[String]) -> Result<Ended, Error> {
    println!("{}", preview::validate(manifest, sets)?);
    Ok(Ended::Success)
}

/// `gacc dataset stats`.
pub fn dataset_stats(path: &Path, format: Format) -> Result<Ended, Error> {
    let (shown, stats) = preview::dataset_stats(path)?;
    terminal::print_dataset_stats(&shown, &stats, format);
    Ok(Ended::Success)
}

/// `gacc dataset convert IN OUT`: the dataset in the other shape.
pub fn dataset_convert(input: &Path, output: &Path) -> Result<Ended, Error> {
    use crate::inputs::{dataset, table};
    if table::is_parquet(output) {
        return Err(crate::error::Invalid::one(
            output.display().to_string(),
            "gacc dataset convert writes CSV or JSON Lines (it reads Parquet): name the output .csv or .jsonl",
        )
        .into());
    }
    let loaded = dataset::load_path(input).map_err(crate::error::Invalid)?;
    let bytes = if dataset::is_table_path(input) {
        dataset::nested_jsonl(&loaded)
    } else {
        let csv = output.extension().is_some_and(|e| e == "csv");
        table::write(&loaded.sources, &table::Columns::default(), csv)
            .map_err(|message| crate::error::Invalid::one(output.display().to_string(), message))?
    };
    crate::files::write(output, &bytes)?;
    Ok(Ended::Success)
}

/// `gacc cache stats`.
pub fn cache_stats(path: &Path, format: Format) -> Result<Ended, Error> {
    let stats = crate::store::cache::Cache::stats(path).map_err(io(path))?;
    terminal::print_cache_stats(path, &stats, format);
    Ok(Ended::Success)
}

/// `gacc bench`: prints each measurement and writes them to `bench.json` in `folder`.
pub fn bench(
    folder: &Path,
    shape: &bench::Shape,
    spawns: usize,
    against: Option<bench::Baseline>,
) -> Result<Ended, Error> {
    let measurements = bench::bench(folder, shape, spawns, against)?;
    for m in &measurements {
        println!("{:<62} {:>9.3} {:<2}  {}", m.name, m.value, m.unit, m.detail);
    }
    crate::files::write(
        &folder.join("bench.json"),
        crate::files::pretty(&measurements).as_bytes(),
    )?;
    Ok(Ended::Success)
}

/// `gacc diff A B` (each a folder, `latest` or `-N` of the runs under `runs`).
pub fn diff(
    runs: &Path,
    a: &Path,
    b: &Path,
    format: Format,
    fail_on_regression: bool,
) -> Result<Ended, Error> {
    let (a, b) = (resolve(a, runs)?, resolve(b, runs)?);
    let diff = crate::review::diff::diff(a.path(), b.path())?;
    match format {
        Format::Json => terminal::emit(&crate::files::pretty(&diff)),
        Format::Text => terminal::emit(&crate::review::diff::render(
            &diff,
            std::io::IsTerminal::is_terminal(&std::io::stdout()),
        )),
    }
    if fail_on_regression && diff.regressions > 0 {
        eprintln!("{} cell(s) regressed", diff.regressions);
        return Ok(Ended::Failed);
    }
    Ok(Ended::Success)
}

/// `gacc trace RUN`.
pub fn trace(runs: &Path, run: &Path, filter: &Filter, format: Format) -> Result<Ended, Error> {
    let review = crate::review::trace::review(resolve(run, runs)?.path(), filter)?;
    match format {
        Format::Json => terminal::emit(&crate::files::pretty(&review)),
        Format::Text => terminal::emit(&crate::review::trace::render(&review, filter)),
    }
    Ok(Ended::Success)
}

/// `gacc runs list`: every run under `runs`, oldest first, numbered back from the newest.
pub fn runs_list(runs: &Path, format: Format) -> Result<Ended, Error> {
    let all = crate::review::runs::list(runs);
    match format {
        Format::Json => terminal::emit(&crate::files::pretty(&all)),
        Format::Text => terminal::emit(&crate::review::runs::render_list(&all)),
    }
    Ok(Ended::Success)
}

/// `gacc runs show RUN`.
pub fn runs_show(runs: &Path, run: &Path, format: Format) -> Result<Ended, Error> {
    let folder = resolve(run, runs)?;
    match format {
        Format::Json => terminal::emit(&crate::files::pretty(&crate::review::runs::summarize(&folder))),
        Format::Text => terminal::emit(&crate::review::runs::render_show(&folder)?),
    }
    Ok(Ended::Success)
}

/// `gacc export RUN`: its question rows (or memory rows) on stdout, or into `out`.
pub fn export(
    runs: &Path,
    run: &Path,
    csv: bool,
    (memories, pairs): (bool, bool),
    out: Option<&Path>,
) -> Result<Ended, Error> {
    use crate::review::export::{Table, read, write, write_pairs};
    let table = if csv { Table::Csv } else { Table::JsonLines };
    if pairs {
        let text = write_pairs(&resolve(run, runs)?, table)?;
        match out {
            Some(path) => crate::files::write(path, text.as_bytes())?,
            None => terminal::emit(&text),
        }
        return Ok(Ended::Success);
    }
    let rows = read(&resolve(run, runs)?, memories)?;
    match out {
        Some(path) => crate::files::write_with(path, |file| write(&rows, table, memories, file))?,
        None => {
            let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
            match write(&rows, table, memories, &mut stdout) {
                // A reader that went away (`| head`) is not an error.
                Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => {
                    return Err(io(Path::new("stdout"))(error));
                }
                _ => {}
            }
        }
    }
    Ok(Ended::Success)
}

/// `gacc export RUN --for-labelling N`: a sample of a run's answers to label by hand.
pub fn export_for_labelling(
    runs: &Path,
    run: &Path,
    count: usize,
    out: Option<&Path>,
) -> Result<Ended, Error> {
    use crate::review::export::write_for_labelling;
    let folder = resolve(run, runs)?;
    let mut text = Vec::new();
    write_for_labelling(&folder, count, &mut text)?;
    match out {
        Some(path) => crate::files::write_with(path, |file| std::io::Write::write_all(file, &text))?,
        None => terminal::emit(&String::from_utf8_lossy(&text)),
    }
    Ok(Ended::Success)
}

/// `gacc completions SHELL`: the completion script of `command` for bash, zsh or fish.
pub fn completions(command: &mut clap::Command, shell: clap_complete::Shell) -> Result<Ended, Error> {
    let mut script = Vec::new();
    clap_complete::generate(shell, command, "gacc", &mut script);
    terminal::emit(&String::from_utf8_lossy(&script));
    Ok(Ended::Success)
}

/// Which schema `gacc schema` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    Manifest,
    Report,
}

/// The JSON Schema (draft 2020-12) of a manifest or of `report.json`, made from the types
/// that read and write them, so it cannot drift from them.
pub fn schema_text(which: Schema) -> String {
    let mut schema = match which {
        Schema::Manifest => schemars::schema_for!(crate::inputs::manifest::Manifest),
        Schema::Report => schemars::schema_for!(crate::report::Report),
    };
    let (title, description) = match which {
        Schema::Manifest => (
            "gacc manifest",
            "A gacc experiment (SPEC §2): the TOML file `gacc run` takes.",
        ),
        Schema::Report => (
            "gacc report.json",
            "The aggregate of a gacc run, schema gacc.report/1 (SPEC §5).",
        ),
    };
    if let Schema::Manifest = which {
        with_engines(&mut schema);
    }
    schema.insert("title".into(), title.into());
    schema.insert("description".into(), description.into());
    crate::files::pretty(&schema)
}

/// A manifest's `[run]` as the engines' registry reads it: `executor` one of the engines'
/// names, and each engine's own table (`[run.<engine>]`) with the engine's schema; no other key.
fn with_engines(schema: &mut schemars::Schema) {
    let mut tables = Vec::new();
    let mut definitions = serde_json::Map::new();
    for (name, mut engine) in crate::exec::engine_schemas() {
        // An engine's schema is a document of its own: its definitions join the manifest's.
        if let Some(serde_json::Value::Object(own)) = engine.remove("$defs") {
            definitions.extend(own);
        }
        engine.remove("$schema");
        tables.push((name, engine.to_value()));
    }
    if let Some(all) = schema.pointer_mut("/$defs").and_then(|d| d.as_object_mut()) {
        all.extend(definitions);
    }
    let Some(run) = schema
        .pointer_mut("/$defs/RunSpec")
        .and_then(|r| r.as_object_mut())
    else {
        return;
    };
    if let Some(properties) = run.get_mut("properties").and_then(|p| p.as_object_mut()) {
        if let Some(executor) = properties.get_mut("executor").and_then(|e| e.as_object_mut()) {
            executor.insert("enum".into(), crate::exec::engine_names().into());
        }
        properties.extend(tables.into_iter().map(|(name, table)| (name.to_owned(), table)));
    }
    run.insert("additionalProperties".into(), false.into());
}

/// `gacc schema manifest|report`.
pub fn schema(which: Schema) -> Result<Ended, Error> {
    terminal::emit(&schema_text(which));
    Ok(Ended::Success)
}

/// `gacc init [DIR]`: a new experiment, and what to do next.
pub fn init(folder: &Path) -> Result<Ended, Error> {
    let written = init::init(folder, init::installed_helper().unwrap_or(init::Helper::Copied))?;
    for path in &written.paths {
        println!("{}", path.display());
    }
    match &written.helper {
        init::Helper::Installed { module, python } => eprintln!(
            "the compressor imports the installed helper ({}), run by {}",
            module.display(),
            python.display()
        ),
        init::Helper::Copied => eprintln!(
            "the compressor imports the helper copied beside it (python3 cannot import an installed gacc_callback)"
        ),
    }
    eprintln!(
        "run it: gacc run {} (from any folder: its runs and cache stay in {})\nthen change data/sources.jsonl and compress.py (see README.md there)",
        folder.join("experiment.toml").display(),
        folder.display()
    );
    Ok(Ended::Success)
}

/// `gacc callback [NAME]`: serves a built-in over stdin/stdout, or lists them; the exit status.
pub fn callback(name: Option<&str>) -> u8 {
    match name {
        Some(name) => crate::builtin::serve(name).clamp(0, 255) as u8,
        None => {
            terminal::print_builtins();
            0
        }
    }
}

/// `gacc callback check MANIFEST [NAME]`: every callback (or one) sent synthetic requests in
/// the sandbox and mode of a run; fails when one of them does.
pub fn callback_check(
    manifest: &Path,
    sets: &[String],
    name: Option<&str>,
    format: Format,
) -> Result<Ended, Error> {
    check::check(manifest, sets, name, format == Format::Json)
}

/// The cache a `gacc batches` argument names: a cache folder, or a manifest's `[run] cache`.
fn batches_cache(path: &Path) -> Result<std::path::PathBuf, Error> {
    if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
        let (loaded, _) = crate::inputs::manifest::load(path, &[])?;
        return Ok(prepare::cache_root(&loaded));
    }
    Ok(path.to_owned())
}

/// `gacc batches list [CACHE|MANIFEST]`: every provider batch the cache recorded.
pub fn batches_list(cache: &Path, format: Format) -> Result<Ended, Error> {
    let cache = &batches_cache(cache)?;
    let records = crate::exec::model::batch::records(&cache.join(run::BATCHES));
    terminal::print_batches(cache, &records, format);
    Ok(Ended::Success)
}

/// `gacc batches cancel [CACHE|MANIFEST]`: cancels every batch still open; fails if one cannot be.
pub fn batches_cancel(cache: &Path) -> Result<Ended, Error> {
    let cache = &batches_cache(cache)?;
    let records = crate::exec::model::batch::records(&cache.join(run::BATCHES));
    let open: Vec<_> = records.into_iter().filter(|r| r.cancellable()).collect();
    if open.is_empty() {
        terminal::emit(&format!("{}: no batch is open\n", cache.display()));
        return Ok(Ended::Success);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(crate::error::runtime_error)?;
    let client = crate::exec::model::http_client(std::time::Duration::from_secs(120)).map_err(|message| {
        Error::Start {
            what: "the HTTP client",
            message,
        }
    })?;
    let mut failed = 0;
    for record in &open {
        let id = record.batch_id.as_deref().unwrap_or("?");
        match runtime.block_on(crate::exec::model::batch::cancel(record, &client)) {
            Ok(()) => terminal::emit(&format!(
                "cancelled {id} ({} requests, endpoint `{}`)\n",
                record.keys.len(),
                record.endpoint
            )),
            Err(message) => {
                failed += 1;
                eprintln!(
                    "could not cancel {id} (endpoint `{}`): {message}",
                    record.endpoint
                );
            }
        }
    }
    terminal::emit("the next `gacc run` collects what they finished and submits the rest again once\n");
    Ok(if failed > 0 { Ended::Failed } else { Ended::Success })
}

/// `gacc array-task ARRAY`: the calls of one task of an array a cluster engine submitted;
/// the exit status.
pub fn array_task(batch: &Path, task: Option<usize>) -> u8 {
    match crate::exec::array_task(batch, task) {
        Ok(made) => {
            eprintln!("gacc array-task: {made} call(s) made");
            0
        }
        Err(message) => {
            eprintln!("gacc array-task: {}: {message}", batch.display());
            1
        }
    }
}

/// `gacc sandbox-exec …`: a sandboxed callback's first step; the exit status if it returns.
pub fn sandbox_exec(args: &[std::ffi::OsString]) -> u8 {
    crate::exec::sandbox::exec(args)
}

/// The trace review's filter, built from the command line.
pub fn trace_filter(stage: Option<String>, callback: Option<String>, job: Option<String>) -> Filter {
    Filter { stage, callback, job }
}
