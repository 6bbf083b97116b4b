//! Google Gemini as a provider (`kind = "gemini"` on AI Studio and
//! `kind = "vertex_gemini"` on Vertex AI) through the real binary against
//! `mock-upstream --kind gemini`: streamed and unary answers, the key in
//! `x-goog-api-key` and the service account's token, a `SAFETY` stop as a
//! content refusal that is not failed over, a 429 with `RetryInfo` failed
//! over and its delay honoured, the chain OpenAI 503 -> Anthropic 529 ->
//! Gemini, a tool round trip whose thought signature must come back, usage
//! and cost in Gemini's shape (implicit cache reads, thoughts), images and a
//! PDF as `inlineData`, and config refused with the field named.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use base64::Engine;
use common::*;
use serde_json::{json, Value};
use switchyard::proto;
use switchyard::proto::FinishReason;

const MODEL: &str = "gemini-2.5-flash";
const KEY: &str = "AIza-switchyard-test-key";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

/// A `gemini` provider at `mock` with `extra` lines (before its model).
fn gemini_provider(id: &str, mock: &Mock, extra: &str) -> String {
    format!(
        r#"
[[providers]]
id = "{id}"
kind = "gemini"
base_url = "http://{}"
api_key_env = "SY_GEMINI_KEY"
first_token_timeout = "5s"
idle_timeout = "5s"
{extra}
  [[providers.models]]
  name = "{MODEL}"
  capabilities = ["chat", "stream", "tools", "json", "vision", "pdf", "reasoning"]
  context_tokens = 1000000
  price = {{ input_per_mtok = 0.30, output_per_mtok = 2.50 }}
"#,
        mock.addr
    )
}

async fn gemini_mock() -> Mock {
    Mock::start("gemini", &[]).await
}

async fn start(config: &str) -> Switchyard {
    Switchyard::start_with(config, &[("SY_GEMINI_KEY", KEY)]).await
}

fn tokens(n: u32) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

fn finished(got: &Collected, sy: &Switchyard) -> proto::Finished {
    got.finished
        .clone()
        .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()))
}

#[tokio::test]
async fn gemini_streams_and_answers_unary_with_the_key_in_x_goog_api_key() {
    let g = gemini_mock().await;
    let config = format!(
        "{}{}",
        gemini_provider("gemini", &g, ""),
        route("chat", &[&format!("gemini/{MODEL}")])
    );
    let sy = start(&config).await;
    let mut client = sy.client().await;
    let mut req = request("chat");
    req.messages.insert(
        0,
        proto::Message {
            role: "system".into(),
            content: "Be brief.".into(),
            ..Default::default()
        },
    );
    req.temperature = Some(0.5);
    req.stop = vec!["END".into()];
    let got = stream(&mut client, req.clone()).await;
    let f = finished(&got, &sy);
    assert_eq!(got.text, tokens(16));
    assert_eq!(f.finish_reason, FinishReason::Stop as i32);
    assert_eq!(f.served_by.unwrap().provider, "gemini");
    assert!(f.usage.unwrap().input_tokens > 0);

    let unary = client.complete(req).await.unwrap().into_inner();
    assert_eq!(unary.text, tokens(16));
    assert_eq!(unary.finish_reason, FinishReason::Stop as i32);

    let log = g.requests().await;
    assert_eq!(log.len(), 2, "one upstream call each");
    for r in &log {
        // Always streamed (the mock refuses a stream without alt=sse).
        assert_eq!(
            r["path"],
            format!("/v1beta/models/{MODEL}:streamGenerateContent")
        );
        assert_eq!(r["status"], 200);
        assert_eq!(r["authorization_present"], true);
        assert_eq!(
            r["body"]["systemInstruction"],
            json!({"parts": [{"text": "Be brief."}]})
        );
        assert_eq!(
            r["body"]["contents"],
            json!([{"role": "user", "parts": [{"text": "Say hello."}]}])
        );
        assert_eq!(
            r["body"]["generationConfig"],
            json!({"maxOutputTokens": 64, "temperature": 0.5, "stopSequences": ["END"]})
        );
    }
    assert!(!sy.logs().contains(KEY), "the key is never logged");
}

