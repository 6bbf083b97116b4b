//! Leases held in Redis (a tenant's slot, an idempotency claim): `Retries`
//! retries the calls that give something back (a slot release, an
//! idempotency completion or release) with backoff until Redis answers or
//! the lease they end has lapsed on its own; `Renewal` keeps a lease alive
//! while it is held. What a Redis outage does to each store is decided in
//! the store's own folder.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::backoff::Backoff;
use crate::state::{StateError, StateFaults};

/// Most calls being retried at once, and most bytes they carry (stored
/// answers); past either a call is not retried and its lease lapses instead.
pub const MAX_RETRIES: usize = 10_000;
pub const MAX_RETRY_BYTES: usize = 64 * 1024 * 1024;

/// Waits between tries: 100 ms doubling to 2 s.
const RETRY_BACKOFF: Backoff = Backoff {
    base: Duration::from_millis(100),
    cap: Duration::from_secs(2),
    retry_after_jitter: 0.0,
};

/// Retries calls that give something back, each in its own task, bounded in
/// count and bytes.
pub struct Retries {
    faults: Arc<StateFaults>,
    running: AtomicUsize,
    bytes: AtomicUsize,
    max: usize,
    max_bytes: usize,
}

/// What one retried call came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retried {
    /// Redis took it, after this many tries.
    Done(u32),
    /// Still failing when its lease lapsed on its own, after this many tries.
    Lapsed(u32),
}

impl Retries {
    pub fn new(faults: Arc<StateFaults>) -> Arc<Self> {
        Self::bounded(faults, MAX_RETRIES, MAX_RETRY_BYTES)
    }

    pub fn bounded(faults: Arc<StateFaults>, max: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(Retries {
            faults,
            running: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
            max,
            max_bytes,
        })
    }

