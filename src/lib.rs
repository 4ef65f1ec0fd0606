//! relayhub: a synchronous TCP telegram relay hub between bank channels and a
//! JSON/HTTP core banking system.
//!
//! A channel sends a fixed-length telegram; the hub checks and routes it,
//! converts it by a layout, calls the core, and answers with one standard code
//! whose meaning does not depend on how the core answered or failed. Above all it
//! tells "not sent" (E902, safe to resend) from "sent, don't know" (E901, answered
//! by inquiry), and never posts a transfer twice for one GUID.
//!
//! "Section N" (or "protocol section N") in comments means section N of
//! `docs/protocol.md`, the wire protocol that channels and the core speak.
//!
//! # Layout: the path of one telegram, top to bottom
//!
//! | module | what it does |
//! |---|---|
//! | [`config`] | the TOML config, built-in defaults, start-up checks |
//! | [`frame`] | the length prefix (ascii or binary): bytes <-> telegrams, pure |
//! | [`header`] | the 64-byte header: parse, check, echo, write |
//! | [`layout`] | layout files and field types: body bytes <-> JSON |
//! | [`json_object`] | a JSON object read by name: a map, or the core's answer read without one |
//! | [`rules`] | routes, layouts, channels and codes as one reloadable snapshot |
//! | [`core_client`] | HTTP calls whose result type says "not sent" or "may have been sent" |
//! | [`outcome`] | the core's answer -> standard code, from a table |
//! | [`journal`] | the GUID journal: one interface, memory and SQLite stores |
//! | [`relay`] | one telegram end to end: checks, journal, call, answer |
//! | [`tls_files`] | the PEM files of TLS (both sides, and `send`/`bench`), their errors, the one crypto provider |
//! | [`channel_tls`] | the TLS listener's files (reloaded), handshake failures, client-certificate names |
//! | [`server`] | accept loop, connections (plain or TLS), pipelining, timeouts, draining |
//! | [`admin`] | the admin HTTP endpoints: metrics, health, readiness |
//! | [`metric_names`] | every metric's name and meaning (a leaf: imports nothing of the crate) |
//! | [`daemon`] | start-up, reload and shutdown |
//! | [`open_files`] | the open-file limit raised for `max_connections` at start |
//! | [`reserve_descriptors`] | descriptors kept to take a connection off a listener at the open-file limit |
//! | [`client`] | the channel side: build, send, decode (for `send`, `bench`, tests) |
//! | [`random`] | jitter, GUIDs and hub names (not secrets) |
//! | [`throttle`] | one log line per period for an event that repeats, with its count |
//! | [`bench`] | the load generator: through the hub or straight to the core, side by side |

// `unsafe` is denied except where it is allowed item by item, each with its
// safety argument written above it: the SQLite journal (fsyncing the database
// file through SQLite's own handle, starting its writes with
// `sync_file_range`, a lock probe, file identities, asking SQLite for its
// WAL's file name), `peek` (a non-blocking look at a socket) and `open_files`
// (the open-file limit). `grep -rn 'allow(unsafe_code)' src` lists them.
#![deny(unsafe_code)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod admin;
pub mod admin_listener;
pub mod bench;
pub mod catch_unwind;
pub mod channel_tls;
pub mod client;
pub mod config;
pub mod console;
pub mod console_stats;
pub mod core_client;
pub mod daemon;
pub mod decimal;
pub mod frame;
pub mod header;
pub mod hex;
pub mod journal;
pub mod json_object;
pub mod layout;
pub mod meters;
pub mod metric_names;
pub mod open_files;
pub mod outcome;
pub(crate) mod peek;
pub mod random;
pub mod relay;
pub mod reserve_descriptors;
pub mod rules;
pub mod server;
pub(crate) mod stash;
pub mod telegram_log;
pub mod throttle;
pub mod tls_files;
