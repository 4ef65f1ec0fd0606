//! The hub's configuration: a strict TOML file, built-in defaults, and the checks
//! that refuse a setting the hub could not honour (a timeout that does not fit the
//! budget, a route to a target that does not exist).
//!
//! Nothing here imports the modules that use the config: they read these plain
//! structs. Every key has a default, so an empty file (or no file at all) is a
//! valid configuration that relays TRF001/INQ001 to the target named `core`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::frame::PrefixMode;
use crate::journal::postgres::LivenessSettings;

/// The name of the target that `--core-url` points at and the default routes use.
pub const DEFAULT_TARGET: &str = "core";

/// A configuration that could not be read or does not make sense.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    /// The file is not valid TOML or has an unknown key or a wrong type.
    #[error("config {file}: {message}")]
    Parse { file: String, message: String },
    /// The values parse but contradict each other or the protocol.
    #[error("config {file}: `{key}`: {reason}")]
    Invalid {
        file: String,
        key: String,
        reason: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize, Serialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub server: ServerConfig,
    pub journal: JournalConfig,
    pub logging: LoggingConfig,
    /// Core systems the hub calls. Without any, one target `core` is assumed.
    #[serde(rename = "target")]
    pub targets: Vec<TargetConfig>,
    /// Tx codes and what they do. Without any, TRF001 and INQ001 go to `core`.
    #[serde(rename = "route")]
    pub routes: Vec<RouteConfig>,
    /// Channels allowed to call. Without any, every well-formed channel id may call.
    #[serde(rename = "channel")]
    pub channels: Vec<ChannelConfig>,
}

/// The telegram listener and the per-telegram budget.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Address of the telegram listener.
    pub listen: String,
    /// Address of the admin HTTP endpoints (metrics, health, console); off when
    /// absent. Give a loopback address (`127.0.0.1:9101`) unless the endpoints
    /// must be reached from other hosts.
    pub admin_listen: Option<String>,
    /// Name of an environment variable holding the admin bearer token; with a
    /// token, every admin endpoint but `/healthz` and `/readyz` needs it.
    pub admin_token_env: Option<String>,
    /// A file holding the admin bearer token (surrounding whitespace ignored).
    pub admin_token_file: Option<PathBuf>,
    /// Length prefix: `ascii` (4 digits) or `binary` (u32 big-endian).
    pub prefix: PrefixMode,
    /// Longest telegram accepted, in bytes after the prefix.
    pub max_telegram_len: usize,
    /// The hub answers every telegram within this many ms of reading it whole.
    pub budget_ms: u64,
    /// A connection with no telegram started for this long is closed.
    pub idle_timeout_ms: u64,
    /// A started telegram must be complete within this many ms (slow senders).
    pub read_timeout_ms: u64,
    /// Channel connections open at once; more are accepted and closed at once.
    pub max_connections: usize,
    /// Telegrams one connection may have in flight (pipelined) at once.
    pub max_in_flight_per_connection: usize,
    /// An answer not written within this many ms (the channel does not read)
    /// closes its connection, freeing the slot.
    pub write_timeout_ms: u64,
    /// Folder of layout files, added to the built-in ones (a file with a
    /// built-in tx code replaces that layout).
    pub layouts_dir: Option<PathBuf>,
    /// The business-result -> standard-code table; the shipped one when absent.
    pub codes_file: Option<PathBuf>,
    /// Address of the TLS telegram listener (beside `listen`); off when absent.
    pub tls_listen: Option<String>,
    /// The hub's certificate chain for `tls_listen`, PEM (leaf first).
    /// Re-read on SIGHUP.
    pub tls_cert_file: Option<PathBuf>,
    /// The private key of `tls_cert_file`, PEM (PKCS#8, PKCS#1 or SEC1).
    /// Re-read on SIGHUP.
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates (PEM) that sign the channels' client certificates; with
    /// it, channels on `tls_listen` are asked for a certificate. Re-read on SIGHUP.
    pub tls_client_ca_file: Option<PathBuf>,
    /// With `tls_client_ca_file`: `required` (a client without a certificate
    /// is refused at the handshake) or `optional` (it may connect, but only as
    /// a channel without `cert_names`).
    pub tls_client_auth: ClientAuth,
    /// A TLS handshake not finished within this many ms is closed (counted).
    pub tls_handshake_timeout_ms: u64,
}

/// Whether a client certificate is required on the TLS listener.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    #[default]
    Required,
    Optional,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:9100".into(),
            admin_listen: None,
            admin_token_env: None,
            admin_token_file: None,
            prefix: PrefixMode::Ascii,
            max_telegram_len: 4096,
            budget_ms: 3000,
            idle_timeout_ms: 60_000,
            read_timeout_ms: 5_000,
            max_connections: 20_000,
            max_in_flight_per_connection: 32,
            write_timeout_ms: 5_000,
            layouts_dir: None,
            codes_file: None,
            tls_listen: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_client_ca_file: None,
            tls_client_auth: ClientAuth::Required,
            tls_handshake_timeout_ms: 5_000,
        }
    }
}

impl ServerConfig {
    /// The admin bearer token, read now: from `admin_token_env`, else from
    /// `admin_token_file`; `None` when neither is set. An unset variable, an
    /// unreadable file or an empty token is an error naming the key.
    pub fn admin_token(&self) -> Result<Option<String>, (&'static str, String)> {
        let token = if let Some(var) = &self.admin_token_env {
            if !is_env_name(var) {
                return Err((
                    "server.admin_token_env",
                    "is not an environment variable's name (letters, digits and _, not \
                     starting with a digit); not shown: it may be the token itself"
                        .into(),
                ));
            }
            // The variable's name is not shown either: a token that looks
            // like one may have been pasted in its place.
            let t = std::env::var(var).map_err(|_| {
                (
                    "server.admin_token_env",
                    "the environment variable it names is not set (its name is not shown: it \
                     may be the token itself)"
                        .to_string(),
                )
            })?;
            ("server.admin_token_env", t)
        } else if let Some(path) = &self.admin_token_file {
            let t = std::fs::read_to_string(path).map_err(|e| {
                (
                    "server.admin_token_file",
                    format!("cannot read {}: {e}", path.display()),
                )
            })?;
            ("server.admin_token_file", t)
        } else {
            return Ok(None);
        };
        let (key, t) = token;
        let t = t.trim();
        if t.is_empty() {
            return Err((key, "the token is empty".into()));
        }
        // No request could carry it (a header value holds no control
        // character but a tab), so no request would be let in: refused, not
        // shown.
        if let Some(at) = t.find(|c: char| c.is_control() && c != '\t') {
            return Err((
                key,
                format!(
                    "the token holds a control character at byte {at}, which no request's \
                     Authorization header can carry (the token is not shown)"
                ),
            ));
        }
        Ok(Some(t.to_string()))
    }
}

/// Where GUIDs are journaled and how repeats are treated (protocol section 8).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct JournalConfig {
    /// A database file, `memory`, or a `postgres://` URL.
    pub path: String,
    /// Resends allowed after a "certainly not sent" answer (E902/E903/E904).
    pub max_resends: u32,
    /// A resend is refused (E905) sooner than this after the previous answer.
    pub resend_cooldown_ms: u64,
    /// Rows older than this are pruned. Keep it at least as long as the core's
    /// own idempotency window, and longer than any channel keeps resending.
    pub retention_hours: u64,
    /// The retention in ms, overriding `retention_hours` when set: for soak
    /// tests that need pruning within a run, never for production.
    pub retention_ms: Option<u64>,
    /// How often housekeeping prunes, in ms.
    pub prune_interval_ms: u64,
    /// Most rows written in one commit; concurrent telegrams share a commit.
    pub max_batch: usize,
    /// SQLite: fsync an outcome's commit before the answer too. Off: claims
    /// (and failover URLs) are fsynced before the POST, outcomes are written
    /// before the answer and fsynced with the next claim; a power loss can
    /// only take an outcome back to E901, which an inquiry settles.
    pub fsync_outcomes: bool,
    /// Shared journal: how often the hub renews its liveness, in ms.
    pub liveness_renew_ms: u64,
    /// Shared journal: the hub posts nothing (transfers answered E901, or the
    /// core's final answer) once this long has passed
    /// since the start of its last successful renewal (its monotonic clock).
    pub liveness_fence_ms: u64,
    /// Shared journal: other hubs take a hub's transfers in flight over once
    /// its last renewal is this old (the database's clock).
    pub liveness_dead_after_ms: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            path: "relayhub-journal.db".into(),
            max_resends: 3,
            resend_cooldown_ms: 1000,
            retention_hours: 72,
            retention_ms: None,
            prune_interval_ms: 600_000,
            max_batch: 256,
            fsync_outcomes: false,
            liveness_renew_ms: LivenessSettings::default().renew_ms,
            liveness_fence_ms: LivenessSettings::default().fence_ms,
            liveness_dead_after_ms: LivenessSettings::default().dead_after_ms,
        }
    }
}

