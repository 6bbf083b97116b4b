//! Stored and background responses across a fleet: two replicas of the real
//! binary on one `redis-server`, tokens auth with two tenants, driven by the
//! official `openai` Python SDK (examples/openai_sdk/test_responses.py
//! phases). A response stored through replica A is continued with
//! `previous_response_id` and read through replica B; the other tenant gets
//! `previous_response_not_found` and 404s; a background response whose
//! stream was left on A is streamed from the next event on B. Needs
//! redis-server and the SDK; skipped loudly without them, except under CI.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;

const TOKENS: &str = "team-a:aaaaaaaaaaaaaaaaaaaaaaaa,team-b:bbbbbbbbbbbbbbbbbbbbbbbb";
const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbb";

async fn replica(mock: &Mock, redis: &RedisServer, dir: &std::path::Path) -> Switchyard {
    let config = format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n[state]\nbackend = \"redis\"\n[queue]\npath = \"{}\"\n{}{}",
        dir.join("queue.sqlite3").display(),
        provider("p", "openai", &mock.base_url(), "m"),
        route("chat", &["p/m"])
    );
    Switchyard::start_with(
        &config,
        &[
            ("SY_TEST_TOKENS", TOKENS),
            ("SWITCHYARD_REDIS_URL", redis.url().as_str()),
        ],
    )
    .await
}

async fn phase(sy: &Switchyard, name: &str, key: &str, extra: &[&str]) {
    let base = format!("{}/v1", sy.http_url());
    let mut args = vec![name, "--base-url", &base, "--api-key", key];
    args.extend_from_slice(extra);
    let (out, stdout, stderr) =
        run_example("python3", "examples/openai_sdk/test_responses.py", &args).await;
    assert!(
        out.status.success() && stdout.contains(&format!("PASS {name}")),
        "phase {name}:\n{stdout}\n{stderr}\nswitchyard logs:\n{}",
        sy.logs()
    );
}

#[tokio::test]
async fn a_stored_response_continues_on_another_replica_and_never_for_another_tenant() {
    if !python_ready(
        "responses_fleet",
        "import openai",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let Some(redis) = RedisServer::start("responses_fleet").await else {
        return;
    };
    let mock = Mock::start("openai", &[]).await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = replica(&mock, &redis, dir_a.path()).await;
    let b = replica(&mock, &redis, dir_b.path()).await;
    let ids = dir_a.path().join("ids.json");
    let ids = ids.to_str().unwrap();

    phase(&a, "chain-first", A, &["--out", ids]).await;
    phase(&b, "chain-next", A, &["--ids", ids]).await;
    phase(&b, "chain-stranger", B, &["--ids", ids]).await;
    phase(&a, "chain-stranger", B, &["--ids", ids]).await;

    // The continuation carried the first turn: its input and its answer
    // reached the upstream before the new question.
    let log = mock.requests().await;
    let last = &log.last().unwrap()["body"]["messages"];
    let texts: Vec<String> = last
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].to_string())
        .collect();
    assert_eq!(texts.len(), 3, "{last}");
    assert!(texts[0].contains("My name is Ada."), "{last}");
    assert!(texts[2].contains("What is my name?"), "{last}");
}

#[tokio::test]
async fn a_background_stream_left_on_one_replica_resumes_on_another() {
    if !python_ready(
        "responses_fleet",
        "import openai",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let Some(redis) = RedisServer::start("responses_fleet_bg").await else {
        return;
    };
    let mock = Mock::start("openai", &[]).await;
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = replica(&mock, &redis, dir_a.path()).await;
    let b = replica(&mock, &redis, dir_b.path()).await;
    let ids = dir_a.path().join("bg.json");
    let ids = ids.to_str().unwrap();
    phase(&a, "bg-start", A, &["--out", ids]).await;
    phase(&b, "bg-resume", A, &["--ids", ids]).await;
}
