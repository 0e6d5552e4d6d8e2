//! The sandbox compressors and readers run in, so the hold-out is enforced rather than trusted.
//!
//! On Linux each sandboxed callback process starts as `gacc sandbox-exec RULES -- ARGV`: a
//! fresh process (spawned with `posix_spawn`, cheap whatever gacc's size) that enters a Landlock
//! domain and then execs the callback, or serves a built-in itself. The callback may read and
//! execute the system folders, its own program and the paths its manifest declares, and write
//! only a private scratch folder (its `TMPDIR`) and declared `write` paths: not the dataset and
//! source files, the manifest, the cache, the run folders or another process's scratch. A
//! Landlock domain also cannot ptrace, signal or reach the abstract sockets of processes outside
//! it, and `/proc` is not readable at all, so gacc's command line, environment, memory and open
//! files stay out of reach.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use crate::inputs::manifest::{Loaded, SandboxSpec};
use crate::protocol::Role;

mod denial;
mod enter;
mod grants;
mod scratch;

pub(crate) use denial::denial_hint;
pub use enter::SANDBOX_EXEC;
pub(crate) use enter::{exec, kernel_abi};
use grants::grants;
pub(crate) use scratch::Scratch;
use scratch::ScratchRoot;

/// Set (to anything) to behave as on a kernel without Landlock: callbacks run unsandboxed and
/// the report says so. It exists to see and test that path.
pub(crate) const NO_LANDLOCK_VARIABLE: &str = "GACC_NO_LANDLOCK";

/// Folders every sandboxed program may read and execute from.
const SYSTEM_FOLDERS: &[&str] = &[
    "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", "/etc",
];
/// System information a program may read: never a process's own `/proc/<pid>` folder.
const SYSTEM_INFO: &[&str] = &[
    "/sys",
    "/proc/cpuinfo",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/version",
    "/proc/filesystems",
    "/proc/sys",
];
/// Device files a program may read and write.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];
/// Folder names whose parent is a program's installation (`/usr/bin`, `.venv/bin`, pyenv's `shims`).
const INSTALLATION_FOLDERS: &[&str] = &["bin", "sbin", "shims"];

/// Makes this process undumpable, so other unprivileged processes (an unsandboxed judge
/// included) cannot read its `/proc/<pid>/environ`, memory or file descriptors. Children get
/// their own setting back when they exec.
pub(crate) fn protect_self() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) changes a flag of this process and touches no memory.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

/// Whether a callback runs sandboxed where the kernel allows: compressors and readers unless
/// `sandbox = false`, judges only when their manifest asks for it.
pub(crate) fn wanted(role: Role, spec: Option<&SandboxSpec>) -> bool {
    match spec {
        Some(spec) => spec.enabled,
        // A judge is given the references, a writer the sources it writes questions of.
        None => !matches!(role, Role::Judge | Role::Writer),
    }
}

/// How one callback runs, as the report records it.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Confinement {
    /// `landlock`, or `off`.
    pub sandbox: &'static str,
    /// Whether a sandboxed callback may use TCP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// Why a callback runs unsandboxed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl Confinement {
    fn off(why: impl Into<String>) -> Self {
        Confinement {
            sandbox: "off",
            network: None,
            why: Some(why.into()),
        }
    }

    pub(crate) fn sandboxed(&self) -> bool {
        self.sandbox != "off"
    }
}

/// Per role: whether every callback of the role ran sandboxed, and how each ran.
#[derive(Debug, Clone, Default, PartialEq, Serialize, schemars::JsonSchema)]
#[schemars(rename = "Holdout")]
pub(crate) struct HoldoutEnforcement {
    pub holdout_enforced: bool,
    pub callbacks: BTreeMap<String, Confinement>,
}

/// Groups callbacks' confinements by role.
pub(crate) fn holdout_enforcement<'a>(
    callbacks: impl IntoIterator<Item = (Role, &'a str, &'a Confinement)>,
) -> BTreeMap<Role, HoldoutEnforcement> {
    let mut roles: BTreeMap<Role, HoldoutEnforcement> = BTreeMap::new();
    for (role, name, confinement) in callbacks {
        roles
            .entry(role)
            .or_default()
            .callbacks
            .insert(name.to_owned(), confinement.clone());
    }
    for holdout in roles.values_mut() {
        holdout.holdout_enforced = holdout.callbacks.values().all(Confinement::sandboxed);
    }
    roles
}

