//! Test-only code that is not one module's tests: proptest strategies of hostile input
//! (`mangle`), the property tests of every reader of outside data that use them (`app`,
//! `providers`), and the limiter and pacer simulated against servers in virtual time
//! (`simulate`). Compiled only for `cargo test`.

mod app;
mod mangle;
mod providers;
mod simulate;
