//! What a callback's sandbox grants (SPEC §3): its declared paths, unless they expose the
//! experiment; its program and the interpreter installations behind it (a venv, pyenv, uv,
//! Homebrew); the modules beside a script; and never a file of the experiment.

use std::path::{Path, PathBuf};

use super::{Grants, INSTALLATION_FOLDERS, Protected, real_path};
use crate::inputs::manifest::SandboxSpec;

/// A script's folder, to list (an interpreter finds its modules by listing), unless it holds
/// any of the experiment's files: then not even their names are shown, and only what the
/// script opens by name beside it is readable.
fn listable_folder(script: &Path, protected: &Protected) -> Option<PathBuf> {
    let folder = script.parent()?;
    protected
        .exposed_by(folder)
        .is_none()
        .then(|| folder.to_path_buf())
}

/// The most entries beside a script that are granted one by one.
const MAX_SIBLINGS: usize = 256;

/// The files and folders beside `script` that hold none of the experiment's files: what a
/// script imports from its own folder (`import helpers`), never the manifest or the dataset
/// that may lie there too.
fn siblings(script: &Path, protected: &Protected) -> Vec<PathBuf> {
    let Some(folder) = script.parent() else {
        return Vec::new();
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(folder)
        .map(|entries| entries.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    entries
        .into_iter()
        .filter(|path| path != script && protected.exposed_by(path).is_none())
        .take(MAX_SIBLINGS)
        .collect()
}

pub(super) fn grants(
    protected: &Protected,
    spec: Option<&SandboxSpec>,
    argv: &[String],
    builtin: bool,
    folder: &Path,
) -> Result<Grants, Vec<String>> {
    let mut problems = Vec::new();
    let mut out = Grants {
        network: spec.is_none_or(|s| s.network),
        ..Grants::default()
    };
    for (key, paths, into) in [
        (
            "read",
            spec.map(|s| &s.read[..]).unwrap_or_default(),
            &mut out.read,
        ),
        (
            "write",
            spec.map(|s| &s.write[..]).unwrap_or_default(),
            &mut out.write,
        ),
    ] {
        for path in paths {
            let full = folder.join(path);
            match protected.exposed_by(&full) {
                Some(what) => problems.push(format!(
                    "`sandbox.{key}` path `{}` would expose {what} to the callback: name a folder that holds none of the experiment's files",
                    path.display()
                )),
                None => into.push(full),
            }
        }
    }
    let Some(program) = argv.first().map(PathBuf::from) else {
        return Err(problems);
    };
    if let Some(what) = protected.exposed_by(&program) {
        problems.push(format!(
            "the program `{}` is {what} (or lies among its files), which a sandboxed callback cannot read",
            program.display()
        ));
    }
    // The program, and the file it links to; and gacc itself, so a script may wrap a built-in.
    out.read.push(program.clone());
    if let Ok(real) = std::fs::canonicalize(&program)
        && real != program
    {
        out.read.push(real);
    }
    if !builtin && let Ok(gacc) = std::env::current_exe() {
        out.read.push(gacc);
    }
    if !builtin {
        interpreter_grants(protected, argv, &program, folder, &mut out, &mut problems);
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// What a program a user wrote needs besides itself: the installation of every hop of its
/// symlinks and of its script's interpreter, the modules beside a script, and the files its
/// arguments name (unless they are the experiment's, which is a problem).
fn interpreter_grants(
    protected: &Protected,
    argv: &[String],
    program: &Path,
    folder: &Path,
    out: &mut Grants,
    problems: &mut Vec<String>,
) {
    // The installation of every hop of the program's symlinks (a venv's python links to
    // pyenv's, uv's or Homebrew's), and the one a venv's pyvenv.cfg names as its home.
    let shebang = shebang_interpreter(program);
    // A program that is a script: what lies beside it is its modules, as for an argument.
    if shebang.is_some() && protected.exposed_by(program).is_none() {
        out.read.extend(siblings(&folder.join(program), protected));
        out.list.extend(listable_folder(&folder.join(program), protected));
    }
    let interpreters = [Some(program.to_path_buf()), shebang];
    for installation in interpreters
        .iter()
        .flatten()
        .flat_map(|p| interpreter_installations(p))
    {
        if protected.exposed_by(&installation).is_none() {
            // Packages installed in development mode live where their .pth files point.
            for source in path_file_entries(&installation) {
                if protected.exposed_by(&source).is_none() {
                    out.read.push(source);
                }
            }
            out.read.push(installation);
        }
    }
    // Arguments naming files (an interpreter's script): readable, unless the experiment's;
    // and what lies beside a script (the modules it imports), but for the experiment's files.
    for argument in &argv[1..] {
        let path = folder.join(argument);
        if !path.is_file() {
            continue;
        }
        match protected.exposed_by(&path) {
            Some(what) => problems.push(format!(
                "the argument `{argument}` names {what}, which a sandboxed callback cannot read"
            )),
            None => {
                out.read.extend(siblings(&path, protected));
                out.list.extend(listable_folder(&path, protected));
                out.read.push(path);
            }
        }
    }
}

/// The installation a program belongs to: the parent of its `bin`, `sbin` or `shims` folder,
/// The interpreter a script's `#!` line runs: its path, or for `#!/usr/bin/env NAME` the
/// program NAME is on PATH (the callback's PATH is gacc's).
fn shebang_interpreter(script: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let read = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = std::str::from_utf8(&head[..read]).ok()?.lines().next()?;
    let mut words = line.strip_prefix("#!")?.split_whitespace();
    let interpreter = PathBuf::from(words.next()?);
    if interpreter.file_name().is_some_and(|n| n == "env") {
        let name = words.find(|w| !w.starts_with('-'))?;
        let path = std::env::var_os("PATH")?;
        return std::env::split_paths(&path)
            .map(|folder| folder.join(name))
            .find(|p| p.is_file());
    }
    Some(interpreter)
}

/// The folders a Python installation's `site-packages` adds to its path: each line of its
/// `.pth` files that names a folder (`pip install -e` writes one), and the source folders of
/// setuptools' editable-install finders (`__editable___*_finder.py`, their `MAPPING`).
pub(super) fn path_file_entries(installation: &Path) -> Vec<PathBuf> {
    let pattern = installation.join("lib/python*/site-packages/*");
    let Some(pattern) = pattern.to_str() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for file in glob::glob(pattern).into_iter().flatten().flatten() {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (Some(site), Ok(text)) = (file.parent(), std::fs::read_to_string(&file)) else {
            continue;
        };
        if name.ends_with(".pth") {
            let entries = text
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with("import "));
            found.extend(entries.map(|entry| site.join(entry)).filter(|p| p.is_dir()));
        } else if name.starts_with("__editable__") && name.ends_with("_finder.py") {
            for line in text.lines().filter(|l| l.starts_with("MAPPING")) {
                let quoted = line.split(['\'', '"']).skip(1).step_by(2);
                found.extend(
                    quoted
                        .map(PathBuf::from)
                        .filter(|p| p.is_absolute() && p.exists()),
                );
            }
        }
    }
    found
}

/// The most symlinks followed from a program to the file it runs.
const MAX_LINKS: usize = 16;

/// Where a program really lives: the installation of each hop of its symlink chain, and for a
/// virtual environment (its `pyvenv.cfg`: venv, virtualenv, uv, poetry) the installation its
/// `home` names.
fn interpreter_installations(program: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    let mut hop = program.to_path_buf();
    for _ in 0..MAX_LINKS {
        found.extend(installation(&hop));
        let Ok(target) = std::fs::read_link(&hop) else {
            break;
        };
        hop = hop.parent().unwrap_or(Path::new("/")).join(target);
    }
    for venv in found.clone() {
        let Ok(config) = std::fs::read_to_string(venv.join("pyvenv.cfg")) else {
            continue;
        };
        for line in config.lines() {
            let (key, value) = line.split_once('=').unwrap_or((line, ""));
            let path = PathBuf::from(value.trim());
            match key.trim() {
                // The folder of the base interpreter (`…/bin`).
                "home" => found.extend(installation(&path.join("python"))),
                "executable" | "base-executable" => found.extend(installation(&path)),
                _ => {}
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// never `/` or the home folder.
pub(super) fn installation(program: &Path) -> Option<PathBuf> {
    let folder = program.parent()?;
    let name = folder.file_name()?.to_str()?;
    let installation = folder.parent()?;
    let home = std::env::var_os("HOME").map(PathBuf::from);
    (INSTALLATION_FOLDERS.contains(&name)
        && installation.parent().is_some()
        && Some(real_path(installation)) != home.as_deref().map(real_path))
    .then(|| installation.to_path_buf())
}
