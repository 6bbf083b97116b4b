//! What the Batch API stores, against the real binary on both backends
//! (the SQLite queue file, a real `redis-server`), with two token
//! tenants: per-tenant file quotas and the store's budget (429 in OpenAI's
//! shape) while another tenant uploads (R4); a 40 MB upload stored in
//! chunks on Redis, and one Redis cannot hold leaving nothing behind (R4);
//! batch reads that load job states, not job bodies (B3); tenants taking
//! turns in the queue (B6); finished jobs and expired files deleted (B4).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use switchyard::proto;
use switchyard::proto::JobState;

const TOKENS: &str = "team-a:aaaaaaaaaaaaaaaaaaaaaaaa,team-b:bbbbbbbbbbbbbbbbbbbbbbbb";
const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbb";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Backend {
    Sqlite,
    Redis,
}

/// One switchyard on one backend, its mock, and the HTTP client.
struct Stack {
    mock: Mock,
    sy: Switchyard,
    redis: Option<RedisServer>,
    dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Stack {
    /// `queue` is TOML under `[queue]`; `None` when the backend is missing.
    async fn start(test: &str, backend: Backend, queue: &str) -> Option<Stack> {
        Self::start_with_state(test, backend, queue, "").await
    }

    /// [`Stack::start`] with `state` as TOML under `[state]`.
    async fn start_with_state(
        test: &str,
        backend: Backend,
        queue: &str,
        state: &str,
    ) -> Option<Stack> {
        let redis = match backend {
            Backend::Redis => Some(RedisServer::start(test).await?),
            Backend::Sqlite => None,
        };
        let mock = Mock::start("openai", &[]).await;
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "[server]\nhttp_listen = \"127.0.0.1:0\"\n[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n[state]\nbackend = \"{}\"\n{state}\n[queue]\npath = \"{}\"\n{queue}\n{}{}",
            match backend {
                Backend::Sqlite => "embedded",
                Backend::Redis => "redis",
            },
            dir.path().join("queue.sqlite3").display(),
            provider("p", "openai", &mock.base_url(), "m"),
            route("chat", &["p/m"])
        );
        let url = redis.as_ref().map(|r| r.url()).unwrap_or_default();
        let sy = Switchyard::start_with(
            &config,
            &[
                ("SY_TEST_TOKENS", TOKENS),
                ("SWITCHYARD_REDIS_URL", url.as_str()),
            ],
        )
        .await;
        Some(Stack {
            mock,
            sy,
            redis,
            dir,
            http: reqwest::Client::new(),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.sy.http_url())
    }

    /// `POST /v1/files` (multipart, purpose `batch`): status, headers, body.
    async fn upload(&self, token: &str, data: &[u8]) -> (u16, reqwest::header::HeaderMap, Value) {
        let boundary = "switchyard-test-boundary";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(data);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let r = self
            .http
            .post(self.url("/v1/files"))
            .bearer_auth(token)
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body)
            .send()
            .await
            .unwrap();
        let (status, headers) = (r.status().as_u16(), r.headers().clone());
        (status, headers, r.json().await.unwrap())
    }

