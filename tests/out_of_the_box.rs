//! `switchyard serve` as a new user runs it: without a config it also opens
//! the OpenAI and Anthropic HTTP doors (127.0.0.1:8080, or `--http-listen`),
//! whose chat, messages, embeddings and model list answer from the built-in
//! mocks; the start line prints every listener; `--http-listen` opens the
//! doors for a config that has none.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

async fn post(url: &str, body: Value, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut r = reqwest::Client::new().post(url).json(&body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// `switchyard` with these arguments, and the start line it printed.
async fn serve(args: &[&str]) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("a start line in time")
        .unwrap()
        .expect("serve exited before its start line");
    (child, line)
}

fn field<'a>(banner: &'a str, name: &str) -> &'a str {
    banner
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {banner}"))
}

#[tokio::test]
async fn serve_without_a_config_answers_on_the_http_doors() {
    let sy = Switchyard::start_default(&[]).await;
    let banner = sy
        .stdout
        .lock()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert!(banner.starts_with("switchyard serving grpc="), "{banner}");
    for name in ["grpc", "admin", "http"] {
        assert!(field(&banner, name).starts_with("127.0.0.1:"), "{banner}");
    }
    let url = sy.http_url();
    let hello = json!([{"role": "user", "content": "Say hello."}]);

    let (status, v) = post(
        &format!("{url}/v1/chat/completions"),
        json!({"model": "chat", "messages": hello, "max_tokens": 64}),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert!(!v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());

    let (status, v) = post(
        &format!("{url}/v1/messages"),
        json!({"model": "chat", "messages": hello, "max_tokens": 64}),
        &[("anthropic-version", "2023-06-01")],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["type"], "message");

    let (status, v) = post(
        &format!("{url}/v1/embeddings"),
        json!({"model": "embed", "input": "hello world"}),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["model"], "text-embedding-3-small");
    assert!(!v["data"][0]["embedding"].as_array().unwrap().is_empty());

    let list: Value = reqwest::get(format!("{url}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"chat") && ids.contains(&"embed"), "{ids:?}");
}

#[tokio::test]
async fn without_the_flag_the_doors_listen_on_8080() {
    // Only when the port is free here: the machine's, not the test's, to give.
    match std::net::TcpListener::bind("127.0.0.1:8080") {
        Ok(probe) => drop(probe),
        Err(e) => {
            eprintln!("\n*** SKIPPED without_the_flag_the_doors_listen_on_8080: 127.0.0.1:8080 is taken ({e}) ***\n");
            return;
        }
    }
    let (_child, banner) = serve(&[
        "serve",
        "--grpc-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .await;
    assert_eq!(field(&banner, "http"), "127.0.0.1:8080", "{banner}");
    let r = reqwest::get("http://127.0.0.1:8080/v1/models")
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn the_flag_opens_the_doors_for_a_config_without_them() {
    let mock = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("p", "openai", &mock.base_url(), "gpt-4o-mini"),
        route("chat", &["p/gpt-4o-mini"])
    );
    let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(file.path(), config).unwrap();
    let path = file.path().to_str().unwrap();
    let common = [
        "serve",
        "--config",
        path,
        "--grpc-listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ];
    // The config has no `http_listen`: no HTTP door, and the start line says so.
    let (child, banner) = serve(&common).await;
    assert!(!banner.contains("http="), "{banner}");
    drop(child);
    let mut args = common.to_vec();
    args.extend(["--http-listen", "127.0.0.1:0"]);
    let (_child, banner) = serve(&args).await;
    let (status, v) = post(
        &format!("http://{}/v1/chat/completions", field(&banner, "http")),
        json!({"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}),
        &[],
    )
    .await;
    assert_eq!(status, 200, "{v}");
}
