//! Per-tenant admission: concurrent requests and request rate per tenant,
//! refused with RESOURCE_EXHAUSTED (TENANT_LIMIT) and a retry time instead of
//! queueing. A held slot is released when the request's task ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::LimitsConfig;
use crate::error::RequestError;
use crate::policy::token_bucket::{TokenBucket, TokenBucketConfig};

#[derive(Default)]
struct TenantState {
    active: u32,
    bucket: Option<TokenBucket>,
}

/// The limiter; share behind an `Arc`.
pub struct TenantLimiter {
    max_concurrent: u32,
    rate: Option<TokenBucketConfig>,
    tenants: Mutex<HashMap<String, TenantState>>,
}

/// Most tenants tracked at once (tenant names come from callers in open
/// auth mode); past it, tenants with nothing in flight are forgotten.
pub const MAX_TENANTS: usize = 10_000;

/// A held concurrency slot; dropping it frees the slot.
pub struct TenantSlot {
    /// `None` when no limit is configured (nothing is tracked).
    limiter: Option<Arc<TenantLimiter>>,
    tenant: String,
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        let Some(limiter) = &self.limiter else {
            return;
        };
        if let Ok(mut tenants) = limiter.tenants.lock() {
            if let Some(t) = tenants.get_mut(&self.tenant) {
                t.active = t.active.saturating_sub(1);
                // Without a rate there is nothing to remember of an idle tenant.
                if t.active == 0 && t.bucket.is_none() {
                    tenants.remove(&self.tenant);
                }
            }
        }
    }
}

impl TenantLimiter {
    pub fn new(limits: &LimitsConfig) -> Arc<Self> {
        let rate = (limits.tenant_rate_per_sec > 0.0).then(|| TokenBucketConfig {
            rate: limits.tenant_rate_per_sec,
            burst: limits.tenant_burst.max(1),
        });
        Arc::new(TenantLimiter {
            max_concurrent: limits.tenant_max_concurrent,
            rate,
            tenants: Mutex::new(HashMap::new()),
        })
    }

    /// Admits one request of `tenant`, or says which limit refused it.
    pub fn admit(self: &Arc<Self>, tenant: &str, now: Instant) -> Result<TenantSlot, RequestError> {
        if self.max_concurrent == 0 && self.rate.is_none() {
            return Ok(TenantSlot {
                limiter: None,
                tenant: String::new(),
            });
        }
        let mut tenants = self
            .tenants
            .lock()
            .map_err(|_| RequestError::Unavailable("tenant limiter poisoned".into()))?;
        if tenants.len() >= MAX_TENANTS && !tenants.contains_key(tenant) {
            // A rate bucket forgotten starts full again: only a flood of
            // distinct names gets here, and each name is still limited.
            tenants.retain(|_, t| t.active > 0);
        }
        let state = tenants.entry(tenant.to_string()).or_default();
        if self.max_concurrent > 0 && state.active >= self.max_concurrent {
            return Err(RequestError::TenantLimit {
                tenant: tenant.to_string(),
                limit: "concurrency",
                retry_after: Some(Duration::from_millis(100)),
            });
        }
        if let Some(rate) = &self.rate {
            let bucket = state
                .bucket
                .get_or_insert_with(|| TokenBucket::new(rate, now));
            if !bucket.try_take(now) {
                return Err(RequestError::TenantLimit {
                    tenant: tenant.to_string(),
                    limit: "rate",
                    retry_after: Some(bucket.time_until_available(now)),
                });
            }
        }
        state.active += 1;
        Ok(TenantSlot {
            limiter: Some(self.clone()),
            tenant: tenant.to_string(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn concurrency_and_rate_per_tenant() {
        let limits = LimitsConfig {
            tenant_max_concurrent: 2,
            tenant_rate_per_sec: 10.0,
            tenant_burst: 3,
            ..LimitsConfig::default()
        };
        let l = TenantLimiter::new(&limits);
        let now = Instant::now();
        let a = l.admit("a", now).unwrap();
        let _b = l.admit("a", now).unwrap();
        assert!(matches!(
            l.admit("a", now),
            Err(RequestError::TenantLimit {
                limit: "concurrency",
                ..
            })
        ));
        assert!(l.admit("other", now).is_ok(), "tenants are separate");
        drop(a);
        let _c = l.admit("a", now).unwrap();
        drop(_c);
        // Burst of 3 used (a, b, c): the fourth within the same instant is rate-limited.
        drop(_b);
        assert!(matches!(
            l.admit("a", now),
            Err(RequestError::TenantLimit { limit: "rate", .. })
        ));
        assert!(
            l.admit("a", now + Duration::from_millis(100)).is_ok(),
            "one token per 100 ms"
        );
    }
}
