//! The fault matrix: every fault of the contract, end to end, each proven twice,
//! by the calls counted at the fixture AND by the ledger (balances moved once or
//! not at all, `total_money()` conserved).
//!
//! | fault | answer | calls at the core | ledger |
//! |---|---|---|---|
//! | core down (connect refused) | E902 | 0 | unchanged; the resend posts once |
//! | delayed past the budget, before applying | E901 in the budget | 1 POST | debited once, later |
//! | delayed past the budget, after applying | E901 in the budget | 1 POST | debited once |
//! | connection reset mid-response (`close` after apply) | E901 | 1 POST | debited once |
//! | response cut short (`truncate`) | E901 | 1 POST | debited once |
//! | 503 + `Retry-After` past the budget | E500 in the budget | 1 POST, no retry | unchanged |
//! | same GUID while in flight | the first one's answer | 1 POST | debited once |
//! | same GUID after E901 | inquiry's answer | 1 POST + GETs | debited once |
//! | same GUID after SIGKILL of the hub | inquiry's answer | 1 POST + GETs | debited once |
//! | same GUID, other amount | E102 | nothing new | unchanged by it |
//! | one byte at a time, just inside the slow-sender timeout | answered | 1 POST | debited once |
//! | stalling past the slow-sender timeout | closed, no answer | 0 | unchanged |
//! | garbage / zero / oversized prefix | E102 + close | 0 | unchanged; other connections served |
//!
//! Colleagues' suites (`relay_*`, `journal_*`) cover many of these one way;
//! this file is the one place that checks each fault both ways at once.
//!
//! Every case runs twice, with the same assertions: against a plain-HTTP core
//! (`fault_matrix::http::*`) and an HTTPS one (`fault_matrix::https::*`, the
//! hub trusting a test CA). Over TLS the proxy forwards the encrypted bytes,
//! and the fixture's faults cut or close the HTTP answer inside TLS.

use crate::chaos_support;
use crate::common;

use std::time::{Duration, Instant};

use chaos_support::*;
use common::*;
use corebank::{CoreBank, FaultMethod, FaultRule, Phase};
use relayhub::client::Answer;
use relayhub::daemon::Daemon;
use tokio::io::AsyncWriteExt;

/// Slack on top of the budget for "answered within the budget" on a loaded CI box.
const SLACK: Duration = Duration::from_millis(300);

/// Each case as two tests: `http::NAME` and `https::NAME`.
macro_rules! both_schemes {
    ($($name:ident),* $(,)?) => {
        mod http {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::CoreScheme::Http).await
                }
            )*
        }
        mod https {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::CoreScheme::Https).await
                }
            )*
        }
    };
}

both_schemes!(
    core_down_is_e902_with_no_call_and_the_resend_posts_once,
    delayed_past_the_budget_before_applying_is_e901_and_debits_once_later,
    delayed_past_the_budget_after_applying_is_e901_and_debits_once,
    connection_reset_mid_response_is_e901_and_debits_once,
    response_cut_short_is_e901_and_debits_once,
    a_502_after_applying_is_e901_and_the_resend_is_an_inquiry,
    a_503_with_retry_after_seconds_past_the_budget_is_answered_in_the_budget,
    a_503_with_retry_after_date_past_the_budget_is_answered_in_the_budget,
    the_same_guid_while_in_flight_gets_the_first_answer_and_one_post,
    the_same_guid_with_another_amount_is_e102_and_moves_nothing,
    the_same_guid_after_a_sigkill_of_the_hub_is_an_inquiry_never_a_second_post,
    a_sigkill_while_the_core_is_still_processing_answers_e901_not_a_post,
    one_byte_at_a_time_just_inside_the_slow_sender_timeout_is_answered,
    stalling_past_the_slow_sender_timeout_closes_without_an_answer_or_a_call,
    garbage_and_oversized_prefixes_are_e102_and_close_while_others_are_served,
);

/// A hub config: `toml`, and for an HTTPS core the table trusting its CA.
fn hub_toml(toml: &str, tls: &Option<CoreTls>) -> String {
    match tls {
        Some(tls) => format!("{toml}{}", tls.hub_toml()),
        None => toml.to_string(),
    }
}

/// A fixture, a proxy in front of it, and an in-process hub calling the proxy.
struct Matrix {
    core: CoreBank,
    proxy: Proxy,
    hub: Daemon,
    before: Ledger,
    budget: Duration,
    _config: Option<TempFile>,
    _tls: Option<CoreTls>,
}

