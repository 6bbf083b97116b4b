//! `mid_stream = "continue"`: when an upstream stream dies after output,
//! the next attempt goes to a target that can continue the partial answer
//! (declares `continuation`; Anthropic up to Claude 4.5 with a trailing
//! assistant turn, an OpenAI-compatible server with
//! `continue_final_message`), given the text so far as a prefill; the
//! caller keeps what it has and gets only the new text: on an HTTP stream,
//! which cannot take a `Reset`, the answer simply goes on; on gRPC after a
//! `Continued` event. Where no target can continue, the route behaves as
//! `reset` (gRPC) or `fail` (HTTP). The upstream's request log shows what
//! the continuing target was sent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};
use switchyard::proto;
use switchyard::proto::completion_event::Event;

fn full_text(n: u32) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

/// A provider whose model declares `capabilities`.
fn provider_with(id: &str, kind: &str, base_url: &str, model: &str, caps: &str) -> String {
    provider(id, kind, base_url, model).replace(
        "capabilities = [\"chat\", \"stream\", \"tools\", \"json\"]",
        &format!("capabilities = [{caps}]"),
    )
}

const CONTINUES: &str = "\"chat\", \"stream\", \"continuation\"";
const PLAIN: &str = "\"chat\", \"stream\"";

struct Pair {
    primary: Mock,
    secondary: Mock,
    sy: Switchyard,
}

/// An OpenAI primary that cannot continue, then `secondary` (`kind`,
/// `model`, `caps`) on a `continue` route; the primary cuts its stream
/// after 5 tokens.
async fn pair(kind: &str, model: &str, caps: &str) -> Pair {
    let primary = Mock::start("openai", &[]).await;
    let secondary = Mock::start(
        if kind == "anthropic" {
            "anthropic"
        } else {
            "openai"
        },
        &[],
    )
    .await;
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{}{}{}mid_stream = \"continue\"\n",
        provider_with(
            "primary",
            "openai",
            &primary.base_url(),
            "gpt-4o-mini",
            PLAIN
        ),
        provider_with("secondary", kind, &secondary.base_url(), model, caps),
        route(
            "chat",
            &["primary/gpt-4o-mini", &format!("secondary/{model}")]
        )
    );
    let sy = Switchyard::start(&config).await;
    primary
        .set_fault(json!({"type": "abort", "after_tokens": 5}))
        .await;
    Pair {
        primary,
        secondary,
        sy,
    }
}

/// The trailing message the continuing target was sent.
fn last_message(log: &[Value]) -> Value {
    log[0]["body"]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone()
}

fn http_text(body: &str) -> (String, Option<Value>) {
    let mut text = String::new();
    let mut error = None;
    for line in body.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if v.get("error").is_some() {
            error = Some(v);
            continue;
        }
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    (text, error)
}

