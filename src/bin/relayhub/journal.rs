//! `relayhub journal`: look at the GUID journal and settle unknown transfers.
//!
//! `list` and `show` only look: a SQLite file is opened read-only (never
//! created, migrated, locked or recovered), so they are safe beside a live
//! hub. `reconcile` settles: with no hub running it owns the journal (the same
//! lock a hub takes), recovers it and asks the core itself; while a hub runs
//! on the file, the hub settles its own unknown transfers, because only it
//! knows which of its calls are still running, so `reconcile` asks it through
//! its admin listener (`--admin`, or the config's `admin_listen`), or refuses
//! and says how.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;

use relayhub::config::Overrides;
use relayhub::daemon::{Source, build_targets, open_journal};
use relayhub::journal::{Journal, JournalError, Row, State, file_of};
use relayhub::outcome::Code;
use relayhub::rules::Rules;

/// The journal file the hub uses when nothing says otherwise.
const DEFAULT_JOURNAL: &str = "relayhub-journal.db";

#[derive(Args)]
pub struct JournalArgs {
    /// The journal: the hub's SQLite file (under systemd
    /// /var/lib/relayhub/journal.db), or a postgres:// URL. Default:
    /// relayhub-journal.db; for `reconcile`, the [journal] path of --config.
    #[arg(long, value_name = "PATH|URL", global = true)]
    journal: Option<String>,
    /// Create the journal file if it does not exist. Without it, a file that
    /// does not exist is refused, so that a mistyped path is not read as an
    /// empty journal.
    #[arg(long, global = true)]
    create: bool,
    #[command(subcommand)]
    action: JournalAction,
}

/// `journal list --state`, as clap parses it.
#[derive(Clone, Copy, ValueEnum)]
enum StateArg {
    Sending,
    Done,
    Unknown,
    #[value(name = "not_sent")]
    NotSent,
}

impl From<StateArg> for State {
    fn from(arg: StateArg) -> State {
        match arg {
            StateArg::Sending => State::Sending,
            StateArg::Done => State::Done,
            StateArg::Unknown => State::Unknown,
            StateArg::NotSent => State::NotSent,
        }
    }
}

