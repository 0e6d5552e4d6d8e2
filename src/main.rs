//! The `gacc` command line: parses arguments, calls one command of `gacc::app`, and maps how it
//! ended to an exit status (0 success, 1 failed jobs, 2 bad input, 3 stopped at the spending cap, 130 interrupted).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use gacc::app::{self, Ended};
use gacc::error::Error;

mod cli;

use cli::{
    BatchesCommand, CacheCommand, CallbackCommand, Cli, Command, DatasetCommand, ExportFormat, RunsCommand,
    format,
};

// A million small allocations across worker threads fragment glibc's arenas (measured: a
// cached paper-scale re-run peaked at 2.9 GB with it, and far less with mimalloc).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// One arm per subcommand, each passing its options to `app` (`cli` turns them into what
/// `app` takes). (One function: the match is the list of commands; split, it would only
/// be two lists.)
fn dispatch(command: Command, quiet: bool, runs: &std::path::Path) -> Result<Ended, Error> {
    match command {
        Command::Run(args) => app::run(&args.options(quiet)),
        Command::Plan {
            manifest,
            sets,
            json,
            power,
            pilot,
            effect,
        } => {
            let asked = power.then_some(app::PowerAsked { effect, pilot });
            app::plan(&manifest, &sets, format(json), (runs, asked.as_ref()))
        }
        Command::Validate { manifest, sets } => app::validate(&manifest, &sets),
        Command::Report { run_dir, template } => app::report(runs, &run_dir, template.as_deref()),
        Command::Dataset { command } => match command {
            DatasetCommand::Stats { path, json } => app::dataset_stats(&path, format(json)),
            DatasetCommand::Convert { input, output } => app::dataset_convert(&input, &output),
        },
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
        Command::Bench(args) => app::bench(&args.folder, &args.shape(), args.spawns),
        Command::Diff {
            run_a,
            run_b,
            format,
            fail_on_regression,
        } => app::diff(runs, &run_a, &run_b, format.into(), fail_on_regression),
        Command::Trace {
            run_dir,
            stage,
            callback,
            job,
            format,
        } => app::trace(
            runs,
            &run_dir,
            &app::trace_filter(stage, callback, job),
            format.into(),
        ),
        Command::Runs { command } => match command.unwrap_or(RunsCommand::List { json: false }) {
            RunsCommand::List { json } => app::runs_list(runs, format(json)),
            RunsCommand::Show { run_dir, json } => app::runs_show(runs, &run_dir, format(json)),
        },
        Command::Export {
            run_dir,
            for_labelling: Some(count),
            output,
            ..
        } => app::export_for_labelling(runs, &run_dir, count, output.as_deref()),
        Command::Export {
            run_dir,
            format,
            memories,
            pairs,
            for_labelling: None,
            output,
        } => app::export(
            runs,
            &run_dir,
            matches!(format, ExportFormat::Csv),
            (memories, pairs),
            output.as_deref(),
        ),
        Command::Pack {
            run_dir,
            output,
            cache,
            no_dataset,
        } => app::pack(runs, &run_dir, output.as_deref(), cache.as_deref(), !no_dataset),
        Command::Unpack { pack, dir } => app::unpack(&pack, dir.as_deref()),
        Command::Verify {
            target,
            dataset,
            cache,
            rejudge,
            reread,
            fraction,
            callbacks,
        } => {
            let checks = app::SpotChecks {
                rejudge,
                reread,
                fraction,
                callbacks,
            };
            app::verify(runs, &target, dataset.as_deref(), cache.as_deref(), &checks)
        }
        Command::View {
            dir,
            port,
            host,
            token,
            cache,
        } => app::view(
            dir.as_deref().unwrap_or(runs),
            &app::Address { host, port, token },
            &cache,
        ),
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
