//! `switchyard drill`: every built-in scenario passes in process, a false
//! assertion makes the drill fail, a malformed scenario names the bad path,
//! and remote mode drives a real `switchyard serve` and `mock-upstream`s.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;

use common::{Mock, Switchyard};
use switchyard_drill::{self as drill, DrillArgs, DrillError};

async fn drill_in_process(scenario: &str) -> (Result<bool, DrillError>, String) {
    let args = DrillArgs {
        scenario: Some(scenario.to_string()),
        ..DrillArgs::default()
    };
    let mut out = Vec::new();
    let result = drill::run_to(args, &mut out).await;
    (result, String::from_utf8_lossy(&out).into_owned())
}

async fn builtin_passes(name: &str) {
    let (result, out) = drill_in_process(name).await;
    println!("{out}");
    assert!(matches!(result, Ok(true)), "{name}: {result:?}\n{out}");
    assert!(out.contains("summary"), "{out}");
    assert!(!out.contains("FAIL"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_primary_down_passes() {
    builtin_passes("primary-down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_primary_abort_100_passes() {
    builtin_passes("primary-abort-100").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_anthropic_overloaded_midstream_passes() {
    builtin_passes("anthropic-overloaded-midstream").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_rate_limit_storm_passes() {
    builtin_passes("rate-limit-storm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_secondary_saturation_passes() {
    builtin_passes("secondary-saturation").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn builtin_all_down_recovery_passes() {
    builtin_passes("all-down-recovery").await;
}

#[tokio::test]
async fn list_names_every_builtin() {
    let mut out = Vec::new();
    let args = DrillArgs {
        list: true,
        ..DrillArgs::default()
    };
    assert!(drill::run_to(args, &mut out).await.unwrap());
    let out = String::from_utf8(out).unwrap();
    for (name, _) in drill::BUILTINS {
        assert!(out.contains(name), "{out}");
    }
    assert!(!out.contains("invalid"), "{out}");
}

const CUSTOM: &str = r#"
name = "custom"
description = "A user-written drill with one assertion that cannot hold."

[mocks.primary]
kind = "openai"
tokens = 4

[mocks.secondary]
kind = "openai"
tokens = 4

[router]
targets = ["primary", "secondary"]

[[phases]]
name = "outage"
faults = { primary = { type = "status", status = 503 } }
requests = 3

[[assert]]
what = "served_by"
provider = "secondary"
phase = "outage"
op = "=="
value = 1.0

[[assert]]
what = "served_by"
provider = "primary"
phase = "outage"
op = "=="
value = 1.0
"#;

fn scenario_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(file.path(), text).unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_false_assertion_fails_the_drill() {
    let file = scenario_file(CUSTOM);
    let (result, out) = drill_in_process(file.path().to_str().unwrap()).await;
    assert!(matches!(result, Ok(false)), "{result:?}\n{out}");
    let line = |needle: &str| {
        out.lines()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle}: {out}"))
            .to_string()
    };
    assert!(
        line("served_by[secondary] in outage == 1").starts_with("PASS"),
        "{out}"
    );
    assert!(
        line("served_by[primary] in outage == 1").starts_with("FAIL"),
        "{out}"
    );
    assert!(
        out.contains("drill custom: FAIL (1 of 2 assertions passed)"),
        "{out}"
    );
}

#[tokio::test]
async fn a_malformed_scenario_names_the_dotted_path() {
    let cases = [
        (
            "status = 503 }",
            "statsu = 503 }",
            "phases[0].faults.primary",
        ),
        (
            "requests = 3",
            "requests = 3\nconcurrency = 0",
            "phases[0].concurrency",
        ),
        (
            "provider = \"primary\"",
            "provider = \"tertiary\"",
            "assert[1].provider",
        ),
        ("op = \"==\"", "op = \"=\"", "assert[0].op"),
    ];
    for (from, to, path) in cases {
        let file = scenario_file(&CUSTOM.replacen(from, to, 1));
        let (result, _) = drill_in_process(file.path().to_str().unwrap()).await;
        match result {
            Err(e @ DrillError::Scenario { .. }) => {
                assert!(e.to_string().contains(&format!("{path}: ")), "{e}");
                assert_eq!(e.exit_code(), 2);
            }
            other => panic!("{path}: expected a scenario error, got {other:?}"),
        }
    }
    let (result, _) = drill_in_process("no-such-drill").await;
    assert!(matches!(result, Err(DrillError::Usage(_))), "{result:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_mode_drives_a_running_switchyard() {
    let primary = Mock::start("openai", &[]).await;
    let secondary = Mock::start("anthropic", &[]).await;
    let scenario = drill::load_scenario("primary-down").unwrap();
    let urls = BTreeMap::from([
        ("primary".to_string(), primary.base_url()),
        ("secondary".to_string(), secondary.base_url()),
    ]);
    let config = scenario.router_config(&urls).unwrap()
        + "\n[admin]\ntoken_env = \"DRILL_TEST_ADMIN_TOKEN\"\n";
    let sy = Switchyard::start_with(&config, &[("DRILL_TEST_ADMIN_TOKEN", "s3cret")]).await;
    std::env::set_var("DRILL_TEST_ADMIN_TOKEN", "s3cret");
    let args = DrillArgs {
        scenario: Some("primary-down".into()),
        target: Some(sy.grpc.clone()),
        mocks: vec![
            ("primary".into(), format!("http://{}", primary.addr)),
            ("secondary".into(), secondary.base_url()),
        ],
        admin_token_env: Some("DRILL_TEST_ADMIN_TOKEN".into()),
        ..DrillArgs::default()
    };
    let mut out = Vec::new();
    let result = drill::run_to(args, &mut out).await;
    let out = String::from_utf8_lossy(&out).into_owned();
    println!("{out}");
    assert!(
        matches!(result, Ok(true)),
        "{result:?}\n{out}\n{}",
        sy.logs()
    );
    assert!(out.contains("remote: target"), "{out}");
    assert!(out.contains("breakers: primary=open"), "{out}");
    // The mocks were configured by the drill and saw the traffic.
    let log = secondary.requests().await;
    assert_eq!(log.len(), 20, "the last phase's log is left in place");
}

#[tokio::test]
async fn remote_mode_needs_every_mock() {
    let args = DrillArgs {
        scenario: Some("primary-down".into()),
        target: Some("127.0.0.1:1".into()),
        mocks: vec![("primary".into(), "http://127.0.0.1:2".into())],
        ..DrillArgs::default()
    };
    let mut out = Vec::new();
    let result = drill::run_to(args, &mut out).await;
    match result {
        Err(DrillError::Usage(m)) => assert!(m.contains("secondary"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn print_config_renders_a_valid_switchyard_config() {
    let args = DrillArgs {
        scenario: Some("secondary-saturation".into()),
        print_config: true,
        mocks: vec![("secondary".into(), "http://127.0.0.1:9002/v1".into())],
        ..DrillArgs::default()
    };
    let mut out = Vec::new();
    assert!(drill::run_to(args, &mut out).await.unwrap());
    let text = String::from_utf8(out).unwrap();
    let config = switchyard::config::Config::from_toml_str(&text).unwrap();
    assert_eq!(config.providers[0].base_url, "http://127.0.0.1:8001/v1");
    assert_eq!(config.providers[1].base_url, "http://127.0.0.1:9002/v1");
    assert_eq!(config.providers[1].failover_max_concurrency, 3);
    assert_eq!(config.routes[0].name, "drill");
}
