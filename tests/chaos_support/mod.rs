//! What the fault matrix and the chaos run share on top of `tests/common`: how to
//! start a real `relayhub serve` on a SQLite journal, so that a test can SIGKILL
//! it and start it again on the same file, and a snapshot of the fixture's
//! ledger. The proxy in front of the core (refuse, drop, hold) is
//! `common::Proxy`.
//!
//! Declare it beside `mod common;` at the test binary's root: it uses that
//! module. Nothing here orders events with a sleep: waits are on ready lines,
//! process exits, answers and the fixture's counters, each bounded.

#![allow(dead_code)] // each suite uses a different part of it

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use corebank::CoreBank;

use crate::common::{Proc, TempDir, relayhub_bin, try_start};

/// The seed accounts of `fixtures/accounts.json`, all of bank 088.
pub const ACCOUNTS: [&str; 6] = [
    "1002003004001",
    "1002003004002",
    "1002003004003",
    "1002003004004",
    "1002003004005",
    "1002003004006",
];

// ---- the ledger -----------------------------------------------------------

/// Every seed account's balance and the total, at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    pub balances: BTreeMap<&'static str, u64>,
    pub total: u64,
}

impl Ledger {
    pub fn of(core: &CoreBank) -> Ledger {
        let balances = ACCOUNTS
            .iter()
            .map(|&a| (a, core.balance(a).expect("seed account")))
            .collect();
        Ledger {
            balances,
            total: core.total_money(),
        }
    }

    /// Asserts the ledger now is `self` with `moves` (from, to, amount) applied
    /// and that no money was created or lost.
    pub fn assert_now(&self, core: &CoreBank, moves: &[(&str, &str, u64)]) {
        let mut want = self.balances.clone();
        for &(from, to, amount) in moves {
            let f = want.get_mut(from).expect("seed account");
            *f = f.checked_sub(amount).expect("expected debit fits");
            *want.get_mut(to).expect("seed account") += amount;
        }
        let now = Ledger::of(core);
        assert_eq!(now.balances, want, "balances (expected moves {moves:?})");
        assert_eq!(now.total, self.total, "total money is conserved");
    }
}

// ---- the real hub process -------------------------------------------------

/// How to start `relayhub serve`; kept so it can be started again the same way.
#[derive(Debug, Clone)]
pub struct HubCommand {
    pub core_url: String,
    pub journal: PathBuf,
    /// A TOML config given as `--config`.
    pub config: PathBuf,
    /// More arguments for `serve`.
    pub extra: Vec<String>,
}

impl HubCommand {
    /// Writes `toml` next to the journal and returns the command.
    pub fn new(dir: &TempDir, core_url: &str, toml: &str) -> HubCommand {
        let config = dir.join("relayhub.toml");
        std::fs::write(&config, toml).expect("write hub config");
        HubCommand {
            core_url: core_url.to_string(),
            journal: dir.join("journal.db"),
            config,
            extra: Vec::new(),
        }
    }

    /// The same command with more arguments for `serve`.
    pub fn args(mut self, args: &[&str]) -> HubCommand {
        self.extra.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Starts the hub on `listen` (`127.0.0.1:0` for any port) and waits for its
    /// ready line. `Err` carries the hub's log when it did not come up.
    pub fn start(&self, listen: &str) -> Result<Proc, String> {
        let mut cmd = Command::new(relayhub_bin());
        cmd.args(["serve", "--listen", listen, "--core-url", &self.core_url])
            .arg("--journal")
            .arg(&self.journal)
            .arg("--config")
            .arg(&self.config)
            .args(&self.extra);
        try_start(&mut cmd)
    }
}
