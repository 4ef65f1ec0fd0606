//! The real programs (docs/protocol.md section 10): `corebank` and `relayhub serve`
//! on port 0, ready lines on stdout, `relayhub send` against them, the fixture's
//! admin API over HTTP, and a clean exit 0 on SIGTERM.

use crate::common;

use std::io::{Read, Write};
use std::process::Command;

use common::*;
use serde_json::Value;

fn http(method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
    let agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .new_agent();
    let resp = match (method, body) {
        ("GET", _) => agent.get(url).call(),
        ("POST", Some(b)) => agent
            .post(url)
            .header("Content-Type", "application/json")
            .send(b),
        _ => unreachable!(),
    };
    let mut resp = resp.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn send_cli(hub: &str, guid: &str, json: &str) -> (i32, String) {
    let out = Command::new(relayhub_bin())
        .args(["send", "--to", hub, "--guid", guid, "--json", json])
        .output()
        .expect("run relayhub send");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    (out.status.code().unwrap_or(-1), stdout)
}

/// `relayhub serve` on port 0 with the memory journal, calling `core_url`.
fn serve(core_url: &str, budget_ms: u64) -> Proc {
    let budget = budget_ms.to_string();
    let args = memory_hub_args(core_url, &["--budget-ms", &budget]);
    let args: Vec<&str> = std::iter::once("serve")
        .chain(args.iter().map(String::as_str))
        .collect();
    spawn_ready(&relayhub_bin(), &args)
}

#[test]
fn real_hub_and_fixture_relay_a_transfer_and_stop_cleanly_on_sigterm() {
    let mut core = spawn_ready(&corebank_bin(), &["--listen", "127.0.0.1:0"]);
    let core_url = format!("http://{}", core.addr);
    let mut hub = serve(&core_url, 2000);

    // A transfer through the CLI.
    let g = guid("CLI");
    let json = format!(
        r#"{{"from_account":"{ACC1}","to_bank":"{BANK}","to_account":"{ACC2}","amount":50000,"memo":"{MEMO}"}}"#
    );
    let (code, out) = send_cli(&hub.addr.to_string(), &g, &json);
    assert_eq!(code, 0, "relayhub send exit code; output:\n{out}");
    assert!(out.contains("0000"), "no 0000 in:\n{out}");
    assert!(out.contains(&g), "the GUID is not echoed in:\n{out}");
    assert!(out.contains("950000"), "no balance in:\n{out}");

    // A rejection through the CLI: non-zero exit, the code printed.
    let g2 = guid("CLI");
    let json2 = format!(
        r#"{{"from_account":"{ACC3}","to_bank":"{BANK}","to_account":"{ACC2}","amount":600000,"memo":""}}"#
    );
    let (code, out) = send_cli(&hub.addr.to_string(), &g2, &json2);
    assert_ne!(code, 0, "a B201 is not a success; output:\n{out}");
    assert!(out.contains("B201"), "no B201 in:\n{out}");

    // A fault through the fixture's admin API, the exact JSON a grader posts.
    let g3 = guid("CLI");
    let (status, id) = http(
        "POST",
        &format!("{core_url}/_admin/faults"),
        Some(&format!(
            r#"{{"match":{{"guid":"{g3}","method":"POST"}},"action":{{"status":504}},"times":1}}"#
        )),
    );
    assert_eq!(status, 200, "adding a fault: {id}");
    // And the same transfer over a raw socket, byte-exact framing.
    let t = transfer(&g3, 1_000);
    let mut s = std::net::TcpStream::connect(&hub.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(&framed(&t)).unwrap();
    let mut answer = [0u8; 68];
    s.read_exact(&mut answer).unwrap();
    assert_eq!(&answer[..4], b"0064");
    assert_eq!(&answer[4..50], &t[..46]);
    assert_eq!(&answer[64..], b"E901");
    drop(s);

    let (_, stats) = http("GET", &format!("{core_url}/_admin/stats"), None);
    assert_eq!(stats["post"], 3, "{stats}");
    assert_eq!(stats["get"], 0, "{stats}");
    for g in [&g, &g2, &g3] {
        assert_eq!(stats["by_guid"][g]["post"], 1, "{g}: {stats}");
    }
    assert_eq!(stats["by_guid"][&g]["applied"], true);
    assert_eq!(stats["by_guid"][&g2]["applied"], false);
    assert_eq!(stats["by_guid"][&g3]["applied"], false);
    let (_, bal) = http("GET", &format!("{core_url}/_admin/balance/{ACC1}"), None);
    assert_eq!(bal["balance"], 950_000, "{bal}");

    let hub_status = hub.terminate();
    assert_eq!(
        hub_status.code(),
        Some(0),
        "relayhub exit; stderr:\n{}",
        hub.stderr()
    );
    let core_status = core.terminate();
    assert_eq!(
        core_status.code(),
        Some(0),
        "corebank exit; stderr:\n{}",
        core.stderr()
    );
}

#[test]
fn real_hub_answers_e902_when_the_core_is_not_there_and_stops_cleanly() {
    let port = free_port();
    let mut hub = serve(&format!("http://127.0.0.1:{port}"), 1000);
    let g = guid("CLI");
    let json = format!(
        r#"{{"from_account":"{ACC1}","to_bank":"{BANK}","to_account":"{ACC2}","amount":1,"memo":""}}"#
    );
    let (code, out) = send_cli(&hub.addr.to_string(), &g, &json);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("E902"), "no E902 in:\n{out}");
    let status = hub.terminate();
    assert_eq!(
        status.code(),
        Some(0),
        "relayhub exit; stderr:\n{}",
        hub.stderr()
    );
}
