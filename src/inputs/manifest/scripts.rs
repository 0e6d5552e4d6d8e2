//! The files a callback's command runs (SPEC §4, "a script is part of its callback"): an edit
//! to a compressor script, or to a module beside it that it imports, changes the callback's
//! identity and so re-runs exactly its calls. A `revision` the user pins keeps the manual way.
//!
//! Found from the command: each argument that names a file inside the experiment's folder
//! (the program itself when it is a path), `python -m module`'s module, the Python modules a
//! `.py` file imports from beside it (followed through what they import), and the files the
//! callback's `files` globs match. Each is hashed, by its path relative to the manifest's
//! folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::CallbackSpec;
use crate::error::Problem;
use crate::hash::sha256;

/// The most files one callback's identity follows (a glob over a data folder is a mistake).
const MOST_FILES: usize = 1000;
/// A file larger than this (model weights an argument names) is identified by its size and
/// modification time, not read whole at every load: a copy or a touch re-runs its calls, as an
/// edit does.
const MOST_HASHED_BYTES: u64 = 64 << 20;

/// `spec`'s files and their SHA-256, by path relative to `folder`; empty where the command
/// names no file of the experiment. They are hashed where a `revision` is pinned too, though not
/// into the identity then, so that a run can say the files changed under the same revision.
pub(crate) fn files(
    spec: &CallbackSpec,
    folder: &Path,
    place: &str,
) -> Result<BTreeMap<String, String>, Problem> {
    let mut found = BTreeMap::new();
    let Some(command) = &spec.command else {
        return Ok(found);
    };
    let mut queue: Vec<PathBuf> = Vec::new();
    let mut module_next = false;
    for argument in command {
        if module_next {
            queue.extend(module(folder, argument));
            module_next = false;
            continue;
        }
        if argument == "-m" {
            module_next = true;
            continue;
        }
        let path = folder.join(argument);
        if !argument.starts_with('-') && path.is_file() && inside(&path, folder) {
            queue.push(path);
        }
    }
    for pattern in &spec.files {
        let full = folder.join(pattern);
        let matched = glob::glob(&full.to_string_lossy()).map_err(|error| Problem {
            place: format!("{place}.files"),
            message: format!("`{pattern}` is not a glob: {error}"),
        })?;
        queue.extend(matched.flatten().filter(|p| p.is_file()));
    }
    while let Some(path) = queue.pop() {
        let shown = path
            .strip_prefix(folder)
            .unwrap_or(&path)
            .to_string_lossy()
            .into_owned();
        if found.contains_key(&shown) {
            continue;
        }
        if found.len() >= MOST_FILES {
            return Err(Problem {
                place: place.to_owned(),
                message: format!(
                    "the command and `files` name more than {MOST_FILES} files; pin `revision` or narrow `files`"
                ),
            });
        }
        let unreadable = |error: std::io::Error| Problem {
            place: place.to_owned(),
            message: format!("cannot read {}, which the callback runs: {error}", path.display()),
        };
        let metadata = std::fs::metadata(&path).map_err(unreadable)?;
        if metadata.len() > MOST_HASHED_BYTES {
            let modified = metadata
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            found.insert(shown, format!("{} bytes, modified {modified}", metadata.len()));
            continue;
        }
        let bytes = std::fs::read(&path).map_err(unreadable)?;
        if path.extension().is_some_and(|e| e == "py") {
            let beside = path.parent().unwrap_or(folder);
            let text = String::from_utf8_lossy(&bytes);
            for name in imports(&text) {
                queue.extend(module(beside, &name).into_iter().filter(|p| inside(p, folder)));
            }
        }
        found.insert(shown, sha256(&bytes));
    }
    Ok(found)
}

/// Whether `path` lies in `folder` (the experiment's files, not the system's).
fn inside(path: &Path, folder: &Path) -> bool {
    std::fs::canonicalize(path).is_ok_and(|p| p.starts_with(folder))
}

