//! The corebank fixture and an in-process hub in front of it, both on
//! `127.0.0.1:0`.

use corebank::{CoreBank, GuidStats, default_seed};
use relayhub::client::Channel;
use relayhub::config::Overrides;
use relayhub::daemon::{Daemon, Source};
use relayhub::frame::PrefixMode;
use tokio::net::{TcpListener, TcpStream};

use super::certs::{Leaf, TestCa, Validity};
use super::{TempFile, connect, within};

/// How a test wants its hub.
#[derive(Debug, Clone, Default)]
pub struct HubOpts {
    pub budget_ms: Option<u64>,
    pub connect_timeout_ms: Option<u64>,
    /// A TOML config written to a temp file and given as `--config`.
    pub toml: Option<String>,
    /// Points the default target elsewhere than the fixture.
    pub core_url: Option<String>,
}

impl HubOpts {
    pub fn budget(ms: u64) -> Self {
        HubOpts {
            budget_ms: Some(ms),
            ..HubOpts::default()
        }
    }

    pub fn toml(text: &str) -> Self {
        HubOpts {
            toml: Some(text.to_string()),
            ..HubOpts::default()
        }
    }
}

/// How the fixture serves: plain HTTP, or HTTPS with a test CA of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoreScheme {
    Http,
    Https,
}

impl CoreScheme {
    /// The base URL of something listening on `addr` in this scheme.
    pub fn url(self, addr: std::net::SocketAddr) -> String {
        match self {
            CoreScheme::Http => format!("http://{addr}"),
            CoreScheme::Https => format!("https://{addr}"),
        }
    }
}

/// A test CA and the fixture's server certificate (for `127.0.0.1` and
/// `localhost`), as PEM files that live as long as this value.
pub struct CoreTls {
    pub ca: TestCa,
    pub server: Leaf,
}

impl CoreTls {
    pub fn new() -> CoreTls {
        let ca = TestCa::new("relayhub test core CA");
        let server = ca.server("core", &["127.0.0.1", "localhost"], Validity::Current);
        CoreTls { ca, server }
    }

    /// A hub config table trusting this CA for the target `core`.
    pub fn hub_toml(&self) -> String {
        target_tls_toml("core", Some(&self.ca.cert), None)
    }
}

impl Default for CoreTls {
    fn default() -> Self {
        CoreTls::new()
    }
}

/// A `[[target]]` table for `name` with a CA file and a client certificate
/// (either may be absent); the URLs come from `--core-url`.
pub fn target_tls_toml(
    name: &str,
    ca_file: Option<&std::path::Path>,
    client: Option<&Leaf>,
) -> String {
    format!(
        "\n[[target]]\nname = {name:?}\n{}",
        target_tls_lines(ca_file, client)
    )
}

/// The lines of a `[[target]]` table naming a CA file (`ca_file`) and a
/// client certificate (`client_cert_file`, `client_key_file`); either may be
/// absent.
pub fn target_tls_lines(ca_file: Option<&std::path::Path>, client: Option<&Leaf>) -> String {
    let mut t = String::new();
    if let Some(ca) = ca_file {
        t.push_str(&format!("ca_file = {:?}\n", ca.display().to_string()));
    }
    if let Some(c) = client {
        t.push_str(&format!(
            "client_cert_file = {:?}\nclient_key_file = {:?}\n",
            c.cert.display().to_string(),
            c.key.display().to_string()
        ));
    }
    t
}

/// The fixture on a free port, serving HTTPS with `server`'s certificate and
/// key; with `client_ca`, it requires client certificates signed by it.
pub async fn start_core_https(server: &Leaf, client_ca: Option<&std::path::Path>) -> CoreBank {
    let tls = corebank::ServerTls::from_files(&server.cert, &server.key, client_ca)
        .expect("fixture TLS settings");
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fixture");
    corebank::start_https(listener, default_seed(), tls).await
}

/// The fixture in `scheme`; for HTTPS, the test CA that signed its
/// certificate (keep it for the hub's `ca_file`).
pub async fn start_core_as(scheme: CoreScheme) -> (CoreBank, Option<CoreTls>) {
    match scheme {
        CoreScheme::Http => (start_core().await, None),
        CoreScheme::Https => {
            let tls = CoreTls::new();
            let core = start_core_https(&tls.server, None).await;
            (core, Some(tls))
        }
    }
}

