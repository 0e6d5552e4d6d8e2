//! `gacc bench --baseline PATH`: this gacc and another gacc binary side by side on the same
//! synthetic experiment, each a whole process: the run folder's size, the cached re-run's median
//! wall time, and the median time of counting the dataset's tokens (`gacc dataset stats`), taken
//! in turn round by round so that a noisy machine slows both alike; each as this / baseline.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::{Value, json};

use super::Measurement;
use crate::error::{Error, io};

/// One of the two binaries: its label, its path, and the cache and runs folders it uses.
struct Side {
    label: &'static str,
    exe: PathBuf,
}

impl Side {
    fn cache(&self, folder: &Path) -> PathBuf {
        folder.join(format!("cache-{}", self.label))
    }

    fn runs(&self, folder: &Path) -> PathBuf {
        folder.join(format!("runs-{}", self.label))
    }

    /// `gacc run bench.toml` on its own cache: its wall time and the run folder it printed.
    fn run(&self, folder: &Path) -> Result<(f64, PathBuf), Error> {
        let cache = format!("run.cache=\"{}\"", self.cache(folder).display());
        let runs = self.runs(folder);
        let args = ["run", "bench.toml", "-q", "--set", &cache, "--out"];
        let (seconds, stdout) = self.time(folder, &args, Some(&runs))?;
        let printed = stdout.lines().last().unwrap_or("").trim();
        Ok((seconds, folder.join(printed)))
    }

    /// The process's wall time and stdout; an exit status other than 0 is an error naming it.
    fn time(&self, folder: &Path, args: &[&str], last: Option<&Path>) -> Result<(f64, String), Error> {
        let mut command = Command::new(&self.exe);
        command.current_dir(folder).args(args);
        if let Some(last) = last {
            command.arg(last);
        }
        let started = Instant::now();
        let output = command.output().map_err(io(&self.exe))?;
        let seconds = started.elapsed().as_secs_f64();
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            return Err(Error::Io {
                path: self.exe.clone(),
                message: format!(
                    "`{} {}` in {} ended with {}: {}",
                    self.label,
                    args.join(" "),
                    folder.display(),
                    output.status,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ),
            });
        }
        Ok((seconds, String::from_utf8_lossy(&output.stdout).into_owned()))
    }
}

/// The bytes of every file under `folder`.
fn bytes_under(folder: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return 0;
    };
    (entries.flatten())
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => bytes_under(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// A measurement of this against the baseline: both figures, and their ratio.
fn compared(name: &str, (this, baseline): (f64, f64), unit: &'static str, detail: Value) -> Measurement {
    let ratio = if baseline > 0.0 { this / baseline } else { f64::NAN };
    let mut detail = detail;
    detail["this"] = json!(this);
    detail["baseline"] = json!(baseline);
    detail["ratio"] = json!((ratio * 1000.0).round() / 1000.0);
    Measurement {
        name: format!("vs baseline: {name}"),
        value: this,
        unit,
        detail,
    }
}

/// The comparison, on the experiment `folder` holds (`bench.toml`, `dataset.jsonl`): a full run of
/// each binary first (each on a cache of its own, timed once), then `rounds` rounds of a cached re-run and a
/// token count by each, in turn.
pub(super) fn compare(folder: &Path, baseline: &Path, rounds: usize) -> Result<Vec<Measurement>, Error> {
    let this = std::env::current_exe().map_err(io(Path::new("gacc")))?;
    let baseline = std::fs::canonicalize(baseline).map_err(io(baseline))?;
    let sides = [
        Side {
            label: "this",
            exe: this,
        },
        Side {
            label: "baseline",
            exe: baseline,
        },
    ];
    let mut full = [0.0; 2];
    for (at, side) in sides.iter().enumerate() {
        let _ = std::fs::remove_dir_all(side.cache(folder));
        let _ = std::fs::remove_dir_all(side.runs(folder));
        // Fills its cache; its time is measured, its folder is not (the re-runs' are).
        let (seconds, made) = side.run(folder)?;
        full[at] = seconds;
        let _ = std::fs::remove_dir_all(made);
    }
    let (mut reruns, mut counts, mut sizes) = ([vec![], vec![]], [vec![], vec![]], [0u64, 0]);
    let mut tokens: [Option<Value>; 2] = [None, None];
    for round in 0..rounds {
        // The first to go alternates, so neither always runs on a warmer machine.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for at in order {
            let side = &sides[at];
            let (seconds, made) = side.run(folder)?;
            reruns[at].push(seconds);
            sizes[at] = bytes_under(&made);
            let _ = std::fs::remove_dir_all(&made);
            let (seconds, stdout) =
                side.time(folder, &["dataset", "stats", "dataset.jsonl", "--json"], None)?;
            counts[at].push(seconds);
            let stats: Value = serde_json::from_str(&stdout).unwrap_or_default();
            tokens[at] = Some(stats["tokens"]["total"].clone());
        }
    }
    let same_tokens = tokens[0] == tokens[1];
    Ok(vec![
        compared(
            "full run on an empty cache, one each",
            (full[0], full[1]),
            "s",
            json!({}),
        ),
        compared(
            "run folder",
            (sizes[0] as f64 / 1e6, sizes[1] as f64 / 1e6),
            "MB",
            json!({}),
        ),
        compared(
            &format!("cached re-run, median of {rounds}"),
            (median(reruns[0].clone()), median(reruns[1].clone())),
            "s",
            json!({"each_this": reruns[0], "each_baseline": reruns[1]}),
        ),
        compared(
            &format!("gacc dataset stats, median of {rounds}"),
            (median(counts[0].clone()), median(counts[1].clone())),
            "s",
            json!({"tokens_this": tokens[0], "tokens_baseline": tokens[1], "same_tokens": same_tokens}),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_median_and_a_ratio() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        let m = compared("x", (1.0, 4.0), "s", json!({}));
        assert_eq!(m.detail["ratio"], 0.25);
        assert_eq!(m.name, "vs baseline: x");
    }
}