impl Matrix {
    async fn new(scheme: CoreScheme, budget_ms: u64) -> Matrix {
        Matrix::with_toml(scheme, budget_ms, "").await
    }

    /// `toml` is added to a config whose resend cooldown is 0, so a resend
    /// after "not sent" needs no wait in these tests.
    async fn with_toml(scheme: CoreScheme, budget_ms: u64, toml: &str) -> Matrix {
        let (core, tls) = start_core_as(scheme).await;
        let proxy = Proxy::start(core.addr()).await;
        let text = hub_toml(&format!("[journal]\nresend_cooldown_ms = 0\n{toml}"), &tls);
        let (hub, config) = start_hub(
            &scheme.url(proxy.addr),
            &HubOpts {
                budget_ms: Some(budget_ms),
                toml: Some(text),
                ..HubOpts::default()
            },
        )
        .await;
        let before = Ledger::of(&core);
        Matrix {
            core,
            proxy,
            hub,
            before,
            budget: Duration::from_millis(budget_ms),
            _config: config,
            _tls: tls,
        }
    }

    async fn channel(&self) -> relayhub::client::Channel {
        connect(self.hub.addr, relayhub::frame::PrefixMode::Ascii).await
    }

    /// Sends on a new connection; returns the answer and how long it took.
    async fn send(&self, telegram: &[u8]) -> (Answer, Duration) {
        let mut ch = self.channel().await;
        let started = Instant::now();
        let a = exchange(&mut ch, telegram).await;
        (a, started.elapsed())
    }

    /// (POSTs, GETs) the fixture counted for `guid`.
    fn calls(&self, guid: &str) -> (u64, u64) {
        calls(&self.core, guid)
    }

    /// (POSTs, GETs) the fixture counted in all.
    fn total_calls(&self) -> (u64, u64) {
        let s = self.core.stats();
        (s.post, s.get)
    }

    fn assert_in_budget(&self, elapsed: Duration, what: &str) {
        assert!(
            elapsed < self.budget + SLACK,
            "{what} after {elapsed:?}, budget {:?}",
            self.budget
        );
    }

    /// Waits (bounded) for the fixture to decide `guid`; true if applied.
    async fn wait_applied(&self, guid: &str) -> bool {
        within(self.core.wait_applied(guid)).await
    }
}

const AMOUNT: u64 = 10_000;

/// ACC1 -> ACC2 of AMOUNT, once.
fn one_debit() -> [(&'static str, &'static str, u64); 1] {
    [(ACC1, ACC2, AMOUNT)]
}

// ---- core down ------------------------------------------------------------

async fn core_down_is_e902_with_no_call_and_the_resend_posts_once(scheme: CoreScheme) {
    let m = Matrix::new(scheme, 1_000).await;
    m.proxy.set_mode(ProxyMode::Refuse);
    m.proxy.mode_applied().await;
    let g = guid("FMDOWN");
    let t = transfer(&g, AMOUNT);

    let (a, elapsed) = m.send(&t).await;
    assert_header_only(&a, "TRF001", &g, "E902");
    m.assert_in_budget(elapsed, "E902");
    assert_eq!(m.total_calls(), (0, 0), "nothing reached the core");
    m.before.assert_now(&m.core, &[]);

    // The core is back: "not sent" means the resend may post, and it posts once.
    m.proxy.set_mode(ProxyMode::Forward);
    m.proxy.mode_applied().await;
    let (a, _) = m.send(&t).await;
    assert_eq!(a.code, "0000", "resend after E902: {a:?}");
    assert_eq!(m.calls(&g), (1, 0));
    assert_eq!(m.total_calls(), (1, 0));
    m.before.assert_now(&m.core, &one_debit());
}

// ---- sent, no answer: E901 ------------------------------------------------

