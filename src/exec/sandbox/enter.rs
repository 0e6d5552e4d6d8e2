//! The child's side of the sandbox: `gacc sandbox-exec` enters a Landlock domain with its
//! rules, then becomes the callback. Also what the kernel offers (its Landlock ABI).

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Grants, NO_LANDLOCK_VARIABLE};

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

/// The hidden subcommand that enters a sandbox and becomes the callback.
pub const SANDBOX_EXEC: &str = "sandbox-exec";
/// The exit status of a process that could not enter its sandbox or start its program.
pub(crate) const SANDBOX_EXEC_FAILED: u8 = 125;

/// `gacc sandbox-exec [--read PATH]... [--list PATH]... [--write PATH]... [--no-network] (-- ARGV... |
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
            Some("--list") => grants.list.extend(rest.next().map(PathBuf::from)),
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

    use super::super::{DEVICES, Grants, SYSTEM_FOLDERS, SYSTEM_INFO};

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
        let list = BitFlags::from(AccessFs::ReadDir);
        for (paths, access) in [(&grants.read, read), (&grants.list, list), (&grants.write, all)] {
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
