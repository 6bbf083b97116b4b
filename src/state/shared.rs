//! The request path's view of shared state: idempotency claims and tenant
//! admission, each with the embedded and the Redis implementation behind one
//! face. What a Redis outage does is decided here, per function:
//! idempotency fails closed (STATE_UNAVAILABLE: never a silent second
//! generation), tenant limits fail open (availability over a limit the fleet
//! cannot count), each with a WARN and `switchyard_state_errors_total`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::redis::Redis;
use super::{IdemClaim, StateError, TenantDecision};
use crate::error::RequestError;
use crate::idempotency::{Claim, ClaimGuard, Fingerprint, IdempotencyStore};
use crate::policy::token_bucket::TokenBucketConfig;
use crate::sink::Event;
use crate::telemetry::metrics::{Metrics, StateLabels};
use crate::tenants::{TenantLimiter, TenantSlot};

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
    format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// Idempotency records: in process, or one record per `tenant:key` for the fleet.
pub enum Idempotency {
    Embedded(Arc<IdempotencyStore>),
    Redis {
        redis: Redis,
        faults: Arc<StateFaults>,
        /// How long a finished answer is replayed.
        ttl: Duration,
        /// How long an unfinished claim holds the key (a dead replica's lapses).
        in_flight_ttl: Duration,
    },
}

/// What a claim found.
pub enum KeyClaim {
    Fresh(KeyGuard),
    Replay(Arc<Vec<Event>>),
    InUse,
    Mismatch,
}

/// A held claim: `complete` stores the answer; dropping it releases the key.
pub enum KeyGuard {
    Embedded(ClaimGuard),
    Redis(RedisClaim),
}

pub struct RedisClaim {
    redis: Redis,
    key: String,
    token: String,
    ttl: Duration,
    done: bool,
}

impl Idempotency {
    pub async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        now: Instant,
    ) -> Result<KeyClaim, RequestError> {
        let (redis, faults, ttl, in_flight_ttl) = match self {
            Idempotency::Embedded(store) => {
                return Ok(match store.claim(key, fingerprint, now) {
                    Claim::Fresh(g) => KeyClaim::Fresh(KeyGuard::Embedded(g)),
                    Claim::Replay(events) => KeyClaim::Replay(events),
                    Claim::InUse => KeyClaim::InUse,
                    Claim::Mismatch => KeyClaim::Mismatch,
                })
            }
            Idempotency::Redis {
                redis,
                faults,
                ttl,
                in_flight_ttl,
            } => (redis, faults, *ttl, *in_flight_ttl),
        };
        let token = token();
        let claim = redis
            .idem_claim(key, &fingerprint, &token, in_flight_ttl)
            .await
            .map_err(|e| {
                faults.record(
                    "idempotency",
                    &e,
                    "keyed requests are refused (fail closed)",
                );
                RequestError::StateUnavailable(format!(
                    "idempotency records cannot be checked: {e}"
                ))
            })?;
        Ok(match claim {
            IdemClaim::Fresh => KeyClaim::Fresh(KeyGuard::Redis(RedisClaim {
                redis: redis.clone(),
                key: key.to_string(),
                token,
                ttl,
                done: false,
            })),
            IdemClaim::Replay(bytes) => match serde_json::from_slice::<Vec<Event>>(&bytes) {
                Ok(events) => KeyClaim::Replay(Arc::new(events)),
                Err(e) => {
                    return Err(RequestError::StateUnavailable(format!(
                        "the stored answer for this key is unreadable: {e}"
                    )))
                }
            },
            IdemClaim::InUse => KeyClaim::InUse,
            IdemClaim::Mismatch => KeyClaim::Mismatch,
        })
    }
}

impl KeyGuard {
    /// Stores the finished answer for replays.
    pub async fn complete(self, events: Vec<Event>) {
        match self {
            KeyGuard::Embedded(g) => g.complete(events, Instant::now()),
            KeyGuard::Redis(mut c) => {
                c.done = true;
                let stored = match serde_json::to_vec(&events) {
                    Ok(bytes) => c.redis.idem_complete(&c.key, &c.token, &bytes, c.ttl).await,
                    Err(e) => Err(StateError::Unavailable(e.to_string())),
                };
                if let Err(e) = stored {
                    // The caller has its answer; a later duplicate runs again
                    // once the in-flight claim lapses.
                    tracing::warn!(error = %e, "idempotency record not stored");
                }
            }
        }
    }
}

impl Drop for RedisClaim {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (redis, key, token) = (self.redis.clone(), self.key.clone(), self.token.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = redis.idem_release(&key, &token).await;
            });
        }
    }
}

/// Per-tenant admission: in process, or counted by the fleet in Redis.
pub enum TenantLimits {
    Embedded(Arc<TenantLimiter>),
    Redis {
        redis: Redis,
        faults: Arc<StateFaults>,
        max_concurrent: u32,
        rate: Option<TokenBucketConfig>,
        /// A slot a dead replica held lapses after this.
        slot_ttl: Duration,
    },
}

/// A held tenant slot; dropping it frees the slot.
pub enum Slot {
    Embedded(TenantSlot),
    Redis(RedisSlot),
    /// Limits off, or Redis was unavailable (failed open).
    None,
}

pub struct RedisSlot {
    redis: Redis,
    tenant: String,
    id: String,
}

impl Drop for RedisSlot {
    fn drop(&mut self) {
        let (redis, tenant, id) = (self.redis.clone(), self.tenant.clone(), self.id.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = redis.tenant_release(&tenant, &id).await;
            });
        }
    }
}

impl TenantLimits {
    pub async fn admit(&self, tenant: &str) -> Result<Slot, RequestError> {
        let (redis, faults, max_concurrent, rate, slot_ttl) = match self {
            TenantLimits::Embedded(l) => {
                return l.admit(tenant, Instant::now()).map(Slot::Embedded)
            }
            TenantLimits::Redis {
                redis,
                faults,
                max_concurrent,
                rate,
                slot_ttl,
            } => (redis, faults, *max_concurrent, rate.clone(), *slot_ttl),
        };
        if max_concurrent == 0 && rate.is_none() {
            return Ok(Slot::None);
        }
        let id = token();
        match redis
            .tenant_acquire(tenant, &id, max_concurrent, rate, slot_ttl)
            .await
        {
            Ok(TenantDecision::Admitted) if max_concurrent > 0 => Ok(Slot::Redis(RedisSlot {
                redis: redis.clone(),
                tenant: tenant.to_string(),
                id,
            })),
            Ok(TenantDecision::Admitted) => Ok(Slot::None),
            Ok(TenantDecision::Concurrency) => Err(RequestError::TenantLimit {
                tenant: tenant.to_string(),
                limit: "concurrency",
                retry_after: Some(Duration::from_millis(100)),
            }),
            Ok(TenantDecision::Rate { retry_after }) => Err(RequestError::TenantLimit {
                tenant: tenant.to_string(),
                limit: "rate",
                retry_after: Some(retry_after),
            }),
            Err(e) => {
                faults.record(
                    "tenant_limits",
                    &e,
                    "tenant limits are not enforced (fail open)",
                );
                Ok(Slot::None)
            }
        }
    }
}
