//! TLS to the core, end to end with the real `relayhub serve` and the fixture
//! serving HTTPS with certificates made by a test CA:
//!
//! - a transfer over HTTPS answers 0000 with one POST;
//! - an unknown CA, an expired certificate and a certificate for another name
//!   each answer E902 with no POST at the core (the fixture saw the handshake
//!   fail), and the hub's log names the cause; the next URL is tried;
//! - a core that requires a client certificate works with one and answers
//!   E902 without one (or with one it does not trust);
//! - SIGHUP re-reads the CA and client certificate files: new connections use
//!   the new ones; a bad file is refused with its name and the old ones stay.

use crate::common;
use crate::resilience_support;

use std::path::Path;

use common::certs::{Leaf, TestCa, Validity};
use common::*;
use corebank::{CoreBank, FaultMethod, FaultRule, Phase};
use relayhub::client::Answer;
use relayhub::frame::PrefixMode;
use relayhub::tls_files;
use resilience_support::*;
use std::sync::{Arc, Mutex};

const AMOUNT: u64 = 1_000;

/// A hub process calling `urls` (the target `core`), with `tls` lines added
/// to the target's table; its config file lives in `dir`.
fn hub(dir: &TempDir, urls: &[&str], tls: &str) -> HubProcess {
    let config = dir.join("relayhub.toml");
    let urls: Vec<String> = urls.iter().map(|u| format!("{u:?}")).collect();
    std::fs::write(
        &config,
        format!(
            "[journal]\nresend_cooldown_ms = 0\n[[target]]\nname = \"core\"\nurls = [{}]\n{tls}",
            urls.join(", ")
        ),
    )
    .expect("write hub config");
    HubProcess::spawn(&["--config", &config.display().to_string()])
}

async fn send(hub: &HubProcess, telegram: &[u8]) -> Answer {
    let mut ch = connect(hub.addr.parse().expect("hub addr"), PrefixMode::Ascii).await;
    exchange(&mut ch, telegram).await
}

