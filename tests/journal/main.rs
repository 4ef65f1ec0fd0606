//! The journal suite, one test binary: what the GUID journal promises across
//! repeats, resends and crashes, the one rule beside the hot path (`one_rule`), and what it costs (`journal_cost`, ignored by
//! default).
//!
//! ```sh
//! cargo test --test journal                                       # the whole suite
//! cargo test --release --test journal journal_cost -- --ignored --nocapture
//! ```

#[path = "../common/mod.rs"]
mod common;
#[path = "../journal_support/mod.rs"]
mod journal_support;
#[path = "../ops_support/mod.rs"]
mod ops_support;

mod journal_cost;
mod journal_crash;
mod journal_repeats;
mod journal_resend;
mod journal_tools;
mod one_rule;
mod one_rule_model;
