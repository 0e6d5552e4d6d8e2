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
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

use crate::inputs::manifest::{Loaded, SandboxSpec};
use crate::protocol::Role;

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

/// The Landlock ABI this kernel answers; 0 without Landlock (or with `GACC_NO_LANDLOCK` set).
pub(crate) fn kernel_abi() -> i32 {
    if std::env::var_os(NO_LANDLOCK_VARIABLE).is_some() {
        return 0;
    }
    landlock_abi()
}

#[cfg(target_os = "linux")]
fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: this form of landlock_create_ruleset(2) reads no memory; it returns the ABI
    // version, or -1 with ENOSYS or EOPNOTSUPP when the kernel has no Landlock.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(abi.max(0)).unwrap_or(0)
}

#[cfg(not(target_os = "linux"))]
fn landlock_abi() -> i32 {
    0
}

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
        None => role != Role::Judge,
    }
}

/// How one callback runs, as the report records it.
#[derive(Debug, Clone, PartialEq, Serialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct Holdout {
    pub holdout_enforced: bool,
    pub callbacks: BTreeMap<String, Confinement>,
}

/// Groups callbacks' confinements by role.
pub(crate) fn holdout<'a>(
    callbacks: impl IntoIterator<Item = (Role, &'a str, &'a Confinement)>,
) -> BTreeMap<Role, Holdout> {
    let mut roles: BTreeMap<Role, Holdout> = BTreeMap::new();
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
        // Every call's request waits there, the readers' questions among them.
        if let Some(work) = loaded.slurm_work_dir() {
            protected.add(&work, "the Slurm work folder");
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
        protected.add(&scratch.path, "the scratch folders");
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
            let why = if spec.is_some() {
                "sandbox = false"
            } else {
                "judges are given the references; they run unrestricted"
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

fn grants(
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
        if let Some(installation) = installation(&program)
            && protected.exposed_by(&installation).is_none()
        {
            out.read.push(installation);
        }
        // Arguments naming files (an interpreter's script): readable, unless the experiment's.
        for argument in &argv[1..] {
            let path = folder.join(argument);
            if !path.is_file() {
                continue;
            }
            match protected.exposed_by(&path) {
                Some(what) => problems.push(format!(
                    "the argument `{argument}` names {what}, which a sandboxed callback cannot read"
                )),
                None => out.read.push(path),
            }
        }
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// The installation a program belongs to: the parent of its `bin`, `sbin` or `shims` folder,
/// never `/` or the home folder.
fn installation(program: &Path) -> Option<PathBuf> {
    let folder = program.parent()?;
    let name = folder.file_name()?.to_str()?;
    let installation = folder.parent()?;
    let home = std::env::var_os("HOME").map(PathBuf::from);
    (INSTALLATION_FOLDERS.contains(&name)
        && installation.parent().is_some()
        && Some(real_path(installation)) != home.as_deref().map(real_path))
    .then(|| installation.to_path_buf())
}

/// Where the scratch folders of one run go: a private folder under the system's temporary
/// folder, removed when the run ends.
#[derive(Debug)]
struct ScratchRoot {
    path: PathBuf,
    next: AtomicU64,
}

/// The prefix of a scratch root's name, followed by the pid of the gacc that made it.
const SCRATCH_PREFIX: &str = "gacc-sandbox-";

impl ScratchRoot {
    fn create() -> std::io::Result<ScratchRoot> {
        use std::os::unix::fs::DirBuilderExt;
        let base = std::env::temp_dir();
        remove_stale_scratch(&base);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let mut attempt = 0u32;
        loop {
            let path = base.join(format!(
                "{SCRATCH_PREFIX}{}-{:08x}",
                std::process::id(),
                nanos.wrapping_add(attempt)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => {
                    return Ok(ScratchRoot {
                        path,
                        next: AtomicU64::new(0),
                    });
                }
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Removes the scratch roots of gacc processes that are gone (killed before they could).
fn remove_stale_scratch(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let pid = name
            .to_str()
            .and_then(|n| n.strip_prefix(SCRATCH_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok());
        // SAFETY: kill(2) with signal 0 only asks whether the process exists.
        if let Some(pid) = pid.filter(|pid| *pid > 0)
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A process's private scratch folder, removed with everything in it when dropped.
#[derive(Debug)]
pub(crate) struct Scratch {
    pub path: PathBuf,
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One callback's sandbox: what it may reach, and where its processes' scratch folders go.
#[derive(Debug)]
pub(crate) struct Policy {
    grants: Grants,
    scratch: Arc<ScratchRoot>,
    /// The gacc executable, which enters the sandbox and then becomes the callback.
    gacc: PathBuf,
    /// A built-in is served by that same process, with no second exec.
    builtin: Option<String>,
}

impl Policy {
    /// What another machine needs to start this callback in the same sandbox (a Slurm task).
    pub(crate) fn describe(&self) -> serde_json::Value {
        serde_json::json!({
            "read": self.grants.read,
            "write": self.grants.write,
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
        use std::os::unix::fs::DirBuilderExt;
        let number = self.scratch.next.fetch_add(1, Ordering::Relaxed);
        let path = self.scratch.path.join(number.to_string());
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        let mut line: Vec<OsString> = vec![self.gacc.clone().into(), SANDBOX_EXEC.into()];
        for path in &self.grants.read {
            line.extend(["--read".into(), path.clone().into()]);
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

/// The hidden subcommand that enters a sandbox and becomes the callback.
pub const SANDBOX_EXEC: &str = "sandbox-exec";
/// The exit status of a process that could not enter its sandbox or start its program.
pub(crate) const SANDBOX_EXEC_FAILED: u8 = 125;

/// `gacc sandbox-exec [--read PATH]... [--write PATH]... [--no-network] (-- ARGV... |
/// --builtin NAME)`: enters a Landlock domain with those rules (and the system's), then execs
/// ARGV or serves the built-in NAME. It runs as a fresh small process started with
/// `posix_spawn`, which costs far less than forking a large gacc to apply the rules between
/// fork and exec; the callback still never runs a single instruction outside the sandbox.
pub(crate) fn exec(args: &[OsString]) -> u8 {
    let fail = |message: String| {
        eprintln!("gacc sandbox-exec: {message}");
        SANDBOX_EXEC_FAILED
    };
    let mut grants = Grants {
        network: true,
        ..Grants::default()
    };
    let mut rest = args.iter();
    let target = loop {
        match rest.next().and_then(|a| a.to_str()) {
            Some("--read") => grants.read.extend(rest.next().map(PathBuf::from)),
            Some("--write") => grants.write.extend(rest.next().map(PathBuf::from)),
            Some("--no-network") => grants.network = false,
            Some("--builtin") => match rest.next().and_then(|a| a.to_str()) {
                Some(name) => break Target::Builtin(name.to_owned()),
                None => return fail("--builtin needs a name".into()),
            },
            Some("--") => break Target::Program(rest.cloned().collect()),
            other => return fail(format!("unexpected argument {other:?}")),
        }
    };
    if let Err(message) = enter(&grants) {
        return fail(format!("could not enter the Landlock sandbox: {message}"));
    }
    match target {
        Target::Builtin(name) => u8::try_from(crate::builtin::serve(&name).clamp(0, 255)).unwrap_or(1),
        Target::Program(argv) => {
            use std::os::unix::process::CommandExt;
            let Some((program, arguments)) = argv.split_first() else {
                return fail("no program to run".into());
            };
            let error = std::process::Command::new(program).args(arguments).exec();
            fail(format!(
                "could not start `{}`: {error}",
                Path::new(program).display()
            ))
        }
    }
}

enum Target {
    Program(Vec<OsString>),
    Builtin(String),
}

#[cfg(target_os = "linux")]
fn enter(grants: &Grants) -> Result<(), String> {
    landlock_rules::enter(grants)
}

#[cfg(not(target_os = "linux"))]
fn enter(_grants: &Grants) -> Result<(), String> {
    Err("sandboxing needs Linux".into())
}

#[cfg(target_os = "linux")]
mod landlock_rules {
    //! The Landlock side: the rules of one process, entered for good.

    use std::path::Path;

    use landlock::{
        ABI, Access, AccessFs, AccessNet, BitFlags, PathBeneath, PathFd, Ruleset, RulesetAttr,
        RulesetCreatedAttr, RulesetStatus, Scope,
    };

    use super::{DEVICES, Grants, SYSTEM_FOLDERS, SYSTEM_INFO};

    /// The ABI whose rights gacc asks for (tested here); older kernels enforce what they can.
    const ABI_TESTED: ABI = ABI::V7;

    /// Opens a path for a rule; the rights are narrowed to those a file can have when it is one.
    fn rule(path: &Path, access: BitFlags<AccessFs>) -> Result<PathBeneath<PathFd>, String> {
        let fd = PathFd::new(path).map_err(|error| error.to_string())?;
        let access = if path.is_dir() {
            access
        } else {
            access & AccessFs::from_file(ABI_TESTED)
        };
        Ok(PathBeneath::new(fd, access))
    }

    /// Restricts this process (and what it execs) to the system's paths and `grants`.
    pub(super) fn enter(grants: &Grants) -> Result<(), String> {
        let read = AccessFs::from_read(ABI_TESTED);
        let all = AccessFs::from_all(ABI_TESTED);
        let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
        // System paths a machine lacks are skipped; the callback's own must all exist.
        let system = SYSTEM_FOLDERS
            .iter()
            .map(|path| (path, read))
            .chain(
                SYSTEM_INFO
                    .iter()
                    .map(|path| (path, AccessFs::ReadFile | AccessFs::ReadDir)),
            )
            .chain(DEVICES.iter().map(|path| (path, device)))
            .filter_map(|(path, access)| rule(Path::new(path), access).ok());
        let mut own = Vec::new();
        for (paths, access) in [(&grants.read, read), (&grants.write, all)] {
            for path in paths {
                own.push(rule(path, access).map_err(|error| format!("{}: {error}", path.display()))?);
            }
        }
        let mut ruleset = Ruleset::default()
            .handle_access(all)
            .and_then(|r| r.scope(Scope::from_all(ABI_TESTED)))
            .map_err(|error| error.to_string())?;
        if !grants.network {
            ruleset = ruleset
                .handle_access(AccessNet::from_all(ABI_TESTED))
                .map_err(|error| error.to_string())?;
        }
        let status = ruleset
            .create()
            .and_then(|r| r.add_rules(system.map(Ok::<_, landlock::RulesetError>)))
            .and_then(|r| r.add_rules(own.into_iter().map(Ok::<_, landlock::RulesetError>)))
            .and_then(|r| r.restrict_self())
            .map_err(|error| error.to_string())?;
        match status.ruleset {
            RulesetStatus::NotEnforced => Err("this kernel enforces none of its rules".into()),
            RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let roles = holdout([
            (Role::Compressor, "compressors.a", &on),
            (Role::Compressor, "compressors.b", &off),
            (Role::Reader, "reader", &on),
        ]);
        assert!(!roles[&Role::Compressor].holdout_enforced);
        assert!(roles[&Role::Reader].holdout_enforced);
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
