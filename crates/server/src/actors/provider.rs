//! The provider actor: one per provider. It owns the provider's control
//! state — a breaker, health window and cooldown per model, and the two
//! concurrency ceilings — answers admissions with permits that live as long as
//! the stream, takes one outcome report per attempt, and publishes a snapshot
//! on a `watch` so the router never has to ask. It never awaits I/O in
//! `handle`: attempts (and synthetic probes) run in their own tasks.
//!
//! Reports reach it through its [`Inbox`]: the report that finds the inbox
//! empty casts one message, and every report that arrives before the actor
//! handles it rides on that message, folded in the order sent and published
//! once. Nothing waits longer than a cast of its own would have.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::recovery::RecoveryMsg;
use super::registry::Registry;
use crate::config::{ModelConfig, ProviderConfig, ProviderKind};
use crate::policy::breaker::{
    Breaker, BreakerRefusal, BreakerState, Cause, Forced, Phase, Ticket, Transition,
};
use crate::policy::cooldown::{Cooldown, CooldownKind};
use crate::policy::health::{HealthWindow, Sample};
use crate::policy::outcome::OutcomeClass;
use crate::policy::share::ShareWindow;
use crate::telemetry::metrics::{Metrics, RefusalLabels, TargetLabels, TransitionLabels};
use crate::upstream::endpoint::Endpoint;

pub use crate::upstream::endpoint::Secret;

/// Whether a request is the provider's own traffic (it is the route's first
/// target) or traffic failing over to it, which has a lower ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrafficClass {
    Own,
    Failover,
}

impl TrafficClass {
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficClass::Own => "own",
            TrafficClass::Failover => "failover",
        }
    }
}

/// One model's published state.
#[derive(Debug, Clone, PartialEq)]
pub struct TargetSnapshot {
    pub breaker: BreakerState,
    /// Health score in [0, 1] (1 for an unknown or healthy target).
    pub score: f64,
    pub success_rate: Option<f64>,
    pub p95_ttft: Option<Duration>,
    pub calls: u64,
    /// At least `health.min_calls` calls in the window: `score` may reorder a route.
    pub evidence: bool,
    /// Skipped until this instant: rate limit, quota, or a rejected key.
    pub cooldown_until: Option<Instant>,
    pub cooldown_reason: Option<&'static str>,
    /// Share of recent attempts that were failover traffic.
    pub failover_share: f64,
}

/// All models of a provider, as of `at`.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSnapshot {
    pub at: Instant,
    pub models: HashMap<Arc<str>, TargetSnapshot>,
}

impl ProviderSnapshot {
    /// When a target the snapshot shows as unavailable may be tried again
    /// (`None`: available now, or never by itself).
    pub fn unavailable_for(&self, model: &str, now: Instant) -> Option<Unavailable> {
        let t = self.models.get(model)?;
        if let Some(until) = t.cooldown_until {
            if until > now {
                return Some(Unavailable::For(until - now));
            }
        }
        match t.breaker {
            BreakerState::Open { retry_in } => {
                let at = self.at + retry_in;
                (at > now).then(|| Unavailable::For(at - now))
            }
            BreakerState::ForcedOpen { retry_in: Some(d) } => {
                let at = self.at + d;
                (at > now).then(|| Unavailable::For(at - now))
            }
            BreakerState::ForcedOpen { retry_in: None } => Some(Unavailable::UntilCleared),
            _ => None,
        }
    }
}

/// How long a target stays unavailable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    For(Duration),
    UntilCleared,
}

/// What request tasks need to talk to a provider: immutable settings, the
/// pooled HTTP client, the concurrency semaphores and the published snapshot.
/// Shared by every incarnation of the provider's actor, so a restart never
/// loses or leaks permits.
#[derive(Debug)]
pub struct ProviderRuntime {
    /// What an attempt needs to reach the provider.
    pub endpoint: Endpoint,
    pub id: String,
    pub kind: ProviderKind,
    pub models: Vec<ModelConfig>,
    pub config: ProviderConfig,
    /// All traffic.
    total: Arc<Semaphore>,
    /// Failover traffic (also holds a `total` permit).
    failover: Arc<Semaphore>,
    pub max_concurrency: u32,
    pub failover_max_concurrency: u32,
    /// Published by the actor after every change.
    snapshot: watch::Sender<ProviderSnapshot>,
    /// Actor incarnations started so far (a restarted actor comes back half-open).
    incarnations: AtomicU64,
    /// Each model's admission gate, set by the actor on every publish.
    gates: HashMap<String, Gate>,
    /// The running incarnation's inbox (set as it starts): where a permit
    /// taken through a gate reports.
    inbox: ArcSwapOption<Inbox>,
}

