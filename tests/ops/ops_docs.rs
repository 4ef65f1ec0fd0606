//! docs/operations.md and README.ko.md stay true to the code:
//! - the configuration reference lists every key of `Config` (serialised from
//!   the real structs, every optional key filled in), in its section, and no
//!   key that does not exist;
//! - the metrics list names every metric the source records;
//! - README.ko.md has README.md's sections and the same commands;
//! - docs/protocol.md keeps the contract's section numbers, and its layout
//!   tables, code table, links and worked example agree with the layout files,
//!   the code table file and the code (module `protocol`).

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
    c.server.admin_token_env = Some("RELAYHUB_ADMIN_TOKEN".into());
    c.server.admin_token_file = Some("/etc/relayhub/admin.token".into());
    c.server.layouts_dir = Some("/etc/relayhub/layouts".into());
    c.server.codes_file = Some("/etc/relayhub/codes.json".into());
    c.server.tls_listen = Some("0.0.0.0:9443".into());
    c.server.tls_cert_file = Some("/etc/relayhub/tls/hub.pem".into());
    c.server.tls_key_file = Some("/etc/relayhub/tls/hub.key".into());
    c.server.tls_client_ca_file = Some("/etc/relayhub/tls/channels-ca.pem".into());
    c.journal.retention_ms = Some(5_000);
    let mut t = TargetConfig::with_url("core", "http://127.0.0.1:8080");
    t.connect_timeout_ms = Some(500);
    t.queue_wait_ms = Some(100);
    t.wire_grace_ms = Some(35_000);
    t.ca_file = Some("/etc/relayhub/core-ca.pem".into());
    t.client_cert_file = Some("/etc/relayhub/hub.pem".into());
    t.client_key_file = Some("/etc/relayhub/hub.key".into());
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
        cert_names: vec!["ibank.channels.example".into()],
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
        (
            "[server]",
            "tls_handshake_timeout_ms",
            c.server.tls_handshake_timeout_ms.to_string(),
        ),
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
        (
            "[journal]",
            "prune_interval_ms",
            c.journal.prune_interval_ms.to_string(),
        ),
        ("[journal]", "max_batch", c.journal.max_batch.to_string()),
        (
            "[journal]",
            "fsync_outcomes",
            c.journal.fsync_outcomes.to_string(),
        ),
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
        (
            "[[target]]",
            "queue_wait_ms",
            relayhub::config::DEFAULT_QUEUE_WAIT_MS.to_string(),
        ),
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

/// docs/protocol.md stays true to the code and the data files: its sections
/// keep the contract's numbers, its layout tables are `layouts/*.json` as the
/// hub loads them, its code table lists every code the hub can answer and
/// every business result of the code table, its links land on its headings,
/// and its worked example is what the hub's own functions make of it.
mod protocol {
    use std::collections::{BTreeMap, BTreeSet};

    use bytes::BytesMut;
    use relayhub::frame::FrameCodec;
    use relayhub::header::{Echo, HEADER_LEN, parse_header, write_response};
    use relayhub::layout::{Field, Layout, load_dir};
    use relayhub::outcome::{Code, CodeTable, classify_transfer};
    use serde_json::{Map, Value};

    use super::{read, repo};

    const DOC: &str = "docs/protocol.md";

    fn doc() -> String {
        read(DOC)
    }

    /// The text of `## N. ...` up to the next `## ` heading.
    fn section(doc: &str, n: u32) -> &str {
        let marker = format!("\n## {n}. ");
        let start = doc
            .find(&marker)
            .unwrap_or_else(|| panic!("{DOC} has no `## {n}. ` heading"))
            + 1;
        let rest = &doc[start..];
        let end = rest.find("\n## ").unwrap_or(rest.len());
        &rest[..end]
    }

