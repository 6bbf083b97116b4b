//! Prompt-cache affinity through the real binary: requests of one cacheable
//! prefix stay on one target, and on one key of it, while the route's order
//! (two equal targets) would spread them; the target's failure moves them,
//! and they stay where they moved; another tenant's same prefix is its own.
//! Fleet-wide on a real redis-server: two replicas share the memory, a dead
//! target's prefix moves for both, and a Redis outage skips affinity without
//! failing a request. The mocks' logs show where each request went.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};
use switchyard::proto;

const KEYS: [(&str, &str); 4] = [
    ("SY_A1", "sk-a-one-0123456789abcdefghij"),
    ("SY_A2", "sk-a-two-0123456789abcdefghij"),
    ("SY_B1", "sk-b-one-0123456789abcdefghij"),
    ("SY_B2", "sk-b-two-0123456789abcdefghij"),
];

/// An Anthropic-wire provider with two keys of equal weight.
fn keyed_provider(id: &str, base_url: &str, envs: [&str; 2]) -> String {
    format!(
        r#"
[[providers]]
id = "{id}"
kind = "anthropic"
base_url = "{base_url}"
first_token_timeout = "5s"
idle_timeout = "5s"
keys = [{{ name = "{id}1", env = "{}" }}, {{ name = "{id}2", env = "{}" }}]
  [[providers.models]]
  name = "m"
  capabilities = ["chat", "stream", "tools", "json", "prompt_cache"]
  context_tokens = 128000
"#,
        envs[0], envs[1]
    )
}

/// Route `code` (affinity) and `spread` (none) over two equal targets.
fn config(head: &str, a: &Mock, b: &Mock) -> String {
    let equal = r#"targets = [{ target = "a/m", priority = 0 }, { target = "b/m", priority = 0 }]"#;
    format!(
        "{head}{}{}\n[[routes]]\nname = \"code\"\n{equal}\ncache_affinity = {{ ttl = \"5m\" }}\n\n[[routes]]\nname = \"spread\"\n{equal}\n",
        keyed_provider("a", &a.base_url(), ["SY_A1", "SY_A2"]),
        keyed_provider("b", &b.base_url(), ["SY_B1", "SY_B2"]),
    )
}

/// Both mocks log the key each request came with, by its label.
async fn label_keys(a: &Mock, b: &Mock) {
    let labels = |n: usize| json!({"labels": {KEYS[n].1: format!("key{}", n % 2 + 1), KEYS[n + 1].1: format!("key{}", n % 2 + 2)}});
    for (mock, rules) in [(a, labels(0)), (b, labels(2))] {
        let r = reqwest::Client::new()
            .put(format!("http://{}/_mock/keys", mock.addr))
            .json(&rules)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
}

/// An agent's turn `i`: a long system prompt marked for caching, then its
/// own question.
fn turn(route: &str, tenant: &str, i: usize) -> proto::CompletionRequest {
    let system = proto::Message {
        role: "system".into(),
        parts: vec![proto::ContentPart {
            part: Some(proto::content_part::Part::Text(
                "You are a coding agent working in a large repository. ".repeat(40),
            )),
            cache_control: Some(proto::CacheControl { ttl: "5m".into() }),
        }],
        ..Default::default()
    };
    proto::CompletionRequest {
        route: route.into(),
        tenant: tenant.into(),
        messages: vec![system, user(&format!("Task {i}: fix the failing test."))],
        max_tokens: 16,
        ..Default::default()
    }
}

/// Sends `n` turns from `first` and returns who served each.
async fn send(
    sy: &Switchyard,
    route: &str,
    tenant: &str,
    turns: std::ops::Range<usize>,
) -> Vec<String> {
    let mut client = sy.client().await;
    let mut served = Vec::new();
    for i in turns {
        let got = stream(&mut client, turn(route, tenant, i)).await;
        let f = got
            .finished
            .unwrap_or_else(|| panic!("turn {i}: {:?}\n{}", got.status, sy.logs()));
        served.push(f.served_by.unwrap().provider.into());
    }
    served
}

/// The key labels of the served requests in a mock's log.
fn served_keys(log: &[Value]) -> Vec<String> {
    log.iter()
        .filter(|r| r["status"] == 200)
        .map(|r| r["key_label"].as_str().unwrap_or("none").to_string())
        .collect()
}

async fn affinity(sy: &Switchyard, result: &str) -> f64 {
    let (_, m) = sy.admin_get("/metrics").await;
    metric_sum(
        &m,
        &format!("switchyard_cache_affinity_total{{route=\"code\",result=\"{result}\"}}"),
    )
}

fn count(served: &[String], p: &str) -> usize {
    served.iter().filter(|s| *s == p).count()
}

#[tokio::test]
async fn one_prefix_stays_on_one_target_and_key_until_that_target_fails() {
    let (a, b) = (
        Mock::start("anthropic", &[]).await,
        Mock::start("anthropic", &[]).await,
    );
    label_keys(&a, &b).await;
    let sy = Switchyard::start_with(&config("", &a, &b), &KEYS).await;

    // Without affinity the route's order spreads the same turns.
    let spread = send(&sy, "spread", "team-a", 0..20).await;
    assert!(
        count(&spread, "a") > 0 && count(&spread, "b") > 0,
        "the equal targets alternate: {spread:?}"
    );
    a.clear().await;
    b.clear().await;

    let served = send(&sy, "code", "team-a", 0..20).await;
    let warm = served[0].clone();
    assert_eq!(count(&served, &warm), 20, "{served:?}");
    let (warm_mock, other_mock, other) = if warm == "a" {
        (&a, &b, "b")
    } else {
        (&b, &a, "a")
    };
    let log = warm_mock.requests().await;
    assert!(other_mock.requests().await.is_empty());
    let keys = served_keys(&log);
    assert_eq!(keys.len(), 20);
    assert!(
        keys.iter().all(|k| *k == keys[0] && k != "none"),
        "one key: {keys:?}"
    );
    // The marker reached the upstream.
    assert_eq!(
        log[0]["body"]["system"][0]["cache_control"]["type"], "ephemeral",
        "{:#}",
        log[0]["body"]
    );
    assert_eq!(
        (affinity(&sy, "miss").await, affinity(&sy, "hit").await),
        (1.0, 19.0)
    );

    // One failure of the warm target moves the prefix with the failover,
    // and it stays where it moved though the first target answers again.
    warm_mock
        .set_fault(json!({"type": "status", "status": 529, "times": 1}))
        .await;
    let moved = send(&sy, "code", "team-a", 20..35).await;
    assert!(moved.iter().all(|p| p == other), "{moved:?}");
    let failed_at_warm = warm_mock
        .requests()
        .await
        .iter()
        .filter(|r| r["status"] == 529)
        .count();
    assert_eq!(failed_at_warm, 1, "the move began with its failure");
    let keys = served_keys(&other_mock.requests().await);
    assert_eq!(keys.len(), 15);
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one key again: {keys:?}"
    );
    assert_eq!(affinity(&sy, "move").await, 1.0);
    assert_eq!(affinity(&sy, "hit").await, 19.0 + 14.0);

    // Another tenant's same prefix is not the first tenant's: a miss.
    send(&sy, "code", "team-b", 0..1).await;
    assert_eq!(affinity(&sy, "miss").await, 2.0);
}

