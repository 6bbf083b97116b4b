//! The cost ledger the request path reserves against, in one home: this face
//! (`CostLedger`) with what a Redis outage does, the in-process ledger
//! (`embedded`), the fleet's on Redis (`redis`) and the outage allowance
//! (`outage`). A request of a capped tenant holds its maximum cost before its
//! first attempt and settles to the real cost when it ends; a tenant without a
//! cap is never written anywhere.
//!
//! When Redis does not answer, a reservation is held against this replica's
//! allowance (the tenant's last known room, else its cap, split by the live
//! replicas), or
//! refused with STATE_UNAVAILABLE on a `fail_closed` route; charges Redis
//! could not record are kept (bounded) and settled into the ledger when it
//! answers again. Each failure counts in `switchyard_state_errors_total{function="cost"}`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::CostConfig;
use crate::error::RequestError;
use crate::state::redis::Redis;
use crate::state::{token, StateFaults};

pub mod embedded;
pub mod outage;
mod redis;

pub use embedded::{CostGuard, OverCap};
use outage::{Outage, Refused};
use redis::{Seen, Settlement};

/// What a cost reservation found.
#[derive(Debug, Clone, PartialEq)]
pub enum CostDecision {
    /// The amount is held against the tenant's cap until settled.
    Reserved,
    /// Spent plus held plus this amount would pass the cap.
    OverCap {
        spent_usd: f64,
        reserved_usd: f64,
        /// When the oldest charge leaves the window (at most the window).
        retry_in: Duration,
    },
}

/// What a reservation does when the fleet ledger cannot be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnOutage {
    /// Hold it against this replica's allowance (the default).
    Allowance,
    /// Refuse it with STATE_UNAVAILABLE (a route's `fail_closed = true`).
    Refuse,
}

/// Why a reservation was refused.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The tenant's cap (or its allowance during an outage) has no room.
    OverCap(OverCap),
    /// The ledger cannot be asked and nothing bounds the spend.
    Unavailable(String),
}

impl Refusal {
    /// The caller's error for a request of `tenant`.
    pub fn into_error(self, tenant: &str) -> RequestError {
        match self {
            Refusal::OverCap(over) => RequestError::CostCap {
                tenant: tenant.to_string(),
                spent_usd: over.spent_usd,
                cap_usd: over.cap_usd,
                retry_in: over.retry_in,
            },
            Refusal::Unavailable(why) => RequestError::StateUnavailable(why),
        }
    }
}

/// Where a reservation is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// In the ledger (in process or on Redis).
    Ledger,
    /// Against this replica's outage allowance.
    Allowance,
}

/// A held reservation; hand it back to `settle`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    pub tenant: String,
    pub id: String,
    pub held_usd: f64,
    pub held: Held,
}

/// The ledger the request path reserves against.
pub enum CostLedger {
    Embedded(CostGuard),
    Redis(RedisLedger),
}

/// The fleet ledger on Redis and this replica's outage state.
pub struct RedisLedger {
    config: CostConfig,
    redis: Redis,
    faults: Arc<StateFaults>,
    /// Names this replica in the heartbeat set and its batches.
    replica: String,
    outage: Mutex<Outage>,
}

/// How often a replica marks itself live; it counts as gone after `HEARTBEAT_TTL`.
pub const HEARTBEAT_EVERY: Duration = Duration::from_secs(5);
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(15);
/// How often owed charges are sent while Redis does not take them.
const SETTLE_EVERY: Duration = Duration::from_secs(1);

impl CostLedger {
    /// The fleet ledger on `redis`.
    pub fn redis(config: CostConfig, redis: Redis, faults: Arc<StateFaults>) -> Self {
        CostLedger::Redis(RedisLedger {
            config,
            redis,
            faults,
            replica: token(),
            outage: Mutex::new(Outage::new()),
        })
    }

    fn config(&self) -> &CostConfig {
        match self {
            CostLedger::Embedded(g) => g.config(),
            CostLedger::Redis(r) => &r.config,
        }
    }

    /// The cap for a tenant, if any.
    fn cap(&self, tenant: &str) -> Option<f64> {
        let config = self.config();
        config
            .tenant_caps_usd
            .get(tenant)
            .copied()
            .or(config.default_cap_usd)
    }

    /// The tenant spends against a cap.
    pub fn has_cap(&self, tenant: &str) -> bool {
        self.cap(tenant).is_some()
    }

    /// Reserves `usd` for `tenant` (held at most `hold`); `None` when the
    /// tenant has no cap (nothing to hold, nothing written).
    pub async fn reserve(
        &self,
        tenant: &str,
        usd: f64,
        hold: Duration,
        on_outage: OnOutage,
    ) -> Result<Option<Reservation>, Refusal> {
        let Some(cap) = self.cap(tenant) else {
            return Ok(None);
        };
        let id = token();
        let held = match self {
            CostLedger::Embedded(g) => {
                let now = Instant::now();
                g.reserve(
                    tenant,
                    &id,
                    usd,
                    crate::policy::clock::after(now, hold),
                    now,
                )
                .map_err(Refusal::OverCap)?;
                Held::Ledger
            }
            CostLedger::Redis(r) => r.reserve(tenant, &id, usd, cap, hold, on_outage).await?,
        };
        Ok(Some(Reservation {
            tenant: tenant.to_string(),
            id,
            held_usd: usd,
            held,
        }))
    }

