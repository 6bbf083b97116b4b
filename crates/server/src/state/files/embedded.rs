//! Files in the SQLite queue file (table `blobs`): a Batch API file's bytes
//! and metadata, a batch's record, line list and output, each owned by a
//! tenant and kept for its TTL. An upload is checked against its tenant's
//! quotas and the store's budget (`quota::admit`) in the transaction that
//! stores it, so two uploads cannot both take the last room, and a refused
//! or failed upload leaves nothing. The file's `sweep` deletes what expired.
//! Blocking calls: `blocking` runs them off the async threads.

use rusqlite::{params, Connection, OptionalExtension};

use std::sync::Arc;

use super::quota::{self, FileLimits, Usage};
use super::BlobPut;
use crate::state::jobs::embedded::now_ms;
use crate::state::jobs::{JobStore, QueueError};

/// The files in the queue's file; cheap to clone.
#[derive(Clone)]
pub struct EmbeddedFiles {
    store: Arc<JobStore>,
}

/// What `tenant` keeps at `now`, leaving out the blob named `except` (the
/// one about to be replaced).
fn usage(conn: &Connection, tenant: &str, now: i64, except: &str) -> rusqlite::Result<Usage> {
    let (files, bytes): (i64, i64) = conn.query_row(
        "SELECT COALESCE(SUM(files), 0), COALESCE(SUM(bytes), 0) FROM blobs
         WHERE tenant = ?1 AND expires_ms >= ?2 AND key != ?3",
        params![tenant, now, except],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let total: i64 = conn.query_row(
        "SELECT COALESCE(SUM(bytes), 0) FROM blobs WHERE expires_ms >= ?1 AND key != ?2",
        params![now, except],
        |r| r.get(0),
    )?;
    Ok(Usage {
        files: files.max(0) as u64,
        bytes: bytes.max(0) as u64,
        total_bytes: total.max(0) as u64,
    })
}

impl EmbeddedFiles {
    pub fn new(store: Arc<JobStore>) -> Self {
        EmbeddedFiles { store }
    }

    /// Runs `f` on the blocking pool.
    pub(super) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&EmbeddedFiles) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, QueueError> {
        let files = self.clone();
        tokio::task::spawn_blocking(move || f(&files))
            .await
            .map_err(|_| crate::state::jobs::storage_gone())?
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, rusqlite::Connection> {
        self.store.conn()
    }

    /// Stores (or replaces) a blob for its TTL; an upload past a quota is
    /// refused with `QueueError::Quota` and nothing is stored.
    pub fn put(
        &self,
        blob: &BlobPut<'_>,
        value: &[u8],
        limits: &FileLimits,
    ) -> Result<(), QueueError> {
        let now = now_ms();
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let held = usage(&tx, blob.tenant, now as i64, blob.name)?;
        quota::admit(limits, blob.tenant, held, value.len() as u64, blob.kind)?;
        let expires = now.saturating_add(blob.ttl.as_millis().min(u64::MAX as u128) as u64);
        tx.execute(
            "INSERT OR REPLACE INTO blobs (key, value, expires_ms, tenant, bytes, files)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                blob.name,
                value,
                expires.min(i64::MAX as u64) as i64,
                blob.tenant,
                value.len() as i64,
                blob.kind.files() as i64
            ],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// A blob's bytes, unless it expired.
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>, QueueError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT value FROM blobs WHERE key = ?1 AND expires_ms >= ?2",
                params![name, now_ms() as i64],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Deletes a blob (and its charge); `false` if there was none.
    pub fn delete(&self, name: &str) -> Result<bool, QueueError> {
        Ok(self
            .conn()
            .execute("DELETE FROM blobs WHERE key = ?1", params![name])?
            == 1)
    }

    /// What `tenant` keeps now, and every tenant together.
    pub fn usage(&self, tenant: &str) -> Result<Usage, QueueError> {
        Ok(usage(&self.conn(), tenant, now_ms() as i64, "")?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::state::files::quota::{BlobKind, Refusal};
    use crate::state::jobs::Limits;

    fn store(dir: &std::path::Path) -> EmbeddedFiles {
        let limits = Limits {
            max_jobs: 10,
            max_per_tenant: 10,
            ttl: Duration::from_secs(3600),
        };
        EmbeddedFiles::new(Arc::new(
            JobStore::open(&dir.join("q.sqlite3"), limits, false).unwrap(),
        ))
    }

    fn limits() -> FileLimits {
        FileLimits {
            max_files_per_tenant: 2,
            max_bytes_per_tenant: 1000,
            max_stored_bytes: 1500,
            chunk_timeout: Duration::from_secs(1),
        }
    }

    fn put(
        s: &EmbeddedFiles,
        name: &str,
        tenant: &str,
        kind: BlobKind,
        n: usize,
    ) -> Result<(), QueueError> {
        let blob = BlobPut {
            name,
            tenant,
            kind,
            ttl: Duration::from_secs(60),
        };
        s.put(&blob, &vec![7u8; n], &limits())
    }

    #[test]
    fn a_tenant_past_its_file_quota_is_refused_while_another_stores() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        put(&s, "a1", "a", BlobKind::Upload, 10).unwrap();
        put(&s, "a2", "a", BlobKind::Upload, 10).unwrap();
        let refused = put(&s, "a3", "a", BlobKind::Upload, 10).unwrap_err();
        assert!(
            matches!(
                refused,
                QueueError::Quota(Refusal::Files {
                    files: 2,
                    limit: 2,
                    ..
                })
            ),
            "{refused}"
        );
        assert_eq!(
            s.get("a3").unwrap(),
            None,
            "nothing of a refused upload is stored"
        );
        put(&s, "b1", "b", BlobKind::Upload, 10).unwrap();
        // What the service owes is counted, never refused.
        put(&s, "a-out", "a", BlobKind::Owed, 10).unwrap();
        let u = s.usage("a").unwrap();
        assert_eq!((u.files, u.bytes, u.total_bytes), (2, 30, 40));
    }

    #[test]
    fn bytes_and_the_budget_bound_uploads_and_a_replaced_blob_counts_once() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        put(&s, "a1", "a", BlobKind::Upload, 900).unwrap();
        assert!(matches!(
            put(&s, "a2", "a", BlobKind::Upload, 101),
            Err(QueueError::Quota(Refusal::Bytes { .. }))
        ));
        put(&s, "a1", "a", BlobKind::Upload, 1000).unwrap();
        assert_eq!(
            s.usage("a").unwrap().bytes,
            1000,
            "the old value is replaced, not added"
        );
        put(&s, "b1", "b", BlobKind::Upload, 500).unwrap();
        assert!(matches!(
            put(&s, "c1", "c", BlobKind::Upload, 1),
            Err(QueueError::Quota(Refusal::Budget { limit: 1500, .. }))
        ));
    }

    #[test]
    fn expired_blobs_stop_counting_and_the_sweep_deletes_them_a_bounded_number_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        for i in 0..5 {
            let name = format!("x{i}");
            let blob = BlobPut {
                name: &name,
                tenant: "a",
                kind: BlobKind::Owed,
                ttl: Duration::from_millis(1),
            };
            s.put(&blob, b"v", &limits()).unwrap();
        }
        let later = now_ms() + 10_000;
        assert_eq!(s.store.sweep(later, 3).unwrap().blobs, 3);
        assert_eq!(s.store.sweep(later, 3).unwrap().blobs, 2);
        assert_eq!(s.store.sweep(later, 3).unwrap().blobs, 0);
        let rows: i64 = s
            .conn()
            .query_row("SELECT COUNT(*) FROM blobs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0);
    }
}
