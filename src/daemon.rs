//! Start-up and lifecycle: load and check the config, open the journal, bind the
//! listeners, serve, reload on request, drain on shutdown.
//!
//! The binary and the end-to-end tests start the hub the same way, through
//! [`Daemon::start`]; tests give `127.0.0.1:0` and read the bound address back.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::channel_tls::{self, Acceptor};
use crate::config::{Config, ConfigError, Overrides};
use crate::core_client::Target;
use crate::journal::{Journal, JournalError, Ownership, now_ms};
use crate::relay::{Hub, ResendPolicy};
use crate::rules::{Rules, RulesError};
use crate::server::{self, Limits};
use crate::tls_files::TlsFileError;

/// Why the hub did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Rules(#[from] RulesError),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("target {name}: {source}")]
    Target {
        name: String,
        source: crate::core_client::TargetError,
    },
    #[error(transparent)]
    Tls(#[from] TlsFileError),
}

/// Why a reload was refused (the previous configuration stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Rules(#[from] RulesError),
    /// A TLS file of the listener (certificate, key, client CA).
    #[error(transparent)]
    ListenerTls(#[from] TlsFileError),
    /// A target's certificate or key file cannot be used; the files in force stay.
    #[error("target {name}: {source}")]
    TargetTls { name: String, source: TlsFileError },
    /// A channel that only a TLS listener can serve (`cert_names`), while
    /// this hub has none until a restart: in force now, the channel table
    /// would shut that channel out (every telegram E103) with no listener it
    /// could show its certificate on.
    #[error(
        "channel.{channel}.cert_names: only a TLS listener can show a client certificate, \
         and this hub has none until a restart (server.tls_listen waits for one); in force \
         now, channel {channel} could not call at all: restart the hub to add the listener \
         and the channel together"
    )]
    NeedsTlsListener { channel: String },
    /// The file is empty (or blank): most likely caught while being written.
    /// Every key has a default, so it would otherwise drop the routes and the
    /// channel table in force.
    #[error(
        "{}: the file is empty; write the new version whole (to a temporary file renamed \
         into place) before the reload",
        .0.display()
    )]
    EmptyFile(PathBuf),
}

/// Where the config comes from, kept for reloads.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub file: Option<PathBuf>,
    pub overrides: Overrides,
}

impl Source {
    /// Reads the file (or the defaults), applies the flags, checks the result.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let config = match &self.file {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        self.finish(config)
    }

    /// The flags applied to `config` (read from this source), then checked.
    fn finish(&self, mut config: Config) -> Result<Config, ConfigError> {
        config.apply(&self.overrides);
        config.validate(&self.name())?;
        Ok(config)
    }

    /// [`Source::load`], and the admin token read as `serve` reads it: for
    /// `check` and a reload, which refuse what a start would refuse. (Other
    /// commands that read the config, e.g. an offline reconcile, need no
    /// token.)
    pub fn load_to_serve(&self) -> Result<Config, ConfigError> {
        let config = self.load()?;
        self.with_admin_token(config)
    }

    /// `config`, once the admin token it names (if it has an admin
    /// listener) can be read.
    fn with_admin_token(&self, config: Config) -> Result<Config, ConfigError> {
        if config.server.admin_listen.is_some() {
            self.admin_token(&config)?;
        }
        Ok(config)
    }

    /// [`Source::load_to_serve`] for a reload: the file is read once, and
    /// refused when empty or blank before those same bytes are parsed (an
    /// editor that truncates it between two reads cannot slip an empty file
    /// in).
    fn load_to_reload(&self) -> Result<Config, ReloadError> {
        let Some(path) = &self.file else {
            return Ok(self.load_to_serve()?);
        };
        let text = Config::file_text(path)?;
        if text.trim().is_empty() {
            return Err(ReloadError::EmptyFile(path.clone()));
        }
        let config = self.finish(Config::from_toml(&self.name(), &text)?)?;
        Ok(self.with_admin_token(config)?)
    }

    /// The admin token `config` names (read from its file or variable), a
    /// failure as a config error of this source.
    fn admin_token(&self, config: &Config) -> Result<Option<String>, ConfigError> {
        config
            .server
            .admin_token()
            .map_err(|(key, reason)| ConfigError::Invalid {
                file: self.name(),
                key: key.into(),
                reason,
            })
    }

    fn name(&self) -> String {
        match &self.file {
            Some(p) => p.display().to_string(),
            None => "command line".into(),
        }
    }
}

