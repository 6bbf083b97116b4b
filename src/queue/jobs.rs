//! Async face of the job store: every SQLite call runs on the blocking pool,
//! and every state change is announced on a broadcast channel (job id) so
//! `WatchJob` streams wake up without polling.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;

use super::{JobRecord, JobStore, NewJob, QueueError};

/// Queue operations for async callers. Cheap to share.
pub struct Jobs {
    store: Arc<JobStore>,
    changed: broadcast::Sender<String>,
    /// Drain rate (jobs per second), for start estimates.
    pub drain_rate: f64,
    /// How long a claimed run may take before the job is returned to the queue.
    pub lease: Duration,
}

/// A new job with owned fields (moved to the blocking pool).
pub struct OwnedJob {
    pub tenant: String,
    pub route: String,
    pub idempotency_key: Option<String>,
    pub fingerprint: Vec<u8>,
    pub request: Vec<u8>,
}

fn storage_gone() -> QueueError {
    QueueError::Storage(rusqlite::Error::InvalidQuery)
}

impl Jobs {
    pub fn new(store: JobStore, drain_rate: f64, lease: Duration) -> Arc<Self> {
        let (changed, _) = broadcast::channel(1024);
        Arc::new(Jobs {
            store: Arc::new(store),
            changed,
            drain_rate,
            lease,
        })
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&JobStore) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, QueueError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|_| storage_gone())?
    }

    fn announce(&self, id: &str) {
        let _ = self.changed.send(id.to_string());
    }

    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.changed.subscribe()
    }

    pub async fn submit(&self, job: OwnedJob) -> Result<JobRecord, QueueError> {
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
        let id = id.to_string();
        self.blocking(move |s| s.get(&id)).await
    }

    pub async fn claim(&self) -> Result<Option<JobRecord>, QueueError> {
        let lease = self.lease;
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
        let (i, c) = (id.to_string(), claim.to_string());
        let done = self
            .blocking(move |s| s.fail(&i, &c, &error, reason))
            .await?;
        self.announce(id);
        Ok(done)
    }

    pub async fn release(&self, id: &str, claim: &str) -> Result<bool, QueueError> {
        let (i, c) = (id.to_string(), claim.to_string());
        let done = self.blocking(move |s| s.release(&i, &c)).await?;
        self.announce(id);
        Ok(done)
    }

    pub async fn requeue_all_running(&self) -> Result<usize, QueueError> {
        self.blocking(|s| s.requeue_all_running()).await
    }

    pub async fn recover_expired_leases(&self) -> Result<usize, QueueError> {
        self.blocking(|s| s.recover_expired_leases()).await
    }

    pub async fn depth(&self) -> Result<(u64, Option<Duration>), QueueError> {
        self.blocking(|s| s.depth()).await
    }

    /// Jobs ahead and the estimated wait before this one runs.
    pub async fn eta(&self, record: &JobRecord) -> (u64, Duration) {
        let r = record.clone();
        let position = self.blocking(move |s| s.position(&r)).await.unwrap_or(0);
        let rate = self.drain_rate.max(0.001);
        (position, Duration::from_secs_f64(position as f64 / rate))
    }
}
