//! TLS on the channel side, with the real binary: a TLS listener beside the
//! plain one, client certificates that are channel ids, the handshake
//! deadline, certificate rotation by SIGHUP (and a bad file refused), and
//! `relayhub send --tls`.
//!
//! Certificates come from a test CA made at test time (`common::certs`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use relayhub::client::{Channel, TlsClient, TlsConnector};
use relayhub::frame::PrefixMode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common;
use crate::resilience_support;

use common::certs::{Leaf, TestCa, Validity};
use common::*;
use resilience_support::*;

/// The hub process with a TLS listener; its TLS address from the ready line,
/// its config and certificate files in `dir`.
struct TlsHub {
    process: HubProcess,
    tls: String,
    admin: String,
    dir: TempDir,
}

impl std::ops::Deref for TlsHub {
    type Target = HubProcess;
    fn deref(&self) -> &HubProcess {
        &self.process
    }
}

impl std::ops::DerefMut for TlsHub {
    fn deref_mut(&mut self) -> &mut HubProcess {
        &mut self.process
    }
}

impl TlsHub {
    /// One counter's value from `/metrics` (0 when absent).
    async fn metric(&self, series: &str) -> f64 {
        let mut s = within(TcpStream::connect(&self.admin)).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut text = String::new();
        within(s.read_to_string(&mut text)).await.unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// A TLS channel connection with `client` (its handshake done as far as
    /// the client can tell).
    async fn tls_channel(&self, client: &TlsConnector) -> std::io::Result<Channel> {
        within(Channel::connect_tls(&self.tls, PrefixMode::Ascii, client)).await
    }
}

/// The certificates of a test: the hub's (for 127.0.0.1), and clients for
/// channels IBANK and CORP, all from one CA.
struct Pki {
    ca: TestCa,
    hub: Leaf,
    ibank: Leaf,
    corp: Leaf,
}

fn pki() -> Pki {
    let ca = TestCa::new("relayhub test channels CA");
    let hub = ca.server("hub", &["127.0.0.1", "localhost"], Validity::Current);
    let ibank = ca.client(
        "ibank",
        "ibank-cn",
        &["ibank.channels.test"],
        Validity::Current,
    );
    // CORP is known by its CN only (no SAN DNS name).
    let corp = ca.client("corp", "corp.channels.test", &[], Validity::Current);
    Pki {
        ca,
        hub,
        ibank,
        corp,
    }
}

fn connector(ca: &Path, client: Option<&Leaf>) -> TlsConnector {
    TlsClient {
        ca_file: ca.to_path_buf(),
        client_cert: client.map(|l| (l.cert.clone(), l.key.clone())),
        server_name: None,
    }
    .connector()
    .expect("client TLS files")
}

/// The config: TLS listener with the hub's certificate (copied to
/// `hub.pem`/`hub.key` in the hub's dir, so it can be rotated there), client
/// certificates `required` from the CA, channels IBANK and CORP by
/// certificate, PLAIN without one.
fn config(
    dir: &TempDir,
    core_url: &str,
    target_extra: &str,
    ca: &Path,
    admin: &str,
    handshake_ms: u64,
) -> String {
    format!(
        "[server]\nadmin_listen = \"{admin}\"\ntls_listen = \"127.0.0.1:0\"\n\
         tls_cert_file = {:?}\ntls_key_file = {:?}\ntls_client_ca_file = {:?}\n\
         tls_client_auth = \"required\"\ntls_handshake_timeout_ms = {handshake_ms}\n\
         {}{}\
         [[channel]]\nid = \"IBANK\"\ncert_names = [\"ibank.channels.test\"]\n\
         [[channel]]\nid = \"CORP\"\ncert_names = [\"CORP.channels.test\"]\n\
         [[channel]]\nid = \"PLAIN\"\n",
        dir.join("hub.pem"),
        dir.join("hub.key"),
        ca,
        target_toml("core", &[core_url], target_extra),
        default_routes_toml("core"),
    )
}

fn install_hub_cert(dir: &TempDir, leaf: &Leaf) {
    std::fs::copy(&leaf.cert, dir.join("hub.pem")).expect("copy hub cert");
    std::fs::copy(&leaf.key, dir.join("hub.key")).expect("copy hub key");
}

async fn start(pki: &Pki, core_url: &str, handshake_ms: u64) -> TlsHub {
    start_with(pki, core_url, "", handshake_ms).await
}

/// [`start`], with `target_extra` lines in the target's table (its TLS files).
async fn start_with(pki: &Pki, core_url: &str, target_extra: &str, handshake_ms: u64) -> TlsHub {
    let dir = TempDir::new("tlshub");
    install_hub_cert(&dir, &pki.hub);
    let admin = format!("127.0.0.1:{}", free_port());
    let path = dir.join("relayhub.toml");
    std::fs::write(
        &path,
        config(
            &dir,
            core_url,
            target_extra,
            &pki.ca.cert,
            &admin,
            handshake_ms,
        ),
    )
    .unwrap();
    let process = HubProcess::spawn(&["--config", &path.display().to_string()]);
    let tls = after(&process.ready_line, "tls on ").unwrap_or_else(|| {
        panic!(
            "the ready line names no TLS listener: {:?}",
            process.ready_line
        )
    });
    TlsHub {
        process,
        tls,
        admin,
        dir,
    }
}

/// True when `client` gets no answer to `telegram` over TLS: refused at the
/// handshake or (TLS 1.3: the client may think its handshake done before the
/// hub checked its certificate) by the alert that ends the connection.
async fn refused(hub: &TlsHub, client: &TlsConnector, telegram: &[u8]) -> bool {
    match hub.tls_channel(client).await {
        Err(_) => true,
        Ok(mut ch) => within(ch.exchange(telegram)).await.is_err(),
    }
}

async fn code_on(ch: &mut Channel, telegram: &[u8]) -> String {
    within(ch.exchange(telegram)).await.expect("an answer").code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_plain_side_by_side_and_a_certificate_is_its_channel() {
    let core = start_core().await;
    let pki = pki();
    let mut hub = start(&pki, &core.url(), 5_000).await;
    assert!(
        hub.ready_line
            .contains(&format!("listening on {}", hub.addr))
            && hub.tls != hub.addr,
        "the ready line names both listeners: {:?}",
        hub.ready_line
    );

    // Over TLS, IBANK's certificate: 0000, one POST.
    let ibank = connector(&pki.ca.cert, Some(&pki.ibank));
    let mut ch = hub.tls_channel(&ibank).await.expect("TLS connect");
    let g = guid("TLSOK");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &g, "IBANK", 1_000)).await,
        "0000"
    );
    assert_eq!(posts(&core, &g), 1);

    // The same connection claiming CORP: E103, nothing sent.
    let other = guid("TLSAB");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &other, "CORP", 1_000)).await,
        "E103"
    );
    assert_eq!(posts(&core, &other), 0, "E103 sends nothing");
    // Nor journaled: the same GUID from its own channel is a first attempt.
    let corp = connector(&pki.ca.cert, Some(&pki.corp));
    let mut corp_ch = hub.tls_channel(&corp).await.expect("TLS connect as CORP");
    assert_eq!(
        code_on(&mut corp_ch, &transfer_as("TRF001", &other, "CORP", 1_000)).await,
        "0000",
        "CORP's certificate (known by its CN) is CORP"
    );
    assert_eq!(posts(&core, &other), 1);
    // The connection is still IBANK's and still works.
    let again = guid("TLSAG");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &again, "IBANK", 1_000)).await,
        "0000"
    );

    // The plain listener answers too: a channel without cert_names calls,
    // a channel with them cannot call without its certificate.
    let mut plain = connect(hub.addr.parse().unwrap(), PrefixMode::Ascii).await;
    let p = guid("PLAIN");
    assert_eq!(
        code_on(&mut plain, &transfer_as("TRF001", &p, "PLAIN", 1_000)).await,
        "0000"
    );
    let spoof = guid("SPOOF");
    assert_eq!(
        code_on(&mut plain, &transfer_as("TRF001", &spoof, "IBANK", 1_000)).await,
        "E103",
        "IBANK without its certificate"
    );
    assert_eq!(posts(&core, &spoof), 0);
    // The log is written off the telegram's path: wait for the line, do not
    // read the file once right after the answer.
    let line = hub
        .wait_log(0, |l| l.contains(&other) && l.contains("E103"))
        .await;
    assert!(
        line.contains("is channel ibank")
            || line.contains("is channel IBANK's, not this channel_id's"),
        "the E103 says whose certificate it was:\n{line}"
    );
}

