//! deploy/prometheus and deploy/grafana against the real things: promtool
//! checks the rules and runs their unit tests (every alert must fire in one
//! case, stay silent in another, and a renamed alert must break its test);
//! the dashboard JSON loads; and every metric the rules, the dashboard and
//! `switchyard plan --prometheus` name is one a running Switchyard exports
//! after scripted traffic, with label names it really uses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{provider, request, route, stream, Rig, Switchyard};
use serde_json::{json, Value};

fn deploy(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// `promtool`, or `None` after a loud SKIPPED line (a failure under CI).
fn promtool(test: &str) -> Option<&'static str> {
    match Command::new("promtool").arg("--version").output() {
        Ok(o) if o.status.success() => Some("promtool"),
        _ => {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set but promtool is not installed ({test}); .ci/run installs the Debian package prometheus");
            }
            eprintln!(
                "\n*** SKIPPED {test}: promtool not installed (apt-get install prometheus) ***\n"
            );
            None
        }
    }
}

fn run(cmd: &mut Command) -> (bool, String) {
    let o = cmd.output().expect("run promtool");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// The NAMEs of `- KIND: NAME` lines of rules.yaml (`alert` or `record`).
fn rule_names<C: FromIterator<String>>(rules: &str, kind: &str) -> C {
    let prefix = format!("- {kind}: ");
    rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .map(|n| n.trim().to_string())
        .collect()
}

fn alert_names(rules: &str) -> Vec<String> {
    rule_names(rules, "alert")
}

fn record_names(rules: &str) -> BTreeSet<String> {
    rule_names(rules, "record")
}

/// Every `expr:` of rules.yaml, one-line or `|` block.
fn rule_exprs(rules: &str) -> Vec<String> {
    let lines: Vec<&str> = rules.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(rest) = l.trim().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest != "|" {
            out.push(rest.to_string());
            continue;
        }
        let indent = l.len() - l.trim_start().len();
        let block: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|b| b.trim().is_empty() || b.len() - b.trim_start().len() > indent)
            .copied()
            .collect();
        out.push(block.join("\n"));
    }
    out
}

#[test]
fn promtool_checks_the_rules_and_passes_their_unit_tests() {
    let Some(promtool) = promtool("promtool_checks_the_rules_and_passes_their_unit_tests") else {
        return;
    };
    let (ok, out) = run(Command::new(promtool)
        .args(["check", "rules"])
        .arg(deploy("prometheus/rules.yaml")));
    assert!(ok, "promtool check rules: {out}");
    let rules = read("prometheus/rules.yaml");
    let n = alert_names(&rules).len() + record_names(&rules).len();
    assert!(out.contains(&format!("SUCCESS: {n} rules found")), "{out}");
    let (ok, out) = run(Command::new(promtool)
        .args(["test", "rules"])
        .arg(deploy("prometheus/rules_test.yaml")));
    assert!(ok, "promtool test rules: {out}");
}

/// The `alert_rule_test` entries of rules_test.yaml: (alertname, expects none).
fn alert_cases(tests: &str) -> Vec<(String, bool)> {
    let lines: Vec<&str> = tests.lines().map(str::trim).collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if let Some(name) = l.strip_prefix("alertname: ") {
            let silent = lines
                .get(i + 1)
                .is_some_and(|next| *next == "exp_alerts: []");
            out.push((name.trim().to_string(), silent));
        }
    }
    out
}