impl JournalConfig {
    /// The liveness intervals of a hub on a shared journal.
    pub fn liveness(&self) -> LivenessSettings {
        LivenessSettings {
            renew_ms: self.liveness_renew_ms,
            fence_ms: self.liveness_fence_ms,
            dead_after_ms: self.liveness_dead_after_ms,
        }
    }

    /// The retention in force: `retention_ms` when set, else `retention_hours`.
    pub fn retention(&self) -> Duration {
        match self.retention_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs(self.retention_hours.saturating_mul(3600)),
        }
    }
}

/// Log output.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// `human` for terminals, `json` for log shippers.
    pub format: LogFormat,
    /// A `tracing` filter, e.g. `info` or `relayhub=debug`.
    pub filter: String,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        LoggingConfig {
            format: LogFormat::Human,
            filter: "info".into(),
        }
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Human,
    Json,
}

/// One core system: its endpoints, timeouts, bulkhead and credentials.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TargetConfig {
    pub name: String,
    /// Base URLs, tried in order; the next one only when nothing was sent.
    #[serde(default)]
    pub urls: Vec<String>,
    /// TCP connect timeout; at most half the budget when left to its default.
    pub connect_timeout_ms: Option<u64>,
    /// How often the host names of `urls` are looked up again (they are
    /// looked up when the target is built, at start and on reload; a call never
    /// waits for a lookup of its own).
    #[serde(default = "default_resolve_refresh_ms")]
    pub resolve_refresh_ms: u64,
    /// How long a transfer call may go on after the hub answered E901, so that
    /// a late answer is still journaled. 0 ends the call with the budget.
    #[serde(default = "default_late_answer_window_ms")]
    pub late_answer_window_ms: u64,
    /// How old an attempt must be before the core's "never received" proves
    /// that it never arrived: a request may still be on the wire (kernel
    /// buffers outlive a killed hub; a proxy or balancer can hold it). At least
    /// the late-answer window; by default budget + late-answer window + 5 s.
    pub wire_grace_ms: Option<u64>,
    /// Calls to this target at once (the bulkhead).
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: usize,
    /// Longest wait for a bulkhead slot, counted against the budget; by
    /// default [`DEFAULT_QUEUE_WAIT_MS`], lowered to half the budget (see
    /// [`TargetConfig::effective_queue_wait`]).
    pub queue_wait_ms: Option<u64>,
    /// Connect attempts per telegram (first try included) when nothing was sent.
    #[serde(default = "default_connect_attempts")]
    pub connect_attempts: u32,
    /// Inquiry attempts per telegram when an inquiry fails after being sent.
    #[serde(default = "default_inquiry_attempts")]
    pub inquiry_attempts: u32,
    /// First backoff step; doubled each retry, with full jitter.
    #[serde(default = "default_backoff_ms")]
    pub backoff_ms: u64,
    /// Credentials; the value itself is never logged.
    #[serde(default)]
    pub auth: Option<AuthConfig>,
    /// PEM file of the CA certificates that may sign the core's certificate
    /// (`https://` URLs). Without it, the Mozilla roots built into the hub
    /// (webpki-roots). Re-read on SIGHUP.
    pub ca_file: Option<PathBuf>,
    /// PEM file of the hub's client certificate (and its chain) for a core
    /// that asks for one (mTLS); needs `client_key_file`. Re-read on SIGHUP.
    pub client_cert_file: Option<PathBuf>,
    /// PEM file of the private key of `client_cert_file` (PKCS#8, PKCS#1 or
    /// SEC1). Re-read on SIGHUP.
    pub client_key_file: Option<PathBuf>,
}

/// The longest budget a channel may be given: ten minutes. Larger values are
/// refused at start (they are mistakes, and would overflow the deadline arithmetic).
pub const MAX_BUDGET_MS: u64 = 600_000;

/// The longest late-answer window and wire grace: one day.
pub const MAX_WINDOW_MS: u64 = 86_400_000;

fn default_resolve_refresh_ms() -> u64 {
    30_000
}
fn default_late_answer_window_ms() -> u64 {
    30_000
}
fn default_max_concurrency() -> usize {
    1024
}
/// The most tries per telegram `connect_attempts` and `inquiry_attempts` may
/// ask for.
pub const MAX_ATTEMPTS: u32 = 100;

/// The longest of any duration in the config (30 days).
pub const MAX_DURATION_MS: u64 = 30 * 24 * 3_600_000;
/// Channel connections at once, at most.
pub const MAX_CONNECTIONS: u64 = 1_000_000;
/// Pipelined telegrams of one connection at once, at most.
pub const MAX_IN_FLIGHT_PER_CONNECTION: u64 = 10_000;
/// Calls in flight to one target, at most: each holds a thread.
pub const MAX_CONCURRENCY: u64 = 100_000;
/// Journal commands in one transaction, at most.
pub const MAX_BATCH: u64 = 100_000;
/// Ten years.
pub const MAX_RETENTION_HOURS: u64 = 87_600;
/// The longest telegram any prefix may announce (the ascii prefix stops at 9999).
pub const MAX_TELEGRAM_LEN: u64 = 16 * 1024 * 1024;

/// The bulkhead wait of a target that does not set `queue_wait_ms`, before
/// it is lowered to half the budget.
pub const DEFAULT_QUEUE_WAIT_MS: u64 = 100;
fn default_connect_attempts() -> u32 {
    3
}
fn default_inquiry_attempts() -> u32 {
    3
}
fn default_backoff_ms() -> u64 {
    25
}

/// The connect timeout used when none is configured.
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 500;

impl TargetConfig {
    /// A target with every default and the given URL.
    pub fn with_url(name: &str, url: &str) -> Self {
        TargetConfig {
            name: name.into(),
            urls: vec![url.into()],
            connect_timeout_ms: None,
            resolve_refresh_ms: default_resolve_refresh_ms(),
            late_answer_window_ms: default_late_answer_window_ms(),
            wire_grace_ms: None,
            max_concurrency: default_max_concurrency(),
            queue_wait_ms: None,
            connect_attempts: default_connect_attempts(),
            inquiry_attempts: default_inquiry_attempts(),
            backoff_ms: default_backoff_ms(),
            auth: None,
            ca_file: None,
            client_cert_file: None,
            client_key_file: None,
        }
    }

    /// The wire grace in force: the configured one, else budget + late-answer
    /// window + 5 s (the longest the hub's own call can run, plus a margin for
    /// bytes held in the network).
    pub fn effective_wire_grace(&self, budget: Duration) -> Duration {
        match self.wire_grace_ms {
            Some(ms) => Duration::from_millis(ms),
            None => budget + Duration::from_millis(self.late_answer_window_ms + 5_000),
        }
    }

    /// The bulkhead wait in force: the configured one, else the default
    /// lowered to half the budget (so `--budget-ms` alone is always valid).
    pub fn effective_queue_wait(&self, budget: Duration) -> Duration {
        match self.queue_wait_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_millis(DEFAULT_QUEUE_WAIT_MS).min(budget / 2),
        }
    }

    /// The connect timeout in force: the configured one, else the default
    /// lowered to half the budget (so `--budget-ms` alone is always valid).
    pub fn effective_connect_timeout(&self, budget: Duration) -> Duration {
        match self.connect_timeout_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_millis(DEFAULT_CONNECT_TIMEOUT_MS).min(budget / 2),
        }
    }
}

/// Credentials sent to a target as an `Authorization` header.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// A bearer token written in the file (prefer `bearer_env`).
    pub bearer: Option<String>,
    /// Name of an environment variable holding a bearer token.
    pub bearer_env: Option<String>,
    /// Name of an environment variable holding a whole `Authorization` value
    /// (e.g. `Basic dXNlcjpwYXNz`).
    pub header_env: Option<String>,
}

impl AuthConfig {
    /// The `Authorization` header value, read now (env vars at start-up/reload).
    pub fn header_value(&self) -> Result<String, AuthError> {
        for (key, var) in [
            ("bearer_env", &self.bearer_env),
            ("header_env", &self.header_env),
        ] {
            if var.as_deref().is_some_and(|v| !is_env_name(v)) {
                return Err(AuthError::NotAName { key });
            }
        }
        let env = |key: &'static str, var: &String| {
            std::env::var(var).map_err(|e| AuthError::Env {
                key,
                // Not the error's own text: a value that is not Unicode
                // would be shown in it.
                why: match e {
                    std::env::VarError::NotPresent => "is not set",
                    std::env::VarError::NotUnicode(_) => "is not valid UTF-8",
                },
            })
        };
        let given = [&self.bearer, &self.bearer_env, &self.header_env]
            .iter()
            .filter(|k| k.is_some())
            .count();
        if given > 1 {
            return Err(AuthError::Several);
        }
        let (value, from) = if let Some(token) = &self.bearer {
            (format!("Bearer {token}"), "bearer".to_string())
        } else if let Some(var) = &self.bearer_env {
            (
                format!("Bearer {}", env("bearer_env", var)?),
                "bearer_env".to_string(),
            )
        } else if let Some(var) = &self.header_env {
            (env("header_env", var)?, "header_env".to_string())
        } else {
            return Err(AuthError::Empty);
        };
        // A newline or a control character would make every request
        // unsendable (E902); the value itself is never shown.
        if ureq::http::HeaderValue::from_str(&value).is_err() {
            return Err(AuthError::NotAHeader { from });
        }
        Ok(value)
    }
}

