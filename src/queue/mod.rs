//! The durable job queue: an embedded SQLite file in WAL mode with
//! `synchronous = FULL`, so a job accepted is on disk before the caller hears
//! about it and survives a SIGKILL. Jobs are claimed with a lease (a crashed
//! run goes back to the queue at restart), finished at most once (a stale
//! claim cannot overwrite a result), bounded per tenant and in total, and
//! expire after their TTL. Blocking calls: run them off the async threads.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

pub mod jobs;

/// A job's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Expired,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "QUEUED",
            JobState::Running => "RUNNING",
            JobState::Succeeded => "SUCCEEDED",
            JobState::Failed => "FAILED",
            JobState::Expired => "EXPIRED",
        }
    }

    fn parse(s: &str) -> JobState {
        match s {
            "RUNNING" => JobState::Running,
            "SUCCEEDED" => JobState::Succeeded,
            "FAILED" => JobState::Failed,
            "EXPIRED" => JobState::Expired,
            _ => JobState::Queued,
        }
    }

    /// No further change will happen.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Expired
        )
    }
}

/// One job as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct JobRecord {
    pub id: String,
    pub tenant: String,
    pub route: String,
    /// The encoded `CompletionRequest`.
    pub request: Vec<u8>,
    pub state: JobState,
    pub attempts: u32,
    /// The encoded `CompletionResponse`, once succeeded.
    pub result: Option<Vec<u8>>,
    pub error: Option<String>,
    pub error_reason: Option<String>,
    pub created_ms: u64,
    pub updated_ms: u64,
    /// Claim token of the run holding it (RUNNING only).
    pub claim: Option<String>,
}

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
}

/// Bounds of the queue.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_jobs: usize,
    pub max_per_tenant: usize,
    pub ttl: Duration,
}

/// The store; share behind an `Arc`.
pub struct JobStore {
    conn: Mutex<Connection>,
    limits: Limits,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

const COLUMNS: &str =
    "id, tenant, route, request, state, attempts, result, error, error_reason, created_ms, updated_ms, claim";

fn row_to_record(row: &rusqlite::Row<'_>) -> rusqlite::Result<JobRecord> {
    Ok(JobRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        route: row.get(2)?,
        request: row.get(3)?,
        state: JobState::parse(&row.get::<_, String>(4)?),
        attempts: row.get(5)?,
        result: row.get(6)?,
        error: row.get(7)?,
        error_reason: row.get(8)?,
        created_ms: row.get::<_, i64>(9)? as u64,
        updated_ms: row.get::<_, i64>(10)? as u64,
        claim: row.get(11)?,
    })
}

/// One job by id.
fn by_id(conn: &Connection, id: &str) -> rusqlite::Result<JobRecord> {
    conn.query_row(
        &format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"),
        params![id],
        row_to_record,
    )
}

/// A new job to accept.
pub struct NewJob<'a> {
    pub tenant: &'a str,
    pub route: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub fingerprint: &'a [u8],
    pub request: &'a [u8],
}

