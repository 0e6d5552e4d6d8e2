//! Helpers for tests that drive the real `gacc` binary in a scratch folder.
#![allow(dead_code)]

pub mod browser;
pub mod mock_api;

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use serde_json::Value;

/// How a test writes a manifest's built-ins as programs: `Scratch::as_programs` or
/// `Scratch::as_persistent_programs`.
pub type Programs = fn(&Scratch, &str) -> String;

/// A scratch folder holding a copy of `experiments/`, where runs and the cache go.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments"),
            &dir.path().join("experiments"),
        );
        Scratch { dir }
    }

    pub fn empty() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, relative: &str) -> PathBuf {
        self.dir.path().join(relative)
    }

    pub fn write(&self, relative: &str, text: &str) -> PathBuf {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Writes an executable script; `@GACC@` in it becomes the gacc binary's path.
    pub fn script(&self, relative: &str, text: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let text = text.replace("@GACC@", &gacc_binary().display().to_string());
        let path = self.write(relative, &text);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    pub fn gacc(&self) -> Command {
        let mut command = Command::new(gacc_binary());
        command.current_dir(self.dir.path()).env_remove("RUST_LOG");
        for (name, _) in std::env::vars() {
            if name.starts_with("GACC_") {
                command.env_remove(name);
            }
        }
        command
    }

    /// Runs `gacc run` and returns (exit status, run folder, stderr).
    pub fn run(&self, manifest: &str, extra: &[&str]) -> (i32, PathBuf, String) {
        self.run_with_env(manifest, extra, &[])
    }

    /// Writes `experiments/NAME.toml`: the fixture with its compressor's `builtin` line
    /// replaced by `compressor` (TOML lines under `[compressors.goal-line]`); its path.
    pub fn fixture_with(&self, name: &str, compressor: &str) -> String {
        let manifest = std::fs::read_to_string(self.path("experiments/fixture.toml"))
            .unwrap()
            .replace(
                "[compressors.goal-line]\nbuiltin = \"goal-line\"",
                &format!("[compressors.goal-line]\n{compressor}"),
            );
        assert!(manifest.contains(compressor), "{manifest}");
        let path = format!("experiments/{name}.toml");
        self.write(&path, &manifest);
        path
    }

    /// Writes `experiments/NAME-programs.toml`: `manifest` with each `builtin = "NAME"` line
    /// made `command = [GACC, "callback", "NAME"]`, so that its built-ins run as programs (in
    /// the sandbox) rather than inside gacc; its path.
    pub fn as_programs(&self, manifest: &str) -> String {
        self.programs(manifest, "", "-programs")
    }

    /// `as_programs`, with each program started once and serving its calls one after another
    /// (`mode = "persistent"`): the same answers, without a process spawned per call (a debug
    /// gacc takes tens of milliseconds to start); `experiments/NAME-persistent.toml`.
    pub fn as_persistent_programs(&self, manifest: &str) -> String {
        self.programs(manifest, "\nmode = \"persistent\"", "-persistent")
    }

    fn programs(&self, manifest: &str, extra: &str, suffix: &str) -> String {
        let text = std::fs::read_to_string(self.path(manifest)).unwrap();
        let gacc = gacc_binary().display().to_string();
        let lines: Vec<String> = text
            .lines()
            .map(|line| match line.strip_prefix("builtin = ") {
                Some(name) => format!("command = [\"{gacc}\", \"callback\", {name}]{extra}"),
                None => line.to_owned(),
            })
            .collect();
        let path = manifest.replace(".toml", &format!("{suffix}.toml"));
        self.write(&path, &(lines.join("\n") + "\n"));
        path
    }

    /// Copies the Python helper beside the experiments' callbacks
    /// (`experiments/callbacks/gacc_callback.py`), where their scripts import it from.
    pub fn copy_helper(&self) {
        let helper = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/python/gacc_callback/__init__.py"
        ))
        .unwrap();
        self.write("experiments/callbacks/gacc_callback.py", &helper);
    }

    /// Runs gacc with `args`, expects success, and parses what it printed as JSON.
    pub fn json<I, S>(&self, args: I) -> Value
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.json_with_env(args, &[])
    }

    /// `json`, with more environment variables.
    pub fn json_with_env<I, S>(&self, args: I, env: &[(&str, &str)]) -> Value
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        serde_json::from_str(&self.stdout_with_env(args, env)).unwrap()
    }

    /// Runs gacc with `args`, expects success, and gives what it printed on stdout.
    pub fn stdout<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.stdout_with_env(args, &[])
    }

    fn stdout_with_env<I, S>(&self, args: I, env: &[(&str, &str)]) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let output = self.gacc().args(args).envs(env.iter().copied()).output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    /// The number of lines in a file a test callback appends to, one per call.
    pub fn count_lines(&self, relative: &str) -> usize {
        std::fs::read_to_string(self.path(relative))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

pub fn gacc_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_gacc"))
}

/// A file's bytes, decompressed when its name ends in `.gz` (as a run folder's plan and memory
/// texts are written): what a search of the file for a secret must look through.
pub fn read_bytes(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    if path.extension().is_some_and(|e| e == "gz") {
        let mut plain = Vec::new();
        // A run stopped mid-way leaves its last gzip member cut: its rows are what came before.
        let mut decoder = flate2::read::MultiGzDecoder::new(&bytes[..]);
        if let Err(error) = std::io::Read::read_to_end(&mut decoder, &mut plain) {
            assert_eq!(
                error.kind(),
                std::io::ErrorKind::UnexpectedEof,
                "{}: {error}",
                path.display()
            );
        }
        return plain;
    }
    bytes
}