#[test]
fn every_alert_has_a_firing_and_a_silent_case_that_promtool_enforces() {
    let rules = read("prometheus/rules.yaml");
    let tests = read("prometheus/rules_test.yaml");
    let alerts = alert_names(&rules);
    assert_eq!(alerts.len(), 10, "{alerts:?}");
    let cases = alert_cases(&tests);
    for a in &alerts {
        let mine: Vec<bool> = cases
            .iter()
            .filter(|(n, _)| n == a)
            .map(|(_, s)| *s)
            .collect();
        assert!(mine.contains(&true), "{a}: no case where it must not fire");
        assert!(mine.contains(&false), "{a}: no case where it fires");
    }
    for (n, _) in &cases {
        assert!(
            alerts.contains(n),
            "rules_test.yaml tests an unknown alert {n}"
        );
    }
    let Some(promtool) =
        promtool("every_alert_has_a_firing_and_a_silent_case_that_promtool_enforces")
    else {
        return;
    };
    // Renaming an alert must break its firing case: the expectations are real.
    for a in &alerts {
        let dir = tempfile::tempdir().unwrap();
        let renamed = rules.replace(
            &format!("- alert: {a}\n"),
            &format!("- alert: {a}Renamed\n"),
        );
        assert_ne!(renamed, rules);
        std::fs::write(dir.path().join("rules.yaml"), renamed).unwrap();
        std::fs::write(dir.path().join("rules_test.yaml"), &tests).unwrap();
        let (ok, out) = run(Command::new(promtool)
            .args(["test", "rules"])
            .arg(dir.path().join("rules_test.yaml")));
        assert!(!ok, "{a} renamed, yet its tests pass: {out}");
        assert!(out.contains(&format!("alertname: {a},")), "{a}: {out}");
    }
}

#[test]
fn the_dashboard_loads_with_a_query_in_every_panel() {
    let d: Value = serde_json::from_str(&read("grafana/switchyard.json")).expect("dashboard JSON");
    assert_eq!(d["uid"], "switchyard");
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    let mut titles = Vec::new();
    for p in panels {
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "duplicate id: {p}"
        );
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "gridPos.{k}: {p}");
        }
        assert!(p["gridPos"]["x"].as_u64().unwrap() + p["gridPos"]["w"].as_u64().unwrap() <= 24);
        if p["type"] == "row" {
            continue;
        }
        titles.push(p["title"].as_str().unwrap().to_string());
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{p}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{p}");
        for t in targets {
            assert!(!t["expr"].as_str().unwrap().is_empty(), "{p}");
        }
    }
    let vars: Vec<&str> = d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert_eq!(vars, ["datasource", "route"]);
    // What the issue asks the dashboard to show.
    for want in [
        "Breaker state",
        "Failover rate",
        "Answered share",
        "Tier mix",
        "Time to first token",
        "In flight against ceilings",
        "Retry budget",
        "queue",
        "Tokens",
    ] {
        assert!(
            titles
                .iter()
                .any(|t| t.to_lowercase().contains(&want.to_lowercase())),
            "no panel for {want}: {titles:?}"
        );
    }
}

/// A metric selector in an expression: its name and the label names it matches on.
#[derive(Debug, Clone, PartialEq)]
struct Selector {
    metric: String,
    labels: Vec<String>,
    /// Labels named in `by (...)`, `without (...)`, `on (...)` anywhere in the expression.
    grouping: Vec<String>,
}

const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
];

/// `by (` or `without (` starts `rest`: the identifier before it aggregates.
fn modifier_follows(rest: &[char]) -> bool {
    let text: String = rest.iter().take(12).collect();
    ["by", "without"].iter().any(|k| {
        text.strip_prefix(k)
            .is_some_and(|after| after.trim_start().starts_with('('))
    })
}

