//! Tests of the mock against `start()` on 127.0.0.1:0 with a real HTTP client:
//! wire shapes of both dialects, every fault type, the log and the stats.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{json, Value};

use super::*;

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client")
}

async fn mock(tokens: u32) -> MockHandle {
    start(MockArgs {
        tokens,
        ..MockArgs::default()
    })
    .await
    .expect("start")
}

fn oa_body(stream: bool) -> Value {
    json!({"model": "gpt-test", "stream": stream,
           "messages": [{"role": "user", "content": "hi"}]})
}

fn an_body(stream: bool) -> Value {
    json!({"model": "claude-test", "stream": stream, "max_tokens": 1000,
           "messages": [{"role": "user", "content": "hi"}]})
}

async fn post(h: &MockHandle, path: &str, body: &Value) -> reqwest::Response {
    client()
        .post(format!("{}{path}", h.base_url()))
        .header("authorization", "Bearer sk-test")
        .header("x-switchyard-attempt", "1")
        .json(body)
        .send()
        .await
        .expect("send")
}

async fn put_fault(h: &MockHandle, spec: Value) -> Value {
    let r = client()
        .put(format!("http://{}/_mock/faults", h.addr()))
        .json(&spec)
        .send()
        .await
        .expect("put");
    assert_eq!(r.status(), 200, "fault rejected: {spec}");
    r.json().await.expect("json")
}

/// `data:` payloads of an SSE body, in order.
fn data_lines(body: &str) -> Vec<String> {
    body.split("\n\n")
        .flat_map(|ev| ev.lines())
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_owned))
        .collect()
}

fn event_names(body: &str) -> Vec<String> {
    body.lines()
        .filter_map(|l| l.strip_prefix("event: ").map(str::to_owned))
        .collect()
}

fn text_of(n: u32) -> String {
    (0..n).map(token_text).collect()
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(50)).await;
}

