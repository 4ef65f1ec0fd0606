//! docs/operations.md and README.ko.md stay true to the code:
//! - the configuration reference lists every key of `Config` (serialised from
//!   the real structs, every optional key filled in), in its section, and no
//!   key that does not exist;
//! - the metrics list names every metric the source records;
//! - README.ko.md has README.md's sections and the same commands.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use relayhub::config::{AuthConfig, ChannelConfig, Config, Operation, RouteConfig, TargetConfig};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

/// A config with every optional key set, one of each table array.
fn full_config() -> Config {
    let mut c = Config::default();
    c.server.admin_listen = Some("127.0.0.1:9101".into());
    c.server.layouts_dir = Some("/etc/relayhub/layouts".into());
    c.server.codes_file = Some("/etc/relayhub/codes.json".into());
    let mut t = TargetConfig::with_url("core", "http://127.0.0.1:8080");
    t.connect_timeout_ms = Some(500);
    t.auth = Some(AuthConfig {
        bearer: Some("t".into()),
        bearer_env: Some("CORE_TOKEN".into()),
        header_env: Some("CORE_AUTHORIZATION".into()),
    });
    c.targets.push(t);
    c.routes.push(RouteConfig {
        tx_code: "TRF001".into(),
        operation: Operation::Transfer,
        target: "core".into(),
        layout: Some("TRF001".into()),
    });
    c.channels.push(ChannelConfig {
        id: "IBANK".into(),
        allow_from: vec!["10.0.0.0/8".into()],
        tx_codes: vec!["TRF001".into()],
    });
    c
}

/// Section heading in the docs -> key names, from the serialised config.
fn config_keys() -> BTreeMap<String, BTreeSet<String>> {
    let value = toml::Value::try_from(full_config()).expect("config serialises");
    let top = value.as_table().unwrap();
    let mut out = BTreeMap::new();
    for (name, v) in top {
        let (heading, table) = match v {
            toml::Value::Table(t) => (format!("[{name}]"), t.clone()),
            toml::Value::Array(a) => (
                format!("[[{name}]]"),
                a[0].as_table().expect("array of tables").clone(),
            ),
            other => panic!("top-level key {name} is not a table: {other:?}"),
        };
        let mut keys = BTreeSet::new();
        for (k, v) in &table {
            keys.insert(k.clone());
            // Nested tables (target.auth) are documented in the same section.
            if let toml::Value::Table(inner) = v {
                keys.extend(inner.keys().cloned());
            }
        }
        out.insert(heading, keys);
    }
    out
}

/// The text of `### HEADING` up to the next `##`-level heading.
fn section<'a>(doc: &'a str, heading: &str) -> &'a str {
    let marker = format!("\n### {heading}\n");
    let start = doc
        .find(&marker)
        .unwrap_or_else(|| panic!("docs/operations.md has no `### {heading}` section"))
        + marker.len();
    let rest = &doc[start..];
    let end = rest
        .find("\n## ")
        .into_iter()
        .chain(rest.find("\n### "))
        .min();
    &rest[..end.unwrap_or(rest.len())]
}

/// The first-column names of table rows: "| `name` |".
fn row_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |").map(|(k, _)| k.to_string()))
        .collect()
}

#[test]
fn config_reference_lists_every_key_and_only_real_ones() {
    let doc = read("docs/operations.md");
    let keys = config_keys();
    assert_eq!(
        keys.keys().cloned().collect::<Vec<_>>(),
        [
            "[[channel]]",
            "[[route]]",
            "[[target]]",
            "[journal]",
            "[logging]",
            "[server]"
        ]
    );
    for (heading, keys) in &keys {
        let documented = row_names(section(&doc, heading));
        let missing: Vec<_> = keys.difference(&documented).collect();
        assert!(
            missing.is_empty(),
            "docs/operations.md `### {heading}` lacks {missing:?}"
        );
        let stale: Vec<_> = documented.difference(keys).collect();
        assert!(
            stale.is_empty(),
            "docs/operations.md `### {heading}` documents keys that do not exist: {stale:?}"
        );
    }
}

