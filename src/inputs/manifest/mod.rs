//! The manifest (SPEC §2): one TOML file, layered with `GACC_` variables and `--set` overrides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use crate::inputs::models::{ModelCall, ModelSpec};
use crate::inputs::records::SourceRecord;

mod check;
mod load;
mod run;
mod sandbox;
pub(crate) mod scripts;
use crate::protocol::{BudgetRule, CallbackSet, Condition, Mode, Role, Timeout};
use crate::protocol::{Ratio, TruncationMode};
pub(crate) use check::warnings;
pub(crate) use load::{check_endpoints, load, load_as, ready_callback, toml_error};
pub(crate) use run::{LOCAL_ENGINE, RunSpec, StopSpec};
pub(crate) use sandbox::SandboxSpec;
pub(crate) use scripts::find_program;

pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const DEFAULT_RETRIES: u32 = 2;
pub(crate) const DEFAULT_RUN_CONCURRENCY: usize = 8;
/// The prefix of environment variables that override manifest values.
pub(crate) const ENV_PREFIX: &str = "GACC_";

/// What a run recorded of its callbacks (run.json's `scripts` and `templates`), from which its
/// replay (`gacc verify`) takes their identities rather than from files that need not be there.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    /// Per callback key: its script files and their SHA-256.
    pub scripts: BTreeMap<String, BTreeMap<String, String>>,
    /// Per template path, as the manifest writes it: the text the run read.
    pub templates: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default = "default_seeds")]
    pub seeds: Vec<u64>,
    /// Retention fractions: `L = floor(r · N)`.
    #[serde(default)]
    pub ratios: Vec<Ratio>,
    /// Absolute budgets in tokens: `L = min(b, N)`. Beside or instead of `ratios`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<usize>,
    #[serde(default = "default_conditions")]
    pub conditions: Vec<Condition>,
    /// How a cut inside a multi-byte character decodes (SPEC §1).
    #[serde(default)]
    pub truncation: TruncationMode,
    #[serde(default)]
    pub tokenizer: TokenizerSpec,
    pub dataset: DatasetSpec,
    pub compressors: BTreeMap<String, CallbackSpec>,
    pub reader: CallbackSpec,
    pub judge: CallbackSpec,
    /// Further judges, by name, that `[audit]` may name (SPEC §10): the same fields as `[judge]`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub judges: BTreeMap<String, CallbackSpec>,
    /// Further readers, by name, that `[audit] readers` may name (SPEC §11): the same fields
    /// as `[reader]`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub readers: BTreeMap<String, CallbackSpec>,
    /// Judges that re-judge the scoring judge's answers, and human labels (SPEC §10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditSpec>,
    /// Floor and ceiling reads, and budget-at-target shares (SPEC §11).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anchors: Option<AnchorsSpec>,
    /// Model endpoints (SPEC §8), named by model built-ins' `params.model`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelSpec>,
    #[serde(default)]
    pub run: RunSpec,
}

/// `[audit]` (SPEC §10): the judges that re-judge the answers, the share of answers each
/// looks at, and a file of human verdicts.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditSpec {
    /// Built-in rule judges (`exact`, `normalized`, `contains`, `token-f1`) or `[judges.*]` names.
    #[serde(default)]
    pub judges: Vec<String>,
    /// The share of answers audited, a seeded sample (default 1).
    #[serde(default = "whole")]
    pub fraction: f64,
    /// Per judge, a share overriding `fraction`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fractions: BTreeMap<String, f64>,
    /// Human verdicts (CSV or JSON Lines): `question_id`, `answer`, `correct`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<PathBuf>,
    /// A reader panel (SPEC §11): built-in rule readers or `[readers.*]` names that re-read
    /// the memories, their answers judged by the scoring judge.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readers: Vec<String>,
    /// The share of (memory, question) pairs each panel reader re-reads, seeded (default 1).
    #[serde(default = "whole")]
    pub reader_fraction: f64,
}

/// `[anchors]` (SPEC §11): each question also read with an empty memory (`floor`) and with its
/// whole source (`ceiling`), and the shares of the ceiling that budget at target looks for.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnchorsSpec {
    #[serde(default)]
    pub floor: bool,
    #[serde(default)]
    pub ceiling: bool,
    /// Budget-at-target shares of the ceiling's Micro (default [0.9]).
    #[serde(default = "default_targets")]
    pub targets: Vec<f64>,
}

