//! Where a program's calls run (SPEC §2 `run.executor`): an `Engine` makes each program's launcher
//! and tidies up when the run ends (the folders it works in are protected from sandboxed callbacks
//! before it starts: `exec::engine_folders`). This machine's engine is `Here`; an engine that runs
//! calls elsewhere is a folder of `exec/` registered in `exec/mod.rs`, and nothing outside them
//! names it.

use std::sync::Arc;

use super::callback::Launcher;
use super::process::ProcessLauncher;
use super::program::Program;

/// Where the calls of a run's programs are made.
pub(crate) trait Engine: Send + Sync {
    /// The launcher of one program's calls.
    fn launcher(&self, program: Program) -> Arc<dyn Launcher>;
    /// The run has ended: what the engine keeps for its calls (their files) can go.
    fn finish(&self) {}
}

/// Each call a process of this machine.
pub(crate) struct Here;

impl Engine for Here {
    fn launcher(&self, program: Program) -> Arc<dyn Launcher> {
        Arc::new(ProcessLauncher::new(program))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn here_runs_a_program_as_a_process() {
        let program = Program {
            argv: vec!["true".into()],
            cwd: std::env::temp_dir(),
            env: Default::default(),
            secrets: Vec::new(),
            timeout: std::time::Duration::from_secs(1),
            mode: Default::default(),
            sandbox: None,
            max_inflight: 1,
        };
        let launcher = Here.launcher(program);
        assert_eq!(
            launcher.program().map(|p| p.argv.clone()),
            Some(vec!["true".to_owned()])
        );
        assert!(
            format!("{launcher:?}").contains("ProcessLauncher"),
            "{launcher:?}"
        );
    }
}
