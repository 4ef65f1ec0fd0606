//! What a load run sends: the target, the pacing, the mix of tx codes, and the
//! transfer each ticket becomes. Pure data and pure functions, so the choice of
//! request for ticket `i` is reproducible and tests can predict a run's codes.

use std::time::Duration;

use serde_json::{Map, Value};

/// Where the load goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A hub's telegram listener, `HOST:PORT`: N channel connections.
    Hub { addr: String },
    /// The core's HTTP API straight, `http://HOST:PORT`: the baseline without a hub.
    Direct { url: String },
}

/// When a run ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stop {
    /// After this many requests (tickets).
    Count(u64),
    /// When this much time has passed since the first request.
    Duration(Duration),
}

/// The transaction kinds the bench can send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tx {
    /// TRF001: a transfer with a fresh GUID.
    Transfer,
    /// INQ001: an inquiry about a GUID this run already transferred.
    Inquiry,
}

impl Tx {
    pub fn code(self) -> &'static str {
        match self {
            Tx::Transfer => "TRF001",
            Tx::Inquiry => "INQ001",
        }
    }
}

/// A weighted choice, taken by ticket number: ticket `i` takes the entry whose
/// cumulative weight range holds `i % total`. Deterministic, so a run of
/// `count` tickets (a multiple of the total) has exactly the weights' shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Weighted<T> {
    entries: Vec<(T, u32)>,
    total: u64,
}

impl<T: Clone> Weighted<T> {
    pub fn new(entries: Vec<(T, u32)>) -> Result<Self, String> {
        let total: u64 = entries.iter().map(|(_, w)| u64::from(*w)).sum();
        if total == 0 {
            return Err("weights add up to 0".into());
        }
        Ok(Weighted { entries, total })
    }

    pub fn one(item: T) -> Self {
        Weighted {
            entries: vec![(item, 1)],
            total: 1,
        }
    }

    pub fn pick(&self, ticket: u64) -> &T {
        let mut slot = ticket % self.total;
        for (item, w) in &self.entries {
            if slot < u64::from(*w) {
                return item;
            }
            slot -= u64::from(*w);
        }
        // Unreachable: slot < total = sum of weights.
        &self.entries[self.entries.len() - 1].0
    }

    pub fn entries(&self) -> &[(T, u32)] {
        &self.entries
    }
}

/// Parses `A=3,B=1` (a bare `A` weighs 1) with `item` checking each name.
pub fn parse_weighted<T: Clone>(
    text: &str,
    item: impl Fn(&str) -> Result<T, String>,
) -> Result<Weighted<T>, String> {
    let mut entries = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, weight) = match part.split_once('=') {
            Some((n, w)) => (
                n.trim(),
                w.trim()
                    .parse::<u32>()
                    .map_err(|_| format!("{part:?}: the weight must be a whole number"))?,
            ),
            None => (part, 1),
        };
        entries.push((item(name)?, weight));
    }
    Weighted::new(entries).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses a `--mix` value such as `TRF001=9,INQ001=1`.
pub fn parse_mix(text: &str) -> Result<Weighted<Tx>, String> {
    parse_weighted(text, |name| match name {
        "TRF001" => Ok(Tx::Transfer),
        "INQ001" => Ok(Tx::Inquiry),
        other => Err(format!(
            "tx code {other:?}: the bench sends TRF001 and INQ001"
        )),
    })
}

/// Parses a duration such as `30`, `30s`, `500ms` or `2m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{text:?}: use e.g. 30s, 500ms or 2m"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{text:?}: must be more than 0"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// The transfer a TRF001 ticket sends: own-bank accounts from the fixture's seed,
/// so it succeeds (or, for an empty `from` account, is refused with B201).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    /// Weighted source accounts, picked by transfer ticket.
    pub from: Weighted<String>,
    pub to_bank: String,
    pub to_account: String,
    pub amount: u64,
    pub memo: String,
}

impl Default for Transfer {
    fn default() -> Self {
        Transfer {
            // 100,000,000 in the fixture seed: a million runs of 100 transfers of 1.
            from: Weighted::one("1002003004005".to_string()),
            to_bank: "088".into(),
            to_account: "1002003004006".into(),
            amount: 1,
            memo: "bench".into(),
        }
    }
}

