//! How each subcommand's arguments become a call of `gacc::app`: one line a command in
//! `Command::dispatch`, and a `call` on each subcommand's arguments where it takes several.

use std::path::{Path, PathBuf};

use gacc::app::{self, Ended};
use gacc::error::Error;

use super::args::{
    DiffArgs, ExportArgs, PackArgs, PlanArgs, ReportArgs, TablesFormat, TraceArgs, UnpackArgs, ValidateArgs,
    VerifyArgs, ViewArgs,
};
use super::{
    BatchesCommand, CacheCommand, CallbackCommand, Cli, Command, DatasetCommand, ExportFormat, RunsCommand,
    format,
};

impl Command {
    /// Runs the command; `runs` is where past runs are found (`--runs`).
    pub(crate) fn dispatch(self, quiet: bool, runs: &Path) -> Result<Ended, Error> {
        match self {
            Command::Run(args) => app::run(&args.options(quiet)),
            Command::Plan(args) => args.call(runs),
            Command::Validate(ValidateArgs { manifest, sets }) => app::validate(&manifest, &sets),
            Command::Report(args) => args.call(runs),
            Command::Dataset { command } => command.call(quiet),
            Command::Batches { command } => BatchesCommand::call(command),
            Command::Cache {
                command: CacheCommand::Stats { path, json },
            } => app::cache_stats(&path, format(json)),
            Command::Bench(args) => {
                let against = (args.baseline.as_deref()).map(|binary| app::bench::Baseline {
                    binary,
                    rounds: args.rounds,
                });
                app::bench(&args.folder, &args.shape(), args.spawns, against)
            }
            Command::Diff(args) => args.call(runs),
            Command::Trace(args) => args.call(runs),
            Command::Runs { command } => RunsCommand::call(command, runs),
            Command::Export(args) => args.call(runs),
            Command::Pack(args) => args.call(runs),
            Command::Unpack(UnpackArgs { pack, dir }) => app::unpack(&pack, dir.as_deref()),
            Command::Verify(args) => args.call(runs),
            Command::View(args) => args.call(runs),
            Command::Init { dir } => app::init(&dir),
            Command::Schema { which } => app::schema(which.into()),
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
            // Served before tracing starts, in `main`.
            Command::Callback { .. } | Command::ArrayTask(_) => Ok(Ended::Success),
        }
    }
}

impl PlanArgs {
    fn call(self, runs: &Path) -> Result<Ended, Error> {
        let asked = self.power.then_some(app::PowerAsked {
            effect: self.effect,
            pilot: self.pilot,
        });
        app::plan(
            &self.manifest,
            &self.sets,
            format(self.json),
            (runs, asked.as_ref()),
        )
    }
}

impl ReportArgs {
    fn call(self, runs: &Path) -> Result<Ended, Error> {
        let tables = |format| match format {
            TablesFormat::Latex => app::Tables::Latex,
            TablesFormat::Csv => app::Tables::Csv,
        };
        match self.format {
            Some(format) => app::report_tables(runs, &self.run_dir, tables(format), self.output.as_deref()),
            None => app::report(runs, &self.run_dir, self.template.as_deref()),
        }
    }
}

impl DatasetCommand {
    fn call(self, quiet: bool) -> Result<Ended, Error> {
        match self {
            DatasetCommand::Build { build, dry_run } => app::build::build(&build, dry_run, quiet),
            DatasetCommand::Stats { path, json } => app::dataset_stats(&path, format(json)),
            DatasetCommand::Convert { input, output } => app::dataset_convert(&input, &output),
        }
    }
}

impl BatchesCommand {
    /// `gacc batches` alone lists the default cache's batches.
    fn call(command: Option<BatchesCommand>) -> Result<Ended, Error> {
        match command.unwrap_or(BatchesCommand::List {
            path: PathBuf::from(".gacc/cache"),
            json: false,
        }) {
            BatchesCommand::List { path, json } => app::batches_list(&path, format(json)),
            BatchesCommand::Cancel { path } => app::batches_cancel(&path),
        }
    }
}

impl RunsCommand {
    /// `gacc runs` alone lists them.
    fn call(command: Option<RunsCommand>, runs: &Path) -> Result<Ended, Error> {
        match command.unwrap_or(RunsCommand::List { json: false }) {
            RunsCommand::List { json } => app::runs_list(runs, format(json)),
            RunsCommand::Show { run_dir, json } => app::runs_show(runs, &run_dir, format(json)),
        }
    }
}

impl DiffArgs {
    fn call(self, runs: &Path) -> Result<Ended, Error> {
        let format = self.format.into();
        app::diff(runs, &self.run_a, &self.run_b, format, self.fail_on_regression)
    }
}

impl TraceArgs {
    fn call(self, runs: &Path) -> Result<Ended, Error> {
        let filter = app::trace_filter(self.stage, self.callback, self.job);
        app::trace(runs, &self.run_dir, &filter, self.format.into())
    }
}

impl ExportArgs {
    fn call(self, runs: &Path) -> Result<Ended, Error> {
        let output = self.output.as_deref();
        match self.for_labelling {
            Some(count) => app::export_for_labelling(runs, &self.run_dir, count, output),
            None => app::export(
                runs,
                &self.run_dir,
                matches!(self.format, ExportFormat::Csv),
                (self.memories, self.pairs),
                output,
            ),
        }
    }
}

impl PackArgs {
    fn call(self, runs: &Path) -> Result<Ended, Error> {
        let (output, cache) = (self.output.as_deref(), self.cache.as_deref());
        app::pack(runs, &self.run_dir, output, cache, !self.no_dataset)
    }
}

impl VerifyArgs {
    fn call(self, runs: &Path) -> Result<Ended, Error> {
        let checks = app::SpotChecks {
            rejudge: self.rejudge,
            reread: self.reread,
            fraction: self.fraction,
            callbacks: self.callbacks,
        };
        let (dataset, cache) = (self.dataset.as_deref(), self.cache.as_deref());
        app::verify(runs, &self.target, dataset, cache, &checks)
    }
}

impl ViewArgs {
    fn call(self, runs: &Path) -> Result<Ended, Error> {
        let address = app::Address {
            host: self.host,
            port: self.port,
            token: self.token,
        };
        app::view(self.dir.as_deref().unwrap_or(runs), &address, &self.cache)
    }
}