/// Builds the targets of a checked config.
pub fn build_targets(config: &Config) -> Result<Vec<Arc<Target>>, StartError> {
    let budget = Duration::from_millis(config.server.budget_ms);
    config
        .targets
        .iter()
        .map(|t| {
            Target::new(t, budget)
                .map(Arc::new)
                .map_err(|source| StartError::Target {
                    name: t.name.clone(),
                    source,
                })
        })
        .collect()
}

/// A running hub.
pub struct Daemon {
    pub addr: SocketAddr,
    /// The TLS telegram listener's address, when `tls_listen` is set.
    pub tls_addr: Option<SocketAddr>,
    pub admin_addr: Option<SocketAddr>,
    /// The TLS configuration new connections get (replaced on reload).
    tls: Option<Arc<Acceptor>>,
    hub: Arc<Hub>,
    source: Source,
    /// The config the hub started with: what restart-only keys are set to.
    started: Config,
    target_names: Vec<String>,
    shutdown: Option<oneshot::Sender<()>>,
    server: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
    /// The journal is this hub's while the daemon lives: dropped (and a SQLite
    /// file's lock released) only once shutdown has drained the telegrams.
    _journal_owner: Ownership,
}

impl Daemon {
    /// Starts a hub; returns once it takes telegrams.
    pub async fn start(source: Source) -> Result<Daemon, StartError> {
        let config = source.load()?;
        crate::open_files::fit(&config);
        let ready = Arc::new(AtomicBool::new(false));
        let mut background = Vec::new();

        crate::admin::describe();
        let hub_cell = crate::admin::HubCell::default();

        // The admin listener comes first, so /readyz can say "starting".
        let admin_addr = match &config.server.admin_listen {
            Some(addr) => {
                let token = source.admin_token(&config)?;
                let listener = bind(addr).map_err(|e| match e {
                    StartError::Bind { addr, source } => StartError::Bind {
                        addr: format!("{addr} (admin_listen)"),
                        source,
                    },
                    other => other,
                })?;
                let bound = listener.local_addr().ok();
                if let Some(admin) = bound {
                    info!(%admin, "admin endpoints listening (not ready yet)");
                }
                background.push(tokio::spawn(serve_admin(
                    listener,
                    ready.clone(),
                    hub_cell.clone(),
                    token,
                )));
                bound
            }
            None => None,
        };

        // The telegram ports are held before the journal is opened: a start
        // refused for a port in use leaves no journal file behind. They
        // listen once the hub is ready; until then a connect is refused.
        let reserved = Reserved::bind(&config.server.listen)?;
        let addr = reserved.addr;
        let tls_socket = match &config.server.tls_listen {
            None => None,
            Some(tls_listen) => {
                let acceptor = Arc::new(Acceptor::new(channel_tls::server_config(&config.server)?));
                Some((Reserved::bind(tls_listen)?, acceptor))
            }
        };
        let tls = tls_socket.as_ref().map(|(r, a)| (a.clone(), r.addr));
        let targets = build_targets(&config)?;
        let target_names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
        let rules = Rules::build(&config, &target_names)?;
        let (mut journal, owner) = open_journal(
            &config.journal.path,
            config.journal.max_batch,
            config.journal.fsync_outcomes,
        )
        .await?;
        if config.journal.fsync_outcomes && !matches!(journal, Journal::Sqlite(_)) {
            warn!(
                journal = journal.kind(),
                "journal.fsync_outcomes applies to a SQLite journal only; ignored"
            );
        }
        journal.check_lease(config.longest_call_ms())?;
        journal.start_liveness(config.journal.liveness()).await?;
        if journal.is_shared() {
            // The fence is asked again at each transfer's first request byte,
            // so no gap is left between the check and the write
            // (docs/scale-out.md, the timing argument).
            for target in &targets {
                let journal = journal.clone();
                target.require_licence(Arc::new(move || journal.may_send()));
            }
        }
        let hub = Arc::new(Hub::new(
            rules,
            targets,
            journal,
            Duration::from_millis(config.server.budget_ms),
            ResendPolicy::from(&config.journal),
        ));
        crate::admin::register_targets(&hub);
        let _ = hub_cell.set(hub.clone());
        background.push(tokio::spawn(housekeeping(
            hub.clone(),
            config.journal.retention(),
            GAUGES_EVERY,
            Duration::from_millis(config.journal.prune_interval_ms),
        )));
        if let Some(lease) = hub.journal().lease() {
            background.push(tokio::spawn(take_over_dead_hubs_rows(hub.clone(), lease)));
        }

        let listener = reserved.listen()?;
        let tls_side = match tls_socket {
            Some((reserved, acceptor)) => Some(server::TlsListener {
                listener: reserved.listen()?,
                acceptor,
            }),
            None => None,
        };
        let tls_addr = tls.as_ref().map(|(_, a)| *a);
        let (tx, rx) = oneshot::channel::<()>();
        let server = tokio::spawn(server::run(
            listener,
            tls_side,
            hub.clone(),
            Limits::from(&config.server),
            async {
                let _ = rx.await;
            },
        ));
        ready.store(true, Ordering::SeqCst);
        match tls_addr {
            Some(tls_addr) => info!(
                %addr, %tls_addr,
                client_certificates = client_auth_name(&config.server),
                journal = hub.journal().kind(),
                budget_ms = config.server.budget_ms,
                "relayhub ready"
            ),
            None => {
                info!(%addr, journal = hub.journal().kind(), budget_ms = config.server.budget_ms, "relayhub ready")
            }
        }
        Ok(Daemon {
            addr,
            tls_addr,
            admin_addr,
            tls: tls.map(|(a, _)| a),
            hub,
            source,
            started: config,
            target_names,
            shutdown: Some(tx),
            server,
            background,
            _journal_owner: owner,
        })
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Re-reads routes, layouts, channels, the code table, the TLS listener's
    /// certificate, key and client CA, and the targets' certificate files.
    /// All are read and checked before any is put in force: an invalid new
    /// version (a bad TLS file included) is refused and the old one stays.
    /// Then each is swapped in whole (a target's TLS config, the rules, the
    /// listener's TLS config, in that order): a connection or call sees the
    /// old or the new version of each, never a mix of files. Open TLS
    /// connections keep their session; the next handshake (channel or core)
    /// uses the new files.
    /// Everything else (listeners, prefix, budget, target URLs and timeouts,
    /// journal, logging) is fixed at start-up: the changed keys of that kind
    /// are returned, and logged, with their running and new values. An empty
    /// or blank file is refused: most likely caught while being written.
    pub fn reload(&self) -> Result<Reloaded, ReloadError> {
        let result = self.source.load_to_reload().and_then(|config| {
            // A route must fit the limit the listener reads by now, and the
            // file's, which the next start puts in force.
            let limit = (self.started.server.max_telegram_len).min(config.server.max_telegram_len);
            let rules = Rules::build_to_read(&config, &self.target_names, limit)?;
            // The running listener takes the new files; a TLS listener
            // added or removed waits for a restart (`tls_listen`).
            let tls = match (&self.tls, &config.server.tls_listen) {
                (Some(_), Some(_)) => Some(channel_tls::server_config(&config.server)?),
                // A listener added waits for a restart, which must find
                // its files.
                (None, Some(_)) => {
                    channel_tls::server_config(&config.server)?;
                    None
                }
                _ => None,
            };
            if self.tls.is_none()
                && let Some(c) = config.channels.iter().find(|c| !c.cert_names.is_empty())
            {
                return Err(ReloadError::NeedsTlsListener {
                    channel: c.id.clone(),
                });
            }
            let target_tls = read_tls(&config, self.hub.targets())?;
            Ok((
                rules,
                tls,
                target_tls,
                restart_only_changes(&self.started, &config),
            ))
        });
        match result {
            Ok((rules, tls, target_tls, restart_pending)) => {
                for (target, material) in target_tls {
                    if target.rotate_tls(material) {
                        info!(
                            target_name = %target.name,
                            "reload: new certificate files of the target in force for new connections"
                        );
                    }
                }
                self.hub.set_rules(rules);
                if let (Some(acceptor), Some(tls)) = (&self.tls, tls) {
                    acceptor.replace(tls);
                    info!(
                        "reload: TLS certificate, key and client CA re-read; new connections use them"
                    );
                }
                metrics::counter!(crate::metric_names::CONFIG_RELOADS, "result" => "ok")
                    .increment(1);
                let reloaded = Reloaded { restart_pending };
                if reloaded.restart_pending.is_empty() {
                    info!("reload: new routes, layouts, channels and codes in force");
                } else {
                    warn!(
                        "reload: new routes, layouts, channels and codes in force; {}",
                        reloaded
                    );
                }
                Ok(reloaded)
            }
            Err(e) => {
                metrics::counter!(crate::metric_names::CONFIG_RELOADS, "result" => "refused")
                    .increment(1);
                warn!(error = %e, "reload refused; the previous configuration stays");
                Err(e)
            }
        }
    }

    /// Drains (no new connections, E903 to new telegrams, in-flight ones get
    /// their answers) and returns when done.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.server).await;
        for task in &self.background {
            task.abort();
        }
        // The telegrams are answered: the journal is made whole in its file.
        match self._journal_owner.close_cleanly(self.hub.journal()).await {
            Ok(true) => info!("journal copied into its file: the file alone holds it now"),
            Ok(false) => {}
            Err(e) => {
                metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "checkpoint")
                    .increment(1);
                warn!(
                    error = %e,
                    "the journal's -wal still holds recent rows: keep it with the file (copy, back up and move them together)"
                );
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.server.abort();
        for task in &self.background {
            task.abort();
        }
    }
}

/// Reads the certificate files of every running target as the new config
/// names them (a target the file no longer has keeps its files: removing a
/// target waits for a restart).
fn read_tls<'a>(
    config: &Config,
    running: &'a [Arc<Target>],
) -> Result<Vec<(&'a Arc<Target>, crate::core_client::tls::TlsMaterial)>, ReloadError> {
    let mut out = Vec::new();
    for target in running {
        if let Some(cfg) = config.targets.iter().find(|t| t.name == target.name) {
            let material =
                crate::core_client::tls::load(cfg).map_err(|source| ReloadError::TargetTls {
                    name: target.name.clone(),
                    source,
                })?;
            out.push((target, material));
        }
    }
    Ok(out)
}

