//! Opening a journal file: refuse anything that is not (or cannot become) a
//! healthy journal of a schema this build knows, before the hub takes traffic.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, ffi};

/// Marks the file as a relayhub journal (`PRAGMA application_id`), so another
/// program's database that happens to carry a `user_version` is not mistaken
/// for one. ASCII "rhjl".
pub(super) const APPLICATION_ID: i32 = 0x7268_6a6c;

/// Schema migrations; migration `n` (1-based) brings `user_version` to `n`.
pub(super) const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/sqlite/0001_init.sql"),
    include_str!("../../../migrations/sqlite/0002_attempt_url.sql"),
    include_str!("../../../migrations/sqlite/0003_prune_index.sql"),
    include_str!("../../../migrations/sqlite/0004_state_checks.sql"),
    include_str!("../../../migrations/sqlite/0005_events_by_row_id.sql"),
    include_str!("../../../migrations/sqlite/0006_attempt_grace.sql"),
];

/// The newest schema version this build reads and writes.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// The page size of a journal this build creates (SQLite's default: 4096).
///
/// A transfer's claim and outcome each change a few rows and index entries
/// of some 250 bytes, and every commit writes each page it changed whole into
/// the WAL. At 2 KiB a transfer dirties about a third fewer bytes for the
/// file system to write and fsync, and the writer checksums and copies half
/// as much per page: about 4% fewer instructions per telegram
/// (docs/performance.md). Smaller still (1 KiB) saves little more and leaves
/// three rows to a page. A file's page size is fixed once it holds a page,
/// so an existing journal keeps its own.
pub(super) const PAGE_SIZE: i64 = 2048;

/// The writer's own automatic checkpoint, kept only as a backstop should the
/// checkpoint thread (`checkpoint`) fall behind or fail: 16,384 pages (32 MiB
/// at the 2 KiB pages of a journal this build creates, 64 MiB at SQLite's
/// default 4 KiB).
pub(super) const BACKSTOP_PAGES: i64 = 16_384;

/// Prepared statements kept per connection.
const STATEMENTS: usize = 64;

/// How long a statement waits for a lock held by another connection (a
/// backup tool, or the previous hub of this process still closing) before
/// failing.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Opens, checks and migrates the journal at `path`, creating it if absent.
/// The error is the reason, in words meant for the operator.
pub(super) fn open(path: &Path) -> Result<Connection, String> {
    check_path(path)?;
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(file_name(path), flags)
        .map_err(|e| format!("cannot open: {e}"))?;
    // First: a start refused below (a journal of a newer schema, say) must
    // not have SQLite delete the -wal as this connection closes.
    keep_wal_file(&conn)?;
    // Every statement the journal runs stays prepared (rusqlite keeps 16 by
    // default; the writer alone runs more, and an evicted one is parsed again).
    conn.set_prepared_statement_cache_capacity(STATEMENTS);
    // SQLite silently falls back to read-only when it may not write the file.
    if conn.is_readonly("main").unwrap_or(true) {
        return Err("the file is read-only; the journal must be writable".into());
    }
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| format!("cannot set busy timeout: {e}"))?;
    check_health(&conn)?;
    // Before anything is written: another program's database is refused
    // as it was found, not switched to WAL first.
    identify(&conn)?;

    // Before the first page is written (switching to WAL writes the header);
    // a no-op on a file that already has pages.
    conn.pragma_update(None, "page_size", PAGE_SIZE)
        .map_err(|e| format!("cannot set page_size: {e}"))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))
        .map_err(|e| format!("cannot switch to WAL: {e}"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("cannot switch to WAL (journal_mode stays {mode})"));
    }
    // FULL while the journal is opened and migrated; the writer then
    // switches to NORMAL and fsyncs the WAL itself (see `syncer`).
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(|e| format!("cannot set synchronous=FULL: {e}"))?;
    // Checkpoints run on a thread of their own (`checkpoint`), which also
    // replaces this automatic one with a backstop that sees its errors;
    // until then (the migration) SQLite's own bounds the WAL.
    conn.pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)
        .map_err(|e| format!("cannot set wal_autocheckpoint: {e}"))?;

    migrate(&conn)?;
    Ok(conn)
}

/// The journal's `-wal` file: beside the file its name leads to, since
/// SQLite follows links to name it.
pub(crate) fn wal_of(path: &Path) -> PathBuf {
    let mut name = std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .into_os_string();
    name.push("-wal");
    PathBuf::from(name)
}

