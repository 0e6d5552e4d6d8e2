//! What a run keeps: the content-addressed cache of every call (SPEC §4), the ledger's rows,
//! and the run folder they are written into (SPEC §5).

pub mod cache;
pub mod ledger;
pub mod run_folder;
