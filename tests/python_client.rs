//! The Python example client (examples/python) against the real binary: proves
//! a non-Rust caller can stream, call unary and read error details from the
//! proto alone. Needs `pip install -r examples/python/requirements.txt`; skipped
//! loudly without it, except under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Output;

use common::*;

async fn run_client(sy: &Switchyard, args: &[&str]) -> (Output, String, String) {
    let mut all = vec!["--target", &sy.grpc, "--timeout", "20"];
    all.extend_from_slice(args);
    run_example("python3", "examples/python/client.py", &all).await
}

/// Route `chat`: an OpenAI-shaped primary, then an Anthropic-shaped secondary.
async fn start() -> Rig {
    Rig::start("", "", &[]).await
}

#[tokio::test]
async fn python_client_streams_and_calls_unary() {
    if !python_ready(
        "python_client",
        "import grpc, grpc_tools, grpc_status, google.rpc.error_details_pb2",
        "examples/python/requirements.txt",
    ) {
        return;
    }
    let rig = start().await;
    let (a, _b, sy) = (&rig.primary, &rig.secondary, &rig.sy);

    let (out, stdout, stderr) =
        run_client(sy, &["--route", "chat", "--prompt", "Say hello."]).await;
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let mut lines = stdout.lines();
    let text = lines.next().unwrap_or_default();
    let summary = lines.next().unwrap_or_default();
    assert!(text.contains("tok0"), "streamed text arrived: {stdout}");
    for want in [
        "served_by=primary/gpt-4o-mini",
        "tier=TIER_PRIMARY",
        "finish=FINISH_REASON_STOP",
        "attempts=1",
    ] {
        assert!(summary.contains(want), "summary lacks {want}: {stdout}");
    }
    assert_eq!(
        a.requests().await.len(),
        1,
        "one upstream call for the stream"
    );

    let (out, stdout, stderr) = run_client(sy, &["--unary"]).await;
    assert!(
        out.status.success(),
        "unary exit {:?}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("tok0"), "{stdout}");
    assert!(stdout.contains("finish=FINISH_REASON_STOP"), "{stdout}");
    assert!(stdout.contains("served_by=primary/gpt-4o-mini"), "{stdout}");
}

#[tokio::test]
async fn python_client_reports_unknown_route() {
    if !python_ready(
        "python_client",
        "import grpc, grpc_tools, grpc_status, google.rpc.error_details_pb2",
        "examples/python/requirements.txt",
    ) {
        return;
    }
    let rig = start().await;
    let (_a, _b, sy) = (&rig.primary, &rig.secondary, &rig.sy);
    let (out, stdout, stderr) = run_client(sy, &["--route", "no-such-route"]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stderr.contains("error: NOT_FOUND:"), "{stderr}");
    assert!(
        stderr.contains("reason=UNKNOWN_ROUTE"),
        "ErrorInfo decoded: {stderr}"
    );
    assert!(!stdout.contains("served_by="), "{stdout}");
}
