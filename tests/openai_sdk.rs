//! The official `openai` Python SDK (examples/openai_sdk/test_sdk.py) against
//! the front door of the real binary: streaming text and tool calls, unary,
//! error classes with `max_retries=0`, a cut stream that raises, and failover
//! seen only in headers. Needs `pip install -r examples/openai_sdk/requirements.txt`;
//! skipped loudly without it, except under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;

#[tokio::test]
async fn the_official_openai_sdk_drives_the_front_door() {
    if !python_ready(
        "openai",
        "import openai",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let rig = Rig::start("", "", &[]).await;
    let base_url = format!("{}/v1", rig.http_url());
    run_sdk_script("examples/openai_sdk/test_sdk.py", &base_url, &rig, 6).await;
}
