//! Per-tenant admission (concurrency and rate), in one home: this face
//! (`TenantLimits`) with what a Redis outage does, the in-process limiter
//! (`embedded`) and the fleet's on Redis (`redis`).
//!
//! On Redis a concurrency slot is a lease (`state.lease`, 20 s) renewed
//! while its request lives, so a dead replica's slot lapses within it; a
//! release that fails is retried with backoff until Redis answers (or the
//! lease has lapsed anyway). An outage fails open: the request runs unlimited,
//! with a WARN and `switchyard_state_errors_total{function="tenant_limits"}`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::RequestError;
use crate::policy::token_bucket::TokenBucketConfig;
use crate::state::redis::lease::{Renewal, Retries};
use crate::state::redis::Redis;
use crate::state::{token, StateFaults};

pub mod embedded;
mod redis;

pub use embedded::{TenantLimiter, TenantSlot};

/// What tenant admission decided.
#[derive(Debug, Clone, PartialEq)]
pub enum TenantDecision {
    Admitted,
    /// At `max_concurrent` requests in flight.
    Concurrency,
    /// Over the rate; a token is available after this long.
    Rate {
        retry_after: Duration,
    },
}

/// Per-tenant admission: in process, or counted by the fleet in Redis.
pub enum TenantLimits {
    Embedded(Arc<TenantLimiter>),
    Redis(RedisTenants),
}

/// The fleet's tenant limits and what a held slot needs to give itself back.
pub struct RedisTenants {
    redis: Redis,
    faults: Arc<StateFaults>,
    retries: Arc<Retries>,
    max_concurrent: u32,
    rate: Option<TokenBucketConfig>,
    /// A slot lapses this long after its last renewal.
    lease: Duration,
}

/// A held tenant slot; dropping it frees the slot.
pub enum Slot {
    Embedded(TenantSlot),
    Redis(RedisSlot),
    /// Limits off, or Redis was unavailable (failed open).
    None,
}

/// A slot in the fleet's set, renewed while held.
pub struct RedisSlot {
    redis: Redis,
    retries: Arc<Retries>,
    tenant: String,
    id: String,
    lease: Duration,
    _renewal: Renewal,
}

impl Drop for RedisSlot {
    fn drop(&mut self) {
        let (redis, tenant, id) = (self.redis.clone(), self.tenant.clone(), self.id.clone());
        let released = self.retries.spawn("tenant_limits", 0, self.lease, move || {
            let (redis, tenant, id) = (redis.clone(), tenant.clone(), id.clone());
            async move { redis.tenant_release(&tenant, &id).await }
        });
        if !released {
            tracing::warn!("too many releases being retried: a tenant slot lapses with its lease");
        }
    }
}

impl TenantLimits {
    pub fn redis(
        redis: Redis,
        faults: Arc<StateFaults>,
        retries: Arc<Retries>,
        limits: &crate::config::LimitsConfig,
        lease: Duration,
    ) -> Self {
        let rate = (limits.tenant_rate_per_sec > 0.0).then(|| TokenBucketConfig {
            rate: limits.tenant_rate_per_sec,
            burst: limits.tenant_burst.max(1),
        });
        TenantLimits::Redis(RedisTenants {
            redis,
            faults,
            retries,
            max_concurrent: limits.tenant_max_concurrent,
            rate,
            lease,
        })
    }

    pub async fn admit(&self, tenant: &str) -> Result<Slot, RequestError> {
        match self {
            TenantLimits::Embedded(l) => l.admit(tenant, Instant::now()).map(Slot::Embedded),
            TenantLimits::Redis(r) => r.admit(tenant).await,
        }
    }
}

impl RedisTenants {
    async fn admit(&self, tenant: &str) -> Result<Slot, RequestError> {
        if self.max_concurrent == 0 && self.rate.is_none() {
            return Ok(Slot::None);
        }
        let id = token();
        let decision = self
            .redis
            .tenant_acquire(
                tenant,
                &id,
                self.max_concurrent,
                self.rate.clone(),
                self.lease,
            )
            .await;
        match decision {
            Ok(TenantDecision::Admitted) if self.max_concurrent > 0 => {
                Ok(Slot::Redis(self.held(tenant, id)))
            }
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
                self.faults.record(
                    "tenant_limits",
                    &e,
                    "tenant limits are not enforced (fail open)",
                );
                Ok(Slot::None)
            }
        }
    }

    /// The slot `id`, renewed until dropped.
    fn held(&self, tenant: &str, id: String) -> RedisSlot {
        let (redis, t, i, lease) = (
            self.redis.clone(),
            tenant.to_string(),
            id.clone(),
            self.lease,
        );
        let renewal = Renewal::start(self.faults.clone(), "tenant_limits", lease, move || {
            let (redis, t, i) = (redis.clone(), t.clone(), i.clone());
            async move { redis.tenant_renew(&t, &i, lease).await }
        });
        RedisSlot {
            redis: self.redis.clone(),
            retries: self.retries.clone(),
            tenant: tenant.to_string(),
            id,
            lease,
            _renewal: renewal,
        }
    }
}
