//! The OpenAI-compatible HTTP front door against the real binary: SSE chunk
//! shape and `data: [DONE]`, the usage chunk, tool-call deltas, unary
//! `chat.completion`, OpenAI error JSON with the right HTTP status, failover
//! visible only in `x-switchyard-served-by`, bearer auth and the body limit.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

struct Front {
    a: Mock,
    b: Mock,
    sy: Switchyard,
    url: String,
    http: reqwest::Client,
}

/// Route `chat`: an OpenAI-shaped primary, an Anthropic-shaped secondary.
/// `head` goes under `[server]`, after `http_listen`.
async fn front(head: &str, env: &[(&str, &str)]) -> Front {
    front_with(head, "", &[], env).await
}

/// [`front`] with lines for the route and arguments for both mocks.
async fn front_with(
    head: &str,
    route_extra: &str,
    mock_args: &[&str],
    env: &[(&str, &str)],
) -> Front {
    let rig = Rig::start_with(head, route_extra, mock_args, env).await;
    let url = rig.http_url();
    let (a, b, sy) = (rig.primary, rig.secondary, rig.sy);
    Front {
        a,
        b,
        sy,
        url,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
    }
}

impl Front {
    async fn post(&self, body: Value) -> reqwest::Response {
        self.http
            .post(format!("{}/v1/chat/completions", self.url))
            .json(&body)
            .send()
            .await
            .unwrap()
    }
}

fn hello(stream: bool) -> Value {
    json!({
        "model": "chat",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 64,
        "stream": stream,
    })
}

fn expected_text() -> String {
    (0..16).map(|i| format!("tok{i} ")).collect()
}

/// The `data:` payloads of an SSE body, in order. The last frame of each
/// event carries the event's number (`id:`, rising from 1), the stream's
/// last frame included, so a dropped stream can resume.
fn frames(body: &str) -> Vec<String> {
    let mut last_id = 0;
    let mut last_has_id = false;
    let out = body
        .split("\n\n")
        .map(str::trim)
        .filter(|f| !f.is_empty())
        .map(|f| {
            let data = match f.strip_prefix("id: ").and_then(|f| f.split_once('\n')) {
                Some((id, data)) => {
                    let id: u64 = id.parse().unwrap();
                    assert!(id > last_id, "ids rise: {id} after {last_id}");
                    last_id = id;
                    last_has_id = true;
                    data
                }
                None => {
                    last_has_id = false;
                    f
                }
            };
            data.strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data frame: {f:?}"))
                .to_string()
        })
        .collect();
    // A stream cut by a drain ends with an error frame of no id of its own.
    let drained = body.contains("SERVER_DRAINING");
    assert!(last_has_id || drained, "the last frame has an id: {body}");
    out
}

fn header<'a>(r: &'a reqwest::Response, name: &str) -> &'a str {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
}

/// Every frame but `[DONE]` as JSON; asserts the stream ended with `[DONE]`.
fn chunks(body: &str) -> Vec<Value> {
    let f = frames(body);
    assert_eq!(f.last().map(String::as_str), Some("[DONE]"), "{body}");
    f[..f.len() - 1]
        .iter()
        .map(|x| serde_json::from_str(x).unwrap_or_else(|e| panic!("{e}: {x}")))
        .collect()
}

#[tokio::test]
async fn streaming_text_is_openai_chunks_ending_with_done() {
    let f = front("", &[]).await;
    let r = f.post(hello(true)).await;
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    assert_eq!(header(&r, "x-switchyard-served-by"), "primary/gpt-4o-mini");
    assert_eq!(header(&r, "x-switchyard-tier"), "primary");
    assert_eq!(header(&r, "x-switchyard-attempts"), "1");
    let body = r.text().await.unwrap();
    let c = chunks(&body);
    let id = c[0]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("chatcmpl-"));
    for x in &c {
        assert_eq!(x["object"], "chat.completion.chunk");
        assert_eq!(x["id"], id.as_str());
        assert_eq!(x["model"], "chat");
        assert!(x.get("usage").is_none(), "no usage without include_usage");
    }
    assert_eq!(c[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = c
        .iter()
        .filter_map(|x| x["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, expected_text());
    let last = c.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(c[..c.len() - 1]
        .iter()
        .all(|x| x["choices"][0]["finish_reason"].is_null()));
}

#[tokio::test]
async fn usage_chunk_only_with_include_usage() {
    let f = front("", &[]).await;
    let mut req = hello(true);
    req["stream_options"] = json!({"include_usage": true});
    let body = f.post(req).await.text().await.unwrap();
    let c = chunks(&body);
    let usage = c.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    let u = &usage["usage"];
    assert_eq!(u["completion_tokens"], 16);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + 16
    );
    assert_eq!(c[c.len() - 2]["choices"][0]["finish_reason"], "stop");
    assert!(c[..c.len() - 1].iter().all(|x| x["usage"].is_null()));
    assert_eq!(
        c.iter().filter(|x| x["choices"] == json!([])).count(),
        1,
        "exactly one usage chunk"
    );

    let body = f.post(hello(true)).await.text().await.unwrap();
    assert!(chunks(&body).iter().all(|x| x["choices"] != json!([])));
}

#[tokio::test]
async fn non_streaming_is_one_chat_completion() {
    let f = front("", &[]).await;
    let r = f
        .http
        .post(format!("{}/v1/chat/completions", f.url))
        .header("x-request-id", "my-req-42")
        .json(&hello(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-request-id"), "my-req-42");
    assert_eq!(header(&r, "x-switchyard-served-by"), "primary/gpt-4o-mini");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["id"], "chatcmpl-my-req-42");
    assert_eq!(v["model"], "chat");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], expected_text());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 16);

    let mut req = hello(false);
    req["max_tokens"] = json!(3);
    let v: Value = f.post(req).await.json().await.unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["message"]["content"], "tok0 tok1 tok2 ");
}

