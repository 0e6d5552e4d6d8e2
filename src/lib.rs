//! gacc runs goal-conditioned compression experiments (the GACC-Bench protocol) from TOML
//! manifests. The stages follow the contract in SPEC.md:
//! manifest → dataset → plan → executor → cache and ledger → report.

pub mod bench;
pub mod budget;
pub mod builtin;
pub mod cache;
pub mod callback;
pub mod dataset;
pub mod diff;
pub mod executor;
pub mod hash;
pub mod html;
pub mod ledger;
pub mod manifest;
pub mod metrics;
pub mod parallel;
pub mod plan;
pub mod plots;
pub mod report;
pub mod run;
pub mod sandbox;
pub mod slurm;
pub mod tokenizer;
pub mod trace;
pub mod trace_review;