/// Sends one transfer that `rule` hits; expects E901 within the budget after
/// exactly one POST; waits until the fixture has applied it (once); then the
/// resend is answered 0000, and still one POST in all.
///
/// `late_answer`: the core still answers the POST after the budget, so the hub
/// may have journaled that late answer by the time of the resend and replay it
/// instead of asking; both are right. Without one, the resend must ask.
async fn e901_then_inquiry(
    scheme: CoreScheme,
    budget_ms: u64,
    late_answer: bool,
    rule: impl FnOnce(&str) -> FaultRule,
) {
    let m = Matrix::new(scheme, budget_ms).await;
    let g = guid("FM901");
    m.core.add_fault(rule(&g));
    let t = transfer(&g, AMOUNT);

    let (a, elapsed) = m.send(&t).await;
    assert_header_only(&a, "TRF001", &g, "E901");
    m.assert_in_budget(elapsed, "E901");
    assert_eq!(m.calls(&g), (1, 0), "one POST, no retry");

    assert!(m.wait_applied(&g).await, "the transfer was rejected");
    m.before.assert_now(&m.core, &one_debit());

    // The resend is an inquiry, never a second POST.
    let (a, elapsed) = m.send(&t).await;
    m.assert_in_budget(elapsed, "inquiry answer");
    assert_eq!(a.code, "0000", "resend after E901: {a:?}");
    assert_eq!(a.body.len(), 45, "0000 carries the TRF001 response body");
    let (post, get) = m.calls(&g);
    assert_eq!(post, 1, "the resend must not POST again");
    if !late_answer {
        assert!(get >= 1, "the resend asked the core (GETs {get})");
    }
    assert_eq!(m.total_calls().0, 1);
    // And a third telegram is a replay: nothing new reaches the core.
    let (again, _) = m.send(&t).await;
    assert_eq!((again.code.as_str(), &again.body), ("0000", &a.body));
    assert_eq!(m.calls(&g), (1, get), "a final answer is replayed");
    m.before.assert_now(&m.core, &one_debit());
}

async fn delayed_past_the_budget_before_applying_is_e901_and_debits_once_later(scheme: CoreScheme) {
    e901_then_inquiry(scheme, 500, true, |g| {
        FaultRule::guid(g)
            .method(FaultMethod::Post)
            .delay_ms(1_500)
            .phase(Phase::BeforeApply)
    })
    .await;
}

async fn delayed_past_the_budget_after_applying_is_e901_and_debits_once(scheme: CoreScheme) {
    e901_then_inquiry(scheme, 500, true, |g| {
        FaultRule::guid(g)
            .method(FaultMethod::Post)
            .delay_ms(1_500)
            .phase(Phase::AfterApply)
    })
    .await;
}

async fn connection_reset_mid_response_is_e901_and_debits_once(scheme: CoreScheme) {
    e901_then_inquiry(scheme, 1_000, false, |g| {
        FaultRule::guid(g)
            .method(FaultMethod::Post)
            .close()
            .phase(Phase::AfterApply)
    })
    .await;
}

async fn response_cut_short_is_e901_and_debits_once(scheme: CoreScheme) {
    e901_then_inquiry(scheme, 1_000, false, |g| {
        FaultRule::guid(g)
            .method(FaultMethod::Post)
            .truncate()
            .phase(Phase::AfterApply)
    })
    .await;
}

async fn a_502_after_applying_is_e901_and_the_resend_is_an_inquiry(scheme: CoreScheme) {
    e901_then_inquiry(scheme, 1_000, false, |g| {
        FaultRule::guid(g)
            .method(FaultMethod::Post)
            .status(502)
            .phase(Phase::AfterApply)
    })
    .await;
}

// ---- 503 with Retry-After past the budget ---------------------------------

async fn e503_retry_after_past_the_budget(scheme: CoreScheme, retry_after: String) {
    let m = Matrix::new(scheme, 800).await;
    let g = guid("FM503");
    m.core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .status(503)
            .retry_after(retry_after.clone()),
    );
    let t = transfer(&g, AMOUNT);
    let (a, elapsed) = m.send(&t).await;
    assert_header_only(&a, "TRF001", &g, "E500");
    m.assert_in_budget(elapsed, "E500");
    assert_eq!(
        m.calls(&g),
        (1, 0),
        "a POST is never retried, Retry-After {retry_after} or not"
    );
    // E500 is final: the resend is a replay, no call at all.
    let (a, _) = m.send(&t).await;
    assert_eq!(a.code, "E500");
    assert_eq!(m.calls(&g), (1, 0));
    assert_eq!(m.total_calls(), (1, 0));
    assert!(!m.core.applied(&g));
    m.before.assert_now(&m.core, &[]);
}

async fn a_503_with_retry_after_seconds_past_the_budget_is_answered_in_the_budget(
    scheme: CoreScheme,
) {
    e503_retry_after_past_the_budget(scheme, "30".into()).await;
}

