//! The process groups of calls in flight: a stopping run ends them all, and any started after.

use crate::parallel::Locked;

/// The process groups of calls in flight, so an interrupted run can end them all.
static LIVE_GROUPS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

pub(super) fn live_groups() -> std::sync::MutexGuard<'static, Vec<i32>> {
    LIVE_GROUPS.locked()
}

/// Set once the run is stopping: a process started after is killed at once.
static STOPPING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Kills every callback process group still running (on Ctrl-C, SIGTERM), and every one
/// started after.
pub(crate) fn kill_all() {
    let mut groups = live_groups();
    STOPPING.store(true, std::sync::atomic::Ordering::SeqCst);
    for group in groups.drain(..) {
        kill_group(Some(group));
    }
}

/// Records a started process's group so that a stopping run ends it; false (and the group
/// killed) when the run is stopping already: a task still going would otherwise leave a worker
/// that outlives gacc and serves the request it was handed.
pub(super) fn register(group: Option<i32>) -> bool {
    let mut groups = live_groups();
    if STOPPING.load(std::sync::atomic::Ordering::SeqCst) {
        kill_group(group);
        return false;
    }
    groups.extend(group);
    true
}

/// Sends SIGKILL to a whole process group; a group that is already gone is fine.
pub(super) fn kill_group(group: Option<i32>) {
    if let Some(group) = group.filter(|g| *g > 0) {
        // SAFETY: kill(2) with a negative pid signals a process group; it touches no memory.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
}
