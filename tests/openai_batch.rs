//! The OpenAI Batch API over the durable queue, driven by the official
//! `openai` SDK (examples/openai_sdk/test_batch.py) against the real binary:
//! a batch submitted while every provider is down, switchyard SIGKILLed,
//! restarted on the same queue file, the providers back: the batch completes
//! with every line answered exactly once. Also a cancelled batch, one whose
//! window passes, and one a bad line fails. Needs `pip install -r examples/openai_sdk/requirements.txt`;
//! skipped loudly without it, except under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn a_batch_survives_sigkill_and_an_outage_and_finishes_once() {
    if !python_ready(
        "openai_batch",
        "import openai",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let queue = dir.path().join("queue.sqlite3");
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n[queue]\npath = \"{}\"\ndrain = {{ rate = 50.0, burst = 5 }}\n{}{}{}",
        queue.display(),
        provider("primary", "openai", &a.base_url(), "gpt-4o-mini"),
        provider("secondary", "anthropic", &b.base_url(), "claude-sonnet-4-5"),
        route("chat", &["primary/gpt-4o-mini", "secondary/claude-sonnet-4-5"])
    );
    for m in [&a, &b] {
        m.set_fault(json!({"type": "status", "status": 503})).await;
    }
    let mut sy = Switchyard::start(&config).await;
    batch_phase(&sy, "invalid", &[]).await;
    let ids = dir.path().join("ids.json");
    let ids = ids.to_str().unwrap();
    batch_phase(&sy, "submit", &["--out", ids]).await;
    batch_phase(&sy, "cancel", &[]).await;
    batch_phase(&sy, "expire", &[]).await;

    // A crash with the batch's jobs queued and every provider down.
    sy.child.start_kill().unwrap();
    sy.child.wait().await.unwrap();
    for m in [&a, &b] {
        m.set_fault(json!({})).await;
        m.clear().await;
    }
    let sy = Switchyard::start(&config).await;
    batch_phase(&sy, "finish", &["--ids", ids]).await;

    // Every line answered once: one successful upstream call per line.
    let served: usize = [a.requests().await, b.requests().await]
        .iter()
        .flatten()
        .filter(|r| r["status"] == 200 && r["completed"] == true)
        .count();
    assert_eq!(served, 5, "one answer per line, none twice");
}
