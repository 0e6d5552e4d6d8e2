//! Talking to Slurm: `sbatch` of a callback's gathered calls as job arrays, `squeue` polls
//! that settle the calls whose tasks ended, and the job lookups a restart needs.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::oneshot;

use super::{LIVE_JOBS, Queue, Slurm, Task};
use crate::exec::callback::{Attempt, FailureKind};
use crate::exec::remote::{call_files, tail_of};
use crate::files::write_durably;
use crate::parallel::Locked;
use crate::protocol::Role;

/// How many polls a submitted task may be missing from `squeue` before it counts as gone.
pub(super) const MISSES_BEFORE_GONE: u32 = 3;

/// How long one `sbatch`, `squeue` or `scancel` may take.
pub(super) const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Job states after which a task makes no more calls.
pub(super) const ENDED: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "TIMEOUT",
    "CANCELLED",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
];

/// Slurm's `--time` for a duration: whole minutes, rounded up, at least one.
pub(super) fn slurm_time(limit: Duration) -> String {
    let minutes = limit.as_secs().div_ceil(60).max(1);
    format!("{}:{:02}:00", minutes / 60, minutes % 60)
}

/// What a task that ended without answering a call means for the call.
pub(super) fn lost_call(task: &Task, state: &str, time_limit: Option<Duration>) -> FailureKind {
    match (state, time_limit) {
        ("TIMEOUT", Some(limit)) => FailureKind::Timeout(limit),
        _ => FailureKind::Cluster {
            task: format!("Slurm task {}", task.id()),
            state: state.to_owned(),
            // The node, not the call, failed.
            retryable: matches!(state, "NODE_FAIL" | "BOOT_FAIL" | "PREEMPTED"),
        },
    }
}

/// A command's output, or why it could not be run.
pub(super) async fn command_output(program: &str, args: &[String]) -> Result<std::process::Output, String> {
    let mut command = tokio::process::Command::new(program);
    command.args(args).kill_on_drop(true);
    match tokio::time::timeout(COMMAND_TIMEOUT, command.output()).await {
        Err(_) => Err(format!("`{program}` did not answer within {COMMAND_TIMEOUT:?}")),
        Ok(Err(error)) => Err(format!("could not run `{program}`: {error}")),
        Ok(Ok(output)) => Ok(output),
    }
}

pub(super) fn job_name(array: &str) -> String {
    format!("gacc-{array}")
}

pub(super) fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

impl Slurm {
    /// The job id of an array whose `job` file was never written, asked of Slurm once.
    pub(super) async fn find_job(&self, array: &str) -> Option<String> {
        if let Some(found) = self.state.locked().found.get(array) {
            return found.clone();
        }
        let args = ["-h", "-t", "all", "-o", "%F", "-n"].map(String::from);
        // A squeue that fails says nothing: ask again for the next call.
        let output = command_output("squeue", &[&args[..], &[job_name(array)]].concat())
            .await
            .ok()
            .filter(|output| output.status.success())?;
        let found = String::from_utf8_lossy(&output.stdout)
            .lines()
            .next()
            .map(|job| job.trim().to_owned())
            .filter(|job| !job.is_empty());
        if let Some(job) = &found {
            let _ = write_durably(&self.array_folder(array).join("job"), job.as_bytes());
        }
        self.state.locked().found.insert(array.to_owned(), found.clone());
        found
    }

    /// Submits one callback's gathered calls as arrays of at most `array_limit` tasks.
    pub(super) async fn submit(&self, queue: Queue) {
        let Queue {
            callback,
            role,
            calls,
            ..
        } = queue;
        let capacity = self.capacity();
        let mut calls = calls;
        while !calls.is_empty() {
            let rest = calls.split_off(calls.len().min(capacity));
            let array = std::mem::replace(&mut calls, rest);
            self.submit_array(&callback, role, array).await;
        }
    }

