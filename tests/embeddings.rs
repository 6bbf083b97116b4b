//! Embeddings through the real binary: `POST /v1/embeddings` and
//! `Router.Embed` over three `mock-upstream`s (`a` and `b` serve one
//! embedding family under two names, `c` another model). Failover stays
//! within the family unless the route says `embedding_family_failover =
//! "any"` (the mocks' logs show every attempt, and `c` none); token ids are
//! passed on; malformed `input` is refused with the parameter named; the
//! call is priced from the model's input price and held against the
//! tenant's cap; the official `openai` SDK, LangChain's `OpenAIEmbeddings`
//! and the `anthropic` SDK's model list drive the door
//! (examples/openai_sdk/test_embeddings.py).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use switchyard::proto;

struct Rig {
    a: Mock,
    b: Mock,
    c: Mock,
    sy: Switchyard,
    url: String,
    http: reqwest::Client,
}

/// One openai-kind provider with one embeddings model (`extra` lines in it).
fn embedder(id: &str, mock: &Mock, model: &str, extra: &str) -> String {
    format!(
        r#"
[[providers]]
id = "{id}"
kind = "openai"
base_url = "{}"
first_token_timeout = "5s"
  [[providers.models]]
  name = "{model}"
  capabilities = ["embeddings"]
  price = {{ input_per_mtok = 1000000.0 }}
{extra}
"#,
        mock.base_url()
    )
}

/// Routes `embed` (a, b, c; one family), `chat` (a chat model only) and
/// `embed-any` (a, c: any family). `head` goes at the top of the file.
async fn rig(head: &str) -> Rig {
    let (a, b, c) = (
        Mock::start("openai", &[]).await,
        Mock::start("openai", &[]).await,
        Mock::start("openai", &[]).await,
    );
    let config = format!(
        r#"{head}
[server]
http_listen = "127.0.0.1:0"
[backoff]
base = "20ms"
{}
  [[providers.models]]
  name = "gpt-4o-mini"
{}{}
[[routes]]
name = "embed"
targets = ["a/text-embedding-3-small", "b/te3-small", "c/other-embed"]
[[routes]]
name = "chat"
targets = ["a/gpt-4o-mini"]
[[routes]]
name = "embed-any"
targets = ["a/text-embedding-3-small", "c/other-embed"]
embedding_family_failover = "any"
"#,
        embedder("a", &a, "text-embedding-3-small", ""),
        embedder(
            "b",
            &b,
            "te3-small",
            "  family = \"text-embedding-3-small\""
        ),
        embedder("c", &c, "other-embed", ""),
    );
    let sy = Switchyard::start(&config).await;
    Rig {
        url: sy.http_url(),
        a,
        b,
        c,
        sy,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap(),
    }
}

