//! The content model through the OpenAI door of the real binary: an image
//! (`image_url`, data URL) and a PDF (`file` part) reach an OpenAI upstream
//! byte for byte and, across a failover, an Anthropic one as `image` and
//! `document` blocks; a `json_schema` request lands only on a target with
//! the `json_schema` capability and gets JSON valid for its schema; usage
//! with cached and reasoning tokens is priced to the hand-computed figure;
//! a dropped cache marker is named in `x-switchyard-dropped`. Assertions are
//! on what the caller got and on the mocks' request logs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use base64::Engine;
use common::*;
use serde_json::{json, Value};
use switchyard::proto;

/// A 1x1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0xda, 0x63, 0x64, 0xf8, 0xcf, 0x50,
    0x0f, 0x00, 0x03, 0x86, 0x01, 0x80, 0x5a, 0x34, 0x7d, 0x6b, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// A one-page PDF with a line of text.
const PDF: &[u8] = b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n\
2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n\
3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 200 50]/Contents 4 0 R/Resources<</Font<</F1 5 0 R>>>>>>endobj\n\
4 0 obj<</Length 44>>stream\nBT /F1 12 Tf 10 20 Td (Invoice 42) Tj ET\nendstream endobj\n\
5 0 obj<</Type/Font/Subtype/Type1/BaseFont/Helvetica>>endobj\n\
trailer<</Root 1 0 R>>\n%%EOF\n";

/// Prices that make the figures easy: $1 an uncached input token, $0.25 a
/// cached one, $2 an output token.
const PRICE: &str = "price = { input_per_mtok = 1000000.0, cache_read_per_mtok = 250000.0, output_per_mtok = 2000000.0 }";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// A provider with one model of the given capabilities and extra lines.
fn model_provider(
    id: &str,
    kind: &str,
    mock: &Mock,
    model: &str,
    caps: &str,
    extra: &str,
) -> String {
    provider(id, kind, &mock.base_url(), model).replace(
        "capabilities = [\"chat\", \"stream\", \"tools\", \"json\"]",
        &format!("capabilities = [{caps}]\n  {extra}"),
    )
}

/// `oa` (OpenAI: vision, pdf, json_schema, reasoning; priced) and `an`
/// (Anthropic: vision, pdf; no json_schema). Routes: `chat` = oa then an;
/// `anthropic_first` = an then oa; `anthropic_only` = an.
struct Two {
    oa: Mock,
    an: Mock,
    sy: Switchyard,
    url: String,
    http: reqwest::Client,
}

async fn two() -> Two {
    let oa = Mock::start("openai", &[]).await;
    let an = Mock::start("anthropic", &[]).await;
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{}{}{}{}{}",
        model_provider(
            "oa",
            "openai",
            &oa,
            "gpt-4o-mini",
            r#""chat", "stream", "tools", "json", "vision", "pdf", "json_schema", "reasoning""#,
            PRICE,
        ),
        model_provider(
            "an",
            "anthropic",
            &an,
            "claude-sonnet-4-5",
            r#""chat", "stream", "tools", "json", "vision", "pdf""#,
            "",
        ),
        route("chat", &["oa/gpt-4o-mini", "an/claude-sonnet-4-5"]),
        route(
            "anthropic_first",
            &["an/claude-sonnet-4-5", "oa/gpt-4o-mini"]
        ),
        route("anthropic_only", &["an/claude-sonnet-4-5"]),
    );
    let sy = Switchyard::start(&config).await;
    let url = sy.http_url();
    Two {
        oa,
        an,
        sy,
        url,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
    }
}

impl Two {
    async fn post(&self, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
        let r = self
            .http
            .post(format!("{}/v1/chat/completions", self.url))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap();
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        (status, headers, v)
    }
}

fn header(h: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    h.get(name).map(|v| v.to_str().unwrap().to_string())
}

/// A user turn with text, a PNG as a data URL and a PDF as a file part.
fn media_request(route: &str) -> Value {
    json!({
        "model": route,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is on the page and in the picture?"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{}", b64(PNG))}},
            {"type": "file", "file": {"filename": "invoice.pdf",
                                      "file_data": format!("data:application/pdf;base64,{}", b64(PDF))}}
        ]}]
    })
}

