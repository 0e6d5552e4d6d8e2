//! The `gacc` command line: parses arguments, calls the library, maps errors to exit statuses
//! (0 success, 1 a run with failed jobs, 2 bad input).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use gacc::app::run::{self, RunOptions};
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
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Plan, run (resuming from the cache) and report; prints the run folder.
    Run {
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
    },
    /// The job graph's size per stage and how much is cached, without calling anything.
    Plan {
        manifest: PathBuf,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check a manifest and its dataset, reporting every problem.
    Validate {
        manifest: PathBuf,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
    /// Re-render the report of a finished run.
    Report {
        run_dir: PathBuf,
        /// Render this template to stdout instead of rewriting report.md.
        #[arg(long, value_name = "FILE")]
        template: Option<PathBuf>,
    },
    /// What changed between two runs: settings, per-cell metrics with paired tests, flipped
    /// questions. Exit 0 either way, unless --fail-on-regression.
    Diff {
        /// A run folder, a `latest` link, or a report.json.
        run_a: PathBuf,
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
    /// Make the calls of one Slurm array task (run by the tasks gacc submits).
    #[command(hide = true)]
    Worker {
        /// The batch folder in the Slurm work folder.
        batch: PathBuf,
        /// The array task (default: SLURM_ARRAY_TASK_ID).
        #[arg(long)]
        task: Option<usize>,
    },
    /// Run a built-in callback over the protocol on stdin/stdout (with no NAME, list them).
    Callback { name: Option<String> },
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
}

fn main() -> ExitCode {
    // A sandboxed callback's first step, before anything else (no parsing, no tracing).
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args
        .get(1)
        .is_some_and(|a| a == gacc::exec::sandbox::SANDBOX_EXEC)
    {
        return ExitCode::from(gacc::exec::sandbox::exec(&args[2..]));
    }
    let cli = Cli::parse();
    if let Command::Callback { name } = &cli.command {
        let Some(name) = name else {
            let mut list = String::new();
            for (name, role, summary) in gacc::builtin::catalogue() {
                list.push_str(&format!("{name:<18} {:<11} {summary}\n", role.as_str()));
            }
            list.push_str(&format!(
                "{:<18} {:<11} the embedded tokenizer\n",
                gacc::builtin::TOKENIZER,
                "tokenizer"
            ));
            emit(&list);
            return ExitCode::SUCCESS;
        };
        return ExitCode::from(gacc::builtin::serve(name).clamp(0, 255) as u8);
    }
    if let Command::Worker { batch, task } = &cli.command {
        return match gacc::exec::slurm::work(batch, *task) {
            Ok(made) => {
                eprintln!("gacc worker: {made} call(s) made");
                ExitCode::SUCCESS
            }
            Err(message) => {
                eprintln!("gacc worker: {}: {message}", batch.display());
                ExitCode::FAILURE
            }
        };
    }
    init_tracing(cli.verbose, cli.quiet);
    let result = match cli.command {
        Command::Run {
            manifest,
            sets,
            out,
            templates,
            fail_fast,
            keep_going: _,
            require_sandbox,
            executor,
        } => run::run(&RunOptions {
            manifest,
            sets: sets
                .into_iter()
                .chain(executor.map(|e| format!("run.executor={e}")))
                .collect(),
            out,
            templates,
            quiet: cli.quiet,
            fail_fast,
            require_sandbox,
        })
        .map(|finished| {
            if !cli.quiet {
                eprintln!("{}", finished.summary);
            }
            println!("{}", finished.folder.display());
            if finished.failures + finished.cancelled > 0 {
                eprintln!(
                    "{} job(s) failed; finished work is cached: fix the callback and run the same command again to finish the rest",
                    finished.failures
                );
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }),
        Command::Plan { manifest, sets, json } => run::plan_status(&manifest, &sets).map(|status| {
            if json {
                println!("{}", serde_json::to_string_pretty(&status).unwrap_or_default());
            } else {
                println!("{:<10} {:>8} {:>8} {:>8}", "stage", "jobs", "cached", "to run");
                for stage in ["compress", "read", "judge"] {
                    let s = status.get(stage).cloned().unwrap_or_default();
                    println!("{:<10} {:>8} {:>8} {:>8}", stage, s.jobs, s.cached + s.skipped, s.jobs - s.cached - s.skipped);
                }
            }
            ExitCode::SUCCESS
        }),
        Command::Validate { manifest, sets } => run::validate(&manifest, &sets).map(|summary| {
            println!("{summary}");
            ExitCode::SUCCESS
        }),
        Command::Report { run_dir, template } => gacc::report::rerender(&run_dir, template.as_deref()).map(|rendered| {
            if let Some(text) = rendered {
                emit(&text);
            }
            ExitCode::SUCCESS
        }),
        Command::Dataset {
            command: DatasetCommand::Stats { path, json },
        } => run::dataset_stats(&path).map(|(shown, stats)| {
            if json {
                println!("{}", serde_json::to_string_pretty(&stats).unwrap_or_default());
            } else {
                let line = |name: &str, s: &gacc::inputs::dataset::Summary| {
                    println!("{name:<20} min {:>6}  median {:>8}  max {:>6}  total {:>8}", s.min, s.median, s.max, s.total)
                };
                println!("{shown}: {} sources, {} goals, {} questions", stats.sources, stats.goals, stats.questions);
                line("tokens per source", &stats.tokens);
                line("goals per source", &stats.goals_per_source);
                line("questions per goal", &stats.questions_per_goal);
            }
            ExitCode::SUCCESS
        }),
        Command::Cache {
            command: CacheCommand::Stats { path, json },
        } => gacc::store::cache::Cache::stats(&path)
            .map_err(|error| Error::Io {
                path: path.clone(),
                message: error.to_string(),
            })
            .map(|stats| {
                if json {
                    println!("{}", serde_json::to_string_pretty(&stats).unwrap_or_default());
                } else {
                    println!("{}: {} segments, {} bytes", path.display(), stats.segments, stats.bytes);
                    for (kind, count) in &stats.entries {
                        println!("  {kind:<12} {count:>10} entries");
                    }
                    if stats.torn_lines > 0 {
                        println!("  {} torn lines (from interrupted writes; ignored)", stats.torn_lines);
                    }
                }
                ExitCode::SUCCESS
            }),
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
            let shape = gacc::app::bench::Shape {
                sources,
                goals,
                questions,
                compressors,
                source_tokens: tokens,
                concurrency,
                ..Default::default()
            };
            gacc::app::bench::bench(&folder, &shape, spawns).map(|measurements| {
                for m in &measurements {
                    println!("{:<62} {:>9.3} s  {}", m.name, m.seconds, m.detail);
                }
                let json = serde_json::to_string_pretty(&measurements).unwrap_or_default();
                let _ = std::fs::write(folder.join("bench.json"), json + "\n");
                ExitCode::SUCCESS
            })
        }
        Command::Diff {
            run_a,
            run_b,
            format,
            fail_on_regression,
        } => gacc::review::diff::diff(&run_a, &run_b).map(|diff| {
            match format {
                DiffFormat::Json => emit(&(serde_json::to_string_pretty(&diff).unwrap_or_default() + "\n")),
                DiffFormat::Markdown => {
                    emit(&gacc::review::diff::render(&diff, std::io::IsTerminal::is_terminal(&std::io::stdout())))
                }
            }
            if fail_on_regression && diff.regressions > 0 {
                eprintln!("{} cell(s) regressed", diff.regressions);
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }),
        Command::Trace {
            run_dir,
            stage,
            callback,
            job,
            format,
        } => {
            let filter = gacc::review::trace::Filter { stage, callback, job };
            gacc::review::trace::review(&run_dir, &filter).map(|review| {
                match format {
                    TraceFormat::Json => emit(&(serde_json::to_string_pretty(&review).unwrap_or_default() + "\n")),
                    TraceFormat::Text => emit(&gacc::review::trace::render(&review, &filter)),
                }
                ExitCode::SUCCESS
            })
        }
        Command::Callback { .. } | Command::Worker { .. } => Ok(ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|error| match &error {
        Error::Invalid(invalid) => {
            eprint!("error: {invalid}");
            ExitCode::from(2)
        }
        Error::Io { .. } => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
        Error::Interrupted { .. } => {
            eprintln!("\n{error}");
            ExitCode::from(130)
        }
    })
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn emit(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes()).and_then(|_| stdout.flush());
}

fn init_tracing(verbose: u8, quiet: bool) {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "error",
        (false, 1) => "gacc=warn,error",
        (false, 2) => "gacc=info,warn",
        (false, _) => "gacc=debug,info",
    };
    let terminal = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let trace = tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_target(false)
        .with_writer(gacc::trace::TraceSink)
        // Finished jobs reach the trace file directly (gacc::trace::job_finished).
        .with_filter(EnvFilter::new(format!(
            "gacc=debug,{}=off",
            gacc::trace::JOB_TARGET
        )));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_filter(terminal);
    let _ = tracing_subscriber::registry().with(trace).with(stderr).try_init();
}