/// What a reload that took left for a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// Changed keys that only a restart applies; empty when there are none.
    pub restart_pending: Vec<PendingKey>,
}

impl std::fmt::Display for Reloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.restart_pending.len();
        if n == 0 {
            return f.write_str("nothing waits for a restart");
        }
        write!(
            f,
            "{n} changed {} for a restart: ",
            if n == 1 { "key waits" } else { "keys wait" }
        )?;
        for (i, k) in self.restart_pending.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}")?;
        }
        Ok(())
    }
}

/// One restart-only key whose value in the file differs from the running one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingKey {
    /// Dotted, targets by name: `server.budget_ms`, `target.core.urls`.
    pub key: String,
    /// The value in force (`unset` when the key is absent).
    pub running: String,
    /// The value in the file.
    pub file: String,
}

impl std::fmt::Display for PendingKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({} -> {})", self.key, self.running, self.file)
    }
}

/// The keys a reload applies; every other key waits for a restart.
const RELOADABLE: [&str; 8] = [
    "route",
    "channel",
    "server.layouts_dir",
    "server.codes_file",
    "server.tls_cert_file",
    "server.tls_key_file",
    "server.tls_client_ca_file",
    "server.tls_client_auth",
];

/// How the TLS listener treats client certificates, for the ready log.
fn client_auth_name(s: &crate::config::ServerConfig) -> &'static str {
    match (&s.tls_client_ca_file, s.tls_client_auth) {
        (None, _) => "not asked",
        (Some(_), crate::config::ClientAuth::Required) => "required",
        (Some(_), crate::config::ClientAuth::Optional) => "optional",
    }
}

