//! Log output for people and for machines, never in a telegram's way.
//!
//! Lines go to stderr in batches, written by a thread of their own
//! (`log_writer`, lossy): when nobody reads stderr fast enough, lines are
//! dropped and counted (`relayhub_log_lines_dropped_total`) instead of holding
//! up the task that logs them. Colours only on a terminal. One event is one
//! line in both formats: the human one escapes newlines and other control
//! characters in values; the JSON one embeds a span field named `fields`
//! holding a JSON object (the request fields, masked) as an object. The
//! fields of the telegram being answered (`relayhub::telegram_log`) are
//! written as its innermost span's, as a `telegram` span's were.

use std::fmt::{self, Write as _};
use std::io::IsTerminal;
use std::time::Duration;

use relayhub::config::LogFormat;
use relayhub::telegram_log::{self, FieldSink};
use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::format::{Format, Full, Json};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

use crate::log_writer::{Dropped, FlushGuard, batched};

/// The installed logging: its writer thread lives (and is flushed on drop)
/// with this value.
pub struct Logging {
    _guard: FlushGuard,
    dropped: Dropped,
}

impl Logging {
    /// Copies the writer's drop count to the metric, every second.
    pub fn count_dropped(&self) -> impl std::future::Future<Output = ()> + use<> {
        let dropped = self.dropped.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                metrics::counter!(relayhub::metric_names::LOG_LINES_DROPPED)
                    .absolute(dropped.lines());
            }
        }
    }
}

/// The level filter of `spec` (`[logging] filter` or `RUST_LOG`), with the
/// TLS library's own lines kept to ERROR unless `spec` names `rustls`: a
/// channel can make rustls warn at will (a renegotiation request writes
/// "Sending warning alert NoRenegotiation" with the build's source paths),
/// which is no WARN an operator acts on, and the hub logs and counts the TLS
/// events that are (found by a black-box probe).
pub fn filter(spec: &str) -> Result<EnvFilter, String> {
    let filter = EnvFilter::try_new(spec).map_err(|e| e.to_string())?;
    if spec.contains("rustls") {
        return Ok(filter);
    }
    Ok(filter.add_directive("rustls=error".parse().map_err(|e| format!("{e}"))?))
}