/// Outcome reports on their way to one incarnation of the provider's actor.
/// A report that finds the inbox empty casts [`ProviderMsg::Reports`]; the
/// ones that arrive before the actor handles it wait here and ride on it, so
/// a busy actor takes many reports per message and publishes once. Past
/// [`INBOX_MAX`] waiting, a report is cast on its own. Reports to an
/// incarnation that has stopped are lost with it, as its breaker is.
#[derive(Debug)]
pub struct Inbox {
    actor: ActorRef<ProviderMsg>,
    waiting: Mutex<Vec<OutcomeReport>>,
}

/// Reports an inbox holds before a report is cast on its own.
pub const INBOX_MAX: usize = 1024;

impl Inbox {
    fn new(actor: ActorRef<ProviderMsg>) -> Self {
        Inbox {
            actor,
            waiting: Mutex::new(Vec::new()),
        }
    }

    /// Hands one report to the actor.
    pub(crate) fn push(&self, report: OutcomeReport) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if waiting.len() >= INBOX_MAX {
            drop(waiting);
            let _ = self.actor.cast(ProviderMsg::Report(report));
            return;
        }
        waiting.push(report);
        let first = waiting.len() == 1;
        drop(waiting);
        if first {
            let _ = self.actor.cast(ProviderMsg::Reports);
        }
    }

    /// Swaps the waiting reports into `into` (empty, keeping its room).
    fn take(&self, into: &mut Vec<OutcomeReport>) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::swap(&mut *waiting, into);
    }
}

/// One model's admission gate: while the actor keeps it open (the breaker
/// closed with no override, no cooldown, credentials not rejected), a
/// request takes its permit straight from the semaphores with a ticket of
/// the published breaker generation, and the actor only hears the outcome.
/// Anything else (a tripped, half-open or overridden breaker, a cooldown, a
/// full ceiling) asks the actor, which decides as it always did.
#[derive(Debug, Default)]
struct Gate(AtomicU64);

impl Gate {
    /// The open generation, if any.
    fn open(&self) -> Option<u64> {
        self.0.load(Ordering::Acquire).checked_sub(1)
    }

    fn set(&self, generation: Option<u64>) {
        self.0
            .store(generation.map_or(0, |g| g + 1), Ordering::Release);
    }
}

/// Building a provider runtime failed.
pub type RuntimeError = crate::upstream::endpoint::EndpointError;

