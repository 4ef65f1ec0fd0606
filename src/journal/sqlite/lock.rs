//! One owner per journal file: an exclusive lock on the sidecar `<file>.lock`.
//!
//! The process that owns a journal (a hub, or `relayhub journal reconcile`
//! with no hub running) treats every `sending` row as its own: at start-up it
//! takes them for rows a crash left behind and marks them unknown, and it
//! believes an inquiry's "never received" for them. A second owner beside a
//! live hub would do both to calls that are still running there, and the
//! channel's resend would be posted twice. So an owner holds this lock for
//! as long as it runs, and a second one is refused.
//!
//! # Why a sidecar file and not the database file
//!
//! SQLite locks the database file with POSIX record locks, and POSIX drops
//! every record lock a process holds on a file when the process closes *any*
//! descriptor of that file. A lock taken on a descriptor of our own would be
//! a second descriptor, and closing it could silently drop SQLite's locks. On
//! Windows the lock would be mandatory and block SQLite's own reads. The
//! sidecar has neither problem; the kernel releases it when the process dies,
//! however it dies, so a crash never leaves a stale lock behind.
//!
//! The file holds the owner's pid and command for the message a refused
//! process prints; it is left in place (removing it would race a new owner).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct FileLock {
    _file: File,
    path: PathBuf,
    /// The lock under the name the journal was given, where that is another
    /// file (a link's): builds before the one name locked only that one.
    _given: Option<File>,
    /// An earlier owner had opened the journal (its lock file said so).
    opened_before: bool,
    /// And it was a build that keeps the journal's `-wal` file at close.
    wal_kept_before: bool,
}

/// Why the lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it: `holder` is what it wrote there.
    Held { lock: PathBuf, holder: String },
    /// The lock file cannot be created or locked.
    Io { lock: PathBuf, reason: String },
}

/// The line an owner adds to its lock file once the journal is open. A
/// journal found missing, or holding nothing, beside a lock file that says
/// so lost what it held (deleted, moved, truncated); beside one that does
/// not, it may be from a first start that failed before making the journal.
const OPENED: &str = "opened the journal";

/// The line an owner that keeps the journal's `-wal` file at close (SQLite
/// would delete it after the last connection's checkpoint) adds with
/// [`OPENED`]. Beside it, a journal without its `-wal` lost it (deleted,
/// moved, not copied with the file); an owner of a build before it may have
/// had SQLite delete it.
const KEEPS_WAL: &str = "keeps the journal's -wal file";

/// The line every lock file of this format carries. A lock file without
/// it, not empty, is from a build before the [`OPENED`] line, whose owners
/// all count as having opened the journal.
const FORMAT: &str = "relayhub journal lock 2";

/// Whether the text of a lock file found when taking it says an earlier
/// owner had opened the journal.
fn says_opened(text: &str) -> bool {
    let has = |line: &str| text.lines().any(|l| l == line);
    has(OPENED) || (!text.trim().is_empty() && !has(FORMAT))
}

/// The journal file, where it exists, has one name in its directory tree:
/// another hard link would have a lock file of its own, and a second hub on
/// it would own the same journal beside the first (links by a symbolic
/// link are followed to one name instead, [`one_name`]).
pub fn one_link(db: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(db) {
        Ok(meta) if meta.is_file() && meta.nlink() > 1 => Err(format!(
            "the file has {} hard links: a hub on another of its names would take a lock of \
             its own and own the same journal beside this one; keep one name (a symbolic \
             link is fine)",
            meta.nlink()
        )),
        _ => Ok(()),
    }
}

/// Whether a lock file beside the journal at `db` (under its one name, or
/// the name given) says its owner keeps the `-wal` file: read, not taken,
/// for a reader that looks at a journal beside a live or a stopped hub.
pub fn says_wal_kept(db: &Path) -> bool {
    let read = |lock: PathBuf| std::fs::read_to_string(lock).unwrap_or_default();
    let kept = |text: &str| text.lines().any(|l| l == KEEPS_WAL);
    // As [`FileLock::acquire`] reads them: the one name's, once current.
    let one = read(lock_path(&one_name(db)));
    kept(&one) || (!one.lines().any(|l| l == FORMAT) && kept(&read(lock_path(db))))
}