/// Installs the global subscriber writing `format` to stderr.
pub fn init(format: LogFormat, filter: EnvFilter) -> Result<Logging, String> {
    let (writer, guard, dropped) = batched(std::io::stderr())
        .map_err(|e| format!("cannot start the log writer thread: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_timer(Utc)
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal());
    let result = match format {
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(JsonObjectFields)
            .event_format(JsonLine::default())
            .try_init(),
        LogFormat::Human => builder
            .fmt_fields(OneLineFields)
            .event_format(HumanLine::default())
            .try_init(),
    };
    result.map_err(|e| e.to_string())?;
    Ok(Logging {
        _guard: guard,
        dropped,
    })
}

/// The time of a line in UTC, RFC 3339 with microseconds
/// (`2026-12-01T16:30:46.232574Z`), as tracing-subscriber's own timer
/// writes it; the text up to the second is made once per second and thread.
struct Utc;

impl FormatTime for Utc {
    fn format_time(&self, w: &mut Writer<'_>) -> fmt::Result {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        write_utc(now.as_secs(), now.subsec_micros(), w)
    }
}

fn write_utc(secs: u64, micros: u32, w: &mut impl fmt::Write) -> fmt::Result {
    thread_local! {
        static SECOND: std::cell::RefCell<(u64, String)> = const {
            std::cell::RefCell::new((u64::MAX, String::new()))
        };
    }
    SECOND.with_borrow_mut(|(second, text)| {
        if *second != secs {
            text.clear();
            let at = i64::try_from(secs)
                .ok()
                .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
                .unwrap_or_default();
            write!(text, "{}", at.format("%Y-%m-%dT%H:%M:%S"))?;
            *second = secs;
        }
        w.write_str(text)?;
        let mut digits = [b'0'; 6];
        let mut rest = micros.min(999_999);
        for d in digits.iter_mut().rev() {
            *d = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
        w.write_char('.')?;
        w.write_str(std::str::from_utf8(&digits).unwrap_or("000000"))?;
        w.write_char('Z')
    })
}

/// The human line, as tracing-subscriber's full format writes it
/// (`TIME LEVEL span{fields}:span{fields}: target: fields`, with its colours
/// on a terminal), written piece by piece: its `write!`s cost more than the
/// line's bytes, on every telegram. The telegram being answered
/// ([`telegram_log`]) is written as the innermost span. Records of the `log`
/// crate (whose target that format reads from their fields) it writes
/// itself, without the telegram.
pub struct HumanLine {
    full: Format<Full, Utc>,
}

impl Default for HumanLine {
    fn default() -> HumanLine {
        HumanLine {
            full: tracing_subscriber::fmt::format().with_timer(Utc),
        }
    }
}

// The ANSI styles that format uses (those of `nu-ansi-term`).
const RESET: &str = "\x1b[0m";
const BOLD: &str = "\x1b[1m";
const DIMMED: &str = "\x1b[2m";

/// `text`, in `style` when the line has colours.
fn paint(w: &mut Writer<'_>, style: &str, text: &str) -> fmt::Result {
    if w.has_ansi_escapes() {
        w.write_str(style)?;
        w.write_str(text)?;
        w.write_str(RESET)
    } else {
        w.write_str(text)
    }
}

/// Whether `event` is a record of the `log` crate, whose target
/// tracing-subscriber's formats read from its fields.
fn from_log_crate(event: &tracing::Event<'_>) -> bool {
    event.metadata().fields().field("log.target").is_some()
}

/// A span's name and its formatted fields, then `:`.
fn write_span(
    w: &mut Writer<'_>,
    name: &str,
    fields: impl FnOnce(&mut Writer<'_>) -> fmt::Result,
) -> fmt::Result {
    paint(w, BOLD, name)?;
    paint(w, BOLD, "{")?;
    fields(w)?;
    paint(w, BOLD, "}")?;
    paint(w, DIMMED, ":")
}

impl<S, N> FormatEvent<S, N> for HumanLine
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        if from_log_crate(event) {
            return self.full.format_event(ctx, w, event);
        }
        let meta = event.metadata();
        let ansi = w.has_ansi_escapes();
        if ansi {
            w.write_str(DIMMED)?;
        }
        if Utc.format_time(&mut w).is_err() {
            w.write_str("<unknown time>")?;
        }
        if ansi {
            w.write_str(RESET)?;
        }
        w.write_char(' ')?;
        let (colour, level) = match *meta.level() {
            tracing::Level::TRACE => ("\x1b[35m", "TRACE"),
            tracing::Level::DEBUG => ("\x1b[34m", "DEBUG"),
            tracing::Level::INFO => ("\x1b[32m", " INFO"),
            tracing::Level::WARN => ("\x1b[33m", " WARN"),
            tracing::Level::ERROR => ("\x1b[31m", "ERROR"),
        };
        paint(&mut w, colour, level)?;
        w.write_char(' ')?;
        let mut seen = false;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                seen = true;
                let ext = span.extensions();
                match ext.get::<FormattedFields<N>>() {
                    Some(fields) if !fields.is_empty() => {
                        write_span(&mut w, span.metadata().name(), |w| w.write_str(fields))?
                    }
                    _ => {
                        paint(&mut w, BOLD, span.metadata().name())?;
                        paint(&mut w, DIMMED, ":")?;
                    }
                }
            }
        }
        if let Some(written) = telegram_log::with_current(|telegram| {
            write_span(&mut w, telegram_log::NAME, |w| {
                let mut v = LineVisitor {
                    writer: w,
                    empty: true,
                    result: Ok(()),
                };
                telegram.write(&mut v, true);
                v.result
            })
        }) {
            written?;
            seen = true;
        }
        if seen {
            w.write_char(' ')?;
        }
        paint(&mut w, DIMMED, meta.target())?;
        paint(&mut w, DIMMED, ":")?;
        w.write_char(' ')?;
        ctx.format_fields(w.by_ref(), event)?;
        w.write_char('\n')
    }
}

/// The span field whose JSON-object text is embedded as an object.
const OBJECT_FIELD: &str = "fields";

