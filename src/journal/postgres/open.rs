//! Opening the shared journal: the hub's own settings read out of the URL, the
//! bounded pool, a check of the server, and the schema migrated under an
//! advisory lock so that hubs starting together migrate once.

use std::str::FromStr;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

/// Schema migrations; migration `n` (1-based) brings the schema to version `n`.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_init.sql"),
    include_str!("../../../migrations/postgres/0002_attempt_url.sql"),
    include_str!("../../../migrations/postgres/0003_prune_index.sql"),
    include_str!("../../../migrations/postgres/0004_liveness.sql"),
    include_str!("../../../migrations/postgres/0005_attempt_grace.sql"),
];

/// The newest schema version this build reads and writes.
pub(super) const SCHEMA_VERSION: i32 = MIGRATIONS.len() as i32;

/// Key of the transaction-level advisory lock that serialises migrations
/// (ASCII "relayhub"). Other applications in the same database would have to
/// pick this very number to collide.
const MIGRATION_LOCK: i64 = 0x7265_6c61_7968_7562;

/// Default lease: covers the default budget (3 s) plus the default late-answer
/// window (30 s) with room to spare. See [`super::LEASE_MARGIN_MS`].
pub(super) const DEFAULT_LEASE_MS: u64 = 60_000;
/// Default pool size: connections to the database at most, per hub.
pub(super) const DEFAULT_POOL_SIZE: usize = 16;
/// Default bound on one journal call (pool wait, connect, statements), well
/// under the default 3 s budget: a database that is down or stuck leaves the
/// hub time to ask the core about the GUID before its answer (nothing sent).
pub(super) const DEFAULT_TIMEOUT_MS: u64 = 1_000;
/// Bound on opening (connect, checks, migrations) at start-up.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// What the hub takes from the `--journal` URL; the rest goes to the driver.
pub(super) struct Settings {
    pub pg: tokio_postgres::Config,
    /// This hub process's id, recorded as the owner of the rows it claims:
    /// the configured `hub_id` with a random suffix (`hub-a#1f2e3d`), or
    /// `HOST-PID-RANDOM`. Unique per process, so that a hub restarted under
    /// the same name is not taken for the one that claimed a row before it.
    pub hub_id: String,
    /// How long a claim keeps other hubs from treating its row as abandoned.
    pub lease_ms: u64,
    pub pool_size: usize,
    /// Bound on one journal call.
    pub timeout: Duration,
}

/// Parses a `postgres://` URL. The query keys `hub_id`, `lease_ms`,
/// `pool_size` and `timeout_ms` are the hub's; every other one (`sslmode`,
/// `application_name`, `options`, ...) is the driver's.
pub(super) fn settings(url: &str) -> Result<Settings, String> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, q),
        None => (url, ""),
    };
    let mut hub_id = None;
    let mut lease_ms = DEFAULT_LEASE_MS;
    let mut pool_size = DEFAULT_POOL_SIZE;
    let mut timeout_ms = DEFAULT_TIMEOUT_MS;
    let mut passed = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "hub_id" => {
                if value.is_empty()
                    || value.len() > 64
                    || !value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
                {
                    return Err(format!(
                        "hub_id {value:?}: 1 to 64 of letters, digits, `.`, `_`, `:`, `-`"
                    ));
                }
                hub_id = Some(value.to_string());
            }
            "lease_ms" => lease_ms = number(key, value, 1_000, 86_400_000)?,
            "pool_size" => pool_size = number(key, value, 1, 1_024)? as usize,
            "timeout_ms" => timeout_ms = number(key, value, 10, 60_000)?,
            _ => passed.push(pair),
        }
    }
    let driver_url = if passed.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", passed.join("&"))
    };
    let mut pg = tokio_postgres::Config::from_str(&driver_url)
        .map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
    let hub_id = match hub_id {
        Some(name) => format!("{name}#{:06x}", random24()),
        None => default_hub_id(),
    };
    let timeout = Duration::from_millis(timeout_ms);
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(timeout);
    }
    if pg.get_application_name().is_none() {
        pg.application_name(format!("relayhub {hub_id}"));
    }
    // The server ends a statement the hub has stopped waiting for, so that a
    // stuck statement does not hold a connection (and its locks) for long.
    let options = match pg.get_options() {
        Some(o) => format!("{o} -c statement_timeout={timeout_ms}"),
        None => format!("-c statement_timeout={timeout_ms}"),
    };
    pg.options(options);
    pg.keepalives(true);
    pg.keepalives_idle(Duration::from_secs(10));
    Ok(Settings {
        pg,
        hub_id,
        lease_ms,
        pool_size,
        timeout,
    })
}