impl ProviderRuntime {
    /// Builds the runtime from config, reading the API key from its environment variable.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, RuntimeError> {
        let endpoint = Endpoint::new(cfg)?;
        let (snapshot, _) = watch::channel(ProviderSnapshot {
            at: Instant::now(),
            models: HashMap::new(),
        });
        Ok(ProviderRuntime {
            endpoint,
            id: cfg.id.clone(),
            kind: cfg.kind,
            models: cfg.models.clone(),
            config: cfg.clone(),
            total: Arc::new(Semaphore::new(cfg.max_concurrency as usize)),
            failover: Arc::new(Semaphore::new(cfg.failover_max_concurrency as usize)),
            max_concurrency: cfg.max_concurrency,
            failover_max_concurrency: cfg.failover_max_concurrency,
            snapshot,
            incarnations: AtomicU64::new(0),
            // Shut until the first incarnation publishes.
            gates: cfg
                .models
                .iter()
                .map(|m| (m.name.clone(), Gate::default()))
                .collect(),
            inbox: ArcSwapOption::empty(),
        })
    }

    /// The running incarnation's inbox.
    #[cfg(test)]
    pub(crate) fn inbox(&self) -> Option<Arc<Inbox>> {
        self.inbox.load_full()
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }

    /// The latest published state of this provider's targets.
    pub fn snapshot(&self) -> ProviderSnapshot {
        self.snapshot.borrow().clone()
    }

    /// Reads the latest published state without copying it (keep `f` short:
    /// the actor's next publish waits for it).
    pub fn with_snapshot<R>(&self, f: impl FnOnce(&ProviderSnapshot) -> R) -> R {
        f(&self.snapshot.borrow())
    }

    /// Subscribe to snapshot changes.
    pub fn subscribe(&self) -> watch::Receiver<ProviderSnapshot> {
        self.snapshot.subscribe()
    }

    /// Requests in flight now, all traffic.
    pub fn in_flight(&self) -> usize {
        self.max_concurrency as usize - self.total.available_permits()
    }

    /// Failover requests in flight now.
    pub fn failover_in_flight(&self) -> usize {
        self.failover_max_concurrency as usize - self.failover.available_permits()
    }

    /// A permit for one attempt without asking the actor, when `model`'s
    /// gate is open and the ceilings have room; `None` sends the request to
    /// the actor ([`ProviderMsg::Admit`]), which refuses or admits it.
    pub fn admit_through_gate(&self, model: &Arc<str>, class: TrafficClass) -> Option<Permit> {
        let gate = self.gates.get(&**model)?;
        let generation = gate.open()?;
        let inbox = self.inbox.load_full()?;
        // A stopped incarnation's successor publishes its own gate.
        if inbox.actor.get_status() != ractor::ActorStatus::Running {
            return None;
        }
        let (total, failover) = self.try_acquire(class)?;
        // Shut (or moved on) meanwhile: the semaphores go back, the actor decides.
        if gate.open() != Some(generation) {
            return None;
        }
        Some(
            Permit::new(total, failover, class, Ticket::through_gate(generation))
                .home(inbox, model.clone()),
        )
    }

    fn try_acquire(
        &self,
        class: TrafficClass,
    ) -> Option<(OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)> {
        let failover = match class {
            TrafficClass::Own => None,
            TrafficClass::Failover => Some(self.failover.clone().try_acquire_owned().ok()?),
        };
        let total = self.total.clone().try_acquire_owned().ok()?;
        Some((total, failover))
    }
}

/// Admission to send one attempt. Dropping it frees the concurrency slot, so
/// it must live as long as the upstream stream. Its outcome goes back to the
/// actor that admitted it through [`Permit::report`]; a permit dropped
/// without a report (a refusal after admission, a cancelled task, a reply
/// nobody waited for) reports `cancelled` itself, so a half-open probe slot
/// is never held by a ticket that no one will return.
#[derive(Debug)]
pub struct Permit {
    _total: OwnedSemaphorePermit,
    _failover: Option<OwnedSemaphorePermit>,
    pub class: TrafficClass,
    ticket: Option<Ticket>,
    /// The admitting incarnation's inbox and the model, once handed out.
    home: Option<(Arc<Inbox>, Arc<str>)>,
    /// The attempt went upstream: a drop before its report still counts it.
    sent: bool,
    reported: bool,
}

impl Permit {
    fn new(
        total: OwnedSemaphorePermit,
        failover: Option<OwnedSemaphorePermit>,
        class: TrafficClass,
        ticket: Ticket,
    ) -> Self {
        Permit {
            _total: total,
            _failover: failover,
            class,
            ticket: Some(ticket),
            home: None,
            sent: false,
            reported: false,
        }
    }

    /// Where the outcome (or the drop) is reported.
    fn home(mut self, inbox: Arc<Inbox>, model: Arc<str>) -> Self {
        self.home = Some((inbox, model));
        self
    }

    /// The attempt is about to go upstream.
    pub fn mark_sent(&mut self) {
        self.sent = true;
    }

    /// Sends the attempt's one outcome to the admitting actor (with the
    /// breaker ticket) and frees the permit.
    pub fn report(mut self, outcome: Outcome) {
        self.reported = true;
        self.send(outcome, false);
    }

