//! Reloading in-process (`Daemon::reload`, what SIGHUP calls): routes and the
//! channel table are swapped as one unit; a broken version is refused with its
//! reason and the old one stays; a telegram keeps the rules it started with.

use crate::common;
use crate::resilience_support;

use common::*;
use corebank::{FaultMethod, FaultRule};
use resilience_support::*;

fn config(core_url: &str, routes: &str, channels: &str) -> String {
    format!("{}{routes}{channels}", target_toml("core", &[core_url], ""))
}

fn trf002_route() -> String {
    route_toml("TRF002", "transfer", "core", Some("TRF001"))
}

async fn code(hub: &FileHub, telegram: &[u8]) -> String {
    let mut ch = hub.channel().await;
    exchange(&mut ch, telegram).await.code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_brings_in_a_channel_table_and_takes_it_away() {
    let core = start_core().await;
    let routes = default_routes_toml("core");
    let hub = start_file_hub(&config(&core.url(), &routes, "")).await;
    let t = |ch: &str| transfer_as("TRF001", &guid("RLCH"), ch, 1_000);

    // No table: any well-formed channel may call.
    assert_eq!(code(&hub, &t("WHOEVER")).await, "0000");

    hub.rewrite(&config(
        &core.url(),
        &routes,
        "[[channel]]\nid = \"IBANK\"\nallow_from = [\"127.0.0.1\"]\n",
    ));
    hub.daemon.reload().expect("valid config");
    assert_eq!(code(&hub, &t("WHOEVER")).await, "E103");
    assert_eq!(code(&hub, &t("IBANK")).await, "0000");

    hub.rewrite(&config(&core.url(), &routes, ""));
    hub.daemon.reload().expect("valid config");
    assert_eq!(code(&hub, &t("WHOEVER")).await, "0000");
    assert_eq!(core.stats().post, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_says_why_and_changes_nothing() {
    let core = start_core().await;
    let good_routes = default_routes_toml("core") + &trf002_route();
    let channels = "[[channel]]\nid = \"IBANK\"\n";
    let hub = start_file_hub(&config(&core.url(), &good_routes, channels)).await;

    let broken = [
        (
            "an unknown key",
            format!(
                "[server]\nno_such_key = 1\n{}",
                config(&core.url(), &good_routes, channels)
            ),
            "no_such_key",
        ),
        (
            "a route with no layout",
            config(
                &core.url(),
                &(good_routes.clone() + &route_toml("TRF009", "transfer", "core", None)),
                channels,
            ),
            "TRF009",
        ),
        (
            "a route to an unknown target",
            config(
                &core.url(),
                &(good_routes.clone()
                    + &route_toml("TRF008", "transfer", "nowhere", Some("TRF001"))),
                channels,
            ),
            "nowhere",
        ),
        (
            "a channel allowed an unrouted tx code",
            config(
                &core.url(),
                &good_routes,
                "[[channel]]\nid = \"IBANK\"\ntx_codes = [\"TRF777\"]\n",
            ),
            "TRF777",
        ),
        (
            "a transfer route on an inquiry layout",
            config(
                &core.url(),
                &(default_routes_toml("core")
                    + &route_toml("TRF002", "inquiry", "core", Some("TRF001"))),
                channels,
            ),
            "TRF002",
        ),
        (
            "a missing layouts folder",
            format!(
                "[server]\nlayouts_dir = \"/nonexistent/relayhub-layouts\"\n{}",
                config(&core.url(), &good_routes, channels)
            ),
            "relayhub-layouts",
        ),
    ];
    for (what, text, names) in broken {
        hub.rewrite(&text);
        let err = hub
            .daemon
            .reload()
            .expect_err(&format!("{what}: reload accepted"))
            .to_string();
        assert!(
            err.contains(names),
            "{what}: the reason names {names:?}: {err}"
        );
        // The previous version is whole and in force.
        let g = guid("RLBAD");
        assert_eq!(
            code(&hub, &transfer_as("TRF002", &g, "IBANK", 1_000)).await,
            "0000",
            "{what}"
        );
        let g = guid("RLBAD");
        assert_eq!(
            code(&hub, &transfer_as("TRF001", &g, "OTHER", 1_000)).await,
            "E103",
            "{what}"
        );
        for tx in ["TRF009", "TRF008"] {
            let g = guid("RLBAD");
            assert_eq!(
                code(&hub, &transfer_as(tx, &g, "IBANK", 1_000)).await,
                "E101",
                "{what}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_in_flight_keeps_the_rules_it_started_with() {
    let core = start_core().await;
    let hub = start_file_hub(&config(
        &core.url(),
        &(default_routes_toml("core") + &trf002_route()),
        "",
    ))
    .await;
    let held = guid("RLHELD");
    core.add_fault(
        FaultRule::guid(&held)
            .method(FaultMethod::Post)
            .delay_ms(1_000),
    );
    let mut ch = hub.channel().await;
    let telegram = transfer_as("TRF002", &held, CHANNEL, 1_000);
    let flight = tokio::spawn(async move { exchange(&mut ch, &telegram).await });
    within(core.wait_received(&held)).await;

    // TRF002 goes away while its transfer is at the core.
    hub.rewrite(&config(&core.url(), &default_routes_toml("core"), ""));
    hub.daemon.reload().expect("valid config");
    let g = guid("RLNEW");
    assert_eq!(
        code(&hub, &transfer_as("TRF002", &g, CHANNEL, 1_000)).await,
        "E101"
    );
    let a = within(flight).await.unwrap();
    assert_answer(&a, "TRF002", &held, CHANNEL, "0000");
    assert_eq!(core.stats().post, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_stay_as_started_across_a_reload() {
    let core = start_core().await;
    let routes = default_routes_toml("core");
    let hub = start_file_hub(&config(&core.url(), &routes, "")).await;
    // The documented choice: endpoints and bulkheads are fixed at start-up.
    let dead = refused_port();
    hub.rewrite(&config(&dead.url, &routes, ""));
    hub.daemon
        .reload()
        .expect("a target change is not an error");
    let g = guid("RLTGT");
    assert_eq!(code(&hub, &transfer(&g, 1_000)).await, "0000");
    assert_eq!(core.stats().by_guid[&g].post, 1);
}

/// A transfer left unknown at one target, whose route a reload then moves to
/// another: its resend (and an INQ001 about it) asks the target that still
/// has the URL the attempt went to, whose answer settles it. Before, the new
/// target was asked, its "never received" could prove nothing about another
/// URL, and the transfer stayed E901 for as long as the route pointed there
/// (found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_transfer_is_asked_where_it_went_after_its_route_moved() {
    let first = start_core().await;
    let second = start_core().await;
    let targets =
        target_toml("first", &[&first.url()], "") + &target_toml("second", &[&second.url()], "");
    let hub = start_file_hub(&(targets.clone() + &default_routes_toml("first"))).await;
    let g = guid("MOVED");
    // The first core applies it, then answers 502: the hub cannot know.
    first.add_fault(
        FaultRule::guid(&g)
            .method(FaultMethod::Post)
            .status(502)
            .phase(corebank::Phase::AfterApply),
    );
    assert_eq!(code(&hub, &transfer(&g, 1_000)).await, "E901");

    hub.rewrite(&(targets + &default_routes_toml("second")));
    hub.daemon.reload().expect("valid config");
    assert_eq!(code(&hub, &transfer(&g, 1_000)).await, "0000");
    assert_eq!(code(&hub, &inquiry(&guid("MOVEDQ"), &g)).await, "0000");
    assert_eq!(
        calls(&first, &g),
        (1, 2),
        "one POST, then both questions to the first core"
    );
    assert_eq!(
        calls(&second, &g),
        (0, 0),
        "nothing about it went to the second core"
    );
}

/// An empty config file (caught while being written) is refused by a reload:
/// every key has a default, so it would drop the channel table and routes in
/// force (found by a black-box probe).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refuses_an_empty_file() {
    let core = start_core().await;
    // The core from the command line, as the probe had it: then an empty
    // file is a valid config (one default target, routes and no table).
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("relayhub.toml");
    std::fs::write(&path, "[[channel]]\nid = \"IBANK\"\n").unwrap();
    let daemon = relayhub::daemon::Daemon::start(relayhub::daemon::Source {
        file: Some(path.clone()),
        overrides: relayhub::config::Overrides {
            listen: Some("127.0.0.1:0".into()),
            journal: Some("memory".into()),
            core_url: Some(core.url()),
            ..Default::default()
        },
    })
    .await
    .expect("start");
    let hub = FileHub { daemon, dir };
    let t = |ch: &str| transfer_as("TRF001", &guid("RLEMPTY"), ch, 1_000);
    assert_eq!(code(&hub, &t("WHOEVER")).await, "E103");
    for blank in ["", " \n\t\n"] {
        hub.rewrite(blank);
        let e = hub.daemon.reload().expect_err("an empty file is refused");
        assert!(e.to_string().contains("the file is empty"), "{e}");
        assert_eq!(code(&hub, &t("WHOEVER")).await, "E103", "the table stays");
    }
    assert_eq!(code(&hub, &t("IBANK")).await, "0000");
}

/// A route a reload adds must fit the limit the running listener reads,
/// not only the file's: max_telegram_len takes effect at a restart, so a
/// longer route taken by the reload would be E102 until then. Refused, with
/// the numbers; a restart with the file's limit takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_refuses_a_route_longer_than_the_running_hub_reads() {
    let core = start_core().await;
    // INQ001's telegram is 96 bytes, TRF001's 132.
    let inquiries = route_toml("INQ001", "inquiry", "core", None);
    let hub = start_file_hub(&format!(
        "[server]\nmax_telegram_len = 100\n{}",
        config(&core.url(), &inquiries, "")
    ))
    .await;
    hub.rewrite(&format!(
        "[server]\nmax_telegram_len = 4096\n{}",
        config(&core.url(), &default_routes_toml("core"), "")
    ));
    let err = hub
        .daemon
        .reload()
        .expect_err("a route the listener cannot read was taken")
        .to_string();
    assert!(
        err.contains("route.TRF001: its telegram is 132 bytes") && err.contains("(100, "),
        "{err}"
    );
}
