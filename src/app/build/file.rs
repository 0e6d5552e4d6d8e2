//! A build file (SPEC §16): `[build]` with its sources, counts, output, `[build.writer]` and
//! `[build.check]`; `[models.*]` as a manifest's (§8); `[run]` for the cache, the concurrency
//! and `max_cost_usd`. Read whole, every problem named with its key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Invalid, Problem};
use crate::inputs::manifest::{CallbackSpec, DatasetSpec, Loaded, Manifest, RunSpec};
use crate::inputs::models::ModelSpec;
use crate::protocol::Role;

/// The most goals or questions one call may be asked for.
const MOST_ITEMS: usize = 1000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildFile {
    build: BuildSpec,
    #[serde(default)]
    models: BTreeMap<String, ModelSpec>,
    #[serde(default)]
    run: RunSpec,
}

/// `[build]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BuildSpec {
    sources: SourcesSpec,
    goals_per_source: usize,
    questions_per_goal: usize,
    out: PathBuf,
    /// The seed of every writer, reader and judge call.
    #[serde(default)]
    seed: u64,
    /// Keep questions a reader answers without a memory (skips the closed-book check).
    #[serde(default)]
    keep_closed_book: bool,
    writer: CallbackSpec,
    check: CheckSpec,
}

/// `[build.check]`: the reader and judge of the ceiling and closed-book checks.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckSpec {
    reader: CallbackSpec,
    judge: CallbackSpec,
}

/// Where the sources are: a glob of text files (id = file stem), or a table of id and text.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum SourcesSpec {
    Glob(String),
    Table(Vec<SourceRow>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SourceRow {
    id: String,
    text: String,
}

/// One source to write questions of.
#[derive(Debug, Clone)]
pub(super) struct Text {
    pub id: String,
    pub text: String,
}

/// A build file read and checked, its callbacks ready to be made.
pub(super) struct Build {
    /// The build as a manifest without compressors or dataset: its reader and judge are the
    /// checks', its models and `[run]` the file's (what the callbacks and the cache are made of).
    pub loaded: Loaded,
    pub writer: CallbackSpec,
    pub sources: Vec<Text>,
    pub goals_per_source: usize,
    pub questions_per_goal: usize,
    pub seed: u64,
    pub keep_closed_book: bool,
    /// The dataset to write, and beside it `<stem>.dropped.jsonl` and `<stem>.report.md`.
    pub out: PathBuf,
}

impl Build {
    /// The file beside the dataset named `<stem>.<suffix>`.
    pub(super) fn beside(&self, suffix: &str) -> PathBuf {
        beside(&self.out, suffix)
    }
}

/// The suffixes of the dropped questions and the report, beside the dataset.
pub(super) const DROPPED: &str = "dropped.jsonl";
pub(super) const REPORT: &str = "report.md";

/// The file beside `out` named `<stem of out>.<suffix>`.
fn beside(out: &Path, suffix: &str) -> PathBuf {
    out.with_file_name(format!("{}.{suffix}", stem(out).unwrap_or_default()))
}

/// A path's file name without its extension.
fn stem(path: &Path) -> Option<String> {
    path.file_stem().map(|s| s.to_string_lossy().into_owned())
}

/// Reads the build file at `path`, its sources and its callbacks' files.
pub(super) fn read(path: &Path) -> Result<Build, Invalid> {
    let place = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|error| Invalid::one(&place, format!("cannot read the build file: {error}")))?;
    let file: BuildFile = toml::from_str(&text)
        .map_err(|error| Invalid::one(&place, crate::inputs::manifest::toml_error(&error)))?;
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let folder = std::fs::canonicalize(folder).unwrap_or_else(|_| folder.to_path_buf());
    let key = |key: &str| format!("{place}: key `{key}`");
    let mut problems = Vec::new();
    let BuildFile { build, models, run } = file;
    problems.extend(number_problems(&build, &run, &key));
    problems.extend(crate::inputs::manifest::check_endpoints(path, &models));
    let (mut writer, mut reader, mut judge) = (build.writer, build.check.reader, build.check.judge);
    for (name, role, spec) in [
        ("build.writer", Role::Writer, &mut writer),
        ("build.check.reader", Role::Reader, &mut reader),
        ("build.check.judge", Role::Judge, &mut judge),
    ] {
        problems.extend(crate::inputs::manifest::ready_callback(
            (path, &folder),
            name,
            role,
            spec,
            &models,
        ));
    }
    let sources = match build.sources {
        SourcesSpec::Glob(pattern) => files(&folder, &pattern, &key("build.sources")),
        SourcesSpec::Table(rows) => Ok(rows
            .into_iter()
            .map(|row| {
                let text = Text {
                    id: row.id,
                    text: row.text,
                };
                (text, None)
            })
            .collect()),
    };
    let out = folder.join(&build.out);
    let sources = sources
        .and_then(|sources| checked_sources(sources, &key("build.sources")))
        .and_then(|sources| not_written(sources, &out, &key("build.out")))
        .unwrap_or_else(|problem| {
            problems.push(problem);
            Vec::new()
        });
    if !problems.is_empty() {
        return Err(Invalid(problems));
    }
    Ok(Build {
        loaded: as_manifest(path, &folder, (reader, judge), (models, run), build.seed),
        writer,
        sources,
        goals_per_source: build.goals_per_source,
        questions_per_goal: build.questions_per_goal,
        seed: build.seed,
        keep_closed_book: build.keep_closed_book,
        out,
    })
}

