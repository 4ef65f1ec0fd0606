//! The embedded, crash-safe journal store (SQLite). Being written.
