//! The commands, each over the stages below: what `main` calls.

pub mod bench;
pub mod run;
