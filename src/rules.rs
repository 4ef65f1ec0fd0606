//! The reloadable part of the configuration: routes, layouts, channels and the
//! code table, checked and assembled into one immutable snapshot.
//!
//! A telegram takes one `Arc<Rules>` when it starts and uses it to the end, so a
//! reload (SIGHUP) swaps the whole set at once or, when the new set is invalid,
//! not at all.
//!
//! Each route's layout is checked against the core API its operation calls
//! ([`core_api`]), so a layout the core cannot work with is refused here rather
//! than answered E500 or E901 telegram after telegram.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use crate::config::{Cidr, CidrError, Config, Operation};
use crate::layout::{self, Layout};
use crate::meters::TelegramMeters;
use crate::outcome::{CodeTable, CodeTableError};

pub mod core_api;

/// A tx code's route.
#[derive(Debug, Clone)]
pub struct Route {
    pub tx_code: String,
    pub operation: Operation,
    /// Index into the hub's targets.
    pub target: usize,
    pub layout: Arc<Layout>,
    /// Its telegram count and duration handles.
    pub meters: Arc<TelegramMeters>,
}

/// The names a connection's verified client certificate bears (SAN DNS
/// names, then the subject CN), lowercased: what `cert_names` match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    pub names: Vec<String>,
}

impl std::fmt::Display for ClientCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.names.is_empty() {
            return f.write_str("a certificate without a DNS name or CN");
        }
        write!(f, "certificate {}", self.names.join(", "))
    }
}

/// Why a channel may not send a telegram (E103).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelRefusal {
    UnknownChannel,
    PeerNotAllowed(IpAddr),
    /// The channel's `tx_codes` leave this one out.
    TxNotAllowed(String),
    /// The connection's certificate is another channel's.
    CertificateOfAnother {
        cert: ClientCert,
        channel: String,
    },
    /// The connection's certificate is no channel's.
    CertificateUnmapped(ClientCert),
    /// The connection's certificate names more than one channel.
    CertificateOfSeveral {
        cert: ClientCert,
        channels: Vec<String>,
    },
    /// The channel has `cert_names` and the connection shows no certificate.
    CertificateMissing,
}

impl std::fmt::Display for ChannelRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChannelRefusal::UnknownChannel => f.write_str("channel_id is not in the channel table"),
            ChannelRefusal::PeerNotAllowed(ip) => write!(f, "channel not allowed from {ip}"),
            ChannelRefusal::TxNotAllowed(tx) => {
                write!(
                    f,
                    "the channel table does not let this channel use tx code {tx}"
                )
            }
            ChannelRefusal::CertificateOfAnother { cert, channel } => {
                write!(
                    f,
                    "the connection's {cert} is channel {channel}'s, not this channel_id's"
                )
            }
            ChannelRefusal::CertificateUnmapped(cert) => {
                write!(f, "the connection's {cert} is in no channel's cert_names")
            }
            ChannelRefusal::CertificateOfSeveral { cert, channels } => {
                write!(
                    f,
                    "the connection's {cert} names channels {}: a certificate must name one",
                    channels.join(" and ")
                )
            }
            ChannelRefusal::CertificateMissing => {
                f.write_str("channel has cert_names and the connection shows no client certificate")
            }
        }
    }
}

#[derive(Debug, Clone)]
struct ChannelRule {
    allow_from: Vec<Cidr>,
    tx_codes: HashSet<String>,
    /// Lowercased; empty: the channel calls without a certificate.
    cert_names: Vec<String>,
}

/// Why the rules cannot be built; each names the file or key at fault.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    /// Named by the key that gave the folder (a black-box probe: a missing
    /// folder was "layout PATH: ..." with no key).
    #[error("server.layouts_dir: {0}")]
    Layouts(#[from] layout::LayoutError),
    #[error("server.codes_file: {0}")]
    Codes(#[from] CodeTableError),
    /// Only a reload can meet this (the config's own check refuses an
    /// unknown target first): the file names a target the running hub
    /// does not have, since targets change at a restart.
    #[error(
        "route.{tx_code}.target: names target {target:?}, which the running hub does not have: \
         a target added or renamed takes effect at a restart; until then a route cannot use it"
    )]
    UnknownTarget { tx_code: String, target: String },
    #[error("route.{tx_code}: no layout {layout:?} (have {have:?})")]
    NoLayout {
        tx_code: String,
        layout: String,
        have: Vec<String>,
    },
    #[error("route.{tx_code}: layout {layout} ({file}): {source}")]
    CoreApi {
        tx_code: String,
        layout: String,
        file: String,
        source: Box<core_api::ApiMismatch>,
    },
    #[error(
        "route.{tx_code}: its telegram is {need} bytes (the 64-byte header and layout \
         {layout}'s {body}-byte body), longer than server.max_telegram_len ({max}, the running \
         hub's on a reload if lower): every one would be refused E102; raise \
         server.max_telegram_len (a restart puts it in force)"
    )]
    TooLong {
        tx_code: String,
        layout: String,
        body: usize,
        need: usize,
        max: usize,
    },
    #[error("channel.{channel}.allow_from: {source}")]
    AllowFrom { channel: String, source: CidrError },
    #[error("channel.{channel}.tx_codes: {code:?} has no route")]
    UnroutedTxCode { channel: String, code: String },
}