/// What is wrong with the counts and the spending cap.
fn number_problems(build: &BuildSpec, run: &RunSpec, key: &dyn Fn(&str) -> String) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (name, count) in [
        ("build.goals_per_source", build.goals_per_source),
        ("build.questions_per_goal", build.questions_per_goal),
    ] {
        if !(1..=MOST_ITEMS).contains(&count) {
            problems.push(Problem {
                place: key(name),
                message: format!("must be a whole number from 1 to {MOST_ITEMS}, got {count}"),
            });
        }
    }
    if let Some(cap) = run.max_cost_usd
        && (!cap.is_finite() || cap < 0.0)
    {
        problems.push(Problem {
            place: key("run.max_cost_usd"),
            message: "must be a non-negative number of US dollars".into(),
        });
    }
    problems
}

/// The build as a manifest without compressors or dataset: its reader and judge are the checks',
/// its models and `[run]` the file's; what the callbacks and the cache are made of, as a run's.
fn as_manifest(
    path: &Path,
    folder: &Path,
    (reader, judge): (CallbackSpec, CallbackSpec),
    (models, run): (BTreeMap<String, ModelSpec>, RunSpec),
    seed: u64,
) -> Loaded {
    let name = stem(path).unwrap_or_else(|| "build".into());
    let project = crate::inputs::manifest::project_of(folder, &name);
    let manifest = Manifest {
        name,
        description: None,
        seeds: vec![seed],
        ratios: Vec::new(),
        budgets: Vec::new(),
        conditions: Vec::new(),
        truncation: Default::default(),
        tokenizer: Default::default(),
        dataset: DatasetSpec {
            path: None,
            columns: None,
            sources: Some(Vec::new()),
        },
        compressors: BTreeMap::new(),
        reader,
        judge,
        judges: BTreeMap::new(),
        readers: BTreeMap::new(),
        audit: None,
        anchors: None,
        models,
        run,
    };
    Loaded {
        manifest,
        path: path.to_path_buf(),
        folder: folder.to_path_buf(),
        project,
        sources: figment::Figment::new(),
    }
}

/// The text files `pattern` matches (relative to `folder`), sorted by path, each a source named
/// by its file stem.
fn files(folder: &Path, pattern: &str, place: &str) -> Result<Vec<(Text, Option<PathBuf>)>, Problem> {
    let problem = |message: String| Problem {
        place: place.to_owned(),
        message,
    };
    let full = folder.join(pattern);
    let matched = glob::glob(&full.to_string_lossy())
        .map_err(|error| problem(format!("`{pattern}` is not a glob: {error}")))?;
    let mut paths: Vec<PathBuf> = matched.flatten().filter(|p| p.is_file()).collect();
    paths.sort();
    if paths.is_empty() {
        return Err(problem(format!(
            "`{pattern}` matches no file (paths are relative to the build file's folder)"
        )));
    }
    let mut sources = Vec::new();
    for path in paths {
        let bytes = std::fs::read(&path)
            .map_err(|error| problem(format!("cannot read {}: {error}", path.display())))?;
        let text =
            String::from_utf8(bytes).map_err(|_| problem(format!("{} is not UTF-8 text", path.display())))?;
        let id = stem(&path).unwrap_or_default();
        let text = Text {
            id,
            // One line ending, so a file saved on Windows builds the same dataset.
            text: text.replace("\r\n", "\n"),
        };
        sources.push((text, Some(path)));
    }
    Ok(sources)
}

/// The sources, when the build writes none of them: a dataset, dropped rows or report among
/// its own sources would make each build read the last one's output.
fn not_written(sources: Vec<(Text, Option<PathBuf>)>, out: &Path, place: &str) -> Result<Vec<Text>, Problem> {
    let written = [out.to_path_buf(), beside(out, DROPPED), beside(out, REPORT)];
    let same = |a: &Path, b: &Path| {
        a == b || std::fs::canonicalize(a).is_ok_and(|a| std::fs::canonicalize(b).is_ok_and(|b| a == b))
    };
    for (_, path) in &sources {
        if let Some(path) = path
            .as_deref()
            .filter(|path| written.iter().any(|w| same(path, w)))
        {
            return Err(Problem {
                place: place.to_owned(),
                message: format!(
                    "{} is written by the build and matched by `build.sources`: put `out` elsewhere",
                    path.display()
                ),
            });
        }
    }
    Ok(sources.into_iter().map(|(text, _)| text).collect())
}

/// Sources with distinct, non-empty ids and some text.
fn checked_sources(
    sources: Vec<(Text, Option<PathBuf>)>,
    place: &str,
) -> Result<Vec<(Text, Option<PathBuf>)>, Problem> {
    let problem = |message: String| Problem {
        place: place.to_owned(),
        message,
    };
    let mut seen = std::collections::BTreeSet::new();
    for (source, _) in &sources {
        if source.id.trim().is_empty() {
            return Err(problem("a source has an empty id".into()));
        }
        if !seen.insert(source.id.as_str()) {
            return Err(problem(format!(
                "two sources have the id `{}` (a source's id is its file's stem)",
                source.id
            )));
        }
        if source.text.trim().is_empty() {
            return Err(problem(format!("source `{}` has no text", source.id)));
        }
    }
    Ok(sources)
}
