//! Real agents as clients of the Responses door, against the real binary
//! and a `switchyard mock-upstream` scripted to call a tool and then answer
//! with text once the tool's result comes back:
//! - the OpenAI Agents SDK (`openai-agents`, examples/openai_sdk/test_agents.py):
//!   one `Agent` with one function tool on the SDK's default model and
//!   model class (`OpenAIResponsesModel`), with `Runner.run_sync` and
//!   `Runner.run_streamed`, and on the door's stored conversation
//!   (`auto_previous_response_id`, then a next turn by `previous_response_id`);
//! - the Codex CLI (`codex exec`, examples/codex): a shell command run
//!   through Codex's `exec_command` function tool on a configured model,
//!   and through its code-mode `exec` custom tool, offered inside an
//!   `additional_tools` input item as a namespace, on its default model's
//!   request shape.
//!
//! Each asserts what the client ended with and what the upstream received:
//! the Responses input mapped to chat messages, the tools, the tool call and
//! its result. Needs `pip install -r examples/openai_sdk/requirements.txt`
//! and `npm ci --prefix examples/codex`; skipped loudly without them, except
//! under CI (`CI` set), where they fail.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::process::Command;

/// The mock's text answer (16 tokens).
fn expected_text() -> String {
    (0..16).map(|i| format!("tok{i} ")).collect()
}

/// One OpenAI-shaped mock behind three routes: `chat`, and one named after
/// each client's default model, so the clients run with their defaults.
async fn start() -> (Mock, Switchyard) {
    let mock = Mock::start("openai", &[]).await;
    let target = provider("primary", "openai", &mock.base_url(), "gpt-4o-mini").replace(
        r#"capabilities = ["chat", "stream", "tools", "json"]"#,
        r#"capabilities = ["chat", "stream", "tools", "json", "json_schema", "reasoning"]"#,
    );
    let routes: String = ["chat", "gpt-5.6-luna", "gpt-6.2-sol"]
        .iter()
        .map(|name| route(name, &["primary/gpt-4o-mini"]))
        .collect();
    let config = format!("[server]\nhttp_listen = \"127.0.0.1:0\"\n{target}{routes}");
    let sy = Switchyard::start(&config).await;
    (mock, sy)
}

/// `PUT /_mock/tools`: which tool the mock calls, with what, and text after
/// the tool's result.
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

#[tokio::test]
async fn the_agents_sdk_runs_an_agent_with_a_function_tool_through_the_door() {
    if !python_ready(
        "responses_agents (Agents SDK)",
        "import agents",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let (mock, sy) = start().await;
    let (out, stdout, stderr) = run_example(
        "python3",
        "examples/openai_sdk/test_agents.py",
        &[
            "--base-url",
            &format!("{}/v1", sy.http_url()),
            "--primary",
            &format!("http://{}", mock.addr),
        ],
    )
    .await;
    println!("{stdout}");
    assert!(
        out.status.success(),
        "agents checks failed:\n{stdout}\n{stderr}\nswitchyard logs:\n{}",
        sy.logs()
    );
    assert!(stdout.contains("default model: gpt-5.6-luna"), "{stdout}");
    assert_eq!(stdout.matches("PASS check_").count(), 3, "{stdout}");
}

/// The pinned Codex CLI from `npm ci --prefix examples/codex`, or why not.
fn codex_bin() -> Option<PathBuf> {
    let bin =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/codex/node_modules/.bin/codex");
    let why = match std::process::Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => return Some(bin),
        Ok(o) => format!("codex --version: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => format!("cannot run {}: {e}", bin.display()),
    };
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but responses_agents cannot run Codex ({why}); CI must run `npm ci --prefix examples/codex`");
    }
    eprintln!(
        "\n*** SKIP responses_agents (Codex CLI): npm ci --prefix examples/codex ({why}) ***\n"
    );
    None
}

/// Codex's config: Switchyard as its model provider (Responses wire), no
/// plugins, analytics or update checks (nothing leaves 127.0.0.1), no
/// approvals, and no retries, so a broken door fails the run at once.
fn codex_config(base_url: &str, model: &str) -> String {
    format!(
        r#"model = "{model}"
model_provider = "switchyard"
approval_policy = "never"
sandbox_mode = "danger-full-access"
check_for_update_on_startup = false

[features]
plugins = false

[analytics]
enabled = false

[model_providers.switchyard]
name = "Switchyard"
base_url = "{base_url}"
env_key = "SWITCHYARD_API_KEY"
wire_api = "responses"
stream_max_retries = 0
request_max_retries = 0
"#
    )
}