#[tokio::test]
async fn an_image_and_a_pdf_reach_openai_intact_and_anthropic_as_blocks_after_failover() {
    let t = two().await;
    let (status, headers, answer) = t.post(&media_request("chat")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        header(&headers, "x-switchyard-served-by").as_deref(),
        Some("oa/gpt-4o-mini")
    );
    assert_eq!(header(&headers, "x-switchyard-dropped"), None);
    let log = t.oa.requests().await;
    let parts = &log[0]["body"]["messages"][0]["content"];
    assert_eq!(parts[0]["text"], "What is on the page and in the picture?");
    assert_eq!(parts[1]["type"], "image_url");
    assert_eq!(
        parts[1]["image_url"]["url"],
        format!("data:image/png;base64,{}", b64(PNG))
    );
    assert_eq!(parts[2]["type"], "file");
    assert_eq!(parts[2]["file"]["filename"], "invoice.pdf");
    assert_eq!(
        parts[2]["file"]["file_data"],
        format!("data:application/pdf;base64,{}", b64(PDF))
    );

    // The OpenAI target fails: the same turn goes to Anthropic in its shape.
    t.oa.set_fault(json!({"type": "status", "status": 503}))
        .await;
    let (status, headers, answer) = t.post(&media_request("chat")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        header(&headers, "x-switchyard-served-by").as_deref(),
        Some("an/claude-sonnet-4-5")
    );
    let log = t.an.requests().await;
    assert_eq!(log.len(), 1);
    let blocks = &log[0]["body"]["messages"][0]["content"];
    assert_eq!(
        blocks[0],
        json!({"type": "text", "text": "What is on the page and in the picture?"})
    );
    assert_eq!(
        blocks[1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}})
    );
    assert_eq!(blocks[2]["type"], "document");
    assert_eq!(
        blocks[2]["source"],
        json!({"type": "base64", "media_type": "application/pdf", "data": b64(PDF)})
    );
    assert_eq!(blocks.as_array().unwrap().len(), 3);
}

fn person_schema() -> Value {
    json!({"type": "object", "additionalProperties": false,
           "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 18},
                          "role": {"enum": ["admin", "user"]}},
           "required": ["name", "age", "role"]})
}

fn schema_request(route: &str) -> Value {
    json!({
        "model": route,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Who is the admin?"}],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "person", "strict": true, "schema": person_schema()}}
    })
}

#[tokio::test]
async fn a_json_schema_request_lands_only_on_a_json_schema_target() {
    let t = two().await;
    // Anthropic comes first in the route but cannot take the schema.
    let (status, headers, answer) = t.post(&schema_request("anthropic_first")).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        header(&headers, "x-switchyard-served-by").as_deref(),
        Some("oa/gpt-4o-mini")
    );
    assert!(t.an.requests().await.is_empty(), "never tried on an");
    let log = t.oa.requests().await;
    assert_eq!(
        log[0]["body"]["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true,
                                                       "schema": person_schema()}})
    );
    // The answer is JSON valid for the schema (the mock honours it).
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    let person: Value = serde_json::from_str(content).unwrap();
    assert_eq!(person["age"], 18);
    assert_eq!(person["role"], "admin");
    assert!(person["name"].as_str().unwrap().starts_with("tok0 tok1 "));

    // No target takes it: refused, naming the capability.
    let (status, _, err) = t.post(&schema_request("anthropic_only")).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["code"], "NO_CAPABLE_TARGET", "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("json_schema"),
        "{err}"
    );
    assert!(t.an.requests().await.is_empty());
}

/// A prompt long enough (well over 1,024 mock tokens) for OpenAI's
/// automatic prompt cache.
fn long_prompt() -> String {
    (0..700).map(|i| format!("line{i} ")).collect()
}

/// The mock's count of a request's prompt tokens (four bytes a token of its
/// `messages` JSON, plus one) and the cached part of a repeat: the longest
/// 128-token step from 1,024 within it.
fn mock_prompt_tokens(body: &Value) -> u64 {
    body["messages"].to_string().len() as u64 / 4 + 1
}

