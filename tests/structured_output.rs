//! Structured-output clients through the real binary, answered by mocks that
//! honour the schema: LangChain's `ChatOpenAI.with_structured_output(...,
//! method="json_schema")` and `ChatAnthropic.with_structured_output` (a forced
//! tool, and `output_config.format`), and the Vercel AI SDK's `generateObject`
//! on the openai provider (Chat Completions and the Responses API) and the
//! anthropic provider (its JSON tool, and `output_config.format`). Each returns a parsed object; the scripts in
//! examples/structured_output also assert on what the mocks received.
//! Needs `pip install -r examples/structured_output/requirements.txt` and
//! `npm ci --prefix examples/structured_output`; skipped loudly without them,
//! except under CI (`CI` set), where they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;

use common::*;

/// An OpenAI-shaped `primary` whose model takes JSON Schemas (route
/// `schema_openai`) and an Anthropic-shaped `secondary`, likewise (route
/// `schema_anthropic`), with the HTTP doors on.
async fn rig() -> Rig {
    let primary = Mock::start("openai", &[]).await;
    let secondary = Mock::start("anthropic", &[]).await;
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n{}{}{}{}",
        provider("oa", "openai", &primary.base_url(), "gpt-4o-mini")
            .replace(r#""json"]"#, r#""json", "json_schema"]"#),
        provider(
            "an",
            "anthropic",
            &secondary.base_url(),
            "claude-sonnet-4-5"
        )
        .replace(r#""json"]"#, r#""json", "json_schema"]"#),
        route("schema_openai", &["oa/gpt-4o-mini"]),
        route("schema_anthropic", &["an/claude-sonnet-4-5"]),
    );
    let sy = Switchyard::start(&config).await;
    Rig {
        primary,
        secondary,
        sy,
    }
}

#[tokio::test]
async fn langchain_structured_output_returns_parsed_objects_on_both_doors() {
    if !python_ready(
        "structured_output (LangChain)",
        "import langchain_openai, langchain_anthropic",
        "examples/structured_output/requirements.txt",
    ) {
        return;
    }
    let rig = rig().await;
    run_sdk_script(
        "examples/structured_output/test_langchain.py",
        &rig.http_url(),
        &rig,
        3,
    )
    .await;
}

/// True when `node` runs and the example's packages are installed; else
/// fails under CI or prints a loud SKIPPED notice.
fn ai_sdk_ready() -> bool {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/structured_output");
    let why = match std::process::Command::new("node").arg("--version").output() {
        Err(e) => format!("cannot run node: {e}"),
        Ok(o) if !o.status.success() => "node --version failed".to_string(),
        Ok(_) if !dir.join("node_modules/ai").is_dir() => {
            "examples/structured_output/node_modules is missing".to_string()
        }
        Ok(_) => return true,
    };
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but the AI SDK test cannot run ({why}); CI must run `npm ci --prefix examples/structured_output`");
    }
    eprintln!("\n*** SKIPPED structured_output (AI SDK): npm ci --prefix examples/structured_output ({why}) ***\n");
    false
}

#[tokio::test]
async fn ai_sdk_generate_object_returns_parsed_objects_on_both_providers() {
    if !ai_sdk_ready() {
        return;
    }
    let rig = rig().await;
    let (out, stdout, stderr) = run_example(
        "node",
        "examples/structured_output/test_ai_sdk.mjs",
        &[
            "--base-url",
            &rig.http_url(),
            "--primary",
            &format!("http://{}", rig.primary.addr),
            "--secondary",
            &format!("http://{}", rig.secondary.addr),
        ],
    )
    .await;
    println!("{stdout}");
    assert!(
        out.status.success(),
        "test_ai_sdk.mjs failed:\n{stdout}\n{stderr}\nswitchyard logs:\n{}",
        rig.sy.logs()
    );
    assert_eq!(stdout.matches("PASS ").count(), 4, "{stdout}");
}