/// The files of Python module `name` (`pkg.mod`) found under `root`: `pkg/mod.py`, or a
/// package's `.py` files.
fn module(root: &Path, name: &str) -> Vec<PathBuf> {
    let relative: PathBuf = name.split('.').collect();
    let file = root.join(&relative).with_extension("py");
    if file.is_file() {
        return vec![file];
    }
    let package = root.join(&relative);
    if package.join("__init__.py").is_file() || package.join("__main__.py").is_file() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&package)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "py"))
            .collect();
        files.sort();
        return files;
    }
    // `from pkg import mod` may name a module of a package found above.
    let top = name.split('.').next().unwrap_or(name);
    if top != name {
        return module(root, top);
    }
    Vec::new()
}

/// The top-level modules a Python file imports (`import a, b.c`, `from a.b import c`, and
/// `from . import c` as `c`), read line by line: what a script names beside it.
fn imports(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("import ") {
            for part in rest.split(',') {
                if let Some(name) = part.split_whitespace().next() {
                    names.push(name.to_owned());
                }
            }
        } else if let Some(rest) = line.strip_prefix("from ") {
            let mut words = rest.split_whitespace();
            let (Some(from), Some("import")) = (words.next(), words.next()) else {
                continue;
            };
            let from = from.trim_start_matches('.');
            if from.is_empty() {
                // `from . import a, b`: modules beside the file.
                let rest: String = words.collect::<Vec<_>>().join(" ");
                for part in rest.split(',') {
                    let part = part.trim().trim_matches(|c| c == '(' || c == ')');
                    if let Some(name) = part.split_whitespace().next() {
                        names.push(name.to_owned());
                    }
                }
            } else {
                names.push(from.to_owned());
            }
        }
    }
    names
}

/// Finds a callback's program: a path with a `/` relative to the manifest, else on PATH.
pub(crate) fn find_program(program: &str, folder: &Path) -> Option<PathBuf> {
    let is_file = |path: &Path| path.is_file();
    if program.contains('/') {
        let path = folder.join(program);
        return is_file(&path).then_some(path);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|path| is_file(path))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_s_files_its_modules_and_a_large_file_by_size() {
        let folder = tempfile::tempdir().unwrap();
        let folder = std::fs::canonicalize(folder.path()).unwrap();
        std::fs::create_dir(folder.join("callbacks")).unwrap();
        std::fs::write(folder.join("callbacks/run.py"), "import helper\nimport json\n").unwrap();
        std::fs::write(folder.join("callbacks/helper.py"), "from . import deeper\n").unwrap();
        std::fs::write(folder.join("callbacks/deeper.py"), "x = 1\n").unwrap();
        let weights = std::fs::File::create(folder.join("weights.bin")).unwrap();
        weights.set_len(MOST_HASHED_BYTES + 1).unwrap();
        let spec: CallbackSpec = toml::from_str(
            "command = [\"python3\", \"callbacks/run.py\", \"--weights\", \"weights.bin\", \"/etc/hostname\"]",
        )
        .unwrap();
        let found = files(&spec, &folder, "m.toml").unwrap();
        let names: Vec<&str> = found.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "callbacks/deeper.py",
                "callbacks/helper.py",
                "callbacks/run.py",
                "weights.bin"
            ],
            "the script, the modules it imports (followed), the named file; nothing outside"
        );
        assert!(found["weights.bin"].starts_with(&format!("{} bytes, modified ", MOST_HASHED_BYTES + 1)));
        assert_eq!(found["callbacks/deeper.py"], sha256(b"x = 1\n"));
        let pinned: CallbackSpec =
            toml::from_str("command = [\"python3\", \"callbacks/run.py\"]\nrevision = \"2\"").unwrap();
        assert_eq!(
            files(&pinned, &folder, "m.toml").unwrap().len(),
            3,
            "a pinned revision's files are hashed too (to say they changed)"
        );
    }

    #[test]
    fn imports_are_read_in_each_form() {
        let text = "import os, helper as h\nfrom lib.sub import thing\nfrom . import beside, (other)\n  import indented\nx = 'import nothing'\n";
        assert_eq!(
            imports(text),
            ["os", "helper", "lib.sub", "beside", "other", "indented"]
        );
    }
}
