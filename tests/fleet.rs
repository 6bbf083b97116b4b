//! One router, many replicas: two `switchyard serve` processes on one real
//! `redis-server` behave as one for jobs, idempotency, cost caps and tenant
//! limits; a replica SIGKILLed mid-job loses the job to the other, which
//! completes it exactly once; Redis killed mid-load gives defined statuses
//! fast and service resumes without a restart, job records intact (AOF).
//! Each replica calls its own mock, so a mock's log tells which replica sent
//! what upstream.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::json;
use switchyard::proto;
use switchyard::proto::JobState;
use tonic::Code;

const TOKENS: &str = "team-a:aaaaaaaaaaaaaaaaaaaaaaaa";

/// A provider `p` with model `m` at `base_url`: input free, output 100,000
/// USD per million tokens (0.1 USD a token: `max_tokens = 10` reserves 1 USD).
fn priced_provider(base_url: &str) -> String {
    format!(
        r#"
[[providers]]
id = "p"
kind = "openai"
base_url = "{base_url}"
first_token_timeout = "10s"
idle_timeout = "10s"
  [[providers.models]]
  name = "m"
  capabilities = ["chat", "stream"]
  context_tokens = 8192
  price = {{ input_per_mtok = 0.0, output_per_mtok = 100000.0 }}
"#
    )
}

fn replica_config(head: &str, mock: &Mock, backend: &str) -> String {
    format!(
        "[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n[state]\nbackend = \"{backend}\"\n[queue]\npath = \"unused-with-redis.sqlite3\"\ndrain = {{ rate = 50.0, burst = 5 }}\n{head}\n{}{}",
        priced_provider(&mock.base_url()),
        route("chat", &["p/m"])
    )
}

struct Replica {
    mock: Mock,
    sy: Switchyard,
}

impl Replica {
    async fn start(head: &str, redis: &RedisServer) -> Replica {
        let mock = Mock::start("openai", &[]).await;
        let config = replica_config(head, &mock, "redis");
        let url = redis.url();
        let sy = Switchyard::start_with(
            &config,
            &[
                ("SWITCHYARD_REDIS_URL", url.as_str()),
                ("SY_TEST_TOKENS", TOKENS),
            ],
        )
        .await;
        Replica { mock, sy }
    }

    async fn client(&self) -> proto::router_client::RouterClient<tonic::transport::Channel> {
        self.sy.client().await
    }

    /// Submits the standard request as a job here.
    async fn submit(&self) -> proto::Job {
        self.client()
            .await
            .submit_job(authed(request("chat")))
            .await
            .unwrap()
            .into_inner()
    }
}

/// The same fault on both replicas' mocks.
async fn slow_both(a: &Replica, b: &Replica, fault: serde_json::Value) {
    a.mock.set_fault(fault.clone()).await;
    b.mock.set_fault(fault).await;
}

fn authed(mut r: proto::CompletionRequest) -> tonic::Request<proto::CompletionRequest> {
    r.max_tokens = 10;
    let mut req = tonic::Request::new(r);
    req.metadata_mut().insert(
        "authorization",
        "Bearer aaaaaaaaaaaaaaaaaaaaaaaa".parse().unwrap(),
    );
    req
}

fn keyed(key: &str) -> tonic::Request<proto::CompletionRequest> {
    authed(proto::CompletionRequest {
        idempotency_key: key.into(),
        ..request("chat")
    })
}

fn job_id(id: &str) -> tonic::Request<proto::GetJobRequest> {
    let mut req = tonic::Request::new(proto::GetJobRequest { id: id.into() });
    req.metadata_mut().insert(
        "authorization",
        "Bearer aaaaaaaaaaaaaaaaaaaaaaaa".parse().unwrap(),
    );
    req
}