#[tokio::test]
async fn openai_stream_is_well_formed() {
    let h = mock(5).await;
    let mut body = oa_body(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = post(&h, "/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("x-request-id"));
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    let data = data_lines(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let id = &chunks[0]["id"];
    assert!(chunks.iter().all(|c| &c["id"] == id
        && c["object"] == "chat.completion.chunk"
        && c["model"] == "gpt-test"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, text_of(5));
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);

    settle().await;
    let log = h.requests();
    assert_eq!(log.len(), 1);
    let rec = &log[0];
    assert!(rec.stream && rec.completed && !rec.client_hung_up);
    assert_eq!(rec.tokens_sent, 5);
    assert_eq!(rec.status, Some(200));
    assert!(rec.authorization_present);
    assert_eq!(
        rec.headers.get("x-switchyard-attempt").map(String::as_str),
        Some("1")
    );
    assert_eq!(rec.model.as_deref(), Some("gpt-test"));
    assert!(!serde_json::to_string(&log).unwrap().contains("sk-test"));
}

#[tokio::test]
async fn openai_non_stream_and_max_tokens() {
    let h = mock(8).await;
    let mut body = oa_body(false);
    body["max_tokens"] = json!(3);
    let v: Value = post(&h, "/chat/completions", &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], text_of(3));
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    // Same request, same text.
    let w: Value = post(&h, "/chat/completions", &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"], w["choices"]);
}

#[tokio::test]
async fn openai_tool_call_stream() {
    let h = mock(4).await;
    let mut body = oa_body(true);
    body["tools"] = json!([{"type": "function", "function": {"name": "lookup", "parameters": {}}}]);
    let text = post(&h, "/chat/completions", &body)
        .await
        .text()
        .await
        .unwrap();
    let data = data_lines(&text);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let first = chunks
        .iter()
        .find(|c| c["choices"][0]["delta"]["tool_calls"][0]["id"].is_string())
        .unwrap();
    let call = &first["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(call["index"], 0);
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "lookup");
    assert_eq!(call["function"]["arguments"], "");
    let args: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    let parsed: Value = serde_json::from_str(&args).unwrap();
    assert_eq!(parsed["query"], text_of(4));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    settle().await;
    assert!(h.requests()[0].has_tools);
}

#[tokio::test]
async fn anthropic_stream_ends_with_message_stop() {
    let h = mock(3).await;
    let r = post(&h, "/messages", &an_body(true)).await;
    assert!(r.headers().contains_key("request-id"));
    let text = r.text().await.unwrap();
    assert_eq!(
        event_names(&text),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let data: Vec<Value> = data_lines(&text)
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(
        data[0]["message"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let t: String = data
        .iter()
        .filter_map(|d| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(t, text_of(3));
    assert_eq!(data[7]["delta"]["stop_reason"], "end_turn");
    assert_eq!(data[7]["usage"]["output_tokens"], 3);

    // Capped by max_tokens, and a tool_use answer.
    let mut body = an_body(true);
    body["max_tokens"] = json!(2);
    let text = post(&h, "/messages", &body).await.text().await.unwrap();
    assert!(text.contains("\"stop_reason\":\"max_tokens\""));
    let mut body = an_body(true);
    body["tools"] = json!([{"name": "lookup", "input_schema": {}}]);
    let text = post(&h, "/messages", &body).await.text().await.unwrap();
    let data: Vec<Value> = data_lines(&text)
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(data[1]["content_block"]["type"], "tool_use");
    assert_eq!(data[1]["content_block"]["name"], "lookup");
    let json: String = data
        .iter()
        .filter_map(|d| d["delta"]["partial_json"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&json).unwrap()["query"],
        text_of(3)
    );
    assert!(text.contains("\"stop_reason\":\"tool_use\""));
    assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));

    let v: Value = post(&h, "/messages", &an_body(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], text_of(3));
    assert_eq!(v["stop_reason"], "end_turn");
}

#[tokio::test]
async fn status_presets_use_real_bodies() {
    let h = mock(2).await;
    put_fault(
        &h,
        json!({"type": "status", "preset": "rate_limit", "headers": {"retry-after": "2"}}),
    )
    .await;
    let r = post(&h, "/chat/completions", &oa_body(false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert!(v["error"]["param"].is_null());

    put_fault(&h, json!({"type": "status", "preset": "spend_limit"})).await;
    let r = post(&h, "/messages", &an_body(true)).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(
        v["error"]["details"]["error_code"],
        "enforced_spend_limit_reached"
    );
    assert!(v["request_id"].is_string());

    put_fault(&h, json!({"type": "status", "preset": "auth"})).await;
    let r = post(&h, "/chat/completions", &oa_body(true)).await;
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains(AUTH_MARKER));

    put_fault(&h, json!({"type": "status", "status": 529})).await;
    let r = post(&h, "/messages", &an_body(true)).await;
    assert_eq!(r.status(), 529);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error");

    put_fault(&h, json!({"type": "status", "preset": "request_too_large"})).await;
    let v: Value = post(&h, "/chat/completions", &oa_body(true))
        .await
        .json()
        .await
        .unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Limit 30000, Requested 34307."));

    put_fault(&h, json!({"type": "status", "status": 500, "body": "oops"})).await;
    let r = post(&h, "/chat/completions", &oa_body(true)).await;
    assert_eq!(r.status(), 500);
    assert_eq!(r.text().await.unwrap(), "oops");
    settle().await;
    let log = h.requests();
    assert!(log.iter().all(|r| r.fault.as_deref() == Some("status")));
    assert_eq!(log[0].status, Some(429));
}

#[tokio::test]
async fn times_counts_down_then_healthy() {
    let h = mock(2).await;
    put_fault(&h, json!({"type": "status", "status": 503, "times": 2})).await;
    let mut codes = vec![];
    for _ in 0..4 {
        codes.push(
            post(&h, "/chat/completions", &oa_body(false))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(codes, [503, 503, 200, 200]);
    assert_eq!(h.fault().times, Some(0));
    put_fault(&h, json!({})).await;
    assert_eq!(h.fault(), FaultSpec::default());
}

#[tokio::test]
async fn fraction_is_seeded_and_deterministic() {
    let h = mock(1).await;
    let mut runs = vec![];
    for _ in 0..2 {
        put_fault(
            &h,
            json!({"type": "status", "status": 500, "fraction": 0.5, "seed": 7}),
        )
        .await;
        let mut pattern = vec![];
        for _ in 0..40 {
            pattern.push(
                post(&h, "/chat/completions", &oa_body(false))
                    .await
                    .status()
                    == 500,
            );
        }
        runs.push(pattern);
    }
    assert_eq!(runs[0], runs[1]);
    let hits = runs[0].iter().filter(|b| **b).count();
    assert!((8..=32).contains(&hits), "hits {hits}");
}

#[tokio::test]
async fn abort_fin_and_rst_are_body_errors() {
    for reset in [false, true] {
        let h = mock(10).await;
        h.set_fault(
            Fault::Abort {
                after_tokens: 3,
                reset,
            }
            .into(),
        );
        let r = post(&h, "/chat/completions", &oa_body(true)).await;
        assert_eq!(r.status(), 200);
        let err = r.text().await.expect_err("body must fail");
        let chain = format!("{:?}", err);
        assert_eq!(chain.to_lowercase().contains("reset"), reset, "{chain}");
        settle().await;
        let rec = &h.requests()[0];
        assert_eq!(rec.tokens_sent, 3);
        assert!(!rec.completed && !rec.client_hung_up);
        assert_eq!(rec.fault.as_deref(), Some("abort"));
    }
}

#[tokio::test]
async fn refuse_then_recover() {
    let h = mock(1).await;
    put_fault(&h, json!({"type": "refuse", "duration_ms": 300})).await;
    let fresh = reqwest::Client::builder().no_proxy().build().unwrap();
    let err = fresh
        .post(format!("{}/chat/completions", h.base_url()))
        .json(&oa_body(false))
        .send()
        .await
        .expect_err("refused");
    assert!(err.is_connect(), "{err:?}");
    tokio::time::sleep(Duration::from_millis(450)).await;
    let r = post(&h, "/chat/completions", &oa_body(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(h.fault(), FaultSpec::default());
}

#[tokio::test]
async fn refuse_from_flag_starts_down() {
    let h = start(MockArgs {
        fault: Some(r#"{"type":"refuse","duration_ms":200}"#.into()),
        ..MockArgs::default()
    })
    .await
    .unwrap();
    assert!(tokio::net::TcpStream::connect(h.addr()).await.is_err());
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert!(tokio::net::TcpStream::connect(h.addr()).await.is_ok());
}

#[tokio::test]
async fn over_capacity_is_rejected_and_logged() {
    let h = start(MockArgs {
        tokens: 5,
        token_delay_ms: 100,
        max_concurrency: 1,
        ..MockArgs::default()
    })
    .await
    .unwrap();
    let h = std::sync::Arc::new(h);
    let h1 = h.clone();
    let slow = tokio::spawn(async move {
        post(&h1, "/messages", &an_body(true))
            .await
            .text()
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let r = post(&h, "/messages", &an_body(true)).await;
    assert_eq!(r.status(), 529);
    let r = post(&h, "/chat/completions", &oa_body(true)).await;
    assert_eq!(r.status(), 503);
    assert!(slow.await.unwrap().contains("message_stop"));
    settle().await;
    let log = h.requests();
    assert_eq!(log.iter().filter(|r| r.over_capacity).count(), 2);
    assert_eq!(h.stats().max_in_flight, 1);
    let stats: Value = client()
        .get(format!("http://{}/_mock/stats", h.addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        stats,
        json!({"in_flight": 0, "max_in_flight": 1, "requests": 3})
    );
}

#[tokio::test]
async fn hang_and_client_timeout_is_logged_as_hang_up() {
    let h = mock(3).await;
    put_fault(&h, json!({"type": "hang"})).await;
    let err = client()
        .post(format!("{}/chat/completions", h.base_url()))
        .json(&oa_body(true))
        .timeout(Duration::from_millis(200))
        .send()
        .await
        .expect_err("timeout");
    assert!(err.is_timeout());
    settle().await;
    let rec = &h.requests()[0];
    assert!(rec.client_hung_up, "{rec:?}");
    assert_eq!(rec.status, None);
    assert_eq!(h.stats().in_flight, 0);
}

#[tokio::test]
async fn stall_then_client_drop_is_logged_as_hang_up() {
    let h = mock(10).await;
    h.set_fault(Fault::Stall { after_tokens: 2 }.into());
    let mut r = post(&h, "/chat/completions", &oa_body(true)).await;
    let mut seen = String::new();
    while !seen.contains("tok1 ") {
        let chunk = r.chunk().await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    let more = tokio::time::timeout(Duration::from_millis(150), r.chunk()).await;
    assert!(more.is_err(), "stall must send nothing more");
    drop(r);
    settle().await;
    let rec = &h.requests()[0];
    assert_eq!(rec.tokens_sent, 2);
    assert!(rec.client_hung_up && !rec.completed);
}

#[tokio::test]
async fn slow_first_token_sends_headers_at_once() {
    let h = mock(2).await;
    put_fault(&h, json!({"type": "slow_first_token", "delay_ms": 600})).await;
    let t0 = std::time::Instant::now();
    let r = post(&h, "/chat/completions", &oa_body(true)).await;
    assert!(t0.elapsed() < Duration::from_millis(500));
    let text = r.text().await.unwrap();
    assert!(t0.elapsed() >= Duration::from_millis(600));
    assert!(text.ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn stream_shape_faults() {
    let h = mock(4).await;
    let get = |path: &'static str, body: Value| {
        let h = &h;
        async move { post(h, path, &body).await.text().await.unwrap() }
    };

    put_fault(&h, json!({"type": "error_event", "after_tokens": 1})).await;
    let t = get("/messages", an_body(true)).await;
    assert!(t.ends_with(
        "event: error\ndata: {\"error\":{\"message\":\"Overloaded\",\"type\":\"overloaded_error\"},\"type\":\"error\"}\n\n"
    ) || t.contains("event: error"));
    assert!(!t.contains("message_stop") && t.contains("tok0 ") && !t.contains("tok1 "));
    let t = get("/chat/completions", oa_body(true)).await;
    assert!(data_lines(&t).last().unwrap().starts_with("{\"error\":"));

    put_fault(
        &h,
        json!({"type": "error_event", "after_tokens": 0, "then_done": true}),
    )
    .await;
    let t = get("/chat/completions", oa_body(true)).await;
    let d = data_lines(&t);
    assert!(d[d.len() - 2].contains("\"error\"") && d[d.len() - 1] == "[DONE]");

    put_fault(&h, json!({"type": "refusal", "after_tokens": 2})).await;
    let t = get("/messages", an_body(true)).await;
    assert!(t.contains("\"stop_reason\":\"refusal\"") && t.contains("message_stop"));
    assert!(!t.contains("tok2 "));
    let t = get("/chat/completions", oa_body(true)).await;
    assert!(t.contains("\"finish_reason\":\"content_filter\"") && t.ends_with("[DONE]\n\n"));

    put_fault(&h, json!({"type": "no_terminator"})).await;
    let t = get("/messages", an_body(true)).await;
    assert!(t.contains("message_delta") && !t.contains("message_stop"));
    let t = get("/chat/completions", oa_body(true)).await;
    assert!(t.contains("\"finish_reason\":\"stop\"") && !t.contains("[DONE]"));

    put_fault(&h, json!({"type": "malformed", "after_tokens": 1})).await;
    let t = get("/chat/completions", oa_body(true)).await;
    assert!(t.contains("data: {\"choices\":[{\"delta\":\n\n") && t.ends_with("[DONE]\n\n"));
    put_fault(
        &h,
        json!({"type": "malformed", "after_tokens": 1, "close": true}),
    )
    .await;
    let t = get("/chat/completions", oa_body(true)).await;
    assert!(t.ends_with("data: {\"choices\":[{\"delta\":\n\n"));

    put_fault(&h, json!({"type": "empty_done"})).await;
    assert_eq!(
        get("/chat/completions", oa_body(true)).await,
        "data: [DONE]\n\n"
    );

    put_fault(&h, json!({"type": "legacy_error"})).await;
    let t = get("/chat/completions", oa_body(true)).await;
    assert!(t.starts_with("error: {\"code\":400") && t.ends_with("data: [DONE]\n\n"));

    put_fault(&h, json!({"type": "error_event"})).await;
    let r = post(&h, "/messages", &an_body(false)).await;
    assert_eq!(r.status(), 529);
}

#[tokio::test]
async fn control_endpoints() {
    let h = mock(2).await;
    let c = client();
    let base = format!("http://{}", h.addr());
    let bad = c
        .put(format!("{base}/_mock/faults"))
        .body(r#"{"type":"status","stauts":500}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let cfg: Value = c
        .put(format!("{base}/_mock/config"))
        .json(&json!({"tokens": 3}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        cfg,
        json!({"tokens": 3, "token_delay_ms": 0, "max_concurrency": 0,
               "ttft": [], "ttft_seed": 0})
    );
    let v: Value = post(&h, "/chat/completions", &oa_body(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], text_of(3));
    let log: Vec<RequestRecord> = c
        .get(format!("{base}/_mock/requests"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].path, "/v1/chat/completions");
    c.delete(format!("{base}/_mock/requests"))
        .send()
        .await
        .unwrap();
    assert!(h.requests().is_empty());
    let spec =
        FaultSpec::parse(r#"{"type":"abort","after_tokens":2,"reset":true,"times":1}"#).unwrap();
    assert_eq!(
        serde_json::to_value(&spec).unwrap(),
        json!({"type":"abort","after_tokens":2,"reset":true,"times":1})
    );
    h.shutdown().await;
}

#[tokio::test]
async fn schemas_are_answered_with_an_instance_streamed_and_whole_on_both_wires() {
    let h = mock(3).await;
    let schema = json!({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 18}}});
    let want = json!({"name": text_of(3), "age": 18});
    let mut oa = oa_body(true);
    oa["response_format"] = json!({"type": "json_schema",
        "json_schema": {"name": "p", "schema": schema.clone()}});
    let mut an = an_body(true);
    an["output_config"] = json!({"format": {"type": "json_schema", "schema": schema}});
    let oa_text: String = data_lines(
        &post(&h, "/chat/completions", &oa)
            .await
            .text()
            .await
            .unwrap(),
    )
    .iter()
    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    .filter_map(|v| {
        v.pointer("/choices/0/delta/content")?
            .as_str()
            .map(str::to_owned)
    })
    .collect();
    assert_eq!(serde_json::from_str::<Value>(&oa_text).unwrap(), want);
    let an_text: String = data_lines(&post(&h, "/messages", &an).await.text().await.unwrap())
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v.pointer("/delta/text")?.as_str().map(str::to_owned))
        .collect();
    assert_eq!(serde_json::from_str::<Value>(&an_text).unwrap(), want);
    oa["stream"] = json!(false);
    an["stream"] = json!(false);
    let whole: Value = post(&h, "/chat/completions", &oa)
        .await
        .json()
        .await
        .unwrap();
    let content = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(content).unwrap(), want);
    let whole: Value = post(&h, "/messages", &an).await.json().await.unwrap();
    let content = whole["content"][0]["text"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(content).unwrap(), want);
    h.shutdown().await;
}

#[tokio::test]
async fn json_mode_answers_a_json_object_and_off_schema_changes_its_key() {
    let h = mock(3).await;
    let mut body = oa_body(true);
    body["response_format"] = json!({"type": "json_object"});
    let streamed = |text: String| -> String {
        data_lines(&text)
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|v| {
                v.pointer("/choices/0/delta/content")?
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    };
    let text = post(&h, "/chat/completions", &body)
        .await
        .text()
        .await
        .unwrap();
    let answer: Value = serde_json::from_str(&streamed(text)).unwrap();
    assert_eq!(answer, json!({"answer": text_of(3)}));
    body["stream"] = json!(false);
    let whole: Value = post(&h, "/chat/completions", &body)
        .await
        .json()
        .await
        .unwrap();
    let content = whole["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(serde_json::from_str::<Value>(content).unwrap(), answer);
    put_fault(&h, json!({"type": "off_schema"})).await;
    let off: Value = post(&h, "/chat/completions", &body)
        .await
        .json()
        .await
        .unwrap();
    let content = off["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(content).unwrap(),
        json!({"reply": text_of(3)})
    );
    // Without JSON mode the answer is the usual text.
    let plain: Value = post(&h, "/chat/completions", &oa_body(false))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(plain["choices"][0]["message"]["content"], text_of(3));
}

#[tokio::test]
async fn a_scripted_tool_call_names_its_tool_and_ends_after_the_result() {
    let h = mock(3).await;
    let r = client()
        .put(format!("http://{}/_mock/tools", h.addr()))
        .json(
            &json!({"name": "get_weather", "arguments": "{\"city\":\"Paris\"}",
                      "text_after_result": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let tool =
        |name: &str| json!({"type": "function", "function": {"name": name, "parameters": {}}});
    let mut body = json!({"model": "gpt-test", "stream": false,
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [tool("other"), tool("get_weather")]});
    let first: Value = post(&h, "/chat/completions", &body)
        .await
        .json()
        .await
        .unwrap();
    let call = &first["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], "{\"city\":\"Paris\"}");
    body["stream"] = json!(true);
    let streamed = post(&h, "/chat/completions", &body)
        .await
        .text()
        .await
        .unwrap();
    let args: String = data_lines(&streamed)
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| {
            v.pointer("/choices/0/delta/tool_calls/0/function/arguments")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect();
    assert_eq!(args, "{\"city\":\"Paris\"}");
    // The result comes back: the loop ends with text.
    body["stream"] = json!(false);
    body["messages"] = json!([{"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]);
    let last: Value = post(&h, "/chat/completions", &body)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(last["choices"][0]["message"]["content"], text_of(3));
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
}

// ---- Rate-limit windows -----------------------------------------------------

/// POSTs `body` to `path` (under `/v1`) with `key` in `header`.
async fn post_key(
    h: &MockHandle,
    path: &str,
    header: &str,
    key: &str,
    body: &Value,
) -> reqwest::Response {
    let value = if header == "authorization" {
        format!("Bearer {key}")
    } else {
        key.to_string()
    };
    client()
        .post(format!("http://{}{path}", h.addr()))
        .header(header, value)
        .json(body)
        .send()
        .await
        .expect("send")
}

async fn put_limits(h: &MockHandle, spec: Value) -> Value {
    let r = client()
        .put(format!("http://{}/_mock/limits", h.addr()))
        .json(&spec)
        .send()
        .await
        .expect("put");
    assert_eq!(r.status(), 200, "limits rejected: {spec}");
    r.json().await.expect("json")
}

async fn get_limits(h: &MockHandle) -> Value {
    client()
        .get(format!("http://{}/_mock/limits", h.addr()))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json")
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers()
        .get(name)
        .map(|v| v.to_str().expect("ascii").to_string())
}

fn header_u64(r: &reqwest::Response, name: &str) -> u64 {
    header(r, name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a number"))
}

/// Parses a duration as OpenAI writes it (Go's format): `120ms`, `1s`,
/// `59.874s`, `6m0s`, `1h2m3s`.
fn parse_openai_duration(s: &str) -> Duration {
    if let Some(ms) = s.strip_suffix("ms") {
        return Duration::from_millis(ms.parse().expect("ms"));
    }
    let (mut secs, mut num) = (0.0, String::new());
    for c in s.chars() {
        let unit = match c {
            'h' => 3600.0,
            'm' => 60.0,
            's' => 1.0,
            _ => {
                num.push(c);
                continue;
            }
        };
        secs += num.parse::<f64>().expect("number") * unit;
        num.clear();
    }
    assert!(num.is_empty() && s.ends_with('s'), "bad duration {s}");
    Duration::from_secs_f64(secs)
}

fn parse_rfc3339(s: &str) -> std::time::SystemTime {
    assert!(s.ends_with('Z'), "not UTC: {s}");
    humantime_serde::re::humantime::parse_rfc3339(s).expect("rfc 3339")
}

fn oa_capped(max_tokens: u32, stream: bool) -> Value {
    let mut b = oa_body(stream);
    b["max_tokens"] = json!(max_tokens);
    b
}

#[test]
fn openai_durations_are_written_as_openai_writes_them() {
    use crate::limits::openai_duration;
    let ms = Duration::from_millis;
    assert_eq!(openai_duration(ms(1000)), "1s");
    assert_eq!(openai_duration(ms(360_000)), "6m0s");
    assert_eq!(openai_duration(ms(59_874)), "59.874s");
    assert_eq!(openai_duration(ms(1_200)), "1.2s");
    assert_eq!(openai_duration(ms(120)), "120ms");
    assert_eq!(openai_duration(ms(3_723_000)), "1h2m3s");
    assert_eq!(openai_duration(Duration::ZERO), "0s");
    for d in [
        1, 999, 1000, 1001, 59_999, 60_000, 61_500, 3_600_000, 7_384_250,
    ] {
        assert_eq!(parse_openai_duration(&openai_duration(ms(d))), ms(d));
    }
    let t = std::time::UNIX_EPOCH + Duration::from_secs(1_796_229_000);
    assert_eq!(
        crate::limits::rfc3339_after(t, ms(1)),
        "2026-12-02T16:30:01Z"
    );
}

#[tokio::test]
async fn openai_window_counts_requests_and_tokens_and_refuses_with_headers() {
    let h = mock(4).await;
    let view = put_limits(
        &h,
        json!({"window_ms": 60000, "keys": {"sk-alpha-1": {"rpm": 5, "tpm": 1000}}}),
    )
    .await;
    assert_eq!(view["window_ms"], 60000);
    let key = "sk-alpha-1";
    let auth = "authorization";

    // An unlimited key sees no rate-limit headers.
    let r = post_key(
        &h,
        "/v1/chat/completions",
        auth,
        "sk-other",
        &oa_body(false),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r
        .headers()
        .keys()
        .all(|k| !k.as_str().starts_with("x-ratelimit")));

    // Each request is charged its prompt plus max_tokens.
    let r = post_key(
        &h,
        "/v1/chat/completions",
        auth,
        key,
        &oa_capped(300, false),
    )
    .await;
    assert_eq!(r.status(), 200);
    let heads = r.headers().clone();
    let usage: Value = r.json().await.unwrap();
    let input = usage["usage"]["prompt_tokens"].as_u64().unwrap();
    let charge = input + 300;
    let num = |n: &str| heads[n].to_str().unwrap().parse::<u64>().unwrap();
    assert_eq!(num("x-ratelimit-limit-requests"), 5);
    assert_eq!(num("x-ratelimit-limit-tokens"), 1000);
    assert_eq!(num("x-ratelimit-remaining-requests"), 4);
    assert_eq!(num("x-ratelimit-remaining-tokens"), 1000 - charge);
    for name in ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"] {
        let reset = parse_openai_duration(heads[name].to_str().unwrap());
        assert!(
            reset <= Duration::from_secs(60) && reset > Duration::ZERO,
            "{reset:?}"
        );
    }
    assert!(!heads.contains_key("retry-after"));

    // Streamed answers carry them too; a fault's refusal is still charged.
    let r = post_key(&h, "/v1/chat/completions", auth, key, &oa_capped(300, true)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header_u64(&r, "x-ratelimit-remaining-tokens"),
        1000 - 2 * charge
    );
    assert!(r.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    put_fault(&h, json!({"type": "status", "status": 503, "times": 1})).await;
    let r = post_key(
        &h,
        "/v1/chat/completions",
        auth,
        key,
        &oa_capped(300, false),
    )
    .await;
    assert_eq!(r.status(), 503);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-requests"), 2);
    assert_eq!(
        header_u64(&r, "x-ratelimit-remaining-tokens"),
        1000 - 3 * charge
    );

    // Past the token budget: refused, not charged.
    let r = post_key(&h, "/v1/chat/completions", auth, key, &oa_capped(300, true)).await;
    assert_eq!(r.status(), 429);
    let retry = header_u64(&r, "retry-after");
    assert!((1..=60).contains(&retry), "retry-after {retry}");
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-requests"), 2);
    assert_eq!(
        header_u64(&r, "x-ratelimit-remaining-tokens"),
        1000 - 3 * charge
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "tokens");
    assert_eq!(v["error"]["code"], "rate_limit_exceeded");
    assert!(v["error"]["param"].is_null());
    let msg = v["error"]["message"].as_str().unwrap();
    let want = format!(
        "Rate limit reached for gpt-test in organization org-mock on tokens per min (TPM): Limit 1000, Used {}, Requested {charge}. Please try again in ",
        3 * charge
    );
    assert!(msg.starts_with(&want), "{msg}");
    let wait = msg[want.len()..].strip_suffix('.').unwrap();
    assert!(parse_openai_duration(wait) <= Duration::from_secs(60));

    // A smaller request still fits; then the request budget runs out.
    let small = input + 10;
    assert!(3 * charge + small <= 1000);
    let r = post_key(&h, "/v1/chat/completions", auth, key, &oa_capped(10, false)).await;
    assert_eq!(r.status(), 200);
    let r = post_key(&h, "/v1/chat/completions", auth, key, &oa_capped(1, false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-requests"), 0);
    let r = post_key(&h, "/v1/chat/completions", auth, key, &oa_capped(1, false)).await;
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "requests");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("on requests per min (RPM): Limit 5, Used 5, Requested 1."));

    settle().await;
    let log: Vec<RequestRecord> = h.requests().into_iter().skip(1).collect();
    let rates: Vec<(u32, bool)> = log
        .iter()
        .map(|r| (r.rate_tokens, r.rate_limited))
        .collect();
    let c = charge as u32;
    let (s1, s2) = (small as u32, input as u32 + 1);
    assert_eq!(
        rates,
        [
            (c, false),
            (c, false),
            (c, false),
            (0, true),
            (s1, false),
            (s2, false),
            (0, true)
        ]
    );
    assert_eq!(h.requests()[0].rate_tokens, 0);
    let view = get_limits(&h).await;
    let k = &view["keys"]["sk-alp…"];
    assert_eq!(k["rpm"], 5);
    assert_eq!(k["tpm"], 1000);
    assert_eq!(k["used_requests"], 5);
    assert_eq!(k["used_tokens"], 3 * charge + small + input + 1);
    assert_eq!(k["peak_requests"], 5);
    assert_eq!(k["peak_tokens"], 3 * charge + small + input + 1);
    assert_eq!(k["limited"], 2);
    let left = k["window_remaining_ms"].as_u64().unwrap();
    assert!(left > 0 && left <= 60_000);
    assert!(!view.to_string().contains(key) && !view.to_string().contains("sk-other"));

    // A PUT resets the counters; `{}` clears the limits.
    let view = put_limits(&h, json!({"keys": {"sk-alpha-1": {"rpm": 5}}})).await;
    assert_eq!(view["window_ms"], 60000);
    assert_eq!(view["keys"]["sk-alp…"]["used_requests"], 0);
    assert_eq!(view["keys"]["sk-alp…"]["limited"], 0);
    assert!(view["keys"]["sk-alp…"]["tpm"].is_null());
    let r = post_key(&h, "/v1/chat/completions", auth, key, &oa_body(false)).await;
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-requests"), 4);
    assert!(header(&r, "x-ratelimit-limit-tokens").is_none());
    assert_eq!(put_limits(&h, json!({})).await["keys"], json!({}));
    let r = post_key(&h, "/v1/chat/completions", auth, key, &oa_body(false)).await;
    assert!(header(&r, "x-ratelimit-limit-requests").is_none());
    let bad = client()
        .put(format!("http://{}/_mock/limits", h.addr()))
        .json(&json!({"window_ms": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn anthropic_window_sends_its_headers_and_rfc3339_resets() {
    let h = mock(3).await;
    put_limits(&h, json!({"default": {"rpm": 2, "tpm": 100000}})).await;
    let key = "sk-ant-key";
    let before = std::time::SystemTime::now();
    let r = post_key(&h, "/v1/messages", "x-api-key", key, &an_body(true)).await;
    assert_eq!(r.status(), 200);
    let charged = 100000 - header_u64(&r, "anthropic-ratelimit-tokens-remaining");
    for name in ["requests", "tokens", "input-tokens", "output-tokens"] {
        let limit = header_u64(&r, &format!("anthropic-ratelimit-{name}-limit"));
        let remaining = header_u64(&r, &format!("anthropic-ratelimit-{name}-remaining"));
        let reset =
            parse_rfc3339(&header(&r, &format!("anthropic-ratelimit-{name}-reset")).unwrap());
        assert!(
            reset >= before + Duration::from_secs(59),
            "{name} reset too early"
        );
        assert!(reset <= std::time::SystemTime::now() + Duration::from_secs(61));
        if name == "requests" {
            assert_eq!((limit, remaining), (2, 1));
        } else {
            assert_eq!((limit, remaining), (100000, 100000 - charged));
        }
    }
    assert!(r
        .headers()
        .keys()
        .all(|k| !k.as_str().starts_with("x-ratelimit")));
    assert!(r.text().await.unwrap().contains("message_stop"));
    settle().await;
    let input = h.requests()[0].body["max_tokens"].as_u64().unwrap();
    assert!(
        charged > input,
        "the prompt is charged as well as max_tokens"
    );

    let r = post_key(&h, "/v1/messages", "x-api-key", key, &an_body(false)).await;
    assert_eq!(r.status(), 200);
    let r = post_key(&h, "/v1/messages", "x-api-key", key, &an_body(false)).await;
    assert_eq!(r.status(), 429);
    assert!(header_u64(&r, "retry-after") >= 1);
    assert_eq!(header_u64(&r, "anthropic-ratelimit-requests-remaining"), 0);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("of 2 requests per minute"));

    // Gemini: RESOURCE_EXHAUSTED with retry-after, no rate-limit headers.
    put_limits(&h, json!({"keys": {"gm-key": {"rpm": 0}}})).await;
    let body = json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]});
    let r = post_key(
        &h,
        "/v1beta/models/gemini-test:generateContent",
        "x-goog-api-key",
        "gm-key",
        &body,
    )
    .await;
    assert_eq!(r.status(), 429);
    assert!(header_u64(&r, "retry-after") >= 1);
    assert!(r
        .headers()
        .keys()
        .all(|k| !k.as_str().contains("ratelimit")));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["status"], "RESOURCE_EXHAUSTED");
    settle().await;
    let last = h.requests().pop().unwrap();
    assert!(last.rate_limited && last.rate_tokens == 0);
}

#[tokio::test]
async fn a_window_ends_after_window_ms_and_the_next_request_opens_one() {
    let h = mock(2).await;
    put_limits(&h, json!({"window_ms": 300, "default": {"rpm": 1}})).await;
    let key = "sk-short";
    let t1 = std::time::Instant::now();
    let r = post_key(
        &h,
        "/v1/chat/completions",
        "authorization",
        key,
        &oa_body(false),
    )
    .await;
    let r1_done = std::time::Instant::now();
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-requests"), 0);
    let reset = parse_openai_duration(&header(&r, "x-ratelimit-reset-requests").unwrap());
    assert!(reset <= Duration::from_millis(300));
    let r = post_key(
        &h,
        "/v1/chat/completions",
        "authorization",
        key,
        &oa_body(false),
    )
    .await;
    let r2_done = std::time::Instant::now();
    // Only a second request that surely arrived inside the window must be refused.
    if r2_done.duration_since(t1) < Duration::from_millis(300) {
        assert_eq!(r.status(), 429);
    }
    // Both windows (the first, and one the second may have opened) are over.
    tokio::time::sleep_until((r1_done.max(r2_done) + Duration::from_millis(320)).into()).await;
    let view = get_limits(&h).await;
    assert_eq!(view["keys"]["sk-sho…"]["used_requests"], 0);
    assert_eq!(view["keys"]["sk-sho…"]["window_remaining_ms"], 0);
    let r = post_key(
        &h,
        "/v1/chat/completions",
        "authorization",
        key,
        &oa_body(false),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-requests"), 0);
    let view = get_limits(&h).await;
    let k = &view["keys"]["sk-sho…"];
    assert!(k["used_requests"].as_u64().unwrap() <= 1);
    assert_eq!(k["peak_requests"], 1);
    assert!(k["window_remaining_ms"].as_u64().unwrap() <= 300);
}

#[tokio::test]
async fn peaks_keep_the_fullest_window_and_refusals_do_not_count() {
    let h = mock(2).await;
    // A pre-loaded window, then a lighter one: the peak stays.
    put_limits(
        &h,
        json!({"window_ms": 300, "keys": {"sk-peak": {"tpm": 100000,
               "used_requests": 4, "used_tokens": 900}}}),
    )
    .await;
    let put_done = std::time::Instant::now();
    let k = &get_limits(&h).await["keys"]["sk-pea…"];
    assert_eq!(
        (k["peak_requests"].as_u64(), k["peak_tokens"].as_u64()),
        (Some(4), Some(900))
    );
    tokio::time::sleep_until((put_done + Duration::from_millis(320)).into()).await;
    let r = post_key(
        &h,
        "/v1/chat/completions",
        "authorization",
        "sk-peak",
        &oa_capped(100, false),
    )
    .await;
    assert_eq!(r.status(), 200);
    // A new window: the pre-loaded 900 tokens are gone.
    let charged = 100000 - header_u64(&r, "x-ratelimit-remaining-tokens");
    assert!(charged > 100 && charged < 900, "{charged}");
    let k = &get_limits(&h).await["keys"]["sk-pea…"];
    assert!(k["used_requests"].as_u64().unwrap() <= 1);
    assert_eq!(
        (k["peak_requests"].as_u64(), k["peak_tokens"].as_u64()),
        (Some(4), Some(900))
    );

    // One long window: the peak follows it; a refused request adds nothing.
    put_limits(&h, json!({"keys": {"sk-peak": {"tpm": 2000}}})).await;
    let mut used = 0;
    for _ in 0..3 {
        let r = post_key(
            &h,
            "/v1/chat/completions",
            "authorization",
            "sk-peak",
            &oa_capped(100, false),
        )
        .await;
        assert_eq!(r.status(), 200);
        used = 2000 - header_u64(&r, "x-ratelimit-remaining-tokens");
    }
    let r = post_key(
        &h,
        "/v1/chat/completions",
        "authorization",
        "sk-peak",
        &oa_capped(5000, false),
    )
    .await;
    assert_eq!(r.status(), 429);
    let k = &get_limits(&h).await["keys"]["sk-pea…"];
    assert_eq!(k["used_requests"], 3);
    assert_eq!(k["peak_requests"], 3);
    assert_eq!(k["used_tokens"].as_u64(), Some(used));
    assert_eq!(k["peak_tokens"].as_u64(), Some(used));
    assert_eq!(k["limited"], 1);
}

#[tokio::test]
async fn preloaded_usage_starts_the_first_window_full() {
    let h = mock(2).await;
    client()
        .put(format!("http://{}/_mock/keys", h.addr()))
        .json(&json!({"labels": {"sk-pre-a": "primary"}}))
        .send()
        .await
        .unwrap();
    let view = put_limits(
        &h,
        json!({"keys": {"sk-pre-a": {"tpm": 1000, "used_tokens": 1000},
                        "sk-pre-b": {"rpm": 2, "used_requests": 2}}}),
    )
    .await;
    assert_eq!(view["keys"]["primary"]["used_tokens"], 1000);
    assert_eq!(view["keys"]["sk-pre…"]["used_requests"], 2);
    assert!(
        view["keys"]["primary"]["window_remaining_ms"]
            .as_u64()
            .unwrap()
            > 0
    );

    let r = post_key(
        &h,
        "/v1/chat/completions",
        "authorization",
        "sk-pre-a",
        &oa_body(false),
    )
    .await;
    assert_eq!(r.status(), 429);
    assert_eq!(header_u64(&r, "x-ratelimit-remaining-tokens"), 0);
    assert_eq!(header_u64(&r, "x-ratelimit-limit-tokens"), 1000);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("Limit 1000, Used 1000,"));

    let r = post_key(&h, "/v1/messages", "x-api-key", "sk-pre-b", &an_body(false)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header_u64(&r, "anthropic-ratelimit-requests-remaining"), 0);
    assert!(header(&r, "anthropic-ratelimit-tokens-limit").is_none());
    let view = get_limits(&h).await;
    assert_eq!(view["keys"]["primary"]["limited"], 1);
    assert_eq!(view["keys"]["sk-pre…"]["limited"], 1);
    settle().await;
    let log = h.requests();
    assert_eq!(log[0].key_label.as_deref(), Some("primary"));
    assert!(log.iter().all(|r| r.rate_limited && r.rate_tokens == 0));
}

// ---- Time to first token ----------------------------------------------------

#[test]
fn ttft_sampler_follows_its_weights_and_seed() {
    use crate::ttft::Ttft;
    let buckets = |p: [f64; 2]| {
        Some(vec![
            TtftBucket { p: p[0], ms: 20 },
            TtftBucket { p: p[1], ms: 4000 },
        ])
    };
    let draw = |t: &mut Ttft| -> Vec<u64> { (0..200).map(|_| t.sample().unwrap()).collect() };
    let mut t = Ttft::new(0);
    assert_eq!(t.sample(), None);
    t.set(buckets([0.95, 0.05]), Some(7)).unwrap();
    let a = draw(&mut t);
    let slow = a.iter().filter(|ms| **ms == 4000).count();
    assert!((2..=25).contains(&slow), "{slow} slow of 200");
    assert!(a.iter().all(|ms| *ms == 20 || *ms == 4000));
    // Reseeded on every set; weights are normalised.
    t.set(buckets([19.0, 1.0]), Some(7)).unwrap();
    assert_eq!(draw(&mut t), a);
    t.set(None, None).unwrap();
    assert_eq!(draw(&mut t), a);
    t.set(None, Some(8)).unwrap();
    assert_ne!(draw(&mut t), a);
    t.set(buckets([0.0, 1.0]), None).unwrap();
    assert!(draw(&mut t).iter().all(|ms| *ms == 4000));
    assert!(t.set(buckets([-1.0, 1.0]), None).is_err());
    assert!(t.set(buckets([0.0, 0.0]), None).is_err());
    t.set(Some(vec![]), None).unwrap();
    assert_eq!(t.sample(), None);
}

async fn put_config(h: &MockHandle, cfg: Value) -> reqwest::Response {
    client()
        .put(format!("http://{}/_mock/config", h.addr()))
        .json(&cfg)
        .send()
        .await
        .expect("put")
}

#[tokio::test]
async fn ttft_waits_before_the_first_token_and_is_logged() {
    let h = mock(3).await;
    let r = put_config(&h, json!({"ttft": [{"p": 1, "ms": 300}], "ttft_seed": 5})).await;
    assert_eq!(r.status(), 200);
    let cfg: Value = r.json().await.unwrap();
    assert_eq!(cfg["ttft"], json!([{"p": 1.0, "ms": 300}]));
    assert_eq!(cfg["ttft_seed"], 5);
    let bad = put_config(&h, json!({"ttft": [{"p": -1, "ms": 3}]})).await;
    assert_eq!(bad.status(), 400);

    for stream in [true, false] {
        let t0 = std::time::Instant::now();
        let r = post(&h, "/chat/completions", &oa_body(stream)).await;
        assert_eq!(r.status(), 200);
        let text = r.text().await.unwrap();
        assert!(t0.elapsed() >= Duration::from_millis(300));
        assert!(text.contains("tok2 "));
    }
    settle().await;
    for rec in h.requests() {
        assert_eq!(rec.ttft_ms, Some(300.0));
        let first = rec.first_token_ms.expect("first token");
        assert!(first - rec.arrived_ms >= 300.0, "{rec:?}");
        assert!(rec.completed && rec.hung_up_ms.is_none());
    }
    // `[]` clears: no wait, no ttft_ms, a first token all the same.
    put_config(&h, json!({"ttft": []})).await;
    h.clear_requests();
    post(&h, "/chat/completions", &oa_body(true))
        .await
        .text()
        .await
        .unwrap();
    settle().await;
    let rec = &h.requests()[0];
    assert_eq!(rec.ttft_ms, None);
    assert!(rec.first_token_ms.is_some());
}

#[tokio::test]
async fn a_hang_up_during_the_ttft_wait_is_noticed_at_once() {
    let h = mock(3).await;
    put_config(&h, json!({"ttft": [{"p": 1, "ms": 10000}]})).await;
    for stream in [true, false] {
        h.clear_requests();
        let sent = std::time::Instant::now();
        let r = post(&h, "/chat/completions", &oa_body(stream)).await;
        assert_eq!(r.status(), 200, "the head comes before the wait");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let dropped = std::time::Instant::now();
        drop(r);
        let rec = loop {
            let rec = h.requests().pop().unwrap();
            if rec.client_hung_up || sent.elapsed() > Duration::from_secs(5) {
                break rec;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(rec.client_hung_up && !rec.completed, "{rec:?}");
        assert_eq!(rec.ttft_ms, Some(10000.0));
        assert_eq!(rec.first_token_ms, None);
        assert_eq!(rec.tokens_sent, 0);
        let hung_up = rec.hung_up_ms.expect("hung_up_ms");
        assert_eq!(rec.finished_ms, Some(hung_up));
        // It arrived after `sent`: noticed within 100 ms of the drop.
        let bound = dropped.duration_since(sent).as_secs_f64() * 1000.0 + 100.0;
        assert!(
            hung_up - rec.arrived_ms <= bound,
            "{hung_up} - {} > {bound}",
            rec.arrived_ms
        );
        assert_eq!(h.stats().in_flight, 0);
    }
}
