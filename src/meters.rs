//! Metric handles kept where the telegram path reaches them, instead of
//! looked up by name and labels on every telegram.
//!
//! A `metrics::counter!` with labels builds its key (the labels' strings
//! allocated), hashes it and searches the recorder's registry: three of them
//! per telegram were about 5% of the memory-journal hub's instructions. A
//! [`TelegramMeters`] belongs to one route (or to the unrouted bucket) of one
//! [`crate::rules::Rules`], a [`CallMeters`] to one target; each registers its
//! handles on first use, after the daemon has installed its recorder, and a
//! reload's new rules start with new ones. The label values are the same as
//! the macros wrote, so the exposition does not change.

use std::sync::{OnceLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram};

use crate::metric_names;
use crate::outcome::Code;

/// `relayhub_telegrams_total` by answer code and the telegram duration
/// histogram of one `tx_code` label value.
#[derive(Default)]
pub struct TelegramMeters {
    duration: OnceLock<Histogram>,
    /// One counter per answer code seen; a handful per tx code.
    by_code: RwLock<Vec<(Code, Counter)>>,
}

impl std::fmt::Debug for TelegramMeters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TelegramMeters")
    }
}

impl TelegramMeters {
    /// Counts one telegram of `tx_code` answered `code` after `elapsed`.
    pub fn record(&self, tx_code: &str, code: Code, elapsed: Duration) {
        self.count(tx_code, code);
        self.duration
            .get_or_init(|| {
                metrics::histogram!(metric_names::TELEGRAM_DURATION, "tx_code" => tx_code.to_string())
            })
            .record(elapsed.as_secs_f64());
    }

    fn count(&self, tx_code: &str, code: Code) {
        // The read guard is gone at the end of this statement.
        let known = bump(
            &self
                .by_code
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            code,
        );
        if known {
            return;
        }
        let mut all = self
            .by_code
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Another thread may have registered it meanwhile.
        if bump(&all, code) {
            return;
        }
        let counter = metrics::counter!(metric_names::TELEGRAMS, "tx_code" => tx_code.to_string(), "code" => code.as_str().to_string());
        counter.increment(1);
        all.push((code, counter));
    }
}

/// Bumps `code`'s counter in `counters`; false when it has none yet.
fn bump(counters: &[(Code, Counter)], code: Code) -> bool {
    counters
        .iter()
        .find(|(c, _)| *c == code)
        .map(|(_, counter)| counter.increment(1))
        .is_some()
}

/// The core call duration histograms of one target, by operation.
#[derive(Default)]
pub struct CallMeters {
    transfer: OnceLock<Histogram>,
    inquiry: OnceLock<Histogram>,
}

impl CallMeters {
    /// Records a transfer's (`inquiry` false) or an inquiry's core call time.
    pub fn record(&self, target: &str, inquiry: bool, elapsed: Duration) {
        let (slot, operation) = if inquiry {
            (&self.inquiry, "inquiry")
        } else {
            (&self.transfer, "transfer")
        };
        slot.get_or_init(|| {
            metrics::histogram!(metric_names::CORE_CALL_DURATION, "target" => target.to_string(), "operation" => operation)
        })
        .record(elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    /// The cached handles write the same series the macros wrote: the same
    /// names and labels, one counter per code, counts that add up.
    #[test]
    fn cached_handles_write_the_series_the_macros_wrote() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let meters = TelegramMeters::default();
            meters.record("TRF001", Code::OK, Duration::from_millis(3));
            meters.record("TRF001", Code::OK, Duration::from_millis(4));
            meters.record("TRF001", Code::UNKNOWN, Duration::from_millis(5));
            let calls = CallMeters::default();
            calls.record("core", false, Duration::from_millis(2));
            calls.record("core", true, Duration::from_millis(1));
            calls.record("core", true, Duration::from_millis(1));
        });
        let text = handle.render();
        let line = |prefix: &str| {
            text.lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("no line {prefix} in\n{text}"))
                .to_string()
        };
        assert!(
            line(&format!(
                "{}{{tx_code=\"TRF001\",code=\"0000\"}}",
                metric_names::TELEGRAMS
            ))
            .ends_with(" 2")
        );
        assert!(
            line(&format!(
                "{}{{tx_code=\"TRF001\",code=\"E901\"}}",
                metric_names::TELEGRAMS
            ))
            .ends_with(" 1")
        );
        assert!(
            line(&format!(
                "{}_count{{tx_code=\"TRF001\"}}",
                metric_names::TELEGRAM_DURATION
            ))
            .ends_with(" 3")
        );
        assert!(
            line(&format!(
                "{}_count{{target=\"core\",operation=\"transfer\"}}",
                metric_names::CORE_CALL_DURATION
            ))
            .ends_with(" 1")
        );
        assert!(
            line(&format!(
                "{}_count{{target=\"core\",operation=\"inquiry\"}}",
                metric_names::CORE_CALL_DURATION
            ))
            .ends_with(" 2")
        );
    }
}
