//! The fleet's shared state under load and outages, through real
//! `switchyard serve` replicas on one real `redis-server`: the cost ledger
//! stays small and fast however many charges a window holds, a tenant without
//! a cap writes nothing, a Redis outage bounds a capped tenant's spend by each
//! replica's allowance (or refuses it on a `fail_closed` route) and the
//! charges reach the ledger when Redis returns, and tenant slots and
//! idempotency keys are leases: renewed while their request lives, given back
//! after a stall, lapsed soon after their replica died.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard::proto;

/// Two tenants: `team-a` (capped where a test says so) and `team-b`.
const TOKENS: &str = "team-a:aaaaaaaaaaaaaaaaaaaaaaaa,team-b:bbbbbbbbbbbbbbbbbbbbbbbb";
const A: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";
const B: &str = "bbbbbbbbbbbbbbbbbbbbbbbb";
const HOUR: Duration = Duration::from_secs(3600);

/// A provider whose answers cost exactly 1 USD: output at 0.1 USD a token,
/// `max_tokens = 10`, and the mock sends 10 tokens.
fn priced_provider(base_url: &str) -> String {
    format!(
        r#"
[[providers]]
id = "p"
kind = "openai"
base_url = "{base_url}"
first_token_timeout = "40s"
idle_timeout = "10s"
  [[providers.models]]
  name = "m"
  capabilities = ["chat", "stream"]
  context_tokens = 8192
  price = {{ input_per_mtok = 0.0, output_per_mtok = 100000.0 }}
"#
    )
}

struct Replica {
    mock: Mock,
    sy: Switchyard,
}

