//! The request path against the real binary: the route order holds on sparse
//! evidence, an always-failing primary trips its breaker (the outage alert)
//! under light sequential traffic, the HTTP door enforces the tenant limits
//! counted together with gRPC, an oversized gRPC message is
//! RESOURCE_EXHAUSTED with ErrorInfo, and one gRPC connection carries more
//! than 200 calls at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard::proto;
use tonic::Code;

#[tokio::test]
async fn sparse_evidence_keeps_the_route_order() {
    let rig = Rig::start("", "", &[]).await;
    // Two transient 503s on the primary, out of four calls.
    rig.primary
        .set_fault(json!({"type": "status", "status": 503, "times": 2}))
        .await;
    let first = rig.served_by(4).await;
    assert_eq!(first[..2], ["secondary", "secondary"], "{first:?}");
    assert_eq!(first[2..], ["primary", "primary"], "{first:?}");
    // The primary has 4 calls in its window (2 failed): far below
    // health.min_calls, so it keeps its place for every later request.
    let later = rig.served_by(20).await;
    assert!(later.iter().all(|p| p == "primary"), "{later:?}");
    let (_, metrics) = rig.sy.admin_get("/metrics").await;
    assert_eq!(
        metric_sum(&metrics, "switchyard_target_demoted{"),
        0.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn an_always_failing_primary_trips_its_breaker_under_light_traffic() {
    let rig = Rig::start("", "", &[]).await;
    rig.primary
        .set_fault(json!({"type": "status", "status": 503}))
        .await;
    let served = rig.served_by(20).await;
    assert!(served.iter().all(|p| p == "secondary"), "{served:?}");
    // Default consecutive_failures = 5: exactly five calls reached the
    // primary, then its breaker opened (open_for 30 s outlasts the test).
    let log = rig.primary.requests().await;
    assert_eq!(attempts(&log), 5, "{log:?}");
    let (_, metrics) = rig.sy.admin_get("/metrics").await;
    let opened = metrics
        .lines()
        .filter(|l| l.starts_with("switchyard_breaker_transitions_total{"))
        .filter(|l| l.contains("provider=\"primary\"") && l.contains("to=\"open\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    assert_eq!(opened, 1.0, "{metrics}");
    let logs = rig.sy.logs();
    let warn = logs
        .lines()
        .find(|l| l.contains("WARN") && l.contains("breaker opened"))
        .unwrap_or_else(|| panic!("no breaker WARN: {logs}"));
    assert!(warn.contains("primary"), "{warn}");
}

const TOKENS: &str = "team-a:aaaaaaaaaaaaaaaaaaaaaaaa";

fn limits(extra: &str) -> String {
    format!("[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n[limits]\n{extra}\n")
}

fn bearer(mut r: proto_request::Req) -> proto_request::Req {
    r.metadata_mut().insert(
        "authorization",
        "Bearer aaaaaaaaaaaaaaaaaaaaaaaa".parse().unwrap(),
    );
    r
}

mod proto_request {
    pub type Req = tonic::Request<switchyard::proto::CompletionRequest>;
}

async fn http_chat(rig: &Rig) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", rig.http_url()))
        .bearer_auth("aaaaaaaaaaaaaaaaaaaaaaaa")
        .json(&json!({"model": "chat", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn the_http_door_shares_the_tenant_concurrency_limit_with_grpc() {
    let rig = Rig::start(
        &limits("tenant_max_concurrent = 1"),
        "",
        &[("SY_TEST_TOKENS", TOKENS)],
    )
    .await;
    // A slow answer holds the tenant's one slot.
    rig.primary
        .set_fault(json!({"type": "slow_first_token", "delay_ms": 3000, "times": 1}))
        .await;
    let mut client = rig.sy.client().await;
    let held = tokio::spawn(async move {
        stream(&mut client, bearer(tonic::Request::new(request("chat")))).await
    });
    rig.primary
        .wait_for("the slow call", |log| !log.is_empty())
        .await;
    // Over HTTP, the same tenant is refused while the gRPC call runs.
    let r = http_chat(&rig).await;
    assert_eq!(r.status(), 429);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "TENANT_LIMIT", "{v}");
    // And the other way round: two concurrent HTTP streams of one tenant.
    let got = held.await.unwrap();
    assert!(got.finished.is_some(), "{:?}", got.status);
    rig.primary
        .set_fault(json!({"type": "slow_first_token", "delay_ms": 3000, "times": 1}))
        .await;
    let slow = tokio::spawn({
        let url = rig.http_url();
        async move {
            reqwest::Client::new()
                .post(format!("{url}/v1/chat/completions"))
                .bearer_auth("aaaaaaaaaaaaaaaaaaaaaaaa")
                .json(&json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    rig.primary
        .wait_for("the second slow call", |log| log.len() >= 2)
        .await;
    let r = http_chat(&rig).await;
    assert_eq!(r.status(), 429, "two concurrent HTTP streams of one tenant");
    assert_eq!(slow.await.unwrap(), 200);
    // Nothing held: served again.
    assert_eq!(http_chat(&rig).await.status(), 200);
}

#[tokio::test]
async fn the_http_door_shares_the_tenant_rate_limit_with_grpc() {
    let rig = Rig::start(
        &limits("tenant_rate_per_sec = 0.01\ntenant_burst = 2"),
        "",
        &[("SY_TEST_TOKENS", TOKENS)],
    )
    .await;
    let mut client = rig.sy.client().await;
    let got = stream(&mut client, bearer(tonic::Request::new(request("chat")))).await;
    assert!(got.finished.is_some(), "{:?}", got.status);
    assert_eq!(
        http_chat(&rig).await.status(),
        200,
        "the second of a burst of 2"
    );
    let r = http_chat(&rig).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "TENANT_LIMIT", "{v}");
    let got = stream(&mut client, bearer(tonic::Request::new(request("chat")))).await;
    let s = got.status.unwrap();
    assert_eq!(s.code(), Code::ResourceExhausted);
    assert_eq!(reason(&s), "TENANT_LIMIT");
    assert_eq!(
        attempts(&rig.primary.requests().await),
        2,
        "two served upstream"
    );
}

#[tokio::test]
async fn an_oversized_grpc_message_is_resource_exhausted_and_the_connection_lives() {
    let rig = Rig::start("[limits]\nmax_request_bytes = 4096", "", &[]).await;
    let mut client = rig.sy.client().await;
    let mut big = request("chat");
    big.messages[0].content = "x".repeat(10_000);
    let s = stream(&mut client, big.clone()).await.status.unwrap();
    assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
    assert_eq!(reason(&s), "REQUEST_TOO_LARGE");
    assert_eq!(error_meta(&s, "limit_bytes").as_deref(), Some("4096"));
    let s = client.complete(big).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted, "unary too");
    // The same connection still serves.
    let got = tokio::time::timeout(
        Duration::from_secs(10),
        stream(&mut client, request("chat")),
    )
    .await
    .unwrap();
    assert!(got.finished.is_some(), "{:?}", got.status);
}

#[tokio::test]
async fn meaningful_evidence_demotes_a_flaky_primary_visibly_and_keeps_a_trickle() {
    // Evidence after 4 calls each (a test-sized `min_calls`); no prior.
    let health = "health = { prior_successes = 0, min_calls = 4 }";
    let rig = Rig::start_full("", health, "", &[], &[]).await;
    let (primary, sy) = (&rig.primary, &rig.sy);
    let mut client = sy.client().await;
    // Every other call fails (never five in a row: the breaker stays closed).
    primary
        .set_fault(json!({"type": "status", "status": 500, "times": 1}))
        .await;
    for i in 0..8 {
        let got = stream(&mut client, request("chat")).await;
        assert!(got.finished.is_some(), "{:?}", got.status);
        if i % 2 == 1 {
            primary
                .set_fault(json!({"type": "status", "status": 500, "times": 1}))
                .await;
        }
    }
    // Both now have at least 4 calls; the primary's success rate is half.
    let (_, metrics) = sy.admin_get("/metrics").await;
    assert_eq!(
        metric_sum(
            &metrics,
            r#"switchyard_target_demoted{route="chat",provider="primary",model="gpt-4o-mini"}"#
        ),
        1.0,
        "{metrics}"
    );
    assert!(sy
        .logs()
        .contains("ranks this target below its route place"));
    primary.set_fault(json!({})).await;
    primary.clear().await;
    let mut firsts = 0;
    for _ in 0..40 {
        let got = stream(&mut client, request("chat")).await;
        let f = got.finished.expect("served");
        if f.served_by.unwrap().provider == "primary" {
            firsts += 1;
        }
    }
    // About 5 % still start at the primary: its recovery is seen.
    assert!(
        firsts <= 8,
        "demoted: most traffic goes to the secondary ({firsts} of 40)"
    );
    assert_eq!(attempts(&primary.requests().await), firsts);
}

/// Over HTTP/2 a server caps the streams one connection carries (the mock
/// is hyper's server: 200). A provider with `http2_prior_knowledge` and
/// `max_concurrency = 300` gets three connections, so 300 slow streams are
/// all upstream at once instead of 100 of them waiting, unseen, inside the
/// client for a free stream. And requests share a connection up to its
/// share of 100 before the next one is used: one after another, five go
/// over one connection; 300 at once go 100 to each of three (the mock logs
/// each request's client address).
#[tokio::test]
async fn an_h2c_provider_spreads_its_streams_over_connections_past_a_servers_stream_cap() {
    const STREAMS: u64 = 300;
    let mock = Mock::start("openai", &["--tokens", "400", "--token-delay-ms", "50"]).await;
    let h2c = provider("h2", "openai", &mock.base_url(), "gpt-4o-mini").replacen(
        "idle_timeout = \"5s\"\n",
        "idle_timeout = \"5s\"\nhttp2_prior_knowledge = true\nmax_concurrency = 300\nfailover_max_concurrency = 300\n",
        1,
    );
    // What is tested is where the streams go, not how fast 300 of them
    // start or flow: on a slow or busy machine (a debug build, two cores
    // shared with the mock) the last headers took more than the helper's
    // 5 s, and under other load a stream's tokens paused past its 5 s idle
    // timeout.
    let h2c = h2c
        .replace(
            "first_token_timeout = \"5s\"",
            "first_token_timeout = \"60s\"",
        )
        .replace("idle_timeout = \"5s\"", "idle_timeout = \"60s\"");
    assert!(h2c.contains("first_token_timeout = \"60s\""));
    assert!(h2c.contains("idle_timeout = \"60s\""));
    assert!(h2c.contains("http2_prior_knowledge"));
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{h2c}{}",
        route("chat", &["h2/gpt-4o-mini"])
    );
    let sy = Switchyard::start(&config).await;
    let url = format!("{}/v1/chat/completions", sy.http_url());
    let http = reqwest::Client::new();
    for _ in 0..5 {
        let r = http
            .post(&url)
            .json(&json!({"model": "chat", "max_tokens": 2,
                "messages": [{"role": "user", "content": "Say hello."}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        r.bytes().await.unwrap();
    }
    let one_by_one: std::collections::BTreeSet<String> = mock
        .requests()
        .await
        .iter()
        .map(|r| r["peer"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        one_by_one.len(),
        1,
        "requests one after another share a connection: {one_by_one:?}"
    );
    let streams: Vec<_> = (0..STREAMS)
        .map(|_| {
            let (http, url) = (http.clone(), url.clone());
            tokio::spawn(async move {
                let r = http
                    .post(url)
                    .json(&json!({"model": "chat", "stream": true,
                        "messages": [{"role": "user", "content": "Say hello."}]}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
                // Hold the stream open until the test ends.
                let mut body = r.bytes_stream();
                while futures_util::StreamExt::next(&mut body).await.is_some() {}
            })
        })
        .collect();
    // Each stream lasts 20 s; all 300 must be upstream well before any ends.
    let mut in_flight = 0;
    for _ in 0..1500 {
        in_flight = mock.stats().await["in_flight"].as_u64().unwrap();
        if in_flight == STREAMS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        in_flight, STREAMS,
        "every stream reached the upstream at once (one h2 connection carries 200)"
    );
    let log = mock.requests().await;
    assert!(
        log.iter().all(|r| r["http_version"] == "HTTP/2.0"),
        "{:?}",
        log[0]
    );
    let mut per_connection: std::collections::BTreeMap<&str, u64> = Default::default();
    // The log is in arrival order: the five above come first.
    for r in log.iter().skip(5) {
        *per_connection
            .entry(r["peer"].as_str().unwrap())
            .or_default() += 1;
    }
    assert_eq!(
        per_connection.values().copied().collect::<Vec<_>>(),
        [100, 100, 100],
        "each connection carries its share of 100 streams: {per_connection:?}"
    );
    for s in streams {
        s.abort();
    }
}

/// The gRPC server puts no cap of its own on one connection's concurrent
/// calls (hyper's HTTP/2 server would cap them at 200): 300 slow streams on
/// one channel all get their first token before any of them ends.
#[tokio::test]
async fn one_grpc_connection_carries_300_streams_at_once() {
    const CALLS: usize = 300;
    let mock = Mock::start("openai", &[]).await;
    // Each stream lasts at least 9 s: four tokens, 3 s apart.
    mock.set_config(json!({"tokens": 4, "token_delay_ms": 3000}))
        .await;
    let config = provider("primary", "openai", &mock.base_url(), "gpt-4o-mini").replace(
        "  [[providers.models]]",
        "max_concurrency = 1000\nfailover_max_concurrency = 1000\n  [[providers.models]]",
    ) + &route("chat", &["primary/gpt-4o-mini"]);
    let sy = Switchyard::start(&config).await;
    let client = proto::router_client::RouterClient::new(sy.channel().await);
    let ended = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (first_tx, mut first_rx) = tokio::sync::mpsc::channel(CALLS);
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..CALLS {
        let (mut client, ended, first_tx) = (client.clone(), ended.clone(), first_tx.clone());
        calls.spawn(async move {
            let mut s = client
                .stream_completion(request("chat"))
                .await
                .unwrap()
                .into_inner();
            let mut seen = false;
            while let Some(event) = s.message().await.unwrap() {
                let delta = matches!(event.event, Some(proto::completion_event::Event::Delta(_)));
                if delta && !seen {
                    seen = true;
                    let _ = first_tx
                        .send(ended.load(std::sync::atomic::Ordering::SeqCst))
                        .await;
                }
            }
            ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
    }
    drop(first_tx);
    let mut before_any_end = 0;
    for n in 0..CALLS {
        let ended_then = tokio::time::timeout(Duration::from_secs(60), first_rx.recv())
            .await
            .unwrap_or_else(|_| panic!("only {n} of {CALLS} streams got a first token"))
            .expect("every call reports its first token");
        if ended_then == 0 {
            before_any_end += 1;
        }
    }
    assert_eq!(
        before_any_end, CALLS,
        "streams that began only after another ended"
    );
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }
    assert_eq!(ended.load(std::sync::atomic::Ordering::SeqCst), CALLS);
}
