//! The cost guard: per-tenant spend over a sliding window, checked before a
//! request is routed and between its attempts, so an expensive fallback chain
//! cannot run up a bill past the tenant's cap. Costs come from each target's
//! price table and the upstream's usage (estimated when it sent none).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::CostConfig;
use crate::policy::window::Buckets;

/// A tenant is past its cap.
#[derive(Debug, Clone, PartialEq)]
pub struct OverCap {
    pub spent_usd: f64,
    pub cap_usd: f64,
    /// When enough of the window has passed to spend again (at most the window).
    pub retry_in: Duration,
}

pub struct CostGuard {
    config: CostConfig,
    /// Spend per tenant in 60 buckets over the window.
    spend: Mutex<HashMap<String, Buckets<f64>>>,
}

impl CostGuard {
    pub fn new(config: CostConfig) -> Self {
        CostGuard {
            config,
            spend: Mutex::new(HashMap::new()),
        }
    }

    fn cap(&self, tenant: &str) -> Option<f64> {
        self.config
            .tenant_caps_usd
            .get(tenant)
            .copied()
            .or(self.config.default_cap_usd)
    }

    /// Refuses a tenant at or past its cap.
    pub fn check(&self, tenant: &str, now: Instant) -> Result<(), OverCap> {
        let Some(cap) = self.cap(tenant) else {
            return Ok(());
        };
        let spent = self.spent(tenant, now);
        if spent >= cap {
            return Err(OverCap {
                spent_usd: spent,
                cap_usd: cap,
                retry_in: self.config.window / 60,
            });
        }
        Ok(())
    }

    /// Adds spend for a tenant.
    pub fn charge(&self, tenant: &str, usd: f64, now: Instant) {
        if usd <= 0.0 || !usd.is_finite() {
            return;
        }
        if let Ok(mut spend) = self.spend.lock() {
            let window = self.config.window;
            let buckets = spend
                .entry(tenant.to_string())
                .or_insert_with(|| Buckets::new(now, window, 60));
            *buckets.current(now) += usd;
        }
    }

    /// A tenant's spend in the window.
    pub fn spent(&self, tenant: &str, now: Instant) -> f64 {
        self.spend
            .lock()
            .ok()
            .and_then(|s| s.get(tenant).map(|b| b.live(now).sum()))
            .unwrap_or(0.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn caps_apply_per_tenant_over_the_window() {
        let mut config = CostConfig {
            window: Duration::from_secs(60),
            default_cap_usd: Some(1.0),
            ..Default::default()
        };
        config.tenant_caps_usd.insert("big".into(), 10.0);
        let g = CostGuard::new(config);
        let t0 = Instant::now();
        g.charge("a", 0.6, t0);
        assert!(g.check("a", t0).is_ok());
        g.charge("a", 0.5, t0);
        let over = g.check("a", t0).unwrap_err();
        assert!((over.spent_usd - 1.1).abs() < 1e-9);
        assert!(g.check("b", t0).is_ok(), "another tenant is separate");
        g.charge("big", 5.0, t0);
        assert!(g.check("big", t0).is_ok(), "its own cap");
        assert!(
            g.check("a", t0 + Duration::from_secs(61)).is_ok(),
            "the window moved on"
        );
    }
}