/// Budget at target's share when `[anchors]` names none.
pub(crate) const DEFAULT_TARGET: f64 = 0.9;

fn default_targets() -> Vec<f64> {
    vec![DEFAULT_TARGET]
}

impl Manifest {
    /// Whether each question is also read with an empty memory, and with its whole source.
    pub(crate) fn anchored(&self) -> (bool, bool) {
        self.anchors
            .as_ref()
            .map_or((false, false), |a| (a.floor, a.ceiling))
    }

    /// The budget-at-target shares (SPEC §11).
    pub(crate) fn targets(&self) -> Vec<f64> {
        self.anchors
            .as_ref()
            .map_or_else(default_targets, |a| a.targets.clone())
    }
}

fn whole() -> f64 {
    1.0
}

impl AuditSpec {
    /// The share of answers `judge` audits.
    pub(crate) fn fraction_of(&self, judge: &str) -> f64 {
        self.fractions.get(judge).copied().unwrap_or(self.fraction)
    }
}

fn default_seeds() -> Vec<u64> {
    vec![0]
}

fn default_conditions() -> Vec<Condition> {
    vec![Condition::OwnGoal]
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenizerSpec {
    #[serde(default = "default_tokenizer_name")]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// For an external tokenizer: one process per request, or one kept running.
    #[serde(default)]
    pub mode: Mode,
    #[serde(default = "default_timeout")]
    pub timeout: Timeout,
    /// Variables passed through to an external tokenizer (e.g. `TIKTOKEN_CACHE_DIR`, where an
    /// offline tiktoken finds its vocabulary); all others are cleared, as for any callback.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Run even when the tokenizer fails verification (the report says so).
    #[serde(default)]
    pub allow_unverified: bool,
}

fn default_tokenizer_name() -> String {
    "cl100k_base".into()
}

impl Default for TokenizerSpec {
    fn default() -> Self {
        TokenizerSpec {
            name: default_tokenizer_name(),
            command: None,
            revision: None,
            mode: Mode::Oneshot,
            timeout: default_timeout(),
            env: Vec::new(),
            allow_unverified: false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DatasetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// A question table's columns by role (defaults: the roles' names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub columns: Option<crate::inputs::table::Columns>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sources: Option<Vec<SourceRecord>>,
}

/// One callback: a command or a built-in, and how to call it (SPEC §2, §3).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CallbackSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builtin: Option<String>,
    /// The user's declared version: part of every cache key. Pinned, it replaces the files
    /// the command runs in the callback's identity (an edit to them then re-runs nothing).
    #[serde(default, deserialize_with = "string_or_number")]
    #[schemars(schema_with = "string_or_number_schema")]
    pub revision: String,
    /// More files whose contents are part of the callback's identity (globs relative to the
    /// manifest), beside the ones its command names and the Python modules those import.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    #[serde(default)]
    pub mode: Mode,
    #[serde(default = "default_timeout")]
    pub timeout: Timeout,
    #[serde(default = "default_retries")]
    pub retries: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<usize>,
    /// Names of environment variables passed through; their values are never written.
    #[serde(default)]
    pub env: Vec<String>,
    /// Variables of `env` whose values are secrets beside those whose names say so (`KEY`,
    /// `TOKEN`, …: `crate::secrets::named_secret`): only secrets are taken out of what gacc keeps.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    #[serde(default = "empty_params")]
    pub params: serde_json::Value,
    /// Where the callback may read and write, and whether it may use the network (on Linux,
    /// compressors and readers run in a Landlock sandbox unless this is `false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<SandboxSpec>,
    /// A persistent callback's requests in flight per worker (default 1); more pipelines them:
    /// each request then carries an `id` that its reply echoes, in any order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_inflight: Option<usize>,
    /// A compressor that serves every budget of a source, goal shown and seed from one call
    /// (SPEC §14): its request carries `token_budgets`, its reply `memories`, one per budget.
    /// Not part of its identity: each memory is kept as a single-budget call's would be.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ladder: bool,
    /// A model built-in's user-message template (minijinja), relative to the manifest's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PathBuf>,
    /// A model built-in's system-message template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_template: Option<PathBuf>,
    /// A model built-in's endpoint and template texts, once the manifest is loaded.
    #[serde(skip)]
    #[schemars(skip)]
    pub model: Option<Arc<ModelCall>>,
    /// The files the command runs, by path relative to the manifest, and their SHA-256, once
    /// the manifest is loaded (where `revision` is pinned, they are not part of its identity).
    #[serde(skip)]
    #[schemars(skip)]
    pub script_files: std::collections::BTreeMap<String, String>,
}

pub(crate) fn default_timeout() -> Timeout {
    Timeout(DEFAULT_TIMEOUT)
}

fn default_retries() -> u32 {
    DEFAULT_RETRIES
}

fn empty_params() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// A revision is text or a number (kept as text).
fn string_or_number_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": ["string", "number"]})
}

/// A revision may be written as `"1"` or `1`; it is kept as text.
fn string_or_number<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Text(String),
        Integer(i64),
        Float(f64),
    }
    Ok(match Written::deserialize(deserializer)? {
        Written::Text(text) => text,
        Written::Integer(number) => number.to_string(),
        Written::Float(number) => number.to_string(),
    })
}

