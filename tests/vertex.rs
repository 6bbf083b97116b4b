//! Anthropic on Google Vertex AI (`kind = "vertex_anthropic"`) through the
//! real binary: the service account's RS256 JWT bearer grant to its
//! `token_uri` (a mock that verifies the signature with the fixture's public
//! key), the token cached for every request, Anthropic's SSE from
//! `:streamRawPredict`, Google's error JSON classified, and the chain
//! Claude API -> Bedrock -> Vertex failing over host by host; prompt-cache
//! markers reaching each of the three hosts whole.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::{json, Value};

const MODEL: &str = "claude-sonnet-4-5@20250929";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

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

fn vertex_provider(mock: &Mock) -> String {
    provider("vertex", "vertex_anthropic", &format!("http://{}", mock.addr), MODEL).replace(
        "first_token_timeout",
        "project = \"sy-test\"\nregion = \"us-east5\"\ncredentials_file_env = \"SY_VERTEX_SA\"\nfirst_token_timeout",
    )
}

async fn vertex_mock() -> Mock {
    let public = format!("{FIXTURES}/vertex-test-key.pub.pem");
    Mock::start_with_env("anthropic", &[], &[("MOCK_GCP_PUBLIC_KEY_FILE", &public)]).await
}

async fn grants(mock: &Mock) -> u64 {
    let v: Value = reqwest::get(format!("http://{}/_mock/tokens", mock.addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["grants"].as_u64().unwrap()
}

#[tokio::test]
async fn vertex_streams_with_one_cached_oauth_token() {
    let g = vertex_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let sa = service_account(dir.path(), &g);
    let config = format!(
        "{}{}",
        vertex_provider(&g),
        route("chat", &[&format!("vertex/{MODEL}")])
    );
    let sy = Switchyard::start_with(&config, &[("SY_VERTEX_SA", &sa)]).await;
    let mut client = sy.client().await;
    for _ in 0..3 {
        let got = stream(&mut client, request("chat")).await;
        let f = got
            .finished
            .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()));
        assert_eq!(f.served_by.unwrap().provider, "vertex");
        assert_eq!(
            got.text,
            (0..16).map(|i| format!("tok{i} ")).collect::<String>()
        );
    }
    assert_eq!(grants(&g).await, 1, "one token for every request");
    let log = g.requests().await;
    assert_eq!(log.len(), 3);
    assert_eq!(
        log[0]["path"],
        "/v1/projects/sy-test/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5%4020250929:streamRawPredict"
    );
    assert_eq!(log[0]["body"]["anthropic_version"], "vertex-2023-10-16");
    assert!(log[0]["body"].get("model").is_none());
    assert!(!sy.logs().contains("PRIVATE KEY") && !sy.logs().contains("ya29."));
}

/// The same model on its three hosts, one mock each, behind route `chat`
/// in the order Claude API, Bedrock, Vertex (with `route_head` lines such as
/// `max_attempts`), and the HTTP doors open.
struct ThreeHosts {
    claude: Mock,
    bedrock: Mock,
    vertex: Mock,
    targets: [String; 3],
    sy: Switchyard,
    _dir: tempfile::TempDir,
}

impl ThreeHosts {
    async fn start(route_head: &str) -> ThreeHosts {
        let claude = Mock::start("anthropic", &[]).await;
        let bedrock = Mock::start("anthropic", &[]).await;
        let vertex = vertex_mock().await;
        let dir = tempfile::tempdir().unwrap();
        let sa = service_account(dir.path(), &vertex);
        let bedrock_model = "anthropic.claude-sonnet-4-5-20250929-v1:0";
        let targets = [
            "claude/claude-sonnet-4-5".to_string(),
            format!("bedrock/{bedrock_model}"),
            format!("vertex/{MODEL}"),
        ];
        let config = format!(
            "[server]\nhttp_listen = \"127.0.0.1:0\"\n{}{}{}{}",
            provider(
                "claude",
                "anthropic",
                &claude.base_url(),
                "claude-sonnet-4-5"
            ),
            provider(
                "bedrock",
                "bedrock_anthropic",
                &format!("http://{}", bedrock.addr),
                bedrock_model
            )
            .replace(
                "first_token_timeout",
                "region = \"us-east-1\"\nfirst_token_timeout"
            ),
            vertex_provider(&vertex),
            route(
                "chat",
                &targets.iter().map(String::as_str).collect::<Vec<_>>()
            )
        )
        .replace(
            "\n[[routes]]\nname = \"chat\"\n",
            &format!("\n[[routes]]\nname = \"chat\"\n{route_head}"),
        );
        let sy = Switchyard::start_with(
            &config,
            &[
                ("SY_VERTEX_SA", &sa),
                ("AWS_ACCESS_KEY_ID", "AKIDSWITCHYARDTEST01"),
                (
                    "AWS_SECRET_ACCESS_KEY",
                    "wJalrXUtnFEMI/K7MDENG+bPxRfiCYSWITCHYARDKEY",
                ),
            ],
        )
        .await;
        ThreeHosts {
            claude,
            bedrock,
            vertex,
            targets,
            sy,
            _dir: dir,
        }
    }
}