#[tokio::test]
async fn replicas_share_the_prefix_memory_on_redis_and_an_outage_only_skips_it() {
    let Some(mut redis) = RedisServer::start("replicas_share_the_prefix_memory_on_redis").await
    else {
        return;
    };
    let (mut a, mut b) = (
        Mock::start("anthropic", &[]).await,
        Mock::start("anthropic", &[]).await,
    );
    label_keys(&a, &b).await;
    let head = "[state]\nbackend = \"redis\"\ntimeout = \"200ms\"\nlease = \"1s\"\n";
    let url = redis.url();
    let env: Vec<(&str, &str)> = KEYS
        .iter()
        .copied()
        .chain([("SWITCHYARD_REDIS_URL", url.as_str())])
        .collect();
    let one = Switchyard::start_with(&config(head, &a, &b), &env).await;
    let two = Switchyard::start_with(&config(head, &a, &b), &env).await;

    // Turns alternate between the replicas; each replica alone would
    // spread its own.
    let mut served = Vec::new();
    for i in 0..20 {
        let sy = if i % 2 == 0 { &one } else { &two };
        served.extend(send(sy, "code", "team-a", i..i + 1).await);
    }
    let warm = served[0].clone();
    assert_eq!(count(&served, &warm), 20, "{served:?}");
    let (warm_mock, other_mock, other) = if warm == "a" {
        (&mut a, &b, "b")
    } else {
        (&mut b, &a, "a")
    };
    let keys = served_keys(&warm_mock.requests().await);
    assert_eq!(keys.len(), 20);
    assert!(
        keys.iter().all(|k| *k == keys[0]),
        "one key across replicas: {keys:?}"
    );
    assert_eq!(
        affinity(&one, "miss").await + affinity(&two, "miss").await,
        1.0
    );
    assert_eq!(affinity(&two, "hit").await, 10.0);

    // The warm target dies: the replica that meets it moves the prefix, and
    // the other replica goes straight to where it moved.
    warm_mock.child.kill().await.unwrap();
    assert_eq!(send(&one, "code", "team-a", 20..21).await, [other]);
    let mut client = two.client().await;
    for i in 21..31 {
        let got = stream(&mut client, turn("code", "team-a", i)).await;
        let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
        assert_eq!(f.served_by.unwrap().provider, other);
        assert_eq!(f.attempts, 1, "turn {i} never tried the dead target");
    }
    assert_eq!(affinity(&one, "move").await, 1.0);
    let keys = served_keys(&other_mock.requests().await);
    assert_eq!(keys.len(), 11);
    assert!(keys.iter().all(|k| *k == keys[0]), "{keys:?}");

    // Redis goes away: affinity is skipped, never a failure.
    redis.kill();
    let served = send(&two, "code", "team-a", 31..36).await;
    assert!(
        served.iter().all(|p| p == other),
        "only one target is alive"
    );
    let (_, m) = two.admin_get("/metrics").await;
    assert!(
        metric_sum(&m, "switchyard_state_errors_total{function=\"affinity\"}") >= 1.0,
        "{m}"
    );
}