/// The metric selectors of a PromQL expression: identifiers not called as
/// functions, not keywords, outside strings, ranges and label lists.
fn selectors(expr: &str) -> Vec<Selector> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out: Vec<Selector> = Vec::new();
    let mut grouping = Vec::new();
    let mut i = 0;
    let ident = |i: &mut usize| {
        let start = *i;
        while *i < chars.len()
            && (chars[*i].is_ascii_alphanumeric() || matches!(chars[*i], '_' | ':'))
        {
            *i += 1;
        }
        chars[start..*i].iter().collect::<String>()
    };
    let skip_ws = |i: &mut usize| {
        while *i < chars.len() && chars[*i].is_whitespace() {
            *i += 1;
        }
    };
    // Label names of `{a="x", b=~"y"}` or `(a, b)`, from just after the opener.
    let names = |i: &mut usize, close: char| {
        let mut names = Vec::new();
        let mut expect_name = true;
        while *i < chars.len() && chars[*i] != close {
            let c = chars[*i];
            if c == '"' {
                *i += 1;
                while *i < chars.len() && chars[*i] != '"' {
                    if chars[*i] == '\\' {
                        *i += 1;
                    }
                    *i += 1;
                }
                *i += 1;
            } else if c == ',' {
                expect_name = true;
                *i += 1;
            } else if expect_name && (c.is_ascii_alphabetic() || c == '_') {
                let start = *i;
                while *i < chars.len() && (chars[*i].is_ascii_alphanumeric() || chars[*i] == '_') {
                    *i += 1;
                }
                names.push(chars[start..*i].iter().collect::<String>());
                expect_name = false;
            } else {
                *i += 1;
            }
        }
        *i += 1;
        names
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += 1;
            }
            i += 1;
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            i += 1;
        } else if c.is_ascii_digit() || c == '.' {
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '.' | '-' | '+'))
            {
                if matches!(chars[i], '-' | '+') && !matches!(chars[i - 1], 'e' | 'E') {
                    break;
                }
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let name = ident(&mut i);
            let mut j = i;
            skip_ws(&mut j);
            let next = chars.get(j).copied();
            if KEYWORDS.contains(&name.as_str()) {
                if matches!(
                    name.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) && next == Some('(')
                {
                    i = j + 1;
                    grouping.extend(names(&mut i, ')'));
                }
            } else if next == Some('(') || modifier_follows(&chars[j..]) {
                // A function, or an aggregation (`sum by (x) (...)`).
            } else if next == Some('{') {
                i = j + 1;
                let labels = names(&mut i, '}');
                out.push(Selector {
                    metric: name,
                    labels,
                    grouping: Vec::new(),
                });
            } else {
                out.push(Selector {
                    metric: name,
                    labels: Vec::new(),
                    grouping: Vec::new(),
                });
            }
        } else {
            i += 1;
        }
    }
    for s in &mut out {
        s.grouping = grouping.clone();
    }
    out
}

#[test]
fn the_selector_scanner_finds_metrics_and_only_metrics() {
    let s = selectors(
        r#"histogram_quantile(0.95, sum by (le, provider) (rate(a_bucket{x="1",y=~"a|b"}[$__rate_interval]))) / on (provider) group_left () b:rec or c > 1e-3 and d"#,
    );
    let names: Vec<&str> = s.iter().map(|s| s.metric.as_str()).collect();
    assert_eq!(names, ["a_bucket", "b:rec", "c", "d"]);
    assert_eq!(s[0].labels, ["x", "y"]);
    assert_eq!(s[0].grouping, ["le", "provider", "provider"]);
}

/// Every expression the rules, the dashboard and `plan --prometheus` evaluate.
fn all_exprs() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for e in rule_exprs(&read("prometheus/rules.yaml")) {
        out.push(("rules.yaml".to_string(), e));
    }
    let d: Value = serde_json::from_str(&read("grafana/switchyard.json")).unwrap();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                format!("dashboard panel {}", p["title"]),
                t["expr"].as_str().unwrap().to_string(),
            ));
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            // label_values(METRIC, LABEL) as the selector METRIC grouped by LABEL.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.strip_suffix(')'))
                .unwrap_or_else(|| panic!("unexpected variable query {q}"));
            let (metric, label) = inner.split_once(',').unwrap();
            out.push((
                format!("dashboard variable {}", v["name"]),
                format!("sum by ({}) ({})", label.trim(), metric.trim()),
            ));
        }
    }
    let w = switchyard_plan::source::promql_duration(std::time::Duration::from_secs(300));
    for (_, q) in switchyard_plan::source::QUERIES {
        out.push(("plan --prometheus".to_string(), q.replace("{w}", &w)));
    }
    out.push((
        "plan --prometheus".to_string(),
        switchyard_plan::source::REPLICAS.to_string(),
    ));
    for m in switchyard_plan::scrape::METRICS_READ {
        out.push(("plan --admin".to_string(), m.to_string()));
    }
    out
}

