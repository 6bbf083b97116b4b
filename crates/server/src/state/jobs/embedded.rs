//! The embedded job store: an SQLite file in WAL mode with
//! `synchronous = FULL`, so a job accepted is on disk before the caller hears
//! about it and survives a SIGKILL. Jobs are claimed with a lease (a crashed
//! run goes back to the queue at restart), finished at most once (a stale
//! claim cannot overwrite a result), bounded per tenant and in total, and
//! expire after their TTL; finished jobs are deleted a TTL after they
//! finish (`sweep`, bounded work per call). Tenants take turns: each job
//! gets a start tag (start-time fair queueing, `turn`), so one tenant's
//! thousand-line batch does not hold another tenant's single job back.
//! The file also holds the Batch API files (`state::files::embedded`): its
//! schema and sweep cover both. Blocking calls: run them off the async threads.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{params, Connection, OptionalExtension};

use super::{JobRecord, JobState, Limits, QueueError};

/// The store; share behind an `Arc`.
pub struct JobStore {
    conn: Mutex<Connection>,
    limits: Limits,
}

/// Milliseconds since the epoch (0 before it).
pub(crate) fn now_ms() -> u64 {
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

/// Final states, as SQL.
const FINAL: &str = "('SUCCEEDED', 'FAILED', 'EXPIRED')";

/// Waiting jobs expired by one claim or sweep, at most.
const EXPIRE_BATCH: i64 = 256;

/// Ids looked up in one statement (`states`), at most.
const IDS_PER_QUERY: usize = 500;

/// What one `sweep` removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Swept {
    /// Waiting jobs past their TTL, marked EXPIRED.
    pub expired: usize,
    /// Finished jobs a TTL after they finished, deleted.
    pub jobs: usize,
    /// Blobs (files, batch records) past their TTL, deleted.
    pub blobs: usize,
}

