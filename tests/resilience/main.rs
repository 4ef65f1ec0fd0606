//! The resilience suite, one test binary: bulkheads, channels, retries
//! (`resilience_*`), the hub's lifecycle under reloads and signals
//! (`lifecycle_*`), and TLS to the core with its certificate rotation
//! (`core_tls`).
//!
//! ```sh
//! cargo test --test resilience                        # the whole suite
//! cargo test --test resilience lifecycle_signals::    # one file's tests
//! ```

#[path = "../common/mod.rs"]
mod common;
#[path = "../resilience_support/mod.rs"]
mod resilience_support;

mod channel_tls;
mod core_tls;
mod lifecycle_reload;
mod lifecycle_signals;
mod resilience_bulkheads;
mod resilience_channels;
mod resilience_retries;
