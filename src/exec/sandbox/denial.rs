//! Telling a user what the sandbox denied: the path a failed call's stderr names, and the
//! `read` line that would grant it, or why none may.

use std::path::Path;

use super::Protected;

/// What to tell a user whose sandboxed callback failed on a file it was denied: the path its
/// stderr names (a `PermissionError`, an `EACCES`, `Permission denied`), resolved against the
/// manifest's folder, and the `read` line that would grant its folder, or why none may.
pub(crate) fn denial_hint(stderr: &str, protected: &Protected, folder: &Path) -> Option<String> {
    let denied = stderr.lines().rev().find_map(denied_path)?;
    let path = folder.join(&denied);
    if let Some(what) = protected.exposed_by(&path) {
        return Some(format!(
            "the sandbox denied `{denied}`: it holds {what}, which a sandboxed callback may never read"
        ));
    }
    let grant = if path.is_dir() {
        path.clone()
    } else {
        path.parent().unwrap_or(&path).to_path_buf()
    };
    // The folder, unless granting it would expose the experiment's files: then the file alone.
    let grant = if protected.exposed_by(&grant).is_some() {
        path
    } else {
        grant
    };
    let shown = match grant.strip_prefix(folder) {
        Ok(relative) if relative.as_os_str().is_empty() => "./".to_owned(),
        Ok(relative) => format!("{}{}", relative.display(), if grant.is_dir() { "/" } else { "" }),
        Err(_) => grant.display().to_string(),
    };
    Some(format!(
        "the sandbox denied `{denied}`; to grant it, add `sandbox = {{ read = [\"{shown}\"] }}` to this callback"
    ))
}

/// The path a `Permission denied` line names: Python's `…: '/path'`, or a tool's `path: …`.
fn denied_path(line: &str) -> Option<String> {
    if !line.contains("Permission denied") && !line.contains("EACCES") {
        return None;
    }
    // Python: PermissionError: [Errno 13] Permission denied: 'models/keywords.txt'
    if let Some(start) = line.rfind(": '") {
        let rest = &line[start + 3..];
        return rest
            .rfind('\'')
            .map(|end| rest[..end].to_owned())
            .filter(|p| !p.is_empty());
    }
    // cat: models/keywords.txt: Permission denied · open(/x/y): Permission denied ·
    // a shell's `script: line 12: /opt/tool/bin/run: Permission denied` (the last path named
    // before the denial, not the script reporting it).
    let before = line.split("Permission denied").next().unwrap_or(line);
    before
        .split([' ', '(', ')', '\'', '"'])
        .map(|word| word.trim_end_matches(':'))
        .rfind(|word| word.contains('/') && !word.starts_with("http"))
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denied_file_is_named_with_the_grant_that_would_open_it() {
        let folder = std::env::temp_dir().join(format!("gacc-denial-{}", std::process::id()));
        std::fs::create_dir_all(folder.join("models")).unwrap();
        std::fs::write(folder.join("models/keywords.txt"), "x").unwrap();
        std::fs::write(folder.join("data.jsonl"), "").unwrap();
        let mut protected = Protected::default();
        protected.add(&folder.join("data.jsonl"), "the dataset");
        let python = "Traceback (most recent call last):\n  File \"k.py\", line 3\nPermissionError: [Errno 13] Permission denied: 'models/keywords.txt'\n";
        let hint = denial_hint(python, &protected, &folder).unwrap();
        assert!(
            hint.contains("`models/keywords.txt`") && hint.contains(r#"read = ["models/"]"#),
            "{hint}"
        );
        let tool = "cat: data.jsonl: Permission denied\n";
        let hint = denial_hint(tool, &protected, &folder);
        assert_eq!(hint, None, "a word without a slash is not taken for a path");
        let tool = "cat: ./data.jsonl: Permission denied\n";
        let hint = denial_hint(tool, &protected, &folder).unwrap();
        assert!(hint.contains("it holds the dataset"), "{hint}");
        assert_eq!(denial_hint("all fine\n", &protected, &folder), None);
        let shell =
            "/home/u/.pyenv/shims/python3: line 12: /home/u/.pyenv/libexec/pyenv: Permission denied\n";
        let hint = denial_hint(shell, &protected, &folder).unwrap();
        assert!(
            hint.contains("denied `/home/u/.pyenv/libexec/pyenv`")
                && hint.contains(r#"read = ["/home/u/.pyenv/libexec"#),
            "{hint}"
        );
        let _ = std::fs::remove_dir_all(&folder);
    }
}