async fn wait_final(
    client: &mut proto::router_client::RouterClient<tonic::transport::Channel>,
    id: &str,
    secs: u64,
) -> proto::Job {
    for _ in 0..secs * 20 {
        let job = client.get_job(job_id(id)).await.unwrap().into_inner();
        if job.state == JobState::Succeeded as i32 || job.state == JobState::Failed as i32 {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} never finished");
}

#[tokio::test]
async fn a_batch_created_on_one_replica_finishes_and_is_read_on_the_other() {
    if !python_ready(
        "fleet batch",
        "import openai",
        "examples/openai_sdk/requirements.txt",
    ) {
        return;
    }
    let Some(redis) = RedisServer::start("fleet batch").await else {
        return;
    };
    let head = "[server]\nhttp_listen = \"127.0.0.1:0\"";
    let a = Replica::start(head, &redis).await;
    let b = Replica::start(head, &redis).await;
    for r in [&a, &b] {
        r.mock
            .set_fault(json!({"type": "status", "status": 503}))
            .await;
    }
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.json");
    let ids = ids.to_str().unwrap();
    let key = ["--api-key", "aaaaaaaaaaaaaaaaaaaaaaaa"];
    batch_phase(&a.sy, "submit", &[&["--out", ids][..], &key[..]].concat()).await;
    // The log is cleared before the fault: a job the fleet retries the
    // moment its upstream recovers is served after the clear, never before.
    for r in [&a, &b] {
        r.mock.clear().await;
        r.mock.set_fault(json!({})).await;
    }
    // The file, the batch and its jobs live in Redis: B reads and finishes it.
    batch_phase(&b.sy, "finish", &[&["--ids", ids][..], &key[..]].concat()).await;
    let served: usize = [a.mock.requests().await, b.mock.requests().await]
        .iter()
        .flatten()
        .filter(|r| r["status"] == 200 && r["completed"] == true)
        .count();
    assert_eq!(served, 5, "each line answered once across the fleet");
}

#[tokio::test]
async fn a_job_submitted_on_one_replica_is_read_and_watched_on_the_other() {
    let Some(redis) = RedisServer::start("fleet jobs").await else {
        return;
    };
    let a = Replica::start("", &redis).await;
    let b = Replica::start("", &redis).await;
    // Slow enough that B's watch sees it before it ends.
    slow_both(
        &a,
        &b,
        json!({"type": "slow_first_token", "delay_ms": 1500}),
    )
    .await;
    let job = a.submit().await;
    let mut cb = b.client().await;
    let seen = cb.get_job(job_id(&job.id)).await.unwrap().into_inner();
    assert_eq!(seen.id, job.id, "replica B reads A's job");
    let mut watch = cb.watch_job(job_id(&job.id)).await.unwrap().into_inner();
    let last = loop {
        let j = tokio::time::timeout(Duration::from_secs(20), watch.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if j.state == JobState::Succeeded as i32 {
            break j;
        }
    };
    assert!(!last.result.unwrap().text.is_empty());
    let upstream = attempts(&a.mock.requests().await) + attempts(&b.mock.requests().await);
    assert_eq!(upstream, 1, "one generation for one job");
}

#[tokio::test]
async fn a_replica_killed_mid_job_loses_it_to_the_other_which_completes_it_once() {
    let Some(redis) = RedisServer::start("fleet job failover").await else {
        return;
    };
    let a = Replica::start("", &redis).await;
    let b = Replica::start("", &redis).await;
    slow_both(
        &a,
        &b,
        json!({"type": "slow_first_token", "delay_ms": 3000, "times": 1}),
    )
    .await;
    let job = a.submit().await;
    // Whichever replica claimed it is sending it upstream now: kill that one.
    let a_runs = loop {
        if !a.mock.requests().await.is_empty() {
            break true;
        }
        if !b.mock.requests().await.is_empty() {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (mut dead, survivor) = if a_runs { (a, b) } else { (b, a) };
    dead.sy.child.start_kill().unwrap();
    let _ = dead.sy.child.wait().await;
    let mut client = survivor.client().await;
    // The lease (10 s) lapses, the survivor takes the job and completes it.
    let done = wait_final(&mut client, &job.id, 40).await;
    assert_eq!(done.state, JobState::Succeeded as i32, "{done:?}");
    assert_eq!(done.attempts, 2, "one killed run, one that finished");
    let survivor_log = survivor.mock.requests().await;
    assert_eq!(
        attempts(&survivor_log),
        1,
        "the survivor generated it once: {survivor_log:?}"
    );
}

#[tokio::test]
async fn idempotent_replay_and_concurrent_duplicates_across_replicas() {
    let Some(redis) = RedisServer::start("fleet idempotency").await else {
        return;
    };
    let a = Replica::start("", &redis).await;
    let b = Replica::start("", &redis).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let first = stream(&mut ca, keyed("k-1")).await;
    let first = first.finished.expect("served");
    assert!(!first.replayed);
    let again = stream(&mut cb, keyed("k-1"))
        .await
        .finished
        .expect("replayed");
    assert!(
        again.replayed,
        "the other replica replays the stored answer"
    );
    assert_eq!(
        attempts(&b.mock.requests().await),
        0,
        "zero upstream calls on B"
    );
    assert_eq!(attempts(&a.mock.requests().await), 1);

    // Two replicas, one key, at once: one runs, the other is ABORTED.
    slow_both(
        &a,
        &b,
        json!({"type": "slow_first_token", "delay_ms": 1000}),
    )
    .await;
    let (x, y) = tokio::join!(stream(&mut ca, keyed("k-2")), stream(&mut cb, keyed("k-2")));
    let served = [&x, &y].iter().filter(|c| c.finished.is_some()).count();
    let refused: Vec<_> = [&x, &y].iter().filter_map(|c| c.status.clone()).collect();
    assert_eq!(served, 1, "{x:?} {y:?}");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].code(), Code::Aborted);
    assert_eq!(reason(&refused[0]), "IDEMPOTENCY_KEY_IN_USE");
    let generations = attempts(&a.mock.requests().await) + attempts(&b.mock.requests().await) - 1;
    assert_eq!(generations, 1, "exactly one upstream generation for k-2");
}

/// 20 concurrent requests, each reserving 1 USD, against a 5 USD cap: exactly
/// five run and spend never passes the cap.
async fn cost_cap_holds(
    clients: Vec<proto::router_client::RouterClient<tonic::transport::Channel>>,
) {
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut c = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            stream(&mut c, authed(request("chat"))).await
        }));
    }
    let mut served = 0;
    let mut spent = 0.0;
    for t in tasks {
        let got = t.await.unwrap();
        match (&got.finished, &got.status) {
            (Some(f), _) => {
                served += 1;
                spent += f.cost_usd;
            }
            (None, Some(s)) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert_eq!(reason(s), "COST_CAP");
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(served, 5, "5 x 1 USD reservations fit a 5 USD cap");
    assert!(spent <= 5.0 + 1e-9, "spent {spent}");
}

const CAPPED: &str = "[cost]\ndefault_cap_usd = 5.0";

#[tokio::test]
async fn a_cost_cap_holds_exactly_across_two_replicas() {
    let Some(redis) = RedisServer::start("fleet cost cap").await else {
        return;
    };
    let a = Replica::start(CAPPED, &redis).await;
    let b = Replica::start(CAPPED, &redis).await;
    slow_both(
        &a,
        &b,
        json!({"type": "slow_first_token", "delay_ms": 1000}),
    )
    .await;
    cost_cap_holds(vec![a.client().await, b.client().await]).await;
}

#[tokio::test]
async fn a_cost_cap_holds_exactly_in_one_embedded_process() {
    let mock = Mock::start("openai", &[]).await;
    mock.set_fault(json!({"type": "slow_first_token", "delay_ms": 1000}))
        .await;
    let config = replica_config(CAPPED, &mock, "embedded")
        .replace("path = \"unused-with-redis.sqlite3\"\n", "");
    let dir = tempfile::tempdir().unwrap();
    let config = config.replace(
        "[queue]\n",
        &format!(
            "[queue]\npath = \"{}\"\n",
            dir.path().join("q.sqlite3").display()
        ),
    );
    let sy = Switchyard::start_with(&config, &[("SY_TEST_TOKENS", TOKENS)]).await;
    cost_cap_holds(vec![sy.client().await]).await;
}

#[tokio::test]
async fn a_tenant_rate_limit_holds_fleet_wide() {
    let Some(redis) = RedisServer::start("fleet rate limit").await else {
        return;
    };
    let head = "[limits]\ntenant_rate_per_sec = 0.01\ntenant_burst = 3";
    let a = Replica::start(head, &redis).await;
    let b = Replica::start(head, &redis).await;
    let (mut ca, mut cb) = (a.client().await, b.client().await);
    let mut served = 0;
    for i in 0..6 {
        let c = if i % 2 == 0 { &mut ca } else { &mut cb };
        let got = stream(c, authed(request("chat"))).await;
        match got.status {
            None => served += 1,
            Some(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted);
                assert_eq!(reason(&s), "TENANT_LIMIT");
            }
        }
    }
    assert_eq!(served, 3, "a burst of 3 for the tenant, not 3 per replica");
}

