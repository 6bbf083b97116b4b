//! Tenants are walls (issue 24, T1-T3), against the real binary with three
//! token-authenticated tenants: an answer one tenant's request put in the
//! exact or the semantic cache is never served to another (unless the route
//! opts in with `shared_across_tenants = true`), and another tenant's job,
//! including the jobs behind a batch's lines, is NOT_FOUND exactly as an
//! unknown id is, on the embedded backend and on Redis.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use switchyard::proto::{self, JobState, Tier};
use tonic::Code;

const TOKENS: &str =
    "alpha:alpha-token-0000000000,beta:beta-token-00000000000,gamma:gamma-token-0000000000";
const ALPHA: &str = "alpha-token-0000000000";
const BETA: &str = "beta-token-00000000000";
const GAMMA: &str = "gamma-token-0000000000";

/// Alpha's customer file, in the system prompt of every request below.
const SYSTEM: &str = "You answer questions about the customer file: Alice Smith, account 4711.";

fn embedder(base_url: &str) -> String {
    format!(
        "\n[[providers]]\nid = \"emb\"\nkind = \"openai\"\nbase_url = \"{base_url}\"\n  [[providers.models]]\n  name = \"embed-small\"\n  capabilities = [\"embeddings\"]\n"
    )
}

/// Route `private` caches per tenant (the default); route `public` shares
/// its caches with every tenant. Both answer fresh hits from either cache.
fn config(chat: &Mock, emb: &Mock, state: &str) -> String {
    let caches = "serve_fresh_within = \"10m\"\nsemantic_cache = { embedder = \"emb/embed-small\", threshold = 0.9, fresh_within = \"10m\" }\n";
    format!(
        "[server]\nhttp_listen = \"127.0.0.1:0\"\n[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n{state}\n{}{}{}{caches}{}{caches}shared_across_tenants = true\n",
        provider("p", "openai", &chat.base_url(), "m"),
        embedder(&emb.base_url()),
        route("private", &["p/m"]),
        route("public", &["p/m"]),
    )
}