/// The fixture with the default seed on a free port.
pub async fn start_core() -> CoreBank {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind fixture");
    corebank::start(listener, default_seed()).await
}

/// A port on 127.0.0.1 with no listener (connect is refused), which a fixture
/// can bind later: "the core is down, then back".
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// Starts the fixture on `port` (the core coming back).
pub async fn start_core_on(port: u16) -> CoreBank {
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("rebind 127.0.0.1:{port} for the fixture: {e}"));
    corebank::start(listener, default_seed()).await
}

/// The POSTs the fixture counted for `guid`.
pub fn posts(core: &CoreBank, guid: &str) -> u64 {
    core.stats().by_guid.get(guid).map(|g| g.post).unwrap_or(0)
}

/// The GETs the fixture counted for `guid`.
pub fn gets(core: &CoreBank, guid: &str) -> u64 {
    core.stats().by_guid.get(guid).map(|g| g.get).unwrap_or(0)
}

/// POSTs and GETs the fixture counted for one GUID.
pub fn calls(core: &CoreBank, guid: &str) -> (u64, u64) {
    core.stats()
        .by_guid
        .get(guid)
        .map(|g| (g.post, g.get))
        .unwrap_or((0, 0))
}

/// A hub with the memory journal on a free port, calling `core_url`.
pub async fn start_hub(core_url: &str, opts: &HubOpts) -> (Daemon, Option<TempFile>) {
    let file = opts.toml.as_deref().map(|t| TempFile::new("toml", t));
    let source = Source {
        file: file.as_ref().map(|f| f.0.clone()),
        overrides: Overrides {
            listen: Some("127.0.0.1:0".into()),
            core_url: Some(
                opts.core_url
                    .clone()
                    .unwrap_or_else(|| core_url.to_string()),
            ),
            budget_ms: opts.budget_ms,
            connect_timeout_ms: opts.connect_timeout_ms,
            journal: Some("memory".into()),
            admin_listen: None,
        },
    };
    let hub = Daemon::start(source).await.expect("hub starts");
    (hub, file)
}

/// A fixture and a hub in front of it.
pub struct Setup {
    pub core: CoreBank,
    pub hub: Daemon,
    _config: Option<TempFile>,
}

pub async fn setup() -> Setup {
    setup_with(HubOpts::default()).await
}

pub async fn setup_with(opts: HubOpts) -> Setup {
    let core = start_core().await;
    let (hub, config) = start_hub(&core.url(), &opts).await;
    Setup {
        core,
        hub,
        _config: config,
    }
}

impl Setup {
    pub fn addr(&self) -> String {
        self.hub.addr.to_string()
    }

    /// A new ascii-prefix connection to the hub.
    pub async fn channel(&self) -> Channel {
        connect(self.hub.addr, PrefixMode::Ascii).await
    }

    /// A new raw TCP connection to the hub.
    pub async fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.hub.addr)
            .await
            .expect("connect to hub");
        s.set_nodelay(true).unwrap();
        s
    }

    /// The fixture's counters for one GUID (zeros when it never saw it).
    pub fn guid_stats(&self, guid: &str) -> GuidStats {
        self.core
            .stats()
            .by_guid
            .get(guid)
            .copied()
            .unwrap_or_default()
    }

    /// POSTs for `guid`, asserting it is the only GUID the fixture saw POSTed.
    pub fn assert_posts(&self, guid: &str, n: u64) {
        let stats = self.core.stats();
        let got = stats.by_guid.get(guid).map(|g| g.post).unwrap_or(0);
        assert_eq!(got, n, "POSTs for {guid}; stats {stats:?}");
    }

    /// Total calls that reached the fixture.
    pub fn assert_calls(&self, post: u64, get: u64) {
        let stats = self.core.stats();
        assert_eq!(
            (stats.post, stats.get),
            (post, get),
            "calls (post, get) that reached the fixture: {stats:?}"
        );
    }

    /// Waits (bounded) until the fixture has counted `n` POSTs for `guid`.
    pub async fn wait_posts(&self, guid: &str, n: u64) {
        let g = guid.to_string();
        within(
            self.core
                .wait_stats(move |s| s.by_guid.get(&g).map(|x| x.post).unwrap_or(0) >= n),
        )
        .await;
    }

    pub fn balance(&self, acc: &str) -> u64 {
        self.core.balance(acc).expect("seed account")
    }
}