#[tokio::test]
async fn the_same_model_fails_over_from_claude_api_to_bedrock_to_vertex() {
    let ThreeHosts {
        claude,
        bedrock,
        vertex: g,
        sy,
        _dir,
        ..
    } = ThreeHosts::start("max_attempts = 3\n").await;
    // The Claude API is overloaded (529), Bedrock throttles (429).
    claude
        .set_fault(json!({"type": "status", "status": 529}))
        .await;
    bedrock
        .set_fault(json!({"type": "status", "status": 429}))
        .await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    let f = got
        .finished
        .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()));
    assert_eq!(f.served_by.unwrap().provider, "vertex");
    assert_eq!(f.attempts, 3);
    assert_eq!(claude.requests().await.len(), 1);
    assert_eq!(bedrock.requests().await.len(), 1);
    assert_eq!(g.requests().await.len(), 1);

    // Vertex's own 429 (Google's error JSON) is a rate limit, not a success.
    claude.set_fault(json!({})).await;
    g.set_fault(json!({"type": "status", "status": 429})).await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    assert_eq!(got.finished.unwrap().served_by.unwrap().provider, "claude");
}

#[tokio::test]
async fn an_upstream_error_echoing_the_vertex_token_never_reaches_the_caller_or_the_logs() {
    let g = vertex_mock().await;
    let dir = tempfile::tempdir().unwrap();
    let sa = service_account(dir.path(), &g);
    let config = format!(
        "{}{}",
        vertex_provider(&g),
        route("chat", &[&format!("vertex/{MODEL}")])
    );
    let sy = Switchyard::start_with(&config, &[("SY_VERTEX_SA", &sa)]).await;
    // The mock's first grant is `ya29.mock-1`; its 400 quotes it back.
    let echo = "Request had invalid credentials: Bearer ya29.mock-1 is not valid here";
    g.set_fault(json!({"type": "status", "status": 400,
        "body": json!({"type": "error", "error": {"type": "invalid_request_error", "message": echo}}).to_string()}))
        .await;
    let mut client = sy.client().await;
    let status = client.complete(request("chat")).await.unwrap_err();
    let everything = format!("{status:?}");
    assert!(everything.contains("is not valid here"), "{everything}");
    assert!(!everything.contains("ya29.mock-1"), "{everything}");
    assert_eq!(grants(&g).await, 1);
    assert!(!sy.logs().contains("ya29."), "{}", sy.logs());
}

/// Prompt-cache markers on the system prompt, a tool and a content block
/// (one with the 1h TTL) reach the same model on each of its three hosts
/// as Anthropic wrote them: the Claude API, Bedrock and Vertex all honour
/// `cache_control`, so nothing is dropped.
#[tokio::test]
async fn cache_markers_reach_the_claude_api_bedrock_and_vertex_whole() {
    let hosts = ThreeHosts::start("").await;
    let (targets, sy) = (&hosts.targets, &hosts.sy);
    let http = reqwest::Client::new();
    for (target, mock) in targets
        .iter()
        .zip([&hosts.claude, &hosts.bedrock, &hosts.vertex])
    {
        let r = http
            .post(format!("{}/v1/messages", sy.http_url()))
            .header("anthropic-version", "2023-06-01")
            .json(&json!({
                "model": format!("chat@{target}"),
                "max_tokens": 64,
                "system": [{"type": "text", "text": "You are terse.",
                            "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
                "tools": [{"name": "lookup", "description": "Look up a word",
                           "input_schema": {"type": "object", "properties": {}},
                           "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "A long shared prefix.",
                     "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "The question."}]}],
            }))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let dropped = r
            .headers()
            .get("x-switchyard-dropped")
            .map(|v| v.to_str().unwrap().to_string());
        let served = r.headers()["x-switchyard-served-by"].clone();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 200, "{target}: {body}\n{}", sy.logs());
        assert_eq!(served, target.as_str());
        assert_eq!(dropped, None, "{target}: nothing is dropped");
        let log = mock.requests().await;
        let sent = &log.last().unwrap()["body"];
        assert_eq!(
            sent["system"][0]["cache_control"],
            json!({"type": "ephemeral", "ttl": "1h"}),
            "{target}: {sent}"
        );
        assert_eq!(
            sent["tools"][0]["cache_control"],
            json!({"type": "ephemeral"}),
            "{target}: {sent}"
        );
        let blocks = &sent["messages"][0]["content"];
        assert_eq!(
            blocks[0]["cache_control"],
            json!({"type": "ephemeral"}),
            "{target}: {sent}"
        );
        assert!(blocks[1].get("cache_control").is_none(), "{target}: {sent}");
    }
}
