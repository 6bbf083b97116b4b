//! Claude Code (the real CLI, `@anthropic-ai/claude-code` pinned in
//! examples/claude_code) through the Anthropic door: `claude -p` with its
//! default model name, routed by Switchyard to an Anthropic-shaped
//! mock-upstream, completes a tool round trip (the mock calls Bash, Claude
//! Code runs it and sends the result back with its signed thinking), and
//! the mock received Claude Code's `cache_control` markers, its
//! mid-conversation system turn and its `thinking`. Nothing leaves
//! 127.0.0.1. Needs `npm ci --prefix examples/claude_code` (or
//! `CLAUDE_CODE_BIN`); skipped loudly without it, except under CI (`CI`
//! set), where it fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::process::Command;

/// Claude Code 2.1.332's default model.
const DEFAULT_MODEL: &str = "claude-opus-5-5";

/// The pinned CLI from `npm ci --prefix examples/claude_code`, else
/// `CLAUDE_CODE_BIN`, else `claude` on PATH; or why not.
fn claude_bin() -> Option<PathBuf> {
    let pinned = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/claude_code/node_modules/.bin/claude");
    let candidates = [
        Some(pinned),
        std::env::var_os("CLAUDE_CODE_BIN").map(PathBuf::from),
        Some(PathBuf::from("claude")),
    ];
    let mut why = Vec::new();
    for bin in candidates.into_iter().flatten() {
        match std::process::Command::new(&bin).arg("--version").output() {
            Ok(o) if o.status.success() => return Some(bin),
            Ok(o) => why.push(format!(
                "{} --version: {}",
                bin.display(),
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => why.push(format!("cannot run {}: {e}", bin.display())),
        }
    }
    let why = why.join("; ");
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but claude_code cannot run Claude Code ({why}); CI must run `npm ci --prefix examples/claude_code`");
    }
    eprintln!("\n*** SKIP claude_code: npm ci --prefix examples/claude_code ({why}) ***\n");
    None
}

/// The mock calls `name` with `arguments`, and answers with text once a
/// tool result comes back.
async fn script_tool_call(mock: &Mock, name: &str, arguments: &Value) {
    let script = json!({
        "name": name,
        "arguments": arguments.to_string(),
        "text_after_result": true,
    });
    let status = reqwest::Client::new()
        .put(format!("http://{}/_mock/tools", mock.addr))
        .json(&script)
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "PUT /_mock/tools: {status}");
}

/// Runs `claude -p PROMPT` in `work` with a fresh HOME, Switchyard as its
/// Anthropic base URL, and nothing nonessential (no telemetry, updates or
/// error reports).
async fn claude_p(bin: &Path, home: &Path, work: &Path, base_url: &str, prompt: &str) -> Output {
    tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(bin)
            .args(["-p", prompt, "--allowedTools", "Bash(echo:*)"])
            .current_dir(work)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .env("TERM", "dumb")
            .env("ANTHROPIC_BASE_URL", base_url)
            .env("ANTHROPIC_API_KEY", "sk-ant-unused-in-open-mode")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            .env("CLAUDE_CODE_MAX_RETRIES", "1")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("claude -p finished in time")
    .expect("run claude -p")
}

/// Route `claude-opus-5-5` (Claude Code's default model name) to the mock.
fn config(mock: &Mock) -> String {
    format!(
        r#"[server]
http_listen = "127.0.0.1:0"

[[providers]]
id = "claude"
kind = "anthropic"
base_url = "{}"
first_token_timeout = "10s"
idle_timeout = "10s"
  [[providers.models]]
  name = "{DEFAULT_MODEL}"
  capabilities = ["chat", "stream", "tools", "vision", "pdf", "reasoning", "prompt_cache"]
  context_tokens = 1000000
{}"#,
        mock.base_url(),
        route(DEFAULT_MODEL, &[&format!("claude/{DEFAULT_MODEL}")])
    )
}

fn blocks(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn claude_code_runs_a_tool_round_trip_with_its_cache_markers_system_turn_and_thinking() {
    let Some(bin) = claude_bin() else {
        return;
    };
    let mock = Mock::start("anthropic", &[]).await;
    let sy = Switchyard::start(&config(&mock)).await;
    script_tool_call(&mock, "Bash", &json!({"command": "echo hi-from-claude"})).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = claude_p(
        &bin,
        home.path(),
        work.path(),
        &sy.http_url(),
        "Run: echo hi-from-claude",
    )
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let log = mock.requests().await;
    let context = || {
        format!(
            "stdout:\n{stdout}\nstderr:\n{stderr}\nmock log:\n{log:#?}\nswitchyard logs:\n{}",
            sy.logs()
        )
    };
    assert!(
        out.status.success(),
        "claude -p: {:?}\n{}",
        out.status,
        context()
    );
    println!("claude -p printed: {stdout}");
    // The mock's answer after the tool result is what Claude Code printed.
    assert!(stdout.contains("tok0 tok1 tok2"), "{}", context());

    let sent: Vec<&Value> = log
        .iter()
        .filter(|r| r["path"] == "/v1/messages")
        .map(|r| &r["body"])
        .collect();
    assert_eq!(sent.len(), 2, "one tool call, one answer\n{}", context());
    assert!(log.iter().all(|r| r["status"] == 200), "{}", context());
    let first = sent[0];
    assert_eq!(first["model"], DEFAULT_MODEL);
    // Its thinking ask, verbatim.
    assert_eq!(first["thinking"]["type"], "adaptive", "{first:#}");
    // Its cache markers: on system blocks and on its last turn.
    let system_markers = blocks(&first["system"])
        .iter()
        .filter(|b| b.get("cache_control").is_some())
        .count();
    assert!(system_markers >= 1, "{:#}", first["system"]);
    let messages = blocks(&first["messages"]);
    let last = messages.last().unwrap();
    assert!(
        blocks(&last["content"])
            .iter()
            .any(|b| b.get("cache_control").is_some()),
        "{last:#}"
    );
    // Its mid-conversation system turn, in place.
    assert!(
        messages.iter().any(|m| m["role"] == "system"),
        "{messages:#?}"
    );

    // Turn two: the signed thinking came back first in the tool-use turn
    // (the mock checked the signature), then the command's output.
    let second = blocks(&sent[1]["messages"]);
    let assistant = second.iter().rfind(|m| m["role"] == "assistant").unwrap();
    let content = blocks(&assistant["content"]);
    assert_eq!(content[0]["type"], "thinking", "{assistant:#}");
    assert!(
        content[0]["signature"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{assistant:#}"
    );
    assert!(
        content
            .iter()
            .any(|b| b["type"] == "tool_use" && b["name"] == "Bash"),
        "{assistant:#}"
    );
    let result = second
        .iter()
        .rev()
        .flat_map(|m| blocks(&m["content"]))
        .find(|b| b["type"] == "tool_result")
        .unwrap();
    // It ran the command: its output, not an error, went back.
    assert_ne!(result["is_error"], true, "{result:#}");
    let output = match &result["content"] {
        Value::String(s) => s.clone(),
        blocks => blocks.to_string(),
    };
    assert!(output.contains("hi-from-claude"), "{result:#}");
}