/// A manifest as loaded: its values, where it lives, and its exact text.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub manifest: Manifest,
    pub path: PathBuf,
    /// The folder relative paths are resolved from.
    pub folder: PathBuf,
    /// The experiment's home: where its default cache and runs folder are (`project_of`).
    pub project: PathBuf,
    /// The file, `GACC_` variables and `--set` overrides merged: where each value came from.
    pub sources: figment::Figment,
}

impl Manifest {
    /// Every budget a cell is made for: the ratios, then the token budgets, as listed.
    pub(crate) fn cell_budgets(&self) -> Vec<BudgetRule> {
        let ratios = self.ratios.iter().map(|&r| BudgetRule::Ratio(r));
        ratios
            .chain(self.budgets.iter().map(|&b| BudgetRule::Tokens(b)))
            .collect()
    }

    /// Every callback: its manifest key (`compressors.NAME`, `reader`, `judge`, `judges.NAME`),
    /// role and settings.
    pub(crate) fn callbacks(&self) -> Vec<(String, Role, &CallbackSpec)> {
        self.compressors
            .iter()
            .map(|(name, spec)| (format!("compressors.{name}"), Role::Compressor, spec))
            .chain([
                ("reader".to_owned(), Role::Reader, &self.reader),
                ("judge".to_owned(), Role::Judge, &self.judge),
            ])
            .chain(
                self.judges
                    .iter()
                    .map(|(name, spec)| (format!("judges.{name}"), Role::Judge, spec)),
            )
            .chain(
                self.readers
                    .iter()
                    .map(|(name, spec)| (format!("readers.{name}"), Role::Reader, spec)),
            )
            .collect()
    }

    /// The callbacks a run calls: every compressor, the reader, the judge and the audit
    /// judges of `[audit] judges` (a `[judges.*]` table no audit names is not called).
    pub(crate) fn callback_set(&self) -> CallbackSet<&CallbackSpec> {
        CallbackSet {
            compressors: self
                .compressors
                .iter()
                .map(|(name, spec)| (name.clone(), spec))
                .collect(),
            reader: &self.reader,
            judge: &self.judge,
            audits: self
                .audit_judges()
                .into_iter()
                .map(|(name, spec, _)| (name.to_owned(), spec))
                .collect(),
            panel: self
                .panel_readers()
                .into_iter()
                .map(|(name, spec, _)| (name.to_owned(), spec))
                .collect(),
        }
    }

    /// The panel readers in `[audit] readers` order: name, settings and the share they re-read.
    pub(crate) fn panel_readers(&self) -> Vec<(&str, &CallbackSpec, f64)> {
        let Some(audit) = &self.audit else {
            return Vec::new();
        };
        (audit.readers.iter())
            .filter_map(|name| Some((name.as_str(), self.readers.get(name)?, audit.reader_fraction)))
            .collect()
    }