    fn send(&mut self, outcome: Outcome, dropped_in_flight: bool) {
        let Some((inbox, model)) = self.home.take() else {
            return;
        };
        inbox.push(OutcomeReport {
            model,
            ticket: self.ticket.take(),
            outcome,
            traffic: self.class,
            dropped_in_flight,
        });
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if !self.reported {
            let sent = self.sent;
            self.send(Outcome::cancelled(), sent);
        }
    }
}

/// Why the provider would not take an attempt now. A local decision: it never
/// counts against the provider's health.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("provider is at its {} concurrency ceiling", .0.as_str())]
    Saturated(TrafficClass),
    #[error("provider does not serve model `{0}`")]
    UnknownModel(String),
    #[error(transparent)]
    Breaker(BreakerRefusal),
    #[error("target cooling down ({reason}) for {retry_in:?}")]
    Cooldown {
        reason: &'static str,
        retry_in: Duration,
    },
}

impl Refusal {
    fn reason(&self) -> &'static str {
        match self {
            Refusal::Saturated(TrafficClass::Own) => "saturated_own",
            Refusal::Saturated(TrafficClass::Failover) => "saturated_failover",
            Refusal::UnknownModel(_) => "unknown_model",
            Refusal::Breaker(_) => "breaker",
            Refusal::Cooldown { .. } => "cooldown",
        }
    }

    /// When trying this target again could succeed, if known.
    pub fn retry_in(&self) -> Option<Duration> {
        match self {
            Refusal::Breaker(BreakerRefusal::Open { retry_in }) => Some(*retry_in),
            Refusal::Breaker(BreakerRefusal::ForcedOpen { retry_in }) => *retry_in,
            Refusal::Cooldown { retry_in, .. } => Some(*retry_in),
            _ => None,
        }
    }
}

/// How one attempt ended, as whoever ran it saw it.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub class: OutcomeClass,
    /// What the upstream asked for (429/503), if anything.
    pub retry_after: Option<Duration>,
    pub elapsed: Duration,
    pub ttft: Option<Duration>,
    /// Output tokens the upstream produced before a failure (billed anyway).
    pub failed_output_tokens: u32,
}

impl Outcome {
    /// An attempt's result, and the output tokens a failure still billed.
    pub fn of(result: &crate::attempt::AttemptResult, failed_output_tokens: u32) -> Self {
        Outcome {
            class: result.end.class(),
            retry_after: match &result.end {
                crate::attempt::AttemptEnd::Failed(f) => f.retry_after,
                _ => None,
            },
            elapsed: result.elapsed,
            ttft: result.ttft,
            failed_output_tokens,
        }
    }

    /// Not sent, or given up on by its caller: counts for nothing.
    pub fn cancelled() -> Self {
        Outcome {
            class: OutcomeClass::Cancelled,
            retry_after: None,
            elapsed: Duration::ZERO,
            ttft: None,
            failed_output_tokens: 0,
        }
    }
}

/// One attempt's outcome as its provider actor receives it, once per permit.
#[derive(Debug)]
pub struct OutcomeReport {
    /// Shared with the plan's candidate: no copy per attempt.
    pub model: Arc<str>,
    pub ticket: Option<Ticket>,
    pub outcome: Outcome,
    pub traffic: TrafficClass,
    /// Its permit was dropped while the attempt was upstream: the attempt
    /// is counted here (a reported one was counted by its runner).
    pub dropped_in_flight: bool,
}

/// An admin override of one target's breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerOverride {
    Force(Forced),
    Clear,
}

pub enum ProviderMsg {
    /// Ask for a permit for one attempt.
    Admit {
        model: Arc<str>,
        class: TrafficClass,
        reply: RpcReplyPort<Result<Permit, Refusal>>,
    },
    /// The outcome of an attempt this actor admitted (a synthetic probe's,
    /// or one past a full inbox).
    Report(OutcomeReport),
    /// Reports wait in the inbox.
    Reports,
    /// Admin: force a target's breaker open or closed, or clear the force.
    SetBreaker {
        model: String,
        change: BreakerOverride,
        reason: String,
        reply: RpcReplyPort<Result<(), String>>,
    },
    /// Time to send a synthetic probe to a tripped model.
    ProbeDue(String),
    /// Test hook: make `handle` fail as a panicking actor would.
    #[cfg(test)]
    Crash,
}

