//! The Python example client (examples/python) against the real binary: proves
//! a non-Rust caller can stream, call unary and read error details from the
//! proto alone. Needs `pip install -r examples/python/requirements.txt`; skipped
//! loudly without it, except under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use common::*;

fn client_py() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/python/client.py")
}

async fn run_client(sy: &Switchyard, args: &[&str]) -> (Output, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("python3")
            .arg(client_py())
            .args(["--target", &sy.grpc, "--timeout", "20"])
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("client.py finished in time")
    .expect("run client.py");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

async fn start() -> (Mock, Mock, Switchyard) {
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let config = format!(
        "{}{}{}",
        provider("primary", "openai", &a.base_url(), "gpt-4o-mini"),
        provider("secondary", "anthropic", &b.base_url(), "claude-sonnet-4-5"),
        route(
            "chat",
            &["primary/gpt-4o-mini", "secondary/claude-sonnet-4-5"]
        )
    );
    let sy = Switchyard::start(&config).await;
    (a, b, sy)
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
    let (a, _b, sy) = start().await;

    let (out, stdout, stderr) =
        run_client(&sy, &["--route", "chat", "--prompt", "Say hello."]).await;
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

    let (out, stdout, stderr) = run_client(&sy, &["--unary"]).await;
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
    let (_a, _b, sy) = start().await;
    let (out, stdout, stderr) = run_client(&sy, &["--route", "no-such-route"]).await;
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
