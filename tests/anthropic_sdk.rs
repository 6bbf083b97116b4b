//! The official `anthropic` Python SDK (examples/anthropic_sdk/test_sdk.py)
//! against the Anthropic Messages door of the real binary: streaming text,
//! streaming tool use (the SDK parses the tool input), unary, count_tokens,
//! errors with `max_retries=0`, a cut stream that raises, and failover seen
//! only in headers. Needs `pip install -r examples/anthropic_sdk/requirements.txt`;
//! skipped loudly without it, except under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;

#[tokio::test]
async fn the_official_anthropic_sdk_drives_the_messages_door() {
    if !python_ready(
        "anthropic",
        "import anthropic",
        "examples/anthropic_sdk/requirements.txt",
    ) {
        return;
    }
    let rig = Rig::start("", "", &[]).await;
    run_sdk_script(
        "examples/anthropic_sdk/test_sdk.py",
        &rig.http_url(),
        &rig,
        6,
    )
    .await;
}