/// One model's control state.
struct ModelState {
    breaker: Breaker,
    health: HealthWindow,
    cooldown: Cooldown,
    /// A 401/403 with the router's key: skipped until then (or a reload).
    auth_until: Option<Instant>,
    /// Recent attempts, and how many were failover traffic.
    traffic: ShareWindow,
    /// Its `switchyard_breaker_state` series, resolved once.
    breaker_gauge: prometheus_client::metrics::gauge::Gauge,
}

/// The actor. `self` holds nothing; everything arrives as arguments.
pub struct ProviderActor;

/// What the actor starts with.
pub struct ProviderArgs {
    pub runtime: Arc<ProviderRuntime>,
    pub metrics: Arc<Metrics>,
    /// To tell the recovery actor when a breaker closes.
    pub registry: Arc<Registry>,
}

/// Mutable state of one incarnation.
pub struct ProviderState {
    /// Shared I/O runtime, semaphores and snapshot (outlive this incarnation).
    runtime: Arc<ProviderRuntime>,
    metrics: Arc<Metrics>,
    registry: Arc<Registry>,
    /// Control state per model name.
    models: HashMap<Arc<str>, ModelState>,
    /// The map of the snapshot published before the last one, cleared and
    /// filled by the next publish (one after every message: no allocation).
    spare: HashMap<Arc<str>, TargetSnapshot>,
    /// `switchyard_actor_calls_total{actor="provider",message="report"}`:
    /// messages that brought reports.
    reports: prometheus_client::metrics::counter::Counter,
    /// Where permits this incarnation hands out report.
    inbox: Arc<Inbox>,
    /// The list the inbox's reports are swapped into, kept for its room.
    taken: Vec<OutcomeReport>,
}

impl ProviderState {
    fn labels(&self, model: &str) -> TargetLabels {
        TargetLabels {
            provider: self.runtime.id.clone(),
            model: model.to_string(),
        }
    }

    fn admit(&mut self, model: &str, class: TrafficClass, now: Instant) -> Result<Permit, Refusal> {
        let synthetic = self.runtime.config.synthetic_probes;
        let Some(m) = self.models.get_mut(model) else {
            return Err(Refusal::UnknownModel(model.to_string()));
        };
        let transition = m.breaker.tick(now);
        let result = (|| {
            if let Some(until) = m.auth_until.filter(|u| *u > now) {
                return Err(Refusal::Cooldown {
                    reason: "auth",
                    retry_in: until - now,
                });
            }
            if let (Some(retry_in), Some(kind)) = (m.cooldown.active(now), m.cooldown.kind(now)) {
                return Err(Refusal::Cooldown {
                    reason: kind.as_str(),
                    retry_in,
                });
            }
            let (total, failover) = self
                .runtime
                .try_acquire(class)
                .ok_or(Refusal::Saturated(class))?;
            let ticket = m.breaker.admit(now).map_err(Refusal::Breaker)?;
            if synthetic && ticket.is_probe() {
                // Probes are synthetic for this provider: a caller's request
                // is never spent on a target that may be dead.
                let _ = m.breaker.record(ticket, OutcomeClass::Cancelled, now);
                return Err(Refusal::Breaker(BreakerRefusal::HalfOpenBusy));
            }
            Ok(Permit::new(total, failover, class, ticket))
        })();
        if let Some(t) = transition {
            self.on_transition(model, &t);
        }
        if let Err(refusal) = &result {
            self.metrics
                .permits_refused
                .get_or_create(&RefusalLabels {
                    provider: self.runtime.id.clone(),
                    model: model.to_string(),
                    reason: refusal.reason(),
                })
                .inc();
        }
        result
    }

