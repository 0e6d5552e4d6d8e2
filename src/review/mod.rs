//! Looking back at finished runs: which there are (`runs`), what changed between two (`diff`),
//! what happened in one (`trace`), and its rows as one table (`export`).

pub(crate) mod diff;
pub(crate) mod export;
pub(crate) mod runs;
pub(crate) mod trace;
