//! Stored Responses (the OpenAI Responses door's `store`), in one home: this
//! face (`ResponseStore`) with what an outage does, the embedded store
//! (`embedded`: SQLite, a file beside the queue's or in memory) and the
//! fleet's on Redis (`redis`: a key per response with its TTL, a per-tenant
//! index bounded by count and bytes).
//!
//! A record is opaque bytes to the store (the door serialises it), kept for
//! `responses.ttl` under its tenant: another tenant's id does not exist. A
//! record is `done` once it holds a final response; `finish` replaces a
//! record that is not done yet (a background response) and marks it done, so
//! of two replicas finishing the same response (or a cancel racing the
//! result) the first wins. New records past `responses.max_per_tenant` or
//! `responses.max_bytes_per_tenant` are refused, naming the limit; finishing
//! one may pass the byte bound by that record (refusing it would lose an
//! answer already paid for). Redis failures are `STATE_UNAVAILABLE` with a
//! WARN and `switchyard_state_errors_total{function="responses"}`; the door
//! decides what a failed `put` means (a foreground answer is still served).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::config::ResponsesConfig;
use crate::error::RequestError;
use crate::state::redis::Redis;
use crate::state::StateError;
use crate::state::StateFaults;

pub mod embedded;
mod redis;

pub use embedded::EmbeddedResponses;

/// The per-tenant bounds and the lifetime of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub ttl: Duration,
    pub max_count: u64,
    pub max_bytes: u64,
}

impl Bounds {
    pub fn of(c: &ResponsesConfig) -> Bounds {
        Bounds {
            ttl: c.ttl,
            max_count: c.max_per_tenant as u64,
            max_bytes: c.max_bytes_per_tenant as u64,
        }
    }
}

/// Which bound a new record would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    Count { count: u64 },
    Bytes { bytes: u64 },
}

/// Whether a tenant holding `count` records of `bytes` may store one more
/// of `new_bytes` (`replaced`: the bytes of a record of the same id it
/// replaces, which then does not count as one more).
pub fn room(
    count: u64,
    bytes: u64,
    new_bytes: u64,
    replaced: Option<u64>,
    b: &Bounds,
) -> Result<(), Full> {
    if replaced.is_none() && count >= b.max_count {
        return Err(Full::Count { count });
    }
    let after = bytes
        .saturating_sub(replaced.unwrap_or(0))
        .saturating_add(new_bytes);
    if after > b.max_bytes {
        return Err(Full::Bytes { bytes });
    }
    Ok(())
}

/// What `put` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    Stored,
    Refused(Full),
}

/// What `finish` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// Replaced and marked done.
    Finished,
    /// Someone finished it first (the stored record stands).
    AlreadyDone,
    /// No such record (expired or deleted).
    Gone,
}

/// Milliseconds since the epoch (the embedded store's clock).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Stored responses: embedded, or shared by the fleet on Redis.
pub enum ResponseStore {
    Embedded(Arc<EmbeddedResponses>),
    Redis {
        redis: Redis,
        faults: Arc<StateFaults>,
        bounds: Bounds,
    },
}

impl ResponseStore {
    pub fn redis(redis: Redis, faults: Arc<StateFaults>, config: &ResponsesConfig) -> Self {
        ResponseStore::Redis {
            redis,
            faults,
            bounds: Bounds::of(config),
        }
    }

