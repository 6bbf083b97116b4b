//! End-to-end tests of the walking skeleton: the real binary, real mock
//! upstreams on loopback, real gRPC. Each asserts on what the client received
//! and on the upstream's own request log.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard::proto::{self, FinishReason, Tier};
use tonic::Code;

/// The shared rig: route `chat` = OpenAI-shaped `primary`, Anthropic-shaped `secondary`.
async fn two_providers() -> (Mock, Mock, Switchyard) {
    let rig = Rig::start("", "", &[]).await;
    (rig.primary, rig.secondary, rig.sy)
}

#[tokio::test]
async fn streams_from_an_openai_upstream() {
    let (a, b, sy) = two_providers().await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    assert!(got.status.is_none(), "{:?}", got.status);
    assert_eq!(got.started.len(), 1);
    let s = &got.started[0];
    assert_eq!(
        (s.provider.as_str(), s.model.as_str(), s.attempt),
        ("primary", "gpt-4o-mini", 1)
    );
    assert_eq!(s.tier, Tier::Primary as i32);
    let f = got.finished.expect("finished");
    assert_eq!(f.finish_reason, FinishReason::Stop as i32);
    assert_eq!(f.served_by.as_ref().unwrap().provider, "primary");
    assert_eq!(f.attempts, 1);
    let usage = f.usage.unwrap();
    assert!(!usage.estimated, "the mock sends a usage chunk");
    assert!(usage.output_tokens > 0);

    let log = a.requests().await;
    assert_eq!(log.len(), 1, "exactly one upstream attempt");
    assert_eq!(log[0]["model"], "gpt-4o-mini");
    assert_eq!(log[0]["stream"], true);
    assert_eq!(log[0]["body"]["stream_options"]["include_usage"], true);
    assert_eq!(got.deltas as u64, log[0]["tokens_sent"].as_u64().unwrap());
    assert!(!got.text.is_empty());
    assert!(
        b.requests().await.is_empty(),
        "the secondary was never called"
    );
}