/// Runs `codex exec PROMPT` non-interactively in `work` with a fresh
/// CODEX_HOME and nothing else from the environment but PATH.
async fn codex_exec(
    bin: &Path,
    home: &Path,
    work: &Path,
    prompt: &str,
) -> (Output, String, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        Command::new(bin)
            .args(["exec", "--skip-git-repo-check", "--color", "never", prompt])
            .current_dir(work)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .env("CODEX_HOME", home)
            .env("SWITCHYARD_API_KEY", "unused-in-open-mode")
            .env("TERM", "dumb")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("codex exec finished in time")
    .expect("run codex exec");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// One `codex exec` through the door on `model` (a route), with the mock
/// scripted to call `tool` with `arguments`, which run `echo` into a file.
/// Returns the upstream's chat requests; asserts Codex ran the command and
/// printed the mock's answer.
async fn codex_round_trip(
    bin: &Path,
    mock: &Mock,
    sy: &Switchyard,
    model: &str,
    tool: &str,
    arguments: Value,
) -> Vec<Value> {
    mock.clear().await;
    script_tool_call(mock, tool, &arguments).await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let base_url = format!("{}/v1", sy.http_url());
    std::fs::write(
        home.path().join("config.toml"),
        codex_config(&base_url, model),
    )
    .unwrap();
    let prompt = "Run: echo hi-from-codex | tee proof.txt";
    let (out, stdout, stderr) = codex_exec(bin, home.path(), work.path(), prompt).await;
    let context = || {
        format!(
            "stdout:\n{stdout}\nstderr:\n{stderr}\nswitchyard logs:\n{}",
            sy.logs()
        )
    };
    assert!(
        out.status.success(),
        "codex exec on {model}: {:?}\n{}",
        out.status,
        context()
    );
    assert_eq!(stdout.trim(), expected_text().trim(), "{}", context());
    let proof = std::fs::read_to_string(work.path().join("proof.txt"));
    assert_eq!(
        proof.ok().as_deref(),
        Some("hi-from-codex\n"),
        "the tool ran: {}",
        context()
    );
    let sent: Vec<Value> = mock
        .requests()
        .await
        .into_iter()
        .filter(|r| r["path"] == "/v1/chat/completions")
        .map(|r| r["body"].clone())
        .collect();
    assert_eq!(sent.len(), 2, "one tool call, one answer: {sent:#?}");
    let first = sent[0]["messages"].as_array().unwrap();
    // Codex's developer messages became system messages, its turn the last user one.
    assert_eq!(first[0]["role"], "system", "{first:#?}");
    assert!(
        first[0]["content"].as_str().unwrap().contains("Codex"),
        "{first:#?}"
    );
    assert_eq!(
        first.last().unwrap(),
        &json!({"role": "user", "content": prompt})
    );
    // The second request is the first plus the call and its result.
    let second = sent[1]["messages"].as_array().unwrap();
    assert_eq!(second.len(), first.len() + 2, "{second:#?}");
    assert_eq!(&second[..first.len()], first.as_slice());
    let call = &second[first.len()]["tool_calls"][0];
    assert_eq!(call["function"]["name"], tool, "{call:#?}");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        args, arguments,
        "the call went back upstream as the mock made it"
    );
    let result = &second[first.len() + 1];
    assert_eq!(result["role"], "tool", "{result:#?}");
    assert_eq!(result["tool_call_id"], call["id"], "{result:#?}");
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("hi-from-codex"),
        "the command's output went back upstream: {result:#?}"
    );
    sent
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn codex_exec_runs_a_tool_round_trip_through_the_door() {
    let Some(bin) = codex_bin() else {
        return;
    };
    let (mock, sy) = start().await;

    // A configured model: top-level function tools (exec_command), beside
    // a built-in web_search tool the door leaves out.
    let cmd = json!({"cmd": "echo hi-from-codex | tee proof.txt"});
    let sent = codex_round_trip(&bin, &mock, &sy, "chat", "exec_command", cmd).await;
    let names = tool_names(&sent[0]);
    assert!(names.contains(&"exec_command".to_string()), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("web_search")), "{names:?}");

    // The default model's shape: no `tools`, an `additional_tools` input
    // item of namespaces whose `exec` is a custom (grammar) tool; the mock's
    // call comes back to Codex as a `custom_tool_call`, its JavaScript runs
    // the command, and the `custom_tool_call_output` parts go upstream.
    let js = "const r = await tools.exec_command({cmd: \"echo hi-from-codex | tee proof.txt\"}); text(r);";
    let sent = codex_round_trip(
        &bin,
        &mock,
        &sy,
        "gpt-6.2-sol",
        "functions__exec",
        json!({"input": js}),
    )
    .await;
    let names = tool_names(&sent[0]);
    assert!(names.contains(&"functions__exec".to_string()), "{names:?}");
    assert!(names.contains(&"functions__wait".to_string()), "{names:?}");
}