    pub(super) async fn submit_array(
        &self,
        callback: &Arc<Value>,
        role: Role,
        calls: Vec<(String, oneshot::Sender<Attempt>)>,
    ) {
        let array = format!(
            "{}-{}-{}",
            crate::clock::utc_timestamp(std::time::SystemTime::now(), false),
            std::process::id(),
            self.arrays.fetch_add(1, Ordering::Relaxed)
        );
        let folder = self.array_folder(&array);
        let tasks: Vec<&[(String, oneshot::Sender<Attempt>)]> =
            calls.chunks(self.spec.calls_per_task).collect();
        let prepared = (|| -> std::io::Result<()> {
            std::fs::create_dir_all(folder.join("tasks"))?;
            std::fs::create_dir_all(folder.join("logs"))?;
            let parallel = self.resources(role).parallel.unwrap_or(1);
            let description = super::task::ArrayDescription {
                callback: (**callback).clone(),
                calls: self.calls(),
                parallel,
            };
            write_durably(
                &folder.join(super::task::DESCRIPTION),
                &serde_json::to_vec(&description).unwrap_or_default(),
            )?;
            for (index, task) in tasks.iter().enumerate() {
                let keys: String = task.iter().map(|(key, _)| format!("{key}\n")).collect();
                write_durably(&folder.join("tasks").join(index.to_string()), keys.as_bytes())?;
                for (key, _) in task.iter() {
                    let files = call_files(&self.calls(), key);
                    write_durably(&files.task, format!("{array} {index}\n").as_bytes())?;
                }
            }
            let script = format!(
                "#!/bin/sh\nexec {} array-task {}\n",
                shell_quote(&self.gacc.to_string_lossy()),
                shell_quote(&folder.to_string_lossy())
            );
            write_durably(&folder.join("job.sh"), script.as_bytes())
        })();
        let submitted = match prepared {
            Err(error) => Err(format!("cannot prepare {}: {error}", folder.display())),
            Ok(()) => self.sbatch(&array, &folder, role, tasks.len()).await,
        };
        let job = match submitted {
            Ok(job) => job,
            Err(message) => {
                tracing::error!(callback = %callback["name"], %message, "sbatch failed");
                for (key, reply) in calls {
                    let _ = std::fs::remove_file(call_files(&self.calls(), &key).task);
                    let _ = reply.send(Attempt {
                        result: Err(FailureKind::Submit(format!("sbatch failed: {message}"))),
                        stderr_tail: String::new(),
                        stderr_of_worker: false,
                    });
                }
                return;
            }
        };
        tracing::info!(callback = %callback["name"], job, tasks = tasks.len(), calls = calls.len(), "array submitted");
        let _ = write_durably(&folder.join("job"), job.as_bytes());
        LIVE_JOBS.locked().insert(job.clone());
        self.state.locked().arrays.insert(array.clone());
        let per_task = self.spec.calls_per_task;
        for (position, (key, reply)) in calls.into_iter().enumerate() {
            let task = Task {
                array: array.clone(),
                job: job.clone(),
                index: position / per_task,
            };
            self.track(key, task, reply, false, callback.clone(), role);
        }
    }

