//! The official `openai` Python SDK (examples/openai_sdk/test_sdk.py) against
//! the front door of the real binary: streaming text and tool calls, unary,
//! error classes with `max_retries=0`, a cut stream that raises, and failover
//! seen only in headers. Needs `pip install -r examples/openai_sdk/requirements.txt`;
//! skipped loudly without it, except under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

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
    let a = Mock::start("openai", &[]).await;
    let b = Mock::start("anthropic", &[]).await;
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{}{}{}",
        provider("primary", "openai", &a.base_url(), "gpt-4o-mini"),
        provider("secondary", "anthropic", &b.base_url(), "claude-sonnet-4-5"),
        route(
            "chat",
            &["primary/gpt-4o-mini", "secondary/claude-sonnet-4-5"]
        )
    );
    let sy = Switchyard::start(&config).await;
    let banner = sy
        .stdout
        .lock()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    let http = banner
        .split_whitespace()
        .find_map(|w| w.strip_prefix("http="))
        .unwrap_or_else(|| panic!("no http= in banner: {banner}"))
        .to_string();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/openai_sdk/test_sdk.py");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("python3")
            .arg(script)
            .args(["--base-url", &format!("http://{http}/v1")])
            .args(["--primary", &format!("http://{}", a.addr)])
            .args(["--secondary", &format!("http://{}", b.addr)])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("test_sdk.py finished in time")
    .expect("run test_sdk.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "test_sdk.py failed:\n{stdout}\n{stderr}\nswitchyard logs:\n{}",
        sy.logs()
    );
    assert_eq!(stdout.matches("PASS ").count(), 6, "{stdout}");
}
