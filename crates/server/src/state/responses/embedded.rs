//! Stored responses in one process: SQLite, in a file beside the job
//! queue's when a `[queue]` is configured (so a background response's record
//! survives a restart with its job), else in memory. One row per response
//! keyed by tenant and id, with its size and expiry; expired rows are
//! deleted on every write and never read. Blocking calls with the clock
//! passed in: run them off the async threads.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::{room, Bounds, Finish, Put};

/// The embedded store; share it behind an `Arc`.
pub struct EmbeddedResponses {
    conn: Mutex<Connection>,
    pub(super) bounds: Bounds,
}

/// The file beside the queue's: `queue.sqlite3` -> `queue.responses.sqlite3`.
pub fn path_beside(queue: &Path) -> std::path::PathBuf {
    queue.with_extension("responses.sqlite3")
}

impl EmbeddedResponses {
    /// Opens (or creates) the store in `path`, or in memory without one.
    pub fn open(path: Option<&Path>, bounds: Bounds) -> Result<Self, rusqlite::Error> {
        let conn = match path {
            Some(p) => {
                let c = Connection::open(p)?;
                c.pragma_update(None, "journal_mode", "WAL")?;
                // A process crash loses nothing committed (WAL); a power cut
                // may lose the last commits, as for the idempotency records.
                c.pragma_update(None, "synchronous", "NORMAL")?;
                c.busy_timeout(Duration::from_secs(5))?;
                c
            }
            None => Connection::open_in_memory()?,
        };
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS responses (
                tenant TEXT NOT NULL,
                id TEXT NOT NULL,
                body BLOB NOT NULL,
                done INTEGER NOT NULL,
                bytes INTEGER NOT NULL,
                expires_ms INTEGER NOT NULL,
                PRIMARY KEY (tenant, id)
            );
            CREATE INDEX IF NOT EXISTS responses_expiry ON responses(expires_ms);",
        )?;
        Ok(EmbeddedResponses {
            conn: Mutex::new(conn),
            bounds,
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn purge(conn: &Connection, now: u64) -> rusqlite::Result<()> {
        conn.execute(
            "DELETE FROM responses WHERE expires_ms <= ?1",
            params![now as i64],
        )?;
        Ok(())
    }

    fn tenant_usage(conn: &Connection, tenant: &str) -> rusqlite::Result<(u64, u64)> {
        conn.query_row(
            "SELECT count(*), coalesce(sum(bytes), 0) FROM responses WHERE tenant = ?1",
            params![tenant],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )
    }

    /// Stores `body` under `tenant`/`id` (replacing one of the same id)
    /// when the tenant's bounds allow it.
    pub fn put(
        &self,
        tenant: &str,
        id: &str,
        body: &[u8],
        done: bool,
        now: u64,
    ) -> rusqlite::Result<Put> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        Self::purge(&tx, now)?;
        let (count, bytes) = Self::tenant_usage(&tx, tenant)?;
        let replaced: Option<u64> = tx
            .query_row(
                "SELECT bytes FROM responses WHERE tenant = ?1 AND id = ?2",
                params![tenant, id],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            .map(|b| b as u64);
        if let Err(full) = room(count, bytes, body.len() as u64, replaced, &self.bounds) {
            return Ok(Put::Refused(full));
        }
        let expires = now.saturating_add(self.bounds.ttl.as_millis() as u64);
        tx.execute(
            "INSERT OR REPLACE INTO responses (tenant, id, body, done, bytes, expires_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![tenant, id, body, done, body.len() as i64, expires as i64],
        )?;
        tx.commit()?;
        Ok(Put::Stored)
    }

    /// Replaces a record that is not done yet and marks it done (keeping its expiry).
    pub fn finish(
        &self,
        tenant: &str,
        id: &str,
        body: &[u8],
        now: u64,
    ) -> rusqlite::Result<Finish> {
        let conn = self.conn();
        let done: Option<bool> = conn
            .query_row(
                "SELECT done FROM responses WHERE tenant = ?1 AND id = ?2 AND expires_ms > ?3",
                params![tenant, id, now as i64],
                |r| r.get(0),
            )
            .optional()?;
        match done {
            None => Ok(Finish::Gone),
            Some(true) => Ok(Finish::AlreadyDone),
            Some(false) => {
                let n = conn.execute(
                    "UPDATE responses SET body = ?3, bytes = ?4, done = 1
                     WHERE tenant = ?1 AND id = ?2 AND done = 0",
                    params![tenant, id, body, body.len() as i64],
                )?;
                Ok(if n == 1 {
                    Finish::Finished
                } else {
                    Finish::AlreadyDone
                })
            }
        }
    }

    pub fn get(&self, tenant: &str, id: &str, now: u64) -> rusqlite::Result<Option<Vec<u8>>> {
        self.conn()
            .query_row(
                "SELECT body FROM responses WHERE tenant = ?1 AND id = ?2 AND expires_ms > ?3",
                params![tenant, id, now as i64],
                |r| r.get(0),
            )
            .optional()
    }

    pub fn delete(&self, tenant: &str, id: &str, now: u64) -> rusqlite::Result<bool> {
        let conn = self.conn();
        let n = conn.execute(
            "DELETE FROM responses WHERE tenant = ?1 AND id = ?2 AND expires_ms > ?3",
            params![tenant, id, now as i64],
        )?;
        Self::purge(&conn, now)?;
        Ok(n == 1)
    }

    /// The tenant's live records and their bytes.
    pub fn usage(&self, tenant: &str, now: u64) -> rusqlite::Result<(u64, u64)> {
        let conn = self.conn();
        Self::purge(&conn, now)?;
        Self::tenant_usage(&conn, tenant)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::Full;
    use super::*;

    fn store() -> EmbeddedResponses {
        EmbeddedResponses::open(
            None,
            Bounds {
                ttl: Duration::from_secs(10),
                max_count: 2,
                max_bytes: 10,
            },
        )
        .unwrap()
    }

    #[test]
    fn records_are_scoped_by_tenant_and_expire() {
        let s = store();
        assert_eq!(s.put("a", "r1", b"abc", true, 1000).unwrap(), Put::Stored);
        assert_eq!(
            s.get("a", "r1", 1000).unwrap().as_deref(),
            Some(&b"abc"[..])
        );
        assert_eq!(s.get("b", "r1", 1000).unwrap(), None, "another tenant");
        assert!(!s.delete("b", "r1", 1000).unwrap());
        assert_eq!(
            s.get("a", "r1", 10_999).unwrap().as_deref(),
            Some(&b"abc"[..])
        );
        assert_eq!(s.get("a", "r1", 11_000).unwrap(), None, "expired");
        assert_eq!(s.usage("a", 11_000).unwrap(), (0, 0), "purged");
    }

    #[test]
    fn bounds_refuse_new_records_by_count_and_bytes_per_tenant() {
        let s = store();
        assert_eq!(s.put("a", "r1", b"1234", true, 0).unwrap(), Put::Stored);
        assert_eq!(
            s.put("a", "r2", b"1234567", true, 0).unwrap(),
            Put::Refused(Full::Bytes { bytes: 4 })
        );
        assert_eq!(s.put("a", "r2", b"12", true, 0).unwrap(), Put::Stored);
        assert_eq!(
            s.put("a", "r3", b"1", true, 0).unwrap(),
            Put::Refused(Full::Count { count: 2 })
        );
        // Another tenant has its own bounds; a deletion frees a slot.
        assert_eq!(s.put("b", "r3", b"1", true, 0).unwrap(), Put::Stored);
        assert!(s.delete("a", "r1", 0).unwrap());
        assert_eq!(s.put("a", "r3", b"1", true, 0).unwrap(), Put::Stored);
        assert_eq!(s.usage("a", 0).unwrap(), (2, 3));
    }

    #[test]
    fn the_first_finish_wins() {
        let s = store();
        s.put("a", "r1", b"q", false, 0).unwrap();
        assert_eq!(s.finish("a", "r1", b"done", 0).unwrap(), Finish::Finished);
        assert_eq!(
            s.finish("a", "r1", b"late", 0).unwrap(),
            Finish::AlreadyDone
        );
        assert_eq!(s.get("a", "r1", 0).unwrap().as_deref(), Some(&b"done"[..]));
        assert_eq!(s.finish("a", "nope", b"x", 0).unwrap(), Finish::Gone);
        assert_eq!(s.finish("b", "r1", b"x", 0).unwrap(), Finish::Gone);
    }
}
