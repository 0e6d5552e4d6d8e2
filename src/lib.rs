//! gacc runs goal-conditioned compression experiments (the GACC-Bench protocol) from TOML
//! manifests. The folders follow the data flow of SPEC.md:
//! manifest → dataset → plan → runner → store → report → review.
//!
//! # Floors
//!
//! A module imports only from its own floor or a lower one; on one floor, a unit imports only
//! the units listed before it. `tests/integration/layers.rs` reads `src/` and fails on any import that
//! breaks this table or closes a circle, and on each `never` line.
//!
//! ```text
//! floor 9  testkit
//! floor 8  app
//! floor 7  review
//! floor 6  report
//! floor 5  runner
//! floor 4  store exec
//! floor 3  plan
//! floor 2  builtin inputs
//! floor 1  protocol trace providers
//! floor 0  error clock rng hash parallel files secrets
//! never    runner -> exec::slurm
//! never    exec::callback -> exec::slurm
//! ```

// Only what the binary and the integration tests use is public; the lint keeps it so.
#![warn(unreachable_pub)]

pub mod app;
pub mod builtin;
pub mod error;
pub mod inputs;
pub mod protocol;
pub mod report;

mod clock;
mod exec;
mod files;
mod hash;
mod parallel;
mod plan;
mod providers;
mod review;
mod rng;
mod runner;
mod secrets;
mod store;
#[cfg(test)]
mod testkit;
mod trace;
