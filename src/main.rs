//! The `gacc` command line: parses arguments, calls one command of `gacc::app`, and maps how it
//! ended to an exit status (0 success, 1 failed jobs, 2 bad input, 3 stopped at the spending cap, 130 interrupted).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use gacc::app::{self, Ended, Format, RunOptions};
use gacc::error::Error;

// A million small allocations across worker threads fragment glibc's arenas (measured: a
// cached paper-scale re-run peaked at 2.9 GB with it, and far less with mimalloc).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "gacc",
    version,
    about = "Goal-conditioned compression experiments (GACC-Bench)"
)]
struct Cli {
    /// More detail on the terminal (-v retries and failed jobs, -vv every job, -vvv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// No progress or summary on the terminal.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Where past runs are found for `latest` and -N (the folder `run --out` writes to); by
    /// default `runs/` here, else that of the nearest project folder (holding `.gacc/`) up.
    #[arg(long, global = true, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    runs: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan, run (resuming from the cache) and report; prints the run folder.
    Run {
        #[arg(value_hint = clap::ValueHint::FilePath)]
        manifest: PathBuf,
        /// Override a manifest value: key.path=value (value read as TOML, else a string).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Where run folders go (default: runs/).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// A folder whose report.md.j2 replaces the built-in template (default: templates/ if present).
        #[arg(long, value_name = "DIR")]
        templates: Option<PathBuf>,
        /// Start no new call after the first failure (finished work is kept and reported).
        #[arg(long, conflicts_with = "keep_going")]
        fail_fast: bool,
        /// Run every job whatever fails (the default).
        #[arg(long)]
        keep_going: bool,
        /// Refuse to run (exit 2) unless every compressor and reader runs in its sandbox.
        #[arg(long)]
        require_sandbox: bool,
        /// Where calls run: local or slurm (the same as --set run.executor=…).
        #[arg(long, value_name = "EXECUTOR")]
        executor: Option<String>,
        /// Print the final summary as one JSON object on stdout (progress stays on stderr).
        #[arg(long)]
        json: bool,
    },
    /// The job graph's size per stage and how much is cached, without calling anything.
    Plan {
        #[arg(value_hint = clap::ValueHint::FilePath)]
        manifest: PathBuf,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check a manifest and its dataset, reporting every problem.
    Validate {
        #[arg(value_hint = clap::ValueHint::FilePath)]
        manifest: PathBuf,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
    /// Re-render the report of a finished run.
    Report {
        /// A run folder, `latest`, or -N (the N-th newest run).
        #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
        run_dir: PathBuf,
        /// Render this template to stdout instead of rewriting report.md.
        #[arg(long, value_name = "FILE")]
        template: Option<PathBuf>,
    },
    /// What changed between two runs: settings, per-cell metrics with paired tests, flipped
    /// questions. Exit 0 either way, unless --fail-on-regression.
    Diff {
        /// A run folder, a `latest` link, a report.json, `latest`, or -N (the N-th newest run).
        #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
        run_a: PathBuf,
        #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
        run_b: PathBuf,
        /// markdown (the default) or json.
        #[arg(long, default_value = "markdown")]
        format: DiffFormat,
        /// Exit 1 when a cell of B is significantly worse than A.
        #[arg(long)]
        fail_on_regression: bool,
    },
    /// Review a run's trace: slowest calls, failures, latency per callback, cache hits per stage.
    Trace {
        /// A run folder, `latest`, or -N (the N-th newest run).
        #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
        run_dir: PathBuf,
        /// Only this stage (compress, read, judge).
        #[arg(long)]
        stage: Option<String>,
        /// Only this callback (e.g. reader, judge, compressors.NAME).
        #[arg(long)]
        callback: Option<String>,
        /// One job's whole story: every event of this job or cache key (a prefix will do).
        #[arg(long, value_name = "KEY")]
        job: Option<String>,
        /// markdown-ish text (the default) or json.
        #[arg(long, default_value = "text")]
        format: TraceFormat,
    },
    /// Make the calls of one array task on a cluster node (run by the tasks gacc submits; `worker` is its
    /// name in arrays an earlier gacc submitted).
    #[command(name = "array-task", alias = "worker", hide = true)]
    ArrayTask {
        /// The array's folder in the engine's work folder (`batches/<array>`).
        array: PathBuf,
        /// The array task (default: the index the cluster gives the task in its environment).
        #[arg(long)]
        task: Option<usize>,
    },
    /// The provider batches of a cache (SPEC §9): list them, or cancel the open ones.
    Batches {
        #[command(subcommand)]
        command: Option<BatchesCommand>,
    },
    /// Check a manifest's callbacks (`callback check`), run a built-in over the protocol on
    /// stdin/stdout (`callback NAME`), or list the built-ins (`callback`).
    Callback {
        #[command(subcommand)]
        command: Option<CallbackCommand>,
    },
    /// Measure gacc on a paper-scale synthetic experiment with trivial callbacks.
    Bench {
        /// Where the synthetic experiment, its cache and runs go (replaced).
        #[arg(long, default_value = "target/gacc-bench")]
        folder: PathBuf,
        /// Sources (281 in the paper's design).
        #[arg(long, default_value_t = 281)]
        sources: usize,
        #[arg(long, default_value_t = 500)]
        goals: usize,
        #[arg(long, default_value_t = 2571)]
        questions: usize,
        #[arg(long, default_value_t = 10)]
        compressors: usize,
        /// Tokens per source.
        #[arg(long, default_value_t = 8000)]
        tokens: usize,
        /// Calls in flight.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Spawns for the oneshot-overhead comparison.
        #[arg(long, default_value_t = 2000)]
        spawns: usize,
    },
    /// Past runs under --runs (default runs/): list them, or show one.
    Runs {
        #[command(subcommand)]
        command: Option<RunsCommand>,
    },
    /// A run's rows as one table: a row per question (or per memory), CSV or JSON Lines.
    Export {
        /// A run folder, `latest`, or -N (the N-th newest run).
        #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
        run_dir: PathBuf,
        /// csv or jsonl.
        #[arg(long, default_value = "csv")]
        format: ExportFormat,
        /// One row per memory (its ledger fields and text) instead of one per question.
        #[arg(long)]
        memories: bool,
        /// A fixed sample of N distinct answers as a CSV to label by hand (`correct` left empty),
        /// which `[audit] labels` reads back.
        #[arg(long, value_name = "N", conflicts_with_all = ["memories", "format"])]
        for_labelling: Option<usize>,
        /// Write to this file instead of stdout.
        #[arg(short, long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
        output: Option<PathBuf>,
    },
    /// Print the JSON Schema of a manifest (for editors: `#:schema` in Even Better TOML / taplo)
    /// or of report.json.
    Schema { which: SchemaKind },
    /// Start a new experiment in DIR (default: the current folder): a manifest, a small
    /// dataset and a Python compressor, ready to run. Never overwrites a file.
    Init {
        #[arg(default_value = ".", value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
    },
    /// Print a completion script for bash, zsh or fish (e.g. `gacc completions bash > /etc/bash_completion.d/gacc`).
    Completions { shell: clap_complete::Shell },
    /// Look at a cache.
    Cache {
        #[command(subcommand)]
        command: CacheCommand,
    },
    /// Look at a dataset.
    Dataset {
        #[command(subcommand)]
        command: DatasetCommand,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum TraceFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum DiffFormat {
    Markdown,
    Json,
}

/// `--json` or not.
fn format(json: bool) -> Format {
    if json { Format::Json } else { Format::Text }
}

#[derive(Subcommand)]
enum RunsCommand {
    /// Every run, newest last: time, experiment, manifest hash, cells, Micro and Macro range,
    /// failures, cost, calls made and cached.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// One run: its summary and every cell.
    Show {
        /// A run folder, `latest`, or -N (the N-th newest run).
        #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
        run_dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SchemaKind {
    Manifest,
    Report,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ExportFormat {
    Csv,
    Jsonl,
}

#[derive(Subcommand)]
enum CacheCommand {
    /// Entries per kind, segments and bytes.
    Stats {
        /// The cache folder.
        #[arg(default_value = ".gacc/cache")]
        path: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum BatchesCommand {
    /// The provider batches a cache recorded, open and ended (the default).
    List {
        /// The cache folder, or a manifest (its `[run] cache`).
        #[arg(default_value = ".gacc/cache")]
        path: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Cancel every batch still open at its provider (its finished requests stay paid for and
    /// are collected by the next run; the rest are submitted again once).
    Cancel {
        /// The cache folder, or a manifest (its `[run] cache`).
        #[arg(default_value = ".gacc/cache")]
        path: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum CallbackCommand {
    /// Before a paid run: send each callback of MANIFEST (or only NAME) synthetic requests
    /// that cover the protocol's edge cases, in the sandbox, environment and mode of a run,
    /// and report what works, protocol violations, latency and what the sandbox blocked.
    Check {
        #[arg(value_hint = clap::ValueHint::FilePath)]
        manifest: PathBuf,
        /// One callback: `compressors.NAME` (or NAME), `reader` or `judge`.
        name: Option<String>,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// A built-in callback's name: serve it over the protocol on stdin/stdout.
    #[command(external_subcommand)]
    Serve(Vec<String>),
}

#[derive(Subcommand)]
enum DatasetCommand {
    /// Sources, goals, questions, and cl100k_base tokens per source (min/median/max).
    Stats {
        /// A JSON Lines file, a folder of them, a glob pattern, or a manifest.
        path: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a dataset in the other shape: nested sources (JSON Lines) as a question table
    /// (CSV when OUTPUT ends in .csv, else JSON Lines), or a question table as nested sources.
    Convert { input: PathBuf, output: PathBuf },
}

fn main() -> ExitCode {
    // A sandboxed callback's first step, before anything else (no parsing, no tracing).
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == app::SANDBOX_EXEC) {
        return ExitCode::from(app::sandbox_exec(&args[2..]));
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Callback {
            command: Some(CallbackCommand::Serve(name)),
        } => ExitCode::from(app::callback(name.first().map(String::as_str))),
        Command::Callback { command: None } => ExitCode::from(app::callback(None)),
        Command::ArrayTask { array, task } => ExitCode::from(app::array_task(&array, task)),
        command => {
            app::init_tracing(cli.verbose, cli.quiet);
            let runs = cli.runs.unwrap_or_else(gacc::app::default_runs);
            exit_status(dispatch(command, cli.quiet, &runs))
        }
    }
}

/// One arm per subcommand, each passing its options to `app`: a table, kept whole so every
/// command's wiring reads in one place (hence its length).
fn dispatch(command: Command, quiet: bool, runs: &std::path::Path) -> Result<Ended, Error> {
    match command {
        Command::Run {
            manifest,
            sets,
            out,
            templates,
            fail_fast,
            keep_going: _,
            require_sandbox,
            executor,
            json,
        } => app::run(&RunOptions {
            manifest,
            sets: sets
                .into_iter()
                .chain(executor.map(|e| format!("run.executor={e}")))
                .collect(),
            out,
            templates,
            quiet,
            fail_fast,
            require_sandbox,
            json,
        }),
        Command::Plan { manifest, sets, json } => app::plan(&manifest, &sets, format(json)),
        Command::Validate { manifest, sets } => app::validate(&manifest, &sets),
        Command::Report { run_dir, template } => app::report(runs, &run_dir, template.as_deref()),
        Command::Dataset {
            command: DatasetCommand::Stats { path, json },
        } => app::dataset_stats(&path, format(json)),
        Command::Dataset {
            command: DatasetCommand::Convert { input, output },
        } => app::dataset_convert(&input, &output),
        Command::Batches { command } => match command.unwrap_or(BatchesCommand::List {
            path: PathBuf::from(".gacc/cache"),
            json: false,
        }) {
            BatchesCommand::List { path, json } => app::batches_list(&path, format(json)),
            BatchesCommand::Cancel { path } => app::batches_cancel(&path),
        },
        Command::Cache {
            command: CacheCommand::Stats { path, json },
        } => app::cache_stats(&path, format(json)),
        Command::Bench {
            folder,
            sources,
            goals,
            questions,
            compressors,
            tokens,
            concurrency,
            spawns,
        } => {
            let shape = app::bench::Shape {
                sources,
                goals,
                questions,
                compressors,
                source_tokens: tokens,
                concurrency,
                ..Default::default()
            };
            app::bench(&folder, &shape, spawns)
        }
        Command::Diff {
            run_a,
            run_b,
            format,
            fail_on_regression,
        } => {
            let format = match format {
                DiffFormat::Markdown => Format::Text,
                DiffFormat::Json => Format::Json,
            };
            app::diff(runs, &run_a, &run_b, format, fail_on_regression)
        }
        Command::Trace {
            run_dir,
            stage,
            callback,
            job,
            format,
        } => {
            let format = match format {
                TraceFormat::Text => Format::Text,
                TraceFormat::Json => Format::Json,
            };
            app::trace(runs, &run_dir, &app::trace_filter(stage, callback, job), format)
        }
        Command::Runs { command } => match command.unwrap_or(RunsCommand::List { json: false }) {
            RunsCommand::List { json } => app::runs_list(runs, format(json)),
            RunsCommand::Show { run_dir, json } => app::runs_show(runs, &run_dir, format(json)),
        },
        Command::Export {
            run_dir,
            format,
            memories,
            for_labelling,
            output,
        } => match for_labelling {
            Some(count) => app::export_for_labelling(runs, &run_dir, count, output.as_deref()),
            None => {
                let csv = matches!(format, ExportFormat::Csv);
                app::export(runs, &run_dir, csv, memories, output.as_deref())
            }
        },
        Command::Init { dir } => app::init(&dir),
        Command::Schema { which } => app::schema(match which {
            SchemaKind::Manifest => app::Schema::Manifest,
            SchemaKind::Report => app::Schema::Report,
        }),
        Command::Completions { shell } => {
            app::completions(&mut <Cli as clap::CommandFactory>::command(), shell)
        }
        Command::Callback {
            command:
                Some(CallbackCommand::Check {
                    manifest,
                    name,
                    sets,
                    json,
                }),
        } => app::callback_check(&manifest, &sets, name.as_deref(), format(json)),
        Command::Callback { .. } | Command::ArrayTask { .. } => Ok(Ended::Success),
    }
}

/// The exit status of how a command ended, with the error's message on stderr.
fn exit_status(result: Result<Ended, Error>) -> ExitCode {
    match result {
        Ok(Ended::Success) => ExitCode::SUCCESS,
        Ok(Ended::Failed) => ExitCode::from(1),
        Ok(Ended::CostCap) => ExitCode::from(3),
        Err(Error::Invalid(invalid)) => {
            eprint!("error: {invalid}");
            ExitCode::from(2)
        }
        Err(
            error @ (Error::Io { .. }
            | Error::NoSuchRun { .. }
            | Error::Schema { .. }
            | Error::Stopped { .. }
            | Error::Start { .. }),
        ) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
        Err(error @ Error::Interrupted { .. }) => {
            eprintln!("\n{error}");
            ExitCode::from(130)
        }
    }
}
