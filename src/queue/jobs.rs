//! Async face of the job store, embedded (SQLite, every call on the blocking
//! pool) or shared by the fleet (Redis, leases with fencing tokens). Every
//! state change is announced on a broadcast channel (job id) so `WatchJob`
//! streams wake up without polling; with Redis the notices come from every
//! replica. A sweeper task does the housekeeping every second, a bounded
//! amount each time: SQLite deletes finished jobs a `job_ttl` after they
//! finished and blobs past their `file_ttl` (Redis expires both itself);
//! both return the quota charges of expired blobs.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::quota::{FileLimits, Usage};
use super::{BlobPut, JobRecord, JobState, JobStore, NewJob, QueueError};
use crate::state::redis::RedisJobs;

/// How often the sweeper runs.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// Rows (jobs, blobs, charges) one sweep step handles, at most.
const SWEEP_LIMIT: usize = 500;

/// Queue operations for async callers. Cheap to share.
pub struct Jobs {
    backend: Backend,
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

fn storage_gone() -> QueueError {
    QueueError::Storage(rusqlite::Error::InvalidQuery)
}

impl Jobs {
    pub fn new(store: JobStore, drain_rate: f64, lease: Duration) -> Arc<Self> {
        let (changed, _) = broadcast::channel(1024);
        Self::with_sweeper(Backend::Sqlite(Arc::new(store)), changed, drain_rate, lease)
    }

    /// Jobs in Redis, shared by every replica naming the same server.
    pub fn redis(store: RedisJobs, drain_rate: f64, lease: Duration) -> Arc<Self> {
        let (changed, _) = broadcast::channel(1);
        Self::with_sweeper(Backend::Redis(store), changed, drain_rate, lease)
    }

    /// The queue, with its sweeper running when there is a runtime.
    fn with_sweeper(
        backend: Backend,
        changed: broadcast::Sender<String>,
        drain_rate: f64,
        lease: Duration,
    ) -> Arc<Self> {
        let stop = CancellationToken::new();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweeper(backend.clone(), stop.clone()));
        }
        Arc::new(Jobs {
            backend,
            changed,
            drain_rate,
            lease,
            _sweeper: stop.drop_guard(),
        })
    }

    /// The fleet backend, when jobs live in Redis.
    pub fn shared(&self) -> Option<&RedisJobs> {
        match &self.backend {
            Backend::Redis(r) => Some(r),
            Backend::Sqlite(_) => None,
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

    pub async fn submit(&self, job: OwnedJob) -> Result<JobRecord, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r
                .submit(
                    &job.tenant,
                    &job.route,
                    job.idempotency_key.as_deref(),
                    &job.fingerprint,
                    &job.request,
                )
                .await;
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

    /// Stores (or replaces) a blob (a Batch API file, a batch's record or
    /// output) where the jobs live, charged to its tenant; an upload past
    /// a quota is refused with `QueueError::Quota` and nothing is stored.
    pub async fn put_blob(
        &self,
        blob: BlobPut<'_>,
        value: Vec<u8>,
        limits: &FileLimits,
    ) -> Result<(), QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.blobs().put(&blob, &value, limits).await;
        }
        let (name, tenant, limits) = (blob.name.to_string(), blob.tenant.to_string(), *limits);
        let (kind, ttl) = (blob.kind, blob.ttl);
        self.blocking(move |s| {
            let blob = BlobPut {
                name: &name,
                tenant: &tenant,
                kind,
                ttl,
            };
            s.put_blob(&blob, &value, &limits)
        })
        .await
    }

    /// A blob's bytes, unless it expired.
    pub async fn get_blob(
        &self,
        name: &str,
        limits: &FileLimits,
    ) -> Result<Option<Vec<u8>>, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.blobs().get(name, limits).await;
        }
        let k = name.to_string();
        self.blocking(move |s| s.get_blob(&k)).await
    }

    /// Deletes a blob and returns its charge; `false` if there was none.
    pub async fn delete_blob(&self, name: &str) -> Result<bool, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.blobs().delete(name).await;
        }
        let k = name.to_string();
        self.blocking(move |s| s.delete_blob(&k)).await
    }

    /// Deletes a blob in the background, retrying (100 ms, doubling to
    /// 2 s) for up to a minute while the store does not answer: what a
    /// failed upload stored first does not stay behind.
    pub fn delete_blob_soon(self: &Arc<Self>, name: String) {
        const GIVE_UP: Duration = Duration::from_secs(60);
        let jobs = self.clone();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + GIVE_UP;
            let mut wait = Duration::from_millis(100);
            loop {
                match jobs.delete_blob(&name).await {
                    Ok(_) => return,
                    Err(e) if tokio::time::Instant::now() + wait >= until => {
                        tracing::warn!(error = %e, "a failed upload's metadata stays until queue.file_ttl");
                        return;
                    }
                    Err(_) => {
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(2));
                    }
                }
            }
        });
    }

    /// What `tenant` keeps in blobs now, and every tenant together.
    pub async fn blob_usage(&self, tenant: &str) -> Result<Usage, QueueError> {
        if let Backend::Redis(r) = &self.backend {
            return r.blobs().usage(tenant).await;
        }
        let t = tenant.to_string();
        self.blocking(move |s| s.blob_usage(&t)).await
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
async fn sweep_once(backend: &Backend) -> Result<(), QueueError> {
    match backend {
        Backend::Sqlite(store) => {
            let store = store.clone();
            let swept =
                tokio::task::spawn_blocking(move || store.sweep(super::now_ms(), SWEEP_LIMIT))
                    .await
                    .map_err(|_| storage_gone())??;
            if swept != super::Swept::default() {
                tracing::debug!(?swept, "job queue swept");
            }
        }
        Backend::Redis(r) => {
            r.blobs().purge(SWEEP_LIMIT).await?;
        }
    }
    Ok(())
}

/// Sweeps every `SWEEP_EVERY` until stopped.
async fn sweeper(backend: Backend, stop: CancellationToken) {
    let mut every = tokio::time::interval(SWEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Err(e) = sweep_once(&backend).await {
            tracing::debug!(error = %e, "job queue sweep skipped");
        }
    }
}
