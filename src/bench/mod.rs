//! `relayhub bench`: a load generator for the hub, and the same load sent
//! straight to the core as the baseline.
//!
//! The figures it gives are what an operator sizes a hub by: throughput,
//! latency percentiles from an HDR histogram, and the count of every standard
//! code. Every answer is checked (well-formed code, GUID echo, a 0000 body that
//! decodes by the layout); an answer that breaks the contract is counted as
//! *wrong*, a request that got none as *no answer*: nothing is dropped.
//!
//! | module | what it does |
//! |---|---|
//! | [`spec`] | what a run sends: target, pacing, mix, transfers |
//! | `drive` | tickets, pacing, the hub and direct workers, the answer checks |
//! | [`report`] | per-worker counts, the merged report, its table |
//!
//! Tests and scripts use [`run_load`] with a [`LoadSpec`]; the CLI is [`run`].
//! `benches/compare.sh` runs the baseline and the hub side by side, and
//! `docs/performance.md` has the figures of a real run.

mod drive;
pub mod report;
pub mod spec;

use std::io::IsTerminal;
use std::process::ExitCode;

pub use drive::{run_load, run_load_blocking};
pub use report::Report;
pub use spec::{LoadSpec, Stop, Target, Transfer, Tx, Weighted};

/// Flags of `relayhub bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The hub's telegram address.
    #[arg(long, default_value = "127.0.0.1:9100")]
    pub to: String,
    /// Send the same load straight to the core's HTTP API at this URL (the
    /// baseline without a hub) instead of to a hub.
    #[arg(long, value_name = "URL")]
    pub direct: Option<String>,
    /// Channel connections (hub) or client threads with keep-alive (direct).
    #[arg(short = 'c', long, default_value_t = 10)]
    pub connections: usize,
    /// Requests to send in all (default 10000 unless --duration is given).
    #[arg(short = 'n', long, conflicts_with = "duration")]
    pub count: Option<u64>,
    /// Send for this long instead of a count, e.g. 30s, 500ms, 2m.
    #[arg(short = 'd', long, value_parser = spec::parse_duration)]
    pub duration: Option<std::time::Duration>,
    /// Requests per second over all connections (open loop; latency counts from
    /// each request's intended send time). Absent: closed loop, as fast as
    /// answers come.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Tx codes and their weights; INQ001 asks about a GUID this run transferred.
    #[arg(long, default_value = "TRF001=1", value_parser = spec::parse_mix)]
    pub mix: Weighted<Tx>,
    /// Source accounts of the transfers, with weights (e.g. an empty account to
    /// see B201 in the mix).
    #[arg(long, default_value = "1002003004005")]
    pub from: String,
    /// Destination account of the transfers.
    #[arg(long, default_value = "1002003004006")]
    pub to_account: String,
    /// Destination bank code (the fixture's own is 088).
    #[arg(long, default_value = "088")]
    pub to_bank: String,
    /// Amount of each transfer.
    #[arg(long, default_value_t = 1)]
    pub amount: u64,
    /// Channel id in the header (and the JSON body, direct).
    #[arg(long, default_value = "BENCH")]
    pub channel: String,
    /// GUIDs start with today's date and this (for fixture fault rules).
    #[arg(long, default_value = "BENCH")]
    pub guid_prefix: String,
    /// Closed-loop requests sent first and not measured.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Extra connections opened first and held idle through the run (hub only).
    #[arg(long, default_value_t = 0)]
    pub idle_connections: usize,
    /// How long to hold the idle connections before the load starts.
    #[arg(long, default_value = "1s", value_parser = spec::parse_duration)]
    pub idle_hold: std::time::Duration,
    /// Longest wait for one answer.
    #[arg(long, default_value = "10s", value_parser = spec::parse_duration)]
    pub timeout: std::time::Duration,
    /// Length prefix of the hub: ascii or binary.
    #[arg(long, default_value = "ascii")]
    pub prefix: String,
    /// Print the report as JSON (for scripts) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Speak TLS to the hub (--to is then its tls_listen).
    #[arg(long, requires = "ca")]
    pub tls: bool,
    /// The CA certificate (PEM) that signed the hub's certificate.
    #[arg(long, value_name = "FILE", requires = "tls")]
    pub ca: Option<std::path::PathBuf>,
    /// The channel's certificate (PEM), when the hub asks for one.
    #[arg(long, value_name = "FILE", requires_all = ["tls", "client_key"])]
    pub client_cert: Option<std::path::PathBuf>,
    /// The key (PEM) of --client-cert.
    #[arg(long, value_name = "FILE", requires = "client_cert")]
    pub client_key: Option<std::path::PathBuf>,
    /// The name the hub's certificate must bear [default: the host of --to].
    #[arg(long, value_name = "NAME", requires = "tls")]
    pub server_name: Option<String>,
}

impl BenchArgs {
    /// The load these flags describe.
    pub fn spec(&self) -> Result<LoadSpec, String> {
        let target = match &self.direct {
            Some(url) => Target::Direct { url: url.clone() },
            None => Target::Hub {
                addr: self.to.clone(),
            },
        };
        let stop = match (self.count, self.duration) {
            (Some(n), _) => Stop::Count(n),
            (None, Some(d)) => Stop::Duration(d),
            (None, None) => Stop::Count(10_000),
        };
        let mut spec = LoadSpec::new(target, self.connections, stop);
        spec.rate = self.rate;
        spec.mix = self.mix.clone();
        spec.transfer = Transfer {
            from: spec::parse_weighted(&self.from, |a| Ok(a.to_string()))
                .map_err(|e| format!("--from {e}"))?,
            to_bank: self.to_bank.clone(),
            to_account: self.to_account.clone(),
            amount: self.amount,
            memo: "bench".into(),
        };
        spec.channel_id = self.channel.clone();
        spec.guid_prefix = self.guid_prefix.clone();
        spec.warmup = self.warmup;
        spec.idle_connections = self.idle_connections;
        spec.idle_hold = self.idle_hold;
        spec.answer_timeout = self.timeout;
        spec.prefix = match self.prefix.as_str() {
            "ascii" => crate::frame::PrefixMode::Ascii,
            "binary" => crate::frame::PrefixMode::Binary,
            other => return Err(format!("--prefix {other:?}: use ascii or binary")),
        };
        if let (true, Some(ca)) = (self.tls, &self.ca) {
            let client = crate::client::TlsClient {
                ca_file: ca.clone(),
                client_cert: self.client_cert.clone().zip(self.client_key.clone()),
                server_name: self.server_name.clone(),
            };
            spec.tls = Some(client.connector()?);
        }
        // A progress line is for a person watching; scripts read the result.
        spec.progress = !self.json && std::io::stdout().is_terminal();
        spec.validate()?;
        Ok(spec)
    }
}

/// `relayhub bench`: runs the load and prints the report. Exits 2 when any
/// answer was wrong or missing, so a script notices.
pub async fn run(args: BenchArgs) -> Result<ExitCode, String> {
    let spec = args.spec()?;
    let report = run_load(spec).await?;
    if args.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print!("{}", report.table());
    }
    Ok(if report.clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(2)
    })
}
