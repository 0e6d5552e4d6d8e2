//! `gacc init [DIR]`: a new experiment a user can run at once and then edit: a commented
//! manifest (with its JSON Schema for editors), a small dataset in the right format, a Python
//! compressor on the helper (a copy of `python/gacc_callback.py` beside it) and a README line.

use std::path::{Path, PathBuf};

use crate::error::{Error, Invalid, io};

/// The files `gacc init` writes, by their path in the new folder.
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
    (
        "callbacks/gacc_callback.py",
        include_str!("../../python/gacc_callback.py"),
    ),
    ("README.md", include_str!("../../templates/init/README.md")),
];

/// The manifest's JSON Schema, beside it.
const SCHEMA: &str = "gacc.schema.json";

/// Writes a new experiment into `folder` (made if missing); refuses, writing nothing, when
/// any of its files exists. The paths written.
pub(crate) fn init(folder: &Path) -> Result<Vec<PathBuf>, Error> {
    let existing: Vec<String> = FILES
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
    let mut written = Vec::new();
    for (relative, text) in FILES {
        let path = folder.join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        crate::files::write(&path, text.replace("{{name}}", &name).as_bytes())?;
        written.push(path);
    }
    // The manifest's first line names this file for editors (Even Better TOML, taplo).
    let schema = folder.join(SCHEMA);
    crate::files::write(&schema, super::schema_text(super::Schema::Manifest).as_bytes())?;
    written.push(schema);
    let script = folder.join("callbacks/compress.py");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).map_err(io(&script))?;
    Ok(written)
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
