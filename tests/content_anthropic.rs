//! The content model through the real binary on the Anthropic side: what a
//! target's wire left out reaches the caller (`x-switchyard-dropped` in the
//! gRPC initial metadata and the HTTP headers, `Finished.dropped`).
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
