//! Shared setup for the end-to-end suites; the other support modules
//! (`journal_support`, `chaos_support`, ...) build on it.
//!
//! - [`fixture`]: the corebank fixture and a hub, both in-process on
//!   `127.0.0.1:0`;
//! - [`telegram`]: telegram builders and answer checks;
//! - [`wire`]: raw-wire helpers (prefixes, byte-by-byte writes, closes);
//! - [`process`]: the real binaries, their ready lines, signals and exits;
//! - [`files`]: temp files and directories removed when dropped;
//! - [`certs`]: a test CA and the certificates it signs (rcgen), as PEM files;
//! - [`holding`]: a proxy before the core that refuses, drops, or holds a
//!   POST's bytes.
//!
//! Nothing here sleeps to order events: waits are on answers, the fixture's
//! counters, or ready lines, each bounded by [`PATIENCE`] so a broken hub fails a
//! test instead of hanging it.

#![allow(dead_code)] // each suite uses a different part of it

pub mod certs;
mod files;
mod fixture;
mod holding;
mod process;
mod telegram;
mod wire;

use std::net::SocketAddr;
use std::time::Duration;

use relayhub::client::{Answer, Channel};
use relayhub::frame::PrefixMode;

// One flat namespace for the suites (`use common::*`); a suite that uses no
// item of a submodule would otherwise warn about its re-export.
#[allow(unused_imports)]
pub use {files::*, fixture::*, holding::*, process::*, telegram::*, wire::*};

/// Upper bound for any wait; never used to order events.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// Seed accounts (fixtures/accounts.json), bank 088.
pub const BANK: &str = "088";
pub const ACC1: &str = "1002003004001"; // 1,000,000
pub const ACC2: &str = "1002003004002"; // 1,000,000
pub const ACC3: &str = "1002003004003"; // 500,000
pub const ACC5: &str = "1002003004005"; // 100,000,000
pub const UNKNOWN_ACC: &str = "1002003009999";
pub const LIMIT: u64 = 5_000_000;
/// The memo of section 11, 9 bytes in EUC-KR.
pub const MEMO: &str = "월세 11월";
pub const CHANNEL: &str = "IBANK";

/// Awaits `fut`, failing the test after [`PATIENCE`].
pub async fn within<F: std::future::Future>(fut: F) -> F::Output {
    within_for(PATIENCE, fut).await
}

/// Awaits `fut`, failing the test after `patience` (for suites with a longer
/// bound of their own).
pub async fn within_for<F: std::future::Future>(patience: Duration, fut: F) -> F::Output {
    match tokio::time::timeout(patience, fut).await {
        Ok(v) => v,
        Err(_) => panic!("no result within {patience:?}"),
    }
}

/// A new connection to a hub, bounded by [`PATIENCE`].
pub async fn connect(addr: SocketAddr, prefix: PrefixMode) -> Channel {
    within(Channel::connect(&addr.to_string(), prefix))
        .await
        .expect("connect to hub")
}

/// Sends a telegram and waits (bounded) for its answer.
pub async fn exchange(ch: &mut Channel, telegram: &[u8]) -> Answer {
    within(ch.exchange(telegram))
        .await
        .expect("an answer telegram")
}
