//! The official `openai` Python SDK's Responses API
//! (examples/openai_sdk/test_responses.py `checks`) against the real binary
//! on one replica with the embedded store and a SQLite queue: unary and
//! typed streams in OpenAI's order with sequence numbers, the SDK's stream
//! helper, a function tool round trip, failover seen only in headers, a
//! stream that fails after its output ended, a background response polled,
//! streamed from an event on and cancelled, refusals naming the parameter,
//! structured output and passthrough, each asserted on what the mock
//! received. Needs `pip install -r examples/openai_sdk/requirements.txt`;
//! skipped loudly without it, except under CI (`CI` set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;

#[tokio::test]
async fn the_openai_sdk_speaks_the_responses_api_through_the_door() {
    if !python_ready(
        "responses_door",
        "import openai",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let head = format!(
        "[queue]\npath = \"{}\"\n",
        dir.path().join("queue.sqlite3").display()
    );
    // Both targets can reason and answer to a schema: the checks ask for both.
    let capable = |p: String| {
        p.replace(
            r#"capabilities = ["chat", "stream", "tools", "json"]"#,
            r#"capabilities = ["chat", "stream", "tools", "json", "json_schema", "reasoning"]"#,
        )
    };
    let primary = Mock::start("openai", &[]).await;
    let secondary = Mock::start("anthropic", &[]).await;
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{head}{}{}{}",
        capable(provider(
            "primary",
            "openai",
            &primary.base_url(),
            "gpt-4o-mini"
        )),
        capable(provider(
            "secondary",
            "anthropic",
            &secondary.base_url(),
            "claude-sonnet-4-5"
        )),
        route(
            "chat",
            &["primary/gpt-4o-mini", "secondary/claude-sonnet-4-5"]
        )
    );
    let sy = Switchyard::start(&config).await;
    let rig = Rig {
        primary,
        secondary,
        sy,
    };
    let base_url = format!("{}/v1", rig.http_url());
    let (primary, secondary) = (
        format!("http://{}", rig.primary.addr),
        format!("http://{}", rig.secondary.addr),
    );
    let (out, stdout, stderr) = run_example(
        "python3",
        "examples/openai_sdk/test_responses.py",
        &[
            "checks",
            "--base-url",
            &base_url,
            "--primary",
            &primary,
            "--secondary",
            &secondary,
        ],
    )
    .await;
    println!("{stdout}");
    assert!(
        out.status.success(),
        "checks failed:\n{stdout}\n{stderr}\nswitchyard logs:\n{}",
        rig.sy.logs()
    );
    assert_eq!(stdout.matches("PASS check_").count(), 9, "{stdout}");
}