/// Why an `auth` table gives no `Authorization` value.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The environment variable `key` names is unset or not Unicode. Its
    /// name is not shown: a token that looks like one may have been pasted
    /// in its place.
    #[error("the environment variable {key} names {why}")]
    Env {
        key: &'static str,
        why: &'static str,
    },
    /// `bearer_env` or `header_env` is not a variable's name: most likely
    /// the credential itself, pasted where its variable's name goes, so it
    /// is not shown.
    #[error(
        "{key} is not an environment variable's name (letters, digits and _, not starting \
         with a digit); not shown: it may be the credential itself"
    )]
    NotAName { key: &'static str },
    /// None of the keys is given.
    #[error("auth needs one of bearer, bearer_env, header_env")]
    Empty,
    /// More than one key is given: which one would be sent is not obvious.
    #[error("auth takes exactly one of bearer, bearer_env, header_env")]
    Several,
    /// The value cannot be an HTTP header's (a newline, a control character).
    #[error(
        "the value from {from} cannot be an HTTP header (a newline or a control character in it)"
    )]
    NotAHeader { from: String },
}

/// An address block that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum CidrError {
    #[error("{text:?} is not an IP address or CIDR block")]
    Address {
        text: String,
        source: std::net::AddrParseError,
    },
    #[error("{text:?}: prefix length must be 0-{max}")]
    Prefix { text: String, max: u8 },
}

/// What a tx code does.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Operation {
    /// `POST /v1/transfers`, journaled: at most one call per GUID.
    Transfer,
    /// `GET /v1/transfers/{orig_guid}`: idempotent, retried when safe.
    Inquiry,
}

/// A route: tx code -> operation on a target, converted by a layout.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub tx_code: String,
    pub operation: Operation,
    #[serde(default = "default_target_name")]
    pub target: String,
    /// The layout's tx code; the route's own tx code when absent.
    pub layout: Option<String>,
}

fn default_target_name() -> String {
    DEFAULT_TARGET.into()
}

/// A channel allowed to call, where it may call from, and what it may call.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelConfig {
    pub id: String,
    /// Peer addresses or CIDR blocks; any address when empty.
    #[serde(default)]
    pub allow_from: Vec<String>,
    /// Tx codes it may send; any routed code when empty.
    #[serde(default)]
    pub tx_codes: Vec<String>,
    /// Client-certificate names (a SAN DNS name or the subject CN) that are
    /// this channel: with any, the channel must call over `tls_listen` with a
    /// certificate bearing one of them. Each name belongs to one channel.
    #[serde(default)]
    pub cert_names: Vec<String>,
}

/// Values given on the command line; each overrides the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub core_url: Option<String>,
    pub budget_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    pub journal: Option<String>,
    pub admin_listen: Option<String>,
}

impl Config {
    /// The longest a core call of this hub can run: the budget and the
    /// longest late-answer window of its targets (a shared journal's lease
    /// must cover it).
    pub fn longest_call_ms(&self) -> u64 {
        let window = self.targets.iter().map(|t| t.late_answer_window_ms).max();
        self.server.budget_ms + window.unwrap_or(0)
    }