async fn a_503_with_retry_after_date_past_the_budget_is_answered_in_the_budget(scheme: CoreScheme) {
    let later = std::time::SystemTime::now() + Duration::from_secs(60);
    e503_retry_after_past_the_budget(scheme, httpdate::fmt_http_date(later)).await;
}

// ---- repeated GUIDs ---------------------------------------------------------

async fn the_same_guid_while_in_flight_gets_the_first_answer_and_one_post(scheme: CoreScheme) {
    let m = Matrix::new(scheme, 3_000).await;
    let g = guid("FMFLY");
    m.core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(600)
            .phase(Phase::BeforeApply),
    );
    let t = transfer(&g, AMOUNT);
    let mut first = m.channel().await;
    within(first.send(&t)).await.expect("send");
    // The core holds the first POST: the second telegram arrives while in flight.
    within(m.core.wait_received(&g)).await;
    let mut second = m.channel().await;
    within(second.send(&t)).await.expect("send");
    let a1 = Answer::parse(&within(first.recv()).await.unwrap().unwrap()).unwrap();
    let a2 = Answer::parse(&within(second.recv()).await.unwrap().unwrap()).unwrap();
    assert_eq!(a1.code, "0000", "{a1:?}");
    assert_eq!((a2.code.as_str(), &a2.body), ("0000", &a1.body));
    assert_eq!(m.calls(&g), (1, 0));
    m.before.assert_now(&m.core, &one_debit());
}

async fn the_same_guid_with_another_amount_is_e102_and_moves_nothing(scheme: CoreScheme) {
    let m = Matrix::new(scheme, 3_000).await;
    let g = guid("FMAMT");
    // While the first is in flight...
    m.core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(400)
            .phase(Phase::BeforeApply),
    );
    let mut first = m.channel().await;
    within(first.send(&transfer(&g, AMOUNT)))
        .await
        .expect("send");
    within(m.core.wait_received(&g)).await;
    let (a, _) = m.send(&transfer(&g, AMOUNT * 2)).await;
    assert_header_only(&a, "TRF001", &g, "E102");
    let a1 = Answer::parse(&within(first.recv()).await.unwrap().unwrap()).unwrap();
    assert_eq!(a1.code, "0000");
    // ...and after its final answer.
    for amount in [AMOUNT * 2, AMOUNT - 1, 1] {
        let (a, _) = m.send(&transfer(&g, amount)).await;
        assert_header_only(&a, "TRF001", &g, "E102");
    }
    assert_eq!(m.calls(&g), (1, 0), "no new call for a different body");
    assert_eq!(m.total_calls(), (1, 0));
    m.before.assert_now(&m.core, &one_debit());
    // The original body is still replayed.
    let (a, _) = m.send(&transfer(&g, AMOUNT)).await;
    assert_eq!((a.code.as_str(), &a.body), ("0000", &a1.body));
}

// ---- a crash of the hub -----------------------------------------------------

async fn the_same_guid_after_a_sigkill_of_the_hub_is_an_inquiry_never_a_second_post(
    scheme: CoreScheme,
) {
    let (core, tls) = start_core_as(scheme).await;
    let before = Ledger::of(&core);
    let dir = TempDir::new("fmcrash");
    let cmd = HubCommand::new(
        &dir,
        &core.url(),
        &hub_toml("[server]\nbudget_ms = 5000\n", &tls),
    );
    let mut hub = cmd.start("127.0.0.1:0").expect("hub starts");

    let g = guid("FMKILL");
    // The core holds the POST long enough to kill the hub in the middle of it.
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(1_000)
            .phase(Phase::BeforeApply),
    );
    let t = transfer(&g, AMOUNT);
    let mut ch = connect(hub.addr, relayhub::frame::PrefixMode::Ascii).await;
    within(ch.send(&t)).await.expect("send");
    within(core.wait_received(&g)).await;
    let status = hub.sigkill();
    assert!(!status.success(), "SIGKILL is not a clean exit: {status:?}");
    assert!(
        within(ch.recv()).await.expect("read").is_none(),
        "a killed hub answers nothing"
    );

    // A new hub on the same journal file; the core finishes the transfer anyway.
    let hub = cmd.start("127.0.0.1:0").expect("hub restarts");
    assert!(within(core.wait_applied(&g)).await, "applied");
    let mut ch = connect(hub.addr, relayhub::frame::PrefixMode::Ascii).await;
    let a = exchange(&mut ch, &t).await;
    assert_eq!(a.code, "0000", "resend after the crash: {a:?}");
    let s = core.stats().by_guid[&g];
    assert_eq!(s.post, 1, "one POST in total: {s:?}");
    assert!(s.get >= 1, "the resend asked the core: {s:?}");
    before.assert_now(&core, &one_debit());

    // Killed again: the final answer is durable and replayed without a call.
    let mut hub = hub;
    hub.sigkill();
    let hub = cmd.start("127.0.0.1:0").expect("hub restarts");
    let mut ch = connect(hub.addr, relayhub::frame::PrefixMode::Ascii).await;
    let again = exchange(&mut ch, &t).await;
    assert_eq!((again.code.as_str(), &again.body), ("0000", &a.body));
    assert_eq!(core.stats().by_guid[&g], s, "replayed from the journal");
    assert_eq!(core.stats().post, 1);
    before.assert_now(&core, &one_debit());
}