/// The files of an experiment that no sandboxed callback may reach, each with what it is.
#[derive(Debug, Clone, Default)]
pub(crate) struct Protected {
    paths: Vec<(PathBuf, String)>,
}

impl Protected {
    /// The manifest, its dataset files (a dataset folder or glob as a whole) and source files,
    /// the cache, the run folders and the scratch folders.
    pub(crate) fn of(loaded: &Loaded, cache: &Path, runs: Option<&Path>) -> Protected {
        let mut protected = Protected::default();
        protected.add(&loaded.path, "the manifest");
        let dataset = &loaded.manifest.dataset;
        if let Some(path) = &dataset.path {
            let path = loaded.resolve(path);
            let text = path.to_string_lossy();
            let files: Vec<PathBuf> = if path.is_dir() {
                protected.add(&path, "the dataset folder");
                std::fs::read_dir(&path)
                    .map(|entries| {
                        entries
                            .filter_map(Result::ok)
                            .map(|e| e.path())
                            .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
                            .collect()
                    })
                    .unwrap_or_default()
            } else if text.contains(['*', '?', '[']) {
                protected.add(&glob_base(&path), "the dataset folder");
                glob::glob(&text)
                    .map(|paths| paths.filter_map(Result::ok).collect())
                    .unwrap_or_default()
            } else {
                vec![path]
            };
            for file in files {
                protected.add(&file, "the dataset");
                let folder = file.parent().unwrap_or(Path::new(".")).to_path_buf();
                for source in source_paths(&file) {
                    protected.add(&folder.join(source), "a source file");
                }
            }
        }
        for record in dataset.sources.iter().flatten() {
            if let Some(path) = &record.path {
                protected.add(&loaded.resolve(path), "a source file");
            }
        }
        protected.add(cache, "the cache");
        for (folder, what) in crate::exec::engine_folders(loaded) {
            protected.add(&folder, what);
        }
        if let Some(runs) = runs {
            protected.add(runs, "the run folders");
        }
        protected
    }

    /// What a callback may reach: its settings checked against the experiment's files. The
    /// problems name the setting and what it would expose.
    pub(crate) fn grants(
        &self,
        spec: Option<&SandboxSpec>,
        argv: &[String],
        builtin: bool,
        folder: &Path,
    ) -> Result<Grants, Vec<String>> {
        grants(self, spec, argv, builtin, folder)
    }

    pub(crate) fn add(&mut self, path: &Path, what: impl Into<String>) {
        self.paths.push((real_path(path), what.into()));
    }

    /// What granting `path` would expose: a protected path inside it, or one that holds it.
    pub(crate) fn exposed_by(&self, path: &Path) -> Option<&str> {
        let path = real_path(path);
        self.paths
            .iter()
            .find(|(protected, _)| protected.starts_with(&path) || path.starts_with(protected))
            .map(|(_, what)| what.as_str())
    }
}

/// The folder a glob pattern searches: its path up to the first component with a wildcard.
fn glob_base(pattern: &Path) -> PathBuf {
    pattern
        .components()
        .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
        .collect()
}

/// The `path` of every source record of a JSON Lines dataset file.
fn source_paths(file: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return Vec::new();
    };
    if !text.contains("\"path\"") {
        return Vec::new();
    }
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|record| record.get("path")?.as_str().map(PathBuf::from))
        .collect()
}

/// A path with symbolic links resolved as far as it exists, absolute in any case.
fn real_path(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            return rest.iter().rev().fold(real, |path, part| path.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            _ => return lexical(&absolute),
        }
    }
}

/// `a/./b/../c` as `a/c`, without looking at the file system.
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// What a sandboxed callback may reach, as paths (before any is opened).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Grants {
    /// Read and execute: files, and folders with everything beneath them.
    pub read: Vec<PathBuf>,
    /// Read, write, create and remove.
    pub write: Vec<PathBuf>,
    /// List only (the names in a folder, not what its files hold): a script's own folder, so
    /// an interpreter can find the modules beside it.
    pub list: Vec<PathBuf>,
    pub network: bool,
}

