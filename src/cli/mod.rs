//! The command line: clap's types (the arguments of each subcommand in `args`), and how each
//! turns into a call of `gacc::app` (`dispatch`).

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod args;
mod dispatch;

use args::{
    ArrayTaskArgs, DiffArgs, ExportArgs, PackArgs, PlanArgs, ReportArgs, TraceArgs, UnpackArgs, ValidateArgs,
    VerifyArgs, ViewArgs,
};
use gacc::app::{self, Format, Layer, RunOptions};

#[derive(Parser)]
#[command(
    name = "gacc",
    version,
    about = "Goal-conditioned compression experiments (GACC-Bench)"
)]
pub(crate) struct Cli {
    /// More detail on the terminal (-v retries and failed jobs, -vv every job, -vvv debug); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub(crate) verbose: u8,
    /// No progress or summary on the terminal.
    #[arg(short, long, global = true)]
    pub(crate) quiet: bool,
    /// Where past runs are found for `latest` and -N (the folder `run --out` writes to); by
    /// default `runs/` here, else that of the nearest project folder (holding `.gacc/`) up.
    #[arg(long, global = true, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub(crate) runs: Option<PathBuf>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Plan, run (resuming from the cache) and report; prints the run folder.
    Run(RunArgs),
    /// The job graph's size per stage and how much is cached, without calling anything.
    Plan(PlanArgs),
    /// Check a manifest and its dataset, reporting every problem.
    Validate(ValidateArgs),
    /// Re-render the report of a finished run.
    Report(ReportArgs),
    /// What changed between two runs: settings, per-cell metrics with paired tests, flipped
    /// questions. Exit 0 either way, unless --fail-on-regression.
    Diff(DiffArgs),
    /// Review a run's trace: slowest calls, failures, latency per callback, cache hits per stage.
    Trace(TraceArgs),
    /// Make the calls of one array task on a cluster node (run by the tasks gacc submits).
    #[command(name = "array-task", hide = true)]
    ArrayTask(ArrayTaskArgs),
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
    Bench(BenchArgs),
    /// One file to share a run: its folder, the cache entries its rows rest on, and the
    /// SHA-256 of every member (a .tar.gz).
    Pack(PackArgs),
    /// Check a pack member by member against its SHA-256 list and extract it.
    Unpack(UnpackArgs),
    /// Recompute every figure a run or a pack states from its cache entries and its dataset
    /// (no call is made); exit 0 "verified", or 1 listing each that does not follow.
    Verify(VerifyArgs),
    /// Browse runs and packs in a web browser: a local, read-only server over DIR.
    View(ViewArgs),
    /// Past runs under --runs (default runs/): list them, or show one.
    Runs {
        #[command(subcommand)]
        command: Option<RunsCommand>,
    },
    /// A run's rows as one table: a row per question (or per memory), CSV or JSON Lines.
    Export(ExportArgs),
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
pub(crate) enum TraceFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum DiffFormat {
    Markdown,
    Json,
}

/// `--json` or not.
pub(crate) fn format(json: bool) -> Format {
    if json { Format::Json } else { Format::Text }
}

#[derive(Subcommand)]
pub(crate) enum RunsCommand {
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
pub(crate) enum SchemaKind {
    Manifest,
    Report,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum ExportFormat {
    Csv,
    Jsonl,
}

#[derive(Subcommand)]
pub(crate) enum CacheCommand {
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
pub(crate) enum BatchesCommand {
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
pub(crate) enum CallbackCommand {
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
pub(crate) enum DatasetCommand {
    /// Sources, goals, questions, and cl100k_base tokens per source (min/median/max).
    Stats {
        /// A JSON Lines file, a folder of them, a glob pattern, or a manifest.
        path: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Write a dataset from a folder of texts (SPEC §16): a writer writes goals and questions,
    /// and only questions that pass the checks (evidence, leak, duplicate, ceiling,
    /// closed-book) are kept. Writes `[build] out`, and <stem>.dropped.jsonl and
    /// <stem>.report.md beside it.
    Build {
        /// The build file: [build] (sources, counts, out), [build.writer], [build.check]
        /// (reader, judge), [models.*] and [run] (cache, concurrency, max_cost_usd).
        #[arg(value_hint = clap::ValueHint::FilePath)]
        build: PathBuf,
        /// Say what calls the build would make and what they could cost; call and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Write a dataset in the other shape: nested sources (JSON Lines) as a question table
    /// (CSV when OUTPUT ends in .csv, else JSON Lines), or a question table as nested sources.
    Convert { input: PathBuf, output: PathBuf },
}

/// `gacc run`'s options.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    #[arg(value_hint = clap::ValueHint::FilePath)]
    pub(crate) manifest: PathBuf,
    /// Override a manifest value: key.path=value (value read as TOML, else a string).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) sets: Vec<String>,
    /// Where run folders go (default: runs/).
    #[arg(long, value_name = "DIR")]
    pub(crate) out: Option<PathBuf>,
    /// A folder whose report.md.j2 replaces the built-in template (default: templates/ if present).
    #[arg(long, value_name = "DIR")]
    pub(crate) templates: Option<PathBuf>,
    /// Start no new call after the first failure (finished work is kept and reported).
    #[arg(long, conflicts_with = "keep_going")]
    pub(crate) fail_fast: bool,
    /// Run every job whatever fails (the default).
    #[arg(long)]
    pub(crate) keep_going: bool,
    /// Refuse to run (exit 2) unless every compressor and reader runs in its sandbox.
    #[arg(long)]
    pub(crate) require_sandbox: bool,
    /// Where calls run: local or slurm (the same as --set run.executor=…).
    #[arg(long, value_name = "EXECUTOR")]
    pub(crate) executor: Option<String>,
    /// Print the final summary as one JSON object on stdout (progress stays on stderr).
    #[arg(long)]
    pub(crate) json: bool,
    /// Read a pack's cache entries (`gacc pack`) beneath the run's cache: what it holds is
    /// not called again.
    #[arg(long, value_name = "PACK", value_hint = clap::ValueHint::FilePath)]
    pub(crate) from: Option<PathBuf>,
    /// A name for this run, kept in its run.json and shown by `gacc runs`, `gacc view` and
    /// report.md; `gacc diff`, `export`, `report`, `trace` and `verify` take it as the run's
    /// name (the newest run of that label).
    #[arg(long, value_name = "TEXT")]
    pub(crate) label: Option<String>,
}

impl RunArgs {
    /// What `app::run` is given (`--executor` is one more `--set`).
    pub(crate) fn options(self, quiet: bool) -> RunOptions {
        RunOptions {
            manifest: self.manifest,
            sets: self
                .sets
                .into_iter()
                .chain(self.executor.map(|e| format!("run.executor={e}")))
                .collect(),
            out: self.out,
            templates: self.templates,
            quiet,
            fail_fast: self.fail_fast,
            require_sandbox: self.require_sandbox,
            json: self.json,
            layer: self.from.map(Layer::Pack),
            label: self.label,
            ..RunOptions::default()
        }
    }
}

/// `gacc bench`'s options.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// Where the synthetic experiment, its cache and runs go: replaced whole, so it must be new,
    /// empty, or made by an earlier bench (anything else is refused untouched).
    #[arg(long, default_value = "target/gacc-bench")]
    pub(crate) folder: PathBuf,
    /// Sources (281 in the paper's design).
    #[arg(long, default_value_t = 281)]
    pub(crate) sources: usize,
    #[arg(long, default_value_t = 500)]
    pub(crate) goals: usize,
    #[arg(long, default_value_t = 2571)]
    pub(crate) questions: usize,
    #[arg(long, default_value_t = 10)]
    pub(crate) compressors: usize,
    /// Tokens per source.
    #[arg(long, default_value_t = 8000)]
    pub(crate) tokens: usize,
    /// Calls in flight.
    #[arg(long, default_value_t = 8)]
    pub(crate) concurrency: usize,
    /// Spawns for the oneshot-overhead comparison.
    #[arg(long, default_value_t = 2000)]
    pub(crate) spawns: usize,
    /// Another gacc binary to measure this one against, side by side on the same experiment:
    /// the run folder's size, the cached re-run's and `dataset stats`' median times, as ratios.
    #[arg(long, value_name = "PATH", value_hint = clap::ValueHint::FilePath)]
    pub(crate) baseline: Option<PathBuf>,
    /// Rounds of each timing against the baseline (the median is reported).
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
}

impl BenchArgs {
    /// The synthetic experiment's shape.
    pub(crate) fn shape(&self) -> app::bench::Shape {
        app::bench::Shape {
            sources: self.sources,
            goals: self.goals,
            questions: self.questions,
            compressors: self.compressors,
            source_tokens: self.tokens,
            concurrency: self.concurrency,
            ..Default::default()
        }
    }
}

impl From<TraceFormat> for Format {
    fn from(format: TraceFormat) -> Format {
        match format {
            TraceFormat::Text => Format::Text,
            TraceFormat::Json => Format::Json,
        }
    }
}

impl From<DiffFormat> for Format {
    fn from(format: DiffFormat) -> Format {
        match format {
            DiffFormat::Markdown => Format::Text,
            DiffFormat::Json => Format::Json,
        }
    }
}

impl From<SchemaKind> for app::Schema {
    fn from(which: SchemaKind) -> app::Schema {
        match which {
            SchemaKind::Manifest => app::Schema::Manifest,
            SchemaKind::Report => app::Schema::Report,
        }
    }
}