async fn a_sigkill_while_the_core_is_still_processing_answers_e901_not_a_post(scheme: CoreScheme) {
    let (core, tls) = start_core_as(scheme).await;
    let before = Ledger::of(&core);
    let dir = TempDir::new("fmcrash2");
    let cmd = HubCommand::new(
        &dir,
        &core.url(),
        &hub_toml("[server]\nbudget_ms = 800\n", &tls),
    );
    let mut hub = cmd.start("127.0.0.1:0").expect("hub starts");
    let g = guid("FMKILL2");
    core.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .delay_ms(3_000)
            .phase(Phase::BeforeApply),
    );
    let t = transfer(&g, AMOUNT);
    let mut ch = connect(hub.addr, relayhub::frame::PrefixMode::Ascii).await;
    within(ch.send(&t)).await.expect("send");
    within(core.wait_received(&g)).await;
    hub.sigkill();

    let hub = cmd.start("127.0.0.1:0").expect("hub restarts");
    let mut ch = connect(hub.addr, relayhub::frame::PrefixMode::Ascii).await;
    let started = Instant::now();
    let a = exchange(&mut ch, &t).await;
    assert_eq!(a.code, "E901", "the core says PROCESSING: {a:?}");
    assert!(started.elapsed() < Duration::from_millis(800) + SLACK);
    assert_eq!(core.stats().by_guid[&g].post, 1);
    assert!(within(core.wait_applied(&g)).await);
    let a = exchange(&mut ch, &t).await;
    assert_eq!(a.code, "0000", "{a:?}");
    assert_eq!(core.stats().by_guid[&g].post, 1);
    before.assert_now(&core, &one_debit());
}

// ---- slow senders -----------------------------------------------------------

/// The slow-sender timeout of these tests: a started telegram must be complete
/// within it.
const READ_TIMEOUT_MS: u64 = 500;

async fn one_byte_at_a_time_just_inside_the_slow_sender_timeout_is_answered(scheme: CoreScheme) {
    let m = Matrix::with_toml(
        scheme,
        2_000,
        &format!("[server]\nread_timeout_ms = {READ_TIMEOUT_MS}\n"),
    )
    .await;
    // The pauses are the subject: 140 bytes spread over 70% of the timeout,
    // each byte written at its own instant so pauses do not add up drift. A
    // machine too busy to keep that pace proves nothing; it gets three tries.
    let spread = Duration::from_millis(READ_TIMEOUT_MS * 7 / 10);
    let mut tried = Vec::new();
    for _ in 0..3 {
        let g = guid("FMSLOW");
        tried.push(g.clone());
        let wire = framed(&transfer(&g, AMOUNT));
        let mut s = tokio::net::TcpStream::connect(m.hub.addr).await.unwrap();
        s.set_nodelay(true).unwrap();
        let started = tokio::time::Instant::now();
        for (i, b) in wire.iter().enumerate() {
            let at = started + spread.mul_f64(i as f64 / (wire.len() - 1) as f64);
            tokio::time::sleep_until(at).await;
            if s.write_all(std::slice::from_ref(b)).await.is_err() {
                break;
            }
        }
        let took = started.elapsed();
        assert!(took >= spread, "the bytes were not spread out ({took:?})");
        if took >= Duration::from_millis(READ_TIMEOUT_MS) {
            eprintln!("note: writing took {took:?}, past the timeout; trying again");
            continue;
        }
        let (_, answer) = read_raw_answer(&mut s).await;
        let a = Answer::parse(&answer).unwrap();
        assert_eq!(a.code, "0000", "{a:?}");
        assert_eq!(a.guid, g);
        assert_eq!(m.calls(&g), (1, 0));
        // A too-slow try may or may not have been read whole in time: the
        // ledger counts whatever of them reached the core, once each.
        let mut moves = Vec::new();
        for t in &tried {
            let (post, _) = m.calls(t);
            assert!(post <= 1, "{t}: {post} POSTs");
            if post == 1 && m.wait_applied(t).await {
                moves.push((ACC1, ACC2, AMOUNT));
            }
        }
        m.before.assert_now(&m.core, &moves);
        return;
    }
    panic!("three tries could not write a telegram inside {READ_TIMEOUT_MS} ms on this machine");
}