impl Replica {
    /// A replica on `redis` with `head` (TOML before the providers) and
    /// `route_extra` (lines of the `chat` route).
    async fn start(head: &str, route_extra: &str, redis: &RedisServer) -> Replica {
        let mock = Mock::start("openai", &[]).await;
        let config = format!(
            "[auth]\nmode = \"tokens\"\ntokens_env = \"SY_TEST_TOKENS\"\n[state]\nbackend = \"redis\"\n{head}\n{}{}{route_extra}\n",
            priced_provider(&mock.base_url()),
            route("chat", &["p/m"])
        );
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

    async fn state_errors(&self) -> f64 {
        let (_, metrics) = self.sy.admin_get("/metrics").await;
        metric_sum(&metrics, "switchyard_state_errors_total{")
    }
}

/// The standard request (1 USD) as `token`'s tenant, with an idempotency key if given.
fn call(token: &str, key: &str) -> tonic::Request<proto::CompletionRequest> {
    let mut req = tonic::Request::new(proto::CompletionRequest {
        max_tokens: 10,
        idempotency_key: key.into(),
        ..request("chat")
    });
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

/// Sends `n` requests one after another; the USD served and the refusals' reasons.
async fn spend(r: &Replica, token: &str, n: usize) -> (f64, Vec<String>) {
    let mut client = r.client().await;
    let mut usd = 0.0;
    let mut refused = Vec::new();
    for _ in 0..n {
        let got = stream(&mut client, call(token, "")).await;
        match (got.finished, got.status) {
            (Some(f), _) => usd += f.cost_usd,
            (None, Some(s)) => refused.push(reason(&s)),
            other => panic!("{other:?}"),
        }
    }
    (usd, refused)
}

/// A library client of the same Redis, to read and fill the ledger.
fn ledger(redis: &RedisServer) -> switchyard::state::redis::Redis {
    switchyard::state::redis::Redis::new(&redis.url(), "switchyard:", Duration::from_secs(5))
        .unwrap()
}

async fn redis_conn(redis: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Keys in Redis matching `pattern`.
async fn keys(redis: &RedisServer, pattern: &str) -> Vec<String> {
    redis::cmd("KEYS")
        .arg(pattern)
        .query_async(&mut redis_conn(redis).await)
        .await
        .unwrap()
}

/// `used_memory` from `INFO memory`, in bytes.
async fn used_memory(redis: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut redis_conn(redis).await)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Records `n` charges of `usd` for `tenant` through the library, 256 at a time.
async fn charge_many(redis: &RedisServer, tenant: &str, n: usize, usd: f64) {
    let r = ledger(redis);
    let mut left = n;
    while left > 0 {
        let batch = left.min(256);
        let calls = (0..batch).map(|i| {
            let r = r.clone();
            async move { r.cost_settle(tenant, &format!("c{i}"), usd, HOUR).await }
        });
        for result in futures_util::future::join_all(calls).await {
            result.unwrap();
        }
        left -= batch;
    }
}

/// R1: 250,000 charges in a tenant's window (70 requests a second for an
/// hour) once made every reservation time out, fail open and open the Redis
/// breaker for every tenant. The ledger stays small, the cap holds exactly,
/// no state call fails, and another tenant's keyed request is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_with_250k_charges_in_its_window_is_capped_exactly_and_redis_stays_small() {
    let Some(redis) = RedisServer::start("ledger at 250k charges").await else {
        return;
    };
    charge_many(&redis, "team-a", 250_000, 0.000_01).await;
    let memory = used_memory(&redis).await;
    assert!(
        memory < 8 << 20,
        "Redis holds {memory} bytes after 250k charges"
    );
    let head = "[cost]\ntenant_caps_usd = { \"team-a\" = 5.0 }";
    let a = Replica::start(head, "", &redis).await;
    // 2.5 USD spent: two 1 USD requests fit under 5 USD, the third does not.
    let (usd, refused) = spend(&a, A, 4).await;
    assert_eq!(usd, 2.0, "{refused:?}");
    assert_eq!(refused, ["COST_CAP", "COST_CAP"]);
    assert_eq!(a.state_errors().await, 0.0, "{}", a.sy.logs());
    let mut client = a.client().await;
    let other = stream(&mut client, call(B, "b-1")).await;
    assert!(other.finished.is_some(), "{:?}", other.status);
    let spent = ledger(&redis).cost_spent("team-a", HOUR).await.unwrap();
    assert!((spent - 4.5).abs() < 1e-6, "{spent}");
}

/// R1: a tenant without a cap makes no ledger write at all; a capped one does.
#[tokio::test]
async fn an_uncapped_tenant_writes_no_ledger_key() {
    let Some(redis) = RedisServer::start("uncapped tenant").await else {
        return;
    };
    let head = "[cost]\ntenant_caps_usd = { \"team-b\" = 100.0 }";
    let a = Replica::start(head, "", &redis).await;
    let (usd, refused) = spend(&a, A, 3).await;
    assert_eq!((usd, refused.len()), (3.0, 0));
    assert_eq!(keys(&redis, "*{t:team-a}*").await, Vec::<String>::new());
    let (usd, _) = spend(&a, B, 1).await;
    assert_eq!(usd, 1.0);
    assert!(!keys(&redis, "*{t:team-b}*").await.is_empty());
    assert_eq!(
        ledger(&redis).cost_spent("team-b", HOUR).await.unwrap(),
        1.0
    );
}

/// R3: during a Redis outage each replica spends at most its allowance (the
/// tenant's last known room split by the two live replicas), and every
/// charge made meanwhile is in the ledger once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_bounds_spend_by_the_allowance_and_settles_it_when_redis_returns() {
    let Some(mut redis) = RedisServer::start("outage allowance").await else {
        return;
    };
    let head = "[cost]\ndefault_cap_usd = 5.0";
    let a = Replica::start(head, "", &redis).await;
    let b = Replica::start(head, "", &redis).await;
    // Each replica serves team-a once: A saw 4 USD of room left, B 3.
    assert_eq!(spend(&a, A, 1).await.0, 1.0);
    assert_eq!(spend(&b, A, 1).await.0, 1.0);
    // Both have counted each other (heartbeats every 5 s).
    tokio::time::sleep(Duration::from_secs(7)).await;
    redis.kill();
    let (on_a, refused_a) = spend(&a, A, 6).await;
    let (on_b, refused_b) = spend(&b, A, 6).await;
    assert_eq!(on_a, 2.0, "A's allowance is 4 / 2: {refused_a:?}");
    assert_eq!(on_b, 1.0, "B's allowance is 3 / 2: {refused_b:?}");
    assert_eq!(refused_a, ["COST_CAP"; 4]);
    assert_eq!(refused_b, ["COST_CAP"; 5]);
    // A tenant neither replica has seen gets its cap split: 5 / 2 on A.
    let (on_a_b, refused) = spend(&a, B, 3).await;
    assert_eq!((on_a_b, refused), (2.0, vec!["COST_CAP".to_string()]));

    redis.run().await;
    let r = ledger(&redis);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let spent = r.cost_spent("team-a", HOUR).await.ok();
        let spent_b = r.cost_spent("team-b", HOUR).await.ok();
        if spent == Some(5.0) && spent_b == Some(2.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ledger shows {spent:?} and {spent_b:?}, not the 2 + 3 and 2 USD spent; logs:\n{}",
            a.sy.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The ledger is whole again: the cap is spent for the fleet.
    let (usd, refused) = spend(&b, A, 1).await;
    assert_eq!((usd, refused), (0.0, vec!["COST_CAP".to_string()]));
}

/// R3: a route with `fail_closed = true` refuses a capped tenant while Redis
/// is away; a tenant without a cap is still served there.
#[tokio::test]
async fn a_fail_closed_route_refuses_capped_requests_while_redis_is_away() {
    let Some(mut redis) = RedisServer::start("fail closed").await else {
        return;
    };
    let head = "[cost]\ntenant_caps_usd = { \"team-a\" = 50.0 }";
    let a = Replica::start(head, "fail_closed = true\n", &redis).await;
    assert_eq!(spend(&a, A, 1).await.0, 1.0);
    redis.kill();
    let (usd, refused) = spend(&a, A, 2).await;
    assert_eq!(usd, 0.0);
    assert_eq!(refused, ["STATE_UNAVAILABLE", "STATE_UNAVAILABLE"]);
    let (usd, refused) = spend(&a, B, 2).await;
    assert_eq!((usd, refused.len()), (2.0, 0), "{refused:?}");
}

/// Retries `key` as team-a until it is served; how long that took and what
/// answered before.
async fn until_served(
    r: &Replica,
    key: &str,
    within: Duration,
) -> (Duration, proto::Finished, Vec<String>) {
    let mut client = r.client().await;
    let started = Instant::now();
    let mut refusals = Vec::new();
    loop {
        let got = stream(&mut client, call(A, key)).await;
        if let Some(f) = got.finished {
            return (started.elapsed(), f, refusals);
        }
        let s = got.status.unwrap();
        refusals.push(reason(&s));
        assert!(
            started.elapsed() < within,
            "still refused after {within:?}: {refusals:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// R2: a 2 s Redis stall while a keyed request finishes once left its tenant
/// slot and its key taken for 150 s. The release and the completion are
/// retried until Redis answers: the caller's retry is replayed within
/// seconds, well inside the 20 s lease, and the slot is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_redis_stall_slots_and_keys_are_free_again_within_the_lease() {
    let Some(redis) = RedisServer::start("stall").await else {
        return;
    };
    let a = Replica::start("[limits]\ntenant_max_concurrent = 1", "", &redis).await;
    a.mock
        .set_fault(json!({"type": "slow_first_token", "delay_ms": 1000, "times": 1}))
        .await;
    let mut client = a.client().await;
    let first = tokio::spawn(async move { stream(&mut client, call(A, "stall-1")).await });
    a.mock
        .wait_for("the keyed request", |log| !log.is_empty())
        .await;
    // Redis stalls for 2 s while the request finishes.
    redis.freeze(true);
    let stalled = Instant::now();
    let got = first.await.unwrap();
    assert!(got.finished.is_some(), "{:?}", got.status);
    tokio::time::sleep(Duration::from_secs(2).saturating_sub(stalled.elapsed())).await;
    redis.freeze(false);
    let (took, replayed, refusals) = until_served(&a, "stall-1", Duration::from_secs(15)).await;
    assert!(
        replayed.replayed,
        "the stored answer after the stall: {refusals:?}"
    );
    assert_eq!(attempts(&a.mock.requests().await), 1, "one generation");
    let (usd, refused) = spend(&a, A, 1).await;
    assert_eq!(
        (usd, refused.len()),
        (1.0, 0),
        "the slot is free: {refused:?}"
    );
    println!("free again {took:?} after the stall ended ({refusals:?})");
}

/// Sends `key` as team-a from `r` until `live` ends; every answer must be
/// a refusal, but for one that raced `live`'s end (`r` may serve it once
/// the slot or key is given back). The refusals' reasons, and how many
/// upstream attempts `r` made for that call (0 or 1: a keyed call may be
/// a replay of the stored answer).
async fn refused_while(
    r: &Replica,
    live: &tokio::task::JoinHandle<Collected>,
    key: &str,
) -> (Vec<String>, usize) {
    let mut client = r.client().await;
    let mut refused = Vec::new();
    while !live.is_finished() {
        let got = stream(&mut client, call(A, key)).await;
        match got.status {
            Some(s) => refused.push(reason(&s)),
            // Raced the live request's end: B served it, by generating
            // (one attempt on its mock) or, for a keyed call, by replaying
            // the answer A stored under the key (no attempt).
            None if live.is_finished() => {
                let replayed = got.finished.as_ref().is_some_and(|f| f.replayed);
                return (refused, usize::from(!replayed));
            }
            None => panic!("served while the first request lived: {got:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (refused, 0)
}

/// Starts `n` requests (keyed `key`, or unkeyed when empty) on `r` that wait
/// `delay_ms` for their first token; returns once the mock has them all.
async fn hold(
    r: &Replica,
    n: usize,
    key: &str,
    delay_ms: u64,
) -> Vec<tokio::task::JoinHandle<Collected>> {
    r.mock.clear().await;
    r.mock
        .set_fault(json!({"type": "slow_first_token", "delay_ms": delay_ms, "times": n}))
        .await;
    let mut held = Vec::new();
    for i in 0..n {
        let mut client = r.client().await;
        let key = if i == 0 {
            key.to_string()
        } else {
            String::new()
        };
        held.push(tokio::spawn(async move {
            stream(&mut client, call(A, &key)).await
        }));
    }
    r.mock
        .wait_for("the held requests", |log| log.len() == n)
        .await;
    held
}

/// R2: a request living longer than its lease keeps its slots and its key
/// (renewed every third of the lease), so no duplicate runs meanwhile; a
/// replica killed mid-request holds them only until the lease (2 s here)
/// lapses, not the longest deadline plus 30 s (150 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_request_keeps_its_lease_and_a_dead_replicas_lapses_within_it() {
    let Some(redis) = RedisServer::start("leases").await else {
        return;
    };
    // `lease` goes under [state]; two slots per tenant.
    let head = "lease = \"2s\"\n[limits]\ntenant_max_concurrent = 2";
    let mut a = Replica::start(head, "", &redis).await;
    let b = Replica::start(head, "", &redis).await;
    // Two requests on A for 5 s (more than two leases) hold both slots: B is refused.
    let mut live = hold(&a, 2, "", 5000).await;
    let (refused, raced) = refused_while(&b, &live[0], "").await;
    let mut served_on_b = raced;
    assert!(refused.len() >= 8, "{refused:?}");
    assert!(refused.iter().all(|r| r == "TENANT_LIMIT"), "{refused:?}");
    for h in live.drain(..) {
        assert!(h.await.unwrap().finished.is_some());
    }
    // One keyed request on A for 5 s holds its key: B's duplicate is refused.
    let live = hold(&a, 1, "long-1", 5000).await;
    let (refused, raced) = refused_while(&b, &live[0], "long-1").await;
    served_on_b += raced;
    // (TENANT_LIMIT when B's own previous slot is still being given back.)
    let in_use = refused
        .iter()
        .filter(|r| *r == "IDEMPOTENCY_KEY_IN_USE")
        .count();
    assert!(in_use >= 4, "{refused:?}");
    assert!(
        refused
            .iter()
            .all(|r| r == "IDEMPOTENCY_KEY_IN_USE" || r == "TENANT_LIMIT"),
        "{refused:?}"
    );
    assert!(live
        .into_iter()
        .next()
        .unwrap()
        .await
        .unwrap()
        .finished
        .is_some());
    // B generated nothing while A's requests lived (only a call that
    // raced their end, seen served after it, may have reached B's mock).
    assert_eq!(
        attempts(&b.mock.requests().await),
        served_on_b,
        "B generated only after A's requests ended"
    );

    // A dies holding both slots and a key; B gets them after the lease.
    let _orphans = hold(&a, 2, "dead-1", 60_000).await;
    a.sy.child.start_kill().unwrap();
    let _ = a.sy.child.wait().await;
    let (took, served, refusals) = until_served(&b, "dead-1", Duration::from_secs(15)).await;
    assert!(!served.replayed);
    assert!(
        refusals.first().is_some_and(|r| r == "TENANT_LIMIT"),
        "held at first: {refusals:?}"
    );
    println!("the dead replica's hold lapsed after {took:?} ({refusals:?})");
}