/// One run's sandboxing: the kernel's Landlock, the experiment's files, and the folder under
/// which each sandboxed process gets its scratch folder.
pub(crate) struct Sandboxing {
    pub abi: i32,
    protected: Protected,
    scratch: Arc<ScratchRoot>,
    /// Set when a system folder every program needs holds a file of the experiment.
    exposed_system: Option<String>,
}

impl Sandboxing {
    /// Probes the kernel and prepares the rules every sandboxed callback shares. `protected`
    /// is completed with the scratch folders.
    pub(crate) fn new(abi: i32, protected: Protected) -> std::io::Result<Sandboxing> {
        let scratch = Arc::new(ScratchRoot::create()?);
        let mut protected = protected;
        protected.add(scratch.path(), "the scratch folders");
        let exposed_system = SYSTEM_FOLDERS.iter().find_map(|folder| {
            let folder = Path::new(folder);
            let what = folder.exists().then(|| protected.exposed_by(folder)).flatten()?;
            Some(format!(
                "{what} lies in {}, which every sandboxed program may read",
                folder.display()
            ))
        });
        Ok(Sandboxing {
            abi,
            protected,
            scratch,
            exposed_system,
        })
    }

    /// The experiment's files, the scratch folders among them.
    pub(crate) fn protected(&self) -> &Protected {
        &self.protected
    }

    /// How a callback of `role` runs, and its sandbox when it has one (`builtin` names a
    /// built-in callback, served by the process that enters the sandbox).
    pub(crate) fn confine(
        &self,
        role: Role,
        spec: Option<&SandboxSpec>,
        grants: &Grants,
        builtin: Option<&str>,
    ) -> Result<(Option<Policy>, Confinement), String> {
        if !wanted(role, spec) {
            let why = match (spec, role) {
                (Some(_), _) => "sandbox = false",
                (None, Role::Writer) => {
                    "a writer is given the sources it writes questions of; it runs unrestricted"
                }
                (None, _) => "judges are given the references; they run unrestricted",
            };
            return Ok((None, Confinement::off(why)));
        }
        if self.abi <= 0 {
            let why = if std::env::var_os(NO_LANDLOCK_VARIABLE).is_some() {
                format!("{NO_LANDLOCK_VARIABLE} is set")
            } else {
                "this kernel has no Landlock".to_owned()
            };
            return Ok((None, Confinement::off(why)));
        }
        if let Some(why) = &self.exposed_system {
            return Ok((None, Confinement::off(why.clone())));
        }
        let policy = self.policy(grants, builtin)?;
        Ok((
            Some(policy),
            Confinement {
                sandbox: "landlock",
                network: Some(grants.network),
                why: None,
            },
        ))
    }

    fn policy(&self, grants: &Grants, builtin: Option<&str>) -> Result<Policy, String> {
        let gacc =
            std::env::current_exe().map_err(|error| format!("cannot find the gacc executable: {error}"))?;
        Ok(Policy {
            grants: grants.clone(),
            scratch: self.scratch.clone(),
            gacc,
            builtin: builtin.map(str::to_owned),
        })
    }
}

/// One callback's sandbox: what it may reach, and where its processes' scratch folders go.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    grants: Grants,
    scratch: Arc<ScratchRoot>,
    /// The gacc executable, which enters the sandbox and then becomes the callback.
    gacc: PathBuf,
    /// A built-in is served by that same process, with no second exec.
    builtin: Option<String>,
}

