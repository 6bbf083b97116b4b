//! Fault tests for the client: Redis killed, frozen and restarted under a
//! live client. Calls must fail as `Unavailable` within the call timeout,
//! the breaker must fail fast, and the same client must recover on its own.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use tokio::time::Instant;

use super::testutil::{RedisServer, CALL_TIMEOUT};
use crate::state::cost::CostDecision;
use crate::state::jobs::{JobState, Limits, QueueError, RedisJobs};
use crate::state::StateError;

const SLACK: Duration = Duration::from_millis(150);
const WINDOW: Duration = Duration::from_secs(60);
/// An open breaker answers from memory: well under any network round trip.
const FAST: Duration = Duration::from_millis(50);

fn limits() -> Limits {
    Limits {
        max_jobs: 100,
        max_per_tenant: 100,
        ttl: Duration::from_secs(3600),
    }
}

/// Retries `f` until it succeeds or `within` passes.
async fn eventually<T, E: std::fmt::Debug, F, Fut>(within: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + within;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < deadline, "still failing: {e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_fast_opens_the_breaker_and_the_same_client_recovers_with_its_jobs() {
    let Some(mut server) = RedisServer::start_with(&["--appendfsync", "always"]) else {
        return;
    };
    let r = server.client();
    let jobs = RedisJobs::new(r.clone(), limits());
    let p = r.persistence().await.unwrap();
    assert!(p.appendonly);
    assert_eq!(p.appendfsync, "always");
    let job = jobs.submit("t", "chat", None, b"fp", b"req").await.unwrap();
    assert!(r.is_healthy());
    assert_eq!(r.errors_total(), 0);

    server.kill();
    for i in 0..3 {
        let started = Instant::now();
        let err = r.cost_spent("t", WINDOW).await.unwrap_err();
        assert!(
            started.elapsed() < CALL_TIMEOUT + SLACK,
            "call {i} took {:?}",
            started.elapsed()
        );
        assert!(
            matches!(err, StateError::Unavailable(ref m) if !m.contains("breaker")),
            "{err:?}"
        );
    }
    assert!(!r.is_healthy(), "three failures open the breaker");
    assert_eq!(r.errors_total(), 3);
    let started = Instant::now();
    let err = jobs.get(&job.id).await.unwrap_err();
    assert!(started.elapsed() < FAST, "open breaker fails fast");
    assert!(
        matches!(err, QueueError::Unavailable(ref m) if m.contains("breaker open")),
        "{err:?}"
    );
    let err = r
        .cost_reserve("t", "r", 1.0, 5.0, WINDOW, WINDOW)
        .await
        .unwrap_err();
    assert!(matches!(err, StateError::Unavailable(ref m) if m.contains("breaker open")));
    assert_eq!(r.errors_total(), 3, "fast failures are not Redis errors");

    server.restart();
    // The breaker lets a probe through after a second; no new client needed.
    let back = eventually(Duration::from_secs(5), || jobs.get(&job.id)).await;
    assert!(r.is_healthy());
    let back = back.unwrap();
    assert_eq!(
        (back.id.clone(), back.state),
        (job.id.clone(), JobState::Queued),
        "AOF kept it"
    );
    assert_eq!(
        r.cost_reserve("t", "r", 1.0, 5.0, WINDOW, WINDOW)
            .await
            .unwrap(),
        CostDecision::Reserved,
        "scripts are loaded again after the restart"
    );
    let claimed = jobs.claim(Duration::from_secs(30)).await.unwrap().unwrap();
    assert_eq!(claimed.id, job.id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_times_out_instead_of_hanging_and_recovery_follows() {
    let Some(server) = RedisServer::start() else {
        return;
    };
    let r = server.client();
    let jobs = RedisJobs::new(r.clone(), limits());
    jobs.submit("t", "chat", None, b"fp", b"req").await.unwrap();
    server.freeze(true);
    for _ in 0..3 {
        let started = Instant::now();
        let err = jobs.depth().await.unwrap_err();
        let took = started.elapsed();
        assert!(
            took >= CALL_TIMEOUT - Duration::from_millis(20) && took < CALL_TIMEOUT + SLACK,
            "{took:?}"
        );
        assert!(
            matches!(err, QueueError::Unavailable(ref m) if m.contains("timed out")),
            "{err:?}"
        );
    }
    assert!(!r.is_healthy());
    let started = Instant::now();
    assert!(jobs.depth().await.is_err());
    assert!(started.elapsed() < FAST);
    server.freeze(false);
    let (n, _) = eventually(Duration::from_secs(5), || jobs.depth()).await;
    assert_eq!(n, 1);
    assert!(r.is_healthy());
}

#[tokio::test]
async fn redis_down_at_start_is_no_error_until_called() {
    let Some(mut server) = RedisServer::start() else {
        return;
    };
    let url = server.url();
    server.kill();
    let r = super::Redis::new(&url, "switchyard:", CALL_TIMEOUT).unwrap();
    let started = Instant::now();
    assert!(r.cost_spent("t", WINDOW).await.is_err());
    assert!(started.elapsed() < CALL_TIMEOUT + SLACK);
    server.restart();
    let spent = eventually(Duration::from_secs(5), || r.cost_spent("t", WINDOW)).await;
    assert_eq!(spent, 0.0);
    // Bad URLs and prefixes are refused without echoing the URL.
    let err = super::Redis::new("http://user:secret@host", "p:", CALL_TIMEOUT).unwrap_err();
    assert!(!format!("{err}").contains("secret"));
    assert!(super::Redis::new("redis://h/", "p{x}:", CALL_TIMEOUT).is_err());
}
