//! What a run keeps: the content-addressed cache of every call (SPEC §4), the ledger's rows,
//! and the run folder they are written into (SPEC §5).

pub(crate) mod cache;
pub(crate) mod ledger;
pub(crate) mod members;
pub(crate) mod pack;
pub(crate) mod row_sink;
pub(crate) mod run_folder;
pub(crate) mod run_record;
pub(crate) mod usage;
