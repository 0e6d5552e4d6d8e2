//! The arguments of each subcommand that takes more than one, as clap reads them.

use std::path::PathBuf;

use super::{DiffFormat, ExportFormat, TraceFormat};

/// `gacc plan`'s arguments.
#[derive(clap::Args)]
pub(crate) struct PlanArgs {
    #[arg(value_hint = clap::ValueHint::FilePath)]
    pub(crate) manifest: PathBuf,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) sets: Vec<String>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also the smallest paired difference the manifest's goals detect, and the goals an
    /// effect needs (α 0.05, power 0.8, goals resampled).
    #[arg(long)]
    pub(crate) power: bool,
    /// With --power: size from this run's per-goal differences (a run folder, `latest` or
    /// -N) rather than a worst case.
    #[arg(long, requires = "power", allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
    pub(crate) pilot: Option<PathBuf>,
    /// With --power: the difference to detect (default 0.02).
    #[arg(long, requires = "power")]
    pub(crate) effect: Option<f64>,
}

/// `gacc validate`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ValidateArgs {
    #[arg(value_hint = clap::ValueHint::FilePath)]
    pub(crate) manifest: PathBuf,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(crate) sets: Vec<String>,
}

/// `gacc report`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ReportArgs {
    /// A run folder, `latest`, or -N (the N-th newest run).
    #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
    pub(crate) run_dir: PathBuf,
    /// Render this template to stdout instead of rewriting report.md.
    #[arg(long, value_name = "FILE", conflicts_with = "format")]
    pub(crate) template: Option<PathBuf>,
    /// Print the results as paper tables instead of rewriting the views: latex (booktabs, one
    /// table per condition) or csv (one row per cell).
    #[arg(long, value_name = "FORMAT")]
    pub(crate) format: Option<TablesFormat>,
    /// Write the tables to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE", requires = "format")]
    pub(crate) output: Option<PathBuf>,
}

/// `gacc report --format`'s values.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum TablesFormat {
    Latex,
    Csv,
}

/// `gacc diff`'s arguments.
#[derive(clap::Args)]
pub(crate) struct DiffArgs {
    /// A run folder, a `latest` link, a report.json, `latest`, or -N (the N-th newest run).
    #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
    pub(crate) run_a: PathBuf,
    #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
    pub(crate) run_b: PathBuf,
    /// markdown (the default) or json.
    #[arg(long, default_value = "markdown")]
    pub(crate) format: DiffFormat,
    /// Exit 1 when a cell of B is significantly worse than A.
    #[arg(long)]
    pub(crate) fail_on_regression: bool,
}

/// `gacc trace`'s arguments.
#[derive(clap::Args)]
pub(crate) struct TraceArgs {
    /// A run folder, `latest`, or -N (the N-th newest run).
    #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
    pub(crate) run_dir: PathBuf,
    /// Only this stage (compress, read, judge).
    #[arg(long)]
    pub(crate) stage: Option<String>,
    /// Only this callback (e.g. reader, judge, compressors.NAME).
    #[arg(long)]
    pub(crate) callback: Option<String>,
    /// One job's whole story: every event of this job or cache key (a prefix will do).
    #[arg(long, value_name = "KEY")]
    pub(crate) job: Option<String>,
    /// markdown-ish text (the default) or json.
    #[arg(long, default_value = "text")]
    pub(crate) format: TraceFormat,
}

/// `gacc pack`'s arguments.
#[derive(clap::Args)]
pub(crate) struct PackArgs {
    /// A run folder, `latest`, or -N (the N-th newest run).
    #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
    pub(crate) run_dir: PathBuf,
    /// Where the pack goes (default: <run>.gacc.tar.gz here).
    #[arg(short, long, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,
    /// The cache the run used (default: the one its run.json names, in its project folder).
    #[arg(long, value_name = "DIR")]
    pub(crate) cache: Option<PathBuf>,
    /// Leave the dataset out; the pack keeps its SHA-256.
    #[arg(long)]
    pub(crate) no_dataset: bool,
}

/// `gacc unpack`'s arguments.
#[derive(clap::Args)]
pub(crate) struct UnpackArgs {
    #[arg(value_hint = clap::ValueHint::FilePath)]
    pub(crate) pack: PathBuf,
    /// Where it goes (created; default: the pack's name without .gacc.tar.gz).
    #[arg(value_hint = clap::ValueHint::DirPath)]
    pub(crate) dir: Option<PathBuf>,
}

