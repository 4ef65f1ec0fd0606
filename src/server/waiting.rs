//! Telegrams that wait in their connection for room to start (the
//! connection has `max_in_flight_per_connection` in flight): counted as
//! handled from their read, and held in order.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::time::Instant;

use super::Answerer;
use crate::frame::FrameCodec;
use crate::header::Echo;

/// A transfer that has to wait for room to start (its connection has its
/// maximum in flight) while its budget runs: its GUID counts as handled by
/// the hub from its read until its task ends, so an inquiry about it in the
/// meantime does not take the core's "never received" for an answer.
pub(super) struct WaitingMark<H: Answerer> {
    hub: Arc<H>,
    /// `None` when the hub did not count it (not a transfer).
    guid: Option<String>,
}

impl<H: Answerer> WaitingMark<H> {
    pub(super) fn new(hub: &Arc<H>, echo: &Echo) -> WaitingMark<H> {
        WaitingMark {
            hub: hub.clone(),
            guid: hub
                .waiting_to_start(echo)
                .then(|| echo.guid_str().to_string()),
        }
    }
}

impl<H: Answerer> Drop for WaitingMark<H> {
    fn drop(&mut self) {
        if let Some(guid) = &self.guid {
            self.hub.no_longer_waiting(guid);
        }
    }
}

/// Frames every telegram whole in `buf` into `held`, each marked as waiting
/// and timed from now (a malformed one stays in `buf`, answered in its turn).
pub(super) fn hold_whole_telegrams<H: Answerer>(
    codec: &FrameCodec,
    buf: &mut BytesMut,
    held: &mut VecDeque<Held<H>>,
    hub: &Arc<H>,
) {
    while let Ok(Some(telegram)) = codec.decode(buf) {
        let mark = WaitingMark::new(hub, &Echo::from_telegram(&telegram));
        held.push_back(Held {
            telegram,
            read_at: Instant::now(),
            mark: Some(mark),
        });
    }
}

/// A telegram read whole that waits in the connection for room to start,
/// behind one that waits already: timed and marked from its read.
pub(super) struct Held<H: Answerer> {
    pub(super) telegram: Bytes,
    pub(super) read_at: Instant,
    pub(super) mark: Option<WaitingMark<H>>,
}

/// The bytes of the telegrams held whole: with the partial one in the
/// buffer, what the connection's read-ahead counts (before, only the
/// buffer was counted, so a channel pipelining without end was read without
/// end while a telegram waited for room; found by a review).
pub(super) fn held_bytes<H: Answerer>(held: &VecDeque<Held<H>>) -> usize {
    held.iter().map(|h| h.telegram.len()).sum()
}