impl Policy {
    /// What another machine needs to start this callback in the same sandbox (a cluster task).
    pub(crate) fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "read": self.grants.read,
            "write": self.grants.write,
            "list": self.grants.list,
            "network": self.grants.network,
            "builtin": self.builtin,
        })
    }

    /// The policy `describe` wrote, with scratch folders of this machine and this executable.
    pub(crate) fn rebuild(description: &serde_json::Value) -> Result<Policy, String> {
        let paths = |key: &str| -> Vec<PathBuf> {
            description[key]
                .as_array()
                .map(|list| {
                    list.iter()
                        .filter_map(|p| p.as_str().map(PathBuf::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        let gacc =
            std::env::current_exe().map_err(|error| format!("cannot find the gacc executable: {error}"))?;
        let scratch =
            ScratchRoot::create().map_err(|error| format!("cannot create scratch folders: {error}"))?;
        Ok(Policy {
            grants: Grants {
                read: paths("read"),
                write: paths("write"),
                list: paths("list"),
                network: description["network"].as_bool().unwrap_or(false),
            },
            scratch: Arc::new(scratch),
            gacc,
            builtin: description["builtin"].as_str().map(str::to_owned),
        })
    }

    /// A fresh scratch folder for one process, and the command line that starts the callback
    /// `argv` inside the sandbox: `gacc sandbox-exec RULES -- ARGV` (or `--builtin NAME`).
    pub(crate) fn jail(&self, argv: &[String]) -> std::io::Result<(Scratch, Vec<OsString>)> {
        let path = self.scratch.new_folder()?;
        let mut line: Vec<OsString> = vec![self.gacc.clone().into(), SANDBOX_EXEC.into()];
        for path in &self.grants.read {
            line.extend(["--read".into(), path.clone().into()]);
        }
        for path in &self.grants.list {
            line.extend(["--list".into(), path.clone().into()]);
        }
        for path in self.grants.write.iter().chain([&path]) {
            line.extend(["--write".into(), path.clone().into()]);
        }
        if !self.grants.network {
            line.push("--no-network".into());
        }
        match &self.builtin {
            Some(name) => line.extend(["--builtin".into(), name.into()]),
            None => {
                line.push("--".into());
                line.extend(argv.iter().map(OsString::from));
            }
        }
        Ok((Scratch { path }, line))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grants::{installation, path_file_entries};

    #[test]
    fn protected_paths_block_grants_around_them() {
        let folder = tempfile_folder();
        std::fs::create_dir_all(folder.join("data/models")).unwrap();
        std::fs::write(folder.join("data/set.jsonl"), "").unwrap();
        let mut protected = Protected::default();
        protected.add(&folder.join("data/set.jsonl"), "the dataset");
        assert_eq!(protected.exposed_by(&folder), Some("the dataset"));
        assert_eq!(protected.exposed_by(&folder.join("data")), Some("the dataset"));
        assert_eq!(
            protected.exposed_by(&folder.join("data/set.jsonl")),
            Some("the dataset")
        );
        assert_eq!(protected.exposed_by(&folder.join("data/models")), None);
        assert_eq!(
            protected.exposed_by(&folder.join("data/../data/")),
            Some("the dataset")
        );
        let _ = std::fs::remove_dir_all(folder);
    }

    #[test]
    fn installations() {
        assert_eq!(
            installation(Path::new("/opt/conda/bin/python")),
            Some(PathBuf::from("/opt/conda"))
        );
        assert_eq!(installation(Path::new("/bin/sh")), None, "never /");
        assert_eq!(installation(Path::new("/work/x/run.sh")), None);
    }

    #[test]
    fn holdout_is_enforced_only_when_every_callback_is_sandboxed() {
        let on = Confinement {
            sandbox: "landlock",
            network: Some(true),
            why: None,
        };
        let off = Confinement::off("sandbox = false");
        let roles = holdout_enforcement([
            (Role::Compressor, "compressors.a", &on),
            (Role::Compressor, "compressors.b", &off),
            (Role::Reader, "reader", &on),
        ]);
        assert!(!roles[&Role::Compressor].holdout_enforced);
        assert!(roles[&Role::Reader].holdout_enforced);
    }

    #[test]
    fn development_installs_are_followed_to_their_sources() {
        let root = tempfile_folder().join("pth");
        let site = root.join("venv/lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::create_dir_all(root.join("classic")).unwrap();
        std::fs::create_dir_all(root.join("modern/pkg")).unwrap();
        std::fs::write(
            site.join("classic.pth"),
            format!("# a comment\nimport sys\n{}\n", root.join("classic").display()),
        )
        .unwrap();
        std::fs::write(
            site.join("__editable___pkg_0_1_finder.py"),
            format!(
                "import sys\nMAPPING: dict[str, str] = {{'pkg': '{}'}}\n",
                root.join("modern/pkg").display()
            ),
        )
        .unwrap();
        let mut found = path_file_entries(&root.join("venv"));
        found.sort();
        assert_eq!(found, [root.join("classic"), root.join("modern/pkg")]);
        let _ = std::fs::remove_dir_all(root.parent().unwrap_or(&root));
    }

    fn tempfile_folder() -> PathBuf {
        let folder = std::env::temp_dir().join(format!(
            "gacc-sandbox-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&folder);
        std::fs::create_dir_all(&folder).unwrap();
        folder
    }
}