fn number(key: &str, value: &str, min: u64, max: u64) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{key}={value:?}: a whole number from {min} to {max}"
        )),
    }
}

/// `HOSTNAME-PID-RANDOM`: unique per process, readable in `journal show`.
fn default_hub_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
                .take(40)
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "hub".into());
    format!("{host}-{}-{:06x}", std::process::id(), random24())
}

/// 24 random bits: a name, not a secret.
fn random24() -> u64 {
    crate::random::random_u64() & 0xff_ffff
}

/// What opening does to the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Schema {
    /// Created or migrated to [`SCHEMA_VERSION`] (a hub, reconcile).
    Migrate,
    /// Only read: refused unless it is at [`SCHEMA_VERSION`] (tools that
    /// look, so that a look from a newer build does not migrate a journal
    /// that older hubs still share).
    Check,
}

/// Builds the pool, checks the server and migrates (or checks) the schema.
pub(super) async fn open(s: &Settings, schema: Schema) -> Result<Pool, String> {
    let manager = Manager::from_config(
        s.pg.clone(),
        NoTls,
        ManagerConfig {
            // `is_closed` only: a connection the server dropped is discarded;
            // one that breaks during a call fails that call, bounded anyway.
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(s.pool_size)
        .wait_timeout(Some(s.timeout))
        .create_timeout(Some(s.timeout))
        .recycle_timeout(Some(s.timeout))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(|e| format!("cannot build the connection pool: {e}"))?;
    match tokio::time::timeout(OPEN_TIMEOUT, prepare(&pool, schema)).await {
        Ok(r) => r?,
        Err(_) => {
            return Err(format!(
                "the database did not finish the start-up checks within {OPEN_TIMEOUT:?}"
            ));
        }
    }
    Ok(pool)
}

async fn prepare(pool: &Pool, schema: Schema) -> Result<(), String> {
    let mut client = pool
        .get()
        .await
        .map_err(|e| format!("cannot connect: {}", super::pool_error(&e)))?;
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery(), current_setting('synchronous_commit')",
            &[],
        )
        .await
        .map_err(|e| format!("cannot query the server: {}", super::db_error(&e)))?;
    let (standby, sync): (bool, String) = (row.get(0), row.get(1));
    if standby {
        return Err("the server is a read-only standby; point --journal at the primary".into());
    }
    if sync == "off" {
        // A claim acknowledged but lost in a crash would let a repeat post twice.
        return Err(
            "synchronous_commit is off: an acknowledged claim could be lost in a crash; \
             set it to on (or stronger) for the journal's database or role"
                .into(),
        );
    }
    match schema {
        Schema::Migrate => migrate(&mut client).await,
        Schema::Check => check_version(&client).await,
    }
}

/// Refuses a schema other than [`SCHEMA_VERSION`], changing nothing.
async fn check_version(client: &deadpool_postgres::Client) -> Result<(), String> {
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('relayhub_schema_version') IS NOT NULL",
            &[],
        )
        .await
        .map_err(|e| format!("cannot read the schema version: {}", super::db_error(&e)))?
        .get(0);
    if !exists {
        return Err(
            "no relayhub journal in this database (a hub creates it at its first start; \
             --create makes it now)"
                .into(),
        );
    }
    let version = schema_version(client).await?;
    match version.cmp(&SCHEMA_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Less => Err(format!(
            "journal schema version {version} is older than this build's ({SCHEMA_VERSION}); \
             this tool only looks and does not migrate it: use the build the hubs run, or give \
             --create to migrate it now as a hub of this build would at its start (hubs of an \
             older build that share it are then refused when they restart)"
        )),
        std::cmp::Ordering::Greater => Err(newer_schema(version)),
    }
}