/// The keys of every target that a reload applies (its certificate files).
const RELOADABLE_TARGET_KEYS: [&str; 3] = ["ca_file", "client_cert_file", "client_key_file"];

/// Restart-only keys that differ between the running config and a new one.
/// Credentials are named, never shown.
pub fn restart_only_changes(running: &Config, file: &Config) -> Vec<PendingKey> {
    let (a, b) = (flat(running), flat(file));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| {
            !RELOADABLE
                .iter()
                .any(|r| *k == r || k.starts_with(&format!("{r}.")))
        })
        .filter(|k| {
            !(k.starts_with("target.")
                && RELOADABLE_TARGET_KEYS
                    .iter()
                    .any(|r| k.ends_with(&format!(".{r}"))))
        })
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let show = |v: Option<&String>| match v {
                None => "unset".to_string(),
                Some(_) if k.contains(".auth.") => "hidden".to_string(),
                // A PostgreSQL URL may carry a password.
                Some(v) if k == "journal.path" => crate::journal::postgres::redact(v),
                Some(v) => v.clone(),
            };
            PendingKey {
                key: k.clone(),
                running: show(a.get(k)),
                file: show(b.get(k)),
            }
        })
        .collect()
}

/// A config as dotted keys -> values; `[[target]]` entries keyed by name.
/// A target's timing left unset is shown as the value it takes (derived
/// from the budget): the key written at that value changes nothing, and the
/// line shows what runs, not "unset" (found by a black-box probe).
fn flat(config: &Config) -> std::collections::BTreeMap<String, String> {
    let budget = std::time::Duration::from_millis(config.server.budget_ms);
    let mut config = config.clone();
    for t in &mut config.targets {
        let ms = |d: std::time::Duration| Some(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        t.connect_timeout_ms = ms(t.effective_connect_timeout(budget));
        t.queue_wait_ms = ms(t.effective_queue_wait(budget));
        t.wire_grace_ms = ms(t.effective_wire_grace(budget));
    }
    let config = &config;
    fn walk(prefix: &str, v: &toml::Value, out: &mut std::collections::BTreeMap<String, String>) {
        match v {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    walk(&format!("{prefix}.{k}"), v, out);
                }
            }
            toml::Value::String(s) => {
                out.insert(prefix.to_string(), s.clone());
            }
            other => {
                out.insert(prefix.to_string(), other.to_string());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    let Ok(toml::Value::Table(top)) = toml::Value::try_from(config) else {
        return out;
    };
    for (name, v) in &top {
        match v {
            toml::Value::Array(items) if name == "target" => {
                for t in items {
                    let id = t.get("name").and_then(toml::Value::as_str).unwrap_or("?");
                    walk(&format!("target.{id}"), t, &mut out);
                }
            }
            // Routes and channels are reloaded as a whole.
            toml::Value::Array(_) => {}
            v => walk(name, v, &mut out),
        }
    }
    out
}

fn bind(addr: &str) -> Result<tokio::net::TcpListener, StartError> {
    Reserved::bind(addr)?.listen()
}

/// A listener's address, bound but not yet listening (`server::reserve`).
struct Reserved {
    socket: tokio::net::TcpSocket,
    /// As configured, for the error.
    name: String,
    /// As bound (port 0 made a port).
    addr: SocketAddr,
}

impl Reserved {
    fn bind(addr: &str) -> Result<Reserved, StartError> {
        let error = |source| StartError::Bind {
            addr: addr.into(),
            source,
        };
        let parsed: SocketAddr = addr.parse().map_err(|_| {
            error(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not HOST:PORT",
            ))
        })?;
        let socket = server::reserve(parsed).map_err(error)?;
        let addr_bound = socket.local_addr().map_err(error)?;
        Ok(Reserved {
            socket,
            name: addr.into(),
            addr: addr_bound,
        })
    }

    fn listen(self) -> Result<tokio::net::TcpListener, StartError> {
        let name = self.name;
        server::listen(self.socket).map_err(|source| StartError::Bind { addr: name, source })
    }
}

/// Opens the journal as its owner (a SQLite file is locked: a second hub, or
/// a reconcile beside a live hub, is refused) and settles what a crash left
/// behind. Keep the [`Ownership`] for as long as the journal is used.
pub async fn open_journal(
    spec: &str,
    max_batch: usize,
    fsync_outcomes: bool,
) -> Result<(Journal, Ownership), JournalError> {
    let (journal, owner) = Journal::open_owned(spec, max_batch, fsync_outcomes).await?;
    let recovered = journal.recover(now_ms()).await?;
    if recovered > 0 {
        warn!(
            recovered,
            "transfers in flight when the hub stopped are now unknown (E901); a resend is answered by inquiry"
        );
    }
    Ok((journal, owner))
}

async fn serve_admin(
    listener: tokio::net::TcpListener,
    ready: Arc<AtomicBool>,
    hub: crate::admin::HubCell,
    token: Option<String>,
) {
    let serving = crate::admin::serve(listener, ready, hub, token, std::future::pending());
    if let Err(e) = serving.await {
        tracing::error!(%e, "admin listener failed");
    }
}

/// On a shared journal, once a lease: the `sending` rows of hubs whose
/// lease ran out become `unknown`, as a hub's start makes them. Otherwise
/// only a resend of the transfer (a claim) or a reconcile took such a row
/// over, and an INQ001 about it, which does not believe the core's "never
/// received" about a row that another hub may be sending, said E901 for as
/// long as the channel asked (found by a chaos run).
async fn take_over_dead_hubs_rows(hub: Arc<Hub>, lease: Duration) {
    let mut tick = tokio::time::interval(lease);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match hub.journal().recover(now_ms()).await {
            Ok(0) => {}
            Ok(n) => info!(
                taken_over = n,
                "transfers of hubs whose lease ran out are now unknown (E901); an inquiry or a resend settles each"
            ),
            Err(e) => {
                metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "recover")
                    .increment(1);
                warn!(%e, "could not take over the rows of hubs whose lease ran out; retrying");
            }
        }
    }
}