/// TLS on both sides at once: a channel with its client certificate, a core
/// over HTTPS that requires the hub's client certificate. 0000, one POST.
/// A TLS error after the handshake (here a record that fails its check) is
/// a channel's doing, like a failed handshake: the connection is closed and
/// an INFO line says so (before: closed with no line at all; found by a
/// black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_record_after_the_handshake_is_logged() {
    use relayhub::tls_files;
    let core = start_core().await;
    let pki = pki();
    let mut hub = start(&pki, &core.url(), 5_000).await;
    let config = rustls::ClientConfig::builder_with_provider(tls_files::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(tls_files::read_roots("ca", &pki.ca.cert).unwrap())
        .with_client_auth_cert(
            tls_files::read_certs("cert", &pki.ibank.cert).unwrap(),
            tls_files::read_key("key", &pki.ibank.key).unwrap(),
        )
        .unwrap();
    let tcp = within(TcpStream::connect(&hub.tls)).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls =
        within(tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp))
            .await
            .unwrap();
    // An application-data record of zeros, which no key seals.
    let mut forged = vec![0x17, 0x03, 0x03, 0x00, 0x20];
    forged.extend_from_slice(&[0; 32]);
    tls.get_mut().0.write_all(&forged).await.unwrap();
    let line = hub
        .wait_log(0, |l| l.contains("TLS error from the channel"))
        .await;
    assert!(
        line.contains("INFO") && line.contains("connection closed"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_over_tls_on_both_sides_answers_0000_with_one_post() {
    let core_tls = CoreTls::new();
    let hub_client = core_tls
        .ca
        .client("hub-client", "relayhub", &["hub.test"], Validity::Current);
    let core = start_core_https(&core_tls.server, Some(&core_tls.ca.cert)).await;
    assert!(core.url().starts_with("https://"), "{}", core.url());
    let pki = pki();
    let hub = start_with(
        &pki,
        &core.url(),
        &target_tls_lines(Some(&core_tls.ca.cert), Some(&hub_client)),
        5_000,
    )
    .await;
    let ibank = connector(&pki.ca.cert, Some(&pki.ibank));
    let mut ch = hub.tls_channel(&ibank).await.expect("TLS connect");
    let g = guid("TLS2S");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &g, "IBANK", 1_000)).await,
        "0000"
    );
    assert_eq!(posts(&core, &g), 1);
    assert!(
        core.tls_handshakes().0 >= 1,
        "the core was reached over TLS"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_certificate_the_handshake_is_refused() {
    let core = start_core().await;
    let pki = pki();
    let mut hub = start(&pki, &core.url(), 5_000).await;
    let before = hub
        .metric("relayhub_tls_handshake_failures_total{reason=\"no_client_certificate\"}")
        .await;
    let anonymous = connector(&pki.ca.cert, None);
    let g = guid("NOCRT");
    assert!(
        refused(&hub, &anonymous, &transfer_as("TRF001", &g, "IBANK", 1_000)).await,
        "a client without a certificate got an answer"
    );
    assert_eq!(posts(&core, &g), 0);
    let line = hub
        .wait_log(0, |l| l.contains("TLS handshake failed"))
        .await;
    assert!(line.contains("no_client_certificate"), "{line}");
    assert_eq!(
        hub.metric("relayhub_tls_handshake_failures_total{reason=\"no_client_certificate\"}")
            .await,
        before + 1.0
    );

    // A certificate from another CA is refused too, with its own reason.
    let stranger_ca = TestCa::new("someone else");
    let stranger = stranger_ca.client("x", "ibank.channels.test", &[], Validity::Current);
    let c = connector(&pki.ca.cert, Some(&stranger));
    assert!(refused(&hub, &c, &transfer_as("TRF001", &guid("STRNG"), "IBANK", 1)).await);
    let line = hub
        .wait_log(0, |l| l.contains("bad_client_certificate"))
        .await;
    assert!(line.contains("TLS handshake failed"), "{line}");

    // An expired certificate from the right CA, for IBANK's name: refused too.
    let expired = pki.ca.client(
        "old",
        "ibank.channels.test",
        &["ibank.channels.test"],
        Validity::Expired,
    );
    let c = connector(&pki.ca.cert, Some(&expired));
    assert!(refused(&hub, &c, &transfer_as("TRF001", &guid("EXPRD"), "IBANK", 1)).await);
    let line = hub
        .wait_log(1, |l| l.contains("bad_client_certificate"))
        .await;
    assert!(
        line.contains("the client certificate was refused: certificate expired"),
        "{line}"
    );
    assert_eq!(
        hub.metric("relayhub_tls_handshake_failures_total{reason=\"bad_client_certificate\"}")
            .await,
        2.0
    );
    assert_eq!(core.stats().post, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_client_is_closed_at_the_handshake_deadline() {
    let core = start_core().await;
    let pki = pki();
    let mut hub = start(&pki, &core.url(), 300).await;
    // Taken before the connect: the hub's clock starts at its accept, later.
    let opened = Instant::now();
    let mut silent = within(TcpStream::connect(&hub.tls)).await.unwrap();
    let mut buf = [0u8; 64];
    let n = within(silent.read(&mut buf))
        .await
        .expect("closed, not reset");
    assert_eq!(n, 0, "the hub closes a silent handshake without a byte");
    assert!(
        opened.elapsed() >= Duration::from_millis(300),
        "closed before the deadline: {:?}",
        opened.elapsed()
    );
    let line = hub
        .wait_log(0, |l| l.contains("TLS handshake failed"))
        .await;
    assert!(line.contains("timeout"), "{line}");
    assert_eq!(
        hub.metric("relayhub_tls_handshake_failures_total{reason=\"timeout\"}")
            .await,
        1.0
    );
    // A slow sender of a handshake is the same: half a ClientHello, then nothing.
    let mut slow = within(TcpStream::connect(&hub.tls)).await.unwrap();
    slow.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    assert_eq!(within(slow.read(&mut buf)).await.unwrap_or(0), 0);
    hub.wait_log(1, |l| {
        l.contains("TLS handshake failed") && l.contains("timeout")
    })
    .await;

    // A plain channel on the TLS port: its telegram is no handshake; closed,
    // nothing forwarded.
    let g = guid("PLNTL");
    let mut plain = within(TcpStream::connect(&hub.tls)).await.unwrap();
    let telegram = transfer_as("TRF001", &g, "PLAIN", 1);
    let mut framed = format!("{:04}", telegram.len()).into_bytes();
    framed.extend_from_slice(&telegram);
    plain.write_all(&framed).await.unwrap();
    let mut answer = Vec::new();
    let _ = within(plain.read_to_end(&mut answer)).await;
    assert!(
        !answer.starts_with(b"0"),
        "a telegram answer on the TLS port: {answer:?}"
    );
    let line = hub
        .wait_log(0, |l| {
            l.contains("TLS handshake failed") && l.contains("protocol")
        })
        .await;
    assert!(line.contains("TLS error"), "{line}");
    assert_eq!(posts(&core, &g), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_the_certificate_for_the_next_connection_and_open_ones_go_on() {
    let core = start_core().await;
    let pki = pki();
    let mut hub = start(&pki, &core.url(), 5_000).await;
    let old_trust = connector(&pki.ca.cert, Some(&pki.ibank));
    let mut open = hub.tls_channel(&old_trust).await.expect("TLS connect");
    assert_eq!(
        code_on(&mut open, &transfer_as("TRF001", &guid("ROT1"), "IBANK", 1)).await,
        "0000"
    );

    // The new certificate comes from another CA, so a client can tell them apart.
    let new_ca = TestCa::new("relayhub test CA, next year");
    let new_leaf = new_ca.server("hub2", &["127.0.0.1"], Validity::Current);
    install_hub_cert(&hub.dir, &new_leaf);
    hub.signal("HUP");
    hub.wait_log(0, |l| {
        l.contains("TLS certificate, key and client CA re-read")
    })
    .await;

    // The next connection gets the new certificate: trusted by the new CA only.
    let new_trust = connector(&new_ca.cert, Some(&pki.ibank));
    let mut next = hub.tls_channel(&new_trust).await.expect("new certificate");
    assert_eq!(
        code_on(&mut next, &transfer_as("TRF001", &guid("ROT2"), "IBANK", 1)).await,
        "0000"
    );
    assert!(
        hub.tls_channel(&old_trust).await.is_err(),
        "a new connection still got the old certificate"
    );
    // The connection opened before the reload keeps working.
    assert_eq!(
        code_on(&mut open, &transfer_as("TRF001", &guid("ROT3"), "IBANK", 1)).await,
        "0000"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_certificate_file_on_reload_is_refused_and_the_old_one_stays() {
    let core = start_core().await;
    let pki = pki();
    let mut hub = start(&pki, &core.url(), 5_000).await;
    let trust = connector(&pki.ca.cert, Some(&pki.ibank));
    let cert_path = hub.dir.join("hub.pem");
    let refused = |l: &str| l.contains("reload refused");

    // Not PEM at all.
    std::fs::write(&cert_path, "this is not a certificate\n").unwrap();
    hub.signal("HUP");
    let line = hub.wait_log(0, refused).await;
    assert!(
        line.contains("server.tls_cert_file") && line.contains(&cert_path.display().to_string()),
        "the refusal names the key and the file: {line}"
    );
    let mut ch = hub
        .tls_channel(&trust)
        .await
        .expect("the old certificate is served");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &guid("BAD1"), "IBANK", 1)).await,
        "0000"
    );

    // A key that is not the certificate's.
    install_hub_cert(&hub.dir, &pki.hub);
    std::fs::copy(&pki.corp.key, hub.dir.join("hub.key")).unwrap();
    hub.signal("HUP");
    let line = hub.wait_log(1, refused).await;
    assert!(
        line.contains("server.tls_key_file") && line.contains("does not belong"),
        "{line}"
    );
    assert_eq!(hub.log_count(|l| l.contains("re-read")), 0);
    assert_eq!(
        hub.metric("relayhub_config_reloads_total{result=\"refused\"}")
            .await,
        2.0
    );
    let mut ch = hub
        .tls_channel(&trust)
        .await
        .expect("the old certificate is served");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &guid("BAD2"), "IBANK", 1)).await,
        "0000"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayhub_send_speaks_tls_with_a_client_certificate() {
    let core = start_core().await;
    let pki = pki();
    let hub = start(&pki, &core.url(), 5_000).await;
    let g = guid("SENDT");
    let run = |channel: &str, with_cert: bool| {
        let mut cmd = Command::new(relayhub_bin());
        cmd.args(["send", "--to", &hub.tls, "--tls", "--guid", &g, "--channel", channel])
            .arg("--ca")
            .arg(&pki.ca.cert)
            .args([
                "--json",
                &format!(r#"{{"from_account":"{ACC1}","to_bank":"{BANK}","to_account":"{ACC2}","amount":1000,"memo":"tls"}}"#),
            ]);
        if with_cert {
            cmd.arg("--client-cert")
                .arg(&pki.ibank.cert)
                .arg("--client-key")
                .arg(&pki.ibank.key);
        }
        cmd.output().expect("run relayhub send")
    };
    let out = run("IBANK", true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("{g} IBANK")) && stdout.contains(" 0000 "),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(posts(&core, &g), 1);
    // Without the certificate the hub refuses the handshake: no answer, exit
    // non-zero, and no second handshake after the last telegram (before, a
    // reconnect for nothing, counted as a second refused handshake).
    let refusals = "relayhub_tls_handshake_failures_total{reason=\"no_client_certificate\"}";
    let before = hub.metric(refusals).await;
    let out = run("IBANK", false);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(posts(&core, &g), 1);
    // The refusal is counted once the hub has read the empty certificate;
    // a later exchange's answer shows it has (its handshake came after).
    let out = run("IBANK", true);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(hub.metric(refusals).await, before + 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayhub_bench_speaks_tls_idle_connections_included() {
    let core = start_core().await;
    let pki = pki();
    let hub = start(&pki, &core.url(), 5_000).await;
    let out = tokio::task::spawn_blocking({
        let (tls, ca, cert, key) = (
            hub.tls.clone(),
            pki.ca.cert.clone(),
            pki.ibank.cert.clone(),
            pki.ibank.key.clone(),
        );
        move || {
            Command::new(relayhub_bin())
                .args(["bench", "--to", &tls, "--tls", "--channel", "IBANK"])
                .args(["-n", "20", "-c", "2", "--idle-connections", "3"])
                .args(["--idle-hold", "10ms", "--json"])
                .arg("--ca")
                .arg(ca)
                .arg("--client-cert")
                .arg(cert)
                .arg("--client-key")
                .arg(key)
                .output()
                .expect("run relayhub bench")
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("JSON report");
    assert_eq!(report["codes"]["0000"], 20, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(core.stats().post, 20);
    // The idle connections finished their handshakes: none timed out or failed.
    assert_eq!(hub.log_count(|l| l.contains("TLS handshake failed")), 0);
}

/// `tls_client_auth = "optional"` (in-process hub): a client without a
/// certificate finishes the handshake and calls as a channel without
/// `cert_names`, never as one with them; a certificate still maps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn optional_client_certificates_let_plain_channels_in_over_tls() {
    let core = start_core().await;
    let pki = pki();
    let toml = format!(
        "[server]\ntls_listen = \"127.0.0.1:0\"\ntls_cert_file = {:?}\ntls_key_file = {:?}\n\
         tls_client_ca_file = {:?}\ntls_client_auth = \"optional\"\n{}{}\
         [[channel]]\nid = \"IBANK\"\ncert_names = [\"ibank.channels.test\"]\n\
         [[channel]]\nid = \"PLAIN\"\n",
        pki.hub.cert,
        pki.hub.key,
        pki.ca.cert,
        target_toml("core", &[&core.url()], ""),
        default_routes_toml("core"),
    );
    let hub = start_file_hub(&toml).await;
    let tls = hub.daemon.tls_addr.expect("a TLS listener").to_string();
    let anonymous = connector(&pki.ca.cert, None);
    let mut ch = within(Channel::connect_tls(&tls, PrefixMode::Ascii, &anonymous))
        .await
        .expect("handshake without a certificate");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &guid("OPT1"), "PLAIN", 1)).await,
        "0000"
    );
    let g = guid("OPT2");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &g, "IBANK", 1)).await,
        "E103"
    );
    assert_eq!(posts(&core, &g), 0);
    let ibank = connector(&pki.ca.cert, Some(&pki.ibank));
    let mut ch = within(Channel::connect_tls(&tls, PrefixMode::Ascii, &ibank))
        .await
        .expect("handshake with a certificate");
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &g, "IBANK", 1)).await,
        "0000"
    );
    assert_eq!(
        code_on(&mut ch, &transfer_as("TRF001", &guid("OPT3"), "PLAIN", 1)).await,
        "E103"
    );
}