#[tokio::test]
async fn streams_from_an_anthropic_upstream() {
    let b = Mock::start("anthropic", &[]).await;
    let config = format!(
        "{}{}",
        provider("claude", "anthropic", &b.base_url(), "claude-sonnet-4-5"),
        route("chat", &["claude/claude-sonnet-4-5"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    assert!(got.status.is_none(), "{:?}", got.status);
    let f = got.finished.expect("finished");
    assert_eq!(f.finish_reason, FinishReason::Stop as i32);
    assert!(f.usage.unwrap().input_tokens > 0);
    let log = b.requests().await;
    assert_eq!(log.len(), 1);
    assert_eq!(log[0]["path"], "/v1/messages");
    assert_eq!(log[0]["body"]["max_tokens"], 64);
    assert_eq!(got.deltas as u64, log[0]["tokens_sent"].as_u64().unwrap());
}

#[tokio::test]
async fn a_failure_before_the_first_token_is_served_by_the_next_target() {
    let (a, b, sy) = two_providers().await;
    a.set_fault(json!({"type": "status", "status": 500})).await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    assert!(got.status.is_none(), "{:?}", got.status);
    assert_eq!(
        got.started.len(),
        1,
        "the failed attempt is invisible to the client"
    );
    assert_eq!(got.started[0].provider, "secondary");
    assert_eq!(got.started[0].attempt, 2);
    assert_eq!(got.started[0].tier, Tier::Fallback as i32);
    let f = got.finished.unwrap();
    assert_eq!(f.attempts, 2);
    assert_eq!(f.tier, Tier::Fallback as i32);
    assert_eq!(a.requests().await.len(), 1);
    assert_eq!(b.requests().await.len(), 1);
}

#[tokio::test]
async fn an_anthropic_overload_event_before_any_text_fails_over() {
    let (a, b, sy) = two_providers().await;
    // Fault the secondary and make it primary by routing the other way.
    drop(sy);
    let config = format!(
        "{}{}{}",
        provider("claude", "anthropic", &b.base_url(), "claude-sonnet-4-5"),
        provider("gpt", "openai", &a.base_url(), "gpt-4o-mini"),
        route("chat", &["claude/claude-sonnet-4-5", "gpt/gpt-4o-mini"])
    );
    let sy = Switchyard::start(&config).await;
    b.set_fault(
        json!({"type": "error_event", "after_tokens": 0, "error_type": "overloaded_error"}),
    )
    .await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    assert!(got.status.is_none(), "{:?}", got.status);
    assert_eq!(got.finished.unwrap().served_by.unwrap().provider, "gpt");
    assert_eq!(b.requests().await.len(), 1);
    assert_eq!(a.requests().await.len(), 1);
}

#[tokio::test]
async fn a_truncated_stream_is_an_error_never_a_success() {
    let a = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("only", "openai", &a.base_url(), "gpt-4o-mini"),
        route("chat", &["only/gpt-4o-mini"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    for reset in [false, true] {
        a.set_fault(json!({"type": "abort", "after_tokens": 3, "reset": reset}))
            .await;
        let got = stream(&mut client, request("chat")).await;
        assert!(got.finished.is_none(), "a cut stream must never finish OK");
        let status = got.status.expect("an error status");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(reason(&status), "UPSTREAM_STREAM_TRUNCATED");
        assert_eq!(got.deltas, 3);
        assert_eq!(error_meta(&status, "tokens_emitted").as_deref(), Some("3"));
    }
    // A stream that looks complete but lacks [DONE] is truncated too.
    a.set_fault(json!({"type": "no_terminator"})).await;
    let got = stream(&mut client, request("chat")).await;
    assert!(got.finished.is_none());
    assert_eq!(reason(&got.status.unwrap()), "UPSTREAM_STREAM_TRUNCATED");
    assert_eq!(
        a.requests().await.len(),
        3,
        "no retry after output was sent"
    );
}

#[tokio::test]
async fn a_client_hang_up_closes_the_upstream_request() {
    let a = Mock::start("openai", &["--tokens", "200", "--token-delay-ms", "50"]).await;
    let config = format!(
        "{}{}",
        provider("only", "openai", &a.base_url(), "gpt-4o-mini"),
        route("chat", &["only/gpt-4o-mini"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let mut req = request("chat");
    req.max_tokens = 1000;
    let mut s = client.stream_completion(req).await.unwrap().into_inner();
    let mut seen = 0;
    while seen < 3 {
        if let Some(proto::completion_event::Event::Delta(_)) =
            s.message().await.unwrap().unwrap().event
        {
            seen += 1;
        }
    }
    drop(s);
    drop(client);
    let log = a
        .wait_for("the upstream saw the client hang up", |l| {
            l.len() == 1 && l[0]["client_hung_up"] == true
        })
        .await;
    assert!(log[0]["tokens_sent"].as_u64().unwrap() < 200);
}

#[tokio::test]
async fn unary_complete_assembles_the_answer_and_fails_over() {
    let (a, b, sy) = two_providers().await;
    let mut client = sy.client().await;
    let r = client.complete(request("chat")).await.unwrap().into_inner();
    assert!(!r.text.is_empty());
    assert_eq!(r.finish_reason, FinishReason::Stop as i32);
    assert_eq!(r.tier, Tier::Primary as i32);
    // A mid-stream cut is invisible to a unary caller: the answer comes from the next target.
    a.set_fault(json!({"type": "abort", "after_tokens": 2, "reset": false}))
        .await;
    let r = client.complete(request("chat")).await.unwrap().into_inner();
    assert_eq!(r.served_by.unwrap().provider, "secondary");
    assert_eq!(r.attempts, 2);
    assert!(!r.text.is_empty());
    assert_eq!(b.requests().await.len(), 1);
}

#[tokio::test]
async fn tool_calls_stream_as_deltas() {
    let (_a, _b, sy) = two_providers().await;
    let mut client = sy.client().await;
    let mut req = request("chat");
    req.tools.push(proto::Tool {
        name: "get_weather".into(),
        description: "Weather for a city".into(),
        parameters_json: r#"{"type":"object","properties":{"city":{"type":"string"}}}"#.into(),
        ..Default::default()
    });
    let got = stream(&mut client, req.clone()).await;
    assert!(got.status.is_none(), "{:?}", got.status);
    assert_eq!(
        got.finished.unwrap().finish_reason,
        FinishReason::ToolCalls as i32
    );
    assert_eq!(got.tool_calls[0].name, "get_weather");
    let args: String = got
        .tool_calls
        .iter()
        .map(|t| t.arguments.as_str())
        .collect();
    serde_json::from_str::<serde_json::Value>(&args).expect("arguments are JSON");
    let r = client.complete(req).await.unwrap().into_inner();
    assert_eq!(r.tool_calls.len(), 1);
    assert_eq!(r.tool_calls[0].name, "get_weather");
}

#[tokio::test]
async fn bad_input_gets_a_precise_error_and_the_server_keeps_serving() {
    let (_a, _b, sy) = two_providers().await;
    let mut client = sy.client().await;
    let got = stream(
        &mut client,
        proto::CompletionRequest {
            messages: vec![],
            ..request("chat")
        },
    )
    .await;
    let s = got.status.unwrap();
    assert_eq!(s.code(), Code::InvalidArgument);
    assert!(s.message().contains("messages"), "{}", s.message());

    let s = stream(&mut client, request("nope")).await.status.unwrap();
    assert_eq!(s.code(), Code::NotFound);
    assert_eq!(reason(&s), "UNKNOWN_ROUTE");

    let mut req = request("chat");
    req.requirements = Some(proto::Requirements {
        vision: true,
        ..Default::default()
    });
    let s = stream(&mut client, req).await.status.unwrap();
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert!(s.message().contains("vision"), "{}", s.message());

    let got = stream(&mut client, request("chat")).await;
    assert!(got.finished.is_some(), "still serving");
}

#[tokio::test]
async fn an_upstream_401_body_is_never_forwarded() {
    let a = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("only", "openai", &a.base_url(), "gpt-4o-mini"),
        route("chat", &["only/gpt-4o-mini"])
    );
    let sy = Switchyard::start(&config).await;
    a.set_fault(json!({"type": "status", "preset": "auth"}))
        .await;
    let mut client = sy.client().await;
    let s = stream(&mut client, request("chat")).await.status.unwrap();
    assert_eq!(
        s.code(),
        Code::Unavailable,
        "router-owned key failures are not the caller's UNAUTHENTICATED"
    );
    assert_eq!(reason(&s), "PROVIDER_AUTH_FAILED");
    let body = format!("{s:?}");
    assert!(
        !body.contains("sk-secret-upstream-401-body"),
        "upstream 401 body leaked: {body}"
    );
}

#[tokio::test]
async fn the_callers_deadline_is_deadline_exceeded_and_cancels_upstream() {
    let a = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("only", "openai", &a.base_url(), "gpt-4o-mini"),
        route("chat", &["only/gpt-4o-mini"])
    );
    let sy = Switchyard::start(&config).await;
    a.set_fault(json!({"type": "hang"})).await;
    let mut client = sy.client().await;
    // The deadline travels as `grpc-timeout`, as every gRPC client sends it.
    // (tonic's own client-side timer would report CANCELLED locally, so the
    // header is set directly: the assertion is on what the server answers.)
    let mut req = tonic::Request::new(request("chat"));
    req.metadata_mut()
        .insert("grpc-timeout", "300m".parse().unwrap());
    let started = std::time::Instant::now();
    let got = stream(&mut client, req).await;
    assert_eq!(got.status.unwrap().code(), Code::DeadlineExceeded);
    assert!(
        started.elapsed() >= Duration::from_millis(280),
        "answered at the deadline, not before"
    );
    a.wait_for("the upstream request was dropped", |l| {
        l.len() == 1 && l[0]["client_hung_up"] == true
    })
    .await;
}

#[tokio::test]
async fn health_and_reflection_are_served() {
    let (_a, _b, sy) = two_providers().await;
    let channel = sy.channel().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel.clone());
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "switchyard.v1.Router".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        r.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );

    use tonic_reflection::pb::v1::{
        server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
        ServerReflectionRequest,
    };
    let mut refl = ServerReflectionClient::new(channel);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut s = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = s.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!()
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"switchyard.v1.Router"), "{names:?}");

    let (code, body) = sy.admin_get("/readyz").await;
    assert_eq!((code, body.trim()), (200, "ready"));
    let (code, _) = sy.admin_get("/healthz").await;
    assert_eq!(code, 200);
}

#[tokio::test]
async fn serve_without_keys_uses_built_in_mocks_and_says_so() {
    let sy = Switchyard::start_default(&[]).await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    assert!(got.status.is_none(), "{:?}", got.status);
    assert!(got.finished.is_some());
    let logs = sy.logs();
    assert!(logs.contains("BUILT-IN MOCK"), "{logs}");
}

#[test]
fn check_config_names_the_bad_field() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        format!(
            "{}{}",
            provider("p", "opneai", "http://127.0.0.1:1/v1", "m"),
            route("chat", &["p/m"])
        ),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .arg("check-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("providers[0].kind"), "{err}");
    assert!(err.contains("opneai"), "{err}");

    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        format!(
            "{}{}",
            provider("p", "openai", "http://127.0.0.1:1/v1", "m"),
            route("chat", &["p/m"])
        ),
    )
    .unwrap();
    let out = std::process::Command::new(BIN)
        .arg("check-config")
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `stream_unary = false`: a caller that takes one answer (unary gRPC, the
/// OpenAI door's `stream: false`) is served by one non-streamed upstream
/// call; a streaming caller is still streamed; a body cut mid-way fails
/// over before the caller sees anything; the other provider, on the
/// default, streams even for unary callers.
#[tokio::test]
async fn stream_unary_false_calls_the_upstream_whole_for_callers_taking_one_answer() {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("openai", &[]).await;
    let whole = provider("whole", "openai", &a.base_url(), "gpt-4o-mini").replacen(
        "idle_timeout = \"5s\"\n",
        "idle_timeout = \"5s\"\nstream_unary = false\n",
        1,
    );
    assert!(whole.contains("stream_unary = false"));
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{whole}{}{}",
        provider("streamed", "openai", &b.base_url(), "gpt-4o-mini"),
        route("chat", &["whole/gpt-4o-mini", "streamed/gpt-4o-mini"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let expected: String = (0..16).map(|i| format!("tok{i} ")).collect();

    let unary = client.complete(request("chat")).await.unwrap().into_inner();
    assert_eq!(unary.text, expected);
    assert_eq!(unary.finish_reason, FinishReason::Stop as i32);
    let usage = unary.usage.unwrap();
    assert!(!usage.estimated && usage.output_tokens == 16, "{usage:?}");
    let got = stream(&mut client, request("chat")).await;
    assert_eq!(got.text, expected);
    let http: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", sy.http_url()))
        .json(&json!({"model": "chat", "stream": false, "max_tokens": 64,
            "messages": [{"role": "user", "content": "Say hello."}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(http["choices"][0]["message"]["content"], expected.as_str());

    let log = a.requests().await;
    let streamed: Vec<bool> = log.iter().map(|r| r["stream"] == true).collect();
    assert_eq!(streamed, [false, true, false], "{log:?}");
    assert!(log[0]["body"].get("stream_options").is_none(), "{}", log[0]);
    assert!(b.requests().await.is_empty());

    // Cut after 3 tokens: the unary caller never sees the part, and the
    // next target (stream_unary on by default) is streamed.
    a.set_fault(json!({"type": "abort", "after_tokens": 3}))
        .await;
    let unary = client.complete(request("chat")).await.unwrap().into_inner();
    assert_eq!(unary.text, expected);
    assert_eq!(unary.served_by.unwrap().provider, "streamed");
    assert_eq!(unary.attempts, 2);
    let log = a.requests().await;
    assert_eq!((log.len(), log[3]["stream"].clone()), (4, json!(false)));
    let log = b.requests().await;
    assert_eq!((log.len(), log[0]["stream"].clone()), (1, json!(true)));
}
