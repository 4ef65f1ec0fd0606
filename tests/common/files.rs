//! Temp files and directories of a test's own, removed when dropped.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// A name no other test (or test process) uses: `relayhub-{tag}-PID-SEQ-NANOS`.
fn unique_name(tag: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "relayhub-{tag}-{}-{}-{nanos}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    )
}

/// A temp file removed when dropped.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(ext: &str, text: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("{}.{ext}", unique_name("test")));
        std::fs::write(&path, text).expect("write temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory of its own under the system temp dir, removed when dropped.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(unique_name(tag));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
