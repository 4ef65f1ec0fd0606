//! Every metric the hub records: its name, its labels and what it means, in one
//! leaf module that imports nothing of the crate, so the modules that record
//! metrics (relay, core client, server, daemon) and the one that serves them
//! (admin) all depend downwards on it.
//!
//! `docs/operations.md` lists the same metrics; a test keeps the two in step.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Telegrams answered, by `tx_code` and standard `code`.
pub const TELEGRAMS: &str = "relayhub_telegrams_total";
/// Time from reading a telegram whole to its answer, by `tx_code`.
pub const TELEGRAM_DURATION: &str = "relayhub_telegram_duration_seconds";
/// Time spent calling the core (retries included), by `target` and `operation`.
pub const CORE_CALL_DURATION: &str = "relayhub_core_call_duration_seconds";
/// Calls to a target running now, by `target`.
pub const CORE_IN_FLIGHT: &str = "relayhub_core_in_flight";
/// Calls refused because a target's bulkhead stayed full, by `target`.
pub const BULKHEAD_REJECTIONS: &str = "relayhub_bulkhead_rejections_total";
/// Retries of a call inside one telegram, by `target` and `operation`.
pub const CORE_RETRIES: &str = "relayhub_core_retries_total";
/// TLS handshakes with a core that failed (nothing was sent), by `target` and
/// `cause` (`certificate_expired`, `certificate_not_valid_for_name`,
/// `unknown_issuer`, `refused_by_core`, `timeout`, ...).
pub const CORE_TLS_FAILURES: &str = "relayhub_core_tls_handshake_failures_total";
/// Times a target stopped reusing its connections for a while because its
/// core closed them right after answering (`core_client/closes.rs`), by
/// `target`.
pub const CORE_REUSE_PAUSES: &str = "relayhub_core_connection_reuse_pauses_total";
/// Channel connections open now.
pub const OPEN_CONNECTIONS: &str = "relayhub_open_connections";
/// Channel connections closed at once because `max_connections` were open.
pub const CONNECTIONS_REFUSED: &str = "relayhub_connections_refused_total";
/// Transfers the journal holds as unknown (answered E901, not yet settled).
pub const JOURNAL_UNKNOWN: &str = "relayhub_journal_unknown";
/// Journal rows past the retention that pruning keeps because they are not
/// settled (`sending` or `unknown`), as of the last prune.
pub const JOURNAL_UNSETTLED_PAST_RETENTION: &str = "relayhub_journal_unsettled_past_retention";
/// SIGHUP reloads, by `result` (`ok` or `refused`).
pub const CONFIG_RELOADS: &str = "relayhub_config_reloads_total";
/// Journal calls that failed or outlived the budget, by `stage`: `claim` (the
/// transfer was not sent: E901, E903 or the core's final answer), `outcome` (answered, not recorded yet: retried
/// in the background), `settle` (an inquiry's answer not recorded), or
/// `late_answer` (a late answer not recorded), `read` (the row of a transfer
/// taken no further, during a drain or past its budget, not read in time:
/// E901), `prune`, or `checkpoint` (the SQLite journal's WAL checkpoint,
/// retried).
pub const JOURNAL_ERRORS: &str = "relayhub_journal_errors_total";
/// Shared journal: `sending` rows of another hub taken over (made `unknown`,
/// then settled by inquiry) because that hub's lease expired or its liveness
/// lapsed.
pub const JOURNAL_TAKEOVERS: &str = "relayhub_journal_takeovers_total";
/// Shared journal: 1 while this hub cannot renew its liveness within the
/// fence and so posts nothing (transfers answered E901, or the core's final
/// answer), else 0.
pub const JOURNAL_FENCED: &str = "relayhub_journal_fenced";
/// Shared journal: liveness renewals that failed or timed out.
pub const JOURNAL_LIVENESS_FAILURES: &str = "relayhub_journal_liveness_failures_total";
/// Answers not written within `write_timeout_ms` (the connection was closed).
pub const ANSWER_WRITE_TIMEOUTS: &str = "relayhub_answer_write_timeouts_total";
/// Answers written after their telegram's budget had ended.
pub const ANSWERS_PAST_BUDGET: &str = "relayhub_answers_past_budget_total";
/// Log lines dropped because stderr was not read fast enough, or could not
/// be written (closed, full).
pub const LOG_LINES_DROPPED: &str = "relayhub_log_lines_dropped_total";
/// Channel TLS handshakes that did not finish, by `reason`: `timeout`,
/// `no_client_certificate`, `bad_client_certificate`, `protocol` or `closed`.
pub const TLS_HANDSHAKE_FAILURES: &str = "relayhub_tls_handshake_failures_total";
/// The `reason` labels of [`TLS_HANDSHAKE_FAILURES`].
pub const TLS_HANDSHAKE_REASONS: [&str; 5] = [
    "timeout",
    "no_client_certificate",
    "bad_client_certificate",
    "protocol",
    "closed",
];

/// The `tx_code` label of a telegram whose tx code has no route (or whose
/// header is unreadable, or of input that cannot be framed): a channel cannot
/// create label values at will.
pub const UNROUTED_TX: &str = "other";