/// How often the read gauges are refreshed.
const GAUGES_EVERY: Duration = Duration::from_secs(5);

/// Periodic work: the read gauges (also refreshed by each `/metrics` scrape),
/// and pruning past the retention (at start-up, then every `prune_every`),
/// whatever the journal's store.
async fn housekeeping(
    hub: Arc<Hub>,
    retention: Duration,
    gauges_every: Duration,
    prune_every: Duration,
) {
    let mut tick = tokio::time::interval(gauges_every.min(prune_every));
    let mut last_gauges: Option<tokio::time::Instant> = None;
    let mut last_prune: Option<tokio::time::Instant> = None;
    loop {
        tick.tick().await;
        if last_gauges.is_none_or(|t| t.elapsed() >= gauges_every) {
            last_gauges = Some(tokio::time::Instant::now());
            crate::admin::refresh(&hub).await;
        }
        if last_prune.is_none_or(|t| t.elapsed() >= prune_every) {
            last_prune = Some(tokio::time::Instant::now());
            prune(hub.journal(), retention).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        let mut c = Config::from_toml("t.toml", text).unwrap();
        c.apply(&Overrides::default());
        c
    }

    #[test]
    fn restart_only_keys_are_named_with_both_values() {
        let a = cfg(
            "[server]\nbudget_ms = 3000\n[[target]]\nname = \"core\"\nurls = [\"http://a:1\"]\nauth = { bearer = \"old\" }\n",
        );
        let b = cfg(
            "[server]\nbudget_ms = 2000\nlayouts_dir = \"/x\"\n[journal]\nmax_resends = 5\n\
             [[target]]\nname = \"core\"\nurls = [\"http://b:1\"]\nauth = { bearer = \"new\" }\n\
             [[route]]\ntx_code = \"TRF009\"\noperation = \"transfer\"\n\
             [[channel]]\nid = \"IBANK\"\n",
        );
        let changes: Vec<String> = restart_only_changes(&a, &b)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            changes,
            [
                "journal.max_resends (3 -> 5)",
                "server.budget_ms (3000 -> 2000)",
                "target.core.auth.bearer (hidden -> hidden)",
                "target.core.urls ([\"http://a:1\"] -> [\"http://b:1\"])",
                // Derived from the budget: the budget + the late-answer window + 5 s.
                "target.core.wire_grace_ms (38000 -> 37000)",
            ]
        );
        assert!(restart_only_changes(&a, &a).is_empty());
        // A timing written at the value it takes unset changes nothing; at
        // another value it is shown against the value that runs, not "unset".
        let same = cfg(
            "[server]\nbudget_ms = 3000\n[[target]]\nname = \"core\"\nurls = [\"http://a:1\"]\n\
             auth = { bearer = \"old\" }\nconnect_timeout_ms = 500\nqueue_wait_ms = 100\n\
             wire_grace_ms = 38000\n",
        );
        assert!(restart_only_changes(&a, &same).is_empty());
        let other = cfg(
            "[server]\nbudget_ms = 3000\n[[target]]\nname = \"core\"\nurls = [\"http://a:1\"]\n\
             auth = { bearer = \"old\" }\nconnect_timeout_ms = 300\n",
        );
        let changes: Vec<String> = restart_only_changes(&a, &other)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(changes, ["target.core.connect_timeout_ms (500 -> 300)"]);
        let r = Reloaded {
            restart_pending: restart_only_changes(&a, &b),
        };
        assert!(
            r.to_string()
                .starts_with("5 changed keys wait for a restart: journal.")
        );
        let one = Reloaded {
            restart_pending: restart_only_changes(&a, &b).into_iter().take(1).collect(),
        };
        assert!(
            one.to_string()
                .starts_with("1 changed key waits for a restart: journal."),
            "{one}"
        );
    }

    #[test]
    fn a_targets_certificate_files_are_reloaded_not_restart_only() {
        let a = cfg(
            "[[target]]\nname = \"core\"\nurls = [\"https://a:1\"]\nca_file = \"/old/ca.pem\"\n",
        );
        let b = cfg(
            "[[target]]\nname = \"core\"\nurls = [\"https://a:1\"]\nca_file = \"/new/ca.pem\"\n\
             client_cert_file = \"/new/hub.pem\"\nclient_key_file = \"/new/hub.key\"\n",
        );
        assert!(restart_only_changes(&a, &b).is_empty());
    }

    #[test]
    fn an_added_target_or_an_unset_key_is_named() {
        let a = cfg("[[target]]\nname = \"core\"\nurls = [\"http://a:1\"]\n");
        let b = cfg(
            "[server]\nadmin_listen = \"127.0.0.1:9101\"\n[[target]]\nname = \"core\"\nurls = [\"http://a:1\"]\n\
             [[target]]\nname = \"ledger\"\nurls = [\"http://c:1\"]\n",
        );
        let keys: Vec<String> = restart_only_changes(&a, &b)
            .into_iter()
            .map(|k| format!("{} {} {}", k.key, k.running, k.file))
            .collect();
        assert!(
            keys.contains(&"server.admin_listen unset 127.0.0.1:9101".to_string())
                && keys.contains(&"target.ledger.name unset ledger".to_string()),
            "{keys:?}"
        );
    }
}

