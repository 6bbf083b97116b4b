//! Stored and background responses across a fleet: two replicas of the real
//! binary on one `redis-server`, tokens auth with two tenants, driven by the
//! official `openai` Python SDK (examples/openai_sdk/test_responses.py
//! phases). A response stored through replica A is continued with
//! `previous_response_id` and read through replica B; the other tenant gets
//! `previous_response_not_found` and 404s; a background response whose
//! stream was left on A is streamed from the next event on B; a background
//! response whose replica is SIGKILLed mid-generation completes on the
//! other, generated there once (the job's lease lapses). Needs
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

/// `POST /v1/responses` with `background: true` as tenant A: the response id.
async fn background(sy: &Switchyard) -> String {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/responses", sy.http_url()))
        .bearer_auth(A)
        .json(&serde_json::json!({"model": "chat", "input": "Say hello.", "background": true}))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "queued", "{body}");
    body["id"].as_str().unwrap().to_string()
}

/// `GET /v1/responses/{id}` as `key`: status and body.
async fn retrieve(sy: &Switchyard, id: &str, key: &str) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .get(format!("{}/v1/responses/{id}", sy.http_url()))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn a_background_response_whose_replica_is_killed_completes_on_another() {
    let Some(redis) = RedisServer::start("responses_fleet_kill").await else {
        return;
    };
    let (mock_a, mock_b) = (
        Mock::start("openai", &[]).await,
        Mock::start("openai", &[]).await,
    );
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let slow = serde_json::json!({"type": "slow_first_token", "delay_ms": 30000, "times": 1});
    mock_a.set_fault(slow.clone()).await;
    mock_b.set_fault(slow).await;
    let a = replica(&mock_a, &redis, dir_a.path()).await;
    let b = replica(&mock_b, &redis, dir_b.path()).await;
    let id = background(&a).await;

    // Whichever replica claimed the job is waiting on its upstream now: kill it.
    let a_runs = loop {
        if !mock_a.requests().await.is_empty() {
            break true;
        }
        if !mock_b.requests().await.is_empty() {
            break false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let (mut dead, survivor, survivor_mock) = if a_runs {
        (a, b, &mock_b)
    } else {
        (b, a, &mock_a)
    };
    dead.child.start_kill().unwrap();
    let _ = dead.child.wait().await;
    survivor_mock.clear().await;
    survivor_mock
        .set_fault(serde_json::json!({"type": "none"}))
        .await;

    // The job's lease (10 s) lapses; the survivor runs it and the response
    // completes, read through the survivor.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let done = loop {
        let (status, body) = retrieve(&survivor, &id, A).await;
        assert_eq!(status, 200, "{body}");
        match body["status"].as_str() {
            Some("queued" | "in_progress") => {}
            _ => break body,
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still {body} after 60 s\n{}",
            survivor.logs()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(done["status"], "completed", "{done}");
    let text = done["output"][0]["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        text,
        (0..16).map(|i| format!("tok{i} ")).collect::<String>()
    );
    assert_eq!(
        attempts(&survivor_mock.requests().await),
        1,
        "the survivor generated it once"
    );
    // Another tenant cannot read it on any replica.
    assert_eq!(retrieve(&survivor, &id, B).await.0, 404);
}