/// `gacc verify`'s arguments.
#[derive(clap::Args)]
pub(crate) struct VerifyArgs {
    /// A pack, a run folder, `latest`, or -N (the N-th newest run).
    #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::AnyPath)]
    pub(crate) target: PathBuf,
    /// Verify against this dataset instead of the run's copy.
    #[arg(long, value_name = "PATH")]
    pub(crate) dataset: Option<PathBuf>,
    /// For a run folder: the cache it was run with (default: the one its run.json names,
    /// in its project folder).
    #[arg(long, value_name = "DIR")]
    pub(crate) cache: Option<PathBuf>,
    /// Re-judge a seeded share of the answers with this judge (a built-in rule judge, a
    /// `[judges.NAME]` of the run's manifest or of --callbacks) and report agreement and kappa.
    #[arg(long, value_name = "NAME")]
    pub(crate) rejudge: Option<String>,
    /// Re-read a seeded share of the questions with this reader (a built-in, or a
    /// `[readers.NAME]` of --callbacks; the run's judge judges its answers) and report
    /// agreement and kappa with the run's verdicts.
    #[arg(long, value_name = "NAME")]
    pub(crate) reread: Option<String>,
    /// The share of answers (--rejudge) or questions (--reread) checked.
    #[arg(long, value_name = "F", default_value_t = 1.0)]
    pub(crate) fraction: f64,
    /// Your own callbacks for the spot checks: a TOML file of `[judges.NAME]`,
    /// `[readers.NAME]` and the `[models.NAME]` endpoints they call.
    #[arg(long, value_name = "FILE")]
    pub(crate) callbacks: Option<PathBuf>,
}

/// `gacc view`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ViewArgs {
    /// The folder of runs and packs (default: --runs, runs/).
    #[arg(value_hint = clap::ValueHint::DirPath)]
    pub(crate) dir: Option<PathBuf>,
    /// The port (0: any free one).
    #[arg(long, default_value_t = 8040)]
    pub(crate) port: u16,
    /// The address to listen on; anything but 127.0.0.1 shows your runs to your network,
    /// to requests that carry the token (made and printed, unless --token gives one).
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// The token every request must carry (`?token=`, then a cookie); on a loopback
    /// address none is needed unless given.
    #[arg(long, value_name = "TOKEN")]
    pub(crate) token: Option<String>,
    /// The cache a pack is unpacked into, once, when it is opened.
    #[arg(long, value_name = "DIR", default_value = ".gacc/cache")]
    pub(crate) cache: PathBuf,
}

/// `gacc export`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ExportArgs {
    /// A run folder, `latest`, or -N (the N-th newest run).
    #[arg(allow_hyphen_values = true, value_hint = clap::ValueHint::DirPath)]
    pub(crate) run_dir: PathBuf,
    /// csv or jsonl.
    #[arg(long, default_value = "csv")]
    pub(crate) format: ExportFormat,
    /// One row per memory (its ledger fields and text) instead of one per question.
    #[arg(long)]
    pub(crate) memories: bool,
    /// One row per pair of compressors in a condition and budget (report.json's `pairs`):
    /// B − A, its interval, p, Holm's p, separated, MDE.
    #[arg(long, conflicts_with = "memories")]
    pub(crate) pairs: bool,
    /// A fixed sample of N distinct answers as a CSV to label by hand (`correct` left empty),
    /// which `[audit] labels` reads back.
    #[arg(long, value_name = "N", conflicts_with_all = ["memories", "format", "pairs"])]
    pub(crate) for_labelling: Option<usize>,
    /// Write to this file instead of stdout.
    #[arg(short, long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub(crate) output: Option<PathBuf>,
}

/// `gacc array-task`'s arguments.
#[derive(clap::Args)]
pub(crate) struct ArrayTaskArgs {
    /// The array's folder in the engine's work folder (`arrays/<array>`).
    pub(crate) array: PathBuf,
    /// The array task (default: the index the cluster gives the task in its environment).
    #[arg(long)]
    pub(crate) task: Option<usize>,
}
