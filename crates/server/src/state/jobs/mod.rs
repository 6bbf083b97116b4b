//! The job store in one home: this face (`Jobs`, async, one per process)
//! with its errors (`QueueError`; the record it keeps is `crate::job`'s,
//! re-exported here, since the event sink carries it to callers) and what a
//! Redis outage does to it, the embedded SQLite store (`embedded`, every call
//! on the blocking pool) and the fleet's on Redis (`redis`, leases with
//! fencing tokens). Every state change is announced on a broadcast channel
//! (job id) so `WatchJob` streams wake up without polling; with Redis the
//! notices come from every replica. A sweeper task does the housekeeping
//! every second, a bounded amount each time: SQLite deletes finished jobs a
//! `job_ttl` after they finished and blobs past their `file_ttl` (Redis
//! expires both itself); both return the quota charges of expired blobs.
//!
//! When Redis does not answer, nothing is guessed: a submit fails with
//! `QueueError::Unavailable` (never a job reported accepted that was not
//! stored: STATE_UNAVAILABLE to the caller), and a run that cannot renew its
//! lease loses its job to another replica once the lease lapses.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::RequestError;
use crate::policy::token_bucket::TokenBucketConfig;
use crate::state::files::{Files, RedisBlobs};
use crate::state::{StateError, StateFaults};

pub mod embedded;
pub mod redis;

pub use crate::job::{JobRecord, JobState};
pub use embedded::{JobStore, NewJob, Swept};
pub use redis::RedisJobs;

/// A queue operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("the queue is full ({0} jobs waiting or running)")]
    Full(usize),
    #[error("tenant `{tenant}` has {count} jobs waiting or running (its limit)")]
    TenantFull { tenant: String, count: usize },
    #[error("this idempotency key was used with a different request")]
    KeyReused,
    #[error("queue storage: {0}")]
    Storage(#[from] rusqlite::Error),
    /// The file exists but holds no Switchyard queue: refusing to start on it.
    #[error("the file exists but holds no Switchyard queue ({0}); it may have been truncated or replaced. Refusing to start so its jobs are not silently forgotten: restore it, move it away, or set queue.accept_empty_file = true (--accept-empty-queue) to begin an empty queue in it")]
    NotAQueue(String),
    /// The shared (Redis) queue could not be reached: nothing was stored.
    #[error("queue state unavailable: {0}")]
    Unavailable(String),
    /// A file would pass its tenant's quota or the store's budget: nothing was stored.
    #[error("{0}")]
    Quota(#[from] crate::state::files::quota::Refusal),
}

/// Bounds of the queue.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_jobs: usize,
    pub max_per_tenant: usize,
    pub ttl: Duration,
}

/// How a queue failure reaches the caller.
impl From<QueueError> for RequestError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Full(_) | QueueError::TenantFull { .. } | QueueError::Quota(_) => {
                RequestError::QueueFull(e.to_string())
            }
            QueueError::KeyReused => RequestError::IdempotencyKeyReused,
            QueueError::Storage(_) | QueueError::NotAQueue(_) => {
                RequestError::QueueUnavailable(e.to_string())
            }
            QueueError::Unavailable(e) => RequestError::StateUnavailable(e),
        }
    }
}

/// How often the sweeper runs.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Rows (jobs, blobs, charges) one sweep step handles, at most.
const SWEEP_LIMIT: usize = 500;

/// Whether a queued job may run now under the drain rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainTurn {
    Go,
    /// The fleet drained its rate's worth: wait for a token.
    Throttled,
    /// The fleet's bucket cannot be asked: no job runs until it can.
    Unavailable,
}

/// Queue operations for async callers. Cheap to share.
pub struct Jobs {
    backend: Backend,
    /// Counts and logs what Redis did not answer (the fleet backend).
    faults: Option<Arc<StateFaults>>,
    /// The files stored beside the jobs.
    files: Files,
    changed: broadcast::Sender<String>,
    /// Drain rate (jobs per second), for start estimates.
    pub drain_rate: f64,
    /// How long a claimed run may take before the job is returned to the queue.
    pub lease: Duration,
    /// Stops the sweeper when the queue goes.
    _sweeper: DropGuard,
}

/// A new job with owned fields (moved to the blocking pool).
pub struct OwnedJob {
    pub tenant: String,
    pub route: String,
    pub idempotency_key: Option<String>,
    pub fingerprint: Vec<u8>,
    pub request: Vec<u8>,
}

/// Where the jobs live.
#[derive(Clone)]
enum Backend {
    Sqlite(Arc<JobStore>),
    Redis(RedisJobs),
}

