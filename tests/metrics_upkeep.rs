//! The metrics recorder keeps every histogram sample until it is folded into
//! its buckets; a hub whose `/metrics` nobody scrapes must still not grow by
//! one sample per telegram. A test binary of its own: it counts the
//! process's live heap bytes with an allocator that wraps the system's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a
// counter is updated beside it.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const SAMPLES: usize = 1_000_000;

#[test]
fn histogram_samples_are_folded_without_a_scrape() {
    // As a hub's start does: the recorder, and its upkeep every 5 s.
    relayhub::admin::describe();
    let histogram = metrics::histogram!("relayhub_test_upkeep_seconds");
    let before = LIVE.load(Ordering::Relaxed);
    for i in 0..SAMPLES {
        histogram.record(i as f64 * 1e-6);
    }
    let held = LIVE.load(Ordering::Relaxed) - before;
    // About 8 bytes a sample while they wait (the upkeep may have folded
    // some already).
    println!("live heap after {SAMPLES} samples: +{held} bytes");
    // Folded by the upkeep, the samples' blocks are freed once no reader
    // can still see them (a few more samples move that along).
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let now = LIVE.load(Ordering::Relaxed) - before;
        if now < 1_000_000 {
            println!("live heap after the upkeep: +{now} bytes");
            return;
        }
        assert!(
            Instant::now() < until,
            "the samples' {now} bytes are still held 20 s later (no upkeep?)"
        );
        histogram.record(0.0);
        std::thread::sleep(Duration::from_millis(10));
    }
}