/// Whether `text` is one JSON object: checked without building it (the
/// telegram span's `fields` is recorded on every telegram).
fn is_json_object(text: &str) -> bool {
    text.trim_start().starts_with('{')
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// Span fields as a JSON object, `fields` embedded as an object.
///
/// The text is written field by field, never parsed and built again: a field
/// recorded later is appended to the object (`add_fields`), so a field
/// recorded twice appears twice, and the JSON formatter, which reads the
/// object into a map when it writes an event, keeps the last value. Strings
/// are escaped here only as far as JSON needs; the formatter writes them out
/// again in its own way.
pub struct JsonObjectFields;

/// Writes `"name":value` entries after `first` (whether one came before).
struct JsonVisitor<'a, W: fmt::Write> {
    out: &'a mut W,
    first: bool,
    /// Whether `fields` is embedded as the object it holds: for a span's
    /// fields (the telegram's), not an event's own, which tracing-subscriber's
    /// JSON format writes as strings.
    embed: bool,
    result: fmt::Result,
}

impl<W: fmt::Write> JsonVisitor<'_, W> {
    fn key(&mut self, name: &str) -> bool {
        if self.result.is_err() {
            return false;
        }
        let sep = if self.first { "" } else { "," };
        self.first = false;
        self.result = self
            .out
            .write_str(sep)
            .and_then(|()| json_string(self.out, name))
            .and_then(|()| self.out.write_char(':'));
        self.result.is_ok()
    }

    fn raw(&mut self, name: &str, value: fmt::Arguments<'_>) {
        if self.key(name) {
            self.result = self.out.write_fmt(value);
        }
    }

    fn str_value(&mut self, name: &str, value: &str) {
        if self.key(name) {
            // Embedded as it is, so only on one line (as the layout's
            // compact text always is): a line break would split the line.
            let embedded = self.embed
                && name == OBJECT_FIELD
                && !value.contains(['\n', '\r'])
                && is_json_object(value);
            self.result = if embedded {
                self.out.write_str(value)
            } else {
                json_string(self.out, value)
            };
        }
    }

    /// A value's text (`{:?}` or `{}`) as a JSON string; `fields` as the
    /// object it holds.
    fn text_value(&mut self, name: &str, value: fmt::Arguments<'_>) {
        if name == OBJECT_FIELD {
            let text = value.to_string();
            return self.str_value(name, &text);
        }
        if self.key(name) {
            self.result = self
                .out
                .write_char('"')
                .and_then(|()| JsonEscaped(&mut *self.out).write_fmt(value))
                .and_then(|()| self.out.write_char('"'));
        }
    }
}

impl<W: fmt::Write> Visit for JsonVisitor<'_, W> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.str_value(field.name(), value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.text_value(field.name(), format_args!("{value:?}"));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.raw(field.name(), format_args!("{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.raw(field.name(), format_args!("{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        // As serde_json writes it (`null` when not finite).
        let text = Value::from(value).to_string();
        self.raw(field.name(), format_args!("{text}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.raw(field.name(), format_args!("{value}"));
    }
}

/// A telegram's fields as its span's were written: displayed values as
/// JSON strings, `fields` as an object.
impl<W: fmt::Write> FieldSink for JsonVisitor<'_, W> {
    fn str(&mut self, name: &'static str, value: &str) {
        self.str_value(name, value);
    }

    fn display(&mut self, name: &'static str, value: &dyn fmt::Display) {
        self.text_value(name, format_args!("{value}"));
    }

    fn text(&mut self, name: &'static str, value: &str) {
        if name == OBJECT_FIELD {
            self.str_value(name, value);
        } else if self.key(name) {
            self.result = json_string(self.out, value);
        }
    }

    fn u64(&mut self, name: &'static str, value: u64) {
        self.raw(name, format_args!("{value}"));
    }
}

/// The JSON line: tracing-subscriber's (`timestamp`, `level`, `fields`,
/// `target`, `span`: the current span's fields and `name`), with the
/// telegram being answered ([`telegram_log`]) as the current span: its
/// fields as they were recorded, the last core time only, as the JSON
/// formatter kept them. Written here when there is such a telegram.
pub struct JsonLine {
    json: Format<Json, Utc>,
}

impl Default for JsonLine {
    fn default() -> JsonLine {
        JsonLine {
            json: tracing_subscriber::fmt::format()
                .json()
                .with_current_span(true)
                .with_span_list(false)
                .with_timer(Utc),
        }
    }
}

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let telegram = if from_log_crate(event) {
            None
        } else {
            telegram_log::with_current(|telegram| json_line(&mut w, event, telegram))
        };
        telegram.unwrap_or_else(|| self.json.format_event(ctx, w, event))
    }
}

