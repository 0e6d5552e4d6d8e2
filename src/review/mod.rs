//! Looking back at finished runs: what changed between two (`diff`), and what happened in one
//! (`trace`).

pub(crate) mod diff;
pub(crate) mod trace;