    /// The audit judges in `[audit] judges` order: name, settings and the share they audit.
    pub(crate) fn audit_judges(&self) -> Vec<(&str, &CallbackSpec, f64)> {
        let Some(audit) = &self.audit else {
            return Vec::new();
        };
        audit
            .judges
            .iter()
            .filter_map(|name| Some((name.as_str(), self.judges.get(name)?, audit.fraction_of(name))))
            .collect()
    }
}

impl Loaded {
    /// Resolves a path written in the manifest against the manifest's folder.
    pub(crate) fn resolve(&self, path: &Path) -> PathBuf {
        self.folder.join(path)
    }

    /// Where the value at a dotted key path was given, for a message: the manifest's key, the
    /// `GACC_` variable or the `--set` override that set it last.
    pub(crate) fn place_of(&self, key: &str) -> String {
        let path: Vec<&str> = key.split('.').collect();
        load::place(
            &self.path.display().to_string(),
            &path,
            self.sources.find_metadata(key),
        )
    }
}

/// The marker of a project folder: gacc's own folder, which holds the default cache.
pub(crate) const PROJECT_MARKER: &str = ".gacc";

/// The project folder of the experiment `name` whose manifest is in `folder` (absolute): the
/// nearest folder from it up that holds `runs/<name>/`, a past run of this experiment (up to the
/// current folder when the manifest lies below it); else the current folder, when the manifest
/// lies inside it; else the manifest's own folder. So `gacc run dir/x.toml` from the parent and
/// `gacc run x.toml` from `dir` share one cache and one runs folder, whichever ran first.
/// Relative to the current folder when inside it (empty for the current folder itself), so
/// paths read as before.
pub(crate) fn project_of(folder: &Path, name: &str) -> PathBuf {
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|cwd| std::fs::canonicalize(cwd).ok());
    let inside = cwd.as_deref().filter(|cwd| folder.starts_with(cwd));
    // A manifest below the current folder looks no further up than it; one in it (or
    // elsewhere) looks up to the root, for a project that ran it from a folder above.
    let bound = inside.filter(|cwd| folder != *cwd);
    let mut candidates = folder.ancestors();
    let ran = candidates
        .by_ref()
        .take_while(|f| bound.is_none_or(|cwd| f.starts_with(cwd)))
        .find(|f| f.join("runs").join(name).is_dir());
    let project = match (ran, inside) {
        (Some(ran), _) => ran.to_path_buf(),
        (None, Some(cwd)) => cwd.to_path_buf(),
        (None, None) => folder.to_path_buf(),
    };
    match &cwd {
        Some(cwd) => project
            .strip_prefix(cwd)
            .map_or_else(|_| project.clone(), Path::to_path_buf),
        None => project,
    }
}

/// Where past runs are looked for when no manifest says (`gacc runs`, `diff`, `report`): `runs/`
/// here if there is one, else that of the nearest folder up from here holding `runs/` and
/// `.gacc/` (a project), else `runs/`.
pub(crate) fn default_runs() -> PathBuf {
    let here = PathBuf::from("runs");
    if here.is_dir() {
        return here;
    }
    let cwd = std::env::current_dir().ok();
    let project = cwd.as_deref().and_then(|cwd| {
        cwd.ancestors()
            .skip(1)
            .find(|f| f.join(PROJECT_MARKER).is_dir() && f.join("runs").is_dir())
    });
    project.map_or(here, |p| p.join("runs"))
}

/// A path as a user would like to read it: relative to the current folder when inside it.
pub(crate) fn shown(path: &Path) -> String {
    std::env::current_dir()
        .ok()
        .and_then(|cwd| path.strip_prefix(cwd).ok().map(Path::to_path_buf))
        .unwrap_or_else(|| path.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts() {
        assert_eq!("500ms".parse::<Timeout>().unwrap().0, Duration::from_millis(500));
        assert_eq!("60s".parse::<Timeout>().unwrap().0, Duration::from_secs(60));
        assert_eq!("2m".parse::<Timeout>().unwrap().0, Duration::from_secs(120));
        assert_eq!("1h".parse::<Timeout>().unwrap().0, Duration::from_secs(3600));
        for bad in ["", "0s", "1.5s", "s", "10x", "-1s"] {
            assert!(bad.parse::<Timeout>().is_err(), "{bad:?}");
        }
        assert_eq!(Timeout(Duration::from_millis(1500)).to_string(), "1500ms");
    }
}
