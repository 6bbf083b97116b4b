//! One upstream attempt (`switchyard::attempt::run`) against a real
//! mock-upstream on loopback: a whole stream, each failure's outcome class,
//! the caller's deadline, and a caller that left. (These were the attempt
//! module's unit tests; the mock is its own crate now, which the server
//! library does not link.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use switchyard::attempt::{run, AttemptEnd, AttemptInput, AttemptResult};
use switchyard::chat::{ChatMessage, ChatRequest, FinishReason};
use switchyard::policy::outcome::OutcomeClass;
use switchyard::sink::{Event, EventSink, Started, Tier};
use switchyard::upstream::endpoint::Endpoint;
use switchyard_mock::{self as mock, MockArgs, MockHandle};
use tokio::sync::mpsc;
use tokio::time::Instant;

async fn mock_with(fault: &str) -> MockHandle {
    mock::start(MockArgs {
        fault: (!fault.is_empty()).then(|| fault.to_string()),
        ..MockArgs::default()
    })
    .await
    .unwrap()
}

fn endpoint(mock: &MockHandle) -> Endpoint {
    let config = switchyard::config::Config::from_toml_str(&format!(
        r#"
[[providers]]
id = "p"
kind = "openai"
base_url = "{}"
first_token_timeout = "300ms"
idle_timeout = "300ms"
  [[providers.models]]
  name = "m"
[[routes]]
name = "chat"
targets = ["p/m"]
"#,
        mock.base_url()
    ))
    .unwrap();
    Endpoint::new(&config.providers[0]).unwrap()
}

fn chat() -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        messages: vec![ChatMessage {
            role: "user".into(),
            content: "hi".into(),
            ..Default::default()
        }]
        .into(),
        max_tokens: Some(64),
        stream: true,
        ..Default::default()
    }
}

/// Runs one attempt against `mock`; returns the end and the caller's events.
async fn attempt(mock: &MockHandle, within: Duration) -> (AttemptResult, EventSink, Vec<Event>) {
    attempt_for(mock, within, true).await
}

/// [`attempt`]; `caller_stays: false` hangs the caller up first.
async fn attempt_for(
    mock: &MockHandle,
    within: Duration,
    caller_stays: bool,
) -> (AttemptResult, EventSink, Vec<Event>) {
    let ep = endpoint(mock);
    let (tx, rx) = mpsc::channel(64);
    let mut rx = caller_stays.then_some(rx);
    let mut sink = EventSink::new(tx, switchyard::sink::Delivery::Resettable);
    sink.begin_attempt(Started {
        provider: "p".into(),
        model: "m".into(),
        attempt: 1,
        tier: Tier::Primary,
        request_id: "r".into(),
        dropped: Vec::new(),
        resume_token: None,
    });
    let chat = chat();
    let result = run(
        AttemptInput {
            endpoint: &ep,
            chat: &chat,
            deadline: Instant::now() + within,
            attempt: 1,
            key: None,
            admit: None,
        },
        &mut sink,
    )
    .await;
    let mut events = Vec::new();
    while let Some(Ok((_, Ok(e)))) = rx.as_mut().map(|rx| rx.try_recv()) {
        events.push(e);
    }
    (result, sink, events)
}

#[tokio::test]
async fn a_whole_stream_completes_and_its_chunks_reach_the_caller() {
    let m = mock_with("").await;
    let (r, sink, events) = attempt(&m, Duration::from_secs(5)).await;
    match &r.end {
        AttemptEnd::Completed(c) => assert_eq!(c.finish_reason, FinishReason::Stop),
        other => panic!("{other:?}"),
    }
    assert!(r.ttft.is_some());
    assert_eq!(sink.attempt_chunks(), 16, "the mock's 16 tokens");
    assert!(matches!(events[0], Event::Started(_)));
    assert_eq!(events.len(), 17);
    assert_eq!(m.requests().len(), 1);
}

#[tokio::test]
async fn each_failure_ends_in_one_class() {
    let rows = [
        (
            r#"{"type":"status","status":503}"#,
            OutcomeClass::Overloaded,
            0,
        ),
        (
            r#"{"type":"status","status":500}"#,
            OutcomeClass::ServerError,
            0,
        ),
        (
            r#"{"type":"status","status":429}"#,
            OutcomeClass::RateLimited,
            0,
        ),
        (
            r#"{"type":"slow_first_token","delay_ms":2000}"#,
            OutcomeClass::Timeout,
            0,
        ),
        (
            r#"{"type":"abort","after_tokens":3}"#,
            OutcomeClass::Truncated,
            3,
        ),
        (
            r#"{"type":"stall","after_tokens":2}"#,
            OutcomeClass::Timeout,
            2,
        ),
        (r#"{"type":"no_terminator"}"#, OutcomeClass::Truncated, 16),
    ];
    for (fault, class, chunks) in rows {
        let m = mock_with(fault).await;
        let (r, sink, _) = attempt(&m, Duration::from_secs(5)).await;
        match &r.end {
            AttemptEnd::Failed(f) => assert_eq!(f.class, class, "{fault}: {f:?}"),
            other => panic!("{fault}: {other:?}"),
        }
        assert_eq!(sink.attempt_chunks(), chunks, "{fault}");
    }
}

#[tokio::test]
async fn the_callers_deadline_ends_the_attempt_as_its_own_outcome() {
    let m = mock_with(r#"{"type":"hang"}"#).await;
    let (r, _, events) = attempt(&m, Duration::from_millis(100)).await;
    assert_eq!(r.end, AttemptEnd::DeadlineExceeded);
    assert_eq!(
        r.end.class(),
        OutcomeClass::Cancelled,
        "not the provider's fault"
    );
    assert!(events.is_empty());
}

#[tokio::test]
async fn a_caller_that_left_drops_the_upstream_call() {
    let m = mock::start(MockArgs {
        token_delay_ms: 20,
        ..MockArgs::default()
    })
    .await
    .unwrap();
    let (r, _, _) = attempt_for(&m, Duration::from_secs(5), false).await;
    assert_eq!(r.end, AttemptEnd::ClientGone);
}