impl JobStore {
    /// Opens the queue file, or creates it when there is none. An existing
    /// file without the queue's marker is refused unless `accept_empty`.
    pub fn open(path: &Path, limits: Limits, accept_empty: bool) -> Result<Self, QueueError> {
        let existed = path.exists();
        let conn = Connection::open(path)?;
        if existed {
            let marked: bool = conn
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .map(|n| n > 0)
                .unwrap_or(false);
            if !marked {
                let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                let what = format!("{size} bytes, no jobs table");
                if !accept_empty {
                    return Err(QueueError::NotAQueue(what));
                }
                tracing::warn!(file = %path.display(), found = %what, "queue.accept_empty_file: beginning an EMPTY queue in a file that held no queue");
            }
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS jobs (
                id TEXT PRIMARY KEY,
                tenant TEXT NOT NULL,
                route TEXT NOT NULL,
                idempotency_key TEXT,
                fingerprint BLOB NOT NULL,
                request BLOB NOT NULL,
                state TEXT NOT NULL,
                attempts INTEGER NOT NULL DEFAULT 0,
                result BLOB,
                error TEXT,
                error_reason TEXT,
                created_ms INTEGER NOT NULL,
                updated_ms INTEGER NOT NULL,
                expires_ms INTEGER NOT NULL,
                claim TEXT,
                lease_until_ms INTEGER
            );
            CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency ON jobs(tenant, idempotency_key)
                WHERE idempotency_key IS NOT NULL;
            CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
            CREATE TABLE IF NOT EXISTS blobs (
                key TEXT PRIMARY KEY,
                value BLOB NOT NULL,
                expires_ms INTEGER NOT NULL
            );",
        )?;
        Ok(JobStore {
            conn: Mutex::new(conn),
            limits,
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A poisoned lock only means another thread panicked mid-call; SQLite
        // rolled its transaction back, so the connection is still sound.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Accepts a job durably, or returns the existing job for the same
    /// tenant, idempotency key and request.
    pub fn submit(&self, job: NewJob<'_>) -> Result<JobRecord, QueueError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        if let Some(key) = job.idempotency_key {
            let existing: Option<(Vec<u8>, String)> = tx
                .query_row(
                    "SELECT fingerprint, id FROM jobs WHERE tenant = ?1 AND idempotency_key = ?2",
                    params![job.tenant, key],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            if let Some((fp, id)) = existing {
                if fp != job.fingerprint {
                    return Err(QueueError::KeyReused);
                }
                let record = by_id(&tx, &id)?;
                return Ok(record);
            }
        }
        let total: i64 = tx.query_row(
            "SELECT COUNT(*) FROM jobs WHERE state IN ('QUEUED', 'RUNNING')",
            [],
            |r| r.get(0),
        )?;
        if total as usize >= self.limits.max_jobs {
            return Err(QueueError::Full(total as usize));
        }
        let tenant_count: i64 = tx.query_row(
            "SELECT COUNT(*) FROM jobs WHERE tenant = ?1 AND state IN ('QUEUED', 'RUNNING')",
            params![job.tenant],
            |r| r.get(0),
        )?;
        if tenant_count as usize >= self.limits.max_per_tenant {
            return Err(QueueError::TenantFull {
                tenant: job.tenant.to_string(),
                count: tenant_count as usize,
            });
        }
        let now = now_ms();
        let id = format!("job-{:016x}{:08x}", now, rand::random::<u32>());
        tx.execute(
            "INSERT INTO jobs (id, tenant, route, idempotency_key, fingerprint, request, state, created_ms, updated_ms, expires_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'QUEUED', ?7, ?7, ?8)",
            params![
                id,
                job.tenant,
                job.route,
                job.idempotency_key,
                job.fingerprint,
                job.request,
                now as i64,
                (now + self.limits.ttl.as_millis() as u64) as i64
            ],
        )?;
        let record = by_id(&tx, &id)?;
        tx.commit()?;
        Ok(record)
    }

    pub fn get(&self, id: &str) -> Result<Option<JobRecord>, QueueError> {
        Ok(by_id(&self.conn(), id).optional()?)
    }

    /// Claims the oldest waiting job for a run of at most `lease`; expires
    /// jobs past their TTL first.
    pub fn claim(&self, lease: Duration) -> Result<Option<JobRecord>, QueueError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let now = now_ms() as i64;
        tx.execute(
            "UPDATE jobs SET state = 'EXPIRED', error = 'job expired before it could run', error_reason = 'JOB_EXPIRED', updated_ms = ?1
             WHERE state = 'QUEUED' AND expires_ms <= ?1",
            params![now],
        )?;
        let id: Option<String> = tx
            .query_row(
                "SELECT id FROM jobs WHERE state = 'QUEUED' ORDER BY rowid LIMIT 1",
                [],
                |r| r.get(0),
            )
            .optional()?;
        let Some(id) = id else {
            tx.commit()?;
            return Ok(None);
        };
        let claim = format!("{:016x}", rand::random::<u64>());
        tx.execute(
            "UPDATE jobs SET state = 'RUNNING', attempts = attempts + 1, claim = ?2, lease_until_ms = ?3, updated_ms = ?4 WHERE id = ?1",
            params![id, claim, now + lease.as_millis() as i64, now],
        )?;
        let record = by_id(&tx, &id)?;
        tx.commit()?;
        Ok(Some(record))
    }

    /// Records the answer of the run holding `claim`; `false` if that claim
    /// no longer holds the job (it finished elsewhere or was re-queued).
    pub fn succeed(&self, id: &str, claim: &str, result: &[u8]) -> Result<bool, QueueError> {
        let n = self.conn().execute(
            "UPDATE jobs SET state = 'SUCCEEDED', result = ?3, claim = NULL, updated_ms = ?4
             WHERE id = ?1 AND claim = ?2 AND state = 'RUNNING'",
            params![id, claim, result, now_ms() as i64],
        )?;
        Ok(n == 1)
    }

    /// Ends the run holding `claim` with a final error.
    pub fn fail(
        &self,
        id: &str,
        claim: &str,
        error: &str,
        reason: &str,
    ) -> Result<bool, QueueError> {
        let n = self.conn().execute(
            "UPDATE jobs SET state = 'FAILED', error = ?3, error_reason = ?4, claim = NULL, updated_ms = ?5
             WHERE id = ?1 AND claim = ?2 AND state = 'RUNNING'",
            params![id, claim, error, reason, now_ms() as i64],
        )?;
        Ok(n == 1)
    }

    /// Puts the job back in the queue (no capacity yet); the run does not count.
    pub fn release(&self, id: &str, claim: &str) -> Result<bool, QueueError> {
        let n = self.conn().execute(
            "UPDATE jobs SET state = 'QUEUED', attempts = MAX(attempts - 1, 0), claim = NULL, updated_ms = ?3
             WHERE id = ?1 AND claim = ?2 AND state = 'RUNNING'",
            params![id, claim, now_ms() as i64],
        )?;
        Ok(n == 1)
    }

    /// Ends a job that has not started (FAILED, reason CANCELLED); `false`
    /// if it is running or final already.
    pub fn cancel(&self, id: &str, error: &str) -> Result<bool, QueueError> {
        let n = self.conn().execute(
            "UPDATE jobs SET state = 'FAILED', error = ?2, error_reason = 'CANCELLED', updated_ms = ?3
             WHERE id = ?1 AND state = 'QUEUED'",
            params![id, error, now_ms() as i64],
        )?;
        Ok(n == 1)
    }

    /// Stores a blob (a batch's file or record) for `ttl`; expired blobs go.
    pub fn put_blob(&self, key: &str, value: &[u8], ttl: Duration) -> Result<(), QueueError> {
        let now = now_ms();
        let conn = self.conn();
        conn.execute(
            "DELETE FROM blobs WHERE expires_ms < ?1",
            params![now as i64],
        )?;
        conn.execute(
            "INSERT OR REPLACE INTO blobs (key, value, expires_ms) VALUES (?1, ?2, ?3)",
            params![
                key,
                value,
                now.saturating_add(ttl.as_millis() as u64) as i64
            ],
        )?;
        Ok(())
    }

    pub fn get_blob(&self, key: &str) -> Result<Option<Vec<u8>>, QueueError> {
        let got = self.conn().query_row(
            "SELECT value FROM blobs WHERE key = ?1 AND expires_ms >= ?2",
            params![key, now_ms() as i64],
            |r| r.get(0),
        );
        match got {
            Ok(v) => Ok(Some(v)),
            Err(rusqlite::Error::QueryReturnedNoRows) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Returns runs whose lease ran out (a crash) to the queue; at start and periodically.
    pub fn recover_expired_leases(&self) -> Result<usize, QueueError> {
        Ok(self.conn().execute(
            "UPDATE jobs SET state = 'QUEUED', claim = NULL, updated_ms = ?1 WHERE state = 'RUNNING' AND lease_until_ms < ?1",
            params![now_ms() as i64],
        )?)
    }

    /// Every run in progress goes back to the queue (at start: no run survives a restart).
    pub fn requeue_all_running(&self) -> Result<usize, QueueError> {
        Ok(self.conn().execute(
            "UPDATE jobs SET state = 'QUEUED', claim = NULL, updated_ms = ?1 WHERE state = 'RUNNING'",
            params![now_ms() as i64],
        )?)
    }

    /// Jobs waiting, and the age of the oldest.
    pub fn depth(&self) -> Result<(u64, Option<Duration>), QueueError> {
        let (n, oldest): (i64, Option<i64>) = self.conn().query_row(
            "SELECT COUNT(*), MIN(created_ms) FROM jobs WHERE state = 'QUEUED'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let age = oldest.map(|t| Duration::from_millis(now_ms().saturating_sub(t as u64)));
        Ok((n as u64, age))
    }

    /// Jobs waiting ahead of this one.
    pub fn position(&self, record: &JobRecord) -> Result<u64, QueueError> {
        let n: i64 = self.conn().query_row(
            "SELECT COUNT(*) FROM jobs WHERE state = 'QUEUED' AND rowid < (SELECT rowid FROM jobs WHERE id = ?1)",
            params![record.id],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn store(dir: &Path, max: usize, per_tenant: usize) -> JobStore {
        JobStore::open(
            &dir.join("q.sqlite3"),
            Limits {
                max_jobs: max,
                max_per_tenant: per_tenant,
                ttl: Duration::from_secs(3600),
            },
            false,
        )
        .unwrap()
    }

    fn job<'a>(tenant: &'a str, key: Option<&'a str>, fp: &'a [u8]) -> NewJob<'a> {
        NewJob {
            tenant,
            route: "chat",
            idempotency_key: key,
            fingerprint: fp,
            request: b"req",
        }
    }

    #[test]
    fn a_job_runs_once_and_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let id = {
            let s = store(dir.path(), 10, 10);
            s.submit(job("t", None, b"a")).unwrap().id
        };
        let s = store(dir.path(), 10, 10);
        let claimed = s.claim(Duration::from_secs(30)).unwrap().unwrap();
        assert_eq!(claimed.id, id);
        assert_eq!(claimed.attempts, 1);
        assert!(
            s.claim(Duration::from_secs(30)).unwrap().is_none(),
            "a running job is not claimed twice"
        );
        let claim = claimed.claim.clone().unwrap();
        assert!(s.succeed(&id, &claim, b"answer").unwrap());
        assert!(
            !s.succeed(&id, &claim, b"again").unwrap(),
            "finished at most once"
        );
        let done = s.get(&id).unwrap().unwrap();
        assert_eq!(done.state, JobState::Succeeded);
        assert_eq!(done.result.as_deref(), Some(&b"answer"[..]));
    }

    #[test]
    fn a_crashed_run_goes_back_to_the_queue_and_its_stale_claim_cannot_finish() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 10, 10);
        let id = s.submit(job("t", None, b"a")).unwrap().id;
        let first = s.claim(Duration::from_secs(30)).unwrap().unwrap();
        assert_eq!(s.requeue_all_running().unwrap(), 1);
        let second = s.claim(Duration::from_secs(30)).unwrap().unwrap();
        assert_eq!(second.attempts, 2);
        assert!(!s
            .succeed(&id, first.claim.as_deref().unwrap(), b"stale")
            .unwrap());
        assert!(s
            .succeed(&id, second.claim.as_deref().unwrap(), b"fresh")
            .unwrap());
    }

    #[test]
    fn bounds_and_idempotency() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 3, 2);
        s.submit(job("a", None, b"1")).unwrap();
        s.submit(job("a", None, b"2")).unwrap();
        assert!(matches!(
            s.submit(job("a", None, b"3")),
            Err(QueueError::TenantFull { .. })
        ));
        let k = s.submit(job("b", Some("k"), b"x")).unwrap();
        assert!(matches!(
            s.submit(job("c", None, b"4")),
            Err(QueueError::Full(3))
        ));
        assert_eq!(
            s.submit(job("b", Some("k"), b"x")).unwrap().id,
            k.id,
            "same key, same request: the same job"
        );
        assert!(matches!(
            s.submit(job("b", Some("k"), b"y")),
            Err(QueueError::KeyReused)
        ));
        assert_eq!(s.depth().unwrap().0, 3);
    }

    #[test]
    fn released_jobs_keep_their_place_and_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 10, 10);
        let a = s.submit(job("t", None, b"a")).unwrap();
        let b = s.submit(job("t", None, b"b")).unwrap();
        assert_eq!(s.position(&b).unwrap(), 1);
        let c = s.claim(Duration::from_secs(30)).unwrap().unwrap();
        assert_eq!(c.id, a.id);
        assert!(s.release(&c.id, c.claim.as_deref().unwrap()).unwrap());
        let again = s.get(&a.id).unwrap().unwrap();
        assert_eq!((again.state, again.attempts), (JobState::Queued, 0));
    }
}
