//! The in-process cost guard: per-tenant spend over a sliding window of 60
//! buckets, enforced by reservation: a request holds its maximum cost against
//! the cap before its first attempt (atomically: concurrent requests cannot
//! all fit into the same remaining room), settles to the real cost when it
//! ends and releases the rest. Costs come from each target's price table and
//! the upstream's usage (estimated when it sent none).

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

/// One tenant's held reservations: id -> (amount, lapses at).
type Held = HashMap<String, (f64, Instant)>;

pub struct CostGuard {
    config: CostConfig,
    /// Spend per tenant in 60 buckets over the window.
    spend: Mutex<HashMap<String, Buckets<f64>>>,
    /// Held reservations per tenant: id -> (amount, lapses at).
    held: Mutex<HashMap<String, Held>>,
}

impl CostGuard {
    pub fn new(config: CostConfig) -> Self {
        CostGuard {
            config,
            spend: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Holds `usd` against the tenant's cap until `settle` (or `lapse`), or
    /// says why it does not fit. Atomic: one lock covers the check and the hold.
    pub fn reserve(
        &self,
        tenant: &str,
        id: &str,
        usd: f64,
        lapse: Instant,
        now: Instant,
    ) -> Result<(), OverCap> {
        let Some(cap) = self.cap(tenant) else {
            return Ok(());
        };
        let Ok(mut held) = self.held.lock() else {
            return Ok(());
        };
        let mine = held.entry(tenant.to_string()).or_default();
        mine.retain(|_, (_, until)| *until > now);
        let reserved: f64 = mine.values().map(|(a, _)| a).sum();
        let spent = self.spent(tenant, now);
        if spent + reserved + usd > cap + 1e-9 {
            if mine.is_empty() {
                held.remove(tenant);
            }
            return Err(OverCap {
                spent_usd: spent + reserved,
                cap_usd: cap,
                retry_in: self.config.window / 60,
            });
        }
        mine.insert(id.to_string(), (usd.max(0.0), lapse));
        Ok(())
    }

    /// Ends a reservation: charges `actual` and frees the rest.
    pub fn settle(&self, tenant: &str, id: &str, actual: f64, now: Instant) {
        // Charge first: between the two steps the spend is never under-counted.
        self.charge(tenant, actual, now);
        if let Ok(mut held) = self.held.lock() {
            if let Some(mine) = held.get_mut(tenant) {
                mine.remove(id);
                if mine.is_empty() {
                    held.remove(tenant);
                }
            }
        }
    }

    pub fn config(&self) -> &CostConfig {
        &self.config
    }

    /// Tenants whose spend is tracked.
    pub fn tenants(&self) -> usize {
        self.spend.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// The cap for a tenant, if any.
    pub fn cap(&self, tenant: &str) -> Option<f64> {
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
            if spend.len() >= MAX_TENANTS && !spend.contains_key(tenant) {
                make_room(&mut spend, now);
            }
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

/// Most tenants whose spend is tracked in process (tenant names come from
/// callers in open auth mode).
pub const MAX_TENANTS: usize = 10_000;

/// Drops the tenants with nothing spent in the window; if every one has
/// spent, the smallest spender (only a flood of new names gets here).
fn make_room(spend: &mut HashMap<String, Buckets<f64>>, now: Instant) {
    spend.retain(|_, b| b.live(now).sum::<f64>() > 0.0);
    if spend.len() < MAX_TENANTS {
        return;
    }
    let smallest = spend
        .iter()
        .map(|(k, b)| (k.clone(), b.live(now).sum::<f64>()))
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _)| k);
    if let Some(k) = smallest {
        tracing::warn!(
            tenants = MAX_TENANTS,
            "cost ledger full; forgetting the smallest spender"
        );
        spend.remove(&k);
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