/// One consistent version of routes, layouts, channels and codes.
#[derive(Debug, Clone)]
pub struct Rules {
    /// Looked up twice per telegram, so hashed with foldhash (see Cargo.toml).
    routes: foldhash::HashMap<String, Route>,
    /// None: no channel table, every channel may call.
    channels: Option<foldhash::HashMap<String, ChannelRule>>,
    /// Certificate name (lowercased) -> channel id.
    cert_channels: HashMap<String, String>,
    pub codes: CodeTable,
    pub layouts: BTreeMap<String, Arc<Layout>>,
    /// The telegram metrics of tx codes without a route.
    unrouted: Arc<TelegramMeters>,
}

impl Rules {
    /// Builds and checks the rules; `target_names` are the hub's targets in order.
    /// The error names the file or key and the reason.
    pub fn build(cfg: &Config, target_names: &[String]) -> Result<Rules, RulesError> {
        Rules::build_to_read(cfg, target_names, cfg.server.max_telegram_len)
    }

    /// [`Rules::build`], every route's telegram checked against
    /// `max_telegram_len` (a reload: the running hub's limit and the file's,
    /// which a restart puts in force, whichever is lower).
    pub fn build_to_read(
        cfg: &Config,
        target_names: &[String],
        max_telegram_len: usize,
    ) -> Result<Rules, RulesError> {
        // The folder adds to the built-in layouts (and replaces one by tx code).
        let layouts = layout::with_dir(cfg.server.layouts_dir.as_deref())?;
        let layouts: BTreeMap<String, Arc<Layout>> =
            layouts.into_iter().map(|(k, v)| (k, Arc::new(v))).collect();
        let codes = match &cfg.server.codes_file {
            Some(path) => CodeTable::from_file(path)?,
            None => CodeTable::builtin(),
        };
        let mut routes = foldhash::HashMap::default();
        for r in &cfg.routes {
            let target = target_names
                .iter()
                .position(|n| *n == r.target)
                .ok_or_else(|| RulesError::UnknownTarget {
                    tx_code: r.tx_code.clone(),
                    target: r.target.clone(),
                })?;
            let layout_name = r.layout.as_deref().unwrap_or(&r.tx_code);
            let layout = layouts
                .get(layout_name)
                .ok_or_else(|| RulesError::NoLayout {
                    tx_code: r.tx_code.clone(),
                    layout: layout_name.to_string(),
                    have: layouts.keys().cloned().collect(),
                })?
                .clone();
            core_api::check(r.operation, &layout).map_err(|source| RulesError::CoreApi {
                tx_code: r.tx_code.clone(),
                layout: layout_name.to_string(),
                file: layout.source.clone(),
                source: Box::new(source),
            })?;
            let need = crate::header::HEADER_LEN + layout.request_len();
            if need > max_telegram_len {
                return Err(RulesError::TooLong {
                    tx_code: r.tx_code.clone(),
                    layout: layout_name.to_string(),
                    body: layout.request_len(),
                    need,
                    max: max_telegram_len,
                });
            }
            routes.insert(
                r.tx_code.clone(),
                Route {
                    tx_code: r.tx_code.clone(),
                    operation: r.operation,
                    target,
                    layout,
                    meters: Arc::default(),
                },
            );
        }
        let mut cert_channels = HashMap::new();
        for c in &cfg.channels {
            for name in &c.cert_names {
                cert_channels.insert(name.to_ascii_lowercase(), c.id.clone());
            }
        }
        let channels = if cfg.channels.is_empty() {
            None
        } else {
            let mut map = foldhash::HashMap::default();
            for c in &cfg.channels {
                let allow_from = c
                    .allow_from
                    .iter()
                    .map(|a| Cidr::parse(a))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|source| RulesError::AllowFrom {
                        channel: c.id.clone(),
                        source,
                    })?;
                for code in &c.tx_codes {
                    if !routes.contains_key(code) {
                        return Err(RulesError::UnroutedTxCode {
                            channel: c.id.clone(),
                            code: code.clone(),
                        });
                    }
                }
                map.insert(
                    c.id.clone(),
                    ChannelRule {
                        allow_from,
                        tx_codes: c.tx_codes.iter().cloned().collect(),
                        cert_names: c
                            .cert_names
                            .iter()
                            .map(|n| n.to_ascii_lowercase())
                            .collect(),
                    },
                );
            }
            Some(map)
        };
        Ok(Rules {
            routes,
            channels,
            cert_channels,
            codes,
            layouts,
            unrouted: Arc::default(),
        })
    }

    pub fn route(&self, tx_code: &str) -> Option<&Route> {
        self.routes.get(tx_code)
    }

    /// The `tx_code` label value and the metrics of a telegram of `route`:
    /// only routed tx codes become label values, so garbage cannot grow the
    /// metrics.
    pub fn telegram_meters<'a>(
        &'a self,
        route: Option<&'a Route>,
    ) -> (&'a str, &'a TelegramMeters) {
        match route {
            Some(r) => (&r.tx_code, &r.meters),
            None => (crate::metric_names::UNROUTED_TX, &self.unrouted),
        }
    }

    /// Routes sorted by tx code (for `relayhub check`).
    pub fn routes(&self) -> Vec<&Route> {
        let mut v: Vec<&Route> = self.routes.values().collect();
        v.sort_by(|a, b| a.tx_code.cmp(&b.tx_code));
        v
    }

    /// Check 3 of the header checks: may this channel, from this peer, over
    /// this connection (its client certificate, if any), use this route?
    ///
    /// A connection with a certificate is the channel its certificate names
    /// and no other; a channel with `cert_names` calls only with one of them.
    pub fn check_channel(
        &self,
        channel_id: &str,
        peer: IpAddr,
        cert: Option<&ClientCert>,
        tx_code: &str,
    ) -> Result<(), ChannelRefusal> {
        if let Some(cert) = cert {
            // A certificate whose names give two channels (a PKI mistake)
            // is no one's, rather than whichever name comes first in it
            // (found by a black-box probe). No list is made unless it is.
            let mut owners = cert.names.iter().filter_map(|n| self.cert_channels.get(n));
            let owner = owners
                .next()
                .ok_or_else(|| ChannelRefusal::CertificateUnmapped(cert.clone()))?;
            if owners.any(|o| o != owner) {
                let mut channels: Vec<String> = cert
                    .names
                    .iter()
                    .filter_map(|n| self.cert_channels.get(n).cloned())
                    .collect();
                channels.sort();
                channels.dedup();
                return Err(ChannelRefusal::CertificateOfSeveral {
                    cert: cert.clone(),
                    channels,
                });
            }
            if owner != channel_id {
                return Err(ChannelRefusal::CertificateOfAnother {
                    cert: cert.clone(),
                    channel: owner.clone(),
                });
            }
        }
        let Some(channels) = &self.channels else {
            return Ok(());
        };
        let rule = channels
            .get(channel_id)
            .ok_or(ChannelRefusal::UnknownChannel)?;
        if cert.is_none() && !rule.cert_names.is_empty() {
            return Err(ChannelRefusal::CertificateMissing);
        }
        if !rule.allow_from.is_empty() && !rule.allow_from.iter().any(|c| c.contains(peer)) {
            // As `allow_from` compares it: an IPv4 channel on an IPv6
            // listener by its IPv4 address, which is what to list.
            return Err(ChannelRefusal::PeerNotAllowed(peer.to_canonical()));
        }
        if !rule.tx_codes.is_empty() && !rule.tx_codes.contains(tx_code) {
            return Err(ChannelRefusal::TxNotAllowed(tx_code.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ChannelConfig, Overrides};

    fn rules(channels: Vec<ChannelConfig>) -> Rules {
        let mut cfg = Config::default();
        cfg.apply(&Overrides {
            core_url: Some("http://127.0.0.1:9".into()),
            ..Overrides::default()
        });
        cfg.channels = channels;
        Rules::build(&cfg, &["core".to_string()]).expect("rules")
    }

    /// An IPv4 channel on an IPv6 listener (`::ffff:a.b.c.d`) is refused
    /// naming its IPv4 address, the one `allow_from` matches (found by a
    /// black-box probe: the mapped form, copied into allow_from, never
    /// matched).
    #[test]
    fn a_mapped_ipv4_peer_is_named_by_its_ipv4_address() {
        let mut c = channel("IBANK", &[]);
        c.allow_from = vec!["10.0.0.0/8".into()];
        let r = rules(vec![c]);
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let err = r
            .check_channel("IBANK", mapped, None, "TRF001")
            .unwrap_err();
        assert_eq!(err.to_string(), "channel not allowed from 127.0.0.1");
        let inside: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert!(r.check_channel("IBANK", inside, None, "TRF001").is_ok());
    }

    /// A route whose telegram is longer than the hub reads could never be
    /// answered but E102: refused with the numbers (found by a black-box
    /// probe: `check` said the config was OK).
    #[test]
    fn a_route_longer_than_the_longest_telegram_is_refused() {
        let mut cfg = Config::default();
        cfg.apply(&Overrides {
            core_url: Some("http://127.0.0.1:9".into()),
            ..Overrides::default()
        });
        // INQ001's 96 bytes fit, TRF001's 132 do not.
        cfg.server.max_telegram_len = 100;
        let Err(err) = Rules::build(&cfg, &["core".to_string()]) else {
            panic!("a route longer than max_telegram_len was taken");
        };
        let err = err.to_string();
        assert!(
            err.starts_with("route.TRF001: its telegram is 132 bytes")
                && err.contains("max_telegram_len (100,"),
            "{err}"
        );
        cfg.server.max_telegram_len = 132;
        assert!(Rules::build(&cfg, &["core".to_string()]).is_ok());
    }

    fn channel(id: &str, cert_names: &[&str]) -> ChannelConfig {
        ChannelConfig {
            id: id.into(),
            allow_from: vec![],
            tx_codes: vec![],
            cert_names: cert_names.iter().map(|n| n.to_string()).collect(),
        }
    }

    fn cert(names: &[&str]) -> ClientCert {
        ClientCert {
            names: names.iter().map(|n| n.to_string()).collect(),
        }
    }

    #[test]
    fn a_certificate_is_its_channel_and_no_other() {
        let r = rules(vec![
            channel("IBANK", &["IBank.Channels.Test"]),
            channel("CORP", &["corp-cn"]),
            channel("PLAIN", &[]),
        ]);
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let check = |id: &str, c: Option<&ClientCert>| r.check_channel(id, peer, c, "TRF001");
        let ibank = cert(&["ibank.channels.test", "some-cn"]);
        assert_eq!(check("IBANK", Some(&ibank)), Ok(()));
        // Any of its names maps it: here the CN.
        assert_eq!(
            check("CORP", Some(&cert(&["x.example", "corp-cn"]))),
            Ok(())
        );
        assert!(matches!(
            check("CORP", Some(&ibank)),
            Err(ChannelRefusal::CertificateOfAnother { ref channel, .. }) if channel == "IBANK"
        ));
        assert!(matches!(
            check("PLAIN", Some(&ibank)),
            Err(ChannelRefusal::CertificateOfAnother { .. })
        ));
        assert!(matches!(
            check("PLAIN", Some(&cert(&["stranger"]))),
            Err(ChannelRefusal::CertificateUnmapped(_))
        ));
        // Without a certificate: only channels that need none.
        assert_eq!(check("PLAIN", None), Ok(()));
        assert_eq!(
            check("IBANK", None),
            Err(ChannelRefusal::CertificateMissing)
        );
        assert_eq!(check("NOBODY", None), Err(ChannelRefusal::UnknownChannel));
        // Two channels' names in one certificate: no one's, in either order.
        for names in [
            ["ibank.channels.test", "corp-cn"],
            ["corp-cn", "ibank.channels.test"],
        ] {
            let both = cert(&names);
            for id in ["IBANK", "CORP"] {
                let refusal = check(id, Some(&both)).unwrap_err();
                assert!(
                    refusal
                        .to_string()
                        .ends_with("names channels CORP and IBANK: a certificate must name one"),
                    "{refusal}"
                );
            }
        }
        // One channel named twice (SAN and CN) is that channel.
        assert_eq!(
            check(
                "IBANK",
                Some(&cert(&["ibank.channels.test", "IBANK.channels.test"]))
            ),
            Ok(())
        );
    }

    /// A tx code the channel table leaves out is named in the refusal.
    #[test]
    fn a_tx_code_not_allowed_is_named() {
        let mut atm = channel("ATM", &[]);
        atm.tx_codes = vec!["INQ001".into()];
        let r = rules(vec![atm]);
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        let refusal = r.check_channel("ATM", peer, None, "TRF001").unwrap_err();
        assert_eq!(refusal, ChannelRefusal::TxNotAllowed("TRF001".into()));
        assert_eq!(
            refusal.to_string(),
            "the channel table does not let this channel use tx code TRF001"
        );
        assert_eq!(r.check_channel("ATM", peer, None, "INQ001"), Ok(()));
    }
}
