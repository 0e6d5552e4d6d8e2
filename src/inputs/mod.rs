//! What an experiment is made of, read and checked before anything runs (SPEC §1, §2):
//! the manifest, the dataset's records, the tokenizer and the budget arithmetic.

pub mod budget;
pub(crate) mod dataset;
pub(crate) mod labels;
pub(crate) mod manifest;
pub(crate) mod models;
pub(crate) mod parquet;
pub(crate) mod records;
pub(crate) mod table;
pub mod tokenizer;