/// Prunes settled rows past the retention and sets the gauge of unsettled
/// rows kept past it. The retention counts on the journal's clock (the
/// database's for a shared journal): a hub whose own clock runs days ahead
/// would otherwise prune every hub's rows, and their resends would post again.
async fn prune(journal: &Journal, retention: Duration) {
    let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let now = match journal.clock_ms().await {
        Ok(now) => now,
        Err(e) => {
            metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "prune").increment(1);
            warn!(%e, "journal prune skipped: the journal's clock could not be read");
            return;
        }
    };
    let before = now.saturating_sub(retention_ms);
    match journal.prune(before).await {
        Ok(0) => {}
        Ok(n) => info!(
            pruned = n,
            retention_ms, "journal rows past the retention pruned"
        ),
        Err(e) => {
            metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "prune").increment(1);
            warn!(%e, "journal prune failed")
        }
    }
    match journal.unsettled_before(before).await {
        Ok(kept) => {
            metrics::gauge!(crate::metric_names::JOURNAL_UNSETTLED_PAST_RETENTION).set(kept as f64);
            if kept > 0 {
                warn!(
                    kept,
                    retention_ms,
                    "journal rows past the retention kept because they are not settled (sending or unknown); reconcile them"
                );
            }
        }
        Err(e) => {
            metrics::counter!(crate::metric_names::JOURNAL_ERRORS, "stage" => "prune").increment(1);
            warn!(%e, "cannot count unsettled journal rows past the retention")
        }
    }
}