fn cached_of(prompt: u64) -> u64 {
    1024 + (prompt - 1024) / 128 * 128
}

#[tokio::test]
async fn cached_and_reasoning_tokens_are_reported_and_priced_by_hand() {
    let t = two().await;
    let body = json!({
        "model": "chat",
        "max_tokens": 64,
        "reasoning_effort": "low",
        "messages": [{"role": "user", "content": long_prompt()}]
    });
    let (status, _, first) = t.post(&body).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (status, _, again) = t.post(&body).await;
    assert_eq!(status, 200, "{again}");

    let log = t.oa.requests().await;
    assert_eq!(log[1]["body"]["reasoning_effort"], "low");
    let prompt = mock_prompt_tokens(&log[1]["body"]);
    let cached = cached_of(prompt);
    assert!(prompt > 1024 + 128, "{prompt}");
    // 16 answer tokens and 4 reasoning tokens ("low" on the mock's scale).
    let usage = &again["usage"];
    assert_eq!(usage["prompt_tokens"], prompt, "{usage}");
    assert_eq!(usage["completion_tokens"], 20, "{usage}");
    assert_eq!(usage["total_tokens"], prompt + 20, "{usage}");
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], cached);
    assert_eq!(usage["completion_tokens_details"]["reasoning_tokens"], 4);
    assert_eq!(
        again["choices"][0]["message"]["reasoning_content"],
        "think0 think1 think2 think3 "
    );

    // The same turn through gRPC: the normalised usage and its price.
    let mut client = t.sy.client().await;
    let mut req = request("chat");
    req.messages = vec![user(&long_prompt())];
    req.reasoning = Some(proto::Reasoning {
        effort: "low".into(),
        ..Default::default()
    });
    let got = client.complete(req).await.unwrap().into_inner();
    let log = t.oa.requests().await;
    let prompt = mock_prompt_tokens(&log[2]["body"]);
    let cached = cached_of(prompt);
    let u = got.usage.unwrap();
    assert_eq!(u64::from(u.input_tokens), prompt - cached, "uncached input");
    assert_eq!(u64::from(u.cache_read_input_tokens), cached);
    assert_eq!(u.cache_write_input_tokens, 0);
    assert_eq!(u.output_tokens, 20, "reasoning counted as output");
    assert_eq!(u.reasoning_tokens, 4);
    // $1 an uncached input token, $0.25 a cached one, $2 an output token.
    let expected = (prompt - cached) as f64 + cached as f64 * 0.25 + 20.0 * 2.0;
    println!(
        "prompt {prompt}, cached {cached}, output 20 (4 reasoning): ${}",
        got.cost_usd
    );
    assert!(
        (got.cost_usd - expected).abs() < 1e-6,
        "cost {} != {expected} (prompt {prompt}, cached {cached})",
        got.cost_usd
    );
}

#[tokio::test]
async fn a_cache_marker_dropped_on_an_openai_target_is_named_in_a_header() {
    let t = two().await;
    let marked = |stream: bool| {
        json!({
            "model": "chat",
            "max_tokens": 64,
            "stream": stream,
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral"}}]}]
        })
    };
    let (status, headers, answer) = t.post(&marked(false)).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        header(&headers, "x-switchyard-dropped").as_deref(),
        Some("cache_control")
    );
    let r = t
        .http
        .post(format!("{}/v1/chat/completions", t.url))
        .json(&marked(true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(r.headers(), "x-switchyard-dropped").as_deref(),
        Some("cache_control")
    );
    assert!(r.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    let log = t.oa.requests().await;
    assert_eq!(log.len(), 2);
    for l in &log {
        assert!(!l["body"].to_string().contains("cache_control"), "{l}");
        assert_eq!(l["body"]["messages"][0]["content"][0]["text"], "Say hello.");
    }

    // On the Anthropic target the marker is carried, and nothing is dropped.
    let mut body = marked(false);
    body["model"] = json!("anthropic_first");
    let (status, headers, answer) = t.post(&body).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(header(&headers, "x-switchyard-dropped"), None);
    let log = t.an.requests().await;
    assert_eq!(
        log[0]["body"]["messages"][0]["content"][0]["cache_control"],
        json!({"type": "ephemeral"})
    );
}