    fn report(&mut self, r: OutcomeReport, now: Instant) -> Option<Transition> {
        let cfg = &self.runtime.config;
        if r.dropped_in_flight {
            self.metrics.count_attempt(
                &self.runtime.id,
                &r.model,
                OutcomeClass::Cancelled.as_str(),
            );
        }
        let m = self.models.get_mut(&*r.model)?;
        m.health.record(
            Sample {
                class: r.outcome.class,
                latency: Some(r.outcome.elapsed),
                ttft: r.outcome.ttft,
            },
            now,
        );
        m.traffic.record(r.traffic == TrafficClass::Failover, now);
        let transition = match r.ticket {
            Some(ticket) => m.breaker.record(ticket, r.outcome.class, now),
            None => m.breaker.tick(now),
        };
        if let Some(until) =
            m.cooldown
                .note(&cfg.cooldown, r.outcome.class, r.outcome.retry_after, now)
        {
            let kind = m
                .cooldown
                .kind(now)
                .map_or("cooldown", CooldownKind::as_str);
            tracing::warn!(provider = %self.runtime.id, model = %r.model, reason = kind, for_ms = (until - now).as_millis() as u64, "target cooling down");
            self.metrics
                .cooldowns
                .get_or_create(&RefusalLabels {
                    provider: self.runtime.id.clone(),
                    model: r.model.to_string(),
                    reason: kind,
                })
                .inc();
        }
        if r.outcome.class == OutcomeClass::Auth {
            m.auth_until = Some(crate::policy::clock::after(now, cfg.auth_cooldown));
            tracing::error!(provider = %self.runtime.id, model = %r.model, skip_for = ?cfg.auth_cooldown, "upstream rejected the router's credentials: target skipped until reload or cooldown end");
            self.metrics
                .cooldowns
                .get_or_create(&RefusalLabels {
                    provider: self.runtime.id.clone(),
                    model: r.model.to_string(),
                    reason: "auth",
                })
                .inc();
        } else if r.outcome.class.is_success() {
            m.auth_until = None;
        }
        if r.outcome.failed_output_tokens > 0 {
            self.metrics
                .failed_stream_tokens
                .get_or_create(&self.labels(&r.model))
                .inc_by(u64::from(r.outcome.failed_output_tokens));
        }
        transition
    }

    fn on_transition(&self, model: &str, t: &Transition) {
        self.metrics
            .breaker_transitions
            .get_or_create(&TransitionLabels {
                provider: self.runtime.id.clone(),
                model: model.to_string(),
                from: t.from.as_str(),
                to: t.to.as_str(),
            })
            .inc();
        match (&t.to, &t.cause) {
            (Phase::Open, Cause::ConsecutiveFailures(tripped) | Cause::FailureRate(tripped)) => {
                let recent: Vec<&str> = tripped.recent.iter().map(|c| c.as_str()).collect();
                tracing::warn!(
                    provider = %self.runtime.id,
                    model,
                    consecutive = tripped.consecutive,
                    window_failures = tripped.window_failures,
                    window_calls = tripped.window_calls,
                    recent = ?recent,
                    open_for_ms = t.open_for.map(|d| d.as_millis() as u64),
                    "breaker opened"
                );
            }
            (Phase::Open, cause) => {
                tracing::warn!(provider = %self.runtime.id, model, ?cause, open_for_ms = t.open_for.map(|d| d.as_millis() as u64), "breaker opened")
            }
            (to, cause) => {
                tracing::info!(provider = %self.runtime.id, model, from = t.from.as_str(), to = to.as_str(), ?cause, "breaker transition")
            }
        }
    }

    /// Publishes the snapshot and the breaker-state gauges.
    fn publish(&mut self, now: Instant) {
        let mut models = std::mem::take(&mut self.spare);
        models.clear();
        models.extend(self.models.iter().map(|(name, m)| {
            let breaker = m.breaker.state(now);
            let gauge = match breaker.phase() {
                Phase::Closed | Phase::ForcedClosed => 0,
                Phase::HalfOpen => 1,
                Phase::Open | Phase::ForcedOpen => 2,
            };
            m.breaker_gauge.set(gauge);
            let (cooldown_until, cooldown_reason) =
                match (m.auth_until.filter(|u| *u > now), m.cooldown.active(now)) {
                    (Some(u), _) => (Some(u), Some("auth")),
                    (None, Some(left)) => (
                        Some(now + left),
                        m.cooldown.kind(now).map(CooldownKind::as_str),
                    ),
                    (None, None) => (None, None),
                };
            let cooling = cooldown_until.is_some_and(|u| u > now);
            if let Some(gate) = self.runtime.gates.get(&**name) {
                gate.set(m.breaker.gate().filter(|_| !cooling));
            }
            let snapshot = TargetSnapshot {
                breaker,
                score: m.health.score(now),
                success_rate: m.health.success_rate(now),
                p95_ttft: m.health.p95_ttft(now),
                calls: m.health.calls(now),
                evidence: m.health.has_evidence(now),
                cooldown_until,
                cooldown_reason,
                failover_share: m.traffic.share(now),
            };
            (name.clone(), snapshot)
        }));
        let published = self
            .runtime
            .snapshot
            .send_replace(ProviderSnapshot { at: now, models });
        self.spare = published.models;
    }
}