/// `relayhub check` reads every TLS file as `serve` would: the listener's
/// certificate, key and client CA, and a target's CA and client certificate
/// and key. Each one spoiled alone fails the check, naming its key and file.
#[test]
fn relayhub_check_reads_every_tls_file() {
    let pki = pki();
    let core_ca = TestCa::new("core CA");
    let to_core = core_ca.client("to-core", "relayhub", &["relayhub.test"], Validity::Current);
    let dir = TempDir::new("tlscheck");
    let files: Vec<(&str, std::path::PathBuf)> = [
        ("server.tls_cert_file", &pki.hub.cert),
        ("server.tls_key_file", &pki.hub.key),
        ("server.tls_client_ca_file", &pki.ca.cert),
        ("ca_file", &core_ca.cert),
        ("client_cert_file", &to_core.cert),
        ("client_key_file", &to_core.key),
    ]
    .into_iter()
    .map(|(key, from)| {
        let copy = dir.join(&format!("{key}.pem"));
        std::fs::copy(from, &copy).expect("copy a TLS file");
        (key, copy)
    })
    .collect();
    let path = |i: usize| format!("{:?}", files[i].1.display().to_string());
    let config = dir.join("relayhub.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ntls_listen = \"127.0.0.1:0\"\ntls_cert_file = {}\ntls_key_file = {}\n\
             tls_client_ca_file = {}\n{}{}\
             [[channel]]\nid = \"IBANK\"\ncert_names = [\"ibank.channels.test\"]\n",
            path(0),
            path(1),
            path(2),
            target_toml(
                "core",
                &["https://127.0.0.1:1"],
                &format!(
                    "ca_file = {}\nclient_cert_file = {}\nclient_key_file = {}",
                    path(3),
                    path(4),
                    path(5)
                ),
            ),
            default_routes_toml("core"),
        ),
    )
    .unwrap();
    let check = || {
        let out = Command::new(relayhub_bin())
            .arg("check")
            .arg("--config")
            .arg(&config)
            .output()
            .expect("run relayhub check");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = check();
    assert!(ok && text.contains("config OK"), "{text}");
    for (key, file) in &files {
        let good = std::fs::read(file).unwrap();
        std::fs::write(file, "not PEM at all\n").unwrap();
        let (ok, text) = check();
        assert!(
            !ok && text.contains(&format!("{key} ({})", file.display())),
            "{key} spoiled: {text}"
        );
        std::fs::write(file, good).unwrap();
    }
    let (ok, text) = check();
    assert!(ok, "{text}");
}