fn json_line(
    w: &mut Writer<'_>,
    event: &tracing::Event<'_>,
    telegram: &telegram_log::TelegramLog,
) -> fmt::Result {
    let meta = event.metadata();
    w.write_str("{\"timestamp\":\"")?;
    Utc.format_time(w)?;
    w.write_str("\",\"level\":\"")?;
    w.write_str(meta.level().as_str())?;
    w.write_str("\",\"fields\":{")?;
    let mut v = JsonVisitor {
        out: &mut *w,
        first: true,
        embed: false,
        result: Ok(()),
    };
    event.record(&mut v);
    v.result?;
    w.write_str("},\"target\":")?;
    json_string(w, meta.target())?;
    w.write_str(",\"span\":{")?;
    let mut v = JsonVisitor {
        out: &mut *w,
        first: true,
        embed: true,
        result: Ok(()),
    };
    telegram.write(&mut v, false);
    v.result?;
    w.write_str(",\"name\":")?;
    json_string(w, telegram_log::NAME)?;
    w.write_str("}}\n")
}

/// `text` as a JSON string, quotes included.
fn json_string<W: fmt::Write + ?Sized>(out: &mut W, text: &str) -> fmt::Result {
    out.write_char('"')?;
    JsonEscaped(out).write_str(text)?;
    out.write_char('"')
}

/// Writes through, escaped as the inside of a JSON string.
struct JsonEscaped<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for JsonEscaped<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let mut start = 0;
        for (i, b) in s.bytes().enumerate() {
            let escaped = match b {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0..0x20 => "",
                _ => continue,
            };
            self.0.write_str(&s[start..i])?;
            if escaped.is_empty() {
                write!(self.0, "\\u{b:04x}")?;
            } else {
                self.0.write_str(escaped)?;
            }
            start = i + 1;
        }
        self.0.write_str(&s[start..])
    }
}

impl<'w> FormatFields<'w> for JsonObjectFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        writer.write_char('{')?;
        let mut v = JsonVisitor {
            out: &mut writer,
            first: true,
            embed: true,
            result: Ok(()),
        };
        fields.record(&mut v);
        v.result?;
        writer.write_char('}')
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let text = &mut current.fields;
        if !(text.starts_with('{') && text.ends_with('}')) {
            text.clear();
            text.push_str("{}");
        }
        text.pop();
        let mut v = JsonVisitor {
            first: text.len() == 1,
            embed: true,
            out: &mut *text,
            result: Ok(()),
        };
        fields.record(&mut v);
        let result = v.result;
        text.push('}');
        result
    }
}

/// Fields as `name=value`, the message bare, every value on one line.
pub struct OneLineFields;

/// Writes `name=value` (the message bare) after a space unless `empty`,
/// straight into the line: no text of its own per field.
struct LineVisitor<'a, 'w> {
    writer: &'a mut Writer<'w>,
    empty: bool,
    result: fmt::Result,
}

impl LineVisitor<'_, '_> {
    /// The separator and `name=` (nothing for the message); false once a
    /// write failed. Written piece by piece: the formatting machinery costs
    /// more than these few bytes, on every field of every telegram.
    fn name(&mut self, name: &str) -> bool {
        if self.result.is_err() {
            return false;
        }
        let sep = if self.empty { "" } else { " " };
        self.empty = false;
        self.result = self.writer.write_str(sep);
        if name != "message" {
            self.result = self
                .result
                .and_then(|()| self.writer.write_str(name))
                .and_then(|()| self.writer.write_char('='));
        }
        self.result.is_ok()
    }

    fn write(&mut self, name: &str, value: fmt::Arguments<'_>) {
        if self.name(name) {
            self.result = OneLine(&mut *self.writer).write_fmt(value);
        }
    }

    fn str_value(&mut self, name: &str, value: &str) {
        if name == "message" || (name == OBJECT_FIELD && is_json_object(value)) {
            if self.name(name) {
                self.result = OneLine(&mut *self.writer).write_str(value);
            }
        } else if value.bytes().fold(true, |plain, b| {
            // A fold, not `all`: no early exit, so the compiler checks
            // many bytes at a time.
            plain & (b' '..=b'~').contains(&b) & (b != b'"') & (b != b'\\')
        }) {
            // What `{:?}` writes for printable ASCII with nothing to escape,
            // without its character-by-character escaping (and with no
            // control character for `OneLine` to look for).
            if self.name(name) {
                self.result = self
                    .writer
                    .write_char('"')
                    .and_then(|()| self.writer.write_str(value))
                    .and_then(|()| self.writer.write_char('"'));
            }
        } else {
            self.write(name, format_args!("{value:?}"));
        }
    }