    /// Ends a reservation at the real cost.
    pub async fn settle(&self, r: Reservation, actual: f64) {
        match self {
            CostLedger::Embedded(g) => g.settle(&r.tenant, &r.id, actual, Instant::now()),
            CostLedger::Redis(ledger) => ledger.settle(r, actual).await,
        }
    }

    /// Records spend outside any reservation; a tenant without a cap is not
    /// tracked at all.
    pub async fn charge(&self, tenant: &str, usd: f64) {
        if usd <= 0.0 || !usd.is_finite() || !self.has_cap(tenant) {
            return;
        }
        match self {
            CostLedger::Embedded(g) => g.charge(tenant, usd, Instant::now()),
            CostLedger::Redis(ledger) => ledger.record(tenant, usd, None).await,
        }
    }

    /// The fleet ledger's upkeep, for the process's life: marks this replica
    /// live (the allowance divides by the count) and settles owed charges
    /// once Redis takes them. Nothing to do in process.
    pub async fn upkeep(self: Arc<Self>) {
        let CostLedger::Redis(ledger) = &*self else {
            return;
        };
        let mut tick = tokio::time::interval(SETTLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let beats = (HEARTBEAT_EVERY.as_millis() / SETTLE_EVERY.as_millis()).max(1) as u64;
        let mut n = 0u64;
        loop {
            tick.tick().await;
            if n % beats == 0 {
                ledger.heartbeat().await;
            }
            n = n.wrapping_add(1);
            ledger.settle_owed().await;
        }
    }
}

impl RedisLedger {
    fn outage(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.outage.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn reserve(
        &self,
        tenant: &str,
        id: &str,
        usd: f64,
        cap: f64,
        hold: Duration,
        on_outage: OnOutage,
    ) -> Result<Held, Refusal> {
        // What this replica owes the tenant's ledger lands before it is asked again.
        let asked = match self.settle_tenant(tenant).await {
            Ok(()) => {
                let window = self.config.window;
                self.redis
                    .cost_reserve_seen(tenant, id, usd, cap, window, hold)
                    .await
            }
            Err(e) => Err(e),
        };
        match asked {
            Ok((decision, seen)) => self.decided(tenant, usd, cap, decision, seen),
            Err(e) => {
                let consequence = match on_outage {
                    OnOutage::Allowance => "cost caps held by this replica's allowance",
                    OnOutage::Refuse => "capped requests on fail_closed routes are refused",
                };
                self.faults.record("cost", &e, consequence);
                if on_outage == OnOutage::Refuse {
                    return Err(Refusal::Unavailable(format!(
                        "the cost ledger cannot be checked: {e}"
                    )));
                }
                self.take_allowance(tenant, usd, cap, &e)
            }
        }
    }

    /// Redis decided: remember the room it showed, and answer.
    fn decided(
        &self,
        tenant: &str,
        usd: f64,
        cap: f64,
        decision: CostDecision,
        seen: Seen,
    ) -> Result<Held, Refusal> {
        let room = cap - seen.spent_usd - seen.reserved_usd;
        match decision {
            CostDecision::Reserved => {
                self.outage().seen(tenant, room - usd, Instant::now());
                Ok(Held::Ledger)
            }
            CostDecision::OverCap {
                spent_usd,
                reserved_usd,
                retry_in,
            } => {
                self.outage().seen(tenant, room, Instant::now());
                Err(Refusal::OverCap(OverCap {
                    spent_usd: spent_usd + reserved_usd,
                    cap_usd: cap,
                    retry_in,
                }))
            }
        }
    }

    fn take_allowance(
        &self,
        tenant: &str,
        usd: f64,
        cap: f64,
        err: &crate::state::StateError,
    ) -> Result<Held, Refusal> {
        match self.outage().take(tenant, usd, cap) {
            Ok(()) => Ok(Held::Allowance),
            Err(Refused::Full) => Err(Refusal::Unavailable(format!(
                "the cost ledger cannot be checked and too many tenants spend allowances: {err}"
            ))),
            Err(Refused::Over { left_usd }) => Err(Refusal::OverCap(OverCap {
                spent_usd: (cap - left_usd).max(0.0),
                cap_usd: cap,
                retry_in: self.config.window / 60,
            })),
        }
    }

    async fn settle(&self, r: Reservation, actual: f64) {
        let actual = if actual.is_finite() {
            actual.max(0.0)
        } else {
            0.0
        };
        match r.held {
            Held::Allowance => {
                // Redis was away when it was held: owed, and sent with the
                // tenant's next batch (no call paid per request of an outage).
                let mut outage = self.outage();
                outage.give_back(&r.tenant, r.held_usd, actual);
                if !outage.owe(&r.tenant, actual, None) {
                    tracing::warn!("too many tenants owe charges: a charge was lost");
                }
            }
            Held::Ledger => {
                let window = self.config.window;
                match self
                    .redis
                    .cost_settle(&r.tenant, &r.id, actual, window)
                    .await
                {
                    Ok(()) => self.outage().returned(&r.tenant, r.held_usd, actual),
                    Err(e) => self.owe(&r.tenant, actual, Some(&r.id), &e),
                }
            }
        }
    }

    /// Records a charge (and ends a reservation, if named) in the ledger, or
    /// owes it when Redis does not take it.
    async fn record(&self, tenant: &str, usd: f64, reservation: Option<&str>) {
        let id = reservation.map_or_else(token, str::to_string);
        let window = self.config.window;
        if let Err(e) = self.redis.cost_settle(tenant, &id, usd, window).await {
            self.owe(tenant, usd, reservation, &e);
        }
    }

    fn owe(&self, tenant: &str, usd: f64, reservation: Option<&str>, e: &crate::state::StateError) {
        if self.outage().owe(tenant, usd, reservation) {
            self.faults
                .record("cost", e, "charges kept until Redis takes them");
        } else {
            self.faults
                .record("cost", e, "too many tenants owe charges: a charge was lost");
        }
    }

    /// Sends what this replica owes for `tenant`, batch by batch.
    async fn settle_tenant(&self, tenant: &str) -> Result<(), crate::state::StateError> {
        loop {
            let batch = {
                let mut outage = self.outage();
                if !outage.owes(tenant) {
                    return Ok(());
                }
                outage.batch(tenant, &self.replica)
            };
            let Some(batch) = batch else {
                return Ok(());
            };
            let settlement = Settlement {
                actual_usd: batch.usd,
                reservations: &batch.reservations,
                batch: Some(&batch.id),
            };
            self.redis
                .cost_settle_many(tenant, &settlement, self.config.window)
                .await?;
            self.outage().landed(tenant, &batch.id);
        }
    }

    /// Sends what this replica owes for every tenant; stops at the first
    /// failure (Redis is still away).
    async fn settle_owed(&self) {
        let debtors = self.outage().debtors();
        for tenant in debtors {
            if let Err(e) = self.settle_tenant(&tenant).await {
                self.faults
                    .record("cost", &e, "charges kept until Redis takes them");
                return;
            }
        }
    }

    async fn heartbeat(&self) {
        match self
            .redis
            .replicas_heartbeat(&self.replica, HEARTBEAT_TTL)
            .await
        {
            Ok(n) => self.outage().set_replicas(n),
            Err(e) => self
                .faults
                .record("cost", &e, "the live replica count is not refreshed"),
        }
    }

    /// USD this replica owes the ledger.
    pub fn owed_usd(&self) -> f64 {
        self.outage().owed_usd()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn reservations_hold_the_cap_exactly_under_concurrency() {
        let ledger = std::sync::Arc::new(CostLedger::Embedded(CostGuard::new(CostConfig {
            window: Duration::from_secs(3600),
            default_cap_usd: Some(5.0),
            ..Default::default()
        })));
        let hold = Duration::from_secs(60);
        let on = OnOutage::Allowance;
        let mut tasks = Vec::new();
        for _ in 0..20 {
            let l = ledger.clone();
            tasks.push(tokio::spawn(
                async move { l.reserve("t", 1.0, hold, on).await },
            ));
        }
        let mut held = Vec::new();
        for t in tasks {
            if let Ok(Some(r)) = t.await.unwrap() {
                held.push(r);
            }
        }
        assert_eq!(held.len(), 5, "20 x 1 USD against 5 USD");
        // Settling lower frees room: 5 x 0.5 spent, 2.5 left -> two more fit.
        for r in held {
            ledger.settle(r, 0.5).await;
        }
        assert!(ledger.reserve("t", 1.0, hold, on).await.unwrap().is_some());
        assert!(ledger.reserve("t", 1.0, hold, on).await.unwrap().is_some());
        let Refusal::OverCap(over) = ledger.reserve("t", 1.0, hold, on).await.unwrap_err() else {
            panic!("over the cap")
        };
        assert!((over.spent_usd - 4.5).abs() < 1e-9, "{over:?}");
        // A held reservation lapses (its request's task died).
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(ledger.reserve("t", 1.0, hold, on).await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_without_a_cap_is_not_tracked_in_process() {
        let mut config = CostConfig::default();
        config.tenant_caps_usd.insert("capped".into(), 1.0);
        let ledger = CostLedger::Embedded(CostGuard::new(config));
        let hold = Duration::from_secs(60);
        assert_eq!(
            ledger
                .reserve("free", 5.0, hold, OnOutage::Allowance)
                .await
                .unwrap(),
            None
        );
        ledger.charge("free", 5.0).await;
        ledger.charge("capped", 0.25).await;
        let CostLedger::Embedded(g) = &ledger else {
            panic!()
        };
        assert_eq!(g.tenants(), 1, "only the capped tenant is tracked");
        assert_eq!(g.spent("capped", Instant::now()), 0.25);
    }
}