    /// Runs an embedded call on the blocking pool.
    async fn blocking<T: Send + 'static>(
        store: &Arc<EmbeddedResponses>,
        f: impl FnOnce(&EmbeddedResponses, u64) -> Result<T, rusqlite::Error> + Send + 'static,
    ) -> Result<T, RequestError> {
        let store = store.clone();
        tokio::task::spawn_blocking(move || f(&store, now_ms()))
            .await
            .map_err(|e| RequestError::StateUnavailable(format!("responses store: {e}")))?
            .map_err(|e| RequestError::StateUnavailable(format!("responses store: {e}")))
    }

    /// A Redis failure, counted and logged.
    fn fault(faults: &StateFaults, e: StateError, consequence: &str) -> RequestError {
        faults.record("responses", &e, consequence);
        let StateError::Unavailable(why) = e;
        RequestError::StateUnavailable(why)
    }

    /// Stores a new record (or replaces one of the same id) within the
    /// tenant's bounds.
    pub async fn put(
        &self,
        tenant: &str,
        id: &str,
        body: Vec<u8>,
        done: bool,
    ) -> Result<(), RequestError> {
        let put = match self {
            ResponseStore::Embedded(s) => {
                let (t, i) = (tenant.to_string(), id.to_string());
                Self::blocking(s, move |s, now| s.put(&t, &i, &body, done, now)).await?
            }
            ResponseStore::Redis {
                redis,
                faults,
                bounds,
            } => redis
                .responses_put(tenant, id, &body, done, bounds)
                .await
                .map_err(|e| Self::fault(faults, e, "responses are not stored"))?,
        };
        match put {
            Put::Stored => Ok(()),
            Put::Refused(full) => Err(self.full(tenant, full)),
        }
    }

    /// Whether the tenant may store one more record now (checked before a
    /// response is generated; `put` checks again).
    pub async fn room(&self, tenant: &str) -> Result<(), RequestError> {
        let (count, bytes) = match self {
            ResponseStore::Embedded(s) => {
                let t = tenant.to_string();
                Self::blocking(s, move |s, now| s.usage(&t, now)).await?
            }
            ResponseStore::Redis { redis, faults, .. } => redis
                .responses_usage(tenant)
                .await
                .map_err(|e| Self::fault(faults, e, "responses are not stored"))?,
        };
        room(count, bytes, 0, None, &self.bounds()).map_err(|f| self.full(tenant, f))
    }

    /// Replaces a record that is not done yet and marks it done.
    pub async fn finish(
        &self,
        tenant: &str,
        id: &str,
        body: Vec<u8>,
    ) -> Result<Finish, RequestError> {
        match self {
            ResponseStore::Embedded(s) => {
                let (t, i) = (tenant.to_string(), id.to_string());
                Self::blocking(s, move |s, now| s.finish(&t, &i, &body, now)).await
            }
            ResponseStore::Redis { redis, faults, .. } => redis
                .responses_finish(tenant, id, &body)
                .await
                .map_err(|e| Self::fault(faults, e, "a background response stays unfinished")),
        }
    }

    /// The tenant's record `id`, if it exists.
    pub async fn get(&self, tenant: &str, id: &str) -> Result<Option<Vec<u8>>, RequestError> {
        match self {
            ResponseStore::Embedded(s) => {
                let (t, i) = (tenant.to_string(), id.to_string());
                Self::blocking(s, move |s, now| s.get(&t, &i, now)).await
            }
            ResponseStore::Redis { redis, faults, .. } => redis
                .responses_get(tenant, id)
                .await
                .map_err(|e| Self::fault(faults, e, "stored responses cannot be read")),
        }
    }

    /// Deletes the tenant's record `id`; false when there was none.
    pub async fn delete(&self, tenant: &str, id: &str) -> Result<bool, RequestError> {
        match self {
            ResponseStore::Embedded(s) => {
                let (t, i) = (tenant.to_string(), id.to_string());
                Self::blocking(s, move |s, now| s.delete(&t, &i, now)).await
            }
            ResponseStore::Redis { redis, faults, .. } => redis
                .responses_delete(tenant, id)
                .await
                .map_err(|e| Self::fault(faults, e, "stored responses cannot be deleted")),
        }
    }

    fn bounds(&self) -> Bounds {
        match self {
            ResponseStore::Embedded(s) => s.bounds,
            ResponseStore::Redis { bounds, .. } => *bounds,
        }
    }

    fn full(&self, tenant: &str, full: Full) -> RequestError {
        let b = self.bounds();
        let (limit, held, max) = match full {
            Full::Count { count } => ("responses.max_per_tenant", count, b.max_count),
            Full::Bytes { bytes } => ("responses.max_bytes_per_tenant", bytes, b.max_bytes),
        };
        RequestError::ResponsesFull {
            tenant: tenant.to_string(),
            limit,
            held,
            max,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const B: Bounds = Bounds {
        ttl: Duration::from_secs(60),
        max_count: 2,
        max_bytes: 100,
    };

    #[test]
    fn a_new_record_needs_a_free_slot_and_the_bytes() {
        assert_eq!(room(0, 0, 100, None, &B), Ok(()));
        assert_eq!(room(1, 0, 101, None, &B), Err(Full::Bytes { bytes: 0 }));
        assert_eq!(room(2, 10, 1, None, &B), Err(Full::Count { count: 2 }));
        assert_eq!(room(1, 60, 41, None, &B), Err(Full::Bytes { bytes: 60 }));
    }

    #[test]
    fn a_replacement_counts_only_its_growth() {
        // At the count bound, replacing one of the records is no new one.
        assert_eq!(room(2, 90, 40, Some(30), &B), Ok(()));
        assert_eq!(
            room(2, 90, 41, Some(30), &B),
            Err(Full::Bytes { bytes: 90 })
        );
    }
}
