//! Several keys per provider (`keys = [...]`) through the real binary: a
//! key-local 429 moves the call to the provider's other key (not to another
//! provider, no breaker trip, the limited key cools alone), a 401 disables
//! one key, and key values never reach a log or the status.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};

const KEY_A: &str = "sk-team-a-0123456789abcdefghij";
const KEY_B: &str = "sk-team-b-0123456789abcdefghij";

async fn start() -> (Mock, Mock, Switchyard) {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let keys = "keys = [{ name = \"team-a\", env = \"SY_KEY_A\", weight = 2 }, { name = \"team-b\", env = \"SY_KEY_B\", max_concurrency = 16 }]\nfirst_token_timeout";
    let config = format!(
        "{}{}{}",
        provider("primary", "openai", &a.base_url(), "gpt-4o-mini")
            .replace("first_token_timeout", keys),
        provider("secondary", "anthropic", &b.base_url(), "claude-sonnet-4-5"),
        route(
            "chat",
            &["primary/gpt-4o-mini", "secondary/claude-sonnet-4-5"]
        )
    );
    let sy = Switchyard::start_with(&config, &[("SY_KEY_A", KEY_A), ("SY_KEY_B", KEY_B)]).await;
    (a, b, sy)
}

async fn key_rules(mock: &Mock, rules: Value) {
    let r = reqwest::Client::new()
        .put(format!("http://{}/_mock/keys", mock.addr))
        .json(&rules)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

#[tokio::test]
async fn a_key_local_429_is_served_by_the_other_key() {
    let (a, b, sy) = start().await;
    key_rules(&a, json!({"rate_limited": [KEY_A]})).await;
    let mut client = sy.client().await;
    for _ in 0..10 {
        let got = stream(&mut client, request("chat")).await;
        let f = got
            .finished
            .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()));
        assert_eq!(
            f.served_by.unwrap().provider,
            "primary",
            "the other key, not the other provider"
        );
    }
    assert!(b.requests().await.is_empty());
    let log = a.requests().await;
    let limited = log
        .iter()
        .filter(|r| r["fault"] == "key_rate_limited")
        .count();
    let served = log.iter().filter(|r| r["status"] == 200).count();
    assert_eq!(served, 10);
    assert_eq!(
        limited, 1,
        "the limited key cools down alone after one 429: {log:#?}"
    );
    let status: Value = reqwest::get(format!("http://{}/v1/status", sy.admin))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let primary = status["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["provider"] == "primary")
        .unwrap();
    assert_eq!(primary["breaker_state"], "closed", "{primary}");
    assert_eq!(
        primary["cooldown_remaining_ms"], 0,
        "the provider did not cool down: {primary}"
    );
    let keys = primary["keys"].as_array().unwrap();
    let a_state = keys.iter().find(|k| k["name"] == "team-a").unwrap();
    assert_eq!(a_state["state"], "cooling", "{keys:?}");
    let metrics = reqwest::get(format!("http://{}/metrics", sy.admin))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            r#"switchyard_key_events_total{provider="primary",key="team-a",event="rate_limited"} 1"#
        ),
        "{metrics}"
    );
    assert!(!metrics.contains(KEY_A));
    let logs = sy.logs();
    assert!(logs.contains("team-a"), "the key is named in the log");
    assert!(!logs.contains(KEY_A) && !logs.contains(KEY_B) && !status.to_string().contains(KEY_A));
}

#[tokio::test]
async fn a_refused_key_is_disabled_and_the_other_serves() {
    let (a, b, sy) = start().await;
    key_rules(&a, json!({"refused": [KEY_B]})).await;
    let mut client = sy.client().await;
    for _ in 0..12 {
        let got = stream(&mut client, request("chat")).await;
        assert_eq!(got.finished.unwrap().served_by.unwrap().provider, "primary");
    }
    let refused = a
        .requests()
        .await
        .iter()
        .filter(|r| r["fault"] == "key_refused")
        .count();
    assert!(
        refused <= 1,
        "a 401 disables the key until reload: {refused}"
    );
    assert!(b.requests().await.is_empty());

    // Both keys refused: the provider is skipped (auth), the secondary serves.
    key_rules(&a, json!({"refused": [KEY_A, KEY_B]})).await;
    let got = stream(&mut client, request("chat")).await;
    assert_eq!(
        got.finished.unwrap().served_by.unwrap().provider,
        "secondary"
    );
}