/// Sample names and the label names seen on each, from a scrape.
fn exported(scrape: &str, into: &mut BTreeMap<String, BTreeSet<String>>) {
    for s in switchyard_plan::scrape::Scrape::parse(scrape).samples {
        into.entry(s.name).or_default().extend(s.labels.into_keys());
    }
}

/// A Switchyard on an unreachable Redis with a cost cap: its cost
/// reservations fail open and count in `switchyard_state_errors_total`.
async fn state_error_scrape() -> String {
    let mock = common::Mock::start("openai", &[]).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", closed.local_addr().unwrap());
    drop(closed);
    let config = format!(
        "[state]\nbackend = \"redis\"\ntimeout = \"100ms\"\n[cost]\ndefault_cap_usd = 10.0\n{}{}",
        provider("only", "openai", &mock.base_url(), "m"),
        route("chat", &["only/m"])
    );
    let sy = Switchyard::start_with(&config, &[("SWITCHYARD_REDIS_URL", &url)]).await;
    let mut client = sy.client().await;
    for _ in 0..2 {
        let got = stream(&mut client, request("chat")).await;
        assert!(got.finished.is_some(), "{:?}\n{}", got.status, sy.logs());
    }
    sy.admin_get("/metrics").await.1
}

/// A Switchyard with a semantic cache: a miss that fills it, then a hit.
async fn semantic_scrape() -> String {
    let chat = common::Mock::start("openai", &[]).await;
    let emb = common::Mock::start("openai", &[]).await;
    let config = format!(
        "{}[[providers]]\nid = \"emb\"\nkind = \"openai\"\nbase_url = \"{}\"\n  [[providers.models]]\n  name = \"e\"\n  capabilities = [\"embeddings\"]\n{}semantic_cache = {{ embedder = \"emb/e\", fresh_within = \"1m\" }}\n",
        provider("only", "openai", &chat.base_url(), "m"),
        emb.base_url(),
        route("chat", &["only/m"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    for _ in 0..50 {
        let got = stream(&mut client, request("chat")).await;
        assert!(got.finished.is_some(), "{:?}\n{}", got.status, sy.logs());
        let (_, m) = sy.admin_get("/metrics").await;
        if m.contains("switchyard_semantic_cache_lookups_total{route=\"chat\",result=\"hit\"}") {
            return m;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("no semantic cache hit:\n{}", sy.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_the_dashboard_and_plan_name_is_exported() {
    // Ceilings of two, breakers that open at two failures, health evidence
    // after four calls, a request window (rpm) that never fills, and the
    // queue on, so that traffic creates every series.
    let dir = tempfile::tempdir().unwrap();
    let head = format!(
        "[queue]\npath = \"{}\"",
        dir.path().join("jobs.sqlite3").display()
    );
    let extra = "max_concurrency = 2\nfailover_max_concurrency = 1\n\
                 breaker = { consecutive_failures = 2, open_for = \"30s\", max_open_for = \"30s\", jitter = 0.0 }\n\
                 health = { prior_successes = 0, min_calls = 4 }\n\
                 rpm = 1000000";
    let rig = Rig::start_full(&head, extra, "", &[], &[]).await;
    let (primary, secondary, sy) = (&rig.primary, &rig.secondary, &rig.sy);
    let mut client = sy.client().await;
    let once = |status: u16| json!({"type": "status", "status": status, "times": 1});
    // Every other call fails: the primary is demoted, its breaker stays closed.
    for i in 0..8 {
        if i % 2 == 0 {
            primary.set_fault(once(500)).await;
        }
        let got = stream(&mut client, request("chat")).await;
        assert!(got.finished.is_some(), "{:?}", got.status);
    }
    // A rate limit (cooldown), eight callers at once against ceilings of two
    // (local refusals), and a stream cut after output (billed tokens).
    primary
        .set_fault(json!({"type": "status", "preset": "rate_limit", "times": 1}))
        .await;
    stream(&mut client, request("chat")).await;
    for m in [primary, secondary] {
        m.set_config(json!({"token_delay_ms": 50})).await;
    }
    let burst: Vec<_> = (0..8)
        .map(|_| {
            let mut c = client.clone();
            tokio::spawn(async move { stream(&mut c, request("chat")).await })
        })
        .collect();
    for b in burst {
        b.await.unwrap();
    }
    for m in [primary, secondary] {
        m.set_config(json!({"token_delay_ms": 0})).await;
    }
    let abort = json!({"type": "abort", "after_tokens": 3});
    primary.set_fault(abort.clone()).await;
    secondary.set_fault(abort).await;
    for _ in 0..4 {
        stream(&mut client, request("chat")).await;
    }
    // Both down: breakers open, then requests are shed.
    primary
        .set_fault(json!({"type": "status", "status": 500}))
        .await;
    secondary
        .set_fault(json!({"type": "status", "status": 500}))
        .await;
    for _ in 0..8 {
        stream(&mut client, request("chat")).await;
    }
    let (_, scrape) = sy.admin_get("/metrics").await;

    let mut have: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    exported(&scrape, &mut have);
    exported(&state_error_scrape().await, &mut have);
    exported(&semantic_scrape().await, &mut have);
    // Prometheus adds these to every scraped series, and `up` of its own.
    let target_labels = ["job", "instance"];
    have.entry("up".into())
        .or_default()
        .extend(target_labels.map(String::from));
    let records = record_names(&read("prometheus/rules.yaml"));

    let mut problems = Vec::new();
    let mut named = BTreeSet::new();
    for (place, expr) in all_exprs() {
        let found = selectors(&expr);
        assert!(!found.is_empty(), "{place}: no metric in `{expr}`");
        // Labels any selector of the expression carries (a recorded series
        // carries the labels its rule grouped by).
        let mut seen: BTreeSet<String> = target_labels.iter().map(|s| s.to_string()).collect();
        seen.insert("le".into());
        for s in &found {
            if let Some(l) = have.get(&s.metric) {
                seen.extend(l.iter().cloned());
            }
        }
        for s in found {
            if records.contains(&s.metric) {
                continue;
            }
            named.insert(s.metric.clone());
            match have.get(&s.metric) {
                None => problems.push(format!("{place}: `{}` is not exported", s.metric)),
                Some(labels) => {
                    for l in &s.labels {
                        if !labels.contains(l) && !target_labels.contains(&l.as_str()) {
                            problems.push(format!("{place}: `{}` has no label `{l}`", s.metric));
                        }
                    }
                }
            }
            for l in &s.grouping {
                if !seen.contains(l) {
                    problems.push(format!("{place}: groups by `{l}`, which no series has"));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\nexported: {:#?}",
        problems.join("\n"),
        have.keys().collect::<Vec<_>>()
    );
    // The scan is not vacuous: these are named and were found.
    for m in [
        "switchyard_breaker_state",
        "switchyard_breaker_transitions_total",
        "switchyard_failover_rate",
        "switchyard_requests_shed_total",
        "switchyard_queue_oldest_job_age_seconds",
        "switchyard_target_demoted",
        "switchyard_state_errors_total",
        "switchyard_ready",
        "gen_ai_server_time_to_first_token_seconds_bucket",
    ] {
        assert!(named.contains(m), "{m} is not used: {named:?}");
    }
}