    fn u64_value(&mut self, name: &str, value: u64) {
        if self.name(name) {
            // Digits: nothing for `OneLine` to look for.
            self.result = self
                .writer
                .write_str(relayhub::decimal::digits(value, &mut [0; 20]));
        }
    }
}

impl Visit for LineVisitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.str_value(field.name(), value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.u64_value(field.name(), value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field.name(), format_args!("{value:?}"));
    }
}

/// A telegram's fields as its span's were written: a string as `{:?}`
/// writes it, a displayed value as its text.
impl FieldSink for LineVisitor<'_, '_> {
    fn str(&mut self, name: &'static str, value: &str) {
        self.str_value(name, value);
    }

    fn display(&mut self, name: &'static str, value: &dyn fmt::Display) {
        self.write(name, format_args!("{value}"));
    }

    fn text(&mut self, name: &'static str, value: &str) {
        if self.name(name) {
            self.result = OneLine(&mut *self.writer).write_str(value);
        }
    }

    fn u64(&mut self, name: &'static str, value: u64) {
        self.u64_value(name, value);
    }
}

impl<'w> FormatFields<'w> for OneLineFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut v = LineVisitor {
            writer: &mut writer,
            empty: true,
            result: Ok(()),
        };
        fields.record(&mut v);
        v.result
    }
}

/// Writes through, with line breaks and other control characters escaped
/// (`\n`, `\r`, `\u{1b}`; a tab stays), so that a value (a TOML error, a
/// peer's bytes) can neither split an event into several lines nor forge one.
struct OneLine<'a, W: fmt::Write + ?Sized>(&'a mut W);

