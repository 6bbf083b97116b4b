//! Prompt-cache affinity's memory, in one home: this face
//! (`AffinityMemory`) with what a Redis outage does, the in-process bounded
//! LRU (`embedded`) and the fleet's per-tenant hashes on Redis (`redis`).
//! It remembers, per tenant-scoped prefix digest, the target and key that
//! last answered it, for the route's `ttl` after that answer.
//!
//! An outage of Redis never fails a request: recall finds nothing and
//! remember is skipped (the route's order serves), with a WARN and
//! `switchyard_state_errors_total{function="affinity"}`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::affinity::{PrefixHash, Warm};
use crate::state::redis::Redis;
use crate::state::StateFaults;

pub mod embedded;
mod redis;

pub use embedded::Memory;

/// Where prefixes are remembered: in process, or fleet-wide on Redis.
pub enum AffinityMemory {
    Embedded(Mutex<Memory>),
    Redis {
        redis: Redis,
        faults: Arc<StateFaults>,
    },
}

impl Default for AffinityMemory {
    fn default() -> Self {
        AffinityMemory::Embedded(Mutex::new(Memory::new(embedded::MAX_ENTRIES)))
    }
}

impl AffinityMemory {
    pub fn redis(redis: Redis, faults: Arc<StateFaults>) -> Self {
        AffinityMemory::Redis { redis, faults }
    }

    /// Where the longest of `prefixes` (of `tenant`'s request) is warm;
    /// `None` when none is, or when the fleet's memory cannot be asked.
    pub async fn recall(&self, tenant: &str, prefixes: &[PrefixHash]) -> Option<Warm> {
        match self {
            AffinityMemory::Embedded(m) => lock(m).recall(prefixes, Instant::now()),
            AffinityMemory::Redis { redis, faults } => {
                match redis.affinity_recall(tenant, prefixes).await {
                    Ok(w) => w,
                    Err(e) => {
                        faults.record("affinity", &e, "the route's order serves");
                        None
                    }
                }
            }
        }
    }

    /// `prefixes` are warm at `warm` for `ttl` from now (skipped when the
    /// fleet's memory cannot be written).
    pub async fn remember(
        &self,
        tenant: &str,
        prefixes: &[PrefixHash],
        warm: &Warm,
        ttl: Duration,
    ) {
        match self {
            AffinityMemory::Embedded(m) => lock(m).remember(prefixes, warm, ttl, Instant::now()),
            AffinityMemory::Redis { redis, faults } => {
                if let Err(e) = redis.affinity_remember(tenant, prefixes, warm, ttl).await {
                    faults.record("affinity", &e, "this answer's prefix is not remembered");
                }
            }
        }
    }
}

/// The memory's lock, riding over poisoning (nothing panics while holding it).
fn lock(m: &Mutex<Memory>) -> std::sync::MutexGuard<'_, Memory> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
