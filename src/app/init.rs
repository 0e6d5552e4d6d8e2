//! `gacc init [DIR]`: a new experiment a user can run at once and then edit: a commented
//! manifest (with its JSON Schema for editors), a small dataset in the right format, a Python
//! compressor on the helper and a README line. The helper is the installed `gacc_callback` when
//! the manifest's `python3` imports it (gacc's wheel installs it beside the binary); otherwise a
//! copy of `python/gacc_callback/__init__.py` beside the compressor.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Invalid, io};

/// The files `gacc init` always writes, by their path in the new folder.
const FILES: &[(&str, &str)] = &[
    (
        "experiment.toml",
        include_str!("../../templates/init/experiment.toml"),
    ),
    (
        "data/sources.jsonl",
        include_str!("../../templates/init/sources.jsonl"),
    ),
    (
        "callbacks/compress.py",
        include_str!("../../templates/init/compress.py"),
    ),
    ("README.md", include_str!("../../templates/init/README.md")),
];

/// The helper's copy, written when no installed one is importable.
const HELPER: (&str, &str) = (
    "callbacks/gacc_callback.py",
    include_str!("../../python/gacc_callback/__init__.py"),
);

/// The manifest's JSON Schema, beside it.
const SCHEMA: &str = "gacc.schema.json";

/// The interpreter the new manifest's compressor command names.
const PYTHON: &str = "python3";

/// How long the interpreter may take to say whether it imports the helper.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a new experiment's compressor finds the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Helper {
    /// Installed: the module's file, as `python3` imports it in a callback's environment, and
    /// that interpreter's absolute path (the manifest names it, so that a run finds the helper
    /// when the environment it was installed in is no longer active).
    Installed { module: PathBuf, python: PathBuf },
    /// `callbacks/gacc_callback.py`, written beside the compressor.
    Copied,
}

impl Helper {
    /// How the compressor's doc and the experiment's README name it.
    fn described(&self) -> &'static str {
        match self {
            Helper::Installed { .. } => "installed with gacc in the Python that runs the script",
            Helper::Copied => "copied beside the script as `gacc_callback.py`",
        }
    }

    /// The interpreter the manifest's command names.
    fn python(&self) -> String {
        match self {
            Helper::Installed { python, .. } => python.display().to_string(),
            Helper::Copied => PYTHON.to_owned(),
        }
    }
}

/// What `gacc init` wrote.
pub(crate) struct Written {
    pub(crate) paths: Vec<PathBuf>,
    pub(crate) helper: Helper,
}

/// The `gacc_callback` module `python3` imports in a callback's environment (cleared but for
/// `PATH`, `HOME` and the locale; run from `/`, so no copy in the current folder counts), with
/// that interpreter's absolute path; or None: no `python3`, no such module, or no answer within
/// `PROBE_TIMEOUT`.
pub(crate) fn installed_helper() -> Option<Helper> {
    let line = [
        PYTHON.into(),
        "-c".into(),
        "import gacc_callback, sys; sys.stdout.write(gacc_callback.__file__ + '\\n' + sys.executable)".into(),
    ];
    let mut command = crate::protocol::callback_command(
        &line,
        Path::new("/"),
        "compressor",
        crate::protocol::Mode::Oneshot,
        [],
    );
    command.stdin(std::process::Stdio::null());
    command.stderr(std::process::Stdio::null());
    let mut child = command.spawn().ok()?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let output = child.wait_with_output().ok()?;
    let printed = String::from_utf8(output.stdout).ok()?;
    let (module, python) = printed.split_once('\n')?;
    let found = output.status.success() && !module.is_empty() && Path::new(python).is_absolute();
    found.then(|| Helper::Installed {
        module: PathBuf::from(module),
        python: PathBuf::from(python),
    })
}

/// Writes a new experiment into `folder` (made if missing), its compressor on `helper`;
/// refuses, writing nothing, when any of its files exists.
pub(crate) fn init(folder: &Path, helper: Helper) -> Result<Written, Error> {
    let files: Vec<(&str, &str)> = FILES
        .iter()
        .copied()
        .chain((helper == Helper::Copied).then_some(HELPER))
        .collect();
    let existing: Vec<String> = files
        .iter()
        .map(|(name, _)| folder.join(name))
        .chain([folder.join(SCHEMA)])
        .filter(|path| path.exists())
        .map(|path| path.display().to_string())
        .collect();
    if !existing.is_empty() {
        return Err(Invalid::one(
            folder.display().to_string(),
            format!(
                "gacc init does not overwrite files: {} already exist",
                existing.join(", ")
            ),
        )
        .into());
    }
    let name = experiment_name(folder);
    let mut paths = Vec::new();
    for (relative, text) in files {
        let path = folder.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let text = if relative == HELPER.0 {
            text.to_owned()
        } else {
            text.replace("{{name}}", &name)
                .replace("{{helper}}", helper.described())
                .replace("{{python}}", &toml_string(&helper.python()))
        };
        crate::files::write(&path, text.as_bytes())?;
        paths.push(path);
    }
    // The manifest's first line names this file for editors (Even Better TOML, taplo).
    let schema = folder.join(SCHEMA);
    crate::files::write(&schema, super::schema_text(super::Schema::Manifest).as_bytes())?;
    paths.push(schema);
    // The folder is the experiment's project: `gacc run DIR/experiment.toml` from anywhere
    // finds it (it holds `runs/<name>/`) and keeps its runs and cache here.
    for place in [
        folder.join("runs").join(&name),
        folder.join(crate::inputs::manifest::PROJECT_MARKER),
    ] {
        std::fs::create_dir_all(&place).map_err(io(&place))?;
    }
    let script = folder.join("callbacks/compress.py");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).map_err(io(&script))?;
    Ok(Written { paths, helper })
}

/// `text` as the inside of a TOML basic string.
fn toml_string(text: &str) -> String {
    let quoted = toml::Value::String(text.to_owned()).to_string();
    quoted[1..quoted.len() - 1].to_owned()
}

/// The folder's name as an experiment name (`[a-z0-9][a-z0-9_-]*`), or `my-experiment`.
fn experiment_name(folder: &Path) -> String {
    let absolute = std::path::absolute(folder).unwrap_or_else(|_| folder.to_path_buf());
    let base = absolute
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let name = name.trim_start_matches(['-', '_']).to_owned();
    if name.is_empty() {
        "my-experiment".into()
    } else {
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_folder() {
        assert_eq!(experiment_name(Path::new("/tmp/My Study")), "my-study");
        assert_eq!(experiment_name(Path::new("/tmp/_x.y")), "x-y");
        assert_eq!(experiment_name(Path::new("/")), "my-experiment");
    }
}
