//! Core URLs with host names (docs/operations.md, `resolve_refresh_ms`): a name
//! is looked up by the target, never per call; one that does not resolve is
//! "not sent" (E902) and nothing reaches any core.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

/// The fixture's URL with `localhost` for its IP literal.
fn by_name(core_url: &str) -> String {
    let port = core_url.rsplit(':').next().expect("a port");
    format!("http://localhost:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_url_with_a_host_name_works() {
    let core = start_core().await;
    let url = by_name(&core.url());
    let s = setup_with(HubOpts {
        core_url: Some(url),
        ..HubOpts::default()
    })
    .await;
    for tag in ["NAME1", "NAME2"] {
        let g = guid(tag);
        let mut ch = s.channel().await;
        let a = exchange(&mut ch, &transfer(&g, 10_000)).await;
        assert_eq!(a.code, "0000", "{tag}: {a:?}");
        assert_eq!(posts(&core, &g), 1, "{tag} reached the core by its name");
    }
    // The hub's own fixture was never called: the name led to `core`.
    s.assert_calls(0, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_host_name_is_e902_and_nothing_is_posted() {
    let budget = 1_000u64;
    let s = setup_with(HubOpts {
        budget_ms: Some(budget),
        // `.invalid` never resolves (RFC 6761).
        core_url: Some("http://relayhub-no-such-core.invalid:8080".into()),
        ..HubOpts::default()
    })
    .await;
    let g = guid("NONAME");
    let mut ch = s.channel().await;
    let started = Instant::now();
    let a = exchange(&mut ch, &transfer(&g, 10_000)).await;
    let elapsed = started.elapsed();
    assert_header_only(&a, "TRF001", &g, "E902");
    assert!(
        elapsed < Duration::from_millis(budget),
        "E902 after {elapsed:?}, budget {budget} ms"
    );
    s.assert_calls(0, 0);
    assert_eq!(s.balance(ACC1), 1_000_000);
}