    /// Calls being retried now.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Takes room for one call of `bytes`; false when full.
    fn admit(&self, bytes: usize) -> bool {
        if self.running.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.running.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        if self.bytes.fetch_add(bytes, Ordering::Relaxed) + bytes > self.max_bytes {
            self.bytes.fetch_sub(bytes, Ordering::Relaxed);
            self.running.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Runs `op` now and, while it fails, again after 100 ms, 200 ms, ...
    /// up to every 2 s, until it succeeds or `lease` has passed since the
    /// first try (what it gives back has lapsed by then). False, with
    /// nothing run, when too many calls (or bytes) are being retried.
    pub fn spawn<F, Fut>(
        self: &Arc<Self>,
        function: &'static str,
        bytes: usize,
        lease: Duration,
        op: F,
    ) -> bool
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), StateError>> + Send,
    {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if !self.admit(bytes) {
            return false;
        }
        let this = self.clone();
        rt.spawn(async move {
            this.run(function, lease, op).await;
            this.bytes.fetch_sub(bytes, Ordering::Relaxed);
            this.running.fetch_sub(1, Ordering::Relaxed);
        });
        true
    }

    /// The retry loop of one call.
    pub async fn run<F, Fut>(&self, function: &'static str, lease: Duration, mut op: F) -> Retried
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), StateError>>,
    {
        let started = Instant::now();
        let mut tries = 0u32;
        loop {
            tries += 1;
            let err = match op().await {
                Ok(()) => return Retried::Done(tries),
                Err(e) => e,
            };
            let wait = RETRY_BACKOFF.ceiling(tries - 1);
            if started.elapsed() + wait > lease {
                self.faults
                    .record(function, &err, "given up: the lease lapses on its own");
                return Retried::Lapsed(tries);
            }
            self.faults
                .record(function, &err, "retried until Redis answers");
            tokio::time::sleep(wait).await;
        }
    }
}

/// Keeps a lease alive while it is held: renews it every third of its
/// length (sooner after a failed try), in its own task; dropping the
/// `Renewal` stops it. A renewal answering `false` (the lease is gone:
/// released, completed or lapsed) stops it too.
pub struct Renewal {
    _stop: tokio_util::sync::DropGuard,
}

impl Renewal {
    pub fn start<F, Fut>(
        faults: Arc<StateFaults>,
        function: &'static str,
        lease: Duration,
        mut renew: F,
    ) -> Renewal
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = Result<bool, StateError>> + Send,
    {
        let stop = tokio_util::sync::CancellationToken::new();
        let every = lease / 3;
        let cancelled = stop.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let mut wait = every;
                loop {
                    tokio::select! {
                        _ = cancelled.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    wait = match renew().await {
                        Ok(true) => every,
                        Ok(false) => return,
                        Err(e) => {
                            faults.record(function, &e, "a lease was not renewed (tried again)");
                            every.min(Duration::from_secs(1))
                        }
                    };
                }
            });
        }
        Renewal {
            _stop: stop.drop_guard(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::telemetry::metrics::Metrics;

    fn retries(max: usize, max_bytes: usize) -> Arc<Retries> {
        Retries::bounded(StateFaults::new(Arc::new(Metrics::new())), max, max_bytes)
    }

    /// An op that fails `failures` times, then succeeds; logs when it was tried.
    fn flaky(
        failures: u32,
        log: Arc<Mutex<Vec<Duration>>>,
        t0: Instant,
    ) -> impl FnMut() -> std::future::Ready<Result<(), StateError>> {
        let mut n = 0;
        move || {
            log.lock().unwrap().push(t0.elapsed());
            n += 1;
            std::future::ready(if n > failures {
                Ok(())
            } else {
                Err(StateError::Unavailable("down".into()))
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_give_back_is_retried_with_backoff_until_redis_answers() {
        let r = retries(10, 100);
        let log = Arc::new(Mutex::new(Vec::new()));
        let op = flaky(5, log.clone(), Instant::now());
        let lease = Duration::from_secs(20);
        assert_eq!(r.run("tenant_limits", lease, op).await, Retried::Done(6));
        let ms: Vec<u128> = log.lock().unwrap().iter().map(|d| d.as_millis()).collect();
        assert_eq!(ms, [0, 100, 300, 700, 1500, 3100], "100 ms doubling");
        let log = Arc::new(Mutex::new(Vec::new()));
        let op = flaky(9, log.clone(), Instant::now());
        r.run("tenant_limits", lease, op).await;
        let gaps: Vec<u128> = log
            .lock()
            .unwrap()
            .windows(2)
            .map(|w| (w[1] - w[0]).as_millis())
            .collect();
        assert_eq!(
            gaps,
            [100, 200, 400, 800, 1600, 2000, 2000, 2000, 2000],
            "at most 2 s apart"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn retrying_stops_once_the_lease_has_lapsed_anyway() {
        let r = retries(10, 100);
        let log = Arc::new(Mutex::new(Vec::new()));
        let op = flaky(u32::MAX, log.clone(), Instant::now());
        let got = r.run("idempotency", Duration::from_secs(2), op).await;
        // Tries at 0, 0.1, 0.3, 0.7 and 1.5 s; the next (3.1 s) is past the lease.
        assert_eq!(got, Retried::Lapsed(5));
        assert_eq!(log.lock().unwrap().len(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_renewed_every_third_of_it_while_held_and_sooner_after_a_failure() {
        let faults = StateFaults::new(Arc::new(Metrics::new()));
        let t0 = Instant::now();
        let log = Arc::new(Mutex::new(Vec::new()));
        let seen = log.clone();
        let mut n = 0;
        let renewal = Renewal::start(
            faults,
            "tenant_limits",
            Duration::from_secs(15),
            move || {
                seen.lock().unwrap().push(t0.elapsed().as_millis());
                n += 1;
                // The second renewal finds Redis away.
                std::future::ready(if n == 2 {
                    Err(StateError::Unavailable("down".into()))
                } else {
                    Ok(true)
                })
            },
        );
        tokio::time::sleep(Duration::from_millis(17_500)).await;
        assert_eq!(*log.lock().unwrap(), [5000, 10000, 11000, 16000]);
        drop(renewal);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(log.lock().unwrap().len(), 4, "dropped: no more renewals");
        // A lease found to be another's is not renewed again.
        let faults = StateFaults::new(Arc::new(Metrics::new()));
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let _held = Renewal::start(faults, "idempotency", Duration::from_secs(3), move || {
            c.fetch_add(1, Ordering::Relaxed);
            std::future::ready(Ok(false))
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(count.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_bounded_in_count_and_bytes() {
        let r = retries(2, 100);
        let lease = Duration::from_secs(60);
        let down = || async { Err(StateError::Unavailable("down".into())) };
        assert!(r.spawn("tenant_limits", 10, lease, down));
        assert!(r.spawn("tenant_limits", 10, lease, down));
        assert!(!r.spawn("tenant_limits", 10, lease, down), "two at most");
        tokio::task::yield_now().await;
        assert_eq!(r.running(), 2);
        let r = retries(10, 100);
        assert!(r.spawn("idempotency", 60, lease, down));
        assert!(
            !r.spawn("idempotency", 60, lease, down),
            "100 bytes at most"
        );
        assert!(r.spawn("idempotency", 40, lease, down));
        // Once they lapse, their room is free again.
        tokio::time::sleep(lease + Duration::from_secs(5)).await;
        assert_eq!(r.running(), 0);
        assert!(r.spawn("idempotency", 100, lease, down));
    }
}