/// Describes every metric (the `# HELP` lines) to the installed recorder and
/// starts the series without labels at zero, so they show from the first scrape.
/// Call once the recorder is installed.
pub fn describe_all() {
    describe_counter!(
        TELEGRAMS,
        Unit::Count,
        "Telegrams answered, by tx code (`other` for codes without a route and input that cannot be framed) and standard response code."
    );
    describe_histogram!(
        TELEGRAM_DURATION,
        Unit::Seconds,
        "Time from reading a telegram whole to its answer (the hub's latency, bounded by the budget), by tx code."
    );
    describe_histogram!(
        CORE_CALL_DURATION,
        Unit::Seconds,
        "Time spent calling the core for one telegram, bulkhead wait and retries included, by target and operation."
    );
    describe_gauge!(
        CORE_IN_FLIGHT,
        Unit::Count,
        "Calls to the target running now (late-answer calls included), by target."
    );
    describe_counter!(
        BULKHEAD_REJECTIONS,
        Unit::Count,
        "Calls not sent because the target's bulkhead stayed full for queue_wait_ms (answered E903), by target."
    );
    describe_counter!(
        CORE_RETRIES,
        Unit::Count,
        "Retries inside one telegram (connects that sent nothing; inquiries), by target and operation."
    );
    describe_counter!(
        CORE_TLS_FAILURES,
        Unit::Count,
        "TLS handshakes with a core that failed, so nothing was sent (E902, failover allowed), by target and cause."
    );
    describe_counter!(
        CORE_REUSE_PAUSES,
        Unit::Count,
        "Times a target stopped reusing its connections to the core for 60 s because the core closed them right after answering without Connection: close (each call opens a new connection meanwhile), by target."
    );
    describe_gauge!(
        OPEN_CONNECTIONS,
        Unit::Count,
        "Channel connections open now."
    );
    describe_counter!(
        CONNECTIONS_REFUSED,
        Unit::Count,
        "Channel connections closed at once because max_connections were open or the hub was out of file descriptors."
    );
    describe_gauge!(
        JOURNAL_UNKNOWN,
        Unit::Count,
        "Transfers the journal holds as unknown (answered E901, not settled yet); reconcile with `relayhub journal reconcile`."
    );
    describe_gauge!(
        JOURNAL_UNSETTLED_PAST_RETENTION,
        Unit::Count,
        "Journal rows older than the retention that pruning keeps because they are not settled (sending or unknown), as of the last prune (every 10 minutes); reconcile them."
    );
    describe_counter!(
        CONFIG_RELOADS,
        Unit::Count,
        "Configuration reloads (SIGHUP), by result: ok, refused (the previous configuration stays) or ignored (the hub was draining)."
    );
    describe_counter!(
        JOURNAL_ERRORS,
        Unit::Count,
        "Journal calls that failed or outlived the budget, by stage: claim (transfer not sent: E901, E903 or the core's final answer), outcome (answered, not recorded yet; retried), settle (an inquiry's answer not recorded), late_answer, read (a transfer taken no further, during a drain or past its budget, whose row was not read in time: E901), prune or checkpoint (SQLite WAL checkpoint; retried)."
    );
    describe_counter!(
        JOURNAL_TAKEOVERS,
        Unit::Count,
        "Shared journal: transfers in flight on another hub taken over (made unknown, settled by inquiry) because that hub's lease expired or its liveness lapsed."
    );
    describe_gauge!(
        JOURNAL_FENCED,
        Unit::Count,
        "Shared journal: 1 while this hub cannot renew its liveness within liveness_fence_ms and so posts nothing (transfers answered E901, or the core's final answer), else 0."
    );
    describe_counter!(
        JOURNAL_LIVENESS_FAILURES,
        Unit::Count,
        "Shared journal: liveness renewals that failed or timed out (the hub fences itself after liveness_fence_ms without one)."
    );
    describe_counter!(
        ANSWER_WRITE_TIMEOUTS,
        Unit::Count,
        "Answers not written within write_timeout_ms because the channel did not read them; each closed its connection."
    );
    describe_counter!(
        ANSWERS_PAST_BUDGET,
        Unit::Count,
        "Answers written after their telegram's budget had ended (budget_ms from its read): the hub was short of CPU, or the channel read its answers slowly."
    );
    describe_counter!(
        LOG_LINES_DROPPED,
        Unit::Count,
        "Log lines dropped because stderr was not read fast enough or could not be written (logging never holds up a telegram)."
    );
    describe_counter!(
        TLS_HANDSHAKE_FAILURES,
        Unit::Count,
        "Channel TLS handshakes that did not finish, by reason: timeout (tls_handshake_timeout_ms), no_client_certificate, bad_client_certificate (unknown CA, expired...), protocol, closed (the client went away)."
    );
    for reason in TLS_HANDSHAKE_REASONS {
        metrics::counter!(TLS_HANDSHAKE_FAILURES, "reason" => reason).increment(0);
    }
    metrics::gauge!(OPEN_CONNECTIONS).increment(0.0);
    metrics::counter!(LOG_LINES_DROPPED).increment(0);
    metrics::counter!(ANSWER_WRITE_TIMEOUTS).increment(0);
    metrics::counter!(ANSWERS_PAST_BUDGET).increment(0);
    metrics::gauge!(JOURNAL_UNKNOWN).increment(0.0);
    metrics::gauge!(JOURNAL_UNSETTLED_PAST_RETENTION).increment(0.0);
    metrics::counter!(CONNECTIONS_REFUSED).increment(0);
    metrics::counter!(JOURNAL_TAKEOVERS).increment(0);
    for result in ["ok", "refused"] {
        metrics::counter!(CONFIG_RELOADS, "result" => result).increment(0);
    }
}
