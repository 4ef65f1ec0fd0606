//! relayhub: a TCP telegram relay hub between bank channels and a JSON/HTTP core.
//!
//! Channels send fixed-length telegrams over TCP; the hub checks each one, converts
//! its body to JSON by a layout, calls the core banking system, and answers with a
//! standard code. `PROTOCOL.md` is the contract.
//!
//! # Module map
//!
//! The path of one telegram, top to bottom. These modules are pure (no sockets, no
//! clock except [`header::local_timestamp`]) so they can be unit- and
//! property-tested on their own:
//!
//! - [`frame`]: the 4-byte length prefix (ascii | binary): stream bytes <-> telegram.
//! - [`header`]: the 64-byte header: parse and check a request's, echo it, write a
//!   response's.
//! - [`layout`]: layout files and the field types `AN`, `N`, `U`, `H`: body bytes <->
//!   JSON.

pub mod frame;
pub mod header;
pub mod layout;