#[derive(Subcommand)]
enum JournalAction {
    /// List transfers in a state (default: unknown, i.e. answered E901).
    ///
    /// One line per row, oldest first: GUID, tx code, state, code, attempts,
    /// created and updated times (ISO 8601, local time), last error. Opens the
    /// journal read-only: safe beside a running hub.
    List {
        /// sending, done, unknown (answered E901, not settled) or not_sent.
        #[arg(long, value_enum, default_value = "unknown")]
        state: StateArg,
        /// At most this many rows.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Show one GUID's row (state, code, attempts, times) and its history.
    ///
    /// Times are ISO 8601 in local time. Opens the journal read-only: safe
    /// beside a running hub. Exits 3 when the GUID is not in the journal.
    Show {
        /// The transfer's GUID (32 characters).
        guid: String,
    },
    /// Show each hub's liveness on a shared (postgres://) journal.
    ///
    /// One line per hub process, most recently renewed first: its id, alive
    /// or dead, how long ago it last renewed (on the database's clock), its
    /// fence and dead-after intervals, its transfers in flight (`sending`)
    /// and when it started. A dead hub's transfers in flight are taken over
    /// by the next resend to a live hub. A SQLite journal has one hub: it
    /// says so.
    Hubs,
    /// Ask the core about every unknown transfer and record the answers.
    ///
    /// Sends GET /v1/transfers/{guid} for each unknown row and prints each GUID
    /// with its code now: 0000 or a B-code (settled), E904 (never received; a
    /// resend may post again) or E901 (still unknown; run it again later).
    ///
    /// With no hub running on the journal, reconcile opens it as the hub would
    /// (taking its lock, marking transfers left in flight by a crash unknown)
    /// and asks the core named by --core-url or --config. While a hub runs on
    /// it, the hub settles its own unknown transfers: reconcile asks it through
    /// its admin listener (--admin, or admin_listen in --config), or refuses.
    Reconcile(ReconcileArgs),
}

#[derive(Args)]
struct ReconcileArgs {
    /// Have the running hub whose admin endpoints are at HOST:PORT (its
    /// admin_listen) reconcile, through POST /journal/reconcile. The journal
    /// and core flags are then not used.
    #[arg(long, value_name = "HOST:PORT")]
    admin: Option<String>,
    /// The hub's admin token, for --admin (or admin_listen in --config) when
    /// the hub asks for one [default: the token --config names, through its
    /// admin_token_file or admin_token_env].
    #[arg(long, value_name = "FILE")]
    admin_token_file: Option<PathBuf>,
    /// Base URL (http://HOST:PORT) of the target `core`, which the default
    /// routes (TRF001, INQ001) use.
    #[arg(long, value_name = "URL")]
    core_url: Option<String>,
    /// The hub's TOML config: its targets, routes, budget, journal path and
    /// admin_listen. Flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Each inquiry is answered within this many ms (default 3000).
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    budget_ms: Option<u64>,
    /// TCP connect timeout to the core, in ms (default 500, lowered to half
    /// the budget).
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    connect_timeout_ms: Option<u64>,
}

pub async fn run(args: JournalArgs) -> Result<ExitCode, String> {
    match args.action {
        JournalAction::List { state, limit } => {
            let state = State::from(state);
            let spec = args.journal.as_deref().unwrap_or(DEFAULT_JOURNAL);
            let j = open_to_look(spec, args.create).await?;
            let rows = j.list(state, limit).await.map_err(|e| e.to_string())?;
            // The total, not the rows shown: operators read it as the size
            // of the backlog. Read with the rows, before they are printed
            // (a slow reader of stdout made it a later moment's; found by a
            // black-box probe).
            let total = j.count(state).await.map_err(|e| e.to_string())?;
            for r in &rows {
                println!(
                    "{}  {}  {:<8}  {}  attempts={}  created={}  updated={}  {}",
                    r.guid,
                    r.tx_code,
                    r.state.as_str(),
                    r.code.as_deref().unwrap_or("----"),
                    r.attempts,
                    local_time(r.created_ms),
                    local_time(r.updated_ms),
                    r.last_error.as_deref().unwrap_or("")
                );
            }
            // "More" only where the limit cut the list: rows written between
            // the two reads are not the limit's doing.
            let shown = if rows.len() == limit && (rows.len() as u64) < total {
                format!(" (the first {} shown; --limit shows more)", rows.len())
            } else {
                String::new()
            };
            eprintln!(
                "{total} row(s) in state {} in {}{shown}",
                state.as_str(),
                describe(spec)
            );
            Ok(ExitCode::SUCCESS)
        }
        JournalAction::Show { guid } => {
            let spec = args.journal.as_deref().unwrap_or(DEFAULT_JOURNAL);
            check_exists(spec, args.create)?;
            // A typo is not "not in the journal" (checked before --create
            // makes a file for it).
            relayhub::client::check_guid(&guid).map_err(|e| format!("GUID {e}"))?;
            let j = open_to_look(spec, args.create).await?;
            eprintln!("{}", describe(spec));
            let Some(row) = j.get(&guid).await.map_err(|e| e.to_string())? else {
                eprintln!("{guid}: not in the journal");
                return Ok(ExitCode::from(3));
            };
            let view = RowView::from(&row);
            println!(
                "{}",
                serde_json::to_string_pretty(&view).unwrap_or_default()
            );
            for e in j.history(&guid).await.map_err(|e| e.to_string())? {
                println!(
                    "{}  {:<8}  {}  {}",
                    local_time(e.at_ms),
                    e.state.as_str(),
                    e.code.as_deref().unwrap_or("----"),
                    e.note
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        JournalAction::Hubs => {
            let spec = args.journal.as_deref().unwrap_or(DEFAULT_JOURNAL);
            let j = open_to_look(spec, args.create).await?;
            let Journal::Postgres(pg) = &j else {
                println!(
                    "{}: a journal of one hub (its lock file names the hub that holds it); \
                     liveness is kept on shared postgres:// journals only",
                    describe(spec)
                );
                return Ok(ExitCode::SUCCESS);
            };
            let hubs = pg.hubs().await.map_err(|e| e.to_string())?;
            for h in &hubs {
                println!(
                    "{}  {:<5}  renewed {} ms ago  fence={} ms  dead_after={} ms  sending={}  started={}",
                    h.hub_id,
                    if h.dead { "dead" } else { "alive" },
                    h.since_renewal_ms,
                    h.fence_ms,
                    h.dead_after_ms,
                    h.sending,
                    local_time(h.started_ms)
                );
            }
            eprintln!(
                "{} hub(s), {} alive, in {}",
                hubs.len(),
                hubs.iter().filter(|h| !h.dead).count(),
                describe(spec)
            );
            Ok(ExitCode::SUCCESS)
        }
        JournalAction::Reconcile(r) => reconcile(args.journal, args.create, r).await,
    }
}

/// A row as `show` prints it: times in ISO 8601 local time.
#[derive(Serialize)]
struct RowView<'a> {
    guid: &'a str,
    tx_code: &'a str,
    fingerprint: &'a str,
    state: &'a str,
    code: Option<&'a str>,
    answer: Option<String>,
    attempts: u32,
    created: String,
    last_attempt: String,
    answered: Option<String>,
    updated: String,
    last_error: Option<&'a str>,
}

impl<'a> From<&'a Row> for RowView<'a> {
    fn from(r: &'a Row) -> Self {
        RowView {
            guid: &r.guid,
            tx_code: &r.tx_code,
            fingerprint: &r.fingerprint,
            state: r.state.as_str(),
            code: r.code.as_deref(),
            answer: r
                .answer
                .as_deref()
                .map(|a| String::from_utf8_lossy(a).into_owned()),
            attempts: r.attempts,
            created: local_time(r.created_ms),
            last_attempt: local_time(r.last_attempt_ms),
            answered: r.answered_ms.map(local_time),
            updated: local_time(r.updated_ms),
            last_error: r.last_error.as_deref(),
        }
    }
}

/// Milliseconds since the epoch as ISO 8601 in local time, with the offset
/// (`2026-11-29T14:03:07.123+09:00`).
fn local_time(ms: i64) -> String {
    use chrono::TimeZone;
    match chrono::Local.timestamp_millis_opt(ms).single() {
        Some(t) => t.format("%Y-%m-%dT%H:%M:%S%.3f%:z").to_string(),
        None => format!("{ms} ms since the epoch"),
    }
}

/// What an operator should read for the journal a command opened: the
/// absolute path of a file, a PostgreSQL URL without its password.
fn describe(spec: &str) -> String {
    match file_of(spec) {
        Some(path) => {
            let shown = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
            format!("journal {} (SQLite file)", shown.display())
        }
        None => format!(
            "journal {} (PostgreSQL)",
            relayhub::journal::postgres::redact(spec)
        ),
    }
}

/// A file that does not exist is refused unless `--create` was given; a
/// memory journal, which lives and dies in its hub's process, always.
fn check_exists(spec: &str, create: bool) -> Result<(), String> {
    if spec == "memory" {
        return Err(
            "journal memory: a memory journal lives in its hub's process and ends with it; \
             there is nothing for a tool to read or settle (a running hub settles its own: \
             relayhub journal reconcile --admin HOST:PORT)"
                .into(),
        );
    }
    match file_of(spec) {
        Some(path) if !create && !path.exists() => Err(format!(
            "journal {}: no such file. Check --journal (the hub's [journal] path; under \
             systemd /var/lib/relayhub/journal.db), or give --create to start an empty journal",
            shown(path)
        )),
        // A file emptied by accident may be a lost journal: not made into a
        // new one unasked (before, reconcile did so where list refused;
        // found by a black-box probe).
        Some(path) if !create && path.metadata().is_ok_and(|m| m.len() == 0) => Err(format!(
            "journal {}: an empty file, not a relayhub journal (yet). Check --journal, or give \
             --create to make an empty journal in it",
            shown(path)
        )),
        _ => Ok(()),
    }
}

fn shown(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// Opens a journal for `list` and `show`: read-only, or created (and then
/// owned for the moment it takes) with `--create`. Names it on stderr.
async fn open_to_look(spec: &str, create: bool) -> Result<Journal, String> {
    check_exists(spec, create)?;
    let missing = file_of(spec).is_some_and(|p| !p.exists());
    let shared = file_of(spec).is_none() && spec != "memory";
    let journal = if shared && create {
        // Its schema made or migrated as a hub would.
        Journal::open(spec, 1).await.map_err(|e| e.to_string())?
    } else if missing {
        // Only with --create: made and migrated as a hub would.
        let (journal, _owner) = Journal::open_owned(spec, 16, true)
            .await
            .map_err(|e| e.to_string())?;
        eprintln!("{} created", describe(spec));
        journal
    } else {
        // Before the open, which makes an empty -wal where there is none.
        let warning = file_of(spec).and_then(relayhub::journal::sqlite::missing_wal_warning);
        let journal = Journal::open_read_only(spec)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(warning) = warning {
            eprintln!("{warning}");
        }
        journal
    };
    Ok(journal)
}

async fn reconcile(
    journal: Option<String>,
    create: bool,
    args: ReconcileArgs,
) -> Result<ExitCode, String> {
    if let Some(admin) = &args.admin {
        return through_hub(admin, admin_token(&args)?.as_deref()).await;
    }
    let given_journal = journal.clone();
    let source = Source {
        file: args.config.clone(),
        overrides: Overrides {
            core_url: args.core_url.clone(),
            budget_ms: args.budget_ms,
            connect_timeout_ms: args.connect_timeout_ms,
            journal,
            ..Overrides::default()
        },
    };
    let mut config = match source.load() {
        Ok(config) => config,
        // Beside a running hub, the way is through it, whatever else is
        // missing: say so first (before: "give --core-url", which then led
        // to this; found by a newcomer's walk-through).
        Err(e) if args.config.is_none() => {
            let spec =
                given_journal.unwrap_or_else(|| relayhub::config::JournalConfig::default().path);
            return Err(
                match file_of(&spec).map(relayhub::journal::sqlite::lock::FileLock::acquire) {
                    Some(Err(relayhub::journal::sqlite::lock::LockError::Held {
                        holder, ..
                    })) => held_by_a_hub(&spec, &holder),
                    _ => e.to_string(),
                },
            );
        }
        Err(e) => return Err(e.to_string()),
    };
    let spec = config.journal.path.clone();
    check_exists(&spec, create)?;
    // What the reconcile says beside its report (a row it leaves alone, as
    // one whose tx code no route names any more): WARN and above, or as
    // RUST_LOG has it (before, nothing was logged here, so such a row was
    // printed E901 with no word why; a black-box probe).
    let filter = std::env::var(tracing_subscriber::EnvFilter::DEFAULT_ENV)
        .ok()
        .and_then(|spec| crate::logging::filter(&spec).ok())
        .map_or_else(|| crate::logging::filter("warn"), Ok)?;
    let _logging = crate::logging::init(config.logging.format, filter)?;
    let grace_unknown = args.config.is_none();
    if grace_unknown {
        // The hub that made the attempts may have had a longer late-answer
        // window (or wire grace) than the defaults: for an attempt that does
        // not carry its own grace (claimed by a build before it was
        // stamped), its "never received" is believed only past the longest
        // grace a config can give (the longest budget and late-answer
        // window, and 5 s), when nothing can still hold a POST.
        use relayhub::config::{MAX_BUDGET_MS, MAX_WINDOW_MS};
        for target in &mut config.targets {
            target.wire_grace_ms = Some(MAX_WINDOW_MS + MAX_BUDGET_MS + 5_000);
        }
    }
    let spec = spec.as_str();
    let (journal, _owner) = match open_journal(
        spec,
        config.journal.max_batch,
        config.journal.fsync_outcomes,
    )
    .await
    {
        Ok(opened) => opened,
        Err(JournalError::Locked { path, holder, .. }) => {
            return match &config.server.admin_listen {
                Some(addr) => {
                    eprintln!(
                        "journal {path} is held by a running hub ({holder}); asking it to \
                         reconcile through its admin listener {addr}"
                    );
                    through_hub(addr, admin_token(&args)?.as_deref()).await
                }
                None => Err(held_by_a_hub(&path, &holder)),
            };
        }
        Err(e) => return Err(e.to_string()),
    };
    eprintln!("{}", describe(spec));
    // Once the journal is open: a refusal comes first, alone.
    if grace_unknown {
        eprintln!(
            "without --config, the hub's wire grace is known only where an attempt carries it: \
             a \"never received\" settles (E904) an attempt stamped with its grace once that \
             has passed, and one from an older build only a day and 10 minutes after it, \
             E901 before; give the hub's config (--config) to settle those sooner"
        );
    }
    let mut targets = build_targets(&config).map_err(|e| e.to_string())?;
    if grace_unknown {
        for target in &mut targets {
            if let Some(target) = std::sync::Arc::get_mut(target) {
                target.wire_grace_is_fallback = true;
            }
        }
    }
    let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
    let rules = Rules::build(&config, &names).map_err(|e| e.to_string())?;
    let hub = relayhub::relay::Hub::new(
        rules,
        targets,
        journal,
        Duration::from_millis(config.server.budget_ms),
        relayhub::relay::ResendPolicy::from(&config.journal),
    );
    let report = relayhub::admin::reconcile(&hub)
        .await
        .map_err(|e| e.to_string())?;
    let report: Vec<(String, String)> = report
        .into_iter()
        .map(|(g, c)| (g, c.as_str().to_string()))
        .collect();
    Ok(print_report(&report))
}

/// Prints each GUID with its code, and a summary on stderr.
fn print_report(report: &[(String, String)]) -> ExitCode {
    for (guid, code) in report {
        let meaning = Code::parse(code)
            .map(|c| c.meaning())
            .unwrap_or("unreadable code");
        println!("{guid}  {code}  {meaning}");
    }
    let open = report
        .iter()
        .filter(|(_, c)| c == Code::UNKNOWN.as_str())
        .count();
    eprintln!(
        "{} unknown transfer(s) asked; {} still unknown",
        report.len(),
        open
    );
    ExitCode::SUCCESS
}

/// Why reconcile does not open a journal a running hub holds, and how to
/// ask that hub instead.
fn held_by_a_hub(path: &str, holder: &str) -> String {
    format!(
        "journal {path} is held by a running hub ({holder}). While a hub runs, it settles its \
         unknown transfers itself: only it knows which of its calls are still running, and a \
         channel's resend is answered by inquiry. To settle them all now, ask it: relayhub \
         journal reconcile --admin HOST:PORT (the hub's admin_listen)"
    )
}

/// The token to show the hub's admin listener: from --admin-token-file, else
/// the one --config names (as the hub reads it), else none.
fn admin_token(args: &ReconcileArgs) -> Result<Option<String>, String> {
    if let Some(path) = &args.admin_token_file {
        // Read as the hub reads its admin_token_file.
        let server = relayhub::config::ServerConfig {
            admin_token_file: Some(path.clone()),
            ..Default::default()
        };
        return server
            .admin_token()
            .map_err(|(_, reason)| format!("--admin-token-file: {reason}"));
    }
    let Some(file) = &args.config else {
        return Ok(None);
    };
    let config = relayhub::config::Config::from_file(file).map_err(|e| e.to_string())?;
    config
        .server
        .admin_token()
        .map_err(|(key, reason)| format!("{}: {key}: {reason}", file.display()))
}

/// `POST http://ADMIN/journal/reconcile` on the running hub.
async fn through_hub(admin: &str, token: Option<&str>) -> Result<ExitCode, String> {
    let host = reachable(admin);
    let url = format!("http://{host}/journal/reconcile");
    let asked = url.clone();
    let bearer = token.map(|t| format!("Bearer {t}"));
    let answer = tokio::task::spawn_blocking(move || -> Result<(u16, String), String> {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(5)))
            .build()
            .new_agent();
        let mut request = agent.post(&url);
        if let Some(t) = &bearer {
            request = request.header("Authorization", t.as_str());
        }
        let mut resp = request.send_empty().map_err(|e| match &e {
            // Connected, then closed before an answer: a hub that stops (a
            // drain) while it reconciles does that.
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => format!(
                "the hub's admin listener at {url} closed the connection before answering ({e}): \
                 is the hub stopping? What it settled before is in the journal; run the \
                 reconcile again once a hub runs"
            ),
            _ => format!("cannot reach the hub's admin listener at {url}: {e}"),
        })?;
        let status = resp.status().as_u16();
        let body = resp
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("{url}: cannot read the answer: {e}"))?;
        Ok((status, body))
    })
    .await
    .map_err(|e| format!("{asked}: {e}"))??;
    match answer {
        (200, body) => {
            let codes: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&body)
                .map_err(|e| {
                    format!("{asked}: the answer is not a JSON object of GUID -> code: {e}")
                })?;
            eprintln!("reconciled by the hub at {host}");
            let report: Vec<(String, String)> = codes
                .into_iter()
                .map(|(g, c)| (g, c.as_str().unwrap_or("????").to_string()))
                .collect();
            Ok(print_report(&report))
        }
        (401, _) => Err(format!(
            "{asked}: 401, the hub asks for its admin token{}: give --admin-token-file FILE, \
             or --config with the hub's admin_token_file or admin_token_env",
            if token.is_some() {
                ", and not this one"
            } else {
                ""
            }
        )),
        (404, _) => Err(format!(
            "{asked}: 404; is {host} the hub's admin_listen, and the hub a build with \
             POST /journal/reconcile?"
        )),
        (status, body) => Err(format!("{asked}: {status} {}", body.trim())),
    }
}

/// An admin address as the hub binds it (`0.0.0.0:9101`, `[::]:9101`) made
/// one this host can connect to.
fn reachable(addr: &str) -> String {
    match addr.parse::<std::net::SocketAddr>() {
        Ok(a) if a.ip().is_unspecified() => {
            let ip: std::net::IpAddr = if a.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            };
            std::net::SocketAddr::new(ip, a.port()).to_string()
        }
        _ => addr.to_string(),
    }
}