#[test]
fn config_reference_defaults_match_the_code() {
    let doc = read("docs/operations.md");
    let c = Config::default();
    let t = TargetConfig::with_url("core", "http://x");
    let expect = [
        ("[server]", "budget_ms", c.server.budget_ms.to_string()),
        (
            "[server]",
            "max_telegram_len",
            c.server.max_telegram_len.to_string(),
        ),
        (
            "[server]",
            "idle_timeout_ms",
            c.server.idle_timeout_ms.to_string(),
        ),
        (
            "[server]",
            "read_timeout_ms",
            c.server.read_timeout_ms.to_string(),
        ),
        (
            "[server]",
            "max_connections",
            c.server.max_connections.to_string(),
        ),
        (
            "[server]",
            "max_in_flight_per_connection",
            c.server.max_in_flight_per_connection.to_string(),
        ),
        ("[server]", "listen", format!("\"{}\"", c.server.listen)),
        ("[journal]", "path", format!("\"{}\"", c.journal.path)),
        (
            "[journal]",
            "max_resends",
            c.journal.max_resends.to_string(),
        ),
        (
            "[journal]",
            "resend_cooldown_ms",
            c.journal.resend_cooldown_ms.to_string(),
        ),
        (
            "[journal]",
            "retention_hours",
            c.journal.retention_hours.to_string(),
        ),
        ("[journal]", "max_batch", c.journal.max_batch.to_string()),
        ("[logging]", "filter", format!("\"{}\"", c.logging.filter)),
        (
            "[[target]]",
            "late_answer_window_ms",
            t.late_answer_window_ms.to_string(),
        ),
        (
            "[[target]]",
            "max_concurrency",
            t.max_concurrency.to_string(),
        ),
        ("[[target]]", "queue_wait_ms", t.queue_wait_ms.to_string()),
        (
            "[[target]]",
            "connect_attempts",
            t.connect_attempts.to_string(),
        ),
        (
            "[[target]]",
            "inquiry_attempts",
            t.inquiry_attempts.to_string(),
        ),
        ("[[target]]", "backoff_ms", t.backoff_ms.to_string()),
        (
            "[[target]]",
            "connect_timeout_ms",
            relayhub::config::DEFAULT_CONNECT_TIMEOUT_MS.to_string(),
        ),
    ];
    for (heading, key, default) in expect {
        let text = section(&doc, heading);
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| `{key}` |")))
            .unwrap_or_else(|| panic!("no row for {key} in {heading}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | key | type | default | meaning |
        assert!(
            cells[3].starts_with(&format!("`{default}`")),
            "{heading} {key}: documented default {:?}, the code has {default}",
            cells[3]
        );
    }
}

/// Every `"relayhub_..."` string literal under `dir`.
fn metric_names(dir: &Path, out: &mut BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            metric_names(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for piece in text.split("\"relayhub_").skip(1) {
                let name: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                out.insert(format!("relayhub_{name}"));
            }
        }
    }
}

#[test]
fn every_metric_in_the_source_is_documented_and_described() {
    let mut names = BTreeSet::new();
    metric_names(&repo("src"), &mut names);
    assert!(names.len() >= 10, "found only {names:?}");
    let doc = read("docs/operations.md");
    let metrics = &doc[doc.find("\n## Metrics\n").expect("a Metrics section")..];
    let metrics = &metrics[..metrics[1..]
        .find("\n## ")
        .map(|i| i + 1)
        .unwrap_or(metrics.len())];
    let listed = row_names(metrics);
    let admin = read("src/metric_names.rs");
    for name in &names {
        assert!(
            listed.contains(name),
            "{name} is recorded but not in the metrics list of docs/operations.md"
        );
        assert!(
            admin.contains(&format!("\"{name}\"")),
            "{name} is recorded but not named (and described) in src/metric_names.rs"
        );
    }
    let stale: Vec<_> = listed.difference(&names).collect();
    assert!(stale.is_empty(), "documented but never recorded: {stale:?}");
}

/// Headings (`##`, `###`) and code blocks of a Markdown file; comments in code
/// (`# ...`) and the descriptions of a file map are translated, so they are cut.
fn skeleton(text: &str) -> (Vec<usize>, Vec<String>) {
    let mut levels = Vec::new();
    let mut blocks = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("```") {
            match block.take() {
                Some(b) => blocks.push(b),
                None => block = Some(String::new()),
            }
            continue;
        }
        if let Some(b) = block.as_mut() {
            let code = match line.find(" #") {
                Some(i) => &line[..i],
                None if line.trim_start().starts_with('#') => "",
                None => line,
            };
            // A file map (`src/relay.rs    one telegram...`): the path is the
            // command-like part, the description is prose.
            let code = match code.split_once("  ") {
                Some((path, _)) if path.contains('/') && !path.contains(' ') => path,
                _ => code,
            };
            b.push_str(code.trim_end());
            b.push('\n');
        } else if let Some(rest) = line.strip_prefix("##") {
            levels.push(2 + rest.chars().take_while(|c| *c == '#').count());
        }
    }
    (levels, blocks)
}

#[test]
fn korean_readme_keeps_step_with_the_english_one() {
    let en = read("README.md");
    let ko = read("README.ko.md");
    let (en_levels, en_blocks) = skeleton(&en);
    let (ko_levels, ko_blocks) = skeleton(&ko);
    assert_eq!(ko_levels, en_levels, "section structure differs");
    assert_eq!(ko_blocks.len(), en_blocks.len(), "number of code blocks");
    for (i, (k, e)) in ko_blocks.iter().zip(&en_blocks).enumerate() {
        assert_eq!(k, e, "code block {i} differs");
    }
    assert!(
        ko.contains("README.md"),
        "README.ko.md links back to README.md"
    );
    assert!(
        en.contains("README.ko.md"),
        "README.md links to README.ko.md"
    );
    for word in [
        "전문",
        "계정계",
        "응답코드",
        "거래코드",
        "결과조회",
        "이체",
        "채널",
    ] {
        assert!(ko.contains(word), "README.ko.md does not use {word}");
    }
}
