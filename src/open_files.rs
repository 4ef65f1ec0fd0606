//! The process's open-file limit against what the configuration holds open.
//!
//! Every channel connection is a descriptor, and so is every core call's
//! socket. A login shell's soft limit is often 1,024, far below
//! `max_connections` (20,000 by default); past it `accept` fails with
//! `EMFILE`, so a hub started by hand would hold a thousand channels and
//! turn the rest away (`reserve_descriptors`; before that, they waited
//! unanswered in the listen backlog).
//! The hard limit is usually far higher, and a process may raise its own soft
//! limit up to it, as many servers do at start. So the hub raises its soft
//! limit as far as its configuration needs, and warns when the hard limit
//! does not allow that (systemd's `LimitNOFILE`, `ulimit -Hn`).

use crate::config::Config;

/// Descriptors beyond the connections: the listeners, the admin endpoint's
/// connections, the journal's files, the log, the console's clients.
const RESERVE: u64 = 256;

/// What the configuration may hold open at once: every channel connection,
/// every target's calls in flight, and [`RESERVE`].
pub fn needed(config: &Config) -> u64 {
    let calls: u64 = config
        .targets
        .iter()
        .map(|t| t.max_concurrency as u64)
        .sum();
    (config.server.max_connections as u64)
        .saturating_add(calls)
        .saturating_add(RESERVE)
}

/// The soft limit before and after [`raise_to`], and the hard limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub before: u64,
    pub now: u64,
    pub hard: u64,
}

/// Raises the soft open-file limit to `want`, or to the hard limit when that
/// is lower; never lowers it. `None` where the platform has no such limit.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn raise_to(want: u64) -> std::io::Result<Option<Limits>> {
    // The limit is the process's: two hubs started in one process (tests)
    // must not interleave their reads and writes of it.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given, nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let before = lim.rlim_cur;
    let target = want.min(lim.rlim_max);
    if target > before {
        let raised = libc::rlimit {
            rlim_cur: target,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct it is given, nothing else.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok(Some(Limits {
        before,
        now: lim.rlim_cur,
        hard: lim.rlim_max,
    }))
}

#[cfg(not(target_os = "linux"))]
pub fn raise_to(_want: u64) -> std::io::Result<Option<Limits>> {
    Ok(None)
}

/// At start: raises the limit for `config` and says what it did; warns when
/// the hard limit leaves it below what the configuration may hold open.
pub fn fit(config: &Config) {
    let want = needed(config);
    match raise_to(want) {
        Ok(Some(l)) if l.now < want => tracing::warn!(
            limit = l.now,
            limit_at_start = l.before,
            hard_limit = l.hard,
            needed = want,
            max_connections = config.server.max_connections,
            "the open-file limit is below what the configuration may hold open \
             (max_connections + each target's max_concurrency + {RESERVE}): \
             past it new channel connections are closed at once; \
             raise LimitNOFILE (systemd) or `ulimit -Hn`, or lower max_connections"
        ),
        Ok(Some(l)) if l.now > l.before => tracing::info!(
            from = l.before,
            to = l.now,
            "raised the open-file limit for max_connections and the targets' calls"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(%e, needed = want, "cannot read or raise the open-file limit"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_need_counts_connections_calls_and_a_reserve() {
        let mut config = Config::default();
        config.server.max_connections = 1_000;
        let calls: u64 = config
            .targets
            .iter()
            .map(|t| t.max_concurrency as u64)
            .sum();
        assert_eq!(needed(&config), 1_000 + calls + RESERVE);
        config.server.max_connections = usize::MAX;
        assert_eq!(needed(&config), u64::MAX, "saturates, never wraps");
    }

    #[cfg(target_os = "linux")]
    #[test]
    #[allow(unsafe_code)]
    fn raising_never_lowers_and_never_passes_the_hard_limit() {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit only read and write the struct given.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            // Soft below hard (they are often equal), so the raise has room;
            // one descriptor less than the hard limit bothers no other test.
            let lowered = libc::rlimit {
                rlim_cur: lim.rlim_cur.min(lim.rlim_max - 1),
                rlim_max: lim.rlim_max,
            };
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lowered), 0);
        }
        let first = raise_to(0).unwrap().unwrap();
        assert_eq!(first.now, first.before, "asking for less changes nothing");
        assert!(first.now < first.hard);
        let one_more = raise_to(first.now + 1).unwrap().unwrap();
        assert_eq!((one_more.before, one_more.now), (first.now, first.now + 1));
        let all = raise_to(u64::MAX).unwrap().unwrap();
        assert_eq!(all.now, all.hard, "asking for more stops at the hard limit");
    }
}
