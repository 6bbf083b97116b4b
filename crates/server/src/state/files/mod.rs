//! Files in one home: Batch API files, a batch's record, line list and
//! output, each owned by a tenant and kept for its TTL. This face (`Files`,
//! async, handed out by the job store they live beside) with the quotas
//! (`quota`, pure policy both backends ask), the embedded store (`embedded`,
//! in the queue's SQLite file) and the fleet's on Redis (`redis`, chunked,
//! under the `{jobs}` hash tag).
//!
//! When the store does not answer, nothing is half stored: an upload fails
//! whole (`QueueError::Unavailable`: STATE_UNAVAILABLE to the caller), what
//! it stored first is deleted in the background (`delete_soon`), and a Redis
//! upload that cannot be aborted expires with its lease (the next purge
//! returns its charge).

use std::sync::Arc;
use std::time::Duration;

use crate::state::jobs::{JobStore, QueueError};

pub mod embedded;
pub mod quota;
pub mod redis;

pub use embedded::EmbeddedFiles;
pub use redis::RedisBlobs;

use quota::{BlobKind, FileLimits, Usage};

/// One blob to store.
#[derive(Debug, Clone, Copy)]
pub struct BlobPut<'a> {
    pub name: &'a str,
    pub tenant: &'a str,
    pub kind: BlobKind,
    pub ttl: Duration,
}

/// File operations for async callers. Cheap to clone.
#[derive(Clone)]
pub struct Files {
    backend: Backend,
}

/// Where the files live: beside the jobs.
#[derive(Clone)]
enum Backend {
    Sqlite(EmbeddedFiles),
    Redis(RedisBlobs),
}

impl Files {
    /// Files in the queue's SQLite file.
    pub fn embedded(store: Arc<JobStore>) -> Files {
        Files {
            backend: Backend::Sqlite(EmbeddedFiles::new(store)),
        }
    }

    /// Files on the fleet's Redis.
    pub fn redis(blobs: RedisBlobs) -> Files {
        Files {
            backend: Backend::Redis(blobs),
        }
    }

    /// Stores (or replaces) a blob (a Batch API file, a batch's record or
    /// output) where the jobs live, charged to its tenant; an upload past
    /// a quota is refused with `QueueError::Quota` and nothing is stored.
    pub async fn put(
        &self,
        blob: BlobPut<'_>,
        value: Vec<u8>,
        limits: &FileLimits,
    ) -> Result<(), QueueError> {
        let store = match &self.backend {
            Backend::Redis(r) => return r.put(&blob, &value, limits).await,
            Backend::Sqlite(s) => s,
        };
        let (name, tenant, limits) = (blob.name.to_string(), blob.tenant.to_string(), *limits);
        let (kind, ttl) = (blob.kind, blob.ttl);
        store
            .blocking(move |s| {
                let blob = BlobPut {
                    name: &name,
                    tenant: &tenant,
                    kind,
                    ttl,
                };
                s.put(&blob, &value, &limits)
            })
            .await
    }

    /// A blob's bytes, unless it expired.
    pub async fn get(
        &self,
        name: &str,
        limits: &FileLimits,
    ) -> Result<Option<Vec<u8>>, QueueError> {
        match &self.backend {
            Backend::Redis(r) => r.get(name, limits).await,
            Backend::Sqlite(s) => {
                let k = name.to_string();
                s.blocking(move |s| s.get(&k)).await
            }
        }
    }

    /// Deletes a blob and returns its charge; `false` if there was none.
    pub async fn delete(&self, name: &str) -> Result<bool, QueueError> {
        match &self.backend {
            Backend::Redis(r) => r.delete(name).await,
            Backend::Sqlite(s) => {
                let k = name.to_string();
                s.blocking(move |s| s.delete(&k)).await
            }
        }
    }

    /// Deletes a blob in the background, retrying (100 ms, doubling to
    /// 2 s) for up to a minute while the store does not answer: what a
    /// failed upload stored first does not stay behind.
    pub fn delete_soon(&self, name: String) {
        const GIVE_UP: Duration = Duration::from_secs(60);
        let files = self.clone();
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + GIVE_UP;
            let mut wait = Duration::from_millis(100);
            loop {
                match files.delete(&name).await {
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
    pub async fn usage(&self, tenant: &str) -> Result<Usage, QueueError> {
        match &self.backend {
            Backend::Redis(r) => r.usage(tenant).await,
            Backend::Sqlite(s) => {
                let t = tenant.to_string();
                s.blocking(move |s| s.usage(&t)).await
            }
        }
    }

    /// Returns the charges of expired blobs, at most `limit` (Redis; the
    /// SQLite file's sweep deletes its expired blobs with the jobs).
    pub(crate) async fn purge(&self, limit: usize) -> Result<usize, QueueError> {
        match &self.backend {
            Backend::Redis(r) => r.purge(limit).await,
            Backend::Sqlite(_) => Ok(0),
        }
    }
}
