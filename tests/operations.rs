//! Seeing and operating it: Prometheus metrics after scripted traffic, the
//! admin API (force a breaker open, traffic moves; clear, it returns),
//! `/v1/status`, hot reload (valid, invalid, providers added and removed under
//! load, SIGHUP and file change), and redaction of keys and prompts.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard::proto::{self, admin_client::AdminClient, BreakerAction};
use tonic::Code;

fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        "Bearer admin-token-0123456789".parse().unwrap(),
    );
    r
}

fn two(a: &Mock, b: &Mock) -> String {
    format!(
        "{}{}{}",
        provider("primary", "openai", &a.base_url(), "gpt"),
        provider("secondary", "anthropic", &b.base_url(), "claude"),
        route("chat", &["primary/gpt", "secondary/claude"])
    )
}

/// The value of one Prometheus series (exact label match, any order).
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        if n != name {
            return None;
        }
        let all = labels
            .iter()
            .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        all.then(|| value.parse().ok()).flatten()
    })
}

#[tokio::test]
async fn metrics_count_attempts_transitions_and_failover() {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let config = format!(
        "{}{}{}",
        provider("primary", "openai", &a.base_url(), "gpt").replace(
            "idle_timeout = \"5s\"",
            "idle_timeout = \"5s\"\nbreaker = { consecutive_failures = 2, open_for = \"60s\" }"
        ),
        provider("secondary", "anthropic", &b.base_url(), "claude"),
        route("chat", &["primary/gpt", "secondary/claude"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    for _ in 0..2 {
        assert!(stream(&mut client, request("chat"))
            .await
            .finished
            .is_some());
    }
    a.set_fault(json!({"type": "status", "status": 503})).await;
    for _ in 0..5 {
        let got = stream(&mut client, request("chat")).await;
        assert_eq!(
            got.finished.unwrap().served_by.unwrap().provider,
            "secondary"
        );
    }
    assert_eq!(
        a.requests().await.len(),
        2 + 2,
        "two 503s tripped the breaker; then no more attempts"
    );

    let (code, text) = sy.admin_get("/metrics").await;
    assert_eq!(code, 200);
    let ok = metric(
        &text,
        "switchyard_upstream_attempts_total",
        &[("provider", "primary"), ("outcome", "ok")],
    );
    assert_eq!(ok, Some(2.0), "{text}");
    let overloaded = metric(
        &text,
        "switchyard_upstream_attempts_total",
        &[("provider", "primary"), ("outcome", "overloaded")],
    );
    assert_eq!(overloaded, Some(2.0));
    assert_eq!(
        metric(
            &text,
            "switchyard_upstream_attempts_total",
            &[("provider", "secondary"), ("outcome", "ok")]
        ),
        Some(5.0)
    );
    assert_eq!(
        metric(
            &text,
            "switchyard_breaker_transitions_total",
            &[("provider", "primary"), ("from", "closed"), ("to", "open")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            "switchyard_breaker_state",
            &[("provider", "primary")]
        ),
        Some(2.0)
    );
    assert_eq!(
        metric(
            &text,
            "switchyard_breaker_state",
            &[("provider", "secondary")]
        ),
        Some(0.0)
    );
    let rate = metric(&text, "switchyard_failover_rate", &[("route", "chat")]).unwrap();
    assert!(
        (rate - 5.0 / 7.0).abs() < 1e-9,
        "5 of 7 requests failed over: {rate}"
    );
    assert_eq!(
        metric(
            &text,
            "switchyard_requests_served_total",
            &[("route", "chat"), ("tier", "fallback")]
        ),
        Some(5.0)
    );
    assert!(metric(
        &text,
        "gen_ai_client_operation_duration_seconds_count",
        &[
            ("gen_ai_provider_name", "anthropic"),
            ("gen_ai_operation_name", "chat")
        ]
    )
    .is_some());
    assert!(metric(
        &text,
        "gen_ai_server_time_to_first_token_seconds_count",
        &[("provider", "primary")]
    )
    .is_some());
    assert!(metric(
        &text,
        "gen_ai_client_token_usage_count",
        &[("gen_ai_token_type", "output")]
    )
    .is_some());
    assert!(text.contains("switchyard_retry_budget_remaining{route=\"chat\"}"));
    assert!(!text.contains("sy-"), "no request ids in labels");

    let logs = sy.logs();
    assert!(
        logs.contains("breaker opened"),
        "a trip is logged at WARN: {logs}"
    );
    assert!(logs
        .lines()
        .any(|l| l.contains("breaker opened") && l.contains("WARN") && l.contains("primary")));
}

#[tokio::test]
async fn admin_force_open_moves_traffic_and_clear_brings_it_back() {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let config = format!("[admin]\ntoken_env = \"SY_ADMIN\"\n{}", two(&a, &b));
    let sy = Switchyard::start_with(&config, &[("SY_ADMIN", "admin-token-0123456789")]).await;
    let mut client = sy.client().await;
    let mut admin = AdminClient::new(sy.channel().await);

    let s = admin
        .list_providers(proto::ListProvidersRequest {})
        .await
        .unwrap_err();
    assert_eq!(
        s.code(),
        Code::Unauthenticated,
        "the admin API needs the admin token"
    );

    let r = admin
        .set_breaker(authed(proto::SetBreakerRequest {
            provider: "primary".into(),
            model: "gpt".into(),
            action: BreakerAction::ForceOpen as i32,
            reason: "maintenance window".into(),
            duration_ms: 0,
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.target.unwrap().breaker_state, "forced_open");
    for _ in 0..3 {
        let got = stream(&mut client, request("chat")).await;
        assert_eq!(
            got.finished.unwrap().served_by.unwrap().provider,
            "secondary"
        );
    }
    assert!(
        a.requests().await.is_empty(),
        "a forced-open target gets no traffic"
    );

    let list = admin
        .list_providers(authed(proto::ListProvidersRequest {}))
        .await
        .unwrap()
        .into_inner();
    let primary = list
        .targets
        .iter()
        .find(|t| t.provider == "primary")
        .unwrap();
    assert_eq!(primary.breaker_state, "forced_open");
    let route = list.routes.iter().find(|r| r.name == "chat").unwrap();
    assert_eq!(route.failover_rate, 1.0);
    let secondary = list
        .targets
        .iter()
        .find(|t| t.provider == "secondary")
        .unwrap();
    assert_eq!(secondary.failover_share, 1.0);
    assert_eq!(secondary.calls, 3);

    admin
        .set_breaker(authed(proto::SetBreakerRequest {
            provider: "primary".into(),
            model: "gpt".into(),
            action: BreakerAction::Clear as i32,
            reason: "done".into(),
            duration_ms: 0,
        }))
        .await
        .unwrap();
    // Clearing a forced-open breaker half-opens it: the next request probes, then it closes.
    for _ in 0..3 {
        let got = stream(&mut client, request("chat")).await;
        assert_eq!(got.finished.unwrap().served_by.unwrap().provider, "primary");
    }
    assert_eq!(a.requests().await.len(), 3);

    let bad = admin
        .set_breaker(authed(proto::SetBreakerRequest {
            provider: "nope".into(),
            model: "gpt".into(),
            action: BreakerAction::ForceOpen as i32,
            reason: "x".into(),
            duration_ms: 0,
        }))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::NotFound);
    // The Admin API's refusals come with ErrorInfo, like every request's.
    assert_eq!(reason(&bad), "UNKNOWN_PROVIDER");
    assert_eq!(error_meta(&bad, "provider").as_deref(), Some("nope"));
    let bad = admin
        .set_breaker(authed(proto::SetBreakerRequest {
            provider: "primary".into(),
            model: "gpt".into(),
            action: BreakerAction::ForceOpen as i32,
            reason: " ".into(),
            duration_ms: 0,
        }))
        .await
        .unwrap_err();
    assert_eq!(
        (bad.code(), reason(&bad), error_meta(&bad, "field")),
        (
            Code::InvalidArgument,
            "INVALID_ARGUMENT".to_string(),
            Some("reason".to_string())
        )
    );

    let (code, body) = sy.admin_get("/v1/status").await;
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["targets"].as_array().unwrap().len(), 2);
    assert_eq!(v["routes"][0]["name"], "chat");
    assert!(v["targets"][0]["breaker_state"].is_string());
}

#[tokio::test]
async fn reload_applies_valid_files_and_keeps_the_old_one_on_errors() {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let c = Mock::start("openai", &[]).await;
    let only_a = format!(
        "[server]\nwatch_config = false\n{}{}",
        provider("primary", "openai", &a.base_url(), "gpt"),
        route("chat", &["primary/gpt"])
    );
    let mut sy = Switchyard::start(&only_a).await;
    let mut client = sy.client().await;
    let mut admin = AdminClient::new(sy.channel().await);
    let path = sy.config_file.as_ref().unwrap().path().to_path_buf();

    // Keep a slow stream running through the primary across the reloads.
    a.set_config(json!({"token_delay_ms": 20})).await;
    let mut slow_client = sy.client().await;
    let mut slow_req = request("chat");
    slow_req.max_tokens = 16;
    let slow = tokio::spawn(async move { stream(&mut slow_client, slow_req).await });

    // Invalid: rejected with the dotted path; the old config keeps serving.
    std::fs::write(
        &path,
        only_a.replace("kind = \"openai\"", "kind = \"opnai\""),
    )
    .unwrap();
    let r = admin
        .reload_config(proto::ReloadConfigRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(!r.applied);
    assert!(r.message.contains("providers[0].kind"), "{}", r.message);
    assert!(stream(&mut client, request("chat"))
        .await
        .finished
        .is_some());

    // Valid: add the secondary, with a new route.
    let with_b = format!(
        "[server]\nwatch_config = false\n{}{}{}{}",
        provider("primary", "openai", &a.base_url(), "gpt"),
        provider("secondary", "anthropic", &b.base_url(), "claude"),
        route("chat", &["primary/gpt", "secondary/claude"]),
        route("claude", &["secondary/claude"])
    );
    std::fs::write(&path, &with_b).unwrap();
    let r = admin
        .reload_config(proto::ReloadConfigRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(r.applied, "{}", r.message);
    assert_eq!(r.providers_added, ["secondary"]);
    let got = stream(&mut client, request("claude")).await;
    assert_eq!(
        got.finished.unwrap().served_by.unwrap().provider,
        "secondary"
    );

    // SIGHUP: replace the primary by another provider.
    let with_c = format!(
        "[server]\nwatch_config = false\n{}{}{}",
        provider("tertiary", "openai", &c.base_url(), "gpt"),
        provider("secondary", "anthropic", &b.base_url(), "claude"),
        route("chat", &["tertiary/gpt", "secondary/claude"])
    );
    std::fs::write(&path, &with_c).unwrap();
    let pid = sy.child.id().unwrap().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let mut served_by_c = false;
    for _ in 0..200 {
        let got = stream(&mut client, request("chat")).await;
        if got.finished.map(|f| f.served_by.unwrap().provider) == Some("tertiary".into()) {
            served_by_c = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(served_by_c, "SIGHUP applied the new file: {}", sy.logs());
    let s = stream(&mut client, request("claude")).await.status.unwrap();
    assert_eq!(s.code(), Code::NotFound, "the removed route is gone");

    // The stream that began on the removed provider finished cleanly.
    let slow = slow.await.unwrap();
    assert!(
        slow.finished.is_some(),
        "a removed provider drains its streams: {:?}",
        slow.status
    );
    assert!(sy.child.try_wait().unwrap().is_none(), "still running");
}

#[tokio::test]
async fn a_changed_config_file_is_picked_up() {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let sy = Switchyard::start(&format!(
        "{}{}",
        provider("primary", "openai", &a.base_url(), "gpt"),
        route("chat", &["primary/gpt"])
    ))
    .await;
    let path = sy.config_file.as_ref().unwrap().path().to_path_buf();
    std::fs::write(
        &path,
        format!(
            "{}{}",
            provider("secondary", "anthropic", &b.base_url(), "claude"),
            route("chat", &["secondary/claude"])
        ),
    )
    .unwrap();
    let mut client = sy.client().await;
    for _ in 0..100 {
        let got = stream(&mut client, request("chat")).await;
        if got.finished.map(|f| f.served_by.unwrap().provider) == Some("secondary".into()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the watcher never applied the changed file: {}", sy.logs());
}

#[tokio::test]
async fn keys_and_prompts_never_reach_logs_or_metrics() {
    let a = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("primary", "openai", &a.base_url(), "gpt").replace(
            "first_token_timeout",
            "api_key_env = \"SY_PLANTED_KEY\"\nfirst_token_timeout"
        ),
        route("chat", &["primary/gpt"])
    );
    let planted = "sk-planted-secret-key-4f9a2c";
    let sy = Switchyard::start_with(
        &config,
        &[("SY_PLANTED_KEY", planted), ("RUST_LOG", "trace")],
    )
    .await;
    let mut client = sy.client().await;
    let mut req = request("chat");
    req.messages[0].content = "my secret prompt text 77123".into();
    assert!(stream(&mut client, req).await.finished.is_some());
    a.set_fault(json!({"type": "status", "preset": "auth"}))
        .await;
    let _ = stream(&mut client, request("chat")).await;
    assert_eq!(
        a.requests().await[0]["authorization_present"],
        true,
        "the key was sent upstream"
    );
    let (_, metrics) = sy.admin_get("/metrics").await;
    let (_, status) = sy.admin_get("/v1/status").await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let logs = sy.logs();
    for text in [&logs, &metrics, &status] {
        assert!(!text.contains(planted), "the API key leaked");
        assert!(
            !text.contains("my secret prompt text"),
            "prompt content leaked"
        );
        assert!(
            !text.contains("sk-secret-upstream-401-body"),
            "an upstream 401 body leaked"
        );
    }
    assert!(
        logs.contains("attempt ended"),
        "trace logging was on: {logs}"
    );
}

/// Spans received by an in-process OTLP/HTTP collector.
type Received = std::sync::Arc<std::sync::Mutex<Vec<opentelemetry_proto::tonic::trace::v1::Span>>>;

async fn otlp_collector() -> (String, Received) {
    use prost::Message;
    let received: Received = Default::default();
    let sink = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let req = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(body)
                    .expect("OTLP protobuf");
                let mut spans = sink.lock().unwrap();
                for rs in req.resource_spans {
                    for ss in rs.scope_spans {
                        spans.extend(ss.spans);
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), received)
}

fn attr(span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    span.attributes.iter().find(|a| a.key == key).and_then(|a| {
        match a.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            Value::IntValue(i) => Some(i.to_string()),
            Value::BoolValue(b) => Some(b.to_string()),
            _ => None,
        }
    })
}

#[tokio::test]
async fn a_callers_trace_continues_through_switchyard() {
    let (endpoint, received) = otlp_collector().await;
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let sy = Switchyard::start_with(
        &two(&a, &b),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    )
    .await;
    a.set_fault(json!({"type": "status", "status": 500, "times": 1}))
        .await;
    let mut client = sy.client().await;
    let mut req = tonic::Request::new(request("chat"));
    req.metadata_mut().insert(
        "traceparent",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap(),
    );
    assert!(stream(&mut client, req).await.finished.is_some());

    let trace_id = hex_decode("4bf92f3577b34da6a3ce929d0e0e4736");
    let caller_span = hex_decode("00f067aa0ba902b7");
    for _ in 0..200 {
        let spans = received.lock().unwrap().clone();
        let ours: Vec<_> = spans.iter().filter(|s| s.trace_id == trace_id).collect();
        let request_span = ours.iter().find(|s| s.name == "chat chat");
        let attempts: Vec<_> = ours
            .iter()
            .filter(|s| {
                attr(s, "provider").is_some()
                    && s.name.starts_with("chat ")
                    && s.name != "chat chat"
            })
            .collect();
        if let (Some(request_span), 2) = (request_span, attempts.len()) {
            assert_eq!(
                request_span.parent_span_id, caller_span,
                "the request span is the caller's child"
            );
            for a in &attempts {
                assert_eq!(
                    a.parent_span_id, request_span.span_id,
                    "attempts are children of the request"
                );
            }
            let outcomes: Vec<_> = attempts
                .iter()
                .map(|s| attr(s, "outcome").unwrap_or_default())
                .collect();
            assert!(
                outcomes.contains(&"server_error".to_string())
                    && outcomes.contains(&"ok".to_string()),
                "{outcomes:?}"
            );
            assert!(attempts.iter().any(|s| attr(s, "ttft_ms").is_some()));
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("spans never arrived: {:#?}", received.lock().unwrap());
}

fn hex_decode(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// `server.worker_threads` sizes the runtime that serves requests: the
/// threads in force show on `/metrics`; left out, one per core (or
/// `TOKIO_WORKER_THREADS`); out of range, `serve` refuses to start.
#[tokio::test]
async fn worker_threads_sizes_the_runtime() {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let workers = |sy: &Switchyard| {
        let admin = sy.admin.clone();
        async move {
            let text = reqwest::get(format!("http://{admin}/metrics"))
                .await
                .unwrap()
                .text()
                .await
                .unwrap();
            metric(&text, "switchyard_runtime_worker_threads", &[])
        }
    };
    let sy = Switchyard::start(&format!("[server]\nworker_threads = 3\n{}", two(&a, &b))).await;
    let mut client = sy.client().await;
    for _ in 0..4 {
        let got = stream(&mut client, request("chat")).await;
        assert_eq!(got.finished.unwrap().served_by.unwrap().provider, "primary");
    }
    assert_eq!(workers(&sy).await, Some(3.0));

    let by_env = Switchyard::start_with(&two(&a, &b), &[("TOKIO_WORKER_THREADS", "5")]).await;
    assert_eq!(workers(&by_env).await, Some(5.0));
    let config_wins = Switchyard::start_with(
        &format!("[server]\nworker_threads = 2\n{}", two(&a, &b)),
        &[("TOKIO_WORKER_THREADS", "5")],
    )
    .await;
    assert_eq!(workers(&config_wins).await, Some(2.0));
    if std::env::var_os("TOKIO_WORKER_THREADS").is_none() {
        let cores = std::thread::available_parallelism().unwrap().get();
        let default = Switchyard::start(&two(&a, &b)).await;
        assert_eq!(workers(&default).await, Some(cores as f64));
    }

    let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(
        file.path(),
        format!("[server]\nworker_threads = 0\n{}", two(&a, &b)),
    )
    .unwrap();
    let out = tokio::process::Command::new(BIN)
        .args(["serve", "--config"])
        .arg(file.path())
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("server.worker_threads") && stderr.contains("1 to 1024"),
        "{stderr}"
    );
}