fn as_tenant<T>(token: &str, body: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(body);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

fn ask(route: &str, question: &str) -> proto::CompletionRequest {
    let mut req = request(route);
    req.messages = vec![
        proto::Message {
            role: "system".into(),
            content: SYSTEM.into(),
            ..Default::default()
        },
        user(question),
    ];
    req
}

/// Chat requests the upstream received (the embedder is another mock).
async fn chat_calls(chat: &Mock) -> usize {
    chat.requests().await.len()
}

/// Waits until route's semantic cache holds `n` answers (filled after `Finished`).
async fn wait_entries(sy: &Switchyard, route: &str, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = sy.admin_get("/metrics").await.1;
        let held = metric_sum(
            &m,
            &format!("switchyard_semantic_cache_entries{{route=\"{route}\"}}"),
        );
        if held == n {
            return;
        }
        assert!(Instant::now() < deadline, "{route} holds {held}, not {n}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn tier_of(sy: &Switchyard, token: &str, req: proto::CompletionRequest) -> Tier {
    let mut client = sy.client().await;
    let got = stream(&mut client, as_tenant(token, req)).await;
    let f = got
        .finished
        .unwrap_or_else(|| panic!("no answer: {:?}\n{}", got.status, sy.logs()));
    Tier::try_from(f.tier).unwrap()
}

#[tokio::test]
async fn cached_answers_are_each_tenants_own_unless_the_route_shares_them() {
    let chat = Mock::start("openai", &[]).await;
    let emb = Mock::start("openai", &[]).await;
    let sy = Switchyard::start_with(&config(&chat, &emb, ""), &[("SY_TEST_TOKENS", TOKENS)]).await;
    let question = "What is the current balance of Alice's savings account?";
    // The same content words: similarity 1 under the mock's embedder.
    let paraphrase = "current savings account balance for Alice";

    // Alpha's answer fills both caches; alpha's own repeat is a cache hit.
    assert_eq!(
        tier_of(&sy, ALPHA, ask("private", question)).await,
        Tier::Primary
    );
    wait_entries(&sy, "private", 1.0).await;
    assert_eq!(
        tier_of(&sy, ALPHA, ask("private", question)).await,
        Tier::Cache
    );
    assert_eq!(
        tier_of(&sy, ALPHA, ask("private", paraphrase)).await,
        Tier::SemanticCache,
        "alpha's near-repeat finds alpha's own answer"
    );
    assert_eq!(chat_calls(&chat).await, 1);

    // T3: beta's identical request is not answered from alpha's exact entry.
    assert_eq!(
        tier_of(&sy, BETA, ask("private", question)).await,
        Tier::Primary
    );
    assert_eq!(
        chat_calls(&chat).await,
        2,
        "beta's answer came from upstream"
    );
    // T1: gamma's near-repeat is not answered from alpha's (or beta's) semantic entry.
    assert_eq!(
        tier_of(&sy, GAMMA, ask("private", paraphrase)).await,
        Tier::Primary
    );
    assert_eq!(
        chat_calls(&chat).await,
        3,
        "gamma's answer came from upstream"
    );

    // The explicit opt-in: a public route's answers serve every tenant.
    assert_eq!(
        tier_of(&sy, ALPHA, ask("public", question)).await,
        Tier::Primary
    );
    wait_entries(&sy, "public", 1.0).await;
    assert_eq!(
        tier_of(&sy, BETA, ask("public", question)).await,
        Tier::Cache
    );
    assert_eq!(
        tier_of(&sy, GAMMA, ask("public", paraphrase)).await,
        Tier::SemanticCache
    );
    assert_eq!(chat_calls(&chat).await, 4);
}

/// Polls alpha's job until it is final.
async fn wait_final(sy: &Switchyard, id: &str) -> proto::Job {
    let mut client = sy.client().await;
    for _ in 0..400 {
        let job = client
            .get_job(as_tenant(ALPHA, proto::GetJobRequest { id: id.into() }))
            .await
            .unwrap()
            .into_inner();
        if job.state == JobState::Succeeded as i32 || job.state == JobState::Failed as i32 {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} never finished: {}", sy.logs());
}

/// Beta and gamma read and watch `id` and get NOT_FOUND, worded exactly as
/// for an id that never existed (no oracle for another tenant's ids).
async fn walled(sy: &Switchyard, id: &str) {
    let mut client = sy.client().await;
    let unknown = client
        .get_job(as_tenant(
            BETA,
            proto::GetJobRequest {
                id: "job-none".into(),
            },
        ))
        .await
        .unwrap_err();
    for token in [BETA, GAMMA] {
        let got = client
            .get_job(as_tenant(token, proto::GetJobRequest { id: id.into() }))
            .await
            .unwrap_err();
        assert_eq!(got.code(), Code::NotFound, "{got:?}");
        assert_eq!(reason(&got), reason(&unknown));
        assert_eq!(
            got.message().replace(id, "ID"),
            unknown.message().replace("job-none", "ID")
        );
        let watched = client
            .watch_job(as_tenant(token, proto::GetJobRequest { id: id.into() }))
            .await;
        assert_eq!(watched.unwrap_err().code(), Code::NotFound);
    }
}

/// A multipart body with `purpose=batch` and `file`.
fn multipart(jsonl: &str) -> (String, Vec<u8>) {
    let boundary = "tenantwallsboundary";
    let body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n{jsonl}\r\n--{boundary}--\r\n"
    );
    (
        format!("multipart/form-data; boundary={boundary}"),
        body.into_bytes(),
    )
}

/// Alpha runs a two-line batch to completion; the ids of its lines' jobs,
/// from the output file.
async fn alpha_batch_jobs(sy: &Switchyard) -> Vec<String> {
    let http = reqwest::Client::new();
    let base = sy.http_url();
    let line = |n: u32| {
        json!({"custom_id": format!("line-{n}"), "method": "POST", "url": "/v1/chat/completions",
               "body": {"model": "private", "max_tokens": 16,
                        "messages": [{"role": "user", "content": format!("Line {n}, about Alice.")}]}})
        .to_string()
    };
    let (content_type, body) = multipart(&format!("{}\n{}\n", line(1), line(2)));
    let file: Value = http
        .post(format!("{base}/v1/files"))
        .bearer_auth(ALPHA)
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let batch: Value = http
        .post(format!("{base}/v1/batches"))
        .bearer_auth(ALPHA)
        .json(&json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = batch["id"].as_str().unwrap_or_else(|| panic!("{batch}"));
    let mut done = Value::Null;
    for _ in 0..400 {
        done = http
            .get(format!("{base}/v1/batches/{id}"))
            .bearer_auth(ALPHA)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if done["status"] == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(done["status"], "completed", "{done}\n{}", sy.logs());
    // Beta cannot read alpha's batch either.
    let other = http
        .get(format!("{base}/v1/batches/{id}"))
        .bearer_auth(BETA)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    let output = http
        .get(format!(
            "{base}/v1/files/{}/content",
            done["output_file_id"].as_str().unwrap()
        ))
        .bearer_auth(ALPHA)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let ids: Vec<String> = output
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["id"]
                .as_str()
                .and_then(|s| s.strip_prefix("batch_req_"))
                .unwrap_or_else(|| panic!("{v}"))
                .to_string()
        })
        .collect();
    assert_eq!(ids.len(), 2, "{output}");
    ids
}

/// T2 on one backend: a submitted job and a batch's line jobs.
async fn jobs_are_walled(state: &str, env: &[(&str, &str)]) {
    let chat = Mock::start("openai", &[]).await;
    let emb = Mock::start("openai", &[]).await;
    let mut env = env.to_vec();
    env.push(("SY_TEST_TOKENS", TOKENS));
    let sy = Switchyard::start_with(&config(&chat, &emb, state), &env).await;
    let mut client = sy.client().await;

    let job = client
        .submit_job(as_tenant(ALPHA, ask("private", "Summarise Alice's file.")))
        .await
        .unwrap()
        .into_inner();
    walled(&sy, &job.id).await;
    let done = wait_final(&sy, &job.id).await;
    assert_eq!(done.state, JobState::Succeeded as i32, "{done:?}");
    assert!(done.result.is_some(), "alpha reads its own answer");
    walled(&sy, &job.id).await;

    for id in alpha_batch_jobs(&sy).await {
        let own = wait_final(&sy, &id).await;
        assert_eq!(own.state, JobState::Succeeded as i32, "{own:?}");
        walled(&sy, &id).await;
    }
}

#[tokio::test]
async fn another_tenants_jobs_and_batch_line_jobs_are_not_found_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let state = format!(
        "[queue]\npath = \"{}\"\ndrain = {{ rate = 50.0, burst = 5 }}\n",
        dir.path().join("jobs.sqlite3").display()
    );
    jobs_are_walled(&state, &[]).await;
}

#[tokio::test]
async fn another_tenants_jobs_and_batch_line_jobs_are_not_found_on_redis() {
    let Some(redis) = RedisServer::start("tenant walls on redis").await else {
        return;
    };
    let url = redis.url();
    let state = "[state]\nbackend = \"redis\"\n[queue]\npath = \"unused-with-redis.sqlite3\"\ndrain = { rate = 50.0, burst = 5 }\n";
    jobs_are_walled(state, &[("SWITCHYARD_REDIS_URL", url.as_str())]).await;
}