/// `bytes` gzipped, as a run folder's row files are.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut encoder, bytes).unwrap();
    encoder.finish().unwrap()
}

/// A file's text, decompressed when its name ends in `.gz`.
pub fn read_text(path: &Path) -> String {
    String::from_utf8(read_bytes(path)).unwrap()
}

pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&read_text(path)).unwrap()
}

pub fn read_lines(path: &Path) -> Vec<Value> {
    read_text(path)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Entries of one kind in the scratch folder's cache, from `gacc cache stats`.
impl Scratch {
    pub fn cached(&self, kind: &str) -> usize {
        let output = self.gacc().args(["cache", "stats", "--json"]).output().unwrap();
        let stats: Value = serde_json::from_slice(&output.stdout).unwrap();
        stats["entries"][kind].as_u64().unwrap_or(0) as usize
    }
}

/// Calls this run made per role, from `run.json`.
pub fn made(folder: &Path, role: &str) -> u64 {
    read_json(&folder.join("run.json"))["calls"][role]["made"]
        .as_u64()
        .unwrap_or(0)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

impl Scratch {
    /// Runs `gacc run` with extra environment variables; returns (exit status, run folder, stderr).
    pub fn run_with_env(
        &self,
        manifest: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (i32, PathBuf, String) {
        let output = self
            .gacc()
            .arg("run")
            .arg(manifest)
            .args(extra)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        let folder = stdout
            .lines()
            .last()
            .map(|l| self.path(l.trim()))
            .unwrap_or_default();
        (output.status.code().unwrap_or(-1), folder, stderr)
    }

    /// `gacc pack FOLDER -o OUT`, expected to succeed; the pack's path.
    pub fn pack_run(&self, folder: &Path, out: &str) -> PathBuf {
        let pack = self.path(out);
        let output = self
            .gacc()
            .arg("pack")
            .arg(folder)
            .arg("-o")
            .arg(&pack)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        pack
    }

    /// `gacc verify TARGET` in an environment holding only PATH and HOME, from this folder:
    /// (exit status, stdout and stderr).
    pub fn verify_bare(&self, target: &Path) -> (i32, String) {
        let output = std::process::Command::new(gacc_binary())
            .current_dir(self.path(""))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", std::env::var_os("HOME").unwrap_or_default())
            .arg("verify")
            .arg(target)
            .output()
            .unwrap();
        let printed =
            String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
        (output.status.code().unwrap_or(-1), printed)
    }

    /// `gacc` as a plain process (to know its pid), in the scratch folder, without `GACC_` variables.
    pub fn gacc_process(&self) -> std::process::Command {
        let mut command = std::process::Command::new(gacc_binary());
        command.current_dir(self.dir.path()).env_remove("RUST_LOG");
        for (name, _) in std::env::vars() {
            if name.starts_with("GACC_") {
                command.env_remove(name);
            }
        }
        command
    }
}

/// Whether `python3` runs here (the Python tests skip, saying so, where it does not).
/// Whether `python3` runs; with `GACC_REQUIRE_PYTHON=1` (as CI sets it), a missing python3
/// fails the test instead of skipping it.
pub fn python3_on_path() -> bool {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    required("GACC_REQUIRE_PYTHON", found, "python3 is not on PATH")
}

/// `found`, unless the variable `name` is `1` and it is not: then the test fails, saying so.
fn required(name: &str, found: bool, missing: &str) -> bool {
    assert!(
        found || std::env::var(name).as_deref() != Ok("1"),
        "{name}=1, but {missing}: the tests that need it would pass without testing anything"
    );
    found
}

/// Whether this kernel answers Landlock (the probe gacc itself makes); with
/// `GACC_REQUIRE_LANDLOCK=1` (as CI sets it), a kernel without it fails the test instead of
/// skipping it.
pub fn landlock_available() -> bool {
    required(
        "GACC_REQUIRE_LANDLOCK",
        kernel_has_landlock(),
        "this kernel has no Landlock",
    )
}

#[cfg(not(target_os = "linux"))]
fn kernel_has_landlock() -> bool {
    false
}

#[cfg(target_os = "linux")]
fn kernel_has_landlock() -> bool {
    // SAFETY: this form of landlock_create_ruleset(2) reads no memory.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1 as libc::c_long,
        )
    };
    abi > 0
}

/// A results row's question in its cell and seed, as one string.
pub fn question_key(row: &Value) -> String {
    [
        "seed",
        "compressor",
        "condition",
        "ratio",
        "goal_id",
        "question_id",
    ]
    .map(|f| row[f].to_string())
    .join(" ")
}

/// Each question's verdict (`correct`) in a run folder's `results.jsonl`, by `question_key`.
pub fn verdicts(folder: &Path) -> std::collections::HashMap<String, Value> {
    read_lines(&folder.join("results.jsonl.gz"))
        .into_iter()
        .map(|row| (question_key(&row), row["correct"].clone()))
        .collect()
}