    /// Reads and parses a file, without the cross-checks of [`Config::validate`].
    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        Config::from_toml(&path.display().to_string(), &Config::file_text(path)?)
    }

    /// The text of a config file, a failure to read it named with the file.
    pub fn file_text(path: &Path) -> Result<String, ConfigError> {
        std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            file: path.display().to_string(),
            source,
        })
    }

    /// Parses TOML text; unknown keys are errors.
    pub fn from_toml(file: &str, text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            file: file.into(),
            message: parse_message(&e, text),
        })
    }

    /// Applies command-line overrides, then fills in the default target and routes.
    pub fn apply(&mut self, o: &Overrides) {
        if let Some(v) = &o.listen {
            self.server.listen = v.clone();
        }
        if let Some(v) = o.budget_ms {
            self.server.budget_ms = v;
        }
        if let Some(v) = &o.journal {
            self.journal.path = v.clone();
        }
        if let Some(v) = &o.admin_listen {
            self.server.admin_listen = Some(v.clone());
        }
        if let Some(url) = &o.core_url {
            match self.targets.iter_mut().find(|t| t.name == DEFAULT_TARGET) {
                Some(t) => t.urls = vec![url.clone()],
                None => self
                    .targets
                    .push(TargetConfig::with_url(DEFAULT_TARGET, url)),
            }
        }
        if let Some(ms) = o.connect_timeout_ms {
            for t in &mut self.targets {
                t.connect_timeout_ms = Some(ms);
            }
        }
        if self.routes.is_empty() {
            self.routes = default_routes();
        }
    }

    /// The TLS listener's keys and the channels' certificate names fit
    /// together (the files themselves are read when the listener is built).
    fn validate_tls(&self, bad: &dyn Fn(&str, String) -> ConfigError) -> Result<(), ConfigError> {
        let s = &self.server;
        if s.tls_listen.is_some() {
            for (key, file) in [
                ("server.tls_cert_file", &s.tls_cert_file),
                ("server.tls_key_file", &s.tls_key_file),
            ] {
                if file.is_none() {
                    return Err(bad(key, "server.tls_listen needs it (a PEM file)".into()));
                }
            }
            if s.tls_handshake_timeout_ms == 0 {
                return Err(bad(
                    "server.tls_handshake_timeout_ms",
                    "must be above 0".into(),
                ));
            }
        } else if let Some((key, _)) = [
            ("server.tls_cert_file", s.tls_cert_file.is_some()),
            ("server.tls_key_file", s.tls_key_file.is_some()),
            ("server.tls_client_ca_file", s.tls_client_ca_file.is_some()),
        ]
        .into_iter()
        .find(|(_, set)| *set)
        {
            return Err(bad(
                key,
                "set without server.tls_listen: there is no TLS listener to use it".into(),
            ));
        } else if s.tls_handshake_timeout_ms != ServerConfig::default().tls_handshake_timeout_ms {
            return Err(bad(
                "server.tls_handshake_timeout_ms",
                "set without server.tls_listen: there is no TLS listener to use it".into(),
            ));
        }
        // `optional` loosens what the client CA asks for; without a CA no
        // certificate is asked for at all, so the setting would mean nothing.
        if s.tls_client_auth == ClientAuth::Optional && s.tls_client_ca_file.is_none() {
            return Err(bad(
                "server.tls_client_auth",
                "\"optional\" without server.tls_client_ca_file: no client certificate is asked for"
                    .into(),
            ));
        }
        let mut owner: std::collections::HashMap<String, &str> = Default::default();
        for c in &self.channels {
            let key = format!("channel.{}.cert_names", c.id);
            if !c.cert_names.is_empty() && s.tls_client_ca_file.is_none() {
                return Err(bad(
                    &key,
                    "needs server.tls_client_ca_file: without it no client certificate is asked for, \
                     so this channel could never call"
                        .into(),
                ));
            }
            for name in &c.cert_names {
                if name.trim().is_empty() || name.chars().any(char::is_control) {
                    return Err(bad(&key, format!("{name:?} is not a certificate name")));
                }
                if let Some(other) = owner.insert(name.to_ascii_lowercase(), &c.id)
                    && other != c.id
                {
                    return Err(bad(
                        &key,
                        format!("{name:?} is channel {other}'s too: a certificate is one channel"),
                    ));
                }
            }
        }
        if s.tls_client_ca_file.is_some() && owner.is_empty() {
            return Err(bad(
                "server.tls_client_ca_file",
                "no [[channel]] has cert_names: every client certificate would be refused (E103)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Upper bounds on every count and duration, checked first: far above
    /// any sensible setting, far below where a value would overflow a
    /// clock's sum, a semaphore's permits or an allocation (a
    /// `max_connections` of 2^62 made the listener's task panic after the
    /// ready line; a cooldown of 2^63 ms wrapped to none).
    fn check_magnitudes(&self) -> Result<(), (String, String)> {
        let (s, j) = (&self.server, &self.journal);
        let mut ms: Vec<(String, Option<u64>)> = vec![
            ("server.idle_timeout_ms".into(), Some(s.idle_timeout_ms)),
            ("server.read_timeout_ms".into(), Some(s.read_timeout_ms)),
            ("server.write_timeout_ms".into(), Some(s.write_timeout_ms)),
            (
                "server.tls_handshake_timeout_ms".into(),
                Some(s.tls_handshake_timeout_ms),
            ),
            (
                "journal.resend_cooldown_ms".into(),
                Some(j.resend_cooldown_ms),
            ),
            ("journal.retention_ms".into(), j.retention_ms),
            (
                "journal.prune_interval_ms".into(),
                Some(j.prune_interval_ms),
            ),
            (
                "journal.liveness_renew_ms".into(),
                Some(j.liveness_renew_ms),
            ),
            (
                "journal.liveness_fence_ms".into(),
                Some(j.liveness_fence_ms),
            ),
            (
                "journal.liveness_dead_after_ms".into(),
                Some(j.liveness_dead_after_ms),
            ),
        ];
        for t in &self.targets {
            let key = |name: &str| format!("target.{}.{name}", t.name);
            ms.extend([
                (key("connect_timeout_ms"), t.connect_timeout_ms),
                (key("resolve_refresh_ms"), Some(t.resolve_refresh_ms)),
                (key("late_answer_window_ms"), Some(t.late_answer_window_ms)),
                (key("wire_grace_ms"), t.wire_grace_ms),
                (key("queue_wait_ms"), t.queue_wait_ms),
                (key("backoff_ms"), Some(t.backoff_ms)),
            ]);
        }
        for (key, value) in ms {
            if let Some(v) = value
                && v > MAX_DURATION_MS
            {
                return Err((
                    key,
                    format!("{v} is out of range: at most {MAX_DURATION_MS} (30 days)"),
                ));
            }
        }
        let mut counts: Vec<(String, u64, u64)> = vec![
            (
                "server.max_connections".into(),
                s.max_connections as u64,
                MAX_CONNECTIONS,
            ),
            (
                "server.max_in_flight_per_connection".into(),
                s.max_in_flight_per_connection as u64,
                MAX_IN_FLIGHT_PER_CONNECTION,
            ),
            ("journal.max_batch".into(), j.max_batch as u64, MAX_BATCH),
            (
                "server.max_telegram_len".into(),
                s.max_telegram_len as u64,
                MAX_TELEGRAM_LEN,
            ),
            (
                "journal.retention_hours".into(),
                j.retention_hours,
                MAX_RETENTION_HOURS,
            ),
        ];
        for t in &self.targets {
            counts.push((
                format!("target.{}.max_concurrency", t.name),
                t.max_concurrency as u64,
                MAX_CONCURRENCY,
            ));
        }
        for (key, value, max) in counts {
            if value > max {
                return Err((key, format!("{value} is out of range: at most {max}")));
            }
        }
        Ok(())
    }

    /// Cross-checks: budgets and timeouts fit, routes name real targets, addresses
    /// parse. `file` names the source in messages.
    pub fn validate(&self, file: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, reason: String| ConfigError::Invalid {
            file: file.into(),
            key: key.into(),
            reason,
        };
        let s = &self.server;
        self.check_magnitudes()
            .map_err(|(key, reason)| bad(&key, reason))?;
        if s.budget_ms == 0 || s.budget_ms > MAX_BUDGET_MS {
            return Err(bad(
                "server.budget_ms",
                format!(
                    "{} is out of range: 1..={MAX_BUDGET_MS} (a channel waits this long for an answer)",
                    s.budget_ms
                ),
            ));
        }
        if s.max_telegram_len < crate::header::HEADER_LEN {
            return Err(bad(
                "server.max_telegram_len",
                format!("{} is shorter than the 64-byte header", s.max_telegram_len),
            ));
        }
        if s.prefix == PrefixMode::Ascii && s.max_telegram_len > 9999 {
            return Err(bad(
                "server.max_telegram_len",
                format!(
                    "{} does not fit a 4-digit ascii prefix (at most 9999)",
                    s.max_telegram_len
                ),
            ));
        }
        // 0 would close every connection at once: an idle one before its
        // first byte, a telegram in two segments before its second.
        for (key, ms) in [
            ("server.write_timeout_ms", s.write_timeout_ms),
            ("server.idle_timeout_ms", s.idle_timeout_ms),
            ("server.read_timeout_ms", s.read_timeout_ms),
        ] {
            if ms == 0 {
                return Err(bad(key, "must be above 0".into()));
            }
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.logging.filter) {
            return Err(bad(
                "logging.filter",
                format!("{:?} is not a log filter: {e}", self.logging.filter),
            ));
        }
        for (key, limit) in [
            ("server.max_connections", s.max_connections),
            (
                "server.max_in_flight_per_connection",
                s.max_in_flight_per_connection,
            ),
        ] {
            if limit == 0 {
                return Err(bad(key, "must be at least 1".into()));
            }
        }
        // Parsed once; the listeners are bound before any listens (the
        // start-up order in docs/operations.md), so one address twice would
        // be found only once the journal is open: refused here instead.
        let mut listeners: Vec<(&str, SocketAddr)> = Vec::new();
        for (key, addr) in [
            ("server.listen", Some(&s.listen)),
            ("server.tls_listen", s.tls_listen.as_ref()),
            ("server.admin_listen", s.admin_listen.as_ref()),
        ] {
            let Some(addr) = addr else { continue };
            let Ok(parsed) = addr.parse::<SocketAddr>() else {
                // A port past 65535 beside a good address says so (a
                // black-box probe: it read "is not HOST:PORT").
                let out_of_range = addr.rsplit_once(':').is_some_and(|(ip, port)| {
                    let good_ip = match ip.strip_prefix('[').and_then(|i| i.strip_suffix(']')) {
                        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
                        // An IPv6 address needs its brackets ("[::1]:80").
                        None => ip.parse::<std::net::Ipv4Addr>().is_ok(),
                    };
                    good_ip
                        && !port.is_empty()
                        && port.bytes().all(|b| b.is_ascii_digit())
                        && port.parse::<u16>().is_err()
                });
                let why = if out_of_range {
                    "a port is 0-65535 (0: any free port)"
                } else {
                    "it is not HOST:PORT (an IP address and a port)"
                };
                return Err(bad(key, format!("{addr:?}: {why}")));
            };
            // A wildcard address takes its port on every address of its
            // family, and [::] (dual-stack on Linux) on IPv4's too; port 0
            // is a port of its own each time.
            let covers = |wild: &SocketAddr, other: &SocketAddr| {
                wild.ip().is_unspecified() && (wild.is_ipv4() == other.is_ipv4() || wild.is_ipv6())
            };
            let clash = |b: &SocketAddr| {
                parsed.port() != 0
                    && b.port() == parsed.port()
                    && (b.ip() == parsed.ip() || covers(b, &parsed) || covers(&parsed, b))
            };
            if let Some((other, theirs)) = listeners.iter().find(|(_, b)| clash(b)) {
                return Err(bad(
                    key,
                    format!("{parsed} takes the port of {other} ({theirs})"),
                ));
            }
            listeners.push((key, parsed));
        }
        self.validate_tls(&bad)?;
        let budget = Duration::from_millis(s.budget_ms);
        if self.targets.is_empty() {
            return Err(bad(
                "target",
                "no target configured: give --core-url or a [[target]] table".into(),
            ));
        }
        let mut names = std::collections::HashSet::new();
        for t in &self.targets {
            let key = format!("target.{}", t.name);
            if !names.insert(t.name.as_str()) {
                return Err(bad(&key, "target named twice".into()));
            }
            if t.urls.is_empty() {
                return Err(bad(
                    &format!("{key}.urls"),
                    "needs at least one base URL".into(),
                ));
            }
            for u in &t.urls {
                if let Err(why) = check_base_url(u) {
                    // Redacted: the URL may carry the password it is refused for.
                    let shown = crate::journal::postgres::redact(u);
                    return Err(bad(&format!("{key}.urls"), format!("{shown:?} {why}")));
                }
            }
            match (&t.client_cert_file, &t.client_key_file) {
                (Some(_), None) => {
                    return Err(bad(
                        &format!("{key}.client_key_file"),
                        "client_cert_file is set without client_key_file".into(),
                    ));
                }
                (None, Some(_)) => {
                    return Err(bad(
                        &format!("{key}.client_cert_file"),
                        "client_key_file is set without client_cert_file".into(),
                    ));
                }
                _ => {}
            }
            if !t.urls.iter().any(|u| u.starts_with("https://")) {
                for (name, set) in [
                    ("ca_file", t.ca_file.is_some()),
                    ("client_cert_file", t.client_cert_file.is_some()),
                ] {
                    if set {
                        return Err(bad(
                            &format!("{key}.{name}"),
                            "is set but no URL of the target is https://: the calls would go in clear"
                                .into(),
                        ));
                    }
                }
            }
            if t.late_answer_window_ms > MAX_WINDOW_MS {
                return Err(bad(
                    &format!("{key}.late_answer_window_ms"),
                    format!(
                        "{} is out of range: at most {MAX_WINDOW_MS} (one day)",
                        t.late_answer_window_ms
                    ),
                ));
            }
            if let Some(grace) = t.wire_grace_ms
                && grace > MAX_WINDOW_MS
            {
                return Err(bad(
                    &format!("{key}.wire_grace_ms"),
                    format!("{grace} is out of range: at most {MAX_WINDOW_MS} (one day)"),
                ));
            }
            if let Some(grace) = t.wire_grace_ms
                && grace < s.budget_ms.saturating_add(t.late_answer_window_ms)
            {
                return Err(bad(
                    &format!("{key}.wire_grace_ms"),
                    format!(
                        "{grace} ms is shorter than the budget plus the late-answer window \
                         ({} + {} ms): a \"never received\" could be believed while an attempt \
                         (a retry within the budget, a late call) may still be sent",
                        s.budget_ms, t.late_answer_window_ms
                    ),
                ));
            }
            let connect = t.effective_connect_timeout(budget);
            if connect.is_zero() || connect >= budget {
                return Err(bad(
                    &format!("{key}.connect_timeout_ms"),
                    format!(
                        "{} ms does not fit the {} ms budget (it must be above 0 and below the budget)",
                        connect.as_millis(),
                        s.budget_ms
                    ),
                ));
            }
            if !(100..=86_400_000).contains(&t.resolve_refresh_ms) {
                return Err(bad(
                    &format!("{key}.resolve_refresh_ms"),
                    format!(
                        "{} ms is out of range (100 ms to 24 h)",
                        t.resolve_refresh_ms
                    ),
                ));
            }
            let queue_wait = t.effective_queue_wait(Duration::from_millis(s.budget_ms));
            if queue_wait.as_millis() >= u128::from(s.budget_ms) {
                return Err(bad(
                    &format!("{key}.queue_wait_ms"),
                    format!(
                        "{} ms does not fit the {} ms budget",
                        queue_wait.as_millis(),
                        s.budget_ms
                    ),
                ));
            }
            if t.max_concurrency == 0 || t.connect_attempts == 0 || t.inquiry_attempts == 0 {
                return Err(bad(
                    &key,
                    "max_concurrency and attempts must be at least 1".into(),
                ));
            }
            // Each try is a request to the core within one telegram's
            // budget: with a backoff of 0, thousands of them would hammer a
            // core that is already failing.
            for (name, n) in [
                ("connect_attempts", t.connect_attempts),
                ("inquiry_attempts", t.inquiry_attempts),
            ] {
                if n > MAX_ATTEMPTS {
                    return Err(bad(
                        &format!("{key}.{name}"),
                        format!(
                            "{n} is more than {MAX_ATTEMPTS} tries per telegram; each is a \
                             request to the core within one budget"
                        ),
                    ));
                }
            }
            if let Some(auth) = &t.auth {
                auth.header_value()
                    .map_err(|e| bad(&format!("{key}.auth"), e.to_string()))?;
            }
        }
        let mut codes = std::collections::HashSet::new();
        for r in &self.routes {
            let key = format!("route.{}", r.tx_code);
            if r.tx_code.len() != 6
                || !r
                    .tx_code
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
            {
                return Err(bad(&key, "tx_code must be 6 of A-Z0-9".into()));
            }
            if !codes.insert(r.tx_code.as_str()) {
                return Err(bad(&key, "tx code routed twice".into()));
            }
            if !names.contains(r.target.as_str()) {
                return Err(bad(
                    &format!("{key}.target"),
                    format!("names unknown target {:?}", r.target),
                ));
            }
        }
        let mut ids = std::collections::HashSet::new();
        for c in &self.channels {
            let key = format!("channel.{}", c.id);
            // The last of two would win, and the first's restrictions
            // (allow_from, tx_codes) would silently go.
            if !ids.insert(c.id.as_str()) {
                return Err(bad(&key, "channel id given twice".into()));
            }
            if c.id.trim().is_empty()
                || c.id.len() > 8
                || !c.id.bytes().all(|b| (0x21..=0x7e).contains(&b))
            {
                return Err(bad(
                    &key,
                    "id must be 1-8 printable ASCII characters without spaces".into(),
                ));
            }
            for a in &c.allow_from {
                Cidr::parse(a).map_err(|e| bad(&format!("{key}.allow_from"), e.to_string()))?;
            }
            for code in &c.tx_codes {
                if !codes.contains(code.as_str()) {
                    return Err(bad(
                        &format!("{key}.tx_codes"),
                        format!("{code:?} has no route"),
                    ));
                }
            }
        }
        if self.journal.path.trim().is_empty() {
            return Err(bad(
                "journal.path",
                "is empty: give a file path, `memory`, or a postgres:// URL".into(),
            ));
        }
        if self.journal.max_batch == 0 {
            return Err(bad("journal.max_batch", "must be at least 1".into()));
        }
        // Forgetting a final answer within the hour would let a resend post again.
        if self.journal.retention_hours == 0 {
            return Err(bad(
                "journal.retention_hours",
                "must be at least 1 (keep it at least as long as the core's idempotency window)"
                    .into(),
            ));
        }
        if self.journal.retention_ms == Some(0) {
            return Err(bad(
                "journal.retention_ms",
                "must be at least 1 (keep it longer than any channel keeps resending)".into(),
            ));
        }
        if self.journal.prune_interval_ms == 0 {
            return Err(bad(
                "journal.prune_interval_ms",
                "must be at least 1".into(),
            ));
        }
        if let Err((key, why)) = self.journal.liveness().check() {
            return Err(bad(key, why));
        }
        Ok(())
    }
}

/// The routes used when the file has none: the shipped TRF001 and INQ001.
pub fn default_routes() -> Vec<RouteConfig> {
    vec![
        RouteConfig {
            tx_code: "TRF001".into(),
            operation: Operation::Transfer,
            target: DEFAULT_TARGET.into(),
            layout: None,
        },
        RouteConfig {
            tx_code: "INQ001".into(),
            operation: Operation::Inquiry,
            target: DEFAULT_TARGET.into(),
            layout: None,
        },
    ]
}

/// An address block: `10.0.0.0/8`, `::1/128`, or a bare address (one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `ADDR` or `ADDR/PREFIX`.
    pub fn parse(s: &str) -> Result<Cidr, CidrError> {
        let (a, p) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = a.parse().map_err(|source| CidrError::Address {
            text: s.into(),
            source,
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => {
                p.parse::<u8>()
                    .ok()
                    .filter(|p| *p <= max)
                    .ok_or_else(|| CidrError::Prefix {
                        text: s.into(),
                        max,
                    })?
            }
            None => max,
        };
        Ok(Cidr { addr, prefix })
    }

    /// Whether `ip` lies in this block (IPv4-mapped IPv6 peers count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - self.prefix as u32).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - self.prefix as u32).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Whether `name` is an environment variable's name as shells and systemd
/// write them: a letter or `_`, then letters, digits and `_`.
fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A TOML error as the parser shows it (the message, the line quoted and
/// marked), but for an error that may show a credential: then the line is
/// named, not quoted, and the message's quoted values are left out. That is
/// an error on a line naming an `auth` table, a token, a password, a
/// `*_env` key or a URL with credentials (`@`), or on any line inside a
/// multi-line string (a token's continuation: its key is lines above).
fn parse_message(e: &toml::de::Error, text: &str) -> String {
    let Some(span) = e.span() else {
        return e.to_string();
    };
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_no = text[..start].matches('\n').count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let lower = line.to_ascii_lowercase();
    let hidden = in_multi_line_string(&text[..line_start])
        || ["auth", "bearer", "token", "password", "secret", "_env", "@"]
            .iter()
            .any(|word| lower.contains(word));
    if hidden {
        format!(
            "TOML parse error at line {line_no} (not shown: it may hold a credential): {}",
            without_quoted(e.message())
        )
    } else {
        e.to_string()
    }
}

/// Whether TOML `text` ends inside a multi-line string (`"""` or `'''`):
/// strings and comments are followed as the grammar has them, so a `"""`
/// in a comment or inside a one-line string does not count.
fn in_multi_line_string(text: &str) -> bool {
    #[derive(PartialEq)]
    enum In {
        Code,
        Comment,
        Basic,
        Literal,
        LongBasic,
        LongLiteral,
    }
    let b = text.as_bytes();
    let mut at = In::Code;
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        match at {
            In::Code if rest.starts_with(b"\"\"\"") => (at, i) = (In::LongBasic, i + 3),
            In::Code if rest.starts_with(b"\'\'\'") => (at, i) = (In::LongLiteral, i + 3),
            In::Code => {
                at = match b[i] {
                    b'#' => In::Comment,
                    b'"' => In::Basic,
                    b'\'' => In::Literal,
                    _ => In::Code,
                };
                i += 1;
            }
            In::Comment | In::Basic | In::Literal if b[i] == b'\n' => (at, i) = (In::Code, i + 1),
            In::Basic | In::LongBasic if b[i] == b'\\' => i += 2,
            In::Basic if b[i] == b'"' => (at, i) = (In::Code, i + 1),
            In::Literal if b[i] == b'\'' => (at, i) = (In::Code, i + 1),
            In::LongBasic if rest.starts_with(b"\"\"\"") => (at, i) = (In::Code, i + 3),
            In::LongLiteral if rest.starts_with(b"\'\'\'") => (at, i) = (In::Code, i + 3),
            _ => i += 1,
        }
    }
    matches!(at, In::LongBasic | In::LongLiteral)
}

/// `message` with every quoted value replaced by `"…"`: serde's messages
/// quote the value they refused (`invalid type: string "..."`).
fn without_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut quoted = false;
    for c in message.chars() {
        match (c, quoted) {
            ('"', false) => {
                out.push_str("\"…\"");
                quoted = true;
            }
            ('"', true) => quoted = false,
            (_, false) => out.push(c),
            (_, true) => {}
        }
    }
    out
}

/// Why `url` cannot be a target's base URL, if it cannot. The hub appends the
/// core API's paths to it (`/v1/transfers`, `/v1/transfers/{guid}`), so a
/// query or a fragment would swallow them: every inquiry would ask the same
/// URL whatever the GUID, and take its answer for each one. Credentials in
/// the URL would be sent, shown on the console and stored in the journal with
/// every attempt's URL: they belong in the target's `auth`.
pub fn check_base_url(url: &str) -> Result<(), String> {
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err("is not an http:// or https:// URL".into());
    }
    let uri = match url.parse::<ureq::http::Uri>() {
        Ok(uri) => uri,
        Err(e) => return Err(format!("is not a valid URL: {e}")),
    };
    let Some(authority) = uri.authority() else {
        return Err("names no host".into());
    };
    if authority.as_str().contains('@') {
        return Err(
            "carries credentials: give them in the target's auth (bearer_env, header_env), \
             which is never shown or stored"
                .into(),
        );
    }
    if authority.host().is_empty() {
        return Err("names no host".into());
    }
    // What follows the host: nothing, or `:` and a port (empty: the default).
    let port = &authority.as_str()[authority.host().len()..];
    let port = port.strip_prefix(':').unwrap_or(port);
    if !port.is_empty() && !port.parse::<u16>().is_ok_and(|p| p != 0) {
        return Err(format!("has port {port:?}: a port is 1-65535"));
    }
    if url.contains('?') || url.contains('#') {
        return Err(
            "has a query or a fragment: the hub appends /v1/transfers to the base URL, \
             so give the base alone (a path is fine)"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_token_comes_from_the_env_or_the_file_and_names_its_key() {
        let mut s = ServerConfig::default();
        assert_eq!(s.admin_token(), Ok(None));
        let file =
            std::env::temp_dir().join(format!("relayhub-admin-token-{}", std::process::id()));
        std::fs::write(&file, "  s3cret\n").unwrap();
        s.admin_token_file = Some(file.clone());
        assert_eq!(s.admin_token(), Ok(Some("s3cret".into())));
        std::fs::write(&file, "\n").unwrap();
        assert_eq!(s.admin_token().unwrap_err().0, "server.admin_token_file");
        std::fs::write(&file, "s3\u{1b}cret\n").unwrap();
        let (key, reason) = s.admin_token().unwrap_err();
        assert_eq!(key, "server.admin_token_file");
        assert!(reason.contains("control character at byte 2"), "{reason}");
        assert!(!reason.contains("s3"), "{reason}");
        std::fs::remove_file(&file).unwrap();
        let (key, reason) = s.admin_token().unwrap_err();
        assert_eq!(key, "server.admin_token_file");
        assert!(reason.contains("cannot read"), "{reason}");
        // The variable wins over the file; an unset one is an error.
        s.admin_token_env = Some("RELAYHUB_TEST_ADMIN_TOKEN_NEVER_SET".into());
        let (key, reason) = s.admin_token().unwrap_err();
        assert_eq!(key, "server.admin_token_env");
        assert!(
            reason.contains("is not set") && !reason.contains("NEVER_SET"),
            "{reason}"
        );
    }

    fn with_core() -> Config {
        let mut c = Config::default();
        c.apply(&Overrides {
            core_url: Some("http://127.0.0.1:8080".into()),
            ..Default::default()
        });
        c
    }

    #[test]
    fn defaults_with_core_url_are_valid() {
        let c = with_core();
        c.validate("test").unwrap();
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.targets[0].urls, vec!["http://127.0.0.1:8080"]);
    }

    #[test]
    fn absurd_budgets_and_windows_are_refused_with_their_key() {
        let mut c = with_core();
        c.server.budget_ms = u64::MAX;
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("server.budget_ms") && err.contains("out of range"),
            "{err}"
        );
        let mut c = with_core();
        c.server.budget_ms = MAX_BUDGET_MS;
        c.validate("t").unwrap();
        let mut c = with_core();
        c.targets[0].late_answer_window_ms = u64::MAX;
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("late_answer_window_ms"), "{err}");
        let mut c = with_core();
        c.targets[0].wire_grace_ms = Some(u64::MAX);
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("wire_grace_ms"), "{err}");
    }

    #[test]
    fn a_wire_grace_shorter_than_budget_plus_late_window_is_refused() {
        let mut c = with_core();
        c.server.budget_ms = 1_500;
        c.targets[0].late_answer_window_ms = 1_000;
        c.targets[0].wire_grace_ms = Some(2_499);
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("target.core.wire_grace_ms") && err.contains("1500 + 1000"),
            "{err}"
        );
        c.targets[0].wire_grace_ms = Some(2_500);
        c.validate("t").unwrap();
    }

    #[test]
    fn unknown_key_is_refused_with_its_name() {
        let err = Config::from_toml("x.toml", "[server]\nbudget = 5\n").unwrap_err();
        assert!(err.to_string().contains("budget"), "{err}");
    }

    #[test]
    fn default_connect_timeout_is_lowered_to_half_the_budget() {
        let mut c = with_core();
        c.apply(&Overrides {
            budget_ms: Some(600),
            ..Default::default()
        });
        c.validate("t").unwrap();
        let t = &c.targets[0];
        assert_eq!(
            t.effective_connect_timeout(Duration::from_millis(600)),
            Duration::from_millis(300)
        );
    }

    /// `--budget-ms` alone is a valid setting at any budget: the default
    /// bulkhead wait (100 ms) is lowered to half a budget of 100 ms or less
    /// (before, such a budget was refused; found by a black-box probe). An
    /// explicit wait is kept, and refused if it does not fit.
    #[test]
    fn default_queue_wait_is_lowered_to_half_the_budget() {
        for (budget_ms, wait_ms) in [(1, 0), (2, 1), (100, 50), (150, 75), (3000, 100)] {
            let mut c = with_core();
            c.apply(&Overrides {
                budget_ms: Some(budget_ms),
                ..Default::default()
            });
            c.validate("t")
                .unwrap_or_else(|e| panic!("budget {budget_ms}: {e}"));
            let wait = c.targets[0].effective_queue_wait(Duration::from_millis(budget_ms));
            assert_eq!(wait.as_millis(), wait_ms, "budget {budget_ms}");
        }
        let mut c = with_core();
        c.apply(&Overrides {
            budget_ms: Some(100),
            ..Default::default()
        });
        c.targets[0].queue_wait_ms = Some(100);
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("queue_wait_ms") && err.contains("100 ms does not fit"),
            "{err}"
        );
    }

    /// Tries per telegram are capped: with a backoff of 0, an inquiry
    /// allowed 100,000 tries made some 1,600 GETs in a 2 s budget against a
    /// failing core (found by a black-box probe).
    #[test]
    fn attempts_beyond_the_cap_are_refused_with_their_key() {
        for key in ["connect_attempts", "inquiry_attempts"] {
            let mut c = with_core();
            c.validate("t").unwrap();
            let t = &mut c.targets[0];
            match key {
                "connect_attempts" => t.connect_attempts = MAX_ATTEMPTS + 1,
                _ => t.inquiry_attempts = MAX_ATTEMPTS + 1,
            }
            let err = c.validate("t").unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains("101 is more than 100"),
                "{err}"
            );
        }
        let mut c = with_core();
        c.targets[0].inquiry_attempts = MAX_ATTEMPTS;
        c.validate("t").unwrap();
    }

    #[test]
    fn explicit_connect_timeout_over_the_budget_is_refused() {
        let mut c = with_core();
        c.apply(&Overrides {
            budget_ms: Some(400),
            connect_timeout_ms: Some(500),
            ..Default::default()
        });
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("connect_timeout_ms"), "{err}");
    }

    #[test]
    fn route_to_unknown_target_is_refused() {
        let mut c = Config::from_toml(
            "r.toml",
            "[[route]]\ntx_code = \"TRF001\"\noperation = \"transfer\"\ntarget = \"nowhere\"\n",
        )
        .unwrap();
        c.apply(&Overrides {
            core_url: Some("http://127.0.0.1:1".into()),
            ..Default::default()
        });
        let err = c.validate("r.toml").unwrap_err().to_string();
        assert!(err.contains("unknown target \"nowhere\""), "{err}");
    }

    #[test]
    fn zero_retention_is_refused() {
        let mut c = with_core();
        c.journal.retention_hours = 0;
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("retention_hours"), "{err}");
        let mut c = with_core();
        c.journal.retention_ms = Some(0);
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("retention_ms"), "{err}");
        let mut c = with_core();
        c.journal.prune_interval_ms = 0;
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("prune_interval_ms"), "{err}");
    }

    #[test]
    fn a_fence_at_or_after_the_others_deadline_is_refused() {
        assert!(with_core().validate("t").is_ok());
        let mut c = with_core();
        c.journal.liveness_fence_ms = 3_000;
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("journal.liveness_dead_after_ms"), "{err}");
        let mut c = with_core();
        c.journal.liveness_fence_ms = 400;
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("journal.liveness_fence_ms"), "{err}");
        let mut c = with_core();
        c.journal.liveness_renew_ms = 0;
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("journal.liveness_renew_ms"), "{err}");
        let c = Config::from_toml(
            "l.toml",
            "[journal]\nliveness_renew_ms = 100\nliveness_fence_ms = 500\nliveness_dead_after_ms = 1000\n",
        )
        .unwrap();
        assert_eq!(
            c.journal.liveness(),
            LivenessSettings {
                renew_ms: 100,
                fence_ms: 500,
                dead_after_ms: 1_000
            }
        );
    }

    #[test]
    fn retention_ms_overrides_the_hours() {
        let mut j = JournalConfig::default();
        assert_eq!(j.retention(), Duration::from_secs(72 * 3600));
        j.retention_ms = Some(4_000);
        assert_eq!(j.retention(), Duration::from_millis(4_000));
    }

    #[test]
    fn settings_that_could_not_take_effect_are_refused() {
        let err = |c: &Config| c.validate("t").unwrap_err().to_string();
        // A handshake timeout with no TLS listener.
        let mut c = with_core();
        c.server.tls_handshake_timeout_ms = 2_000;
        let e = err(&c);
        assert!(
            e.contains("server.tls_handshake_timeout_ms")
                && e.contains("without server.tls_listen"),
            "{e}"
        );
        c.server.tls_listen = Some("127.0.0.1:0".into());
        c.server.tls_cert_file = Some("/c.pem".into());
        c.server.tls_key_file = Some("/c.key".into());
        c.validate("t").unwrap();
        // `optional` client certificates with no CA to ask for them.
        c.server.tls_client_auth = ClientAuth::Optional;
        let e = err(&c);
        assert!(
            e.contains("server.tls_client_auth") && e.contains("tls_client_ca_file"),
            "{e}"
        );
        // An admin token with no admin listener in the file is kept: the
        // listener may come from `--admin-listen`, and `journal reconcile
        // --config` reads the token from the same file (found by a review).
        let mut c = with_core();
        c.server.admin_token_file = Some("/token".into());
        c.validate("t").unwrap();
    }

    #[test]
    fn tls_keys_and_cert_names_must_fit_together() {
        let err = |c: &Config| c.validate("t").unwrap_err().to_string();
        let mut c = with_core();
        c.server.tls_listen = Some("127.0.0.1:0".into());
        assert!(err(&c).contains("server.tls_cert_file"), "{}", err(&c));
        c.server.tls_cert_file = Some("/c.pem".into());
        c.server.tls_key_file = Some("/c.key".into());
        c.validate("t").unwrap();
        c.server.tls_handshake_timeout_ms = 0;
        assert!(err(&c).contains("server.tls_handshake_timeout_ms"));
        c.server.tls_handshake_timeout_ms = 5_000;
        // A CA with no channel to map certificates to.
        c.server.tls_client_ca_file = Some("/ca.pem".into());
        assert!(
            err(&c).contains("no [[channel]] has cert_names"),
            "{}",
            err(&c)
        );
        let channel = |id: &str, names: &[&str]| ChannelConfig {
            id: id.into(),
            allow_from: vec![],
            tx_codes: vec![],
            cert_names: names.iter().map(|n| n.to_string()).collect(),
        };
        c.channels = vec![channel("IBANK", &["ibank.example"])];
        c.validate("t").unwrap();
        // One name, two channels (names compare without case).
        c.channels.push(channel("CORP", &["IBANK.example"]));
        assert!(err(&c).contains("channel.CORP.cert_names"), "{}", err(&c));
        c.channels.pop();
        // cert_names without a CA: nobody could call as that channel.
        c.server.tls_client_ca_file = None;
        assert!(
            err(&c).contains("needs server.tls_client_ca_file"),
            "{}",
            err(&c)
        );
        // TLS files without a TLS listener.
        let mut c = with_core();
        c.server.tls_key_file = Some("/c.key".into());
        assert!(err(&c).contains("server.tls_key_file"), "{}", err(&c));
    }

    #[test]
    fn https_targets_and_their_tls_keys_are_checked() {
        let mut c = Config::default();
        c.apply(&Overrides {
            core_url: Some("https://core.example:8443".into()),
            ..Default::default()
        });
        c.validate("t").unwrap();
        c.targets[0].client_cert_file = Some("/x/hub.pem".into());
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("target.core.client_key_file"), "{err}");
        c.targets[0].client_cert_file = None;
        c.targets[0].client_key_file = Some("/x/hub.key".into());
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("target.core.client_cert_file"), "{err}");

        let mut c = with_core();
        c.targets[0].ca_file = Some("/x/ca.pem".into());
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("target.core.ca_file") && err.contains("no URL of the target is https://"),
            "{err}"
        );
        c.targets[0].urls = vec!["ftp://core".into()];
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("not an http:// or https:// URL"), "{err}");
    }

    /// Every count and duration has an upper bound, named with its key
    /// (found by a black-box probe: a max_connections of 2^62 passed check
    /// and made the listener's task panic after the ready line; a
    /// max_concurrency of 2^62 panicked at start; a max_batch of 2^40 asked
    /// for 16 TB; a resend cooldown of 2^63 ms wrapped to none).
    #[test]
    fn counts_and_durations_past_their_bounds_are_refused_with_their_key() {
        type Set = fn(&mut Config);
        let cases: [(&str, Set); 8] = [
            ("server.max_telegram_len", |c| {
                c.server.prefix = PrefixMode::Binary;
                c.server.max_telegram_len = usize::MAX
            }),
            ("server.max_connections", |c| {
                c.server.max_connections = 1 << 62
            }),
            ("server.max_in_flight_per_connection", |c| {
                c.server.max_in_flight_per_connection = usize::MAX
            }),
            ("target.core.max_concurrency", |c| {
                c.targets[0].max_concurrency = 1 << 62
            }),
            ("journal.max_batch", |c| c.journal.max_batch = 1 << 40),
            ("journal.resend_cooldown_ms", |c| {
                c.journal.resend_cooldown_ms = 1 << 63
            }),
            ("server.idle_timeout_ms", |c| {
                c.server.idle_timeout_ms = u64::MAX
            }),
            ("target.core.backoff_ms", |c| {
                c.targets[0].backoff_ms = MAX_DURATION_MS + 1
            }),
        ];
        for (key, set) in cases {
            let mut c = with_core();
            set(&mut c);
            let err = c.validate("t").unwrap_err().to_string();
            assert!(
                err.contains(key) && err.contains("out of range"),
                "{key}: {err}"
            );
        }
        let mut c = with_core();
        c.journal.resend_cooldown_ms = MAX_DURATION_MS;
        c.server.max_connections = MAX_CONNECTIONS as usize;
        c.validate("t").unwrap();
    }

    /// A channel id given twice is refused: the last would win, and the
    /// first's restrictions would go (found by a black-box probe).
    #[test]
    fn a_channel_id_given_twice_is_refused() {
        let mut c = with_core();
        let channel = |allow: &[&str]| ChannelConfig {
            id: "IBANK".into(),
            allow_from: allow.iter().map(|a| a.to_string()).collect(),
            tx_codes: vec![],
            cert_names: vec![],
        };
        c.channels = vec![channel(&["10.0.0.0/8"]), channel(&[])];
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("channel.IBANK") && err.contains("given twice"),
            "{err}"
        );
    }

    /// An auth table takes one key, and its value must be sendable as a
    /// header; the value is never shown (found by a black-box probe: two
    /// keys were taken, and a token with a newline made every transfer E902
    /// with no ERROR).
    #[test]
    fn an_auth_table_takes_one_key_and_a_sendable_value() {
        let auth = |bearer: Option<&str>, header_env: Option<&str>| AuthConfig {
            bearer: bearer.map(String::from),
            bearer_env: None,
            header_env: header_env.map(String::from),
        };
        let mut c = with_core();
        c.targets[0].auth = Some(auth(Some("abc"), Some("PATH")));
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("target.core.auth") && err.contains("exactly one"),
            "{err}"
        );
        c.targets[0].auth = Some(auth(Some("s3cret\nX-Evil: 1"), None));
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("cannot be an HTTP header") && !err.contains("s3cret"),
            "{err}"
        );
        c.targets[0].auth = Some(auth(Some("abc"), None));
        c.validate("t").unwrap();
        // A token pasted where the variable's name goes is not echoed as
        // "environment variable <token> is not set" (found by a black-box
        // probe).
        for pasted in ["eyJhbGci.S3CRETPAYLOAD.sig", "Basic S3CRETdXNl", "9TOKEN"] {
            c.targets[0].auth = Some(auth(None, Some(pasted)));
            let err = c.validate("t").unwrap_err().to_string();
            assert!(
                err.contains("header_env is not an environment variable's name")
                    && !err.contains("S3CRET")
                    && !err.contains("9TOKEN"),
                "{err}"
            );
            c.server.admin_listen = Some("127.0.0.1:0".into());
            c.server.admin_token_env = Some(pasted.into());
            let (key, err) = c.server.admin_token().unwrap_err();
            assert!(
                key == "server.admin_token_env"
                    && !err.contains("S3CRET")
                    && !err.contains("9TOKEN"),
                "{err}"
            );
            c.server.admin_token_env = None;
        }
        // Nor one that looks like a name (a token of letters, digits, `_`).
        c.targets[0].auth = Some(AuthConfig {
            bearer: None,
            bearer_env: Some("ghp_S3CRET_NEVER_SET_1".into()),
            header_env: None,
        });
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("the environment variable bearer_env names is not set")
                && !err.contains("S3CRET"),
            "{err}"
        );
        c.server.admin_token_env = Some("ghp_S3CRET_NEVER_SET_1".into());
        let (_, err) = c.server.admin_token().unwrap_err();
        assert!(
            err.contains("is not set") && !err.contains("S3CRET"),
            "{err}"
        );
        c.server.admin_token_env = None;
    }

    /// A TOML error on a line that may hold a credential names the line and
    /// does not quote it (the parser's message quotes the line it fails on;
    /// found by a review); other errors keep the quote.
    #[test]
    fn a_parse_error_on_a_credential_s_line_does_not_quote_it() {
        let text = "[[target]]\nname = \"core\"\nurls = [\"http://c\"]\nauth = { bearer = \"s3cr\\qet\" }\n";
        let err = Config::from_toml("t", text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("line 4") && err.contains("not shown") && !err.contains("s3cr"),
            "{err}"
        );
        let err = Config::from_toml("t", "[server]\nbudget_ms = \"x\"\n")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("budget_ms = \"x\""), "quoted: {err}");
        // An error on a later line of a multi-line string: the key that
        // names it is lines above (found by a black-box probe).
        for text in [
            "[[target]]\nname = \"core\"\nurls = [\"http://c\"]\nauth = { bearer = \"\"\"S3CRET1\nS3CRET2-\\q\"\"\" }\n",
            "[[target]]\nname = \"core\"\nurls = [\"http://c\"]\n[target.auth]\nbearer = \"\"\"\nS3CRET-ONLY\n",
            "[[target]]\nname = \"core\"\nurls = [\"http://c\"]\n[target.auth]\nbearer = '''\nS3CRET-ONLY\n",
            // A `"""` in a comment does not end the string (found by a review).
            "[[target]]\nname = \"core\"\nurls = [\"http://c\"]\n# \"\"\" quotes\n[target.auth]\nbearer = \"\"\"\nS3CRET\\q\n\"\"\"\n",
            // A `*_env` line, a URL with a password, a value of the wrong type.
            "[[target]]\nname = \"core\"\nurls = [\"http://c\"]\n[target.auth]\nheader_env = \"Basic S3CRET\\q\"\n",
            "[journal]\npath = \"postgres://u:S3CRET@h/db\n",
            "[[target]]\nname = \"core\"\nurls = [\"http://c\"]\nauth = \"Bearer S3CRETtok\"\n",
        ] {
            let err = Config::from_toml("t", text)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(
                err.contains("not shown") && !err.contains("S3CRET"),
                "{text:?}: {err}"
            );
        }
    }

    #[test]
    fn a_base_url_the_api_paths_cannot_follow_is_refused() {
        for (url, why) in [
            ("http://core:8080/api?x=1", "query or a fragment"),
            ("http://core:8080/api#part", "query or a fragment"),
            ("http://core/?", "query or a fragment"),
            ("http://alice:pw@core:8080", "carries credentials"),
            ("http://alice@core", "carries credentials"),
            ("http://127.0.0.1:99999", "a port is 1-65535"),
            ("http://127.0.0.1:0", "a port is 1-65535"),
            ("http://core:http", "a port is 1-65535"),
            ("http://core/a b", "not a valid URL"),
            ("http://:80", "names no host"),
            ("https://", "not a valid URL"),
        ] {
            let mut c = with_core();
            c.targets[0].urls = vec![url.into()];
            let err = c.validate("t").unwrap_err().to_string();
            assert!(
                err.contains("target.core.urls") && err.contains(why),
                "{url}: {err}"
            );
            // The refusal shows no password.
            assert!(!err.contains(":pw@"), "{err}");
        }
        for url in [
            "http://core:8080",
            "https://core.bank.internal:8443/core/",
            "http://[::1]:8080/x",
            "http://[::1]",
            "http://core:/x",
        ] {
            let mut c = with_core();
            c.targets[0].urls = vec![url.into()];
            c.validate("t").unwrap_or_else(|e| panic!("{url}: {e}"));
        }
    }

    #[test]
    fn resolve_refresh_out_of_range_is_refused_with_its_key() {
        for ms in [0, 99, 86_400_001] {
            let mut c = with_core();
            c.targets[0].resolve_refresh_ms = ms;
            let err = c.validate("t").unwrap_err().to_string();
            assert!(
                err.contains("target.core.resolve_refresh_ms"),
                "{ms}: {err}"
            );
        }
        let mut c = with_core();
        c.targets[0].resolve_refresh_ms = 100;
        c.validate("t").unwrap();
    }

    /// An empty journal path is refused at the check, under its key (before,
    /// `check` passed it and `serve` blamed "another relayhub" with its own
    /// pid).
    #[test]
    fn an_empty_journal_path_is_refused() {
        let mut c = with_core();
        c.journal.path = " ".into();
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("`journal.path`") && err.contains("is empty"),
            "{err}"
        );
    }

    /// Two listeners on one address are refused, naming both keys; port 0
    /// (a port each) is not one address.
    #[test]
    fn two_listeners_on_one_address_are_refused() {
        let mut c = with_core();
        c.server.listen = "127.0.0.1:9100".into();
        c.server.tls_listen = Some("127.0.0.1:9100".into());
        let err = c.validate("t").unwrap_err().to_string();
        assert!(
            err.contains("`server.tls_listen`") && err.contains("the port of server.listen"),
            "{err}"
        );
        c.server.listen = "0.0.0.0:9100".into();
        c.server.tls_listen = Some("127.0.0.1:9100".into());
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("(0.0.0.0:9100)"), "{err}");
        // IPv4's wildcard leaves IPv6's loopback its port.
        c.server.tls_listen = None;
        c.server.admin_listen = Some("[::1]:9100".into());
        c.validate("t").unwrap();
        c.server.admin_listen = None;
        // Another port passes this check (and meets the next: no certificate).
        c.server.tls_listen = Some("127.0.0.1:9443".into());
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("`server.tls_cert_file`"), "{err}");
        c.server.tls_listen = None;
        c.server.listen = "127.0.0.1:9100".into();
        c.server.tls_listen = None;
        c.server.admin_listen = Some("127.0.0.1:9100".into());
        let err = c.validate("t").unwrap_err().to_string();
        assert!(err.contains("`server.admin_listen`"), "{err}");
        c.server.listen = "127.0.0.1:0".into();
        c.server.admin_listen = Some("127.0.0.1:0".into());
        c.validate("t").unwrap();
    }

    /// A zero timeout or limit is refused under its own key (before, a zero
    /// idle or read timeout passed, and the hub then closed connections
    /// without an answer; a zero in-flight limit was named as
    /// `server.max_connections`).
    #[test]
    fn zero_timeouts_and_limits_are_refused_with_their_key() {
        type Set = fn(&mut ServerConfig);
        let cases: [(&str, Set); 5] = [
            ("server.write_timeout_ms", |s| s.write_timeout_ms = 0),
            ("server.idle_timeout_ms", |s| s.idle_timeout_ms = 0),
            ("server.read_timeout_ms", |s| s.read_timeout_ms = 0),
            ("server.max_connections", |s| s.max_connections = 0),
            ("server.max_in_flight_per_connection", |s| {
                s.max_in_flight_per_connection = 0
            }),
        ];
        for (key, set) in cases {
            let mut c = with_core();
            set(&mut c.server);
            let err = c.validate("t").unwrap_err().to_string();
            assert!(err.contains(&format!("`{key}`")), "{key}: {err}");
        }
    }

    #[test]
    fn cidr_matching() {
        let c = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(!c.contains("10.2.0.1".parse().unwrap()));
        assert!(c.contains("::ffff:10.1.9.9".parse().unwrap()));
        let host = Cidr::parse("127.0.0.1").unwrap();
        assert!(host.contains("127.0.0.1".parse().unwrap()));
        assert!(!host.contains("127.0.0.2".parse().unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("8.8.8.8".parse().unwrap())
        );
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("nope").is_err());
    }
}
