//! The CPU cost of one telegram's conversions, without sockets or the core:
//! what the hub does between reading a telegram and calling the core, and
//! between the core's answer and writing the channel's answer. Target: under
//! 2 µs each way (docs/performance.md).
//!
//! `cargo bench --bench convert`

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{Criterion, criterion_group, criterion_main};

use relayhub::frame::{FrameCodec, PrefixMode};
use relayhub::header::{Echo, HEADER_LEN, local_timestamp, parse_header, write_response};
use relayhub::layout::{builtin, encode_fields};
use relayhub::outcome::{CodeTable, Outcome, classify_transfer};

/// The worked example of docs/protocol.md section 11, framed (136 bytes).
fn request_frame() -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(b"0132TRF00120261129IBANK000000000000000001AIBANK   20261129132000    ");
    t.extend_from_slice(b"1002003004001   0881002003004002   0000000050000");
    t.extend_from_slice(&[0xbf, 0xf9, 0xbc, 0xbc, 0x20, 0x31, 0x31, 0xbf, 0xf9]);
    t.extend_from_slice(&[b' '; 11]);
    assert_eq!(t.len(), 136);
    t
}

const CORE_ANSWER: &[u8] =
    br#"{"result":"OK","txn_id":"T202611290000001","balance":950000,"processed_at":"20261129132001"}"#;

fn request(c: &mut Criterion) {
    let layouts = builtin();
    let layout = &layouts["TRF001"];
    let codec = FrameCodec::new(PrefixMode::Ascii, 4096);
    let framed = request_frame();
    let mut g = c.benchmark_group("trf001_request");
    // What the brief calls "decode + validate + convert": frame, header, body -> JSON.
    g.bench_function("frame+header+layout", |b| {
        b.iter(|| {
            let mut buf = BytesMut::from(black_box(&framed[..]));
            let t = codec.decode(&mut buf).unwrap().unwrap();
            let h = parse_header(&t).unwrap();
            let fields = layout.decode_request(&t[HEADER_LEN..], HEADER_LEN).unwrap();
            black_box((&h, &fields));
        })
    });
    // Plus what the hub adds before the call: the JSON body it posts and
    // the masked fields its summary line shows.
    g.bench_function("frame+header+layout+json", |b| {
        b.iter(|| {
            let mut buf = BytesMut::from(black_box(&framed[..]));
            let t = codec.decode(&mut buf).unwrap().unwrap();
            let h = parse_header(&t).unwrap();
            let fields = layout.decode_request(&t[HEADER_LEN..], HEADER_LEN).unwrap();
            let masked = layout.masked_request(&fields);
            let body = relayhub::relay::transfer_body(h.guid, h.channel_id, &fields);
            black_box((masked, body))
        })
    });
    // The journal's fingerprint of the body (SHA-256), once per transfer.
    g.bench_function("fingerprint", |b| {
        b.iter(|| {
            black_box(relayhub::relay::fingerprint(
                "TRF001",
                black_box(&framed[68..]),
            ))
        })
    });
    g.finish();
}

fn answer(c: &mut Criterion) {
    let layouts = builtin();
    let layout = &layouts["TRF001"];
    let codec = FrameCodec::new(PrefixMode::Ascii, 4096);
    let framed = request_frame();
    let echo = Echo::from_telegram(&framed[4..]);
    let codes = CodeTable::builtin();
    let Outcome::Processed(answer) = classify_transfer(200, CORE_ANSWER, &codes) else {
        panic!("the sample answer is a 200 OK");
    };
    let fields = answer.fields();
    let sent_at = "20261129132001";
    let mut g = c.benchmark_group("trf001_answer");
    // What the brief calls "one answer back": fields -> body, header, frame.
    g.bench_function("layout+header+frame", |b| {
        b.iter(|| {
            let body = encode_fields(&layout.response, black_box(&fields), HEADER_LEN).unwrap();
            let mut t = Vec::with_capacity(HEADER_LEN + body.len());
            write_response(&echo, sent_at, "0000", &body, &mut t);
            let mut out = BytesMut::with_capacity(t.len() + 4);
            codec.encode(&t, &mut out).unwrap();
            black_box(out)
        })
    });
    // Plus reading the core's JSON and taking the hub's clock for `sent_at`.
    g.bench_function("json+layout+header+frame", |b| {
        b.iter(|| {
            let Outcome::Processed(answer) = classify_transfer(200, black_box(CORE_ANSWER), &codes)
            else {
                unreachable!()
            };
            let body = encode_fields(&layout.response, &answer.fields(), HEADER_LEN).unwrap();
            let mut t = Vec::with_capacity(HEADER_LEN + body.len());
            write_response(&echo, &local_timestamp(), "0000", &body, &mut t);
            let mut out = BytesMut::with_capacity(t.len() + 4);
            codec.encode(&t, &mut out).unwrap();
            black_box(out)
        })
    });
    g.bench_function("local_timestamp", |b| {
        b.iter(|| black_box(local_timestamp()))
    });
    g.finish();
}

criterion_group!(benches, request, answer);
criterion_main!(benches);
