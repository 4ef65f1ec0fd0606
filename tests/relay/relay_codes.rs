//! The relay path end to end, one standard code per test: 0000 byte for byte
//! (docs/protocol.md section 11), the business rejections B201-B203, E101, and the
//! E500 family. Each test also counts the calls that reached the fixture.

use crate::common;

use common::*;
use corebank::FaultRule;
use relayhub::header::local_timestamp;
use tokio::io::AsyncWriteExt;

/// The request of section 11, byte for byte (132 bytes after the prefix).
fn section11_request() -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(b"TRF001");
    t.extend_from_slice(b"20261129IBANK000000000000000001A");
    t.extend_from_slice(b"IBANK   ");
    t.extend_from_slice(b"20261129132000");
    t.extend_from_slice(b"    ");
    t.extend_from_slice(b"1002003004001   ");
    t.extend_from_slice(b"088");
    t.extend_from_slice(b"1002003004002   ");
    t.extend_from_slice(b"0000000050000");
    t.extend_from_slice(&[0xbf, 0xf9, 0xbc, 0xbc, 0x20, 0x31, 0x31, 0xbf, 0xf9]);
    t.extend_from_slice(&[b' '; 11]);
    t
}

/// What the core says about a transfer, read from it directly.
async fn core_record(url: String, guid: &str) -> serde_json::Value {
    let url = format!("{url}/v1/transfers/{guid}");
    tokio::task::spawn_blocking(move || {
        let mut resp = ureq::get(&url)
            .call()
            .expect("GET the transfer from the fixture");
        let text = resp.body_mut().read_to_string().expect("body");
        serde_json::from_str(&text).expect("JSON")
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ok_0000_section11_byte_for_byte() {
    let s = setup().await;
    let guid = "20261129IBANK000000000000000001A";
    let request = section11_request();
    assert_eq!(request.len(), 132);
    // The shared builder makes the same bytes (but for sent_at, which is ours).
    let mut built = trf(guid, &trf_fields(ACC1, BANK, ACC2, 50_000, MEMO));
    built[46..60].copy_from_slice(b"20261129132000");
    assert_eq!(built, request, "build_telegram disagrees with section 11");

    let total = s.core.total_money();
    let before = local_timestamp();
    let mut raw = s.raw().await;
    raw.write_all(&framed(&request)).await.unwrap();
    let (prefix, answer) = read_raw_answer(&mut raw).await;

    assert_eq!(prefix, b"0109", "answer prefix");
    assert_eq!(answer.len(), 109);
    assert_eq!(
        &answer[..46],
        &request[..46],
        "tx_code, guid and channel_id echoed"
    );
    let sent_at = std::str::from_utf8(&answer[46..60]).unwrap();
    assert_hub_time(sent_at, &before);
    assert_eq!(&answer[60..64], b"0000");

    let body = &answer[64..];
    assert_eq!(body.len(), 45);
    s.assert_posts(guid, 1);
    s.assert_calls(1, 0);
    let processed_at = std::str::from_utf8(&body[16..30]).unwrap();
    assert_hub_time(processed_at, &before); // the fixture shares our clock
    let expected = format!(
        "T{}0000001{processed_at}000000000950000",
        &processed_at[..8]
    );
    assert_eq!(std::str::from_utf8(body).unwrap(), expected);

    // And the body carries exactly what the core answered.
    let record = core_record(s.core.url(), guid).await;
    assert_eq!(record["result"], "OK");
    let from_core = format!(
        "{}{}{:015}",
        record["txn_id"].as_str().unwrap(),
        record["processed_at"].as_str().unwrap(),
        record["balance"].as_u64().unwrap()
    );
    assert_eq!(std::str::from_utf8(body).unwrap(), from_core);

    assert_eq!(s.balance(ACC1), 950_000);
    assert_eq!(s.balance(ACC2), 1_050_000);
    assert_eq!(s.core.total_money(), total);
    assert!(s.core.applied(guid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn business_rejections_b201_b202_b203_move_no_money() {
    let s = setup().await;
    let cases = [
        ("B201", ACC3, ACC2, 600_000u64),   // 500,000 on the account
        ("B202", ACC1, UNKNOWN_ACC, 1_000), // own bank, no such account
        ("B203", ACC5, ACC2, LIMIT + 1),    // over the per-transfer limit
    ];
    let total = s.core.total_money();
    let mut ch = s.channel().await;
    for (i, (code, from, to, amount)) in cases.into_iter().enumerate() {
        let (b_from, b_to) = (s.balance(from), s.core.balance(to));
        let g = guid("B2");
        let a = exchange(
            &mut ch,
            &trf(&g, &trf_fields(from, BANK, to, amount, "rent")),
        )
        .await;
        assert_header_only(&a, "TRF001", &g, code);
        s.assert_posts(&g, 1);
        s.assert_calls(i as u64 + 1, 0);
        assert!(!s.core.applied(&g), "{code}: the fixture applied it");
        assert_eq!(s.balance(from), b_from, "{code}: money left {from}");
        assert_eq!(s.core.balance(to), b_to, "{code}: money reached {to}");
    }
    assert_eq!(s.core.total_money(), total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b201_answer_is_the_bare_header_on_the_wire() {
    let s = setup().await;
    let g = guid("B2W");
    let t = trf(&g, &trf_fields(ACC3, BANK, ACC2, 600_000, MEMO));
    let before = local_timestamp();
    let mut raw = s.raw().await;
    raw.write_all(&framed(&t)).await.unwrap();
    let (prefix, answer) = read_raw_answer(&mut raw).await;
    assert_eq!(prefix, b"0064");
    assert_eq!(&answer[..46], &t[..46]);
    assert_hub_time(std::str::from_utf8(&answer[46..60]).unwrap(), &before);
    assert_eq!(&answer[60..], b"B201");
    s.assert_posts(&g, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e101_unrouted_tx_code_reaches_no_one_and_keeps_the_connection() {
    let s = setup().await;
    let g = guid("E101");
    let mut t = transfer(&g, 1_000);
    t[..6].copy_from_slice(b"XYZ999");
    let mut ch = s.channel().await;
    let before = local_timestamp();
    let a = exchange(&mut ch, &t).await;
    assert_header_only(&a, "XYZ999", &g, "E101");
    assert_hub_time(&a.sent_at, &before);
    // The route check comes before the body check: a bad body still gets E101.
    let mut short = t[..70].to_vec();
    short[..6].copy_from_slice(b"XYZ998");
    let a = exchange(&mut ch, &short).await;
    assert_header_only(&a, "XYZ998", &g, "E101");
    s.assert_calls(0, 0);

    let ok = exchange(&mut ch, &transfer(&guid("E101OK"), 1_000)).await;
    assert_eq!(ok.code, "0000");
    s.assert_calls(1, 0);
}

async fn expect_e500(rule: impl FnOnce(&str) -> FaultRule, what: &str) {
    let s = setup().await;
    let g = guid("E500");
    s.core.add_fault(rule(&g));
    let (b1, b2) = (s.balance(ACC1), s.balance(ACC2));
    let mut ch = s.channel().await;
    let a = exchange(&mut ch, &transfer(&g, 10_000)).await;
    assert_header_only(&a, "TRF001", &g, "E500");
    s.assert_posts(&g, 1);
    s.assert_calls(1, 0);
    assert!(!s.core.applied(&g), "{what}: applied");
    assert_eq!(
        (s.balance(ACC1), s.balance(ACC2)),
        (b1, b2),
        "{what}: money moved"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e500_for_a_500() {
    expect_e500(|g| FaultRule::guid(g).status(500), "500").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e500_for_a_503_with_retry_after_and_no_retry() {
    expect_e500(|g| FaultRule::guid(g).status(503).retry_after("1"), "503").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e500_for_a_422_with_an_unmapped_result() {
    expect_e500(
        |g| {
            FaultRule::guid(g)
                .status(422)
                .body(r#"{"result":"ACCOUNT_FROZEN"}"#)
        },
        "422 unmapped",
    )
    .await;
}