fn tool_request(stream: bool) -> Value {
    json!({
        "model": "chat",
        "stream": stream,
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": "Weather in Paris?"},
        ],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Current weather",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}],
    })
}

#[tokio::test]
async fn tool_calls_stream_as_openai_deltas() {
    let f = front("", &[]).await;
    let body = f.post(tool_request(true)).await.text().await.unwrap();
    let c = chunks(&body);
    let calls: Vec<&Value> = c
        .iter()
        .filter_map(|x| x["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .collect();
    assert!(calls.len() > 1, "{body}");
    let first = calls[0];
    assert_eq!(first["index"], 0);
    assert!(first["id"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(first["type"], "function");
    assert_eq!(first["function"]["name"], "get_weather");
    for later in &calls[1..] {
        assert_eq!(later["index"], 0);
        assert!(later.get("id").is_none() && later["function"].get("name").is_none());
    }
    let args: String = calls
        .iter()
        .map(|c| c["function"]["arguments"].as_str().unwrap())
        .collect();
    let parsed: Value = serde_json::from_str(&args).unwrap();
    assert!(parsed["query"].is_string());
    assert_eq!(
        c.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    let log = f.a.requests().await;
    assert_eq!(log[0]["has_tools"], true, "{log:?}");

    // Unary: the assembled call, content null.
    let v: Value = f.post(tool_request(false)).await.json().await.unwrap();
    let m = &v["choices"][0]["message"];
    assert!(m["content"].is_null());
    assert_eq!(m["tool_calls"][0]["type"], "function");
    assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
}

/// The door answers `POST /v1/chat/completions` before its path router;
/// another method on that path is still the router's (405), a query string
/// leaves the path what it is, and the answer is JSON written once.
#[tokio::test]
async fn completions_go_straight_to_their_handler_and_other_methods_do_not() {
    let f = front("", &[]).await;
    let r = f
        .http
        .get(format!("{}/v1/chat/completions", f.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let r = f
        .http
        .post(format!("{}/v1/chat/completions?trace=1", f.url))
        .json(&hello(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "application/json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], expected_text());
    assert_eq!(f.a.requests().await.len(), 1, "the GET reached no upstream");
}

#[tokio::test]
async fn unknown_model_is_404_openai_error_and_no_upstream_call() {
    let f = front("", &[]).await;
    let mut req = hello(true);
    req["model"] = json!("no-such-route");
    let r = f.post(req).await;
    assert_eq!(r.status(), 404);
    assert!(header(&r, "content-type").starts_with("application/json"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "UNKNOWN_ROUTE");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["param"], "model");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no-such-route"));
    assert!(f.a.requests().await.is_empty() && f.b.requests().await.is_empty());

    let r = f
        .http
        .get(format!("{}/v1/nothing", f.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].is_string());
}

#[tokio::test]
async fn bad_input_is_400_naming_the_field() {
    let f = front("\n[limits]\nmax_request_bytes = 4096\n", &[]).await;
    let mut req = hello(false);
    req["temperature"] = json!(3.5);
    let r = f.post(req).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], "INVALID_REQUEST");
    assert_eq!(v["error"]["param"], "temperature");

    let mut req = hello(false);
    req["messages"] = json!([{"role": "robot", "content": "x"}]);
    let v: Value = f.post(req).await.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages[0].role");

    let r = f
        .http
        .post(format!("{}/v1/chat/completions", f.url))
        .header("content-type", "application/json")
        .body("{\"model\": \"chat\", \"messages\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "INVALID_REQUEST");

    let mut req = hello(false);
    req["messages"][0]["content"] = json!("x".repeat(8192));
    let r = f.post(req).await;
    assert_eq!(r.status(), 413);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "REQUEST_TOO_LARGE");
    assert!(f.a.requests().await.is_empty());
}

#[tokio::test]
async fn failover_is_visible_only_in_served_by() {
    let f = front("", &[]).await;
    f.a.set_fault(json!({"type": "status", "status": 503}))
        .await;
    for stream in [true, false] {
        let r = f.post(hello(stream)).await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            header(&r, "x-switchyard-served-by"),
            "secondary/claude-sonnet-4-5"
        );
        assert_eq!(header(&r, "x-switchyard-tier"), "fallback");
        let text = if stream {
            let body = r.text().await.unwrap();
            let c = chunks(&body);
            assert!(c.iter().all(|x| x["model"] == "chat"));
            c.iter()
                .filter_map(|x| x["choices"][0]["delta"]["content"].as_str())
                .collect::<String>()
        } else {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["model"], "chat");
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(text, expected_text());
    }
    assert!(!f.a.requests().await.is_empty());
}

#[tokio::test]
async fn exhausted_rate_limit_is_429_with_retry_after() {
    let f = front("", &[]).await;
    let fault = json!({"type": "status", "preset": "rate_limit", "headers": {"retry-after": "3"}});
    f.a.set_fault(fault.clone()).await;
    f.b.set_fault(fault).await;
    let r = f.post(hello(true)).await;
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after"), "3");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "UPSTREAM_RATE_LIMITED");
    assert_eq!(v["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn a_cut_stream_ends_with_an_error_frame_not_done() {
    let f = front("", &[]).await;
    f.a.set_fault(json!({"type": "abort", "after_tokens": 3}))
        .await;
    let r = f.post(hello(true)).await;
    assert_eq!(r.status(), 200, "headers were out with the first token");
    let body = r.text().await.unwrap();
    let fr = frames(&body);
    assert!(!fr.iter().any(|x| x == "[DONE]"), "{body}");
    let last: Value = serde_json::from_str(fr.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "UPSTREAM_STREAM_TRUNCATED", "{body}");
    assert_eq!(last["error"]["type"], "server_error");
}

#[tokio::test]
async fn bearer_auth_is_the_grpc_auth() {
    let f = front(
        "\n[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n",
        &[("SY_TEST_TOKENS", "team-a:aaaaaaaaaaaaaaaaaaaaaaaa")],
    )
    .await;
    let r = f.post(hello(false)).await;
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error");
    let r = f
        .http
        .get(format!("{}/v1/models", f.url))
        .bearer_auth("wrong-wrong-wrong-wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert!(f.a.requests().await.is_empty());

    let r = f
        .http
        .post(format!("{}/v1/chat/completions", f.url))
        .bearer_auth("aaaaaaaaaaaaaaaaaaaaaaaa")
        .json(&hello(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = f
        .http
        .get(format!("{}/v1/models", f.url))
        .bearer_auth("aaaaaaaaaaaaaaaaaaaaaaaa")
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "chat");
    assert_eq!(v["data"][0]["object"], "model");
    // Then each target, pinned by `provider/model`, then as `route@target`.
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "chat",
            "primary/gpt-4o-mini",
            "secondary/claude-sonnet-4-5",
            "chat@primary/gpt-4o-mini",
            "chat@secondary/claude-sonnet-4-5"
        ]
    );
}

#[tokio::test]
async fn a_reset_route_ends_the_http_stream_with_an_error_and_sends_no_second_attempt() {
    // OpenAI clients cannot discard output: `mid_stream = "reset"` ends the
    // stream with an error frame, like `fail`, and the request task stops
    // there (the ladder knows the caller cannot take a `Reset`): no attempt
    // is sent whose output nobody could read.
    let f = front_with("", "mid_stream = \"reset\"", &[], &[]).await;
    f.a.set_fault(json!({"type": "abort", "after_tokens": 3}))
        .await;
    let body = f.post(hello(true)).await.text().await.unwrap();
    let fr = frames(&body);
    assert!(!fr.iter().any(|x| x == "[DONE]"), "{body}");
    let text: String = fr[..fr.len() - 1]
        .iter()
        .map(|x| serde_json::from_str::<Value>(x).unwrap())
        .filter_map(|x| {
            x["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 ", "only the first attempt's output");
    let last: Value = serde_json::from_str(fr.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "UPSTREAM_STREAM_TRUNCATED", "{body}");
    let message = last["error"]["message"].as_str().unwrap();
    assert!(message.contains("primary"), "{message}");
    assert!(message.contains("must be discarded"), "{message}");
    assert_eq!(f.a.requests().await.len(), 1);
    assert_eq!(
        f.b.requests().await.len(),
        0,
        "the secondary was never asked for an answer nobody could read"
    );

    // A unary caller never saw the partial output: it gets the secondary's answer.
    let r = f.post(hello(false)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "x-switchyard-served-by"),
        "secondary/claude-sonnet-4-5"
    );
    assert_eq!(f.b.requests().await.len(), 1);
}

#[tokio::test]
async fn sigterm_drains_http_streams_then_ends_the_rest_with_an_error_frame() {
    let mut f = front_with(
        "drain_timeout = \"1500ms\"",
        "",
        &["--tokens", "400", "--token-delay-ms", "25"],
        &[],
    )
    .await;
    let mut calls = Vec::new();
    for max_tokens in [20, 400] {
        let mut req = hello(true);
        req["max_tokens"] = json!(max_tokens);
        let r = f.post(req).await;
        assert_eq!(r.status(), 200);
        calls.push(tokio::spawn(async move { r.text().await.unwrap() }));
    }
    f.a.wait_for("two streams in flight", |l| l.len() == 2)
        .await;
    let pid = f.sy.child.id().unwrap();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let mut bodies = Vec::new();
    for c in calls {
        bodies.push(
            tokio::time::timeout(Duration::from_secs(15), c)
                .await
                .expect("nothing hangs")
                .unwrap(),
        );
    }
    assert!(
        frames(&bodies[0]).last().is_some_and(|x| x == "[DONE]"),
        "the short stream finished inside the drain window: {}",
        bodies[0]
    );
    let last: Value = serde_json::from_str(frames(&bodies[1]).last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "SERVER_DRAINING", "{}", bodies[1]);
    let status = tokio::time::timeout(Duration::from_secs(10), f.sy.child.wait())
        .await
        .expect("exits after draining")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn idempotency_key_header_replays_instead_of_calling_again() {
    let f = front("", &[]).await;
    let send = || {
        f.http
            .post(format!("{}/v1/chat/completions", f.url))
            .header("idempotency-key", "order-7")
            .json(&hello(false))
            .send()
    };
    let first: Value = send().await.unwrap().json().await.unwrap();
    // The record completes just after the first answer went out; until then
    // the key is in use (409, which the OpenAI SDKs retry).
    let mut second = Value::Null;
    for _ in 0..100 {
        let r = send().await.unwrap();
        let status = r.status();
        second = r.json().await.unwrap();
        if status != 409 {
            assert_eq!(status, 200, "{second}");
            break;
        }
        assert_eq!(second["error"]["code"], "IDEMPOTENCY_KEY_IN_USE");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        first["choices"][0]["message"]["content"], second["choices"][0]["message"]["content"],
        "{second}"
    );
    assert_eq!(
        f.a.requests().await.len(),
        1,
        "the second call was a replay"
    );
}

#[tokio::test]
async fn a_client_that_hangs_up_cancels_the_upstream_call() {
    let f = front_with("", "", &["--tokens", "400", "--token-delay-ms", "25"], &[]).await;
    let mut req = hello(true);
    req["max_tokens"] = json!(400);
    let mut r = f.post(req).await;
    assert!(r.chunk().await.unwrap().is_some());
    drop(r);
    let log =
        f.a.wait_for("the upstream call hung up", |l| {
            l.len() == 1 && l[0]["client_hung_up"] == true
        })
        .await;
    assert!(log[0]["tokens_sent"].as_u64().unwrap() < 400);
}

#[tokio::test]
async fn a_provider_model_name_pins_one_target_of_a_route() {
    let f = front("", &[]).await;
    let r = f
        .post(json!({"model": "secondary/claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["x-switchyard-served-by"],
        "secondary/claude-sonnet-4-5"
    );
    assert!(f.a.requests().await.is_empty(), "the pinned target only");
    // Pinned to a failing target: no failover to the rest of the route.
    f.b.set_fault(json!({"type": "status", "status": 500}))
        .await;
    let r = f
        .post(json!({"model": "secondary/claude-sonnet-4-5", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status(), 503);
    assert!(f.a.requests().await.is_empty());
    let r = f
        .post(json!({"model": "nobody/nothing", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status(), 404);
}
