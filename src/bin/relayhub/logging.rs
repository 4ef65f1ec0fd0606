//! Log output for people and for machines, never in a telegram's way.
//!
//! Lines go to stderr in batches, written by a thread of their own
//! (`log_writer`, lossy): when nobody reads stderr fast enough, lines are
//! dropped and counted (`relayhub_log_lines_dropped_total`) instead of holding
//! up the task that logs them. Colours only on a terminal. One event is one
//! line in both formats: the human one escapes newlines and other control
//! characters in values; the JSON one embeds a span field named `fields`
//! holding a JSON object (the request fields, masked) as an object.

use std::fmt::{self, Write as _};
use std::io::IsTerminal;
use std::time::Duration;

use relayhub::config::LogFormat;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FormatFields, FormattedFields};

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

/// Installs the global subscriber writing `format` to stderr.
pub fn init(format: LogFormat, filter: EnvFilter) -> Result<Logging, String> {
    let (writer, guard, dropped) = batched(std::io::stderr())
        .map_err(|e| format!("cannot start the log writer thread: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal());
    let result = match format {
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .fmt_fields(JsonObjectFields)
            .try_init(),
        LogFormat::Human => builder.fmt_fields(OneLineFields).try_init(),
    };
    result.map_err(|e| e.to_string())?;
    Ok(Logging {
        _guard: guard,
        dropped,
    })
}

/// The span field whose JSON-object text is embedded as an object.
const OBJECT_FIELD: &str = "fields";

fn json_object(field: &Field, text: &str) -> Option<Value> {
    if field.name() != OBJECT_FIELD {
        return None;
    }
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => Some(v),
        _ => None,
    }
}

/// Span fields as a JSON object, `fields` embedded as an object.
pub struct JsonObjectFields;

struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl JsonVisitor<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        self.0.insert(field.name().to_string(), value);
    }
}

impl Visit for JsonVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let v = json_object(field, value).unwrap_or_else(|| Value::from(value));
        self.put(field, v);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        let v = json_object(field, &text).unwrap_or(Value::String(text));
        self.put(field, v);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
}

impl<'w> FormatFields<'w> for JsonObjectFields {
    fn format_fields<R: RecordFields>(&self, mut writer: Writer<'w>, fields: R) -> fmt::Result {
        let mut map = Map::new();
        fields.record(&mut JsonVisitor(&mut map));
        writer.write_str(&Value::Object(map).to_string())
    }

    fn add_fields(
        &self,
        current: &'w mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        let mut map = match serde_json::from_str::<Value>(&current.fields) {
            Ok(Value::Object(m)) => m,
            _ => Map::new(),
        };
        fields.record(&mut JsonVisitor(&mut map));
        current.fields = Value::Object(map).to_string();
        Ok(())
    }
}

/// Fields as `name=value`, the message bare, every value on one line.
pub struct OneLineFields;

struct LineVisitor<'a, 'w> {
    writer: &'a mut Writer<'w>,
    empty: bool,
    result: fmt::Result,
}

impl LineVisitor<'_, '_> {
    fn write(&mut self, field: &Field, value: &str) {
        if self.result.is_err() {
            return;
        }
        let sep = if self.empty { "" } else { " " };
        self.empty = false;
        self.result = if field.name() == "message" {
            write!(self.writer, "{sep}{}", one_line(value))
        } else {
            write!(self.writer, "{sep}{}={}", field.name(), one_line(value))
        };
    }
}

impl Visit for LineVisitor<'_, '_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" || json_object(field, value).is_some() {
            self.write(field, value);
        } else {
            self.write(field, &format!("{value:?}"));
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format!("{value:?}"));
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

/// `text` with line breaks and other control characters escaped, so that
/// a value (a TOML error, a peer's bytes) can neither split an event into
/// several lines nor forge one.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return text.into();
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push('\t'),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.into()
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn values_stay_on_one_line() {
        assert_eq!(one_line("plain"), "plain");
        assert_eq!(
            one_line("TOML parse error\n  |\n1 | [server\r\n"),
            "TOML parse error\\n  |\\n1 | [server\\r\\n"
        );
        assert_eq!(one_line("a\u{1b}[31mb"), "a\\u{1b}[31mb");
    }
}