async fn stalling_past_the_slow_sender_timeout_closes_without_an_answer_or_a_call(
    scheme: CoreScheme,
) {
    let m = Matrix::with_toml(
        scheme,
        2_000,
        &format!("[server]\nread_timeout_ms = {READ_TIMEOUT_MS}\n"),
    )
    .await;
    let g = guid("FMSTALL");
    let wire = framed(&transfer(&g, AMOUNT));
    let mut s = tokio::net::TcpStream::connect(m.hub.addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(&wire[..70]).await.unwrap();
    let started = Instant::now();
    // The hub closes on its own once the timeout passes: EOF, no answer bytes.
    assert_closed(&mut s).await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(READ_TIMEOUT_MS * 9 / 10),
        "closed after {waited:?}, before the {READ_TIMEOUT_MS} ms timeout"
    );
    assert_eq!(m.total_calls(), (0, 0), "nothing forwarded");
    m.before.assert_now(&m.core, &[]);
}

// ---- unframeable input --------------------------------------------------------

async fn garbage_and_oversized_prefixes_are_e102_and_close_while_others_are_served(
    scheme: CoreScheme,
) {
    let m = Matrix::new(scheme, 3_000).await;
    // A transfer in flight on another connection the whole time.
    let held = guid("FMHELD");
    m.core.add_fault(
        FaultRule::guid(&held)
            .method(FaultMethod::Post)
            .delay_ms(800)
            .phase(Phase::BeforeApply),
    );
    let mut other = m.channel().await;
    within(other.send(&transfer(&held, AMOUNT))).await.unwrap();
    within(m.core.wait_received(&held)).await;

    let bad: [&[u8]; 7] = [
        b"ABCD",
        b"01x2",
        b"\x00\x00\x00\x84",
        b" 132",
        b"0000",
        b"4097",
        b"9999",
    ];
    for prefix in bad {
        let mut s = tokio::net::TcpStream::connect(m.hub.addr).await.unwrap();
        let mut wire = prefix.to_vec();
        wire.extend_from_slice(&transfer(&guid("FMBAD"), AMOUNT));
        s.write_all(&wire).await.unwrap();
        let (p, answer) = read_raw_answer(&mut s).await;
        assert_eq!(p, b"0064", "prefix {prefix:?}");
        let a = Answer::parse(&answer).unwrap();
        assert_eq!(a.code, "E102", "prefix {prefix:?}: {a:?}");
        assert_eq!(a.tx_code, "      ", "blank header for {prefix:?}");
        assert_eq!(a.guid, " ".repeat(32), "blank header for {prefix:?}");
        assert_eq!(a.channel_id, "", "blank header for {prefix:?}");
        assert_closed(&mut s).await;
    }

    // The held transfer still gets its answer, and a new connection is served.
    let a = Answer::parse(&within(other.recv()).await.unwrap().unwrap()).unwrap();
    assert_eq!(a.code, "0000", "{a:?}");
    let fresh = guid("FMFRESH");
    let (a, _) = m.send(&transfer(&fresh, AMOUNT)).await;
    assert_eq!(a.code, "0000", "{a:?}");
    assert_eq!(m.calls(&held), (1, 0));
    assert_eq!(m.calls(&fresh), (1, 0));
    assert_eq!(m.total_calls(), (2, 0), "the bad telegrams reached nothing");
    m.before
        .assert_now(&m.core, &[(ACC1, ACC2, AMOUNT), (ACC1, ACC2, AMOUNT)]);
}