    /// `sbatch` of one array; its job id.
    pub(super) async fn sbatch(
        &self,
        array: &str,
        folder: &Path,
        role: Role,
        tasks: usize,
    ) -> Result<String, String> {
        let resources = self.resources(role);
        let logs = folder.join("logs");
        let mut args: Vec<String> = vec![
            "--parsable".into(),
            format!("--array=0-{}", tasks - 1),
            format!("--job-name={}", job_name(array)),
            format!("--output={}", logs.join("%a.out").display()),
            format!("--error={}", logs.join("%a.err").display()),
            format!("--chdir={}", self.work.display()),
        ];
        if let Some(partition) = resources.partition.as_ref().or(self.spec.partition.as_ref()) {
            args.push(format!("--partition={partition}"));
        }
        if let Some(account) = &self.spec.account {
            args.push(format!("--account={account}"));
        }
        if let Some(limit) = self.time_limit(role) {
            args.push(format!("--time={}", slurm_time(limit)));
        }
        if let Some(cpus) = resources.cpus {
            args.push(format!("--cpus-per-task={cpus}"));
        }
        if let Some(memory) = &resources.memory {
            args.push(format!("--mem={memory}"));
        }
        if let Some(gres) = &resources.gres {
            args.push(format!("--gres={gres}"));
        }
        args.extend(self.spec.sbatch_args.iter().cloned());
        args.push(folder.join("job.sh").display().to_string());
        let output = command_output("sbatch", &args).await?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        // `--parsable` prints `JOBID` or `JOBID;CLUSTER`.
        let job = stdout.trim().split(';').next().unwrap_or_default().to_owned();
        if !output.status.success() || job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(format!("{} {}", stderr.trim(), stdout.trim()).trim().to_owned());
        }
        Ok(job)
    }

    /// Every array task of this user that Slurm knows, with its state (`JOB_INDEX` → state).
    pub(super) async fn states(&self) -> Result<HashMap<String, String>, String> {
        // SAFETY: getuid(2) cannot fail and touches no memory.
        let user = unsafe { libc::getuid() };
        let args: Vec<String> = ["-h", "-r", "-t", "all", "-o", "%i|%T"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("--user={user}")])
            .collect();
        let output = command_output("squeue", &args).await?;
        if !output.status.success() {
            return Err(format!(
                "squeue failed: {}",
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.trim().split_once('|'))
            .map(|(task, state)| (task.to_owned(), state.to_owned()))
            .collect())
    }

    /// Takes the responses that arrived and settles the calls whose task ended without one.
    pub(super) async fn poll(&self) {
        // States first, files second: a task seen ended has written everything it will write.
        let states = match self.states().await {
            Ok(states) => states,
            Err(message) => {
                tracing::warn!(%message, "could not read job states; trying again");
                return;
            }
        };
        let keys: Vec<(String, Task)> = self
            .state
            .locked()
            .outstanding
            .iter()
            .map(|(key, o)| (key.clone(), o.task.clone()))
            .collect();
        let calls = self.calls();
        for (key, task) in keys {
            let files = call_files(&calls, &key);
            if let Some(attempt) = self.take_response(&key, &files) {
                if let Some(outstanding) = self.state.locked().outstanding.remove(&key) {
                    let _ = outstanding.reply.send(attempt);
                }
                continue;
            }
            let ended = match states.get(&task.id()) {
                Some(state) if ENDED.contains(&state.as_str()) => state.clone(),
                Some(_) => continue,
                None => {
                    let mut state = self.state.locked();
                    let Some(outstanding) = state.outstanding.get_mut(&key) else {
                        continue;
                    };
                    outstanding.misses += 1;
                    if outstanding.misses < MISSES_BEFORE_GONE {
                        continue;
                    }
                    "gone from the queue".to_owned()
                }
            };
            let Some(outstanding) = self.state.locked().outstanding.remove(&key) else {
                continue;
            };
            let _ = std::fs::remove_file(&files.task);
            if outstanding.adopted {
                tracing::info!(task = %task.id(), state = %ended, key, "an earlier run's task ended without answering; submitting again");
                self.enqueue(key, outstanding.reply, outstanding.callback, outstanding.role);
                continue;
            }
            let kind = lost_call(&task, &ended, self.time_limit(outstanding.role));
            let log = self
                .array_folder(&task.array)
                .join("logs")
                .join(format!("{}.err", task.index));
            tracing::warn!(task = %task.id(), state = %ended, key, "task ended without answering");
            let _ = outstanding.reply.send(Attempt {
                result: Err(kind),
                stderr_tail: tail_of(&log),
                stderr_of_worker: false,
            });
        }
    }
}
