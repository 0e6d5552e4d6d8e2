//! gacc's integration tests, one binary (one link of the crate): each module is a topic,
//! `common` the helpers they share (a scratch project, the mock model API, the gacc binary).
//! `cargo test --test integration MODULE::` runs one topic.

mod audit;
mod bad_input;
mod batches;
mod bench;
mod budgets;
mod building;
mod callback_check;
mod callbacks;
mod common;
mod conditions;
mod costs;
mod crash;
mod dataset;
mod diff;
mod docs;
mod faults;
mod first_day;
mod fixture;
mod formats;
mod hostile;
mod html;
mod interface;
mod ladder;
mod layers;
mod limits;
mod live;
mod models;
mod pairs;
mod past_runs;
mod pipelined;
mod plots;
mod protocol_rules;
mod python_helper;
mod rate_limits;
mod sandbox;
mod schema;
mod seeds;
mod slurm;
mod tables;
mod tokenizers;
mod trace;
mod travel;
mod view;
mod why;
