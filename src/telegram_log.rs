//! What every log line about a telegram carries (`telegram{guid tx peer
//! trace channel fields core_ms}`), kept in the telegram's task instead of a
//! tracing span.
//!
//! A span per telegram cost a slab entry, its fields formatted on creation
//! and on every record, and an enter and exit on every poll, on every
//! telegram (docs/performance.md, "A telegram's log fields without a span"). The values sit here until a line is
//! written, and the log formatters write them where the span's fields went,
//! in the same order, so the lines read as before.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;

use crate::core_client::TraceText;
use crate::header::Echo;

tokio::task_local! {
    static TELEGRAM: TelegramLog;
}

/// The log fields of the telegram a task is answering.
pub struct TelegramLog {
    echo: Echo,
    peer: IpAddr,
    trace: TraceText,
    /// Known as the telegram is read and answered, in that order.
    later: RefCell<Later>,
}

#[derive(Default)]
struct Later {
    /// The header was read and checked: the line shows its channel, the
    /// echo's bytes (a checked header's `channel_id`), with no copy of them.
    channel: bool,
    /// The request fields, masked by the layout: one JSON object.
    fields: Option<String>,
    /// The time spent calling the core, each time it was called.
    core_ms: Vec<u64>,
}

/// Where a formatter writes the fields, each by its kind: a string is quoted
/// (in human lines), a displayed value is written as its text (`fields`, one
/// JSON object's text: an object in JSON lines).
pub trait FieldSink {
    fn str(&mut self, name: &'static str, value: &str);
    fn display(&mut self, name: &'static str, value: &dyn fmt::Display);
    /// A value that is text already, written as `display` would write it.
    fn text(&mut self, name: &'static str, value: &str);
    fn u64(&mut self, name: &'static str, value: u64);
}

/// The span name the lines show.
pub const NAME: &str = "telegram";

impl TelegramLog {
    pub fn new(echo: Echo, peer: IpAddr, trace: TraceText) -> TelegramLog {
        TelegramLog {
            echo,
            peer,
            trace,
            later: RefCell::default(),
        }
    }

    /// Runs `f` as the work of this telegram: its log lines carry these fields.
    /// (Not an `async fn`: that would hold `f` twice in its state, and the
    /// telegram's future is copied whole as it moves.)
    pub fn scope<F: Future>(self, f: F) -> impl Future<Output = F::Output> {
        TELEGRAM.scope(self, f)
    }

    /// Runs `f`, which does not await, as the work of this telegram.
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        TELEGRAM.sync_scope(self, f)
    }

    /// Writes the fields into `sink` in the order a span showed them: those
    /// known from the start, then the rest as they were recorded. With
    /// `every_core_ms` false only the last core time is written (a JSON
    /// object keeps one value per name).
    pub fn write(&self, sink: &mut dyn FieldSink, every_core_ms: bool) {
        sink.str("guid", self.echo.guid_str());
        sink.str("tx", self.echo.tx_code_str());
        match self.peer {
            // Written by hand: the formatting machinery costs about a
            // thousand instructions for these few digits, on every line.
            IpAddr::V4(v4) => sink.text("peer", ipv4_text(v4, &mut [0; 15])),
            IpAddr::V6(_) => sink.display("peer", &self.peer),
        }
        sink.text("trace", self.trace.as_str());
        let later = self.later.borrow();
        if later.channel {
            sink.str("channel", self.echo.channel_id_str());
        }
        if let Some(fields) = &later.fields {
            sink.text("fields", fields);
        }
        let core_ms = if every_core_ms {
            &later.core_ms[..]
        } else {
            later
                .core_ms
                .last()
                .map(std::slice::from_ref)
                .unwrap_or(&[])
        };
        for ms in core_ms {
            sink.u64("core_ms", *ms);
        }
    }
}

/// `a.b.c.d` in `buf`, as `Ipv4Addr`'s `Display` writes it.
fn ipv4_text(ip: std::net::Ipv4Addr, buf: &mut [u8; 15]) -> &str {
    let mut len = 0;
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            buf[len] = b'.';
            len += 1;
        }
        let digits = [octet / 100, octet / 10 % 10, octet % 10];
        let skip = if octet >= 100 {
            0
        } else if octet >= 10 {
            1
        } else {
            2
        };
        for d in &digits[skip..] {
            buf[len] = b'0' + d;
            len += 1;
        }
    }
    // ASCII digits and dots only.
    std::str::from_utf8(&buf[..len]).unwrap_or_default()
}

/// Calls `f` with the fields of the telegram the current task answers, if any.
pub fn with_current<R>(f: impl FnOnce(&TelegramLog) -> R) -> Option<R> {
    TELEGRAM.try_with(f).ok()
}

fn later(f: impl FnOnce(&mut Later)) {
    let _ = TELEGRAM.try_with(|t| f(&mut t.later.borrow_mut()));
}

/// The header is parsed and checked: from now on the lines show its
/// channel (the telegram's own `channel_id` bytes, kept in the echo).
pub fn record_channel() {
    later(|l| l.channel = true);
}

/// The request fields, masked (a JSON object's text), once the body is read.
pub fn record_fields(masked: &str) {
    later(|l| l.fields = Some(masked.to_owned()));
}

/// The time one call to the core took.
pub fn record_core_ms(ms: u64) {
    later(|l| l.core_ms.push(ms));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Text(String);

    impl FieldSink for Text {
        fn str(&mut self, name: &'static str, value: &str) {
            self.0 += &format!(" {name}={value:?}");
        }
        fn display(&mut self, name: &'static str, value: &dyn fmt::Display) {
            self.0 += &format!(" {name}={value}");
        }
        fn text(&mut self, name: &'static str, value: &str) {
            self.0 += &format!(" {name}={value}");
        }
        fn u64(&mut self, name: &'static str, value: u64) {
            self.0 += &format!(" {name}={value}");
        }
    }

    fn log() -> TelegramLog {
        let mut telegram = b"TRF001".to_vec();
        telegram.extend_from_slice(b"20261129IBANK000000000000000001A");
        telegram.extend_from_slice(b"IBANK   ");
        TelegramLog::new(
            Echo::from_telegram(&telegram),
            "10.1.2.3".parse().unwrap(),
            crate::core_client::TraceId(0x4bf9).text(),
        )
    }

    fn written(every_core_ms: bool) -> String {
        let mut text = Text::default();
        with_current(|t| t.write(&mut text, every_core_ms)).expect("in a telegram's task");
        text.0
    }

    #[tokio::test]
    async fn fields_come_in_the_order_they_became_known() {
        let (all, last) = log()
            .scope(async {
                let start = written(true);
                record_channel();
                record_fields(r#"{"amount":5}"#);
                record_core_ms(11);
                record_core_ms(12);
                (format!("{start} |{}", written(true)), written(false))
            })
            .await;
        let known = r#" guid="20261129IBANK000000000000000001A" tx="TRF001" peer=10.1.2.3 trace=00000000000000000000000000004bf9"#;
        assert_eq!(
            all,
            format!(
                r#"{known} |{known} channel="IBANK" fields={{"amount":5}} core_ms=11 core_ms=12"#
            )
        );
        assert!(
            last.ends_with(r#"fields={"amount":5} core_ms=12"#),
            "{last}"
        );
    }

    proptest::proptest! {
        /// The address written by hand is what `Display` writes.
        #[test]
        fn an_ipv4_address_is_written_as_display_writes_it(bits: u32) {
            let ip = std::net::Ipv4Addr::from(bits);
            let mut buf = [0; 15];
            proptest::prop_assert_eq!(ipv4_text(ip, &mut buf), ip.to_string());
        }
    }

    #[test]
    fn outside_a_telegram_nothing_is_recorded_or_written() {
        record_core_ms(3);
        assert!(with_current(|_| ()).is_none());
    }
}
