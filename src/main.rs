//! The `gacc` command line: parses arguments, calls one command of `gacc::app`, and maps how it
//! ended to an exit status (0 success, 1 failed jobs, 2 bad input, 3 stopped at the spending cap,
//! 130 interrupted).

use std::process::ExitCode;

use clap::Parser;

use gacc::app::{self, Ended};
use gacc::error::Error;

mod cli;

use cli::{CallbackCommand, Cli, Command};

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
        Command::ArrayTask(task) => ExitCode::from(app::array_task(&task.array, task.task)),
        command => {
            app::init_tracing(cli.verbose, cli.quiet);
            let runs = cli.runs.unwrap_or_else(gacc::app::default_runs);
            exit_status(command.dispatch(cli.quiet, &runs))
        }
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