async fn post_stream(sy: &Switchyard) -> String {
    reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", sy.http_url()))
        .json(&json!({"model": "chat", "stream": true,
                      "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_http_stream_cut_mid_answer_goes_on_with_claude_continuing_it() {
    let p = pair("anthropic", "claude-sonnet-4-5", CONTINUES).await;
    let body = post_stream(&p.sy).await;
    let (text, error) = http_text(&body);
    assert!(error.is_none(), "{body}");
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert_eq!(
        text,
        full_text(16),
        "no character repeated or lost at the seam"
    );

    let log = p.secondary.requests().await;
    assert_eq!(log.len(), 1);
    let prefill = last_message(&log);
    assert_eq!(prefill["role"], "assistant");
    let sent = prefill["content"]
        .as_str()
        .map(String::from)
        .unwrap_or_else(|| prefill["content"][0]["text"].as_str().unwrap().to_string());
    assert_eq!(
        sent, "tok0 tok1 tok2 tok3 tok4",
        "the text so far, without trailing space"
    );
    assert_eq!(p.primary.requests().await.len(), 1);
}

#[tokio::test]
async fn a_grpc_stream_is_told_continued_and_gets_only_the_new_text() {
    let p = pair("anthropic", "claude-sonnet-4-5", CONTINUES).await;
    let mut client = p.sy.client().await;
    let mut s = client
        .stream_completion(request("chat"))
        .await
        .unwrap()
        .into_inner();
    let mut text = String::new();
    let mut continued = None;
    let mut finished = None;
    while let Some(ev) = s.message().await.unwrap() {
        match ev.event {
            Some(Event::Delta(d)) => text.push_str(&d.text),
            Some(Event::Continued(c)) => continued = Some((ev.seq, c)),
            Some(Event::Finished(f)) => finished = Some(f),
            Some(Event::Reset(r)) => panic!("continued, not reset: {r:?}"),
            _ => {}
        }
    }
    assert_eq!(text, full_text(16));
    let (seq, c) = continued.expect("a Continued event");
    assert_eq!(
        c,
        proto::Continued {
            failed_attempt: 1,
            provider: "secondary".into(),
            model: "claude-sonnet-4-5".into(),
            at_seq: 6,
            attempt: 2,
        },
        "after Started and 5 deltas"
    );
    assert_eq!(seq, 7);
    let f = finished.unwrap();
    assert_eq!(f.served_by.unwrap().provider, "secondary");
    let usage = f.usage.unwrap();
    assert!(
        usage.output_tokens >= 16,
        "both attempts' output is in the usage: {usage:?}"
    );
}

#[tokio::test]
async fn an_openai_compatible_server_is_asked_to_continue_its_final_message() {
    let p = pair("openai", "qwen", CONTINUES).await;
    let (text, error) = http_text(&post_stream(&p.sy).await);
    assert!(error.is_none());
    assert_eq!(text, full_text(16));
    let log = p.secondary.requests().await;
    let body = &log[0]["body"];
    assert_eq!(body["continue_final_message"], true);
    assert_eq!(
        body["add_generation_prompt"], false,
        "vLLM refuses both true"
    );
    assert_eq!(last_message(&log)["content"], "tok0 tok1 tok2 tok3 tok4");
}

#[tokio::test]
async fn where_no_target_can_continue_http_fails_and_grpc_resets() {
    // Claude 4.6 answers 400 to a prefill, whatever the config declares.
    for (model, caps) in [
        ("claude-sonnet-4-6", CONTINUES),
        ("claude-sonnet-4-5", PLAIN),
    ] {
        let p = pair("anthropic", model, caps).await;
        let (text, error) = http_text(&post_stream(&p.sy).await);
        assert_eq!(text, full_text(5), "{model}: what was sent stays");
        let error = error.expect("an error frame");
        assert_eq!(error["error"]["code"], "UPSTREAM_STREAM_TRUNCATED");
        assert!(
            p.secondary.requests().await.is_empty(),
            "{model}: nothing asked of a target that cannot continue for a caller that cannot reset"
        );

        let got = stream(&mut p.sy.client().await, request("chat")).await;
        assert_eq!(got.resets.len(), 1, "{model}: as `reset` on gRPC");
        assert_eq!(got.text, full_text(16));
        let log = p.secondary.requests().await;
        assert_eq!(log.len(), 1);
        assert_eq!(
            last_message(&log)["role"],
            "user",
            "a new answer, no prefill"
        );
    }
}

#[tokio::test]
async fn an_anthropic_door_stream_cut_mid_answer_goes_on_seamlessly() {
    let p = pair("anthropic", "claude-sonnet-4-5", CONTINUES).await;
    let body = reqwest::Client::new()
        .post(format!("{}/v1/messages", p.sy.http_url()))
        .json(&json!({"model": "chat", "stream": true, "max_tokens": 64,
                      "messages": [{"role": "user", "content": "hello"}]}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut text = String::new();
    let mut names = Vec::new();
    for block in body.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let name = block
            .lines()
            .find_map(|l| l.strip_prefix("event: "))
            .unwrap_or_default();
        let data: Value = block
            .lines()
            .find_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .unwrap_or(Value::Null);
        if name == "content_block_delta" {
            text.push_str(data["delta"]["text"].as_str().unwrap_or_default());
        }
        names.push(name.to_string());
    }
    assert!(!names.iter().any(|n| n == "error"), "{body}");
    assert_eq!(
        names.last().map(String::as_str),
        Some("message_stop"),
        "{body}"
    );
    assert_eq!(text, full_text(16), "one answer across the seam");
    assert_eq!(p.secondary.requests().await.len(), 1);
}
