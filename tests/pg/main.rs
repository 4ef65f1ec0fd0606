//! The shared-journal suite, one test binary: the PostgreSQL journal store
//! (`pg_journal`) and several real hubs on one database (`pg_hubs`). Needs
//! `RELAYHUB_TEST_PG`, which `scripts/with-postgres.sh` sets:
//!
//! ```sh
//! ./scripts/with-postgres.sh cargo test --test pg
//! ```

#[path = "../common/mod.rs"]
mod common;
#[path = "../pg_common/mod.rs"]
mod pg_common;

mod pg_hubs;
mod pg_journal;
mod pg_takeover;