impl Rig {
    async fn embed(&self, body: Value) -> (u16, reqwest::header::HeaderMap, Value) {
        let r = self
            .http
            .post(format!("{}/v1/embeddings", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        (status, headers, r.json().await.unwrap())
    }

    async fn embed_calls(mock: &Mock) -> Vec<Value> {
        mock.requests()
            .await
            .into_iter()
            .filter(|r| r["path"] == "/v1/embeddings")
            .collect()
    }
}

/// A body cut for an assertion message (a vector is 512 numbers).
fn brief(v: &Value) -> String {
    v.to_string().chars().take(300).collect()
}

fn header<'a>(h: &'a reqwest::header::HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

#[tokio::test]
async fn failover_stays_within_the_family_unless_the_route_allows_any() {
    let r = rig("").await;
    r.a.set_fault(json!({"type": "status", "status": 503}))
        .await;
    let (status, h, body) = r
        .embed(json!({"model": "embed", "input": ["refund policy"]}))
        .await;
    assert_eq!(status, 200, "{}", brief(&body));
    // The answer names the model that served, and so do the headers.
    assert_eq!(body["model"], "te3-small");
    assert_eq!(header(&h, "x-switchyard-served-by"), "b/te3-small");
    assert_eq!(header(&h, "x-switchyard-tier"), "fallback");
    assert_eq!(header(&h, "x-switchyard-attempts"), "2");
    assert_eq!(body["data"][0]["embedding"].as_array().unwrap().len(), 512);
    assert_eq!(Rig::embed_calls(&r.a).await.len(), 1);
    assert_eq!(Rig::embed_calls(&r.b).await.len(), 1);

    // Both of the family down: an OpenAI-shaped 503, and `c` never asked.
    r.b.set_fault(json!({"type": "status", "status": 503}))
        .await;
    let (status, h, body) = r
        .embed(json!({"model": "embed", "input": "refund policy"}))
        .await;
    assert_eq!(status, 503, "{}", brief(&body));
    assert_eq!(body["error"]["type"], "server_error");
    assert_eq!(body["error"]["code"], "UPSTREAM_OVERLOADED");
    assert!(!header(&h, "x-request-id").is_empty());
    let tries = Rig::embed_calls(&r.a).await.len() + Rig::embed_calls(&r.b).await.len();
    assert_eq!(tries, 2 + 3, "max_attempts (3) across a and b");
    assert!(Rig::embed_calls(&r.c).await.is_empty(), "another family");

    // A route that allows any family fails over to it.
    let (status, h, body) = r
        .embed(json!({"model": "embed-any", "input": "refund policy"}))
        .await;
    assert_eq!(status, 200, "{}", brief(&body));
    assert_eq!(body["model"], "other-embed");
    assert_eq!(header(&h, "x-switchyard-served-by"), "c/other-embed");
    assert_eq!(Rig::embed_calls(&r.c).await.len(), 1);
}

#[tokio::test]
async fn token_ids_are_passed_on_and_bad_input_is_refused_naming_it() {
    let r = rig("").await;
    let tokens = json!({"model": "embed", "input": [[1, 2, 3], [4]], "encoding_format": "base64"});
    let (status, _, body) = r.embed(tokens).await;
    assert_eq!(status, 200, "{}", brief(&body));
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(body["usage"]["prompt_tokens"], 4);
    // Base64 of little-endian f32: the float answer's own bits.
    let floats = json!({"model": "embed", "input": [[1, 2, 3], [4]], "encoding_format": "float"});
    let (_, _, plain) = r.embed(floats).await;
    let vector: Vec<f32> = serde_json::from_value(plain["data"][1]["embedding"].clone()).unwrap();
    assert!(vector.iter().any(|x| *x != 0.0));
    assert_eq!(
        body["data"][1]["embedding"].as_str(),
        Some(switchyard::semantic::embed::to_base64(&vector).as_str())
    );
    let sent = Rig::embed_calls(&r.a).await;
    assert_eq!(sent[0]["body"]["input"], json!([[1, 2, 3], [4]]));
    assert_eq!(sent[0]["body"]["model"], "text-embedding-3-small");

    for (bad, param) in [
        (json!({"model": "embed", "input": {"text": "x"}}), "input"),
        (json!({"model": "embed", "input": []}), "input"),
        (json!({"model": "embed", "input": ["a", 7]}), "input[1]"),
        (
            json!({"model": "embed", "input": [[1], [-2]]}),
            "input[1][0]",
        ),
        (json!({"model": "embed", "input": ["a", ""]}), "input[1]"),
        (
            json!({"model": "embed", "input": "a", "encoding_format": "hex"}),
            "encoding_format",
        ),
        (json!({"input": "a"}), "model"),
    ] {
        let (status, _, body) = r.embed(bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert_eq!(body["error"]["param"], param, "{bad}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["code"], "INVALID_REQUEST");
    }
    assert_eq!(
        Rig::embed_calls(&r.a).await.len(),
        2,
        "no refused call went upstream"
    );

    let (status, _, body) = r.embed(json!({"model": "chat", "input": "a"})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (400, &json!("NO_CAPABLE_TARGET"))
    );
    let (status, _, body) = r.embed(json!({"model": "nope", "input": "a"})).await;
    assert_eq!(
        (status, &body["error"]["code"]),
        (404, &json!("UNKNOWN_ROUTE"))
    );
    assert_eq!(body["error"]["param"], "model");
    // A pinned target is served by that target alone.
    let (status, h, _) = r
        .embed(json!({"model": "c/other-embed", "input": "a"}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(header(&h, "x-switchyard-served-by"), "c/other-embed");
}

#[tokio::test]
async fn grpc_embed_has_the_same_semantics() {
    let r = rig("").await;
    let mut client = r.sy.client().await;
    let ask = |route: &str| proto::EmbedRequest {
        route: route.into(),
        texts: vec!["refund policy".into(), "reset my password".into()],
        dimensions: 16,
        ..Default::default()
    };
    let got = client.embed(ask("embed")).await.unwrap().into_inner();
    assert_eq!(got.embeddings.len(), 2);
    assert_eq!(got.embeddings[0].values.len(), 16);
    let by = got.served_by.unwrap();
    assert_eq!(
        (by.provider.as_str(), by.model.as_str()),
        ("a", "text-embedding-3-small")
    );
    assert_eq!(got.tier, proto::Tier::Primary as i32);
    // Priced from the model's input price: $1 a token, 5 tokens (the mock
    // counts words).
    assert_eq!(got.usage.unwrap().input_tokens, 5);
    assert!((got.cost_usd - 5.0).abs() < 1e-9, "{}", got.cost_usd);
    assert_eq!(Rig::embed_calls(&r.a).await[0]["body"]["dimensions"], 16);

    r.a.set_fault(json!({"type": "status", "status": 503}))
        .await;
    let got = client.embed(ask("embed")).await.unwrap().into_inner();
    assert_eq!(got.served_by.unwrap().provider, "b");
    assert_eq!((got.tier, got.attempts), (proto::Tier::Fallback as i32, 2));

    let e = client.embed(ask("chat")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&e), "NO_CAPABLE_TARGET");
    let e = client.embed(ask("nope")).await.unwrap_err();
    assert_eq!(
        (e.code(), reason(&e)),
        (tonic::Code::NotFound, "UNKNOWN_ROUTE".into())
    );
    let e = client
        .embed(proto::EmbedRequest {
            route: "embed".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("input"), "{}", e.message());
}

#[tokio::test]
async fn embeddings_are_held_against_the_tenants_cost_cap() {
    // $1 a token; a cap of $5: three words cost $3, and the next call's
    // hold (about 4 tokens for 16 characters) no longer fits.
    let r = rig("[cost]\ndefault_cap_usd = 5.0\n").await;
    let (status, _, body) = r
        .embed(json!({"model": "embed", "input": "alpha beta gamma"}))
        .await;
    assert_eq!(status, 200, "{}", brief(&body));
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    let (status, h, body) = r
        .embed(json!({"model": "embed", "input": "alpha beta gamma"}))
        .await;
    assert_eq!(status, 429, "{}", brief(&body));
    assert_eq!(body["error"]["code"], "COST_CAP");
    assert!(!header(&h, "retry-after").is_empty());
    assert_eq!(
        Rig::embed_calls(&r.a).await.len(),
        1,
        "refused before any upstream call"
    );
}

#[tokio::test]
async fn the_official_clients_embed_and_list_models() {
    if !python_ready(
        "openai, langchain-openai and anthropic",
        "import openai, anthropic, langchain_openai",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let r = rig("").await;
    let base_url = format!("{}/v1", r.url);
    let (out, stdout, stderr) = run_example(
        "python3",
        "examples/openai_sdk/test_embeddings.py",
        &[
            "--base-url",
            &base_url,
            "--primary",
            &format!("http://{}", r.a.addr),
            "--secondary",
            &format!("http://{}", r.b.addr),
        ],
    )
    .await;
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{stderr}\nswitchyard logs:\n{}",
        r.sy.logs()
    );
    assert_eq!(stdout.matches("PASS ").count(), 8, "{stdout}");
    assert!(Rig::embed_calls(&r.c).await.is_empty());
}