impl Actor for ProviderActor {
    type Msg = ProviderMsg;
    type State = ProviderState;
    type Arguments = ProviderArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let now = Instant::now();
        let runtime = args.runtime;
        let restarted = runtime.incarnations.fetch_add(1, Ordering::Relaxed) > 0;
        let models = runtime
            .models
            .iter()
            .map(|m| {
                let seed = rand::random();
                let breaker = if restarted {
                    Breaker::restarted(runtime.config.breaker.clone(), now, seed)
                } else {
                    Breaker::new(runtime.config.breaker.clone(), now, seed)
                };
                let state = ModelState {
                    breaker,
                    health: HealthWindow::new(runtime.config.health.clone(), now),
                    cooldown: Cooldown::default(),
                    auth_until: None,
                    traffic: ShareWindow::new(Duration::from_secs(60), now),
                    breaker_gauge: args
                        .metrics
                        .breaker_state
                        .get_or_create(&TargetLabels {
                            provider: runtime.id.clone(),
                            model: m.name.clone(),
                        })
                        .clone(),
                };
                (Arc::from(m.name.as_str()), state)
            })
            .collect();
        if restarted {
            tracing::warn!(provider = %runtime.id, "provider actor restarted: its breakers start half-open");
        }
        let inbox = Arc::new(Inbox::new(myself.clone()));
        runtime.inbox.store(Some(inbox.clone()));
        let mut state = ProviderState {
            runtime,
            inbox,
            taken: Vec::new(),
            reports: args.metrics.actor_calls().report,
            metrics: args.metrics,
            registry: args.registry,
            models,
            spare: HashMap::new(),
        };
        if restarted && state.runtime.config.synthetic_probes {
            for name in state.models.keys() {
                let _ = myself.cast(ProviderMsg::ProbeDue(name.to_string()));
            }
        }
        state.publish(now);
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        match message {
            ProviderMsg::Admit {
                model,
                class,
                reply,
            } => {
                let answer = state
                    .admit(&model, class, now)
                    .map(|permit| permit.home(state.inbox.clone(), model));
                // The requester may have given up: the dropped permit reports
                // itself cancelled, returning its ticket.
                let _ = reply.send(answer);
            }
            ProviderMsg::Report(report) => {
                state.reports.inc();
                fold(state, &myself, report, now);
            }
            ProviderMsg::Reports => {
                state.reports.inc();
                let mut taken = std::mem::take(&mut state.taken);
                state.inbox.take(&mut taken);
                for report in taken.drain(..) {
                    fold(state, &myself, report, now);
                }
                state.taken = taken;
            }
            ProviderMsg::SetBreaker {
                model,
                change,
                reason,
                reply,
            } => {
                let answer = match state.models.get_mut(model.as_str()) {
                    None => Err(format!(
                        "provider `{}` has no model `{model}`",
                        state.runtime.id
                    )),
                    Some(m) => {
                        let t = match change {
                            BreakerOverride::Force(f) => Some(m.breaker.force(f)),
                            BreakerOverride::Clear => m.breaker.clear_force(now),
                        };
                        tracing::warn!(provider = %state.runtime.id, model = %model, ?change, %reason, "breaker override by admin");
                        if let Some(t) = t {
                            state.on_transition(&model, &t);
                        }
                        Ok(())
                    }
                };
                let _ = reply.send(answer);
            }
            ProviderMsg::ProbeDue(model) => probe(state, &myself, &model, now),
            #[cfg(test)]
            ProviderMsg::Crash => return Err("crash requested by test".into()),
        }
        state.publish(now);
        Ok(())
    }
}