/// `<db>.lock`, beside the database file.
pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    PathBuf::from(name)
}

/// The journal's one name: symbolic links followed and the path made
/// absolute, as SQLite names the file it opens, so that every name of the
/// same file (a link, `./journal.db`, a path through `..`) has the same lock.
/// A link is followed even to a file not made yet (SQLite makes the link's
/// target), at most 40 deep as the kernel does; a file not made yet is named
/// by its directory's one name.
fn one_name(db: &Path) -> PathBuf {
    let mut path = db.to_path_buf();
    for _ in 0..40 {
        if let Ok(real) = std::fs::canonicalize(&path) {
            return real;
        }
        match std::fs::read_link(&path) {
            // Relative to the link's directory; an absolute target replaces it.
            Ok(target) => {
                path = path
                    .parent()
                    .map_or(target.clone(), |dir| dir.join(&target))
            }
            Err(_) => break,
        }
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    match (std::fs::canonicalize(dir), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => path,
    }
}

impl FileLock {
    /// Takes the lock of the journal at `db` without waiting: under its one
    /// name, and under the name given too where that is another file.
    pub fn acquire(db: &Path) -> Result<FileLock, LockError> {
        let path = lock_path(&one_name(db));
        let (file, opened) = take(&path)?;
        let given = lock_path(db);
        let (given, given_opened) = match one_name(&given) == path {
            true => (None, Found::default()),
            false => {
                let (file, opened) = take(&given)?;
                (Some(file), opened)
            }
        };
        Ok(FileLock {
            _file: file,
            path,
            _given: given,
            opened_before: opened.opened || given_opened.opened,
            // The one name's lock, once a build that keeps it wrote it,
            // is the latest word: the given name's may be from an older run
            // through that name (a link), before a clean stop under the one
            // name (found by a review: a start through the link was refused
            // for the -wal that stop had emptied).
            wal_kept_before: opened.wal_kept || (!opened.current && given_opened.wal_kept),
        })
    }

    /// Whether an earlier owner had opened the journal: then a journal
    /// missing or holding nothing lost what it held.
    pub fn opened_before(&self) -> bool {
        self.opened_before
    }

    /// Whether that earlier owner kept the journal's `-wal` file, so that
    /// the file must still be there.
    pub fn wal_kept_before(&self) -> bool {
        self.wal_kept_before
    }

    /// Notes in the lock file (both names) that the journal was opened, on
    /// disk before the journal takes a transfer.
    pub fn mark_opened(&mut self) -> std::io::Result<()> {
        for file in std::iter::once(&mut self._file).chain(self._given.as_mut()) {
            let mut text = String::new();
            file.rewind()?;
            file.read_to_string(&mut text)?;
            let missing: String = [OPENED, KEEPS_WAL]
                .into_iter()
                .filter(|line| !text.lines().any(|l| l == *line))
                .map(|line| format!("{line}\n"))
                .collect();
            if missing.is_empty() {
                continue;
            }
            file.seek(std::io::SeekFrom::End(0))?;
            file.write_all(missing.as_bytes())?;
            file.sync_all()?;
        }
        Ok(())
    }

    /// Notes in the lock file (both names) that the journal is whole in its
    /// file (a clean stop emptied the `-wal` into it): the next start takes
    /// a missing or empty `-wal` as no loss. The next owner's
    /// [`FileLock::mark_opened`] says that it keeps the `-wal` again.
    ///
    /// The line is the file's last (this build writes it last): cut off by
    /// one `ftruncate`, so that a crash leaves the file with or without it,
    /// never without the lines before it (an empty lock file no longer says
    /// the journal was opened; found by a review). Elsewhere, the rest is
    /// written over it and the file cut to the new length.
    pub fn mark_whole_in_file(&mut self) -> std::io::Result<()> {
        let last = format!("{KEEPS_WAL}\n");
        for file in std::iter::once(&mut self._file).chain(self._given.as_mut()) {
            let mut text = String::new();
            file.rewind()?;
            file.read_to_string(&mut text)?;
            if let Some(kept) = text.strip_suffix(&last) {
                file.set_len(kept.len() as u64)?;
            } else if text.lines().any(|l| l == KEEPS_WAL) {
                let kept: String = text
                    .lines()
                    .filter(|l| *l != KEEPS_WAL)
                    .map(|l| format!("{l}\n"))
                    .collect();
                file.rewind()?;
                file.write_all(kept.as_bytes())?;
                file.set_len(kept.len() as u64)?;
            } else {
                continue;
            }
            file.sync_all()?;
        }
        Ok(())
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What a lock file said of its earlier owners when it was taken.
#[derive(Debug, Default, Clone, Copy)]
struct Found {
    opened: bool,
    wal_kept: bool,
    /// Written by a build of this lock format, which keeps it up to date.
    current: bool,
}

/// Takes the lock file at `path`, and writes this process's name in it;
/// with what it said of earlier owners (the journal opened, its -wal kept),
/// which it keeps.
fn take(path: &Path) -> Result<(File, Found), LockError> {
    let io = |e: std::io::Error| LockError::Io {
        lock: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io)?;
    // `File::try_lock`: flock(2) on Unix, LockFileEx on Windows (Rust 1.89).
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            // Its first line: who; the rest is not for the message.
            let holder = holder.lines().next().unwrap_or("").trim();
            return Err(LockError::Held {
                lock: path.to_path_buf(),
                holder: if holder.is_empty() {
                    "a process that has not written its name yet".into()
                } else {
                    holder.to_string()
                },
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    // Who holds it, for the message of the next one refused; an earlier
    // owner's note that the journal was opened stays (a start refused before
    // it opens the journal must not wipe it for the next one).
    let mut before = String::new();
    let _ = file.read_to_string(&mut before);
    let found = Found {
        opened: says_opened(&before),
        wal_kept: before.lines().any(|l| l == KEEPS_WAL),
        current: before.lines().any(|l| l == FORMAT),
    };
    let mut me = holder_name();
    me.push_str(FORMAT);
    me.push('\n');
    // Kept for the next owner, should this one stop before opening it.
    for (line, said) in [(OPENED, found.opened), (KEEPS_WAL, found.wal_kept)] {
        if said {
            me.push_str(line);
            me.push('\n');
        }
    }
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(me.as_bytes()))
        // On disk now: a power loss must not leave the file empty, which
        // would forget that a journal (and its `-wal`) was opened here and
        // let the next start take a lost one as new (found by a review).
        .and_then(|()| file.sync_all())
        .map_err(io)?;
    Ok((file, found))
}

/// `pid 1234: relayhub serve`.
fn holder_name() -> String {
    let mut args = std::env::args();
    let program = args
        .next()
        .map(|p| {
            Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or(p)
        })
        .unwrap_or_else(|| "?".into());
    let command = args.next().unwrap_or_default();
    format!("pid {}: {program} {command}\n", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether an earlier owner had opened the journal is read from the lock
    /// file under either name (a link's target included), and kept by the
    /// next owner's taking of the lock; a lock file of a build before the
    /// note counts as opened, an empty one (its owner's write failed) not.
    #[test]
    fn an_earlier_opening_is_read_under_either_name_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.db");
        let mut first = FileLock::acquire(&real).unwrap();
        assert!(!first.opened_before(), "a first start");
        drop(first);
        first = FileLock::acquire(&real).unwrap();
        assert!(!first.opened_before(), "never opened: no note");
        first.mark_opened().unwrap();
        first.mark_opened().unwrap();
        drop(first);
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let second = FileLock::acquire(&link).unwrap();
        assert!(second.opened_before(), "through a link");
        drop(second);
        let text = std::fs::read_to_string(lock_path(&real)).unwrap();
        assert_eq!(text.matches(OPENED).count(), 1, "kept once: {text}");
        assert_eq!(text.matches(KEEPS_WAL).count(), 1, "kept once: {text}");
        assert!(FileLock::acquire(&real).unwrap().wal_kept_before());

        let older = dir.path().join("older.db");
        std::fs::write(lock_path(&older), "pid 7: relayhub serve\n").unwrap();
        let older_lock = FileLock::acquire(&older).unwrap();
        assert!(older_lock.opened_before(), "an older build's");
        assert!(
            !older_lock.wal_kept_before(),
            "an older build's may have let SQLite delete the -wal"
        );
        let emptied = dir.path().join("emptied.db");
        std::fs::write(lock_path(&emptied), "").unwrap();
        assert!(
            !FileLock::acquire(&emptied).unwrap().opened_before(),
            "empty"
        );
    }

    /// A clean stop's note (no `-wal` kept) cuts only that line off, and
    /// the one name's lock is the latest word on the `-wal`: a stale note
    /// under a link's name, from an older run through the link, does not
    /// make the next start through it look for a `-wal` (both found by a
    /// review).
    #[test]
    fn a_clean_stop_drops_only_the_wal_note_and_the_one_name_decides() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.db");
        let link = dir.path().join("link.db");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        // An earlier run through the link, crashed: both locks say kept.
        let mut crashed = FileLock::acquire(&link).unwrap();
        crashed.mark_opened().unwrap();
        drop(crashed);
        // A run under the one name, stopped cleanly.
        let mut stopped = FileLock::acquire(&real).unwrap();
        assert!(stopped.wal_kept_before());
        stopped.mark_opened().unwrap();
        stopped.mark_whole_in_file().unwrap();
        drop(stopped);
        let text = std::fs::read_to_string(lock_path(&real)).unwrap();
        assert!(
            text.ends_with(&format!("{FORMAT}\n{OPENED}\n")) && !text.contains(KEEPS_WAL),
            "{text:?}"
        );
        assert!(
            std::fs::read_to_string(lock_path(&link))
                .unwrap()
                .contains(KEEPS_WAL),
            "the link's lock is stale"
        );
        let through_link = FileLock::acquire(&link).unwrap();
        assert!(through_link.opened_before());
        assert!(!through_link.wal_kept_before(), "the one name decides");
        drop(through_link);
        assert!(!says_wal_kept(&link) && !says_wal_kept(&real));
    }

    /// The holder's message names who, not the lock file's notes.
    #[test]
    fn a_journal_with_a_second_hard_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.db");
        assert!(one_link(&db).is_ok(), "not made yet");
        std::fs::write(&db, b"").unwrap();
        assert!(one_link(&db).is_ok());
        let link = dir.path().join("other.db");
        std::fs::hard_link(&db, &link).unwrap();
        for name in [&db, &link] {
            let err = one_link(name).unwrap_err();
            assert!(err.contains("2 hard links"), "{err}");
        }
        std::fs::remove_file(&link).unwrap();
        assert!(one_link(&db).is_ok());
    }

    #[test]
    fn the_holder_is_named_by_the_first_line() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.db");
        let mut first = FileLock::acquire(&db).unwrap();
        first.mark_opened().unwrap();
        match FileLock::acquire(&db) {
            Err(LockError::Held { holder, .. }) => assert!(
                holder.starts_with("pid ") && !holder.contains(OPENED) && !holder.contains(FORMAT),
                "{holder}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_holder_at_a_time_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("journal.db");
        let first = FileLock::acquire(&db).expect("first lock");
        assert_eq!(first.path(), dir.path().join("journal.db.lock"));
        // A second descriptor, even in the same process, is refused.
        match FileLock::acquire(&db) {
            Err(LockError::Held { lock, holder }) => {
                assert_eq!(lock, lock_path(&db));
                assert!(
                    holder.starts_with(&format!("pid {}: ", std::process::id())),
                    "{holder}"
                );
            }
            other => panic!("expected Held, got {other:?}"),
        }
        drop(first);
        FileLock::acquire(&db).expect("free again once dropped");
    }

    /// A second owner through another name of the same file (a symbolic
    /// link, a path with `.` in it, a linked directory) is refused: it took a
    /// lock of its own and its start-up marked the first hub's live claims
    /// unknown.
    #[cfg(unix)]
    #[test]
    fn every_name_of_the_file_has_the_same_lock() {
        let dir = tempfile::tempdir().unwrap();
        let real_dir = std::fs::canonicalize(dir.path()).unwrap();
        let db = dir.path().join("journal.db");
        std::fs::write(&db, b"").unwrap();
        let link = dir.path().join("alias.db");
        std::os::unix::fs::symlink(&db, &link).unwrap();
        let dotted = dir.path().join(".").join("journal.db");
        let first = FileLock::acquire(&link).expect("first lock, through the link");
        assert_eq!(first.path(), real_dir.join("journal.db.lock"));
        for other in [&db, &dotted] {
            assert!(
                matches!(FileLock::acquire(other), Err(LockError::Held { .. })),
                "{} took a second lock",
                other.display()
            );
        }
        // A file not made yet, through a linked directory.
        let linked_dir = dir.path().join("linked");
        std::os::unix::fs::symlink(dir.path(), &linked_dir).unwrap();
        let new = FileLock::acquire(&linked_dir.join("new.db")).expect("a new file's lock");
        assert_eq!(new.path(), real_dir.join("new.db.lock"));
        assert!(matches!(
            FileLock::acquire(&dir.path().join("new.db")),
            Err(LockError::Held { .. })
        ));
    }

    /// A link made before the first start, to a file SQLite has not made
    /// yet, names the same lock before and after SQLite makes it.
    #[cfg(unix)]
    #[test]
    fn a_link_to_a_file_not_made_yet_has_the_lock_of_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let link = dir.path().join("journal.db");
        std::os::unix::fs::symlink(data.join("journal.db"), &link).unwrap();
        let first = FileLock::acquire(&link).expect("first owner");
        assert_eq!(
            first.path(),
            std::fs::canonicalize(&data)
                .unwrap()
                .join("journal.db.lock")
        );
        std::fs::write(data.join("journal.db"), b"").unwrap();
        for name in [&link, &data.join("journal.db")] {
            assert!(
                matches!(FileLock::acquire(name), Err(LockError::Held { .. })),
                "{} took a second lock",
                name.display()
            );
        }
    }

    /// A hub of a build before the one name locks only `<name given>.lock`:
    /// through a link, that lock is taken too, so neither can own the
    /// journal beside the other.
    #[cfg(unix)]
    #[test]
    fn the_lock_of_the_name_given_is_taken_too() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("journal.db");
        std::fs::write(&real, b"").unwrap();
        let link = dir.path().join("alias.db");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let older = File::create(lock_path(&link)).unwrap();
        older.try_lock().unwrap();
        assert!(matches!(
            FileLock::acquire(&link),
            Err(LockError::Held { .. })
        ));
        drop(older);
        let lock = FileLock::acquire(&link).expect("free once the older hub is gone");
        let again = File::open(lock_path(&link)).unwrap();
        assert!(
            matches!(again.try_lock(), Err(TryLockError::WouldBlock)),
            "the link's own lock is held for older builds"
        );
        drop(lock);
    }

    #[test]
    fn an_unwritable_place_is_an_io_error() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("missing").join("journal.db");
        assert!(matches!(FileLock::acquire(&db), Err(LockError::Io { .. })));
    }
}