impl<W: fmt::Write + ?Sized> fmt::Write for OneLine<'_, W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Control characters (`char::is_control`) are U+0000 to U+001F and
        // U+007F to U+009F: in UTF-8 a byte below 0x20, 0x7F, or 0xC2 followed
        // by 0x80 to 0x9F.
        let bytes = s.as_bytes();
        // Most text has none: one quick scan (a fold with no early exit,
        // which the compiler does many bytes at a time) for a byte that
        // may start one, and the whole text in one write when there is none.
        let suspect = bytes.iter().fold(false, |seen, &b| {
            seen | ((b < 0x20) & (b != b'\t')) | (b == 0x7f) | (b == 0xc2)
        });
        if !suspect {
            return self.0.write_str(s);
        }
        let mut start = 0;
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            let len = match b {
                b'\t' => 0,
                0..0x20 | 0x7f => 1,
                0xc2 if matches!(bytes.get(i + 1), Some(0x80..=0x9f)) => 2,
                _ => 0,
            };
            if len == 0 {
                i += 1;
                continue;
            }
            self.0.write_str(&s[start..i])?;
            match b {
                b'\n' => self.0.write_str("\\n")?,
                b'\r' => self.0.write_str("\\r")?,
                _ => {
                    let c = s[i..].chars().next().unwrap_or_default();
                    write!(self.0, "\\u{{{:x}}}", c as u32)?;
                }
            }
            i += len;
            start = i;
        }
        self.0.write_str(&s[start..])
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::sync::{Arc, Mutex};

    use relayhub::core_client::TraceId;
    use relayhub::header::Echo;
    use relayhub::telegram_log::{self, TelegramLog};
    use serde_json::{Value, json};
    use tracing::{info, info_span, warn};
    use tracing_subscriber::fmt::MakeWriter;

    /// The TLS library's own lines are kept to ERROR (a channel can make
    /// rustls warn at will), unless the filter names rustls.
    #[test]
    fn the_tls_library_is_kept_to_errors_unless_named() {
        let f = super::filter("info").unwrap().to_string();
        assert!(f.contains("rustls=error"), "{f}");
        let f = super::filter("relayhub=debug,warn").unwrap().to_string();
        assert!(f.contains("rustls=error"), "{f}");
        let f = super::filter("info,rustls=debug").unwrap().to_string();
        assert!(
            !f.contains("rustls=error") && f.contains("rustls=debug"),
            "{f}"
        );
        assert!(super::filter("relayhub=[").is_err());
    }

    use super::{HumanLine, JsonLine, JsonObjectFields, OneLine, OneLineFields, Utc};

    fn one_line(text: &str) -> String {
        let mut out = String::new();
        OneLine(&mut out).write_str(text).unwrap();
        out
    }

    #[test]
    fn values_stay_on_one_line() {
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(
            one_line("TOML parse error\n  |\n1 | [server\r\n"),
            "TOML parse error\\n  |\\n1 | [server\\r\\n"
        );
        assert_eq!(one_line("a\u{1b}[31mb"), "a\\u{1b}[31mb");
        // Every control character, and only those, escaped; tabs and
        // other text (two-byte characters next to C1 controls) kept.
        let text = "\t\u{0}x\u{7f}é\u{80}\u{85}\u{9f}\u{a0}ü한\u{1f}";
        assert_eq!(
            one_line(text),
            "\t\\u{0}x\\u{7f}é\\u{80}\\u{85}\\u{9f}\u{a0}ü한\\u{1f}"
        );
        for c in (0..0x800u32).filter_map(char::from_u32) {
            let want = if c.is_control() && c != '\t' {
                match c {
                    '\n' => "\\n".to_string(),
                    '\r' => "\\r".to_string(),
                    c => format!("\\u{{{:x}}}", c as u32),
                }
            } else {
                c.to_string()
            };
            assert_eq!(one_line(&format!("a{c}b")), format!("a{want}b"), "{c:?}");
        }
    }

    proptest::proptest! {
        /// A string field is written as `{:?}` writes it, on one line,
        /// whether it takes the plain path or not.
        #[test]
        fn a_string_field_is_written_as_debug_writes_it(value in "\\PC{0,12}|[ -~]{0,40}") {
            let mut out = String::new();
            let mut writer = tracing_subscriber::fmt::format::Writer::new(&mut out);
            let mut v = super::LineVisitor {
                writer: &mut writer,
                empty: true,
                result: Ok(()),
            };
            v.str_value("guid", &value);
            proptest::prop_assert_eq!(out, one_line(&format!("guid={value:?}")));
        }
    }

    /// A writer the test reads.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl MakeWriter<'_> for Lines {
        type Writer = Lines;
        fn make_writer(&self) -> Lines {
            self.clone()
        }
    }

    /// A telegram's log fields, as `Hub::handle` starts them.
    fn telegram_log(guid: &str, tx: &str) -> TelegramLog {
        // The echo's fields are public: they may hold what a header never would.
        let mut echo = Echo::blank();
        echo.guid[..guid.len()].copy_from_slice(guid.as_bytes());
        echo.tx_code[..tx.len()].copy_from_slice(tx.as_bytes());
        echo.channel_id[..5].copy_from_slice(b"IBANK");
        let trace = TraceId(0x4bf92f3577b34da6a3ce929d0e0e4736).text();
        TelegramLog::new(echo, "10.1.2.3".parse().unwrap(), trace)
    }

    /// What the hub logs of one telegram: its fields recorded as
    /// `Hub::handle` records them, a warning on the way, the summary line.
    fn telegram() {
        let conn = info_span!("conn", peer = %"10.1.2.3:5000");
        let _conn = conn.enter();
        telegram_log("G1", "TRF001").sync_scope(|| {
            telegram_log::record_channel();
            let masked =
                json!({"amount": 50000, "from_account": "*********4001", "memo": "<2 \"q\">"});
            telegram_log::record_fields(&masked.to_string());
            telegram_log::record_core_ms(11);
            warn!(stage = "outcome", "could not journal the outcome");
            telegram_log::record_core_ms(12);
            info!(code = %"0000", ms = 14u64, "attempt 1: processed\nforged");
        });
        // A header that could not be read: nothing recorded; a `fields`
        // that is not an object is written as its text (a string in JSON).
        telegram_log("bad\tguid", "T\u{1b}").sync_scope(|| {
            telegram_log::record_fields("[1]");
            info!(code = %"E102", ms = 0u64, f = 1.5f64, n = -2i64, "header")
        });
    }

    /// The lines `events` logs in one format, every level enabled (as a hub
    /// at RUST_LOG=trace); the human ones without their time.
    fn output(format: Style, events: fn()) -> String {
        output_in_colour(format, false, events)
    }

    /// The same, with colours if `ansi` (as on a terminal).
    fn output_in_colour(format: Style, ansi: bool, events: fn()) -> String {
        let lines = Lines::default();
        let builder = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .with_ansi(ansi)
            .with_max_level(tracing::Level::TRACE);
        match format {
            Style::Json => {
                let s = builder
                    .fmt_fields(JsonObjectFields)
                    .event_format(JsonLine::default())
                    .finish();
                tracing::subscriber::with_default(s, events);
            }
            Style::TracingJson => {
                let s = builder
                    .with_timer(Utc)
                    .json()
                    .with_current_span(true)
                    .with_span_list(false)
                    .fmt_fields(JsonObjectFields)
                    .finish();
                tracing::subscriber::with_default(s, events);
            }
            Style::Human => {
                let s = builder
                    .fmt_fields(OneLineFields)
                    .event_format(HumanLine::default())
                    .finish();
                tracing::subscriber::with_default(s, events);
            }
            Style::Full => {
                let s = builder.with_timer(Utc).fmt_fields(OneLineFields).finish();
                tracing::subscriber::with_default(s, events);
            }
        }
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        if matches!(format, Style::Json | Style::TracingJson) {
            // Without the time: `"timestamp":"2026-12-01T16:30:46.232574Z"`.
            return text
                .lines()
                .map(|line| {
                    let at = line.find("\"timestamp\":\"").expect(line) + 13;
                    assert_eq!(line.as_bytes().get(at + 26), Some(&b'Z'), "{line}");
                    format!("{}{}\n", &line[..at], &line[at + 27..])
                })
                .collect();
        }
        // `2026-12-01T16:30:46.232574Z `: 27 characters and a space (and
        // the style around them in colour).
        let (skip, cut) = if ansi { (4, 27) } else { (0, 28) };
        text.lines()
            .map(|line| {
                assert_eq!(line.as_bytes().get(skip + 26), Some(&b'Z'), "{line}");
                format!("{}{}\n", &line[..skip], &line[skip + cut..])
            })
            .collect()
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Style {
        /// The hub's.
        Json,
        /// tracing-subscriber's, which the hub's writes when no telegram is
        /// being answered.
        TracingJson,
        /// The hub's.
        Human,
        /// tracing-subscriber's full format, which the hub's copies.
        Full,
    }

    /// Lines at every level, in spans with fields and without.
    fn every_level() {
        tracing::trace!(n = 1u64, "trace");
        tracing::debug!(n = 2u64, "debug");
        info!("info");
        let conn = info_span!("conn", peer = %"10.1.2.3:5000");
        let bare = info_span!("listener");
        conn.in_scope(|| warn!(e = %"x", "warn"));
        bare.in_scope(|| conn.in_scope(|| tracing::error!(n = -1i64, "error")));
    }

    #[test]
    fn the_human_line_is_tracing_subscribers_full_format() {
        let human = output(Style::Human, every_level);
        assert_eq!(human.lines().count(), 5, "{human}");
        assert_eq!(human, output(Style::Full, every_level));
        // With colours, as on a terminal.
        let human = output_in_colour(Style::Human, true, every_level);
        assert!(human.contains("\x1b[1mconn\x1b[0m"), "{human}");
        assert_eq!(human, output_in_colour(Style::Full, true, every_level));
        // A telegram's lines: its fields as the innermost span's, in bold.
        let human = output_in_colour(Style::Human, true, telegram);
        assert!(
            human.contains("\x1b[1mtelegram\x1b[0m\x1b[1m{\x1b[0mguid=\"G1\" tx="),
            "{human}"
        );
    }

    #[test]
    fn the_json_line_is_tracing_subscribers_outside_a_telegram() {
        let json = output(Style::Json, every_level);
        assert_eq!(json.lines().count(), 5, "{json}");
        assert_eq!(json, output(Style::TracingJson, every_level));
    }

    #[test]
    fn json_lines_carry_the_telegram_span_with_fields_as_an_object() {
        let text = output(Style::Json, telegram);
        let lines: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        assert_eq!(lines.len(), 3, "{text}");
        let span = json!({
            "name": "telegram", "guid": "G1", "tx": "TRF001", "channel": "IBANK",
            "peer": "10.1.2.3", "trace": "4bf92f3577b34da6a3ce929d0e0e4736",
            "fields": {"amount": 50000, "from_account": "*********4001", "memo": "<2 \"q\">"},
        });
        let mut warning = span.clone();
        warning["core_ms"] = json!(11);
        assert_eq!(lines[0]["span"], warning, "{text}");
        assert_eq!(lines[0]["fields"]["stage"], "outcome");
        // core_ms recorded again: the last value.
        let mut summary = span;
        summary["core_ms"] = json!(12);
        assert_eq!(lines[1]["span"], summary, "{text}");
        assert_eq!(
            lines[1]["fields"],
            json!({"message": "attempt 1: processed\nforged", "code": "0000", "ms": 14})
        );
        assert_eq!(
            lines[2]["span"],
            json!({"name": "telegram", "guid": "bad\tguid", "tx": "T\u{1b}", "fields": "[1]",
                "peer": "10.1.2.3", "trace": "4bf92f3577b34da6a3ce929d0e0e4736"}),
            "{text}"
        );
        assert_eq!(lines[2]["fields"]["f"], 1.5);
        assert_eq!(lines[2]["fields"]["n"], -2);
    }

    #[test]
    fn only_a_telegrams_one_line_fields_are_embedded_as_an_object() {
        fn events() {
            telegram_log("G2", "TRF001").sync_scope(|| {
                telegram_log::record_fields("{\"a\":\n1}");
                info!(fields = "{\"b\":2}", "own fields");
            });
        }
        let text = output(Style::Json, events);
        let line: Value = serde_json::from_str(text.trim_end()).expect(&text);
        assert_eq!(text.lines().count(), 1, "{text}");
        // An event's own `fields` stays a string, as tracing-subscriber writes it;
        // a telegram's with a line break too (embedded, it would split the line).
        assert_eq!(line["fields"]["fields"], "{\"b\":2}", "{text}");
        assert_eq!(line["span"]["fields"], "{\"a\":\n1}", "{text}");
    }

    #[test]
    fn line_times_are_rfc3339_utc_with_microseconds() {
        use chrono::{DateTime, SecondsFormat};
        for (secs, micros) in [
            (0, 0),
            (1_796_131_846, 232_574),
            (1_796_131_846, 5),
            (1_796_131_847, 999_999),
            (951_782_400, 100_000),
        ] {
            let mut text = String::new();
            super::write_utc(secs, micros, &mut text).unwrap();
            let want = DateTime::from_timestamp(secs as i64, micros * 1_000)
                .unwrap()
                .to_rfc3339_opts(SecondsFormat::Micros, true);
            assert_eq!(text, want);
        }
    }

    #[test]
    fn a_string_field_is_written_as_its_debug_text() {
        let samples = [
            "",
            "G1",
            " ~",
            "it's",
            "a\"b",
            "a\\b",
            "tab\there",
            "del\u{7f}",
            "é",
            "한글",
            "\u{85}",
        ];
        for value in samples {
            let lines = Lines::default();
            let s = tracing_subscriber::fmt()
                .with_writer(lines.clone())
                .with_ansi(false)
                .without_time()
                .fmt_fields(OneLineFields)
                .finish();
            tracing::subscriber::with_default(s, || info!(x = value, "m"));
            let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
            let want = format!(" x={}\n", one_line(&format!("{value:?}")));
            assert!(text.ends_with(&want), "{value:?}: {text:?}");
        }
    }

    #[test]
    fn human_lines_carry_the_telegram_span_on_one_line() {
        let text = output(Style::Human, telegram);
        let lines: Vec<&str> = text.lines().collect();
        let span = r#"conn{peer=10.1.2.3:5000}:telegram{guid="G1" tx="TRF001" peer=10.1.2.3 trace=4bf92f3577b34da6a3ce929d0e0e4736 channel="IBANK" fields={"amount":50000,"from_account":"*********4001","memo":"<2 \"q\">"} core_ms=11"#;
        assert_eq!(
            lines,
            [
                format!(r#" WARN {span}}}: relayhub::logging::tests: could not journal the outcome stage="outcome""#),
                format!(" INFO {span} core_ms=12}}: relayhub::logging::tests: attempt 1: processed\\nforged code=0000 ms=14"),
                r#" INFO conn{peer=10.1.2.3:5000}:telegram{guid="bad\tguid" tx="T\u{1b}" peer=10.1.2.3 trace=4bf92f3577b34da6a3ce929d0e0e4736 fields=[1]}: relayhub::logging::tests: header code=E102 ms=0 f=1.5 n=-2"#.to_string(),
            ],
            "{text}"
        );
    }
}
