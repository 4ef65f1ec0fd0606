//! The operations suite, one test binary: configuration and service files,
//! the docs against the code, logs, metrics and readiness.
//!
//! ```sh
//! cargo test --test ops                # the whole suite
//! cargo test --test ops ops_docs::     # one file's tests
//! ```

#[path = "../common/mod.rs"]
mod common;
#[path = "../ops_support/mod.rs"]
mod ops_support;

mod console;
mod edges;
mod first_hour;
mod idle_memory;
mod open_files;
mod ops_config;
mod ops_docs;
mod ops_logs;
mod ops_metrics;
mod ops_readyz;