impl Transfer {
    /// The TRF001 body fields for ticket `ticket`.
    pub fn fields(&self, ticket: u64) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("from_account".into(), self.from.pick(ticket).clone().into());
        m.insert("to_bank".into(), self.to_bank.clone().into());
        m.insert("to_account".into(), self.to_account.clone().into());
        m.insert("amount".into(), self.amount.into());
        m.insert("memo".into(), self.memo.clone().into());
        m
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub target: Target,
    /// Channel connections (hub) or client threads with keep-alive (direct).
    pub connections: usize,
    pub stop: Stop,
    /// Requests per second over all connections (open loop); `None`: closed loop,
    /// each connection sends its next request as soon as the answer is in.
    pub rate: Option<f64>,
    pub mix: Weighted<Tx>,
    pub transfer: Transfer,
    /// The channel id in the header (hub) or the JSON body (direct).
    pub channel_id: String,
    /// GUIDs are `new_guid(prefix)`: today's date, then this prefix.
    pub guid_prefix: String,
    /// Closed-loop requests sent first and reported apart (pools, caches).
    pub warmup: u64,
    /// Extra channel connections opened before the load and held, idle, to its
    /// end (hub only): what a hub pays per connection.
    pub idle_connections: usize,
    /// How long to hold the idle connections before the load starts.
    pub idle_hold: Duration,
    /// Longest wait for one answer; past it the request counts as an error.
    pub answer_timeout: Duration,
    /// Length prefix mode of the hub.
    pub prefix: crate::frame::PrefixMode,
    /// A progress line on stderr while running.
    pub progress: bool,
    /// Speak TLS to the hub (its `tls_listen`); plain TCP when `None`.
    pub tls: Option<crate::client::TlsConnector>,
}

impl LoadSpec {
    /// A closed-loop TRF001 run with every other setting at its default.
    pub fn new(target: Target, connections: usize, stop: Stop) -> LoadSpec {
        LoadSpec {
            target,
            connections,
            stop,
            rate: None,
            mix: Weighted::one(Tx::Transfer),
            transfer: Transfer::default(),
            channel_id: "BENCH".into(),
            guid_prefix: "BENCH".into(),
            warmup: 0,
            idle_connections: 0,
            idle_hold: Duration::ZERO,
            answer_timeout: Duration::from_secs(10),
            prefix: crate::frame::PrefixMode::Ascii,
            progress: false,
            tls: None,
        }
    }

    /// Checks the settings that flags cannot check alone.
    pub fn validate(&self) -> Result<(), String> {
        if self.connections == 0 {
            return Err("--connections must be at least 1".into());
        }
        if let Some(r) = self.rate
            && !(r.is_finite() && r > 0.0)
        {
            return Err("--rate must be more than 0".into());
        }
        if self.channel_id.is_empty() || self.channel_id.len() > 8 {
            return Err("--channel must be 1-8 characters".into());
        }
        if self.idle_connections > 0 && matches!(self.target, Target::Direct { .. }) {
            return Err("--idle-connections needs a hub (not --direct)".into());
        }
        if self.tls.is_some() && matches!(self.target, Target::Direct { .. }) {
            return Err("--tls is for a hub's tls_listen (not --direct)".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_pick_gives_exact_shares_per_period() {
        let w = parse_mix("TRF001=3,INQ001=1").unwrap();
        let picks: Vec<Tx> = (0..8).map(|i| *w.pick(i)).collect();
        let inq = picks.iter().filter(|t| **t == Tx::Inquiry).count();
        assert_eq!(inq, 2);
        assert_eq!(picks[0], Tx::Transfer);
    }

    #[test]
    fn mix_refuses_unknown_codes_and_zero_weights() {
        assert!(parse_mix("XYZ001=1").is_err());
        assert!(parse_mix("TRF001=0").is_err());
        assert!(parse_mix("TRF001=x").is_err());
        assert_eq!(parse_mix("TRF001").unwrap().entries().len(), 1);
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("fast").is_err());
    }
}