/// Folds one report in, and acts on the transition it causes.
fn fold(
    state: &mut ProviderState,
    myself: &ActorRef<ProviderMsg>,
    report: OutcomeReport,
    now: Instant,
) {
    let model = report.model.clone();
    let Some(t) = state.report(report, now) else {
        return;
    };
    state.on_transition(&model, &t);
    schedule_probe(state, myself, &model, &t);
    if t.to == Phase::Closed {
        if let Some(recovery) = state.registry.recovery() {
            let _ = recovery.cast(RecoveryMsg::BreakerClosed {
                provider: state.runtime.id.clone(),
                model: model.to_string(),
            });
        }
    }
}

/// After a trip, schedule the synthetic probe for when the breaker half-opens.
fn schedule_probe(
    state: &ProviderState,
    myself: &ActorRef<ProviderMsg>,
    model: &str,
    t: &Transition,
) {
    if !state.runtime.config.synthetic_probes || t.to != Phase::Open {
        return;
    }
    if let Some(open_for) = t.open_for {
        myself.send_after(open_for, {
            let model = model.to_string();
            move || ProviderMsg::ProbeDue(model)
        });
    }
}

/// Sends a synthetic `max_tokens: 1` probe if the breaker admits one; the
/// attempt runs in its own task and reports back like any other.
fn probe(state: &mut ProviderState, myself: &ActorRef<ProviderMsg>, model: &str, now: Instant) {
    let Some(m) = state.models.get_mut(model) else {
        return;
    };
    let transition = m.breaker.tick(now);
    match m.breaker.admit(now) {
        Ok(ticket) => {
            let runtime = state.runtime.clone();
            let metrics = state.metrics.clone();
            let actor = myself.clone();
            let model = model.to_string();
            tokio::spawn(async move {
                let report = synthetic_probe(&runtime, &model, ticket).await;
                metrics.count_attempt(&runtime.id, &model, report.outcome.class.as_str());
                let _ = actor.cast(ProviderMsg::Report(report));
            });
        }
        Err(refusal) => {
            // Still open (or a probe is out): look again when it may admit.
            let wait = refusal.retry_in().unwrap_or(Duration::from_secs(1));
            let model = model.to_string();
            myself.send_after(wait, move || ProviderMsg::ProbeDue(model));
        }
    }
    if let Some(t) = transition {
        state.on_transition(model, &t);
    }
}

/// Runs a synthetic probe: one `max_tokens: 1` request with the given breaker
/// ticket, outside any caller's request and outside the concurrency ceilings.
/// It runs in a spawned task; the actor only gets its report.
async fn synthetic_probe(
    runtime: &ProviderRuntime,
    model: &str,
    ticket: crate::policy::breaker::Ticket,
) -> OutcomeReport {
    let chat = crate::chat::ChatRequest {
        model: model.into(),
        messages: vec![crate::chat::ChatMessage {
            role: "user".into(),
            content: "ping".into(),
            ..Default::default()
        }]
        .into(),
        max_tokens: Some(1),
        stream: runtime
            .model(model)
            .is_none_or(|m| m.has(crate::config::Capability::Stream)),
        ..Default::default()
    };
    let mut sink = crate::sink::EventSink::discard();
    let deadline = crate::policy::clock::after(
        Instant::now(),
        runtime
            .endpoint
            .first_token_timeout
            .saturating_add(runtime.endpoint.idle_timeout),
    );
    let result = crate::attempt::run(
        crate::attempt::AttemptInput {
            endpoint: &runtime.endpoint,
            chat: &chat,
            deadline,
            attempt: 0,
            key: None,
            admit: None,
        },
        &mut sink,
    )
    .await;
    let class = result.end.class();
    tracing::info!(provider = %runtime.id, model, outcome = %class, "synthetic probe");
    OutcomeReport {
        model: model.into(),
        ticket: Some(ticket),
        outcome: Outcome::of(&result, 0),
        traffic: TrafficClass::Own,
        dropped_in_flight: false,
    }
}
