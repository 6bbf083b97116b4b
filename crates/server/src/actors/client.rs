//! The one door to the actors for everything outside them: a plan from the
//! router actor, a permit from a provider actor, one more attempt from a
//! route's retry budget, the casts that tell them what was served or queued,
//! and the timeouts every such call waits under. Request tasks, the semantic
//! cache's embedder and the doors call these; none of them builds a message.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use tokio::time::Instant;

use super::provider::{Permit, ProviderMsg, Refusal, TrafficClass};
use super::recovery::RecoveryMsg;
use super::registry::{ProviderEntry, Registry};
use super::router::{Plan, PlanError, Planner, RouteTable, RouterMsg};
use crate::chat::Needs;
use crate::error::RequestError;
use crate::telemetry::metrics::{ActorCalls, Metrics};

/// How long a request task waits for an actor's reply before treating the
/// actor as unavailable (it is being restarted).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request waits for a restarting provider actor to reappear.
const RESTART_GRACE: Duration = Duration::from_millis(500);

/// How long a metrics scrape waits for the router to fold its tallies in.
const FOLD_WAIT: Duration = Duration::from_secs(1);

/// Has the router fold its routes' tallies in and waits (up to a second)
/// until it has, so a metrics scrape counts every request answered before it.
pub async fn fold_tallies(registry: &Registry) {
    if let Some(router) = registry.router() {
        let _ = router
            .call(|reply| RouterMsg::Fold(Some(reply)), Some(FOLD_WAIT))
            .await;
    }
}

/// The answer to a request for a permit.
pub enum Admission {
    Granted(ProviderEntry, Permit),
    Refused(Refusal),
    /// The actor is gone and no new incarnation appeared in time.
    Unreachable,
}

/// The actors as callers see them; cheap to clone.
#[derive(Clone)]
pub struct Actors {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    calls: ActorCalls,
}

impl Actors {
    pub fn new(registry: Arc<Registry>, metrics: Arc<Metrics>) -> Self {
        Actors {
            registry,
            calls: metrics.actor_calls(),
            metrics,
        }
    }

    /// A provider's actor and runtime (prices, snapshots), if it runs.
    pub fn provider(&self, id: &str) -> Option<ProviderEntry> {
        self.registry.provider(id)
    }

    /// The chat targets of `route` that have every capability in `needs`
    /// (only `pin`, when given), ranked from the router's published table
    /// (no call: one cast tells the route's budget).
    pub async fn plan(
        &self,
        route: &str,
        needs: &Needs,
        pin: Option<&str>,
    ) -> Result<Plan, RequestError> {
        self.planned(route, |table, at, now| {
            table.plan(at, route, needs, pin, now)
        })
    }

    /// The `embeddings` targets of `route`, of one family.
    pub async fn plan_embeddings(
        &self,
        route: &str,
        pin: Option<&str>,
    ) -> Result<Plan, RequestError> {
        self.planned(route, |table, at, now| {
            table.plan_embeddings(at, route, pin, now)
        })
    }

    fn planned(
        &self,
        route: &str,
        plan: impl FnOnce(&RouteTable, Planner<'_>, Instant) -> Result<Plan, PlanError>,
    ) -> Result<Plan, RequestError> {
        let (Some(table), true) = (self.registry.route_table(), self.registry.has_router()) else {
            return Err(RequestError::Unavailable(
                "router actor is not running".into(),
            ));
        };
        let at = Planner {
            registry: &self.registry,
            metrics: &self.metrics,
        };
        let plan = plan(&table, at, Instant::now())?;
        if let Some(tally) = table.tally(route) {
            tally.planned();
        }
        Ok(plan)
    }

    /// Asks the route's budget for one more attempt (a retry or a failover).
    pub async fn withdraw_retry(&self, route: &str) -> bool {
        let Some(router) = self.registry.router() else {
            return false;
        };
        let msg = |reply| RouterMsg::WithdrawRetry {
            route: route.to_string(),
            reply,
        };
        self.calls.withdraw_retry.inc();
        matches!(
            router.call(msg, Some(CALL_TIMEOUT)).await,
            Ok(CallResult::Success(true))
        )
    }

    /// Tells the router a request of `route` was answered (its failover
    /// rate), through the route's tally: no message.
    pub fn served(&self, route: &str, primary: bool) {
        if let Some(tally) = self
            .registry
            .route_table()
            .as_deref()
            .and_then(|t| t.tally(route))
        {
            tally.served(primary);
        }
    }

    /// Wakes the recovery actor: a job is waiting.
    pub fn jobs_waiting(&self) {
        if let Some(recovery) = self.registry.recovery() {
            let _ = recovery.cast(RecoveryMsg::JobsWaiting);
        }
    }

    /// A permit to send one call to `model`: straight from the provider's
    /// semaphores while its gate is open (no message at all), else from its
    /// actor. A busy actor is waited for up to `deadline` (its mailbox is a
    /// queue, not a failure); a dead one up to `RESTART_GRACE` for its next
    /// incarnation.
    pub async fn take_permit(
        &self,
        provider: &str,
        model: &Arc<str>,
        traffic: TrafficClass,
        deadline: Instant,
    ) -> Admission {
        let give_up = Instant::now() + RESTART_GRACE;
        loop {
            let Some(entry) = self.registry.provider(provider) else {
                return Admission::Unreachable;
            };
            if let Some(permit) = entry.runtime.admit_through_gate(model, traffic) {
                self.calls.gate.inc();
                return Admission::Granted(entry, permit);
            }
            self.calls.admit.inc();
            let wait = deadline.saturating_duration_since(Instant::now());
            if wait.is_zero() {
                return Admission::Unreachable;
            }
            let msg = |reply| ProviderMsg::Admit {
                model: model.clone(),
                class: traffic,
                reply,
            };
            match entry.actor.call(msg, Some(wait)).await {
                Ok(CallResult::Success(Ok(permit))) => return Admission::Granted(entry, permit),
                Ok(CallResult::Success(Err(refusal))) => return Admission::Refused(refusal),
                Ok(CallResult::Timeout) => return Admission::Unreachable,
                _ if Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ => return Admission::Unreachable,
            }
        }
    }
}