/// The schema version the journal's table records (0: none yet).
async fn schema_version(c: &impl deadpool_postgres::GenericClient) -> Result<i32, String> {
    let row = c
        .query_one(
            "SELECT coalesce(max(version), 0) FROM relayhub_schema_version",
            &[],
        )
        .await
        .map_err(|e| format!("cannot read the schema version: {}", super::db_error(&e)))?;
    Ok(row.get(0))
}

/// Why a journal of schema `version`, newer than this build, is refused.
fn newer_schema(version: i32) -> String {
    format!(
        "journal schema version {version} is newer than this build knows ({SCHEMA_VERSION}); \
         run a newer relayhub"
    )
}

/// Brings the schema to [`SCHEMA_VERSION`] inside one transaction holding an
/// advisory lock: hubs starting together wait for each other, and a failed
/// migration leaves nothing behind.
async fn migrate(client: &mut deadpool_postgres::Client) -> Result<(), String> {
    let e = |what: &str| {
        let what = what.to_string();
        move |err: tokio_postgres::Error| format!("{what}: {}", super::db_error(&err))
    };
    let tx = client
        .transaction()
        .await
        .map_err(e("cannot start a transaction"))?;
    // Migrations may take longer than one journal call is allowed to.
    tx.batch_execute("SET LOCAL statement_timeout = 0")
        .await
        .map_err(e("cannot lift the statement timeout"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(e("cannot take the migration lock"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS relayhub_schema_version (\
             version    integer     NOT NULL PRIMARY KEY, \
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await
    .map_err(e("cannot create relayhub_schema_version"))?;
    let version = schema_version(&tx).await?;
    if version > SCHEMA_VERSION {
        return Err(newer_schema(version));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let to = i as i32 + 1;
        tx.batch_execute(sql)
            .await
            .map_err(e(&format!("migration to schema version {to} failed")))?;
        tx.execute(
            "INSERT INTO relayhub_schema_version (version) VALUES ($1)",
            &[&to],
        )
        .await
        .map_err(e(&format!("cannot record schema version {to}")))?;
    }
    tx.commit().await.map_err(e("cannot commit the schema"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_keys_are_taken_and_the_rest_passed_on() {
        let s = settings(
            "postgres://u:p@127.0.0.1:5433/db?hub_id=hub-a&lease_ms=5000&application_name=x&pool_size=4&timeout_ms=250",
        )
        .unwrap();
        assert!(s.hub_id.starts_with("hub-a#"), "{}", s.hub_id);
        assert_eq!(s.hub_id.len(), "hub-a#".len() + 6);
        assert_eq!(s.lease_ms, 5000);
        assert_eq!(s.pool_size, 4);
        assert_eq!(s.timeout, Duration::from_millis(250));
        assert_eq!(s.pg.get_application_name(), Some("x"));
        assert_eq!(s.pg.get_dbname(), Some("db"));
        assert_eq!(
            s.pg.get_connect_timeout(),
            Some(&Duration::from_millis(250))
        );
        assert_eq!(s.pg.get_options(), Some("-c statement_timeout=250"));
    }

    #[test]
    fn defaults_when_the_url_says_nothing() {
        let s = settings("postgresql://localhost/relayhub").unwrap();
        assert_eq!(s.lease_ms, DEFAULT_LEASE_MS);
        assert_eq!(s.pool_size, DEFAULT_POOL_SIZE);
        assert_eq!(s.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
        assert!(
            s.hub_id.contains(&std::process::id().to_string()),
            "{}",
            s.hub_id
        );
        assert_ne!(
            s.hub_id,
            settings("postgresql://localhost/relayhub").unwrap().hub_id,
            "two opens in one process are two ids"
        );
    }

    #[test]
    fn bad_values_are_refused() {
        for url in [
            "postgres://h/db?lease_ms=10",
            "postgres://h/db?pool_size=0",
            "postgres://h/db?timeout_ms=x",
            "postgres://h/db?hub_id=a%20b",
            "postgres://h/db?hub_id=",
            "postgres://h/db?no_such_option=1",
        ] {
            assert!(settings(url).is_err(), "{url} accepted");
        }
    }
}
