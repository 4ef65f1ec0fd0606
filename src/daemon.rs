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

use crate::config::{Config, ConfigError, Overrides};
use crate::core_client::Target;
use crate::journal::{Journal, JournalError, now_ms};
use crate::relay::{Hub, ResendPolicy};
use crate::rules::Rules;
use crate::server::{self, Limits};

/// Why the hub did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Rules(String),
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("target {name}: {reason}")]
    Target { name: String, reason: String },
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
        let mut config = match &self.file {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        config.apply(&self.overrides);
        config.validate(&self.name())?;
        Ok(config)
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
                .map_err(|reason| StartError::Target {
                    name: t.name.clone(),
                    reason,
                })
        })
        .collect()
}

/// A running hub.
pub struct Daemon {
    pub addr: SocketAddr,
    pub admin_addr: Option<SocketAddr>,
    hub: Arc<Hub>,
    source: Source,
    target_names: Vec<String>,
    shutdown: Option<oneshot::Sender<()>>,
    server: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
}

impl Daemon {
    /// Starts a hub; returns once it takes telegrams.
    pub async fn start(source: Source) -> Result<Daemon, StartError> {
        let config = source.load()?;
        let ready = Arc::new(AtomicBool::new(false));
        let mut background = Vec::new();

        crate::admin::describe();
        let hub_cell = crate::admin::HubCell::default();

        // The admin listener comes first, so /readyz can say "starting".
        let admin_addr = match &config.server.admin_listen {
            Some(addr) => {
                let listener = bind(addr)?;
                let bound = listener.local_addr().ok();
                if let Some(admin) = bound {
                    info!(%admin, "admin endpoints listening (not ready yet)");
                }
                background.push(tokio::spawn(serve_admin(
                    listener,
                    ready.clone(),
                    hub_cell.clone(),
                )));
                bound
            }
            None => None,
        };

        let targets = build_targets(&config)?;
        let target_names: Vec<String> = targets.iter().map(|t| t.name.clone()).collect();
        let rules = Rules::build(&config, &target_names).map_err(StartError::Rules)?;
        let journal = open_journal(&config.journal.path, config.journal.max_batch).await?;
        let longest_window = config.targets.iter().map(|t| t.late_answer_window_ms).max();
        journal.check_lease(config.server.budget_ms + longest_window.unwrap_or(0))?;
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
            Duration::from_millis(config.journal.prune_interval_ms),
        )));

        let listener = bind(&config.server.listen)?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            addr: config.server.listen.clone(),
            source,
        })?;
        let (tx, rx) = oneshot::channel::<()>();
        let server = tokio::spawn(server::run(
            listener,
            hub.clone(),
            Limits::from(&config.server),
            async {
                let _ = rx.await;
            },
        ));
        ready.store(true, Ordering::SeqCst);
        info!(%addr, journal = hub.journal().kind(), budget_ms = config.server.budget_ms, "relayhub ready");
        Ok(Daemon {
            addr,
            admin_addr,
            hub,
            source,
            target_names,
            shutdown: Some(tx),
            server,
            background,
        })
    }

    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// Re-reads routes, layouts, channels and the code table and swaps them in
    /// as one unit; an invalid new version is refused and the old one stays.
    /// Targets are fixed at start-up.
    pub fn reload(&self) -> Result<(), String> {
        let result = self
            .source
            .load()
            .map_err(|e| e.to_string())
            .and_then(|config| {
                let names: Vec<String> = config.targets.iter().map(|t| t.name.clone()).collect();
                if names != self.target_names {
                    warn!("reload: targets changed; target changes take effect at the next start");
                }
                Rules::build(&config, &self.target_names)
            });
        match result {
            Ok(rules) => {
                self.hub.set_rules(rules);
                metrics::counter!(crate::metric_names::CONFIG_RELOADS, "result" => "ok")
                    .increment(1);
                info!("reload: new routes, layouts, channels and codes in force");
                Ok(())
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

fn bind(addr: &str) -> Result<tokio::net::TcpListener, StartError> {
    let parsed: SocketAddr = addr.parse().map_err(|_| StartError::Bind {
        addr: addr.into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "not HOST:PORT"),
    })?;
    server::bind(parsed).map_err(|source| StartError::Bind {
        addr: addr.into(),
        source,
    })
}

/// Opens the journal and settles what a crash left behind.
pub async fn open_journal(spec: &str, max_batch: usize) -> Result<Journal, JournalError> {
    let journal = Journal::open(spec, max_batch).await?;
    let recovered = journal.recover(now_ms()).await?;
    if recovered > 0 {
        warn!(
            recovered,
            "transfers in flight when the hub stopped are now unknown (E901); a resend is answered by inquiry"
        );
    }
    Ok(journal)
}

async fn serve_admin(
    listener: tokio::net::TcpListener,
    ready: Arc<AtomicBool>,
    hub: crate::admin::HubCell,
) {
    if let Err(e) = crate::admin::serve(listener, ready, hub, std::future::pending()).await {
        warn!(%e, "admin listener failed");
    }
}

/// Periodic work: the read gauges (also refreshed by each `/metrics` scrape,
/// else every 5 s), and pruning past the retention every `prune_every`.
async fn housekeeping(hub: Arc<Hub>, retention: Duration, prune_every: Duration) {
    let gauges_every = Duration::from_secs(5);
    let mut tick = tokio::time::interval(gauges_every.min(prune_every));
    let mut last_gauges: Option<tokio::time::Instant> = None;
    let mut last_prune = tokio::time::Instant::now();
    loop {
        tick.tick().await;
        if last_gauges.is_none_or(|t| t.elapsed() >= gauges_every) {
            last_gauges = Some(tokio::time::Instant::now());
            crate::admin::refresh(&hub).await;
        }
        if last_prune.elapsed() >= prune_every {
            last_prune = tokio::time::Instant::now();
            let retention_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
            match hub
                .journal()
                .prune(now_ms().saturating_sub(retention_ms))
                .await
            {
                Ok(0) => {}
                Ok(n) => info!(
                    pruned = n,
                    retention_ms, "journal rows past the retention pruned"
                ),
                Err(e) => warn!(%e, "journal prune failed"),
            }
        }
    }
}