/// The blocking pool lost a call (or the store is not the SQLite file).
pub(crate) fn storage_gone() -> QueueError {
    QueueError::Storage(rusqlite::Error::InvalidQuery)
}

impl Jobs {
    pub fn new(store: JobStore, drain_rate: f64, lease: Duration) -> Arc<Self> {
        let (changed, _) = broadcast::channel(1024);
        let store = Arc::new(store);
        let files = Files::embedded(store.clone());
        let backend = Backend::Sqlite(store);
        Self::with_sweeper(backend, None, files, changed, drain_rate, lease)
    }

    /// Jobs in Redis, shared by every replica naming the same server; a
    /// call Redis does not answer is counted and logged in `faults`.
    pub fn redis(
        store: RedisJobs,
        faults: Arc<StateFaults>,
        drain_rate: f64,
        lease: Duration,
    ) -> Arc<Self> {
        let (changed, _) = broadcast::channel(1);
        let files = Files::redis(RedisBlobs::new(store.redis().clone()));
        let backend = Backend::Redis(store);
        Self::with_sweeper(backend, Some(faults), files, changed, drain_rate, lease)
    }

    /// The queue, with its sweeper running when there is a runtime.
    fn with_sweeper(
        backend: Backend,
        faults: Option<Arc<StateFaults>>,
        files: Files,
        changed: broadcast::Sender<String>,
        drain_rate: f64,
        lease: Duration,
    ) -> Arc<Self> {
        let stop = CancellationToken::new();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweeper(backend.clone(), files.clone(), stop.clone()));
        }
        Arc::new(Jobs {
            backend,
            faults,
            files,
            changed,
            drain_rate,
            lease,
            _sweeper: stop.drop_guard(),
        })
    }

    /// The files (Batch API files and records) stored beside the jobs.
    pub fn files(&self) -> &Files {
        &self.files
    }

    /// A turn under the drain rate. On Redis the bucket is the fleet's
    /// (`{jobs}:drain:drain`): N replicas do not drain N times faster; when
    /// Redis does not answer no job runs (it waits, like one no target can
    /// take yet). Embedded, the recovery actor's own bucket is the only one.
    pub async fn drain_turn(&self, drain: TokenBucketConfig) -> DrainTurn {
        let Backend::Redis(r) = &self.backend else {
            return DrainTurn::Go;
        };
        match r.redis().bucket_take("drain", drain).await {
            Ok(true) => DrainTurn::Go,
            Ok(false) => DrainTurn::Throttled,
            Err(e) => {
                tracing::warn!(error = %e, "job queue: the fleet drain bucket is unavailable");
                DrainTurn::Unavailable
            }
        }
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&JobStore) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, QueueError> {
        let Backend::Sqlite(store) = &self.backend else {
            return Err(storage_gone());
        };
        let store = store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|_| storage_gone())?
    }

    fn announce(&self, id: &str) {
        // Redis publishes from inside its scripts, to every replica.
        let _ = self.changed.send(id.to_string());
    }

    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        match &self.backend {
            Backend::Redis(r) => r.subscribe_changes(),
            Backend::Sqlite(_) => self.changed.subscribe(),
        }
    }

    /// Accepts a job durably. When Redis does not answer nothing is stored
    /// and the error says so (never "accepted" for a job that was not
    /// stored), counted in `switchyard_state_errors_total{function="jobs"}`.
    pub async fn submit(&self, job: OwnedJob) -> Result<JobRecord, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            let stored = r
                .submit(
                    &job.tenant,
                    &job.route,
                    job.idempotency_key.as_deref(),
                    &job.fingerprint,
                    &job.request,
                )
                .await;
            if let (Err(QueueError::Unavailable(why)), Some(faults)) = (&stored, &self.faults) {
                let err = StateError::Unavailable(why.clone());
                faults.record("jobs", &err, "the job was not stored");
            }
            return stored;
        }
        let record = self
            .blocking(move |s| {
                s.submit(NewJob {
                    tenant: &job.tenant,
                    route: &job.route,
                    idempotency_key: job.idempotency_key.as_deref(),
                    fingerprint: &job.fingerprint,
                    request: &job.request,
                })
            })
            .await?;
        self.announce(&record.id);
        Ok(record)
    }

    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.get(id).await;
        }
        let id = id.to_string();
        self.blocking(move |s| s.get(&id)).await
    }

    pub async fn claim(&self) -> Result<Option<JobRecord>, QueueError> {
        let lease = self.lease;
        if let Backend::Redis(r) = &self.backend {
            // A replica that died mid-run loses its lease; its job comes back here.
            let recovered = r.recover_expired_leases().await?;
            if recovered > 0 {
                tracing::warn!(
                    recovered,
                    "job queue: leases lapsed (a replica died mid-run); jobs requeued"
                );
            }
            return r.claim(lease).await;
        }
        let record = self.blocking(move |s| s.claim(lease)).await?;
        if let Some(r) = &record {
            self.announce(&r.id);
        }
        Ok(record)
    }

    pub async fn succeed(
        &self,
        id: &str,
        claim: &str,
        result: Vec<u8>,
    ) -> Result<bool, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.succeed(id, claim, &result).await;
        }
        let (i, c) = (id.to_string(), claim.to_string());
        let done = self.blocking(move |s| s.succeed(&i, &c, &result)).await?;
        self.announce(id);
        Ok(done)
    }

    pub async fn fail(
        &self,
        id: &str,
        claim: &str,
        error: String,
        reason: &'static str,
    ) -> Result<bool, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.fail(id, claim, &error, reason).await;
        }
        let (i, c) = (id.to_string(), claim.to_string());
        let done = self
            .blocking(move |s| s.fail(&i, &c, &error, reason))
            .await?;
        self.announce(id);
        Ok(done)
    }

    pub async fn release(&self, id: &str, claim: &str) -> Result<bool, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.release(id, claim).await;
        }
        let (i, c) = (id.to_string(), claim.to_string());
        let done = self.blocking(move |s| s.release(&i, &c)).await?;
        self.announce(id);
        Ok(done)
    }

    /// Ends a job that has not started (FAILED, reason CANCELLED).
    pub async fn cancel(&self, id: &str, error: &str) -> Result<bool, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.cancel(id, error).await;
        }
        let (i, e) = (id.to_string(), error.to_string());
        let done = self.blocking(move |s| s.cancel(&i, &e)).await?;
        self.announce(id);
        Ok(done)
    }

    /// The states of these jobs (`None`: no such job), in order, without
    /// reading any job's request or answer.
    pub async fn states(&self, ids: Vec<String>) -> Result<Vec<Option<JobState>>, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.states(&ids).await;
        }
        self.blocking(move |s| s.states(&ids)).await
    }

    /// Runs cut short by this process's previous life go back to the queue.
    /// With Redis other replicas' runs are live: only lapsed leases return.
    pub async fn requeue_all_running(&self) -> Result<usize, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.recover_expired_leases().await;
        }
        self.blocking(|s| s.requeue_all_running()).await
    }

    pub async fn recover_expired_leases(&self) -> Result<usize, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.recover_expired_leases().await;
        }
        self.blocking(|s| s.recover_expired_leases()).await
    }

    /// Extends a running job's lease (Redis; the SQLite lease outlives any run).
    pub async fn renew(&self, id: &str, claim: &str) -> Result<bool, QueueError> {
        match &self.backend {
            Backend::Redis(r) => r.renew(id, claim, self.lease).await,
            Backend::Sqlite(_) => Ok(true),
        }
    }

    pub async fn depth(&self) -> Result<(u64, Option<Duration>), QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.depth().await;
        }
        self.blocking(|s| s.depth()).await
    }

    /// Jobs ahead and the estimated wait before this one runs.
    pub async fn eta(&self, record: &JobRecord) -> (u64, Duration) {
        let position = match &self.backend {
            Backend::Redis(store) => store.position(&record.id).await.unwrap_or(0),
            Backend::Sqlite(_) => {
                let r = record.clone();
                self.blocking(move |s| s.position(&r)).await.unwrap_or(0)
            }
        };
        let rate = self.drain_rate.max(0.001);
        (position, Duration::from_secs_f64(position as f64 / rate))
    }
}

/// One round of housekeeping on `backend`, a bounded amount of work.
async fn sweep_once(backend: &Backend, files: &Files) -> Result<(), QueueError> {
    match backend {
        Backend::Sqlite(store) => {
            let store = store.clone();
            let swept =
                tokio::task::spawn_blocking(move || store.sweep(embedded::now_ms(), SWEEP_LIMIT))
                    .await
                    .map_err(|_| storage_gone())??;
            if swept != Swept::default() {
                tracing::debug!(?swept, "job queue swept");
            }
        }
        Backend::Redis(_) => {
            files.purge(SWEEP_LIMIT).await?;
        }
    }
    Ok(())
}

/// Sweeps every `SWEEP_EVERY` until stopped.
async fn sweeper(backend: Backend, files: Files, stop: CancellationToken) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = sweep_once(&backend, &files).await {
            tracing::debug!(error = %e, "job queue sweep skipped");
        }
    }
}
