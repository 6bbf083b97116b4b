//! Shared state behind the request path, one folder per store (`affinity`,
//! `cost`, `files`, `idempotency`, `jobs`, `responses`, `tenants`: the face
//! with its outage policy, the embedded and the Redis implementation; the
//! response cache, in process only, is `cache.rs`), the
//! Redis client (`redis`: connection, breaker, key layout, leases) and the
//! stores' assembly from `[state]` (`assemble`). Here: what every store
//! speaks when shared state fails (`StateError`, counted and logged by
//! `StateFaults`). Nothing above this layer knows which backend answers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::telemetry::metrics::{Metrics, StateLabels};

pub mod affinity;
pub mod assemble;
pub mod cache;
pub mod cost;
pub mod files;
pub mod idempotency;
pub mod jobs;
pub mod journal;
pub mod limits;
pub mod redis;
pub mod responses;
pub mod tenants;
pub mod validation;

/// The shared state could not be reached or answered in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("shared state unavailable: {0}")]
    Unavailable(String),
}

/// How Redis keeps what it acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    pub appendonly: bool,
    /// `always`, `everysec` or `no`.
    pub appendfsync: String,
}

/// Counts a failed state call and logs it at WARN (at most one line a second
/// for the process, so an outage does not flood the log).
pub struct StateFaults {
    metrics: Arc<Metrics>,
    last_warn_ms: AtomicU64,
}

impl StateFaults {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(StateFaults {
            metrics,
            last_warn_ms: AtomicU64::new(0),
        })
    }

    pub fn record(&self, function: &'static str, err: &StateError, consequence: &str) {
        self.metrics
            .state_errors
            .get_or_create(&StateLabels { function })
            .inc();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let last = self.last_warn_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= 1000
            && self
                .last_warn_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(function, error = %err, "shared state unavailable: {consequence}");
        }
    }
}

/// A random token naming one claim, slot or reservation.
pub fn token() -> String {
    token_in(&mut [0; 32]).to_string()
}

/// A fresh [`token`] (128 random bits, 32 lowercase hex characters) written
/// into `out`, for a caller that keeps it in a string of its own kind.
pub fn token_in(out: &mut [u8; 32]) -> &str {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits: u128 = rand::random();
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = HEX[(bits >> (124 - 4 * i) & 0xf) as usize];
    }
    std::str::from_utf8(out).unwrap_or_default()
}
