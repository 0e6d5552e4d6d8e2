//! What an experiment is made of, read and checked before anything runs (SPEC §1, §2):
//! the manifest, the dataset's records, the tokenizer and the budget arithmetic.

pub mod budget;
pub mod dataset;
pub mod manifest;
pub mod records;
pub mod tokenizer;