/// The transfer is E902, nothing reached the core, the fixture saw a failed
/// handshake, and the hub logged the handshake failure naming `cause`.
async fn assert_not_sent_because(hub: &mut HubProcess, core: &CoreBank, tag: &str, cause: &str) {
    let failed_before = core.tls_handshakes().1;
    let g = guid(tag);
    let a = send(hub, &transfer(&g, AMOUNT)).await;
    if a.code != "E902" {
        hub.wait_log(0, |l| l.contains(&g)).await;
        panic!("{a:?}\nhub log:\n{}", hub.stderr());
    }
    assert_header_only(&a, "TRF001", &g, "E902");
    assert_eq!(posts(core, &g), 0, "no POST may reach the core");
    assert_eq!(core.stats().post, 0, "no POST at all: {:?}", core.stats());
    within(core.wait_tls_handshakes(|_, failed| failed > failed_before)).await;
    hub.wait_log(0, |l| {
        l.contains("TLS handshake with the core failed") && l.contains(cause)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_over_https_answers_0000_with_one_post() {
    let ca = TestCa::new("core CA");
    let server = ca.server("core", &["localhost", "127.0.0.1"], Validity::Current);
    let core = start_core_https(&server, None).await;
    let dir = TempDir::new("tlsok");
    // By name: SNI and the name check use `localhost`.
    let hub = hub(
        &dir,
        &[&core.url_for_host("localhost")],
        &target_tls_lines(Some(&ca.cert), None),
    );
    let g = guid("TLSOK");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    assert_eq!(a.code, "0000", "{a:?}\nhub log:\n{}", hub.stderr());
    assert_eq!(posts(&core, &g), 1);
    let (ok, failed) = core.tls_handshakes();
    assert!(
        ok >= 1 && failed == 0,
        "handshakes ok {ok}, failed {failed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_ca_is_e902_with_no_post_and_logged_as_unknown_issuer() {
    let ca = TestCa::new("core CA");
    let other = TestCa::new("someone else's CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    let core = start_core_https(&server, None).await;
    let dir = TempDir::new("tlsca");
    let mut hub = hub(
        &dir,
        &[&core.url()],
        &target_tls_lines(Some(&other.cert), None),
    );
    assert_not_sent_because(&mut hub, &core, "TLSCA", "unknown issuer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_e902_with_no_post_and_logged_as_expired() {
    let ca = TestCa::new("core CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Expired);
    let core = start_core_https(&server, None).await;
    let dir = TempDir::new("tlsexp");
    let mut hub = hub(
        &dir,
        &[&core.url()],
        &target_tls_lines(Some(&ca.cert), None),
    );
    assert_not_sent_because(&mut hub, &core, "TLSEXP", "certificate expired").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_e902_with_no_post_and_logged_as_such() {
    let ca = TestCa::new("core CA");
    let server = ca.server("core", &["core.example"], Validity::Current);
    let core = start_core_https(&server, None).await;
    let dir = TempDir::new("tlsname");
    let mut hub = hub(
        &dir,
        &[&core.url()],
        &target_tls_lines(Some(&ca.cert), None),
    );
    assert_not_sent_because(&mut hub, &core, "TLSNAME", "certificate not valid for name").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_handshake_fails_over_to_the_next_url() {
    let ca = TestCa::new("core CA");
    let expired = ca.server("stale", &["127.0.0.1"], Validity::Expired);
    let current = ca.server("core", &["127.0.0.1"], Validity::Current);
    let stale_core = start_core_https(&expired, None).await;
    let core = start_core_https(&current, None).await;
    let dir = TempDir::new("tlsfail");
    let hub = hub(
        &dir,
        &[&stale_core.url(), &core.url()],
        &target_tls_lines(Some(&ca.cert), None),
    );
    let g = guid("TLSFO");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    assert_eq!(a.code, "0000", "{a:?}\nhub log:\n{}", hub.stderr());
    assert_eq!(stale_core.stats().post, 0);
    assert_eq!(posts(&core, &g), 1);
    assert!(
        stale_core.tls_handshakes().1 >= 1,
        "the first URL was tried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_requiring_a_client_certificate_works_with_one_and_is_e902_without() {
    let ca = TestCa::new("core CA");
    let clients = TestCa::new("client CA");
    let stranger = TestCa::new("a CA the core does not trust");
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    let good = clients.client("hub", "relayhub", &["relayhub.test"], Validity::Current);
    let unknown = stranger.client("hub-x", "relayhub", &["relayhub.test"], Validity::Current);
    let core = start_core_https(&server, Some(&clients.cert)).await;

    let dir = TempDir::new("mtlsok");
    let with = hub(
        &dir,
        &[&core.url()],
        &target_tls_lines(Some(&ca.cert), Some(&good)),
    );
    let g = guid("MTLSOK");
    let a = send(&with, &transfer(&g, AMOUNT)).await;
    assert_eq!(a.code, "0000", "{a:?}\nhub log:\n{}", with.stderr());
    assert_eq!(posts(&core, &g), 1);
    drop(with);
    core.reset(None).expect("reset the fixture's counters");

    let dir = TempDir::new("mtlsno");
    let mut without = hub(
        &dir,
        &[&core.url()],
        &target_tls_lines(Some(&ca.cert), None),
    );
    assert_not_sent_because(
        &mut without,
        &core,
        "MTLSNO",
        "the core requires a client certificate",
    )
    .await;
    drop(without);

    let dir = TempDir::new("mtlsbad");
    let mut untrusted = hub(
        &dir,
        &[&core.url()],
        &target_tls_lines(Some(&ca.cert), Some(&unknown)),
    );
    assert_not_sent_because(
        &mut untrusted,
        &core,
        "MTLSBAD",
        "the core refused the handshake",
    )
    .await;
}

/// Sends a transfer the fixture holds (so the hub's pooled connection is
/// busy), then another one, which must open a new connection: returns the
/// second answer.
async fn answer_on_a_new_connection(hub: &HubProcess, core: &CoreBank, tag: &str) -> Answer {
    let held = guid(&format!("{tag}H"));
    core.add_fault(
        FaultRule::guid(&held)
            .method(FaultMethod::Post)
            .delay_ms(1_000)
            .phase(Phase::BeforeApply),
    );
    let mut first = connect(hub.addr.parse().unwrap(), PrefixMode::Ascii).await;
    within(first.send(&transfer(&held, AMOUNT)))
        .await
        .expect("send");
    within(core.wait_received(&held)).await;
    let (ok_before, _) = core.tls_handshakes();
    let g = guid(tag);
    let a = send(hub, &transfer(&g, AMOUNT)).await;
    assert!(
        core.tls_handshakes().0 > ok_before || a.code != "0000",
        "the second transfer had a new connection"
    );
    let first = Answer::parse(&within(first.recv()).await.unwrap().unwrap()).unwrap();
    assert_eq!(first.code, "0000", "{first:?}");
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_the_ca_file_and_a_bad_one_is_refused_with_its_name() {
    let ca = TestCa::new("core CA");
    let other = TestCa::new("old CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    let core = start_core_https(&server, None).await;
    let dir = TempDir::new("tlsrot");
    let ca_file = dir.join("core-ca.pem");
    std::fs::copy(&other.cert, &ca_file).unwrap();
    let mut hub = hub(
        &dir,
        &[&core.url()],
        &target_tls_lines(Some(&ca_file), None),
    );

    let a = send(&hub, &transfer(&guid("ROT1"), AMOUNT)).await;
    assert_eq!(a.code, "E902", "{a:?}");

    // The right CA, by SIGHUP: the next call trusts the core.
    std::fs::copy(&ca.cert, &ca_file).unwrap();
    hub.signal("HUP");
    hub.wait_log(0, |l| {
        l.contains("new certificate files of the target in force")
    })
    .await;
    let g = guid("ROT2");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    assert_eq!(a.code, "0000", "{a:?}\nhub log:\n{}", hub.stderr());
    assert_eq!(posts(&core, &g), 1);

    // A bad file is refused, named, and the CA in force stays, also for a new
    // connection.
    std::fs::write(&ca_file, "not a certificate\n").unwrap();
    hub.signal("HUP");
    let name = ca_file.display().to_string();
    hub.wait_log(0, |l| {
        l.contains("reload refused") && l.contains(&name) && l.contains("no PEM certificate")
    })
    .await;
    let a = answer_on_a_new_connection(&hub, &core, "ROT3").await;
    assert_eq!(a.code, "0000", "{a:?}\nhub log:\n{}", hub.stderr());

    // Rotated back to a CA that did not sign the core: pooled connections made
    // with the old files are not reused, so the very next call fails the
    // handshake and sends nothing.
    std::fs::copy(&other.cert, &ca_file).unwrap();
    hub.signal("HUP");
    hub.wait_log(1, |l| {
        l.contains("new certificate files of the target in force")
    })
    .await;
    let posts_before = core.stats().post;
    let a = send(&hub, &transfer(&guid("ROT4"), AMOUNT)).await;
    assert_eq!(a.code, "E902", "{a:?}");
    assert_eq!(core.stats().post, posts_before, "nothing was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rotates_the_client_certificate_and_a_mismatched_key_is_refused() {
    let ca = TestCa::new("core CA");
    let clients = TestCa::new("client CA");
    let stranger = TestCa::new("retired client CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    let core = start_core_https(&server, Some(&clients.cert)).await;
    let old = stranger.client("old", "relayhub", &["relayhub.test"], Validity::Current);
    let new = clients.client("new", "relayhub", &["relayhub.test"], Validity::Current);
    let other = clients.client("other", "relayhub", &["relayhub.test"], Validity::Current);

    let dir = TempDir::new("mtlsrot");
    let live = Leaf {
        cert: dir.join("hub.pem"),
        key: dir.join("hub.key"),
    };
    std::fs::copy(&old.cert, &live.cert).unwrap();
    std::fs::copy(&old.key, &live.key).unwrap();
    let mut hub = hub(
        &dir,
        &[&core.url()],
        &target_tls_lines(Some(&ca.cert), Some(&live)),
    );

    let a = send(&hub, &transfer(&guid("CROT1"), AMOUNT)).await;
    assert_eq!(a.code, "E902", "{a:?}");
    assert_eq!(core.stats().post, 0);

    std::fs::copy(&new.cert, &live.cert).unwrap();
    std::fs::copy(&new.key, &live.key).unwrap();
    hub.signal("HUP");
    hub.wait_log(0, |l| {
        l.contains("new certificate files of the target in force")
    })
    .await;
    let g = guid("CROT2");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    assert_eq!(a.code, "0000", "{a:?}\nhub log:\n{}", hub.stderr());
    assert_eq!(posts(&core, &g), 1);

    // Half a rotation (the new key with the old certificate) is refused.
    std::fs::copy(&other.key, &live.key).unwrap();
    hub.signal("HUP");
    let key_name = live.key.display().to_string();
    hub.wait_log(0, |l| {
        l.contains("reload refused") && l.contains(&key_name) && l.contains("does not go with")
    })
    .await;
    let a = answer_on_a_new_connection(&hub, &core, "CROT3").await;
    assert_eq!(a.code, "0000", "{a:?}\nhub log:\n{}", hub.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_ca_file_stops_the_start_with_its_name() {
    let dir = TempDir::new("tlsmiss");
    let config = dir.join("relayhub.toml");
    let missing = dir.join("nowhere-ca.pem");
    std::fs::write(
        &config,
        format!(
            "[[target]]\nname = \"core\"\nurls = [\"https://127.0.0.1:1\"]\nca_file = {:?}\n",
            missing.display().to_string()
        ),
    )
    .unwrap();
    let out = std::process::Command::new(relayhub_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--journal",
            "memory",
            "--config",
        ])
        .arg(&config)
        .output()
        .expect("run relayhub");
    assert!(!out.status.success(), "started with a missing CA file");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("target core")
            && stderr.contains("ca_file")
            && stderr.contains(&missing.display().to_string()),
        "{stderr}"
    );
}

/// The gate is above TLS: a core that takes the connection but never answers
/// the handshake is "not sent" (E902) when the connect timeout ends it, like a
/// connect that never completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_silent_during_the_handshake_is_e902() {
    let ca = TestCa::new("core CA");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts and keeps every connection without a byte in return.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            match s {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
    });
    let dir = TempDir::new("tlssilent");
    let mut hub = hub(
        &dir,
        &[&format!("https://{addr}")],
        &target_tls_lines(Some(&ca.cert), None),
    );
    let g = guid("TLSSIL");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    assert_header_only(&a, "TRF001", &g, "E902");
    hub.wait_log(0, |l| {
        l.contains("TLS handshake with the core failed") && l.contains("handshake timed out")
    })
    .await;
}

/// Over plain HTTP a connection closed at once by something in front of the
/// core may have taken the request (E901). Over TLS the hub writes no request
/// byte before the handshake is done, so the same close is "not sent": E902.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_before_the_handshake_ends_is_e902() {
    let ca = TestCa::new("core CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    let core = start_core_https(&server, None).await;
    let proxy = Proxy::start(core.addr()).await;
    proxy.set_mode(ProxyMode::CloseNew);
    proxy.mode_applied().await;
    let dir = TempDir::new("tlsclose");
    let mut hub = hub(
        &dir,
        &[&format!("https://{}", proxy.addr)],
        &target_tls_lines(Some(&ca.cert), None),
    );
    let g = guid("TLSCLO");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    assert_header_only(&a, "TRF001", &g, "E902");
    assert_eq!(core.stats().post, 0);
    hub.wait_log(0, |l| {
        l.contains("TLS handshake with the core failed")
            && l.contains("connection closed during the handshake")
    })
    .await;
}

/// An `https://` URL naming a plain-HTTP core: what answers is no TLS
/// record. Not sent (E902), logged as `the core's side does not speak TLS`
/// (before, `handshake failed`, cause `other`; found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_url_on_a_plain_http_core_is_named_as_such() {
    let ca = TestCa::new("core CA");
    let core = start_core().await;
    let dir = TempDir::new("tlsplain");
    let mut hub = hub(
        &dir,
        &[&format!("https://{}", core.addr())],
        &target_tls_lines(Some(&ca.cert), None),
    );
    let g = guid("TLSPLN");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    assert_header_only(&a, "TRF001", &g, "E902");
    assert_eq!(core.stats().post, 0);
    hub.wait_log(0, |l| {
        l.contains("TLS handshake with the core failed")
            && l.contains("the core's side does not speak TLS")
    })
    .await;
}

/// The fixture as a process serves HTTPS with `--tls-cert`/`--tls-key`, and
/// with `--tls-client-ca` takes only clients with a certificate of that CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixture_binary_serves_https_and_requires_client_certificates_when_told() {
    let ca = TestCa::new("core CA");
    let clients = TestCa::new("client CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    let client = clients.client("hub", "relayhub", &["relayhub.test"], Validity::Current);
    let path = |p: &Path| p.display().to_string();
    let core = spawn_ready(
        &corebank_bin(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            &path(&server.cert),
            "--tls-key",
            &path(&server.key),
            "--tls-client-ca",
            &path(&clients.cert),
        ],
    );
    let url = format!("https://{}", core.addr);

    let dir = TempDir::new("binmtls");
    let with = hub(
        &dir,
        &[&url],
        &target_tls_lines(Some(&ca.cert), Some(&client)),
    );
    let a = send(&with, &transfer(&guid("BINOK"), AMOUNT)).await;
    assert_eq!(a.code, "0000", "{a:?}\nhub log:\n{}", with.stderr());

    let dir = TempDir::new("binnocert");
    let without = hub(&dir, &[&url], &target_tls_lines(Some(&ca.cert), None));
    let a = send(&without, &transfer(&guid("BINNO"), AMOUNT)).await;
    assert_eq!(a.code, "E902", "{a:?}\nhub log:\n{}", without.stderr());
}

/// What a [`head_reading_core`] does once it has read a request head.
enum AfterHead {
    /// Cuts the connection: a reset (RST) when the head contains `TLSRST`,
    /// else a close without a TLS close (FIN).
    Cut,
    /// Sends a fatal alert of this description, sealed under its traffic
    /// key as its TLS stack would (its config must offer only
    /// TLS13_AES_128_GCM_SHA256 and allow secret extraction), and closes.
    SealedAlert(u8),
}

/// A bare TLS server on a free port standing in for a core: for each
/// connection that completes the handshake it reads the request head, keeps
/// it, then does `after`. Returns its address and the heads it read.
async fn head_reading_core(
    config: rustls::ServerConfig,
    after: AfterHead,
) -> (String, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = heads.clone();
    let alert = match after {
        AfterHead::Cut => None,
        AfterHead::SealedAlert(description) => Some(description),
    };
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let reset = head.contains("TLSRST");
                seen.lock().unwrap().push(head);
                if let Some(description) = alert {
                    // The tickets are out before the alert.
                    tls.flush().await.unwrap();
                    let (mut tcp, conn) = tls.into_inner();
                    let secrets = conn.dangerous_extract_secrets().unwrap();
                    let (seq, rustls::ConnectionTrafficSecrets::Aes128Gcm { key, iv }) = secrets.tx
                    else {
                        panic!("the one suite offered");
                    };
                    let record = sealed_alert(key.as_ref(), iv.as_ref(), seq, description);
                    tcp.write_all(&record).await.unwrap();
                    return;
                }
                let (tcp, _) = tls.into_inner();
                if reset {
                    tcp.set_zero_linger().expect("SO_LINGER 0");
                }
                drop(tcp);
            });
        }
    });
    (format!("https://{addr}"), heads)
}

/// The POST heads for `g` among `heads`.
fn posts_read(heads: &Mutex<Vec<String>>, g: &str) -> usize {
    heads
        .lock()
        .unwrap()
        .iter()
        .filter(|h| h.starts_with("POST ") && h.contains(g))
        .count()
}

/// The one rule over TLS: a core that took the handshake and read the request
/// head, then resets the connection (RST) or closes it without a TLS close
/// (FIN), may have taken the request in. Both are E901 on a fresh TLS 1.3
/// connection that has read no answer byte, never the "not sent" of a
/// refused handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_that_reads_the_request_then_resets_or_closes_is_e901() {
    let ca = TestCa::new("core CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    let config = tls_files::server_builder()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            tls_files::read_certs("cert", &server.cert).unwrap(),
            tls_files::read_key("key", &server.key).unwrap(),
        )
        .unwrap();
    let (url, heads) = head_reading_core(config, AfterHead::Cut).await;
    let dir = TempDir::new("tlsrst");
    let hub = hub(&dir, &[&url], &target_tls_lines(Some(&ca.cert), None));
    for tag in ["TLSRST", "TLSFIN"] {
        let g = guid(tag);
        let a = send(&hub, &transfer(&g, AMOUNT)).await;
        assert_eq!(
            posts_read(&heads, &g),
            1,
            "the core read the POST of {g} once"
        );
        if a.code != "E901" {
            panic!("{tag}: {a:?}\nhub log:\n{}", hub.stderr());
        }
        assert_header_only(&a, "TRF001", &g, "E901");
    }
    assert_eq!(
        hub.log_count(|l| l.contains("TLS handshake with the core failed")),
        0,
        "judged a refused handshake:\n{}",
        hub.stderr()
    );
}

/// A TLS 1.3 core standing in for a gateway with a policy: it completes the
/// handshake (its session tickets go out with it), reads the request head,
/// keeps it, then sends a fatal `access_denied` alert and closes. Returns
/// its address and the heads it read.
async fn alerting_core(ca: &TestCa) -> (String, Arc<Mutex<Vec<String>>>) {
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    // One cipher suite, so that the alert is sealed with a known AEAD.
    let provider = rustls::crypto::CryptoProvider {
        cipher_suites: vec![rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256],
        ..rustls::crypto::ring::default_provider()
    };
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            tls_files::read_certs("cert", &server.cert).unwrap(),
            tls_files::read_key("key", &server.key).unwrap(),
        )
        .unwrap();
    config.enable_secret_extraction = true;
    assert!(config.send_tls13_tickets > 0, "the core sends tickets");
    // access_denied.
    head_reading_core(config, AfterHead::SealedAlert(49)).await
}

/// A TLS 1.3 record holding a fatal alert `description`, sealed with
/// AES-128-GCM under `key` and `iv` as record number `seq` (RFC 8446 5.2-5.3).
fn sealed_alert(key: &[u8], iv: &[u8], seq: u64, description: u8) -> Vec<u8> {
    use ring::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, key).unwrap());
    let mut nonce = [0u8; 12];
    nonce.copy_from_slice(iv);
    for (n, s) in nonce[4..].iter_mut().zip(seq.to_be_bytes()) {
        *n ^= s;
    }
    // The alert (fatal, description), then its content type (21).
    let mut record = vec![2, description, 21];
    let len = u16::try_from(record.len() + AES_128_GCM.tag_len()).unwrap();
    let header = [23, 3, 3, (len >> 8) as u8, len as u8];
    key.seal_in_place_append_tag(
        Nonce::assume_unique_for_key(nonce),
        Aad::from(header),
        &mut record,
    )
    .unwrap();
    [header.as_slice(), &record].concat()
}

/// The one rule over TLS: an alert of the kind that refuses a handshake
/// (`access_denied`), read after the core's TLS showed that it took the
/// handshake (its session tickets), may follow a request the core passed
/// on: E901, and the POST read once, never the "not sent" of a refused
/// handshake, which posted the GUID again with each connect attempt and
/// each resend (found by a black-box probe: six POSTs of one GUID).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handshake_alert_after_the_core_took_the_handshake_is_e901() {
    let ca = TestCa::new("core CA");
    let (url, heads) = alerting_core(&ca).await;
    let dir = TempDir::new("tlsalert");
    let hub = hub(&dir, &[&url], &target_tls_lines(Some(&ca.cert), None));
    let g = guid("TLSALERT");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    if a.code != "E901" {
        panic!("{a:?}\nhub log:\n{}", hub.stderr());
    }
    assert_header_only(&a, "TRF001", &g, "E901");
    assert_eq!(posts_read(&heads, &g), 1, "the core read the POST once");
    assert_eq!(
        hub.log_count(|l| l.contains("TLS handshake with the core failed")),
        0,
        "judged a refused handshake:\n{}",
        hub.stderr()
    );
}

/// In TLS 1.2 a core refuses a missing client certificate inside the
/// handshake, before the hub's handshake ends: E902, nothing read, logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls12_core_refusing_the_client_certificate_is_e902() {
    let ca = TestCa::new("core CA");
    let clients = TestCa::new("client CA");
    let server = ca.server("core", &["127.0.0.1"], Validity::Current);
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(tls_files::read_roots("client ca", &clients.cert).unwrap()),
        tls_files::provider(),
    )
    .build()
    .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(tls_files::provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            tls_files::read_certs("cert", &server.cert).unwrap(),
            tls_files::read_key("key", &server.key).unwrap(),
        )
        .unwrap();
    let (url, heads) = head_reading_core(config, AfterHead::Cut).await;
    let dir = TempDir::new("tls12");
    let mut hub = hub(&dir, &[&url], &target_tls_lines(Some(&ca.cert), None));
    let g = guid("TLS12");
    let a = send(&hub, &transfer(&g, AMOUNT)).await;
    if a.code != "E902" {
        panic!("{a:?}\nhub log:\n{}", hub.stderr());
    }
    assert_header_only(&a, "TRF001", &g, "E902");
    assert!(heads.lock().unwrap().is_empty(), "the core read a request");
    hub.wait_log(0, |l| {
        l.contains("TLS handshake with the core failed")
            && l.contains("the core requires a client certificate")
    })
    .await;
}
