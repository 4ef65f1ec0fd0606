//! E102 end to end (docs/protocol.md sections 2-4): every malformed header field and
//! body field, framing errors that close the connection, and the connection
//! staying usable after any other E102. Nothing here may reach the fixture.

use crate::common;

use common::*;
use relayhub::header::local_timestamp;
use tokio::io::AsyncWriteExt;

/// A telegram with `bytes` written at `offset` over a valid transfer.
fn patched(base: &[u8], offset: usize, bytes: &[u8]) -> Vec<u8> {
    let mut t = base.to_vec();
    t[offset..offset + bytes.len()].copy_from_slice(bytes);
    t
}

/// The echo part (first 46 bytes) an E102 answer must carry for `telegram`:
/// each of tx_code, guid, channel_id copied when whole and printable, else blank.
fn expected_echo(telegram: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (start, len) in [(0usize, 6usize), (6, 32), (38, 8)] {
        match telegram.get(start..start + len) {
            Some(f) if f.iter().all(|b| (0x20..=0x7e).contains(b)) => out.extend_from_slice(f),
            _ => out.extend(std::iter::repeat_n(b' ', len)),
        }
    }
    out
}

/// Sends each case on one connection and checks its E102 answer byte for byte.
async fn expect_e102_each(
    s: &Setup,
    ch: &mut relayhub::client::Channel,
    cases: &[(&str, Vec<u8>)],
) {
    for (name, t) in cases {
        let before = local_timestamp();
        within(ch.send(t)).await.expect("send");
        let answer = within(ch.recv()).await.expect("read").unwrap_or_else(|| {
            panic!("{name}: the hub closed the connection after a non-framing E102")
        });
        assert_eq!(
            answer.len(),
            64,
            "{name}: an E102 answer is the header alone: {answer:?}"
        );
        assert_eq!(
            String::from_utf8_lossy(&answer[..46]),
            String::from_utf8_lossy(&expected_echo(t)),
            "{name}: echo"
        );
        assert_hub_time(std::str::from_utf8(&answer[46..60]).unwrap(), &before);
        assert_eq!(&answer[60..64], b"E102", "{name}: code");
        s.assert_calls(0, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e102_for_each_malformed_header_field_then_the_connection_still_works() {
    let s = setup().await;
    let g = guid("HDR");
    let t = transfer(&g, 1_000);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("63 bytes", t[..63].to_vec()),
        ("20 bytes", t[..20].to_vec()),
        ("1 byte", t[..1].to_vec()),
        ("tx_code lower case", patched(&t, 0, b"trf001")),
        ("tx_code control byte", patched(&t, 3, b"\x01")),
        ("guid with '!'", patched(&t, 20, b"!")),
        ("guid with a space", patched(&t, 37, b" ")),
        ("guid with a non-ASCII byte", patched(&t, 6, b"\xff")),
        ("channel_id blank", patched(&t, 38, b"        ")),
        ("channel_id right-aligned", patched(&t, 38, b"   IBANK")),
        ("channel_id non-ASCII", patched(&t, 40, b"\x80")),
        ("sent_at not digits", patched(&t, 46, b"2026112913200A")),
        ("sent_at month 13", patched(&t, 46, b"20261329132000")),
        ("sent_at 30 February", patched(&t, 46, b"20260230120000")),
        ("sent_at 31 April", patched(&t, 46, b"20260431120000")),
        ("sent_at hour 24", patched(&t, 46, b"20261129240000")),
        ("sent_at minute 60", patched(&t, 46, b"20261129126000")),
        ("sent_at second 60", patched(&t, 46, b"20261129125960")),
        ("sent_at day 00", patched(&t, 46, b"20261100120000")),
        ("sent_at blank", patched(&t, 46, b"              ")),
        ("resp_code 0000", patched(&t, 60, b"0000")),
        ("resp_code one non-space", patched(&t, 63, b"X")),
    ];
    let mut ch = s.channel().await;
    expect_e102_each(&s, &mut ch, &cases).await;

    // Same connection, a valid telegram with the same GUID: nothing was recorded.
    let a = exchange(&mut ch, &t).await;
    assert_eq!(a.code, "0000", "after the E102s: {a:?}");
    s.assert_posts(&g, 1);
    s.assert_calls(1, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e102_for_each_malformed_body_then_the_connection_still_works() {
    let s = setup().await;
    let g = guid("BODY");
    let t = transfer(&g, 1_000);
    assert_eq!(t.len(), 132);
    // Body offsets: from_account 64, to_bank 80, to_account 83, amount 99, memo 112.
    let mut memo_cut = t.clone();
    memo_cut[112..132].copy_from_slice(b"                   \xbf");
    let mut memo_cut_after_text = t.clone(); // "월세 11월" then a lead byte at the end
    memo_cut_after_text[131] = 0xbf;
    let mut longer = t.clone();
    longer.push(b' ');
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("body one byte short", t[..131].to_vec()),
        ("body one byte long", longer),
        ("header only", t[..64].to_vec()),
        ("amount non-digit", patched(&t, 99, b"00000000100A0")),
        ("amount blank", patched(&t, 99, b"             ")),
        ("amount 0 under min 1", patched(&t, 99, b"0000000000000")),
        ("amount space-padded", patched(&t, 99, b"         1000")),
        ("to_bank non-digit", patched(&t, 80, b"08A")),
        ("to_bank blank", patched(&t, 80, b"   ")),
        ("from_account blank", patched(&t, 64, &[b' '; 16])),
        ("to_account blank", patched(&t, 83, &[b' '; 16])),
        ("from_account non-ASCII", patched(&t, 66, b"\x80")),
        ("memo cut EUC-KR character", memo_cut),
        ("memo cut after text", memo_cut_after_text),
        ("memo control byte", patched(&t, 121, b"\x07")),
    ];
    let mut ch = s.channel().await;
    expect_e102_each(&s, &mut ch, &cases).await;

    let other = guid("BODYOK");
    let a = exchange(&mut ch, &transfer(&other, 1_000)).await;
    assert_eq!(a.code, "0000", "a valid telegram after the E102s: {a:?}");
    // The corrected telegram may reuse the refused GUID (nothing was journaled).
    let a = exchange(&mut ch, &t).await;
    assert_eq!(a.code, "0000", "the corrected telegram: {a:?}");
    s.assert_posts(&g, 1);
    s.assert_posts(&other, 1);
    s.assert_calls(2, 0);
    assert_eq!(s.balance(ACC1), 1_000_000 - 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valid_blank_memo_and_a_full_width_memo_are_accepted() {
    let s = setup().await;
    let mut ch = s.channel().await;
    for memo in ["", "가나다라마바사아자차"] {
        let g = guid("MEMO");
        let a = exchange(&mut ch, &trf(&g, &trf_fields(ACC1, BANK, ACC2, 10, memo))).await;
        assert_eq!(a.code, "0000", "memo {memo:?}: {a:?}");
        s.assert_posts(&g, 1);
    }
}

/// Writes `bytes` on a fresh connection, expects E102 with a blank header and
/// then the close, and no call to the fixture.
async fn expect_blank_e102_and_close(s: &Setup, bytes: &[u8], what: &str) {
    let mut raw = s.raw().await;
    let before = local_timestamp();
    raw.write_all(bytes).await.unwrap();
    let (prefix, answer) = read_raw_answer(&mut raw).await;
    assert_eq!(prefix, b"0064", "{what}: prefix");
    assert_eq!(&answer[..46], &[b' '; 46][..], "{what}: blank header");
    assert_hub_time(std::str::from_utf8(&answer[46..60]).unwrap(), &before);
    assert_eq!(&answer[60..], b"E102", "{what}: code");
    assert_closed(&mut raw).await;
    s.assert_calls(0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_prefix_gets_a_blank_e102_and_the_close() {
    let s = setup().await;
    expect_blank_e102_and_close(&s, b"GET / HTTP/1.1\r\nHost: hub\r\n\r\n", "HTTP request").await;
    expect_blank_e102_and_close(&s, b"GET /", "GET /").await;
    expect_blank_e102_and_close(&s, b"12a4", "digit, digit, letter").await;
    expect_blank_e102_and_close(&s, b" 132", "space-padded prefix").await;
    // What follows the bad prefix is never read as a telegram.
    let mut bytes = b"GET /".to_vec();
    bytes.extend_from_slice(&framed(&transfer(&guid("RESYNC"), 1_000)));
    expect_blank_e102_and_close(&s, &bytes, "bad prefix then a valid telegram").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn length_zero_or_over_the_maximum_gets_a_blank_e102_and_the_close() {
    let s = setup().await;
    expect_blank_e102_and_close(&s, b"0000", "length 0").await;
    // The answer comes as soon as the prefix is read: the hub does not wait for
    // 4097 bytes it will never take.
    expect_blank_e102_and_close(&s, b"4097", "length 4097").await;
    expect_blank_e102_and_close(&s, b"9999", "length 9999").await;
    // After a good telegram on the same connection, too.
    let mut raw = s.raw().await;
    let g = guid("MAX");
    raw.write_all(&framed(&transfer(&g, 1_000))).await.unwrap();
    let (_, ok) = read_raw_answer(&mut raw).await;
    assert_eq!(&ok[60..64], b"0000");
    raw.write_all(b"0000").await.unwrap();
    let (_, e) = read_raw_answer(&mut raw).await;
    assert_eq!(&e[..46], &[b' '; 46][..]);
    assert_eq!(&e[60..], b"E102");
    assert_closed(&mut raw).await;
    s.assert_calls(1, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn length_at_the_maximum_is_framed_and_judged_by_its_body() {
    let s = setup().await;
    let g = guid("AT4096");
    let mut t = transfer(&g, 1_000);
    t.resize(4096, b' ');
    let mut ch = s.channel().await;
    let a = exchange(&mut ch, &t).await;
    assert_header_only(&a, "TRF001", &g, "E102");
    // Not a framing error: the connection stays open.
    let a = exchange(&mut ch, &transfer(&g, 1_000)).await;
    assert_eq!(a.code, "0000");
    s.assert_calls(1, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eof_in_the_middle_of_a_telegram_closes_without_an_answer() {
    let s = setup().await;
    let t = transfer(&guid("HALF"), 1_000);
    let mut raw = s.raw().await;
    raw.write_all(&framed(&t)[..100]).await.unwrap();
    raw.shutdown().await.unwrap();
    assert_closed(&mut raw).await;
    s.assert_calls(0, 0);

    // A prefix alone, then EOF: the same.
    let mut raw = s.raw().await;
    raw.write_all(b"01").await.unwrap();
    raw.shutdown().await.unwrap();
    assert_closed(&mut raw).await;
    s.assert_calls(0, 0);
}