/// Whether the journal's `-wal` file is there with at least its header (32
/// bytes, beginning with the WAL's magic number). A running hub's `-wal`
/// always has one (its start writes a frame, and a reset keeps
/// `journal_size_limit` bytes); an empty one was made by a reader that found
/// none (`journal list`, `sqlite3 -readonly`), so it stands for a lost one
/// (found by a probe), as does a shorter one (a copy cut short) or one
/// without the magic (another file), which SQLite would take for empty
/// (found by a review). `None` when it is; else what is wrong with it, for the refusal's words:
/// "is gone", "is empty", or what it is instead (before, every case read
/// "is gone"; found by a black-box probe).
pub(crate) fn wal_problem(path: &Path) -> Option<String> {
    use std::io::Read;
    let wal = wal_of(path);
    let Ok(mut file) = std::fs::File::open(&wal) else {
        return Some("is gone".into());
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let mut header = [0u8; 32];
    match file.read_exact(&mut header) {
        _ if len == 0 => Some(
            "is empty (a reader such as `relayhub journal list` makes an empty one where it \
             finds none)"
                .into(),
        ),
        Err(_) => Some(format!(
            "is damaged: {len} bytes, shorter than a WAL's 32-byte header"
        )),
        Ok(()) if matches!(header[..4], [0x37, 0x7f, 0x06, 0x82 | 0x83]) => None,
        Ok(()) => Some(format!(
            "is damaged: {len} bytes that do not begin with a WAL's magic number"
        )),
    }
}

/// The `-wal` file stays when `conn` is the last connection to close
/// (SQLite would checkpoint and delete it). So a `-wal` found missing beside
/// a journal this build had open was lost, not deleted by SQLite, and its
/// next start can refuse it (`lock.rs`) rather than post again the GUIDs
/// only it held. Every writable connection sets it: either may close last.
#[allow(unsafe_code)]
pub(super) fn keep_wal_file(conn: &Connection) -> Result<(), String> {
    let mut on: std::ffi::c_int = 1;
    // SAFETY: `conn.handle()` is the open connection borrowed for this whole
    // call. PERSIST_WAL reads and writes one `int` through the pointer,
    // which lives for the call.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_PERSIST_WAL,
            (&raw mut on).cast(),
        )
    };
    if rc == ffi::SQLITE_OK {
        Ok(())
    } else {
        Err(format!(
            "cannot keep the -wal file at close (SQLite code {rc})"
        ))
    }
}

/// Whether the database file at `path` is there and holds nothing: no
/// schema, no version (what SQLite makes of a file of 0 bytes, or of a new
/// journal's header page without the WAL that held its tables). Read as a
/// reader would, the WAL included; nothing is written. A file of a few
/// pages at most is read (a journal whose tables are in the file is larger);
/// a file that cannot be read is left to the open that follows to report.
pub(crate) fn holds_nothing(path: &Path) -> bool {
    const AT_MOST: u64 = 8 * 1024;
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() < AT_MOST) {
        return false;
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let Ok(conn) = Connection::open_with_flags(file_name(path), flags) else {
        return false;
    };
    let _ = conn.busy_timeout(BUSY_TIMEOUT);
    let read = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0));
    matches!(
        (
            read("PRAGMA user_version"),
            read("SELECT count(*) FROM sqlite_schema")
        ),
        (Ok(0), Ok(0))
    )
}

/// Opens an existing journal for reading only (`relayhub journal list` and
/// `show`, which may run beside a live hub): nothing is created, migrated or
/// written. A journal of an older schema is read as it is; the hub migrates
/// it at its next start.
pub(super) fn open_read_only(path: &Path) -> Result<Connection, String> {
    check_path(path)?;
    if !path.exists() {
        return Err("no such file".into());
    }
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = Connection::open_with_flags(file_name(path), flags)
        .map_err(|e| format!("cannot open: {e}"))?;
    conn.set_prepared_statement_cache_capacity(STATEMENTS);
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| format!("cannot set busy timeout: {e}"))?;
    check_health(&conn)?;
    let version = identify(&conn)?;
    if version == 0 {
        return Err("an empty database, not a relayhub journal (yet)".into());
    }
    if version < SCHEMA_VERSION {
        // A tool only looks: it does not migrate, and this build reads the
        // newest schema's columns.
        return Err(format!(
            "journal schema version {version} is older than this build's ({SCHEMA_VERSION}); \
             `relayhub serve` on it (or `relayhub journal reconcile` with no hub running) migrates it"
        ));
    }
    check_tables(&conn)?;
    Ok(conn)
}

/// `path` as SQLite reads a plain file name: the SQLite this build bundles
/// reads a name that begins with `file:` as a URI (whatever the open flags
/// say), so a relative path such as `file:journal.db` is given as
/// `./file:journal.db`, the same file.
pub(super) fn file_name(path: &Path) -> Cow<'_, Path> {
    if path.as_os_str().as_encoded_bytes().starts_with(b"file:") {
        Cow::Owned(Path::new(".").join(path))
    } else {
        Cow::Borrowed(path)
    }
}

