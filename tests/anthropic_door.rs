//! The Anthropic Messages door at the HTTP level, through the real binary:
//! the exact event sequence, an upstream `overloaded_error` before any delta
//! failed over transparently, a failure before output as Anthropic's error
//! JSON with its status, `x-api-key` authentication mapped to tenants, and
//! bounds on the body.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};

fn hello(stream: bool) -> Value {
    json!({"model": "chat", "max_tokens": 64, "stream": stream,
           "messages": [{"role": "user", "content": "Say hello."}]})
}

/// `(event, data)` pairs of an SSE body.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let mut name = String::new();
            let mut data = Value::Null;
            for line in f.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_string();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = serde_json::from_str(d).unwrap();
                }
            }
            (name, data)
        })
        .collect()
}

async fn post(rig: &Rig, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{}/v1/messages", rig.http_url()))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_stream_is_anthropics_event_sequence_and_failover_stays_invisible() {
    let rig = Rig::start("", "", &[]).await;
    // The primary overloads in the stream before any token: not committed,
    // so the secondary serves and the caller sees one clean answer.
    rig.primary
        .set_fault(json!({"type": "error_event", "after_tokens": 0}))
        .await;
    let r = post(&rig, &hello(true)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(
        r.headers()["x-switchyard-served-by"],
        "secondary/claude-sonnet-4-5"
    );
    assert!(r.headers().contains_key("request-id"));
    let body = r.text().await.unwrap();
    let ev = events(&body);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..3],
        ["message_start", "ping", "content_block_start"],
        "{body}"
    );
    assert_eq!(
        &names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    assert_eq!(ev[0].1["message"]["model"], "chat");
    let text: String = ev
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        text,
        (0..16).map(|i| format!("tok{i} ")).collect::<String>()
    );
    let delta = &ev[ev.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(delta["usage"]["output_tokens"], 16);
    assert_eq!(rig.primary.requests().await.len(), 1, "tried once");
    assert_eq!(rig.secondary.requests().await.len(), 1);
}

#[tokio::test]
async fn failures_are_anthropic_errors_with_their_status() {
    let rig = Rig::start("[limits]\nmax_request_bytes = 4096", "", &[]).await;
    for m in [&rig.primary, &rig.secondary] {
        m.set_fault(json!({"type": "status", "status": 429, "headers": {"retry-after": "7"}}))
            .await;
    }
    let r = post(&rig, &hello(true)).await;
    let status = r.status();
    let retry_after = r.headers().get("retry-after").cloned();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error", "{v}");
    assert!(
        status == 429 || status == 529,
        "rate limited everywhere: {status} {v}"
    );
    assert!(
        ["rate_limit_error", "overloaded_error"].contains(&v["error"]["type"].as_str().unwrap()),
        "{v}"
    );
    assert!(v["error"]["details"]["error_code"].is_string(), "{v}");
    assert!(v["request_id"].is_string(), "{v}");
    assert!(retry_after.is_some(), "a retry-after is passed on");

    let r = post(&rig, &json!({"model": "chat", "messages": []})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("max_tokens:"),
        "{v}"
    );

    let huge = json!({"model": "chat", "max_tokens": 8,
        "messages": [{"role": "user", "content": "x".repeat(8192)}]});
    let r = post(&rig, &huge).await;
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "request_too_large");

    let r = reqwest::Client::new()
        .post(format!("{}/v1/messages/count_tokens", rig.http_url()))
        .json(&json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn x_api_key_authenticates_like_a_bearer_token() {
    let rig = Rig::start(
        "\n[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n",
        "",
        &[("SY_TEST_TOKENS", "team-a:aaaaaaaaaaaaaaaaaaaaaaaa")],
    )
    .await;
    let r = post(&rig, &hello(false)).await;
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    assert!(rig.primary.requests().await.is_empty());

    let client = reqwest::Client::new();
    let url = format!("{}/v1/messages", rig.http_url());
    let r = client
        .post(&url)
        .header("x-api-key", "wrong-wrong-wrong-wrong")
        .json(&hello(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client
        .post(&url)
        .header("x-api-key", "aaaaaaaaaaaaaaaaaaaaaaaa")
        .json(&hello(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m: Value = r.json().await.unwrap();
    assert_eq!(m["type"], "message");
    assert_eq!(m["stop_reason"], "end_turn");
    let r = client
        .post(&url)
        .bearer_auth("aaaaaaaaaaaaaaaaaaaaaaaa")
        .json(&hello(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
