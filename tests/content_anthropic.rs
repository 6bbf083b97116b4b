//! The content model through the real binary on the Anthropic side: what a
//! target's wire left out reaches the caller (`x-switchyard-dropped` in the
//! gRPC initial metadata and the HTTP headers, `Finished.dropped`); the
//! official `anthropic` SDK's images, PDFs, cache markers, signed thinking
//! and system turns reaching an Anthropic upstream whole
//! (examples/anthropic_sdk/test_content.py; skipped loudly without the SDK,
//! except under CI); `cost_usd` of cache writes and reads to the cent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use switchyard::proto;

/// A user turn whose one text part carries a prompt-cache marker.
fn marked_request(route: &str) -> proto::CompletionRequest {
    let mut req = request(route);
    req.messages[0] = proto::Message {
        role: "user".into(),
        parts: vec![proto::ContentPart {
            part: Some(proto::content_part::Part::Text("Say hello.".into())),
            cache_control: Some(proto::CacheControl { ttl: "1h".into() }),
        }],
        ..Default::default()
    };
    req
}

#[tokio::test]
async fn grpc_callers_see_what_an_openai_target_dropped_in_the_initial_metadata() {
    let mock = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("oa", "openai", &mock.base_url(), "gpt-4o-mini"),
        route("chat", &["oa/gpt-4o-mini"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;

    let response = client
        .stream_completion(marked_request("chat"))
        .await
        .unwrap();
    assert_eq!(
        response.metadata().get("x-switchyard-dropped").unwrap(),
        "cache_control"
    );
    let mut events = response.into_inner();
    let mut dropped = (Vec::new(), Vec::new());
    while let Some(ev) = events.message().await.unwrap() {
        match ev.event {
            Some(proto::completion_event::Event::Started(s)) => dropped.0 = s.dropped,
            Some(proto::completion_event::Event::Finished(f)) => dropped.1 = f.dropped,
            _ => {}
        }
    }
    assert_eq!(dropped.0, ["cache_control"]);
    assert_eq!(dropped.1, ["cache_control"]);

    let unary = client.complete(marked_request("chat")).await.unwrap();
    assert_eq!(
        unary.metadata().get("x-switchyard-dropped").unwrap(),
        "cache_control"
    );
    assert_eq!(unary.into_inner().dropped, ["cache_control"]);

    // Nothing left out: no header at all.
    let plain = client.complete(request("chat")).await.unwrap();
    assert!(plain.metadata().get("x-switchyard-dropped").is_none());
    // The OpenAI target got the text without a marker.
    let log = mock.requests().await;
    assert_eq!(
        log[0]["body"]["messages"][0]["content"][0]["text"],
        "Say hello."
    );
    assert!(log[0]["body"].to_string().find("cache_control").is_none());
}

/// An Anthropic provider whose model can take everything the content
/// model carries, at Sonnet's price ($3 / $15 a million tokens; cache
/// prices from Anthropic's multipliers), behind route `chat`.
fn anthropic_config(mock: &Mock) -> String {
    format!(
        r#"[server]
http_listen = "127.0.0.1:0"

[[providers]]
id = "claude"
kind = "anthropic"
base_url = "{}"
first_token_timeout = "5s"
idle_timeout = "5s"
  [[providers.models]]
  name = "claude-sonnet-4-5"
  capabilities = ["chat", "stream", "tools", "vision", "pdf", "reasoning", "prompt_cache"]
  context_tokens = 200000
  price = {{ input_per_mtok = 3.0, output_per_mtok = 15.0 }}
{}"#,
        mock.base_url(),
        route("chat", &["claude/claude-sonnet-4-5"])
    )
}

#[tokio::test]
async fn the_anthropic_sdk_carries_media_cache_markers_thinking_and_system_turns_whole() {
    if !python_ready(
        "anthropic",
        "import anthropic",
        "examples/anthropic_sdk/requirements.txt",
    ) {
        return;
    }
    let mock = Mock::start("anthropic", &[]).await;
    let sy = Switchyard::start(&anthropic_config(&mock)).await;
    let mock_url = format!("http://{}", mock.addr);
    let (out, stdout, stderr) = run_example(
        "python3",
        "examples/anthropic_sdk/test_content.py",
        &[
            "--base-url",
            &sy.http_url(),
            "--primary",
            &mock_url,
            "--secondary",
            &mock_url,
        ],
    )
    .await;
    println!("{stdout}");
    assert!(
        out.status.success(),
        "test_content.py failed:\n{stdout}\n{stderr}\nswitchyard logs:\n{}",
        sy.logs()
    );
    assert_eq!(stdout.matches("PASS ").count(), 4, "{stdout}");
}

/// A system prompt of `n` bytes with a cache marker, then a question.
fn cached_request(system_bytes: usize, question: &str) -> proto::CompletionRequest {
    let mut req = request("chat");
    req.messages = vec![
        proto::Message {
            role: "system".into(),
            parts: vec![proto::ContentPart {
                part: Some(proto::content_part::Part::Text("r".repeat(system_bytes))),
                cache_control: Some(proto::CacheControl { ttl: "5m".into() }),
            }],
            ..Default::default()
        },
        user(question),
    ];
    req
}

/// Sonnet's prices: $3 input, $15 output, reads 0.1x, 5m writes 1.25x.
fn hand_cost(u: &proto::Usage) -> f64 {
    (f64::from(u.input_tokens) * 3.0
        + f64::from(u.cache_read_input_tokens) * 0.3
        + f64::from(u.cache_write_input_tokens) * 3.75
        + f64::from(u.output_tokens) * 15.0)
        / 1e6
}

#[tokio::test]
async fn cost_usd_prices_cache_writes_and_reads_by_anthropics_multipliers() {
    let mock = Mock::start("anthropic", &[]).await;
    let sy = Switchyard::start(&anthropic_config(&mock)).await;
    let mut client = sy.client().await;

    // 40,000 bytes of marked system prompt: the block the mock hashes,
    // {"type":"text","text":"rrr…"}, is 40,025 bytes = 10,006 tokens
    // (bytes / 4); with the question, 10,008; 16 tokens out.
    let first = client
        .complete(cached_request(40_000, "First?"))
        .await
        .unwrap()
        .into_inner();
    let u = first.usage.unwrap();
    let got = |u: &proto::Usage| {
        (
            u.input_tokens,
            u.cache_write_input_tokens,
            u.cache_read_input_tokens,
            u.output_tokens,
        )
    };
    assert_eq!(got(&u), (2, 10_006, 0, 16));
    // By hand: (2 x $3 + 10,006 x $3.75 + 16 x $15) / 1e6.
    assert!((first.cost_usd - 0.037_768_5).abs() < 1e-9, "{first:?}");
    assert!((first.cost_usd - hand_cost(&u)).abs() < 1e-9);

    let second = stream(&mut client, cached_request(40_000, "Second?")).await;
    let f = second.finished.unwrap();
    let v = f.usage.unwrap();
    assert_eq!(got(&v), (2, 0, 10_006, 16));
    // By hand: (2 x $3 + 10,006 x $0.30 + 16 x $15) / 1e6.
    assert!((f.cost_usd - 0.003_247_8).abs() < 1e-9, "{f:?}");
    assert!((f.cost_usd - hand_cost(&v)).abs() < 1e-9);

    // The upstream got the marker on the system block.
    let log = mock.requests().await;
    assert_eq!(
        log[0]["body"]["system"][0]["cache_control"],
        serde_json::json!({"type": "ephemeral"})
    );
}
