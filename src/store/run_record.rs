//! `run.json` (SPEC §5): one run's own record, typed for the run that writes it and every
//! command that reads it. Its format is named in `schema` (`gacc.run/1`); a record of another
//! is not read. A field the record lacks reads as its default; fields are declared in the
//! order they are written.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The format of `run.json` this gacc writes and reads.
pub(crate) const RUN_SCHEMA: &str = "gacc.run/1";

/// What one run did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct RunRecord {
    /// The cache it used, as shown to the user.
    pub cache: String,
    /// Per role: calls made, taken from the cache, shared and failed; the audit's apart.
    pub calls: super::usage::RunCalls,
    /// Per cell of report.json, in its order: its distinct compressor calls, how many of them
    /// this run found in the cache, and how long they took (SPEC §15; what they cost is in
    /// report.json's `compression`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub compression: Vec<CompressionRecord>,
    /// Per model endpoint: what it did.
    pub endpoints: BTreeMap<String, EndpointRecord>,
    pub failures: usize,
    pub gacc_version: String,
    pub host: String,
    /// The name the user gave the run (`gacc run --label`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Cache entries found damaged (a payload failing its checksum, a torn line): each was a
    /// miss, its call made again.
    #[serde(skip_serializing_if = "is_zero")]
    pub cache_damaged: usize,
    /// The kernel's Landlock ABI (0: none).
    pub landlock_abi: i32,
    pub manifest: String,
    /// Per role: what this run's calls cost.
    pub paid: BTreeMap<crate::protocol::Role, super::usage::Usage>,
    /// The run's phases and their seconds, in order.
    pub phases: Vec<(String, f64)>,
    /// While the run is in flight, what it has done so far (rewritten about every second);
    /// left in place by a run that was interrupted or crashed. A finished run has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<LiveProgress>,
    /// The record's format, `gacc.run/1` (absent in records written before it was named,
    /// which are of that format too).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub schema: String,
    /// Per callback (its manifest key): the files its command runs and their SHA-256, as
    /// hashed into its identity; the next run says which changed.
    pub scripts: BTreeMap<String, BTreeMap<String, String>>,
    pub seconds: f64,
    pub started: String,
    /// Why it stopped early, if it did.
    pub stopped: Option<String>,
    /// Per template path, as the manifest writes it: the text its model built-in read. With
    /// `scripts`, what a replay (`gacc verify`) needs of the callbacks' files.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub templates: BTreeMap<String, String>,
}

/// A cell's compressor calls: how many, those this run found in the cache, and their wall time
/// as each call's cache entry records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CompressionRecord {
    #[serde(flatten)]
    pub cell: crate::protocol::CellId,
    pub calls: usize,
    pub cached: usize,
    #[serde(flatten)]
    pub times: super::usage::CallTimes,
}

/// What one model endpoint did in a run (SPEC §8): its requests, retries and 429s, the live
/// limit and the pace it ended on, what it sustained (`gacc plan` estimates the next run's
/// time from it), and its provider batches.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct EndpointRecord {
    /// The requests limit the provider's replies announced, if they did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announced_limit: Option<f64>,
    pub batches: Option<usize>,
    pub final_limit: usize,
    /// The endpoint is a server on this machine or its network, whose calls in flight are
    /// found from the queue its replies show: only such a run's `final_limit` starts another.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub local_server: bool,
    pub pace_rpm: Option<f64>,
    pub pace_tpm: Option<f64>,
    /// The most calls it had in flight at once.
    #[serde(default)]
    pub peak_in_flight: usize,
    pub rate_limited: u64,
    pub requests: u64,
    pub retries: u64,
    pub sustained_rpm: Option<f64>,
    pub sustained_tpm: Option<f64>,
    /// How the judge's verdict was asked for at the end, when the server refused the schema
    /// (`json_object`, or `prompted`: no response format).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict_format: Option<String>,
}

/// A run in flight, as `run.json` shows it while it goes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct LiveProgress {
    /// Audit judgements given so far (their number is known only as they come).
    pub audited: usize,
    /// What this run's model calls have cost so far (USD).
    pub cost_usd: f64,
    /// Per model endpoint: what it is doing now.
    pub endpoints: BTreeMap<String, EndpointLive>,
    /// Seconds since the jobs started.
    pub seconds: f64,
    /// Per stage (`compress`, `read`, `judge`): its jobs so far.
    pub stages: BTreeMap<String, StageCounts>,
    pub state: RunStatus,
    /// When this record was written (UTC).
    pub updated: String,
    /// The process that runs it, on `host`: where it is gone, a record still `running` was
    /// left by a run killed or crashed.
    pub pid: u32,
}

/// Whether a run in flight is still going.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum RunStatus {
    #[default]
    Running,
    /// Stopped by Ctrl-C: `gacc run` of the same manifest goes on from the cache.
    Interrupted,
    /// Its process is gone without a word (killed, or crashed, or its machine went down): the
    /// next `gacc run` on this machine says so in the record; the same command goes on from
    /// the cache.
    Stopped,
}

/// One stage's jobs: planned, and of those finished, how each was served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct StageCounts {
    /// Served from the cache.
    pub cached: usize,
    /// Finished, failed ones included.
    pub finished: usize,
    pub failed: usize,
    pub planned: usize,
    /// Served by an identical call of this run.
    pub shared: usize,
    /// Nothing to call (`L = 0`).
    pub skipped: usize,
}

/// One model endpoint in flight: calls in flight and its live limit, the most it has had,
/// its 429s, replies a second lately and the pace in force (requests a minute).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct EndpointLive {
    /// The requests budget the newest reply announced: its limit and what remained.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announced_limit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub announced_remaining: Option<f64>,
    pub in_flight: usize,
    pub limit: usize,
    pub pace_rpm: Option<f64>,
    pub peak_in_flight: usize,
    pub rate_limited: u64,
    pub throughput: f64,
}

