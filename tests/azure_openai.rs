//! Azure OpenAI (`kind = "azure_openai"`) through the real binary against
//! `mock-upstream`'s Azure path, which refuses what Azure refuses (no
//! `api-version`, a key in `Authorization` instead of `api-key`): streamed
//! and unary answers at the deployment's URL, a content-filter block served
//! as an answer (no failover), and a throttled deployment failed over.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;
use switchyard::proto;

const KEY: &str = "azure-test-key-0123456789abcdef";

fn azure(base_url: &str) -> String {
    provider("azure", "azure_openai", base_url, "gpt-4o-mini").replace(
        "first_token_timeout",
        "api_version = \"2024-10-21\"\napi_key_env = \"SY_AZURE_KEY\"\nfirst_token_timeout",
    )
}

async fn start() -> (Mock, Mock, Switchyard) {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let config = format!(
        "{}{}{}",
        azure(&format!("http://{}", a.addr)),
        provider("secondary", "anthropic", &b.base_url(), "claude-sonnet-4-5"),
        route(
            "chat",
            &["azure/gpt-4o-mini", "secondary/claude-sonnet-4-5"]
        )
    );
    let sy = Switchyard::start_with(&config, &[("SY_AZURE_KEY", KEY)]).await;
    (a, b, sy)
}

#[tokio::test]
async fn azure_deployments_stream_and_answer_with_the_api_key_header() {
    let (a, b, sy) = start().await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    let f = got
        .finished
        .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()));
    assert_eq!(f.served_by.unwrap().provider, "azure");
    assert_eq!(
        got.text,
        (0..16).map(|i| format!("tok{i} ")).collect::<String>()
    );
    let unary = client.complete(request("chat")).await.unwrap().into_inner();
    assert_eq!(unary.finish_reason, proto::FinishReason::Stop as i32);
    let log = a.requests().await;
    assert_eq!(log.len(), 2);
    for r in &log {
        assert_eq!(
            r["path"],
            "/openai/deployments/gpt-4o-mini/chat/completions"
        );
        assert_eq!(r["status"], 200, "{r}");
        assert!(
            r["body"].get("model").is_none(),
            "the deployment names the model: {r}"
        );
    }
    assert!(b.requests().await.is_empty());
    assert!(!sy.logs().contains(KEY), "the key never reaches a log");
}

#[tokio::test]
async fn a_content_filter_block_is_an_answer_not_a_failover() {
    let (a, b, sy) = start().await;
    a.set_fault(json!({"type": "status", "preset": "content_filter"}))
        .await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
    assert_eq!(f.finish_reason, proto::FinishReason::ContentFilter as i32);
    assert_eq!(f.served_by.unwrap().provider, "azure");
    assert_eq!(f.attempts, 1);
    assert!(got.text.is_empty());
    assert!(
        b.requests().await.is_empty(),
        "no failover for a filtered prompt"
    );
}

#[tokio::test]
async fn a_throttled_deployment_fails_over() {
    let (a, b, sy) = start().await;
    a.set_fault(json!({"type": "status", "status": 429, "headers": {"retry-after": "3"}}))
        .await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
    assert_eq!(f.served_by.unwrap().provider, "secondary");
    assert_eq!(a.requests().await.len(), 1, "the deployment was tried once");
    assert_eq!(b.requests().await.len(), 1);
}

#[tokio::test]
async fn a_bad_azure_config_is_refused_with_its_field() {
    let no_version = azure("http://127.0.0.1:9").replace("api_version = \"2024-10-21\"\n", "");
    let text = check_config_refuses(&format!(
        "{no_version}{}",
        route("chat", &["azure/gpt-4o-mini"])
    ));
    assert!(text.contains("providers[0].api_version"), "{text}");
}
