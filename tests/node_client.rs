//! The Node.js example client (examples/node: @grpc/grpc-js and
//! @grpc/proto-loader) against the real binary: a second language streams,
//! calls unary, sees a failover in `Finished`, and decodes
//! `google.rpc.ErrorInfo` from the status details, from the proto alone.
//! Needs `npm ci --prefix examples/node`; skipped loudly without it, except
//! under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::*;
use serde_json::json;

fn example_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/node")
}

/// `node` runs and the example's packages are installed.
fn node_ready() -> bool {
    let why = match std::process::Command::new("node").arg("--version").output() {
        Err(e) => format!("cannot run node: {e}"),
        Ok(o) if !o.status.success() => "node --version failed".to_string(),
        Ok(_) if !example_dir().join("node_modules/@grpc/grpc-js").is_dir() => {
            "examples/node/node_modules is missing".to_string()
        }
        Ok(_) => return true,
    };
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but node_client cannot run ({why}); CI must run `npm ci --prefix examples/node`");
    }
    eprintln!("\n*** SKIPPED node_client: npm ci --prefix examples/node ({why}) ***\n");
    false
}

async fn run_client(sy: &Switchyard, args: &[&str]) -> (Output, String, String) {
    let mut all = vec!["--target", &sy.grpc, "--timeout", "20"];
    all.extend_from_slice(args);
    run_example("node", "examples/node/client.js", &all).await
}

/// Route `chat`: an OpenAI-shaped primary, then an Anthropic-shaped secondary.
async fn start() -> Rig {
    Rig::start("", "", &[]).await
}

fn assert_ok(out: &Output, stdout: &str, stderr: &str) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
}

#[tokio::test]
async fn node_client_streams_and_calls_unary() {
    if !node_ready() {
        return;
    }
    let rig = start().await;
    let (a, b, sy) = (&rig.primary, &rig.secondary, &rig.sy);

    let (out, stdout, stderr) =
        run_client(sy, &["--route", "chat", "--prompt", "Say hello."]).await;
    assert_ok(&out, &stdout, &stderr);
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
    assert_eq!(a.requests().await.len(), 1, "one upstream call");
    assert_eq!(b.requests().await.len(), 0);

    let (out, stdout, stderr) = run_client(sy, &["--unary"]).await;
    assert_ok(&out, &stdout, &stderr);
    assert!(stdout.contains("tok0"), "{stdout}");
    assert!(stdout.contains("finish=FINISH_REASON_STOP"), "{stdout}");
    assert!(stdout.contains("served_by=primary/gpt-4o-mini"), "{stdout}");
    assert_eq!(a.requests().await.len(), 2);
}

#[tokio::test]
async fn node_client_sees_the_failover_in_finished() {
    if !node_ready() {
        return;
    }
    let rig = start().await;
    let (a, b, sy) = (&rig.primary, &rig.secondary, &rig.sy);
    a.set_fault(json!({"type": "status", "status": 503})).await;
    let (out, stdout, stderr) = run_client(sy, &[]).await;
    assert_ok(&out, &stdout, &stderr);
    assert!(
        stdout.contains("served_by=secondary/claude-sonnet-4-5"),
        "{stdout}"
    );
    assert!(stdout.contains("attempts=2"), "{stdout}");
    assert_eq!(a.requests().await.len(), 1, "the primary tried once");
    assert_eq!(b.requests().await.len(), 1);
}

#[tokio::test]
async fn node_client_decodes_error_info() {
    if !node_ready() {
        return;
    }
    let rig = start().await;
    let (a, b, sy) = (&rig.primary, &rig.secondary, &rig.sy);
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

    // Every target refuses: the reason and its metadata arrive in the details.
    a.set_fault(json!({"type": "status", "status": 503})).await;
    b.set_fault(json!({"type": "status", "status": 503})).await;
    let (out, stdout, stderr) = run_client(sy, &[]).await;
    assert_eq!(
        out.status.code(),
        Some(1),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(stderr.contains("error: UNAVAILABLE:"), "{stderr}");
    assert!(
        stderr.contains("reason=UPSTREAM_"),
        "ErrorInfo decoded: {stderr}"
    );
    for key in ["attempts=", "provider=", "outcome=overloaded"] {
        assert!(
            stderr.contains(key),
            "ErrorInfo metadata decoded ({key}): {stderr}"
        );
    }
}