#[tokio::test]
async fn redis_killed_mid_load_gives_defined_statuses_and_recovers_without_restart() {
    let Some(mut redis) = RedisServer::start("fleet redis outage").await else {
        return;
    };
    let a = Replica::start("[limits]\ntenant_max_concurrent = 10", &redis).await;
    let mut ca = a.client().await;
    // A job stored and finished before the outage (AOF, appendfsync always).
    let kept = ca
        .submit_job(authed(request("chat")))
        .await
        .unwrap()
        .into_inner();
    let kept = wait_final(&mut ca, &kept.id, 20).await;
    assert_eq!(kept.state, JobState::Succeeded as i32);
    redis.kill();

    let t0 = std::time::Instant::now();
    // A keyed request fails closed: never a second generation.
    let s = stream(&mut ca, keyed("outage-1")).await.status.unwrap();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "STATE_UNAVAILABLE");
    // A job that cannot be stored is never "accepted".
    let s = ca.submit_job(authed(request("chat"))).await.unwrap_err();
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "STATE_UNAVAILABLE");
    // Unkeyed traffic is served: limits and caps fail open.
    for _ in 0..5 {
        let got = stream(&mut ca, authed(request("chat"))).await;
        assert!(got.finished.is_some(), "{:?}", got.status);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "no call paid a hang: {:?}",
        t0.elapsed()
    );
    let (_, metrics) = a.sy.admin_get("/metrics").await;
    assert!(
        metric_sum(&metrics, "switchyard_state_errors_total{") >= 2.0,
        "{metrics}"
    );
    assert!(a.sy.logs().contains("shared state unavailable"));

    // Redis returns: service resumes without a restart, the job is intact.
    redis.run().await;
    let mut ok = false;
    for _ in 0..100 {
        if stream(&mut ca, keyed("outage-2")).await.finished.is_some() {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "keyed requests served again after Redis returned");
    let job = ca.get_job(job_id(&kept.id)).await.unwrap().into_inner();
    assert_eq!(job, kept, "the job record survived the Redis restart");
}