    /// Uploads `data`; its file id.
    async fn file(&self, token: &str, data: &[u8]) -> String {
        let (status, _, body) = self.upload(token, data).await;
        assert_eq!(status, 200, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    async fn get(&self, token: &str, path: &str) -> (u16, Vec<u8>) {
        let r = self
            .http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
    }

    async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .unwrap();
        (r.status().as_u16(), r.json().await.unwrap())
    }

    /// Creates a batch of `file`; the batch as answered.
    async fn batch(&self, token: &str, file: &str) -> Value {
        let (status, body) = self
            .post(
                token,
                "/v1/batches",
                json!({"input_file_id": file, "endpoint": "/v1/chat/completions",
                       "completion_window": "24h"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        body
    }

    async fn read_batch(&self, token: &str, id: &str) -> Value {
        let (status, body) = self.get(token, &format!("/v1/batches/{id}")).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }

    async fn submit_job(&self, token: &str) -> proto::Job {
        let mut client = self.sy.client().await;
        client
            .submit_job(with_token(request("chat"), token))
            .await
            .unwrap()
            .into_inner()
    }

    /// GetJob: the job, or the status it was refused with.
    async fn job(&self, token: &str, id: &str) -> Result<proto::Job, tonic::Status> {
        let mut client = self.sy.client().await;
        let req = proto::GetJobRequest { id: id.into() };
        client
            .get_job(with_token(req, token))
            .await
            .map(|r| r.into_inner())
    }

    /// A raw command on the stack's Redis.
    async fn redis<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let url = self.redis.as_ref().unwrap().url();
        let client = redis::Client::open(url).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut c).await.unwrap()
    }

    /// Every key but the drain bucket's (the recovery actor's, coming and going).
    async fn stored_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.redis(&["KEYS", "*"]).await;
        keys.retain(|k| !k.contains(":drain:"));
        keys.sort();
        keys
    }

    async fn used_memory(&self) -> i64 {
        let info: String = self.redis(&["INFO", "memory"]).await;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The switchyard process's resident memory, in bytes.
    fn rss(&self) -> u64 {
        let pid = self.sy.child.id().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap();
        kb * 1024
    }

    /// Rows in a table of the SQLite queue file.
    fn rows(&self, table: &str) -> i64 {
        let conn = rusqlite::Connection::open(self.dir.path().join("queue.sqlite3")).unwrap();
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

/// A batch input of `n` lines, each asking with a `content_bytes` prompt.
fn jsonl(n: usize, content_bytes: usize) -> Vec<u8> {
    let content = "x".repeat(content_bytes);
    let mut out = String::new();
    for i in 0..n {
        out.push_str(
            &json!({"custom_id": format!("r{i}"), "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "chat", "max_tokens": 8,
                             "messages": [{"role": "user", "content": content}]}})
            .to_string(),
        );
        out.push('\n');
    }
    out.into_bytes()
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `secs`.
async fn within<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    for _ in 0..secs * 10 {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not within {secs} s: {what}");
}

fn assert_quota(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    code: &str,
    key: &str,
) {
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert_eq!(body["error"]["type"], "insufficient_quota", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(key), "the message names {key}: {message}");
    assert_eq!(headers.get("x-should-retry").unwrap(), "false");
}

async fn quotas_hold_per_tenant_and_for_the_store(backend: Backend) {
    let queue = "max_file_bytes = 1048576\nmax_file_bytes_per_tenant = 1048576\nmax_files_per_tenant = 3\nmax_stored_bytes = 1572864";
    let Some(s) = Stack::start("batch quotas", backend, queue).await else {
        return;
    };
    let small = jsonl(1, 10);
    let big = vec![b'x'; 600_000];
    s.file(A, &small).await;
    s.file(A, &big).await;
    let (status, headers, body) = s.upload(A, &big).await;
    assert_quota(
        status,
        &headers,
        &body,
        "FILE_QUOTA",
        "queue.max_file_bytes_per_tenant",
    );
    s.file(A, &small).await;
    let (status, headers, body) = s.upload(A, &small).await;
    assert_quota(
        status,
        &headers,
        &body,
        "FILE_QUOTA",
        "queue.max_files_per_tenant",
    );
    // Another tenant is not held back by A's quota...
    let b = s.file(B, &big).await;
    let (status, content) = s.get(B, &format!("/v1/files/{b}/content")).await;
    assert_eq!((status, content.len()), (200, big.len()));
    // ...until every tenant's bytes reach the store's budget.
    let (status, headers, body) = s.upload(B, &big[..400_000]).await;
    assert_quota(
        status,
        &headers,
        &body,
        "FILE_STORE_FULL",
        "queue.max_stored_bytes",
    );
    // A refused upload leaves no file behind: A's three files are all it has.
    if backend == Backend::Sqlite {
        assert_eq!(
            s.rows("blobs"),
            2 * 4,
            "a file is its metadata and its bytes"
        );
    }
}

#[tokio::test]
async fn a_tenant_past_its_file_quota_gets_429_while_another_uploads_sqlite() {
    quotas_hold_per_tenant_and_for_the_store(Backend::Sqlite).await;
}

#[tokio::test]
async fn a_tenant_past_its_file_quota_gets_429_while_another_uploads_redis() {
    quotas_hold_per_tenant_and_for_the_store(Backend::Redis).await;
}

#[tokio::test]
async fn a_40_mb_upload_is_stored_on_redis_in_chunks_and_read_back_whole() {
    let Some(s) = Stack::start("batch 40 MB upload", Backend::Redis, "").await else {
        return;
    };
    let data: Vec<u8> = (0..40_000_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let (status, _, body) = s.upload(A, &data).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["bytes"], 40_000_000);
    let id = body["id"].as_str().unwrap();
    let (status, content) = s.get(A, &format!("/v1/files/{id}/content")).await;
    assert_eq!(status, 200);
    assert!(content == data, "the file comes back whole");
    let (status, _) = s.get(B, &format!("/v1/files/{id}/content")).await;
    assert_eq!(status, 404, "another tenant's file does not exist for B");
    // A job submitted right after is stored: the request path's Redis is fine.
    assert_eq!(s.submit_job(A).await.route, "chat");
}

#[tokio::test]
async fn an_upload_redis_cannot_hold_fails_and_leaves_its_keys_and_memory_as_they_were() {
    let Some(s) = Stack::start("batch failed upload", Backend::Redis, "").await else {
        return;
    };
    let kept = s.file(A, &jsonl(1, 10)).await;
    let keys = s.stored_keys().await;
    let memory = s.used_memory().await;
    let cap = (memory + (16 << 20)).to_string();
    let _: () = s.redis(&["CONFIG", "SET", "maxmemory", &cap]).await;
    let data = vec![b'x'; 40_000_000];
    let (status, _, body) = s.upload(A, &data).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "STATE_UNAVAILABLE", "{body}");
    // The chunks written before Redis said OOM are deleted.
    within(10, "the failed upload's keys are gone", || async {
        (s.stored_keys().await == keys).then_some(())
    })
    .await;
    let after = s.used_memory().await;
    assert!(
        after < memory + (2 << 20),
        "Redis memory back: {memory} -> {after}"
    );
    let _: () = s.redis(&["CONFIG", "SET", "maxmemory", "0"]).await;
    let (status, _) = s.get(A, &format!("/v1/files/{kept}/content")).await;
    assert_eq!(status, 200);
    // Jobs are accepted again (the breaker, if Redis's OOM opened it, closed).
    within(10, "a job is accepted", || async {
        let mut client = s.sy.client().await;
        client
            .submit_job(with_token(request("chat"), A))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

#[tokio::test]
async fn an_upload_cut_short_by_a_redis_stall_leaves_nothing_once_redis_answers() {
    let queue = "blob_timeout = \"200ms\"";
    let Some(s) = Stack::start("batch stalled upload", Backend::Redis, queue).await else {
        return;
    };
    let kept = s.file(A, &jsonl(1, 10)).await;
    let keys = s.stored_keys().await;
    let s = std::sync::Arc::new(s);
    let upload = {
        let s = s.clone();
        tokio::spawn(async move { s.upload(A, &vec![b'x'; 40_000_000]).await })
    };
    within(30, "the upload's first chunks are stored", || async {
        let chunks: Vec<String> = s.redis(&["KEYS", "switchyard:{jobs}:chunk:*"]).await;
        (chunks.len() >= 2).then_some(())
    })
    .await;
    let redis = s.redis.as_ref().unwrap();
    redis.freeze(true);
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.freeze(false);
    let (status, _, body) = upload.await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("queue.blob_timeout"),
        "{body}"
    );
    within(15, "the stalled upload's keys are gone", || async {
        (s.stored_keys().await == keys).then_some(())
    })
    .await;
    let (status, _) = s.get(A, &format!("/v1/files/{kept}/content")).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_full_redis_refuses_new_work_with_errors_and_loses_nothing_it_holds() {
    let Some(s) = Stack::start("full redis", Backend::Redis, "").await else {
        return;
    };
    let file = s.file(A, &jsonl(1, 10)).await;
    let job = s.submit_job(A).await;
    within(20, "the job finishes", || async {
        let j = s.job(A, &job.id).await.ok()?;
        (j.state == JobState::Succeeded as i32).then_some(())
    })
    .await;
    // Every write that needs memory is refused from here on.
    let _: () = s.redis(&["CONFIG", "SET", "maxmemory", "1"]).await;
    let mut client = s.sy.client().await;
    let refused = client
        .submit_job(with_token(request("chat"), B))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(reason(&refused), "STATE_UNAVAILABLE");
    let keyed = proto::CompletionRequest {
        idempotency_key: "full-1".into(),
        ..request("chat")
    };
    let got = stream(&mut client, with_token(keyed, B)).await;
    let status = got.status.expect("a keyed request fails closed");
    assert_eq!(reason(&status), "STATE_UNAVAILABLE", "{status:?}");
    let (status, _, body) = s.upload(B, &jsonl(1, 10)).await;
    assert_eq!(status, 503, "{body}");
    let _: () = s.redis(&["CONFIG", "SET", "maxmemory", "0"]).await;
    // What was stored before is all there.
    let j = within(10, "the job reads again", || async {
        s.job(A, &job.id).await.ok()
    })
    .await;
    assert_eq!(j.state, JobState::Succeeded as i32);
    assert!(j.result.is_some());
    let (status, content) = s.get(A, &format!("/v1/files/{file}/content")).await;
    assert_eq!((status, content), (200, jsonl(1, 10)));
    within(10, "jobs are accepted again", || async {
        let mut client = s.sy.client().await;
        client
            .submit_job(with_token(request("chat"), B))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
}

/// 16 concurrent reads of a 1,000-line in-progress batch whose lines carry
/// 20 KB prompts (20 MB of job requests): the peak RSS rise of the process.
async fn rss_rise_of_concurrent_batch_reads(backend: Backend) -> Option<u64> {
    // The drain barely runs: the batch stays in progress, its jobs queued.
    let queue = "drain = { rate = 0.01, burst = 1 }";
    // What is measured is memory: storing 20 MB of jobs on a busy machine
    // once took one Redis call past the default 250 ms and failed the batch.
    let state = "timeout = \"5s\"";
    let s = Stack::start_with_state("batch reads", backend, queue, state).await?;
    let file = s.file(A, &jsonl(1000, 20_000)).await;
    let batch = s.batch(A, &file).await;
    let id = batch["id"].as_str().unwrap().to_string();
    assert_eq!(batch["status"], "in_progress", "{batch}");
    s.read_batch(A, &id).await;
    let baseline = s.rss();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(baseline));
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        let pid = s.sy.child.id().unwrap();
        tokio::spawn(async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    let kb: u64 = status
                        .lines()
                        .find_map(|l| l.strip_prefix("VmRSS:"))
                        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                        .unwrap_or(0);
                    peak.fetch_max(kb * 1024, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let s = std::sync::Arc::new(s);
    for _ in 0..3 {
        let reads: Vec<_> = (0..16)
            .map(|_| {
                let (s, id) = (s.clone(), id.clone());
                tokio::spawn(async move {
                    let b = s.read_batch(A, &id).await;
                    assert_eq!(b["status"], "in_progress");
                    assert_eq!(b["request_counts"]["total"], 1000);
                })
            })
            .collect();
        for r in reads {
            r.await.unwrap();
        }
    }
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    sampler.await.unwrap();
    let rise = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .saturating_sub(baseline);
    println!(
        "{backend:?}: 16 concurrent reads x 3 raised RSS by {} KiB",
        rise / 1024
    );
    Some(rise)
}

/// The bound README states: a read holds the line list and the jobs'
/// states, never their requests or answers (here 20 MB per read).
const READ_RSS_BOUND: u64 = 48 << 20;

#[tokio::test]
async fn a_batch_read_during_16_concurrent_reads_stays_within_its_memory_bound_sqlite() {
    if let Some(rise) = rss_rise_of_concurrent_batch_reads(Backend::Sqlite).await {
        assert!(rise < READ_RSS_BOUND, "RSS rose {rise} bytes");
    }
}

#[tokio::test]
async fn a_batch_read_during_16_concurrent_reads_stays_within_its_memory_bound_redis() {
    if let Some(rise) = rss_rise_of_concurrent_batch_reads(Backend::Redis).await {
        assert!(rise < READ_RSS_BOUND, "RSS rose {rise} bytes");
    }
}

async fn another_tenants_job_runs_before_a_big_batch_finishes(backend: Backend) {
    // 1,000 lines at 10 a second: the batch takes at least 100 s.
    let queue = "drain = { rate = 10.0, burst = 2 }";
    let Some(s) = Stack::start("fair drain", backend, queue).await else {
        return;
    };
    let file = s.file(A, &jsonl(1000, 10)).await;
    let batch = s.batch(A, &file).await;
    let id = batch["id"].as_str().unwrap().to_string();
    assert_eq!(batch["status"], "in_progress", "{batch}");
    let job = s.submit_job(B).await;
    let done = within(30, "B's job finishes", || async {
        let j = s.job(B, &job.id).await.unwrap();
        (j.state == JobState::Succeeded as i32).then_some(j)
    })
    .await;
    assert!(done.result.is_some());
    let a = s.read_batch(A, &id).await;
    assert_eq!(a["status"], "in_progress", "{a}");
    let completed = a["request_counts"]["completed"].as_u64().unwrap();
    assert!(
        completed < 1000,
        "B ran before A's batch finished ({completed} of 1000 done)"
    );
    println!("{backend:?}: B's job finished with {completed} of A's 1000 lines done");
    let (status, _) = s
        .post(A, &format!("/v1/batches/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn another_tenants_single_job_runs_before_a_1000_line_batch_finishes_sqlite() {
    another_tenants_job_runs_before_a_big_batch_finishes(Backend::Sqlite).await;
}

#[tokio::test]
async fn another_tenants_single_job_runs_before_a_1000_line_batch_finishes_redis() {
    another_tenants_job_runs_before_a_big_batch_finishes(Backend::Redis).await;
}

async fn finished_jobs_and_expired_files_are_deleted(backend: Backend) {
    let queue = "job_ttl = \"2s\"\nfile_ttl = \"2s\"";
    let Some(s) = Stack::start("retention", backend, queue).await else {
        return;
    };
    let file = s.file(A, &jsonl(1, 10)).await;
    let job = s.submit_job(A).await;
    within(20, "the job finishes", || async {
        let j = s.job(A, &job.id).await.ok()?;
        (j.state == JobState::Succeeded as i32).then_some(())
    })
    .await;
    s.mock
        .wait_for("the job's call", |log| !log.is_empty())
        .await;
    within(20, "the finished job is deleted", || async {
        let gone = s.job(A, &job.id).await.err()?;
        assert_eq!(gone.code(), tonic::Code::NotFound);
        Some(())
    })
    .await;
    let (status, _) = s.get(A, &format!("/v1/files/{file}")).await;
    assert_eq!(status, 404, "the file expired");
    match backend {
        Backend::Sqlite => {
            within(20, "the queue file holds nothing", || async {
                (s.rows("jobs") == 0 && s.rows("blobs") == 0).then_some(())
            })
            .await;
        }
        Backend::Redis => {
            within(20, "the file's charge is returned", || async {
                let usage: Option<i64> = s
                    .redis(&["HGET", "switchyard:{jobs}:objs:usage", "b:team-a"])
                    .await;
                usage.is_none().then_some(())
            })
            .await;
        }
    }
}

#[tokio::test]
async fn finished_jobs_and_expired_files_are_deleted_after_their_ttl_sqlite() {
    finished_jobs_and_expired_files_are_deleted(Backend::Sqlite).await;
}

#[tokio::test]
async fn finished_jobs_and_expired_files_are_deleted_after_their_ttl_redis() {
    finished_jobs_and_expired_files_are_deleted(Backend::Redis).await;
}