/// The parent directory exists and the path is not a directory itself.
pub(crate) fn check_path(path: &Path) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if dir.exists() && !dir.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        if !dir.is_dir() {
            return Err(format!("directory {} does not exist", dir.display()));
        }
    }
    if path.is_dir() {
        return Err("is a directory, not a database file".into());
    }
    Ok(())
}

/// `PRAGMA quick_check`: the first statement that reads the file, so random
/// bytes and corruption are refused here.
fn check_health(conn: &Connection) -> Result<(), String> {
    let check: Vec<String> = conn
        .prepare("PRAGMA quick_check")
        .and_then(|mut s| s.query_map([], |r| r.get::<_, String>(0))?.collect())
        .map_err(not_a_database)?;
    if check != ["ok"] {
        // Skip SQLite's "*** in database main ***" banner; keep the findings.
        let first: Vec<&str> = check
            .iter()
            .map(String::as_str)
            .filter(|l| !l.starts_with("***"))
            .take(3)
            .collect();
        return Err(format!(
            "database is corrupt (quick_check: {})",
            first.join("; ")
        ));
    }
    Ok(())
}

fn not_a_database(e: rusqlite::Error) -> String {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => {
            format!("not a SQLite database, or its header is corrupt ({e})")
        }
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => format!("database is corrupt ({e})"),
        _ => format!("cannot read: {e}"),
    }
}

/// Brings the schema to [`SCHEMA_VERSION`], inside one write transaction so
/// two hubs starting on one file cannot both migrate, and so that a file we
/// cannot write is refused now rather than at the first telegram.
fn migrate(conn: &Connection) -> Result<(), String> {
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(|e| format!("cannot take the write lock: {e}"))?;
    let result = migrate_locked(conn);
    let end = if result.is_ok() { "COMMIT" } else { "ROLLBACK" };
    let ended = conn.execute_batch(end);
    result?;
    ended.map_err(|e| format!("cannot commit the schema: {e}"))
}

fn migrate_locked(conn: &Connection) -> Result<(), String> {
    let version = identify(conn)?;
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let to = i + 1;
        conn.execute_batch(sql)
            .map_err(|e| format!("migration to schema version {to} failed: {e}"))?;
        conn.execute_batch(&format!(
            "PRAGMA user_version = {to}; PRAGMA application_id = {APPLICATION_ID};"
        ))
        .map_err(|e| format!("cannot record schema version {to}: {e}"))?;
    }
    // One frame in the -wal, which SQLite writes with its header: a -wal a
    // clean stop emptied holds one again before the lock file says that the
    // hub keeps it, so a crash before the first transfer does not leave an
    // empty -wal that the next start takes for a lost one.
    conn.execute_batch(&format!("PRAGMA user_version = {}", MIGRATIONS.len()))
        .map_err(|e| format!("cannot write to the journal: {e}"))?;
    check_tables(conn)
}

/// The schema version of a relayhub journal (0: an empty database, which may
/// become one); an error for another program's database or a newer schema.
fn identify(conn: &Connection) -> Result<i64, String> {
    let read = |pragma: &str| -> Result<i64, String> {
        conn.query_row(&format!("PRAGMA {pragma}"), [], |r| r.get(0))
            .map_err(|e| format!("cannot read {pragma}: {e}"))
    };
    let version = read("user_version")?;
    let app_id = read("application_id")?;
    let objects: i64 = conn
        .query_row("SELECT count(*) FROM sqlite_schema", [], |r| r.get(0))
        .map_err(|e| format!("cannot read the schema: {e}"))?;

    if version == 0 && app_id == 0 {
        if objects > 0 {
            return Err(format!(
                "not a relayhub journal: the database already holds another schema ({objects} tables/indexes)"
            ));
        }
    } else if app_id != i64::from(APPLICATION_ID) {
        return Err(format!(
            "not a relayhub journal (application_id {app_id:#x}, user_version {version})"
        ));
    }
    if version > SCHEMA_VERSION {
        return Err(format!(
            "journal schema version {version} is newer than this build knows ({SCHEMA_VERSION}); \
             run a newer relayhub or point --journal at another file"
        ));
    }
    if version < 0 {
        return Err(format!("invalid journal schema version {version}"));
    }
    Ok(version)
}

fn check_tables(conn: &Connection) -> Result<(), String> {
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name IN ('journal', 'journal_events')",
            [],
            |r| r.get(0),
        )
        .map_err(|e| format!("cannot read the schema: {e}"))?;
    if tables != 2 {
        return Err(
            "journal tables are missing although the schema version says they exist".into(),
        );
    }
    Ok(())
}
