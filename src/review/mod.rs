//! Looking back at finished runs: what changed between two (`diff`), and what happened in one
//! (`trace`).

pub mod diff;
pub mod trace;
