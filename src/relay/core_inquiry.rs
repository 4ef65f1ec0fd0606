//! The core's `GET /v1/transfers/{guid}` with safe retries inside the
//! budget: what an INQ telegram asks, what a resend after E901 asks instead
//! of posting, and what settles a transfer whose outcome is not known.

use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use crate::core_client::{CallEnd, CallFailure, CoreRequest, Target, parse_retry_after};
use crate::metric_names;
use crate::outcome::{CodeTable, Outcome, classify_inquiry, inquiry_is_retryable};

/// `GET /v1/transfers/{guid}` with safe retries inside the budget, at `pin`
/// when given (the URL a transfer was sent to), else across the target's URLs.
pub(super) async fn inquire(
    target: &Target,
    guid: &str,
    pin: Option<&str>,
    codes: &CodeTable,
    deadline: Instant,
) -> Outcome {
    let request = CoreRequest::Inquiry {
        guid: guid.to_string(),
    };
    let started = Instant::now();
    let mut tries = 0u32;
    let outcome = loop {
        let url = pin.unwrap_or_else(|| target.url_for(tries));
        let end = target.attempt_at(&request, url, deadline).await;
        tries += 1;
        let (outcome, wait) = match end {
            CallEnd::Done(Ok(answer)) => {
                let o = classify_inquiry(answer.status, &answer.body, codes);
                let retry = inquiry_is_retryable(answer.status);
                let wait = answer.retry_after.as_deref().and_then(parse_retry_after);
                (
                    o,
                    retry.then(|| wait.unwrap_or_else(|| target.backoff(tries))),
                )
            }
            CallEnd::Done(Err(CallFailure::NotSent(r))) => {
                (Outcome::NotSent(r), Some(target.backoff(tries)))
            }
            CallEnd::Done(Err(CallFailure::MaybeSent(r))) => {
                (Outcome::Unknown(r), Some(target.backoff(tries)))
            }
            CallEnd::Done(Err(CallFailure::NoCapacity(r))) => (Outcome::NoCapacity(r), None),
            CallEnd::Pending(_) => (
                Outcome::Unknown("inquiry not answered within the budget".into()),
                None,
            ),
        };
        match wait {
            // Retry only what is safe (a GET) and only if the wait fits the budget.
            Some(pause) if tries < target.inquiry_attempts && fits(pause, deadline) => {
                metrics::counter!(metric_names::CORE_RETRIES, "target" => target.name.clone(), "operation" => "inquiry").increment(1);
                debug!(?pause, "retrying the inquiry");
                tokio::time::sleep(pause).await;
            }
            _ => break outcome,
        }
    };
    target.meters.record(&target.name, true, started.elapsed());
    // Phase timing for the telegram's summary line.
    crate::telegram_log::record_core_ms(started.elapsed().as_millis() as u64);
    outcome
}

/// Whether a pause (and a little room to call again) ends before `deadline`;
/// a pause too long to add to the clock does not fit.
pub(super) fn fits(pause: Duration, deadline: Instant) -> bool {
    pause
        .checked_add(Duration::from_millis(5))
        .and_then(|p| Instant::now().checked_add(p))
        .is_some_and(|end| end < deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_past_the_clock_does_not_fit() {
        let deadline = Instant::now() + Duration::from_secs(3);
        assert!(fits(Duration::from_millis(10), deadline));
        assert!(!fits(Duration::from_secs(5), deadline));
        assert!(!fits(Duration::MAX, deadline));
        assert!(!fits(Duration::from_secs(u64::MAX / 2), deadline));
    }
}