/// Adds `column` to `table` when a file from an older version lacks it.
fn add_column(conn: &Connection, table: &str, column: &str, decl: &str) -> rusqlite::Result<()> {
    let present: bool = conn.query_row(
        &format!("SELECT count(*) FROM pragma_table_info('{table}') WHERE name = ?1"),
        params![column],
        |r| r.get::<_, i64>(0).map(|n| n > 0),
    )?;
    if !present {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

/// Marks at most `limit` waiting jobs past their TTL EXPIRED; their records
/// are kept a TTL from now.
fn expire_waiting(conn: &Connection, now: i64, ttl_ms: i64, limit: i64) -> rusqlite::Result<usize> {
    conn.execute(
        "UPDATE jobs SET state = 'EXPIRED', error = 'job expired before it could run', error_reason = 'JOB_EXPIRED', updated_ms = ?1, expires_ms = ?1 + ?2
         WHERE rowid IN (SELECT rowid FROM jobs WHERE state = 'QUEUED' AND expires_ms <= ?1 LIMIT ?3)",
        params![now, ttl_ms, limit],
    )
}

/// The file's tables (jobs, files, the queue's clock), as the first
/// version wrote them plus every column added since.
const TABLES: &str = "CREATE TABLE IF NOT EXISTS jobs (
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
                lease_until_ms INTEGER,
                vtag INTEGER NOT NULL DEFAULT 0
            );
            CREATE UNIQUE INDEX IF NOT EXISTS jobs_idempotency ON jobs(tenant, idempotency_key)
                WHERE idempotency_key IS NOT NULL;
            CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
            CREATE TABLE IF NOT EXISTS blobs (
                key TEXT PRIMARY KEY,
                value BLOB NOT NULL,
                expires_ms INTEGER NOT NULL,
                tenant TEXT,
                bytes INTEGER NOT NULL DEFAULT 0,
                files INTEGER NOT NULL DEFAULT 0
            );
            CREATE TABLE IF NOT EXISTS queue_clock (
                id INTEGER PRIMARY KEY CHECK (id = 0),
                v INTEGER NOT NULL
            );
            INSERT OR IGNORE INTO queue_clock (id, v) VALUES (0, 0);";

/// The indexes of turns, retention and quotas (after `TABLES` and any
/// column an older file lacks).
const INDEXES: &str = "CREATE INDEX IF NOT EXISTS jobs_turn ON jobs(state, vtag);
            CREATE INDEX IF NOT EXISTS jobs_tenant_turn ON jobs(tenant, state, vtag);
            CREATE INDEX IF NOT EXISTS jobs_retention ON jobs(state, expires_ms);
            CREATE INDEX IF NOT EXISTS blobs_expiry ON blobs(expires_ms);
            CREATE INDEX IF NOT EXISTS blobs_tenant ON blobs(tenant, expires_ms);";

/// An existing file without the jobs table is not a queue: refused unless
/// `accept_empty` (then it begins an empty queue, with a WARN).
fn refuse_unmarked(conn: &Connection, path: &Path, accept_empty: bool) -> Result<(), QueueError> {
    let marked: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map(|n| n > 0)
        .unwrap_or(false);
    if marked {
        return Ok(());
    }
    let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let what = format!("{size} bytes, no jobs table");
    if !accept_empty {
        return Err(QueueError::NotAQueue(what));
    }
    tracing::warn!(file = %path.display(), found = %what, "queue.accept_empty_file: beginning an EMPTY queue in a file that held no queue");
    Ok(())
}

/// Creates what is missing: tables, columns, indexes.
fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(TABLES)?;
    // Files written by an older version: the columns fairness and
    // quotas need (old rows: tag 0, FIFO among themselves; no owner).
    add_column(conn, "jobs", "vtag", "INTEGER NOT NULL DEFAULT 0")?;
    add_column(conn, "blobs", "tenant", "TEXT")?;
    add_column(conn, "blobs", "bytes", "INTEGER NOT NULL DEFAULT 0")?;
    add_column(conn, "blobs", "files", "INTEGER NOT NULL DEFAULT 0")?;
    conn.execute_batch(INDEXES)
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
            refuse_unmarked(&conn, path, accept_empty)?;
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.busy_timeout(Duration::from_secs(5))?;
        migrate(&conn)?;
        Ok(JobStore {
            conn: Mutex::new(conn),
            limits,
        })
    }

    pub(crate) fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
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
        self.room_for(&tx, job.tenant)?;
        let now = now_ms();
        let id = format!("job-{:016x}{:08x}", now, rand::random::<u32>());
        let tag = turn(&tx, job.tenant)?;
        tx.execute(
            "INSERT INTO jobs (id, tenant, route, idempotency_key, fingerprint, request, state, created_ms, updated_ms, expires_ms, vtag)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'QUEUED', ?7, ?7, ?8, ?9)",
            params![
                id,
                job.tenant,
                job.route,
                job.idempotency_key,
                job.fingerprint,
                job.request,
                now as i64,
                (now + self.limits.ttl.as_millis() as u64) as i64,
                tag
            ],
        )?;
        let record = by_id(&tx, &id)?;
        tx.commit()?;
        Ok(record)
    }

    /// Whether the queue and `tenant` have room for one more job waiting
    /// or running.
    fn room_for(&self, tx: &Connection, tenant: &str) -> Result<(), QueueError> {
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
            params![tenant],
            |r| r.get(0),
        )?;
        if tenant_count as usize >= self.limits.max_per_tenant {
            return Err(QueueError::TenantFull {
                tenant: tenant.to_string(),
                count: tenant_count as usize,
            });
        }
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<Option<JobRecord>, QueueError> {
        Ok(by_id(&self.conn(), id).optional()?)
    }

    /// A finished record is kept this long after it finished.
    fn ttl_ms(&self) -> i64 {
        self.limits.ttl.as_millis().min(i64::MAX as u128) as i64
    }

    /// Claims the waiting job whose turn it is (the lowest start tag, the
    /// oldest among equals) for a run of at most `lease`; expires jobs past
    /// their TTL first.
    pub fn claim(&self, lease: Duration) -> Result<Option<JobRecord>, QueueError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let now = now_ms() as i64;
        expire_waiting(&tx, now, self.ttl_ms(), EXPIRE_BATCH)?;
        let next: Option<(String, i64)> = tx
            .query_row(
                "SELECT id, vtag FROM jobs WHERE state = 'QUEUED' ORDER BY vtag, rowid LIMIT 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((id, tag)) = next else {
            tx.commit()?;
            return Ok(None);
        };
        tx.execute(
            "UPDATE queue_clock SET v = MAX(v, ?1) WHERE id = 0",
            params![tag],
        )?;
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
            "UPDATE jobs SET state = 'SUCCEEDED', result = ?3, claim = NULL, updated_ms = ?4, expires_ms = ?4 + ?5
             WHERE id = ?1 AND claim = ?2 AND state = 'RUNNING'",
            params![id, claim, result, now_ms() as i64, self.ttl_ms()],
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
            "UPDATE jobs SET state = 'FAILED', error = ?3, error_reason = ?4, claim = NULL, updated_ms = ?5, expires_ms = ?5 + ?6
             WHERE id = ?1 AND claim = ?2 AND state = 'RUNNING'",
            params![id, claim, error, reason, now_ms() as i64, self.ttl_ms()],
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
            "UPDATE jobs SET state = 'FAILED', error = ?2, error_reason = 'CANCELLED', updated_ms = ?3, expires_ms = ?3 + ?4
             WHERE id = ?1 AND state = 'QUEUED'",
            params![id, error, now_ms() as i64, self.ttl_ms()],
        )?;
        Ok(n == 1)
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

    /// Jobs waiting ahead of this one (those whose turn comes first).
    pub fn position(&self, record: &JobRecord) -> Result<u64, QueueError> {
        let n: i64 = self.conn().query_row(
            "SELECT COUNT(*) FROM jobs AS j, (SELECT vtag, rowid AS r FROM jobs WHERE id = ?1) AS me
             WHERE j.state = 'QUEUED' AND (j.vtag < me.vtag OR (j.vtag = me.vtag AND j.rowid < me.r))",
            params![record.id],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// The states of these jobs (`None`: no such job), in order: what a
    /// batch's progress needs, without any job's request or answer.
    pub fn states(&self, ids: &[String]) -> Result<Vec<Option<JobState>>, QueueError> {
        let conn = self.conn();
        let mut found = std::collections::HashMap::with_capacity(ids.len());
        for chunk in ids.chunks(IDS_PER_QUERY) {
            let marks = vec!["?"; chunk.len()].join(", ");
            let mut stmt =
                conn.prepare(&format!("SELECT id, state FROM jobs WHERE id IN ({marks})"))?;
            let rows = stmt.query_map(rusqlite::params_from_iter(chunk.iter()), |r| {
                Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
            })?;
            for row in rows {
                let (id, state) = row?;
                found.insert(id, JobState::parse(&state));
            }
        }
        Ok(ids.iter().map(|id| found.get(id).copied()).collect())
    }

    /// Housekeeping at `now_ms`, each step at most `limit` rows: waiting
    /// jobs past their TTL expire, finished jobs a TTL after they finished
    /// are deleted, and so are files and batch records past their TTL.
    pub fn sweep(&self, now_ms: u64, limit: usize) -> Result<Swept, QueueError> {
        let conn = self.conn();
        let (now, limit) = (now_ms as i64, limit as i64);
        let expired = expire_waiting(&conn, now, self.ttl_ms(), limit)?;
        let jobs = conn.execute(
            &format!(
                "DELETE FROM jobs WHERE rowid IN
                 (SELECT rowid FROM jobs WHERE state IN {FINAL} AND expires_ms <= ?1 LIMIT ?2)"
            ),
            params![now, limit],
        )?;
        let blobs = conn.execute(
            "DELETE FROM blobs WHERE rowid IN (SELECT rowid FROM blobs WHERE expires_ms < ?1 LIMIT ?2)",
            params![now, limit],
        )?;
        Ok(Swept {
            expired,
            jobs,
            blobs,
        })
    }
}

/// The start tag of `tenant`'s next job: one after its last waiting job,
/// and never before the tag of the job that ran last (the queue's clock).
/// Claims take the lowest tag, so tenants with work waiting take turns.
fn turn(conn: &Connection, tenant: &str) -> rusqlite::Result<i64> {
    conn.query_row(
        "SELECT MAX(c.v, COALESCE((SELECT MAX(vtag) + 1 FROM jobs WHERE tenant = ?1 AND state = 'QUEUED'), 0))
         FROM queue_clock AS c WHERE c.id = 0",
        params![tenant],
        |r| r.get(0),
    )
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
    fn tenants_take_turns_so_a_big_backlog_does_not_hold_another_tenants_job_back() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 100, 100);
        let lease = Duration::from_secs(30);
        let mut a = Vec::new();
        for i in 0..20u8 {
            a.push(s.submit(job("a", None, &[i])).unwrap().id);
        }
        let first = s.claim(lease).unwrap().unwrap();
        assert_eq!(first.id, a[0]);
        let b = s.submit(job("b", None, b"b")).unwrap();
        assert_eq!(s.position(&b).unwrap(), 0, "b's job is next");
        let c = s.submit(job("c", None, b"c")).unwrap();
        assert_eq!(s.position(&c).unwrap(), 1, "then c's, before a's second");
        let order: Vec<String> = (0..4)
            .map(|_| s.claim(lease).unwrap().unwrap().id)
            .collect();
        assert_eq!(order, vec![b.id, c.id, a[1].clone(), a[2].clone()]);
        // Two tenants with backlogs alternate.
        let d: Vec<String> = (0..3u8)
            .map(|i| s.submit(job("d", None, &[b'd', i])).unwrap().id)
            .collect();
        let next: Vec<String> = (0..4)
            .map(|_| s.claim(lease).unwrap().unwrap().id)
            .collect();
        assert_eq!(
            next,
            vec![d[0].clone(), a[3].clone(), d[1].clone(), a[4].clone()]
        );
    }

    #[test]
    fn states_are_read_in_order_and_unknown_ids_are_none() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 10, 10);
        let a = s.submit(job("t", None, b"a")).unwrap();
        let b = s.submit(job("t", None, b"b")).unwrap();
        let c = s.claim(Duration::from_secs(30)).unwrap().unwrap();
        assert!(s
            .succeed(&c.id, c.claim.as_deref().unwrap(), b"ok")
            .unwrap());
        let ids = vec![b.id.clone(), "job-nope".to_string(), a.id.clone()];
        assert_eq!(
            s.states(&ids).unwrap(),
            vec![Some(JobState::Queued), None, Some(JobState::Succeeded)]
        );
        let many: Vec<String> = (0..1200).map(|i| format!("job-{i}")).collect();
        assert_eq!(
            s.states(&many).unwrap().len(),
            1200,
            "more ids than one query takes"
        );
    }

    #[test]
    fn finished_jobs_are_deleted_a_ttl_after_they_finish_a_bounded_number_per_sweep() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 10, 10);
        let lease = Duration::from_secs(30);
        for i in 0..3u8 {
            s.submit(job("t", None, &[i])).unwrap();
        }
        let waiting = s.submit(job("t", None, b"w")).unwrap();
        let mut done = Vec::new();
        for _ in 0..3 {
            let c = s.claim(lease).unwrap().unwrap();
            assert!(s
                .succeed(&c.id, c.claim.as_deref().unwrap(), b"ok")
                .unwrap());
            done.push(c.id);
        }
        let now = now_ms();
        assert_eq!(
            s.sweep(now, 10).unwrap(),
            Swept::default(),
            "nothing is due yet"
        );
        assert!(s.get(&done[0]).unwrap().is_some());
        let later = now + 3_600_000 + 60_000;
        let first = s.sweep(later, 2).unwrap();
        assert_eq!(
            (first.jobs, first.expired),
            (2, 1),
            "at most 2 a step; the waiting job expires"
        );
        let second = s.sweep(later, 2).unwrap();
        assert_eq!(second.jobs, 1);
        for id in &done {
            assert_eq!(s.get(id).unwrap(), None, "{id} is gone");
        }
        // The job that expired waiting is kept a TTL from its expiry.
        let expired = s.get(&waiting.id).unwrap().unwrap();
        assert_eq!(expired.state, JobState::Expired);
        assert_eq!(s.sweep(later, 10).unwrap().jobs, 0);
        assert_eq!(s.sweep(later + 3_600_000 + 60_000, 10).unwrap().jobs, 1);
        let rows: i64 = s
            .conn()
            .query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0);
    }

    #[test]
    fn a_queue_file_from_before_turns_and_quotas_opens_with_its_jobs_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("q.sqlite3");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE jobs (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, route TEXT NOT NULL,
                   idempotency_key TEXT, fingerprint BLOB NOT NULL, request BLOB NOT NULL,
                   state TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, result BLOB,
                   error TEXT, error_reason TEXT, created_ms INTEGER NOT NULL,
                   updated_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL, claim TEXT,
                   lease_until_ms INTEGER);
                 CREATE TABLE blobs (key TEXT PRIMARY KEY, value BLOB NOT NULL, expires_ms INTEGER NOT NULL);
                 INSERT INTO jobs (id, tenant, route, fingerprint, request, state, created_ms, updated_ms, expires_ms)
                   VALUES ('job-old1', 'a', 'chat', x'00', x'00', 'QUEUED', 1, 1, 99999999999999),
                          ('job-old2', 'b', 'chat', x'00', x'00', 'QUEUED', 2, 2, 99999999999999);",
            )
            .unwrap();
        }
        let s = store(dir.path(), 10, 10);
        let new = s.submit(job("a", None, b"n")).unwrap();
        let lease = Duration::from_secs(30);
        let order: Vec<String> = (0..3)
            .map(|_| s.claim(lease).unwrap().unwrap().id)
            .collect();
        assert_eq!(order, vec!["job-old1", "job-old2", new.id.as_str()]);
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
