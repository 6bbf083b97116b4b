//! Anthropic on Amazon Bedrock (`kind = "bedrock_anthropic"`) through the
//! real binary against `mock-upstream`'s Bedrock path, which recomputes the
//! SigV4 signature with AWS's signer and answers in the binary AWS event
//! stream (CRCs included): a streamed answer, a unary one, a mid-stream
//! exception that is never a success, throttling failed over to the next
//! host of the same model, and credentials that never reach a log.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;
use switchyard::proto;

const AKID: &str = "AKIDSWITCHYARDTEST01";
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYSWITCHYARDKEY";
const MODEL: &str = "anthropic.claude-sonnet-4-5-20250929-v1:0";

async fn start(secret_for_switchyard: &str) -> (Mock, Mock, Switchyard) {
    let bedrock =
        Mock::start_with_env("anthropic", &[], &[("MOCK_AWS_SECRET_ACCESS_KEY", SECRET)]).await;
    let claude = Mock::start("anthropic", &[]).await;
    let config = format!(
        "{}{}{}",
        provider(
            "bedrock",
            "bedrock_anthropic",
            &format!("http://{}", bedrock.addr),
            MODEL
        )
        .replace(
            "first_token_timeout",
            "region = \"us-east-1\"\nfirst_token_timeout"
        ),
        provider(
            "vertex",
            "anthropic",
            &claude.base_url(),
            "claude-sonnet-4-5"
        ),
        route(
            "chat",
            &[&format!("bedrock/{MODEL}"), "vertex/claude-sonnet-4-5"]
        )
    );
    let sy = Switchyard::start_with(
        &config,
        &[
            ("AWS_ACCESS_KEY_ID", AKID),
            ("AWS_SECRET_ACCESS_KEY", secret_for_switchyard),
        ],
    )
    .await;
    (bedrock, claude, sy)
}

#[tokio::test]
async fn a_signed_bedrock_stream_is_a_complete_answer() {
    let (bedrock, claude, sy) = start(SECRET).await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    let f = got
        .finished
        .unwrap_or_else(|| panic!("{:?}\n{}", got.status, sy.logs()));
    assert_eq!(f.served_by.unwrap().provider, "bedrock");
    assert_eq!(f.finish_reason, proto::FinishReason::Stop as i32);
    assert_eq!(
        got.text,
        (0..16).map(|i| format!("tok{i} ")).collect::<String>()
    );
    let unary = client.complete(request("chat")).await.unwrap().into_inner();
    assert_eq!(unary.text, got.text);
    let log = bedrock.requests().await;
    assert_eq!(log.len(), 2);
    assert_eq!(
        log[0]["path"],
        "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"
    );
    assert_eq!(log[0]["body"]["anthropic_version"], "bedrock-2023-05-31");
    assert!(log[0]["body"].get("model").is_none() && log[0]["body"].get("stream").is_none());
    assert!(claude.requests().await.is_empty());
    let logs = sy.logs();
    assert!(
        !logs.contains(SECRET) && !logs.contains("Signature="),
        "no secret or signature logged"
    );
}

#[tokio::test]
async fn a_wrong_signature_is_refused_and_fails_over() {
    // Switchyard signs with another secret: the mock's recomputed signature differs.
    let (bedrock, claude, sy) = start("not-the-secret-not-the-secret-000").await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
    assert_eq!(f.served_by.unwrap().provider, "vertex");
    assert_eq!(bedrock.requests().await.len(), 0, "refused before the log");
    assert_eq!(claude.requests().await.len(), 1);
}

#[tokio::test]
async fn a_mid_stream_exception_is_never_a_success() {
    let (bedrock, claude, sy) = start(SECRET).await;
    // Output first, then `event: error` re-framed as a modelStreamErrorException.
    bedrock
        .set_fault(json!({"type": "error_event", "after_tokens": 3, "error_type": "api_error"}))
        .await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    let status = got.status.expect("the stream failed after output");
    assert_ne!(status.code(), tonic::Code::Ok);
    assert!(got.finished.is_none(), "never a clean finish");
    assert!(
        !got.text.is_empty(),
        "the tokens before the exception were forwarded"
    );
    assert_eq!(bedrock.requests().await.len(), 1);
    let _ = claude;
}

#[tokio::test]
async fn bedrock_throttling_fails_over_to_the_same_model_elsewhere() {
    let (bedrock, claude, sy) = start(SECRET).await;
    bedrock
        .set_fault(json!({"type": "status", "status": 429}))
        .await;
    let got = stream(&mut sy.client().await, request("chat")).await;
    let f = got.finished.unwrap_or_else(|| panic!("{:?}", got.status));
    assert_eq!(f.served_by.unwrap().provider, "vertex");
    assert_eq!(bedrock.requests().await.len(), 1, "Bedrock tried once");
    assert_eq!(claude.requests().await.len(), 1);
}