impl RunRecord {
    /// A record of this gacc on this host, the rest to be filled in.
    pub(crate) fn here() -> RunRecord {
        RunRecord {
            gacc_version: env!("CARGO_PKG_VERSION").to_owned(),
            host: hostname(),
            schema: RUN_SCHEMA.to_owned(),
            ..RunRecord::default()
        }
    }

    /// Whether the record says its run is going, but its process on this machine is gone.
    pub(crate) fn orphaned(&self) -> bool {
        let Some(progress) = &self.progress else {
            return false;
        };
        progress.state == RunStatus::Running
            && progress.pid > 0
            && self.host == hostname()
            && !gacc_alive(progress.pid)
    }

    /// The record in `text`, or None for text that is not one of this gacc's format.
    pub(crate) fn parse(text: &str) -> Option<RunRecord> {
        let record: RunRecord = serde_json::from_str(text).ok()?;
        (record.schema.is_empty() || record.schema == RUN_SCHEMA).then_some(record)
    }
}

/// The records of an experiment's runs under `runs` (`runs/<name>`), newest first; folders
/// without a readable `run.json` are passed over.
pub(crate) fn newest_first(runs: &std::path::Path) -> Vec<(std::path::PathBuf, RunRecord)> {
    let mut folders: Vec<_> = std::fs::read_dir(runs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.is_dir()
                && !path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    folders.sort();
    folders
        .into_iter()
        .rev()
        .filter_map(|folder| {
            let text = std::fs::read_to_string(folder.join(crate::store::run_folder::RUN)).ok()?;
            Some((folder, RunRecord::parse(&text)?))
        })
        .collect()
}

/// Marks `stopped` each record under `runs` (an experiment's runs) whose run is said to be
/// going though its process on this machine is gone; returns the folders marked.
pub(crate) fn settle_orphans(runs: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut settled = Vec::new();
    for (folder, mut record) in newest_first(runs) {
        if !record.orphaned() {
            continue;
        }
        if let Some(progress) = record.progress.as_mut() {
            progress.state = RunStatus::Stopped;
        }
        let path = folder.join(crate::store::run_folder::RUN);
        if crate::files::write(&path, crate::files::pretty(&record).as_bytes()).is_ok() {
            settled.push(folder);
        }
    }
    settled
}

/// Whether process `pid` is alive and a gacc (a pid taken again by another program is not).
fn gacc_alive(pid: u32) -> bool {
    let proc = std::path::Path::new("/proc");
    if !proc.is_dir() {
        // No way to tell: taken to be alive.
        return true;
    }
    std::fs::read(proc.join(pid.to_string()).join("cmdline"))
        .is_ok_and(|line| String::from_utf8_lossy(&line).contains("gacc"))
}

/// This machine's name, or nothing where it has none to tell.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default()
}

fn is_zero(value: &usize) -> bool {
    *value == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_record_is_written_with_its_keys_in_order_and_an_older_one_still_loads() {
        let record = RunRecord {
            endpoints: BTreeMap::from([("m".to_owned(), EndpointRecord::default())]),
            phases: vec![("prepare".into(), 0.5)],
            ..RunRecord::here()
        };
        let text = serde_json::to_string(&record).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            text,
            value.to_string(),
            "the keys in the order a JSON map writes them"
        );
        assert_eq!(value["phases"], json!([["prepare", 0.5]]));
        // An older run.json: no endpoints, no landlock_abi.
        let older = RunRecord::parse(r#"{"started": "2026-01-01T00:00:00Z", "seconds": 2.5, "failures": 1}"#)
            .unwrap();
        assert_eq!((older.seconds, older.failures, older.landlock_abi), (2.5, 1, 0));
        assert!(older.endpoints.is_empty());
        assert!(RunRecord::parse("not json").is_none());
        // Another gacc's format is not read as this one's.
        assert!(RunRecord::parse(r#"{"schema": "gacc.run/2", "seconds": 1}"#).is_none());
        assert_eq!(RunRecord::parse(&text).unwrap().schema, "gacc.run/1");
    }

    #[test]
    fn calls_and_paid_are_written_per_role_with_the_audit_apart_and_read_back() {
        use crate::protocol::Role;
        use crate::store::usage::{CallCounts, RunCalls, Usage};
        let counts = |made, cached| CallCounts {
            made,
            cached,
            ..CallCounts::default()
        };
        let mut record = RunRecord::here();
        record.calls = RunCalls {
            roles: BTreeMap::from([(Role::Compressor, counts(2, 0)), (Role::Reader, counts(1, 5))]),
            audit: counts(0, 0),
        };
        record.paid = BTreeMap::from([(
            Role::Reader,
            Usage {
                input_tokens: 7,
                cost_usd: 0.5,
                ..Usage::default()
            },
        )]);
        let value = serde_json::to_value(&record).unwrap();
        assert_eq!(value["calls"]["reader"]["cached"], 5);
        assert!(value["calls"].get("audit").is_none(), "no audit, no key");
        assert_eq!(value["paid"]["reader"]["cost_usd"], 0.5);
        assert_eq!(RunRecord::parse(&value.to_string()), Some(record.clone()));
        record.calls.audit = counts(3, 1);
        let value = serde_json::to_value(&record).unwrap();
        assert_eq!(value["calls"]["audit"]["made"], 3);
        let read = RunRecord::parse(&value.to_string()).unwrap();
        assert_eq!(read.calls.total(|c| c.made), 6);
        assert_eq!(read, record);
    }
}