/// A service-account file whose token_uri is the mock's.
fn service_account(dir: &std::path::Path, mock: &Mock) -> String {
    let key = std::fs::read_to_string(format!("{FIXTURES}/vertex-test-key.pem")).unwrap();
    let path = dir.join("sa.json");
    std::fs::write(
        &path,
        json!({"type": "service_account", "project_id": "sy-test",
               "private_key_id": "k1", "private_key": key,
               "client_email": "switchyard@sy-test.iam.gserviceaccount.com",
               "token_uri": format!("http://{}/token", mock.addr)})
        .to_string(),
    )
    .unwrap();
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn vertex_gemini_takes_the_service_accounts_token_at_vertexs_url() {
    let public = format!("{FIXTURES}/vertex-test-key.pub.pem");
    let g = Mock::start_with_env(
        "vertex_gemini",
        &[],
        &[("MOCK_GCP_PUBLIC_KEY_FILE", &public)],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let sa = service_account(dir.path(), &g);
    let config = format!(
        "{}{}",
        provider("vg", "vertex_gemini", &format!("http://{}", g.addr), MODEL).replace(
            "first_token_timeout",
            "project = \"sy-test\"\nregion = \"us-central1\"\ncredentials_file_env = \"SY_VERTEX_SA\"\nfirst_token_timeout",
        ),
        route("chat", &[&format!("vg/{MODEL}")])
    );
    let sy = Switchyard::start_with(&config, &[("SY_VERTEX_SA", &sa)]).await;
    let mut client = sy.client().await;
    for _ in 0..2 {
        let got = stream(&mut client, request("chat")).await;
        let f = finished(&got, &sy);
        assert_eq!(f.served_by.unwrap().provider, "vg");
        assert_eq!(got.text, tokens(16));
    }
    let log = g.requests().await;
    assert_eq!(log.len(), 2);
    assert_eq!(
        log[0]["path"],
        format!("/v1/projects/sy-test/locations/us-central1/publishers/google/models/{MODEL}:streamGenerateContent")
    );
    let grants: Value = reqwest::get(format!("http://{}/_mock/tokens", g.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(grants["grants"], 1, "one token for both requests");
    assert!(!sy.logs().contains("ya29."));
}

/// Gemini first, an OpenAI-compatible backup second.
async fn gemini_then_backup(extra: &str) -> (Mock, Mock, Switchyard) {
    let g = gemini_mock().await;
    let backup = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}{}",
        gemini_provider("gemini", &g, extra),
        provider("backup", "openai", &backup.base_url(), "gpt-4o-mini"),
        route("chat", &[&format!("gemini/{MODEL}"), "backup/gpt-4o-mini"])
    );
    let sy = start(&config).await;
    (g, backup, sy)
}

#[tokio::test]
async fn a_safety_stop_is_a_content_refusal_and_never_fails_over() {
    let (g, backup, sy) = gemini_then_backup("").await;
    g.set_fault(json!({"type": "refusal", "after_tokens": 2}))
        .await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    let f = finished(&got, &sy);
    assert_eq!(f.finish_reason, FinishReason::ContentFilter as i32);
    assert_eq!(f.served_by.unwrap().provider, "gemini");
    assert_eq!(f.attempts, 1);
    assert_eq!(got.text, tokens(2), "what came before the stop");
    assert_eq!(g.requests().await.len(), 1);
    assert!(
        backup.requests().await.is_empty(),
        "a refusal is not laundered through another provider"
    );
}

#[tokio::test]
async fn a_429_with_retry_info_fails_over_and_its_delay_keeps_gemini_aside() {
    // Without RetryInfo a 429 would cool Gemini down for 1 ms only.
    let (g, backup, sy) = gemini_then_backup("cooldown = { rate_limit_cooldown = \"1ms\" }").await;
    let body = json!({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "You exceeded your current quota. Please retry in 30s.",
        "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [
                {"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                 "quotaId": "GenerateRequestsPerMinutePerProjectPerModel-FreeTier", "quotaValue": "10"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}]}});
    g.set_fault(json!({"type": "status", "status": 429, "body": body.to_string(), "times": 1}))
        .await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    let f = finished(&got, &sy);
    assert_eq!(f.served_by.unwrap().provider, "backup");
    assert_eq!(f.attempts, 2);
    assert_eq!(g.requests().await.len(), 1);
    assert_eq!(backup.requests().await.len(), 1);
    // Gemini would serve now (the fault was for one request), but its
    // RetryInfo asked for 30 s.
    let got = stream(&mut client, request("chat")).await;
    assert_eq!(finished(&got, &sy).served_by.unwrap().provider, "backup");
    assert_eq!(g.requests().await.len(), 1, "RetryInfo honoured");
    assert_eq!(backup.requests().await.len(), 2);
}

#[tokio::test]
async fn openai_503_then_anthropic_529_then_gemini_serves() {
    let openai = Mock::start("openai", &[]).await;
    let anthropic = Mock::start("anthropic", &[]).await;
    let g = gemini_mock().await;
    let config = format!(
        "{}{}{}{}",
        provider("openai", "openai", &openai.base_url(), "gpt-4o-mini"),
        provider(
            "anthropic",
            "anthropic",
            &anthropic.base_url(),
            "claude-sonnet-4-5"
        ),
        gemini_provider("gemini", &g, ""),
        route(
            "chat",
            &[
                "openai/gpt-4o-mini",
                "anthropic/claude-sonnet-4-5",
                &format!("gemini/{MODEL}")
            ]
        )
    );
    let sy = start(&config).await;
    openai
        .set_fault(json!({"type": "status", "status": 503}))
        .await;
    anthropic
        .set_fault(json!({"type": "status", "status": 529}))
        .await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    let f = finished(&got, &sy);
    assert_eq!(f.served_by.unwrap().provider, "gemini");
    assert_eq!(f.attempts, 3);
    assert_eq!(got.text, tokens(16));
    for (name, mock) in [
        ("openai", &openai),
        ("anthropic", &anthropic),
        ("gemini", &g),
    ] {
        assert_eq!(mock.requests().await.len(), 1, "{name}: one attempt");
    }
}

fn lookup_tool() -> proto::Tool {
    proto::Tool {
        name: "lookup".into(),
        description: "Look it up".into(),
        parameters_json: r#"{"type":"object","properties":{"query":{"type":"string"}}}"#.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_tool_round_trip_sends_the_thought_signature_back_and_gemini_checks_it() {
    let g = gemini_mock().await;
    let config = format!(
        "{}{}",
        gemini_provider("gemini", &g, ""),
        route("chat", &[&format!("gemini/{MODEL}")])
    );
    let sy = start(&config).await;
    let mut client = sy.client().await;
    let mut first = request("chat");
    first.messages = vec![user("Look up the weather.")];
    first.tools = vec![lookup_tool()];
    first.reasoning = Some(proto::Reasoning {
        effort: "low".into(),
        ..Default::default()
    });
    let got = stream(&mut client, first.clone()).await;
    let f = finished(&got, &sy);
    assert_eq!(f.finish_reason, FinishReason::ToolCalls as i32);
    assert_eq!(got.tool_calls.len(), 1);
    let call = &got.tool_calls[0];
    assert_eq!(call.name, "lookup");
    assert_eq!(call.arguments, format!("{{\"query\":\"{}\"}}", tokens(16)));
    assert_eq!(f.reasoning.len(), 1);
    let block = f.reasoning[0].clone();
    assert_eq!(block.dialect, "gemini");
    assert_eq!(block.text, "Thinking it over. ");
    assert!(!block.signature.is_empty());
    assert_eq!(
        g.requests().await[0]["body"]["generationConfig"]["thinkingConfig"],
        json!({"thinkingBudget": 1024, "includeThoughts": true})
    );

    // The next turn: the call with its reasoning, and the tool's result.
    let turn = |reasoning: Option<proto::ReasoningBlock>| {
        let mut req = first.clone();
        req.reasoning = None;
        req.messages.push(proto::Message {
            role: "assistant".into(),
            tool_calls: vec![proto::ToolCall {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            }],
            parts: reasoning
                .into_iter()
                .map(|r| proto::ContentPart {
                    part: Some(proto::content_part::Part::Reasoning(r)),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        req.messages.push(proto::Message {
            role: "tool".into(),
            tool_call_id: call.id.clone(),
            content: r#"{"hits": 3}"#.into(),
            ..Default::default()
        });
        req
    };
    let got = stream(&mut client, turn(Some(block.clone()))).await;
    let f = finished(&got, &sy);
    assert_eq!(f.finish_reason, FinishReason::Stop as i32);
    assert_eq!(got.text, tokens(16));
    let log = g.requests().await;
    assert_eq!(
        log[1]["body"]["contents"],
        json!([
            {"role": "user", "parts": [{"text": "Look up the weather."}]},
            {"role": "model", "parts": [
                {"text": "Thinking it over. ", "thought": true},
                {"functionCall": {"name": "lookup", "args": {"query": tokens(16)}},
                 "thoughtSignature": block.signature}]},
            {"role": "user", "parts": [
                {"functionResponse": {"name": "lookup", "response": {"hits": 3}}}]}
        ])
    );

    // Without it Gemini refuses the turn (400): the caller's request, not failed over.
    let got = stream(&mut client, turn(None)).await;
    let status = got.status.expect("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("thought_signature"), "{status:?}");
    let log = g.requests().await;
    assert_eq!(log.len(), 3);
    assert_eq!(log[2]["status"], 400);
    assert_eq!(log[2]["fault"], "thought_signature");
}

#[tokio::test]
async fn usage_and_cost_come_from_usage_metadata_with_implicit_cache_reads_and_thoughts() {
    let g = gemini_mock().await;
    let config = format!(
        "{}{}",
        gemini_provider("gemini", &g, ""),
        route("chat", &[&format!("gemini/{MODEL}")])
    );
    let sy = start(&config).await;
    let mut client = sy.client().await;
    let ask = |question: &str| {
        let mut req = request("chat");
        req.messages = vec![
            proto::Message {
                role: "system".into(),
                content: "You answer questions about the fleet. ".repeat(20),
                ..Default::default()
            },
            user(question),
        ];
        req.reasoning = Some(proto::Reasoning {
            budget_tokens: 512,
            ..Default::default()
        });
        req
    };
    let first = finished(&stream(&mut client, ask("How many?")).await, &sy);
    let second = finished(&stream(&mut client, ask("Which ones?")).await, &sy);
    let log = g.requests().await;
    // The mock's counts: a token per four bytes of the prompt, the prefix
    // (system and all but the last turn) read from its cache the second time.
    let prompt_of = |b: &Value| {
        (b["contents"].to_string().len() + b["systemInstruction"].to_string().len()) as u32 / 4 + 1
    };
    let cached = |b: &Value| {
        json!([
            b["systemInstruction"],
            b["contents"].as_array().unwrap()[..0]
        ])
        .to_string()
        .len() as u32
            / 4
    };
    let u1 = first.usage.unwrap();
    assert_eq!(u1.cache_read_input_tokens, 0);
    assert_eq!(u1.input_tokens, prompt_of(&log[0]["body"]));
    assert_eq!(u1.output_tokens, 16 + 8, "candidates and thoughts");
    assert_eq!(u1.reasoning_tokens, 8);
    let u2 = second.usage.unwrap();
    let (prompt, read) = (prompt_of(&log[1]["body"]), cached(&log[1]["body"]));
    assert!(read > 0);
    assert_eq!(u2.cache_read_input_tokens, read);
    assert_eq!(u2.input_tokens, prompt - read, "input is the uncached part");
    // Gemini's reads cost a quarter of the input price.
    let want = (f64::from(prompt - read) * 0.30
        + f64::from(read) * 0.30 * 0.25
        + f64::from(16 + 8) * 2.50)
        / 1e6;
    assert!(
        (second.cost_usd - want).abs() < 1e-12,
        "{} {want}",
        second.cost_usd
    );
}

#[tokio::test]
async fn images_and_a_pdf_reach_gemini_as_inline_data_and_a_plain_url_is_reported_dropped() {
    let g = gemini_mock().await;
    let config = format!(
        "{}{}",
        gemini_provider("gemini", &g, ""),
        route("chat", &[&format!("gemini/{MODEL}")])
    );
    let sy = start(&config).await;
    let png: &[u8] = b"\x89PNG\r\n\x1a\n-switchyard-test-image";
    let pdf: &[u8] = b"%PDF-1.4\n%switchyard test\n";
    let part = |p: proto::content_part::Part| proto::ContentPart {
        part: Some(p),
        ..Default::default()
    };
    let mut req = request("chat");
    req.messages = vec![proto::Message {
        role: "user".into(),
        parts: vec![
            part(proto::content_part::Part::Text("What are these?".into())),
            part(proto::content_part::Part::Image(proto::ImagePart {
                data: png.to_vec().into(),
                media_type: "image/png".into(),
                ..Default::default()
            })),
            part(proto::content_part::Part::Document(proto::DocumentPart {
                data: pdf.to_vec().into(),
                media_type: "application/pdf".into(),
                ..Default::default()
            })),
            part(proto::content_part::Part::Image(proto::ImagePart {
                url: "https://example.com/cat.png".into(),
                ..Default::default()
            })),
        ],
        ..Default::default()
    }];
    let got = stream(&mut sy.client().await, req).await;
    let f = finished(&got, &sy);
    assert_eq!(got.started[0].dropped, ["image_url"]);
    assert_eq!(f.dropped, ["image_url"]);
    let b64 = |d: &[u8]| base64::engine::general_purpose::STANDARD.encode(d);
    assert_eq!(
        g.requests().await[0]["body"]["contents"][0]["parts"],
        json!([
            {"text": "What are these?"},
            {"inlineData": {"mimeType": "image/png", "data": b64(png)}},
            {"inlineData": {"mimeType": "application/pdf", "data": b64(pdf)}}
        ])
    );
}

#[tokio::test]
async fn gemini_faults_fail_over_before_the_first_token_and_a_stream_without_finish_reason_is_truncated(
) {
    let (g, backup, sy) =
        gemini_then_backup("breaker = { consecutive_failures = 100, min_calls = 100 }").await;
    let mut client = sy.client().await;
    let faults = [
        json!({"type": "status", "status": 503}),
        json!({"type": "status", "status": 500}),
        json!({"type": "error_event", "after_tokens": 0}),
        json!({"type": "malformed", "after_tokens": 0, "close": true}),
        json!({"type": "no_terminator", "times": 1}),
    ];
    for (i, fault) in faults.iter().enumerate() {
        g.set_fault(fault.clone()).await;
        let mut req = request("chat");
        // A stream cut after its tokens ends there (the route's mid-stream
        // policy is `fail`); the others fail over before any token.
        if i == faults.len() - 1 {
            req.max_tokens = 4;
        }
        let got = stream(&mut client, req).await;
        assert_eq!(g.requests().await.len(), i + 1, "{fault}");
        if i < faults.len() - 1 {
            let f = finished(&got, &sy);
            assert_eq!(f.served_by.unwrap().provider, "backup", "{fault}");
            assert_eq!(backup.requests().await.len(), i + 1, "{fault}");
        } else {
            assert_eq!(got.text, tokens(4));
            let status = got.status.unwrap_or_else(|| panic!("{:?}", got.finished));
            assert!(status.message().contains("finishReason"), "{status:?}");
        }
    }
}

#[tokio::test]
async fn a_bad_key_is_auth_and_googles_answer_never_reaches_the_caller() {
    let g = gemini_mock().await;
    let config = format!(
        "{}{}",
        gemini_provider("gemini", &g, ""),
        route("chat", &[&format!("gemini/{MODEL}")])
    );
    let sy = start(&config).await;
    let r = reqwest::Client::new()
        .put(format!("http://{}/_mock/keys", g.addr))
        .json(&json!({"refused": [KEY]}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let got = stream(&mut sy.client().await, request("chat")).await;
    let status = got.status.expect("refused");
    let everything = format!("{status:?}");
    assert!(
        !everything.contains(switchyard_mock::AUTH_MARKER),
        "{everything}"
    );
    assert!(!everything.contains("API key not valid"), "{everything}");
    let log = g.requests().await;
    assert_eq!(log[0]["status"], 400, "Google's API_KEY_INVALID");
    assert!(
        sy.logs().contains("rejected the router's credentials"),
        "{}",
        sy.logs()
    );
}

#[test]
fn gemini_configs_missing_their_fields_are_refused_with_the_field_named() {
    let at = "http://127.0.0.1:9";
    let cases = [
        (
            provider("g", "gemini", at, MODEL),
            "providers[0].api_key_env",
        ),
        (
            provider("v", "vertex_gemini", at, MODEL),
            "providers[0].region",
        ),
        (
            provider("v", "vertex_gemini", at, MODEL).replace(
                "first_token_timeout",
                "region = \"us-central1\"\nfirst_token_timeout",
            ),
            "providers[0].project",
        ),
        (
            provider("g", "gemini", at, MODEL).replace(
                "first_token_timeout",
                "api_key_env = \"K\"\nproject = \"p\"\nfirst_token_timeout",
            ),
            "providers[0].project",
        ),
    ];
    for (p, field) in cases {
        let id = if p.contains("\"g\"") { "g" } else { "v" };
        let text = check_config_refuses(&format!(
            "{p}{}",
            route("chat", &[&format!("{id}/{MODEL}")])
        ));
        assert!(text.contains(field), "{field}: {text}");
    }
}
