//! Rate-limit-aware admission and hedged first tokens through the real
//! binary, against mock-upstream enforcing per-key windows and sending the
//! providers' rate-limit headers: no request is sent to a key whose window
//! has no room (the upstream's 429 count stays 0), fleet-wide on Redis; a
//! reported empty window stops traffic to the key until its reset; a
//! request that fits nowhere waits `admission_wait` or gets RATE_LIMITED;
//! a slow first token is hedged on the next target and the loser's upstream
//! connection is closed at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};
use switchyard::proto;

const KEY_A: &str = "sk-small-window-0123456789abcdef";
const KEY_B: &str = "sk-large-window-0123456789abcdef";

async fn put(mock: &Mock, path: &str, body: Value) -> Value {
    let r = reqwest::Client::new()
        .put(format!("http://{}{path}", mock.addr))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{path}: {}", r.status());
    r.json().await.unwrap_or(Value::Null)
}

async fn limits(mock: &Mock) -> Value {
    reqwest::get(format!("http://{}/_mock/limits", mock.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A request whose window charge is about 1,000 tokens (900 of output).
fn big(route: &str) -> proto::CompletionRequest {
    proto::CompletionRequest {
        max_tokens: 900,
        ..request(route)
    }
}

#[tokio::test]
async fn two_replicas_on_redis_never_pass_a_keys_token_window() {
    let Some(redis) = RedisServer::start("rate windows fleet").await else {
        return;
    };
    let mock = Mock::start("openai", &[]).await;
    put(
        &mock,
        "/_mock/keys",
        json!({"labels": {KEY_A: "small", KEY_B: "large"}}),
    )
    .await;
    put(
        &mock,
        "/_mock/limits",
        json!({"keys": {KEY_A: {"tpm": 10000}}}),
    )
    .await;
    let keys = "keys = [{ name = \"small\", env = \"SY_KEY_A\", weight = 100, tpm = 10000 }, { name = \"large\", env = \"SY_KEY_B\" }]\nfirst_token_timeout";
    let config = format!(
        "[state]\nbackend = \"redis\"\n{}{}",
        provider("primary", "openai", &mock.base_url(), "gpt-4o-mini")
            .replace("first_token_timeout", keys),
        route("chat", &["primary/gpt-4o-mini"])
    );
    let env = [
        ("SWITCHYARD_REDIS_URL", redis.url()),
        ("SY_KEY_A", KEY_A.to_string()),
        ("SY_KEY_B", KEY_B.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let a = Switchyard::start_with(&config, &env).await;
    let b = Switchyard::start_with(&config, &env).await;
    let mut calls = Vec::new();
    for i in 0..50 {
        let sy = if i % 2 == 0 { &a } else { &b };
        let mut client = sy.client().await;
        calls.push(tokio::spawn(async move {
            stream(&mut client, big("chat")).await
        }));
    }
    for c in calls {
        let got = c.await.unwrap();
        assert!(got.finished.is_some(), "{:?}\n{}", got.status, a.logs());
    }
    let log = mock.requests().await;
    let limited = log.iter().filter(|r| r["status"] == 429).count();
    assert_eq!(limited, 0, "no upstream 429: {log:#?}");
    assert_eq!(log.len(), 50, "one upstream request each: {log:#?}");
    let small = log.iter().filter(|r| r["key_label"] == "small").count();
    assert!(
        (1..=10).contains(&small),
        "the small key took what its window holds ({small}), the rest went to the large one"
    );
    let view = limits(&mock).await;
    let peak = view["keys"]["small"]["peak_tokens"].as_u64().unwrap();
    assert!(peak <= 10_000, "the mock's window peaked at {peak}: {view}");
    assert_eq!(view["keys"]["small"]["limited"], 0);
    let (_, metrics) = a.admin_get("/metrics").await;
    assert!(
        metrics.contains(
            "switchyard_key_window_remaining{provider=\"primary\",key=\"small\",kind=\"tokens\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "switchyard_key_window_limit{provider=\"primary\",key=\"small\",kind=\"tokens\"} 10000"
        ),
        "the window's size, for `switchyard plan`: {metrics}"
    );
}

/// One provider with one key limited by the mock, a fallback provider.
async fn learned_rig(route_extra: &str, fallback: bool) -> (Mock, Mock, Switchyard) {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("openai", &[]).await;
    // 1,000 tokens a 2-second window, 80 of it already used: the first
    // request (about 911 charged) empties it, and its answer says so.
    put(
        &a,
        "/_mock/limits",
        json!({"window_ms": 2000, "keys": {KEY_A: {"tpm": 1000, "used_tokens": 80}}}),
    )
    .await;
    let targets: &[&str] = if fallback {
        &["primary/gpt-4o-mini", "secondary/gpt-4o-mini"]
    } else {
        &["primary/gpt-4o-mini"]
    };
    let config = format!(
        "{}{}{}{route_extra}\n",
        provider("primary", "openai", &a.base_url(), "gpt-4o-mini").replace(
            "first_token_timeout",
            "api_key_env = \"SY_KEY_A\"\nfirst_token_timeout"
        ),
        provider("secondary", "openai", &b.base_url(), "gpt-4o-mini"),
        route("chat", targets)
    );
    let sy = Switchyard::start_with(&config, &[("SY_KEY_A", KEY_A)]).await;
    (a, b, sy)
}

#[tokio::test]
async fn a_reported_empty_window_stops_traffic_to_the_key_until_its_reset() {
    let (a, b, sy) = learned_rig("", true).await;
    let mut client = sy.client().await;
    let first = stream(&mut client, big("chat")).await;
    assert_eq!(
        first.finished.unwrap().served_by.unwrap().provider,
        "primary"
    );
    // Status shows the key's window by name, never its value.
    let (_, status) = sy.admin_get("/v1/status").await;
    assert!(!status.contains(KEY_A));
    let status: Value = serde_json::from_str(&status).unwrap();
    let primary = status["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["provider"] == "primary")
        .unwrap();
    assert_eq!(primary["windows"][0]["key"], "default", "{primary}");
    assert!(primary["windows"][0]["tokens_remaining"].as_u64().unwrap() < 100);
    // The answer said 0 tokens are left for about 2 s: the next requests
    // go to the fallback, none to the empty key.
    for _ in 0..3 {
        let got = stream(&mut client, big("chat")).await;
        let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
        assert_eq!(f.served_by.unwrap().provider, "secondary");
    }
    assert_eq!(a.requests().await.len(), 1);
    assert_eq!(b.requests().await.len(), 3);
    // After the reset the key serves again.
    tokio::time::sleep(std::time::Duration::from_millis(2300)).await;
    let again = stream(&mut client, big("chat")).await;
    assert_eq!(
        again.finished.unwrap().served_by.unwrap().provider,
        "primary"
    );
    let log = a.requests().await;
    assert_eq!(log.len(), 2);
    assert!(
        log.iter().all(|r| r["status"] == 200),
        "not a single 429: {log:#?}"
    );
}

#[tokio::test]
async fn a_request_that_fits_nowhere_waits_its_admission_wait_or_is_rate_limited() {
    // Waits for the window (about 2 s) within admission_wait.
    let (a, _b, sy) = learned_rig("admission_wait = \"5s\"", false).await;
    let mut client = sy.client().await;
    assert!(stream(&mut client, big("chat")).await.finished.is_some());
    let started = std::time::Instant::now();
    let got = stream(&mut client, big("chat")).await;
    assert!(got.finished.is_some(), "{:?}", got.status);
    assert!(started.elapsed() >= std::time::Duration::from_millis(500));
    let log = a.requests().await;
    assert_eq!(log.len(), 2);
    assert!(log.iter().all(|r| r["status"] == 200), "{log:#?}");
    let (_, metrics) = sy.admin_get("/metrics").await;
    assert_eq!(
        metric_sum(
            &metrics,
            "switchyard_admission_waits_total{route=\"chat\",outcome=\"admitted\"}"
        ),
        1.0,
        "{metrics}"
    );

    // Without a wait: RESOURCE_EXHAUSTED / RATE_LIMITED with the reset as RetryInfo.
    let (a, _b, sy) = learned_rig("", false).await;
    let mut client = sy.client().await;
    assert!(stream(&mut client, big("chat")).await.finished.is_some());
    let got = stream(&mut client, big("chat")).await;
    let status = got.status.expect("refused");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(reason(&status), "RATE_LIMITED");
    use tonic_types::StatusExt;
    let retry = status
        .get_error_details()
        .retry_info()
        .and_then(|r| r.retry_delay)
        .expect("RetryInfo");
    assert!(retry <= std::time::Duration::from_secs(3), "{retry:?}");
    assert_eq!(a.requests().await.len(), 1, "nothing sent to the empty key");
}

#[tokio::test]
async fn a_slow_first_token_is_hedged_and_the_loser_is_hung_up_on() {
    let mock = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}{}hedge = {{ after = \"150ms\" }}\n",
        provider("primary", "openai", &mock.base_url(), "gpt-4o-mini"),
        provider("secondary", "openai", &mock.base_url(), "gpt-4.1-mini")
            .replace("gpt-4o-mini", "gpt-4.1-mini"),
        route("chat", &["primary/gpt-4o-mini", "secondary/gpt-4.1-mini"])
    );
    let sy = Switchyard::start(&config).await;
    // The primary's first token takes 3 s; the hedge's comes at once.
    mock.set_fault(json!({"type": "slow_first_token", "delay_ms": 3000, "times": 1}))
        .await;
    let mut client = sy.client().await;
    let started = std::time::Instant::now();
    let got = stream(&mut client, request("chat")).await;
    let f = got
        .finished
        .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()));
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert!(f.hedged);
    assert_eq!(f.won_attempt, 2);
    assert_eq!(f.attempts, 2);
    assert_eq!(f.served_by.unwrap().provider, "secondary");
    assert_eq!(got.started.len(), 1, "one Started, the winner's");
    let log = mock
        .wait_for("the loser's hang-up", |l| {
            l.iter().any(|r| r["client_hung_up"] == true)
        })
        .await;
    assert_eq!(log.len(), 2, "one hedge, no more");
    let winner = log.iter().find(|r| r["model"] == "gpt-4.1-mini").unwrap();
    let loser = log.iter().find(|r| r["model"] == "gpt-4o-mini").unwrap();
    let first_token = winner["first_token_ms"].as_f64().unwrap();
    let hung_up = loser["hung_up_ms"].as_f64().unwrap();
    assert!(
        hung_up - first_token < 100.0,
        "the loser was hung up on {} ms after the winner's first token",
        hung_up - first_token
    );
    let (_, metrics) = sy.admin_get("/metrics").await;
    assert_eq!(
        metric_sum(
            &metrics,
            "switchyard_hedges_total{route=\"chat\",outcome=\"won\"}"
        ),
        1.0
    );
    // A fast first token is never hedged.
    mock.clear().await;
    let got = stream(&mut client, request("chat")).await;
    let f = got.finished.unwrap();
    assert!(!f.hedged);
    assert_eq!(mock.requests().await.len(), 1);
}

#[tokio::test]
async fn hedges_are_paid_from_the_retry_budget_and_never_pass_it() {
    let mock = Mock::start("openai", &[]).await;
    // Every first token is slow: every request would like a hedge.
    mock.set_config(json!({"ttft": [{"p": 1.0, "ms": 600}]}))
        .await;
    let config = format!(
        "[retry_budget]\nratio = 0.1\nmin_per_sec = 0.1\n{}{}{}hedge = {{ after = \"50ms\" }}\n",
        provider("primary", "openai", &mock.base_url(), "gpt-4o-mini"),
        provider("secondary", "openai", &mock.base_url(), "gpt-4.1-mini")
            .replace("gpt-4o-mini", "gpt-4.1-mini"),
        route("chat", &["primary/gpt-4o-mini", "secondary/gpt-4.1-mini"])
    );
    let sy = Switchyard::start(&config).await;
    let mut calls = Vec::new();
    for _ in 0..20 {
        let mut client = sy.client().await;
        calls.push(tokio::spawn(async move {
            stream(&mut client, request("chat")).await
        }));
    }
    let mut hedged = 0;
    for c in calls {
        let got = c.await.unwrap();
        let f = got
            .finished
            .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()));
        hedged += usize::from(f.hedged);
    }
    let extra = mock.requests().await.len() - 20;
    // What the budget allows: ratio x first attempts + min_per_sec x ttl.
    assert!(extra <= 3, "{extra} hedges for 20 requests");
    assert_eq!(extra, hedged, "each extra request is a hedge");
    let (_, metrics) = sy.admin_get("/metrics").await;
    let refused = metric_sum(
        &metrics,
        "switchyard_hedges_total{route=\"chat\",outcome=\"budget\"}",
    );
    assert_eq!(refused as usize, 20 - extra, "{metrics}");
}

#[tokio::test]
async fn max_extra_hedges_one_more_target_each_after() {
    let mock = Mock::start("openai", &[]).await;
    let model =
        |m: &str| provider(m, "openai", &mock.base_url(), "gpt-4o-mini").replace("gpt-4o-mini", m);
    let config = format!(
        "{}{}{}{}hedge = {{ after = \"100ms\", max_extra = 2 }}\n",
        model("m1"),
        model("m2"),
        model("m3"),
        route("chat", &["m1/m1", "m2/m2", "m3/m3"])
    );
    let sy = Switchyard::start(&config).await;
    // The first two attempts are slow; the third answers at once.
    mock.set_fault(json!({"type": "slow_first_token", "delay_ms": 3000, "times": 2}))
        .await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    let f = got
        .finished
        .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()));
    assert!(f.hedged);
    assert_eq!((f.won_attempt, f.attempts), (3, 3));
    assert_eq!(f.served_by.unwrap().provider, "m3");
    let log = mock
        .wait_for("both losers hung up on", |l| {
            l.iter().filter(|r| r["client_hung_up"] == true).count() == 2
        })
        .await;
    assert_eq!(log.len(), 3, "two hedges, no more");
}

/// A flood of batch work waiting on one key's short window: every window
/// that resets starts again from the size the upstream reported (not from
/// nothing, which would let the whole flood through at once), so the
/// upstream never refuses one, and interactive requests on the same key are
/// still served within their deadline. (That batch work yields a window's
/// half to waiting interactive requests is `policy::rate_window`'s
/// `batch_yields_to_waiting_interactive_work`: here the interactive
/// requests are served with or without it.)
#[tokio::test]
async fn a_batch_flood_leaves_interactive_requests_served_within_their_deadline() {
    let Some(redis) = RedisServer::start("rate windows batch").await else {
        return;
    };
    let mock = Mock::start("openai", &[]).await;
    // 3,000 tokens every 2 s: three of these requests never fit one window.
    put(
        &mock,
        "/_mock/limits",
        json!({"window_ms": 2000, "keys": {KEY_A: {"tpm": 3000}}}),
    )
    .await;
    let config = format!(
        "[state]\nbackend = \"redis\"\n{}{}deadline = \"8s\"\nadmission_wait = \"6s\"\n{}priority = \"batch\"\nadmission_wait = \"60s\"\ndeadline = \"90s\"\n",
        provider("primary", "openai", &mock.base_url(), "gpt-4o-mini")
            .replace("first_token_timeout", "api_key_env = \"SY_KEY_A\"\nfirst_token_timeout"),
        route("chat", &["primary/gpt-4o-mini"]),
        route("bulk", &["primary/gpt-4o-mini"]),
    );
    let env = [
        ("SWITCHYARD_REDIS_URL", redis.url()),
        ("SY_KEY_A", KEY_A.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let sy = Switchyard::start_with(&config, &env).await;
    // One answer teaches the router the key's window (and its size).
    let mut client = sy.client().await;
    assert!(stream(&mut client, big("chat")).await.finished.is_some());
    let mut flood = Vec::new();
    for _ in 0..20 {
        let mut client = sy.client().await;
        flood.push(tokio::spawn(async move {
            stream(&mut client, big("bulk")).await
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for i in 0..3 {
        let got = stream(&mut client, big("chat")).await;
        assert!(
            got.finished.is_some(),
            "interactive request {i}: {:?}\n{}",
            got.status,
            sy.logs()
        );
    }
    let log = mock.requests().await;
    assert!(
        log.iter().all(|r| r["status"] == 200),
        "the upstream never refused a request: {log:#?}"
    );
    let view = limits(&mock).await;
    assert!(view["keys"]
        .as_object()
        .unwrap()
        .values()
        .all(|k| k["peak_tokens"].as_u64().unwrap() <= 3000));
    drop(flood);
}

#[tokio::test]
async fn a_window_one_replica_learned_holds_the_other_replica_back_too() {
    let Some(redis) = RedisServer::start("rate windows learned fleet").await else {
        return;
    };
    let a_mock = Mock::start("openai", &[]).await;
    let b_mock = Mock::start("openai", &[]).await;
    // Nothing configured: the window is only what the upstream reports.
    put(
        &a_mock,
        "/_mock/limits",
        json!({"window_ms": 30000, "keys": {KEY_A: {"tpm": 1000, "used_tokens": 80}}}),
    )
    .await;
    let config = format!(
        "[state]\nbackend = \"redis\"\n{}{}{}",
        provider("primary", "openai", &a_mock.base_url(), "gpt-4o-mini").replace(
            "first_token_timeout",
            "api_key_env = \"SY_KEY_A\"\nfirst_token_timeout"
        ),
        provider("secondary", "openai", &b_mock.base_url(), "gpt-4o-mini"),
        route("chat", &["primary/gpt-4o-mini", "secondary/gpt-4o-mini"])
    );
    let env = [
        ("SWITCHYARD_REDIS_URL", redis.url()),
        ("SY_KEY_A", KEY_A.to_string()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let one = Switchyard::start_with(&config, &env).await;
    let two = Switchyard::start_with(&config, &env).await;
    // Replica one's answer empties the window and says so.
    let got = stream(&mut one.client().await, big("chat")).await;
    assert_eq!(got.finished.unwrap().served_by.unwrap().provider, "primary");
    // Replica two never had an answer from the key; within its refresh it
    // knows the fleet's window and sends nothing into it.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let got = stream(&mut two.client().await, big("chat")).await;
    assert_eq!(
        got.finished.unwrap().served_by.unwrap().provider,
        "secondary"
    );
    let log = a_mock.requests().await;
    assert_eq!(log.len(), 1, "nothing sent into the full window: {log:#?}");
}