#[cfg(test)]
mod housekeeping_tests {
    use super::*;
    use crate::config::Overrides;
    use crate::journal::memory::MemoryJournal;
    use crate::journal::{Finish, State};

    /// A hub on `journal` whose core is never called.
    fn hub_on(journal: Journal) -> Arc<Hub> {
        let source = Source {
            file: None,
            overrides: Overrides {
                core_url: Some("http://127.0.0.1:9".into()),
                ..Overrides::default()
            },
        };
        let config = source.load().expect("default config");
        let targets = build_targets(&config).expect("targets");
        let names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
        let rules = Rules::build(&config, &names).expect("rules");
        Arc::new(Hub::new(
            rules,
            targets,
            journal,
            Duration::from_millis(config.server.budget_ms),
            ResendPolicy::from(&config.journal),
        ))
    }

    fn settle(j: &MemoryJournal, guid: &str, state: State, at_ms: i64) {
        j.claim(guid, "TRF001", "fp", "http://core", at_ms).unwrap();
        let f = Finish {
            state,
            code: if state == State::Done { "0000" } else { "E901" }.into(),
            answer: None,
            error: None,
            note: "test".into(),
            attempt: None,
        };
        j.finish(guid, f, at_ms).unwrap();
    }

    /// Polls (bounded) until `done` holds; the pause between polls orders
    /// nothing, it only keeps the loop from spinning.
    async fn until(mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "housekeeping did not get there"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The memory journal is pruned by the hub's housekeeping like the
    /// others: at start-up, then every `prune_every`; unknown rows stay.
    #[tokio::test]
    async fn housekeeping_prunes_the_memory_journal_too() {
        let mem = MemoryJournal::default();
        let now = now_ms();
        let long_ago = now - 100 * 3_600_000;
        settle(&mem, "old-done", State::Done, long_ago);
        settle(&mem, "old-unknown", State::Unknown, long_ago);
        settle(&mem, "fresh", State::Done, now);
        let task = tokio::spawn(housekeeping(
            hub_on(Journal::Memory(mem.clone())),
            Duration::from_secs(72 * 3600),
            Duration::from_millis(5),
            Duration::from_millis(50),
        ));

        until(|| mem.get("old-done").unwrap().is_none()).await;
        assert!(mem.get("old-unknown").unwrap().is_some(), "unknown pruned");
        assert!(mem.get("fresh").unwrap().is_some());

        // Another old row: gone at a later prune.
        settle(&mem, "later", State::Done, long_ago);
        until(|| mem.get("later").unwrap().is_none()).await;
        assert!(mem.get("old-unknown").unwrap().is_some());
        assert!(mem.get("fresh").unwrap().is_some());
        task.abort();
    }
}