    /// The text of `### NAME` (exactly) up to the next heading of level 2 or 3.
    fn subsection<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        let marker = format!("\n### {name}\n");
        let start = text.find(&marker)? + marker.len();
        let rest = &text[start..];
        let end = rest
            .find("\n## ")
            .into_iter()
            .chain(rest.find("\n### "))
            .min()
            .unwrap_or(rest.len());
        Some(&rest[..end])
    }

    /// The cells of the body rows of the first table after the line starting
    /// with `intro` (the header row and the `|---|` row are skipped).
    fn table_after(text: &str, intro: &str, what: &str) -> Vec<Vec<String>> {
        let start = text
            .find(intro)
            .unwrap_or_else(|| panic!("{DOC} {what}: no line starting {intro:?}"));
        text[start..]
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(cells)
            .collect()
    }

    fn cells(row: &str) -> Vec<String> {
        let inner = row.trim().trim_start_matches('|').trim_end_matches('|');
        inner.split('|').map(|c| c.trim().to_string()).collect()
    }

    fn unquote(cell: &str) -> &str {
        cell.trim_matches('`')
    }

    /// What the doc's `checks` cell must say for a field.
    fn checks(f: &Field) -> String {
        let mut parts = Vec::new();
        if f.required {
            parts.push("required".to_string());
        }
        if let Some(min) = f.min {
            parts.push(format!("min {min}"));
        }
        if let Some(max) = f.max {
            parts.push(format!("max {max}"));
        }
        if parts.is_empty() {
            "-".into()
        } else {
            parts.join(", ")
        }
    }

    /// Compares one documented body table with the layout's fields; the
    /// message names the layout, the list and the row.
    fn compare_fields(tx: &str, list: &str, rows: &[Vec<String>], fields: &[Field]) {
        let mut offset = HEADER_LEN;
        for (i, f) in fields.iter().enumerate() {
            let row_no = i + 1;
            let Some(row) = rows.get(i) else {
                panic!(
                    "{DOC} {tx} {list} table stops after {} rows; layouts/{tx}.json has row {row_no} `{}` {:?} {}",
                    rows.len(),
                    f.name,
                    f.kind,
                    f.length
                );
            };
            let at = format!("{DOC} {tx} {list} row {row_no} (`{}`)", f.name);
            assert_eq!(
                row.len(),
                6,
                "{at}: expected | offset | field | type | length | checks | meaning |, got {row:?}"
            );
            assert_eq!(
                unquote(&row[1]),
                f.name,
                "{at}: the doc names the field {:?}; layouts/{tx}.json has `{}` here",
                row[1],
                f.name
            );
            assert_eq!(row[0], offset.to_string(), "{at}: offset");
            assert_eq!(row[2], format!("{:?}", f.kind), "{at}: type");
            assert_eq!(row[3], f.length.to_string(), "{at}: length");
            assert_eq!(row[4], checks(f), "{at}: checks");
            offset += f.length;
        }
        if rows.len() > fields.len() {
            panic!(
                "{DOC} {tx} {list} row {} ({:?}) is not in layouts/{tx}.json",
                fields.len() + 1,
                rows[fields.len()]
            );
        }
    }

    fn layouts() -> BTreeMap<String, Layout> {
        load_dir(&repo("layouts")).unwrap_or_else(|e| panic!("load layouts/: {e}"))
    }

    #[test]
    fn sections_keep_the_contract_numbers_in_order() {
        let doc = doc();
        let numbered: Vec<u32> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("## "))
            .filter_map(|h| h.split_once(". ").and_then(|(n, _)| n.parse().ok()))
            .collect();
        assert_eq!(
            numbered,
            (1..=11).collect::<Vec<u32>>(),
            "{DOC}: the `## N. ` headings must be sections 1 to 11, in order"
        );
    }

    #[test]
    fn layout_tables_are_the_layout_files() {
        let doc = doc();
        let types = section(&doc, 4);
        let layouts = layouts();
        assert!(layouts.contains_key("TRF001") && layouts.contains_key("INQ001"));
        for (tx, layout) in &layouts {
            let text = subsection(types, tx).unwrap_or_else(|| {
                panic!("{DOC} section 4 has no `### {tx}` for layouts/{tx}.json")
            });
            let req = layout.request_len();
            let intro = format!(
                "Request body: {req} bytes (telegram {} bytes, {} with the prefix).",
                HEADER_LEN + req,
                HEADER_LEN + req + 4
            );
            assert!(
                text.contains(&intro),
                "{DOC} {tx}: the request length line should read {intro:?}"
            );
            let rows = table_after(text, "Request body:", &format!("{tx} request"));
            compare_fields(tx, "request", &rows, &layout.request);

            let resp = layout.response_len();
            let intro = format!("Response body (on `0000` only): {resp} bytes.");
            assert!(
                text.contains(&intro),
                "{DOC} {tx}: the response length line should read {intro:?}"
            );
            let rows = table_after(text, "Response body", &format!("{tx} response"));
            compare_fields(tx, "response", &rows, &layout.response);
        }
        // No table for a layout that does not exist.
        for line in types.lines() {
            if let Some(tx) = line.strip_prefix("### ") {
                assert!(
                    layouts.contains_key(tx.trim()),
                    "{DOC} section 4 documents `### {tx}`, which no layouts/*.json defines"
                );
            }
        }
    }

    /// `pub const NAME: Code = Code(*b"XXXX");` in src/outcome.rs.
    fn code_constants() -> BTreeMap<String, String> {
        let src = read("src/outcome.rs");
        let mut out = BTreeMap::new();
        for line in src.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("pub const ") else {
                continue;
            };
            let Some((name, value)) = rest.split_once(": Code = Code(*b\"") else {
                continue;
            };
            let code = value.split('"').next().unwrap_or_default().to_string();
            assert!(
                Code::parse(&code).is_some(),
                "src/outcome.rs: Code::{name} = {code:?} is not a code"
            );
            out.insert(code, name.to_string());
        }
        out
    }

    #[test]
    fn code_table_lists_every_code_and_business_result() {
        let doc = doc();
        let rows = table_after(section(&doc, 6), "| code |", "section 6");
        let mut documented = BTreeMap::new();
        for row in &rows {
            assert_eq!(
                row.len(),
                4,
                "{DOC} section 6 row {row:?}: expected | code | when | money moved? | what the channel does |"
            );
            let code = unquote(&row[0]).to_string();
            assert!(
                documented.insert(code.clone(), row[1].clone()).is_none(),
                "{DOC} section 6 lists `{code}` twice"
            );
        }

        let constants = code_constants();
        assert!(
            constants.len() >= 10 && constants.contains_key(Code::UNKNOWN.as_str()),
            "read too few codes from src/outcome.rs: {constants:?}"
        );
        for (code, name) in &constants {
            assert!(
                documented.contains_key(code),
                "{DOC} section 6 has no row for `{code}` (Code::{name} in src/outcome.rs)"
            );
        }

        let path = repo("layouts/codes/codes.json");
        let table = CodeTable::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        let raw: Value = serde_json::from_str(&read("layouts/codes/codes.json")).unwrap();
        let business = raw["business"]
            .as_object()
            .expect("codes.json has `business`");
        assert!(!business.is_empty());
        for (result, code) in business {
            let code = code.as_str().expect("a code string");
            assert_eq!(
                table.business(result).map(|c| c.to_string()).as_deref(),
                Some(code)
            );
            let when = documented.get(code).unwrap_or_else(|| {
                panic!(
                    "{DOC} section 6 has no row for `{code}` ({result} in layouts/codes/codes.json)"
                )
            });
            assert!(
                when.contains(&format!("`{result}`")),
                "{DOC} section 6 row `{code}` does not name its business result `{result}` (layouts/codes/codes.json); it says {when:?}"
            );
        }

        for code in documented.keys() {
            let known = constants.contains_key(code)
                || business.values().any(|c| c.as_str() == Some(code.as_str()));
            assert!(
                known,
                "{DOC} section 6 row `{code}` is neither a Code in src/outcome.rs nor in layouts/codes/codes.json"
            );
        }
    }

    /// GitHub's anchor for a heading.
    fn slug(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    /// Every `](...#anchor)` target in `text` whose file part ends with `file`
    /// ("" for links inside the page).
    fn anchors_into<'a>(text: &'a str, file: &str) -> Vec<&'a str> {
        text.split("](")
            .skip(1)
            .filter_map(|rest| rest.split_once(')').map(|(target, _)| target))
            .filter_map(|target| target.split_once('#'))
            .filter(|(path, _)| {
                if file.is_empty() {
                    path.is_empty()
                } else {
                    path.ends_with(file)
                }
            })
            .map(|(_, anchor)| anchor)
            .collect()
    }

    #[test]
    fn links_to_its_sections_land_on_headings() {
        let doc = doc();
        let slugs: BTreeSet<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
            .map(slug)
            .collect();
        let mut checked = 0;
        let mut check = |file: &str, text: &str, target: &str| {
            for anchor in anchors_into(text, target) {
                assert!(
                    slugs.contains(anchor),
                    "{file} links to {DOC}#{anchor}, which is not a heading of {DOC}"
                );
                checked += 1;
            }
        };
        check(DOC, &doc, "");
        for file in [
            "README.md",
            "README.ko.md",
            "layouts/README.md",
            "fixtures/corebank/README.md",
        ] {
            check(file, &read(file), "protocol.md");
        }
        for entry in std::fs::read_dir(repo("docs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                let name = format!("docs/{}", path.file_name().unwrap().to_string_lossy());
                check(&name, &read(&name), "protocol.md");
            }
        }
        assert!(checked >= 20, "found only {checked} links to check");
    }

    /// The code blocks of a text, with their info strings.
    fn code_blocks(text: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut open: Option<(String, String)> = None;
        for line in text.lines() {
            if let Some(info) = line.strip_prefix("```") {
                match open.take() {
                    Some(block) => out.push(block),
                    None => open = Some((info.to_string(), String::new())),
                }
            } else if let Some((_, body)) = open.as_mut() {
                body.push_str(line);
                body.push('\n');
            }
        }
        out
    }

    /// The annotated request of section 11: each line is the bytes, two or
    /// more spaces, a comment. Bytes are text with `␠` for a space, or hex
    /// pairs optionally followed by `+ N × XX` (N more of byte XX).
    fn annotated_bytes(block: &str) -> Vec<Vec<u8>> {
        block
            .lines()
            .map(|line| {
                let data = line.split("  ").next().unwrap_or_default();
                let (hex, repeat) = match data.split_once(" + ") {
                    Some((h, r)) => (h, Some(r)),
                    None => (data, None),
                };
                let words: Vec<&str> = hex.split(' ').collect();
                let is_hex = words.len() > 1
                    && words
                        .iter()
                        .all(|w| w.len() == 2 && w.bytes().all(|b| b.is_ascii_hexdigit()));
                if !is_hex {
                    return data.replace('␠', " ").into_bytes();
                }
                let mut bytes: Vec<u8> = words
                    .iter()
                    .map(|w| u8::from_str_radix(w, 16).unwrap())
                    .collect();
                if let Some(r) = repeat {
                    let (n, byte) = r
                        .split_once(" × ")
                        .unwrap_or_else(|| panic!("{DOC} section 11: cannot read {line:?}"));
                    let n: usize = n.parse().unwrap();
                    bytes.extend(std::iter::repeat_n(
                        u8::from_str_radix(byte, 16).unwrap(),
                        n,
                    ));
                }
                bytes
            })
            .collect()
    }

    fn framed(telegram: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        FrameCodec::default()
            .encode(telegram, &mut out)
            .expect("frames");
        out.to_vec()
    }

    #[test]
    fn worked_example_is_what_the_code_makes_of_it() {
        let doc = doc();
        let blocks = code_blocks(section(&doc, 11));
        assert_eq!(
            blocks.len(),
            5,
            "{DOC} section 11: expected 5 code blocks (request, posted JSON, core answer, 0000 answer, B201 answer)"
        );
        let layouts = layouts();
        let trf = &layouts["TRF001"];

        // The request: prefix, then the telegram the prefix announces.
        let pieces = annotated_bytes(&blocks[0].1);
        let request: Vec<u8> = pieces[1..].concat();
        let wire: Vec<u8> = pieces.concat();
        assert_eq!(
            wire.len(),
            136,
            "{DOC} section 11: the request is 136 bytes on the wire"
        );
        assert_eq!(
            framed(&request),
            wire,
            "{DOC} section 11: prefix and telegram disagree"
        );
        let header = parse_header(&request).unwrap_or_else(|e| panic!("{DOC} section 11: {e}"));
        let fields = trf
            .decode_request(&request[HEADER_LEN..], HEADER_LEN)
            .unwrap_or_else(|e| panic!("{DOC} section 11: {e}"));

        // What the hub posts: the header's guid and channel_id plus the fields.
        assert_eq!(blocks[1].0, "json");
        let posted: Value = serde_json::from_str(&blocks[1].1).expect("posted JSON");
        let mut expected = Map::new();
        expected.insert("guid".into(), Value::String(header.guid.to_string()));
        expected.insert(
            "channel_id".into(),
            Value::String(header.channel_id.to_string()),
        );
        expected.extend(fields.to_map());
        assert_eq!(
            posted,
            Value::Object(expected),
            "{DOC} section 11: the posted JSON is not what the request decodes to"
        );
        // Section 5 shows the same JSON.
        assert!(
            section(&doc, 5).contains(&blocks[1].1),
            "{DOC}: section 5's example JSON differs from section 11's"
        );

        // The 0000 answer: header echo, the doc's sent_at, the body the layout
        // writes from the core's JSON.
        let codes = CodeTable::builtin();
        assert_eq!(blocks[2].0, "json");
        let core = blocks[2].1.trim().as_bytes();
        let outcome = classify_transfer(200, core, &codes);
        assert_eq!(codes.code(&outcome), Code::OK);
        let relayhub::outcome::Outcome::Processed(answer) = outcome else {
            unreachable!()
        };
        let body = trf
            .encode_response(&answer.fields(), HEADER_LEN)
            .unwrap_or_else(|e| panic!("{DOC} section 11: {e}"));
        let shown = blocks[3].1.trim().as_bytes();
        let sent_at = std::str::from_utf8(&shown[4 + 46..4 + 60]).unwrap();
        let mut telegram = Vec::new();
        let echo = Echo::from_telegram(&request);
        write_response(&echo, sent_at, "0000", &body, &mut telegram);
        assert_eq!(
            String::from_utf8_lossy(&framed(&telegram)),
            String::from_utf8_lossy(shown),
            "{DOC} section 11: the 0000 answer"
        );
        assert_eq!(shown.len(), 113);

        // The B201 answer: the header alone.
        let rejected = classify_transfer(422, br#"{"result":"INSUFFICIENT_FUNDS"}"#, &codes);
        let code = codes.code(&rejected);
        let shown = blocks[4].1.trim().as_bytes();
        let mut telegram = Vec::new();
        write_response(&echo, sent_at, code.as_str(), &[], &mut telegram);
        assert_eq!(
            String::from_utf8_lossy(&framed(&telegram)),
            String::from_utf8_lossy(shown),
            "{DOC} section 11: the {code} answer"
        );
        assert_eq!(shown.len(), 68);
    }
}
