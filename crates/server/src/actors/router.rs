//! The router actor: owns the route table and each route's retry budget and
//! failover window. It builds the table from config and publishes it (on
//! start and on every reload); a request plans itself from the published
//! table ([`RouteTable::plan`]) with no message — capable targets only (fail
//! closed), skipping tripped or cooling targets, sorted by health band, then
//! priority, then weighted chance — and counts itself in its route's
//! [`RouteTally`] (the budget's deposit; an answer counts there too, for the
//! failover window): no message. The router folds the tallies in before it
//! reads the budget or the window (every message, a metrics scrape) and
//! every [`FOLD_EVERY`], and grants or refuses each retry and failover
//! against the budget. It decides; it never touches a response byte, and it
//! reads provider state from their published snapshots.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rand::Rng;
use smallvec::SmallVec;
use tokio::time::Instant;

use super::fold_every;
use super::provider::Unavailable;
use super::registry::Registry;
pub use crate::chat::Needs;
use crate::config::{
    Capability, Config, FamilyFailover, MidStreamPolicy, OnCallerGone, RetryBudgetConfig, Rung,
    SemanticCacheConfig,
};
use crate::policy::budget::RetryBudget;
use crate::policy::next::RoutePolicy;
use crate::policy::share::ShareWindow;
use crate::sink::Tier;
use crate::state::validation::record::RouteValidation;
use crate::telemetry::metrics::{Metrics, RouteLabels, RouteTargetLabels};

/// One target the request may be sent to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Shared with the route table: a plan clones no string.
    pub provider: Arc<str>,
    pub model: Arc<str>,
    /// The route's first target: its traffic is the provider's own.
    pub primary: bool,
    /// Position in the route's fallback order.
    pub position: usize,
    /// The model declares streaming.
    pub streams: bool,
    /// The provider's `stream_unary`: a caller taking one assembled answer
    /// is streamed from the upstream too.
    pub stream_unary: bool,
    /// One of the route's cheaper `downshift` targets.
    pub downshift: bool,
}

impl Candidate {
    /// Whether the upstream is called streaming: when the model streams,
    /// unless the caller takes one assembled answer (`buffered`) and the
    /// provider has `stream_unary = false`.
    pub fn streamed(&self, buffered: bool) -> bool {
        self.streams && (self.stream_unary || !buffered)
    }
}

/// The ordered candidates for one request and the route's policies.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub route: Arc<str>,
    pub candidates: SmallVec<[Candidate; INLINE_CANDIDATES]>,
    pub default_max_tokens: Option<u32>,
    pub service_tier: Option<String>,
    pub deadline: Option<Duration>,
    pub max_attempts: u32,
    pub mid_stream: MidStreamPolicy,
    /// What the request does when its caller hangs up (unset: by key).
    pub on_caller_gone: Option<OnCallerGone>,
    pub side_effects: bool,
    pub ladder: Arc<[Rung]>,
    pub cache_ttl: Duration,
    pub serve_fresh_within: Option<Duration>,
    pub max_tokens_limit: Option<u32>,
    /// The route's semantic cache settings, when it has one.
    pub semantic: Option<Arc<SemanticCacheConfig>>,
    /// Both caches are shared by every tenant (else each tenant has its own).
    pub shared_across_tenants: bool,
    /// When the plan is empty because every capable target is tripped or
    /// cooling down: the soonest one may take traffic again.
    pub unavailable_for: Option<Duration>,
    /// Cost reservations are refused while the fleet ledger is away.
    pub fail_closed: bool,
    /// The route's prompt-cache affinity: how long a prefix stays warm.
    pub cache_affinity: Option<Duration>,
    pub traffic: Traffic,
}

/// A route's admission and hedging options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// How long a request no key has room for waits for a window.
    pub admission_wait: Duration,
    pub priority: crate::config::TrafficPriority,
    pub batch_share: f64,
    pub hedge: Option<crate::config::HedgeConfig>,
}

impl Traffic {
    fn of(r: &crate::config::RouteConfig) -> Self {
        Traffic {
            admission_wait: r.admission_wait,
            priority: r.priority,
            batch_share: r.batch_share,
            hedge: r.hedge,
        }
    }
}

impl Plan {
    pub fn has_rung(&self, rung: Rung) -> bool {
        self.ladder.contains(&rung)
    }

    /// Each candidate's provider, in the plan's order (the decision table's
    /// `View::providers`).
    pub fn providers(&self) -> SmallVec<[&str; INLINE_TARGETS]> {
        self.candidates.iter().map(|c| &*c.provider).collect()
    }

    /// The route's part of the next-step decision.
    pub fn policy(&self) -> RoutePolicy {
        RoutePolicy {
            route: self.route.clone(),
            max_attempts: self.max_attempts,
            mid_stream: self.mid_stream,
            side_effects: self.side_effects,
            unavailable_for: self.unavailable_for,
        }
    }
}

impl Candidate {
    /// The tier an answer from this candidate is served as.
    pub fn tier(&self) -> Tier {
        if self.downshift {
            Tier::Downshift
        } else if self.position == 0 {
            Tier::Primary
        } else {
            Tier::Fallback
        }
    }
}

/// Why no plan could be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("unknown route `{0}`")]
    UnknownRoute(String),
    #[error("no target of route `{route}` has {}", missing.join(", "))]
    NoCapableTarget { route: String, missing: Vec<String> },
}

impl From<PlanError> for crate::error::RequestError {
    fn from(e: PlanError) -> Self {
        match e {
            PlanError::UnknownRoute(r) => crate::error::RequestError::UnknownRoute(r),
            PlanError::NoCapableTarget { route, missing } => {
                crate::error::RequestError::NoCapableTarget { route, missing }
            }
        }
    }
}

pub enum RouterMsg {
    /// Fold the routes' tallies in now (a timer's tick, or a metrics scrape
    /// that waits for the reply). Every other message folds them first too.
    Fold(Option<RpcReplyPort<()>>),
    /// May this request make one more attempt (a retry or a failover)?
    WithdrawRetry {
        route: String,
        reply: RpcReplyPort<bool>,
    },
    /// Every route's state, for the admin surfaces.
    Status(RpcReplyPort<Vec<RouteStatus>>),
    /// A new, validated config: rebuild and publish the route table (the
    /// reply says it is published, so a reload's caller never plans from
    /// the old one).
    Reload(Arc<Config>, RpcReplyPort<()>),
}

/// One route as the admin surfaces show it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RouteStatus {
    pub name: String,
    pub targets: Vec<String>,
    pub failover_rate: f64,
    pub retry_budget_remaining: f64,
    /// The downshift rung uses only validated targets.
    pub require_validated: bool,
    /// The route's last golden-set validation, if any.
    pub validation: Option<RouteValidation>,
}

/// One route of the published table: its targets and policies.
struct RouteEntry {
    name: Arc<str>,
    /// Where its requests count themselves (the router's counters hold it too).
    tally: Arc<RouteTally>,
    targets: Vec<TargetInfo>,
    ladder: Arc<[Rung]>,
    cache_ttl: Duration,
    serve_fresh_within: Option<Duration>,
    max_tokens_limit: Option<u32>,
    semantic: Option<Arc<SemanticCacheConfig>>,
    shared_across_tenants: bool,
    require_validated: bool,
    default_max_tokens: Option<u32>,
    service_tier: Option<String>,
    deadline: Option<Duration>,
    max_attempts: u32,
    mid_stream: MidStreamPolicy,
    on_caller_gone: Option<OnCallerGone>,
    side_effects: bool,
    fail_closed: bool,
    family_failover: FamilyFailover,
    cache_affinity: Option<Duration>,
    traffic: Traffic,
}

/// How often the router folds its routes' tallies in when nothing else
/// does: a deposit's or an answer's time is its fold's, at most this late
/// (the budget's slots are a tenth of its ttl, 1 s by default).
pub const FOLD_EVERY: Duration = Duration::from_millis(100);

/// What one route's requests tell the router, counted without a message:
/// plans (each a first attempt, the retry budget's deposit) and answers (by
/// the route's first target or not, the failover window). The router takes
/// the counts when it folds them in; a reload keeps a route's tally, so a
/// request planned from the old table still counts.
#[derive(Debug, Default)]
pub struct RouteTally {
    planned: AtomicU64,
    served_primary: AtomicU64,
    served_failover: AtomicU64,
}

impl RouteTally {
    /// A request planned itself (a first attempt).
    pub fn planned(&self) {
        self.planned.fetch_add(1, Ordering::Relaxed);
    }

    /// A request was answered; `primary` if by the route's first target.
    pub fn served(&self, primary: bool) {
        let count = if primary {
            &self.served_primary
        } else {
            &self.served_failover
        };
        count.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts since the last take: (planned, served by the primary,
    /// served by another target).
    fn take(&self) -> (u64, u64, u64) {
        (
            self.planned.swap(0, Ordering::Relaxed),
            self.served_primary.swap(0, Ordering::Relaxed),
            self.served_failover.swap(0, Ordering::Relaxed),
        )
    }
}

/// What the router keeps of one route between requests.
struct RouteCounters {
    budget: RetryBudget,
    /// Requests answered in the last minute, and how many by a non-primary target.
    served: ShareWindow,
    /// What requests counted since the last fold.
    tally: Arc<RouteTally>,
}

/// The route table as the router last published it: what a request needs
/// to plan itself. Immutable; a reload publishes a new one.
pub struct RouteTable {
    routes: HashMap<String, RouteEntry>,
}

struct TargetInfo {
    provider: Arc<str>,
    model: Arc<str>,
    capabilities: Vec<Capability>,
    /// The provider's `stream_unary`.
    stream_unary: bool,
    context_tokens: u32,
    priority: u32,
    weight: u32,
    downshift: bool,
    /// The embedding family (`family`, else the model's name).
    family: String,
    /// Health evidence ranked it below its route place in the last plan
    /// (for the gauge and the log line on a change only).
    demoted: AtomicBool,
}

/// What a plan is for.
#[derive(Debug, Clone, Copy)]
enum Purpose<'a> {
    /// A chat request with these needs.
    Chat(&'a Needs),
    /// An embeddings call.
    Embeddings,
}

impl TargetInfo {
    /// What this target lacks for the purpose, by name.
    fn unmet_for(&self, purpose: Purpose<'_>) -> Vec<String> {
        match purpose {
            Purpose::Chat(needs) => self.unmet(needs),
            // The regular targets only: `downshift` is a chat rung.
            Purpose::Embeddings if self.downshift => vec!["embeddings".to_string()],
            Purpose::Embeddings => (!self.capabilities.contains(&Capability::Embeddings))
                .then(|| "embeddings".to_string())
                .into_iter()
                .collect(),
        }
    }

    /// The needs this target does not meet, by name.
    fn unmet(&self, needs: &Needs) -> Vec<String> {
        let mut missing = Vec::new();
        for (needed, cap) in [
            (needs.tools, Capability::Tools),
            (needs.json, Capability::Json),
            (needs.vision, Capability::Vision),
            (needs.pdf, Capability::Pdf),
            (needs.reasoning, Capability::Reasoning),
            (needs.json_schema, Capability::JsonSchema),
        ] {
            if needed && !self.capabilities.contains(&cap) {
                missing.push(cap.as_str().to_string());
            }
        }
        if self.context_tokens < needs.min_context_tokens {
            missing.push(format!("context_tokens >= {}", needs.min_context_tokens));
        }
        missing
    }
}

/// The actor.
pub struct RouterActor;

/// What the actor starts with.
pub struct RouterArgs {
    pub config: Arc<Config>,
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
}

/// Mutable state: the published table and each route's counters.
pub struct RouterState {
    /// The table requests plan from (also in the registry).
    table: Arc<RouteTable>,
    /// Each route's budget and failover window, by name.
    counters: HashMap<String, RouteCounters>,
    /// Where the table is published and the validations are read.
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
}

impl RouterState {
    /// Folds every route's tally in: its plans become the budget's
    /// deposits, its answers the failover window's events, both as of
    /// `now`; the gauges of a route that counted anything are set.
    fn fold(&mut self, now: Instant) {
        for (route, c) in &mut self.counters {
            let (planned, primary, failover) = c.tally.take();
            if planned == 0 && primary == 0 && failover == 0 {
                continue;
            }
            let labels = RouteLabels {
                route: route.clone(),
            };
            if planned > 0 {
                c.budget.deposit_many(planned, now);
                self.metrics
                    .retry_budget_remaining
                    .get_or_create(&labels)
                    .set(c.budget.remaining(now));
            }
            if primary + failover > 0 {
                c.served.record_many(primary + failover, failover, now);
                self.metrics
                    .failover_rate
                    .get_or_create(&labels)
                    .set(c.served.share(now));
            }
        }
    }

    /// Builds the table of `config`, publishes it, and keeps the counters
    /// of the routes it still has (new routes start fresh).
    fn install(&mut self, config: &Config, now: Instant) {
        let mut fresh = build_counters(config, &config.retry_budget, now);
        for (name, counters) in fresh.iter_mut() {
            if let Some(old) = self.counters.remove(name) {
                *counters = old;
            }
        }
        self.counters = fresh;
        self.table = Arc::new(RouteTable {
            routes: build_routes(config, &self.counters),
        });
        self.registry.set_route_table(self.table.clone());
    }
}

fn build_counters(
    config: &Config,
    budget: &RetryBudgetConfig,
    now: Instant,
) -> HashMap<String, RouteCounters> {
    config
        .routes
        .iter()
        .map(|r| {
            let counters = RouteCounters {
                budget: RetryBudget::new(budget, now),
                served: ShareWindow::new(Duration::from_secs(60), now),
                tally: Arc::default(),
            };
            (r.name.clone(), counters)
        })
        .collect()
}

fn build_routes(
    config: &Config,
    counters: &HashMap<String, RouteCounters>,
) -> HashMap<String, RouteEntry> {
    config
        .routes
        .iter()
        .map(|r| {
            let downshift = if r.has_rung(Rung::Downshift) {
                r.downshift.as_slice()
            } else {
                &[]
            };
            let targets = r
                .targets
                .iter()
                .map(|t| (t, false))
                .chain(downshift.iter().map(|t| (t, true)))
                .enumerate()
                .filter_map(|(i, (t, down))| {
                    Some((i, t, down, config.resolve_target(&t.target).ok()?))
                })
                .map(|(i, t, down, at)| {
                    let p = &config.providers[at.provider];
                    let m = &p.models[at.model];
                    TargetInfo {
                        provider: p.id.as_str().into(),
                        model: m.name.as_str().into(),
                        capabilities: m.capabilities.clone(),
                        stream_unary: p.stream_unary,
                        context_tokens: m.context_tokens,
                        priority: t.priority.unwrap_or(i as u32),
                        weight: t.weight.max(1),
                        downshift: down,
                        family: m.family().to_string(),
                        demoted: AtomicBool::new(false),
                    }
                })
                .collect();
            let entry = RouteEntry {
                name: r.name.as_str().into(),
                tally: counters
                    .get(&r.name)
                    .map(|c| c.tally.clone())
                    .unwrap_or_default(),
                targets,
                ladder: r.ladder.as_slice().into(),
                cache_ttl: r.cache_ttl,
                serve_fresh_within: r.serve_fresh_within,
                max_tokens_limit: r.max_tokens_limit,
                semantic: r.semantic_cache.clone().map(Arc::new),
                shared_across_tenants: r.shared_across_tenants,
                require_validated: r.require_validated,
                default_max_tokens: r.default_max_tokens,
                service_tier: r.service_tier.clone(),
                deadline: r.deadline,
                max_attempts: r.max_attempts,
                mid_stream: r.mid_stream,
                on_caller_gone: r.on_caller_gone,
                side_effects: r.side_effects,
                fail_closed: r.fail_closed,
                family_failover: r.embedding_family_failover,
                cache_affinity: r.cache_affinity.map(|a| a.ttl),
                traffic: Traffic::of(r),
            };
            (r.name.clone(), entry)
        })
        .collect()
}

/// Health bands: scores within one band count as equal, so a hair of
/// difference does not move a route off its primary.
fn band(score: f64) -> u32 {
    ((1.0 - score.clamp(0.0, 1.0)) / 0.2).floor() as u32
}

/// Share of requests that still reach a demoted target at its route place.
const TRICKLE: f64 = 0.05;

/// What the ranking knows of one live target.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Health {
    score: f64,
    /// Enough calls in the window (`health.min_calls`) for the score to count.
    evidence: bool,
}

impl Health {
    const UNKNOWN: Health = Health {
        score: 1.0,
        evidence: false,
    };
}

/// The evidence rule: health may reorder a route only when every target
/// compared has enough calls in its window; otherwise the operator's order
/// holds (every band 0) and the breakers alone protect.
fn bands(live: &[Health]) -> SmallVec<[u32; INLINE_TARGETS]> {
    if live.len() > 1 && live.iter().all(|h| h.evidence) {
        live.iter().map(|h| band(h.score)).collect()
    } else {
        smallvec::smallvec![0; live.len()]
    }
}

/// Marks a target demoted or back at its route place: a gauge per target
/// and an INFO line when that changes (no work when it does not).
fn observe_demotion(route: &str, t: &TargetInfo, demoted: bool, metrics: &Metrics) {
    if t.demoted.load(Ordering::Relaxed) == demoted
        || t.demoted.swap(demoted, Ordering::Relaxed) == demoted
    {
        return;
    }
    if demoted {
        tracing::info!(%route, provider = %t.provider, model = %t.model, "health evidence ranks this target below its route place (it keeps a trickle of traffic)");
    } else {
        tracing::info!(%route, provider = %t.provider, model = %t.model, "target back at its route place");
    }
    metrics
        .target_demoted
        .get_or_create(&RouteTargetLabels {
            route: route.to_string(),
            provider: t.provider.to_string(),
            model: t.model.to_string(),
        })
        .set(i64::from(demoted));
}

/// An embeddings plan's targets: numbered among the route's `embeddings`
/// targets (the first is the primary), and kept to the first one's family
/// unless the route allows `any` (a pinned call names its one target).
fn embedding_targets(capable: Targets<'_>, failover: FamilyFailover) -> Targets<'_> {
    let family = capable.first().map(|&(_, t)| t.family.as_str());
    capable
        .into_iter()
        .enumerate()
        .map(|(position, (_, t))| (position, t))
        .filter(|(_, t)| failover == FamilyFailover::Any || Some(t.family.as_str()) == family)
        .collect()
}

/// A route's targets while a plan is ranked: routes have a handful, so the
/// lists a plan builds live on the stack (measured: five allocations a
/// request fewer).
pub(crate) const INLINE_TARGETS: usize = 4;

/// A plan's candidates kept without an allocation of their own: a route's
/// primary and its fallback. The plan lives as long as its request, so a
/// longer route's plan allocates rather than every plan growing.
pub const INLINE_CANDIDATES: usize = 2;

/// Targets by their position in the route.
type Targets<'a> = SmallVec<[(usize, &'a TargetInfo); INLINE_TARGETS]>;

/// Candidates by their rank: downshift last, then health band, priority
/// and the weighted random key.
type Ranked = SmallVec<[((bool, u32, u32, f64), Candidate); INLINE_TARGETS]>;

/// Reads the published table and the providers' snapshots: a plan with no message.
pub struct Planner<'a> {
    pub registry: &'a Registry,
    pub metrics: &'a Metrics,
}

impl RouteTable {
    /// The chat targets of `route` that have every capability in `needs`
    /// (only `pin`, when given), ranked.
    pub fn plan(
        &self,
        at: Planner<'_>,
        route: &str,
        needs: &Needs,
        pin: Option<&str>,
        now: Instant,
    ) -> Result<Plan, PlanError> {
        self.plan_for(at, &mut rand::rng(), route, Purpose::Chat(needs), pin, now)
    }

    /// A plan for an embeddings call: the route's `embeddings` targets of
    /// one family (unless the route says `embedding_family_failover = "any"`).
    pub fn plan_embeddings(
        &self,
        at: Planner<'_>,
        route: &str,
        pin: Option<&str>,
        now: Instant,
    ) -> Result<Plan, PlanError> {
        self.plan_for(at, &mut rand::rng(), route, Purpose::Embeddings, pin, now)
    }

    /// Where `route`'s requests count themselves for the router.
    pub fn tally(&self, route: &str) -> Option<&RouteTally> {
        self.routes.get(route).map(|e| &*e.tally)
    }

    fn plan_for(
        &self,
        at: Planner<'_>,
        rng: &mut impl Rng,
        route: &str,
        purpose: Purpose<'_>,
        pin: Option<&str>,
        now: Instant,
    ) -> Result<Plan, PlanError> {
        let entry = self
            .routes
            .get(route)
            .ok_or_else(|| PlanError::UnknownRoute(route.to_string()))?;
        let validations =
            (entry.require_validated && pin.is_none()).then(|| at.registry.validations());
        let capable: Targets<'_> = entry
            .targets
            .iter()
            .enumerate()
            .filter(|(_, t)| t.unmet_for(purpose).is_empty())
            .filter(|(_, t)| pin.is_none_or(|p| p.split_once('/') == Some((&t.provider, &t.model))))
            // A pinned request (a golden run) may reach an unvalidated target.
            .filter(|(_, t)| {
                pin.is_some()
                    || !(t.downshift && entry.require_validated)
                    || validations.as_ref().is_some_and(|v| {
                        v.routes
                            .get(route)
                            .is_some_and(|v| v.validated(&format!("{}/{}", t.provider, t.model)))
                    })
            })
            .collect();
        let capable = match purpose {
            Purpose::Embeddings => embedding_targets(capable, entry.family_failover),
            Purpose::Chat(_) => capable,
        };
        if let Some(p) = pin.filter(|_| capable.is_empty()) {
            let listed = entry
                .targets
                .iter()
                .any(|t| p.split_once('/') == Some((&t.provider, &t.model)));
            if !listed {
                return Err(PlanError::NoCapableTarget {
                    route: route.to_string(),
                    missing: vec![format!("target `{p}` (not one of the route's targets)")],
                });
            }
        }
        if capable.is_empty() {
            // Name what no target offers.
            let mut missing: Vec<String> = Vec::new();
            for t in &entry.targets {
                for m in t.unmet_for(purpose) {
                    if !missing.contains(&m) {
                        missing.push(m);
                    }
                }
            }
            return Err(PlanError::NoCapableTarget {
                route: route.to_string(),
                missing,
            });
        }
        let mut soonest: Option<Duration> = None;
        let mut live: SmallVec<[(usize, &TargetInfo, Health); INLINE_TARGETS]> = SmallVec::new();
        for (position, t) in capable {
            let read =
                |s: &super::provider::ProviderSnapshot| match s.unavailable_for(&t.model, now) {
                    Some(u) => Err(u),
                    None => Ok(s.models.get(&*t.model).map_or(Health::UNKNOWN, |m| Health {
                        score: m.score,
                        evidence: m.evidence,
                    })),
                };
            let health = match at.registry.provider(&t.provider) {
                Some(p) => match p.runtime.with_snapshot(read) {
                    Ok(h) => h,
                    Err(Unavailable::For(d)) => {
                        soonest = Some(soonest.map_or(d, |s| s.min(d)));
                        continue;
                    }
                    Err(Unavailable::UntilCleared) => continue,
                },
                None => Health::UNKNOWN,
            };
            live.push((position, t, health));
        }
        let bands = bands(
            &live
                .iter()
                .map(|(_, _, h)| *h)
                .collect::<SmallVec<[_; INLINE_TARGETS]>>(),
        );
        let best = bands.iter().copied().min().unwrap_or(0);
        let mut ranked: Ranked = SmallVec::new();
        for ((position, t, _), band) in live.into_iter().zip(bands) {
            let demoted = band > best;
            if pin.is_none() {
                observe_demotion(route, t, demoted, at.metrics);
            }
            // A demoted target keeps a trickle of traffic at its place, so
            // its recovery (or its breaker's opening) is seen.
            let band = if demoted && rng.random_bool(TRICKLE) {
                best
            } else {
                band
            };
            // Efraimidis-Spirakis key: a weighted random order among equals.
            let u: f64 = rng.random_range(f64::EPSILON..1.0);
            let key = -u.ln() / f64::from(t.weight);
            ranked.push((
                (t.downshift, band, t.priority, key),
                Candidate {
                    provider: t.provider.clone(),
                    model: t.model.clone(),
                    primary: position == 0,
                    position,
                    streams: t.capabilities.contains(&Capability::Stream),
                    stream_unary: t.stream_unary,
                    downshift: t.downshift,
                },
            ));
        }
        // With no healthy target the plan is empty: the request goes straight
        // down the ladder (cache, queue, refuse) with `unavailable_for` as its retry time.
        let ranked_empty = ranked.is_empty();
        ranked.sort_by(|(a, _), (b, _)| {
            a.0.cmp(&b.0)
                .then(a.1.cmp(&b.1))
                .then(a.2.cmp(&b.2))
                .then(a.3.total_cmp(&b.3))
        });
        Ok(Plan {
            route: entry.name.clone(),
            candidates: ranked.into_iter().map(|(_, c)| c).collect(),
            default_max_tokens: entry.default_max_tokens,
            service_tier: entry.service_tier.clone(),
            deadline: entry.deadline,
            max_attempts: entry.max_attempts,
            mid_stream: entry.mid_stream,
            on_caller_gone: entry.on_caller_gone,
            side_effects: entry.side_effects,
            ladder: entry.ladder.clone(),
            cache_ttl: entry.cache_ttl,
            serve_fresh_within: entry.serve_fresh_within,
            max_tokens_limit: entry.max_tokens_limit,
            semantic: entry.semantic.clone(),
            shared_across_tenants: entry.shared_across_tenants,
            unavailable_for: if ranked_empty { soonest } else { None },
            fail_closed: entry.fail_closed,
            cache_affinity: entry.cache_affinity,
            traffic: entry.traffic,
        })
    }
}

impl Actor for RouterActor {
    type Msg = RouterMsg;
    type State = RouterState;
    type Arguments = RouterArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = RouterState {
            table: Arc::new(RouteTable {
                routes: HashMap::new(),
            }),
            counters: HashMap::new(),
            registry: args.registry,
            metrics: args.metrics,
        };
        state.install(&args.config, Instant::now());
        Ok(state)
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        _state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        fold_every(myself, FOLD_EVERY, || RouterMsg::Fold(None));
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        // What requests counted since the last message is older than it.
        state.fold(now);
        match message {
            RouterMsg::Fold(reply) => {
                if let Some(reply) = reply {
                    let _ = reply.send(());
                }
            }
            RouterMsg::WithdrawRetry { route, reply } => {
                let granted = match state.counters.get_mut(&route) {
                    Some(entry) => {
                        let granted = entry.budget.try_withdraw(now);
                        state
                            .metrics
                            .retry_budget_remaining
                            .get_or_create(&RouteLabels {
                                route: route.clone(),
                            })
                            .set(entry.budget.remaining(now));
                        granted
                    }
                    None => false,
                };
                let _ = reply.send(granted);
            }
            RouterMsg::Status(reply) => {
                let validations = state.registry.validations();
                let mut routes: Vec<RouteStatus> = state
                    .table
                    .routes
                    .iter()
                    .filter_map(|(name, e)| {
                        let counters = state.counters.get(name)?;
                        Some(RouteStatus {
                            name: name.clone(),
                            targets: e
                                .targets
                                .iter()
                                .map(|t| format!("{}/{}", t.provider, t.model))
                                .collect(),
                            failover_rate: counters.served.share(now),
                            retry_budget_remaining: counters.budget.remaining(now),
                            require_validated: e.require_validated,
                            validation: validations.routes.get(name).cloned(),
                        })
                    })
                    .collect();
                routes.sort_by(|a, b| a.name.cmp(&b.name));
                let _ = reply.send(routes);
            }
            RouterMsg::Reload(config, reply) => {
                // Unchanged routes keep their budget and failover window.
                state.install(&config, now);
                let _ = reply.send(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::state::validation::record::Records;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    #[test]
    fn a_unary_caller_is_streamed_unless_the_provider_says_stream_unary_false() {
        let c = |streams, stream_unary| Candidate {
            provider: "p".into(),
            model: "m".into(),
            primary: true,
            position: 0,
            streams,
            stream_unary,
            downshift: false,
        };
        // (streams, stream_unary, buffered) -> streamed upstream
        for (s, u, b, want) in [
            (true, true, true, true),
            (true, true, false, true),
            (true, false, true, false),
            (true, false, false, true),
            (false, true, false, false),
            (false, false, true, false),
        ] {
            assert_eq!(c(s, u).streamed(b), want, "{s} {u} {b}");
        }
    }

    fn config() -> Config {
        Config::from_toml_str(
            r#"
[[providers]]
id = "a"
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
  [[providers.models]]
  name = "small"
  capabilities = ["chat", "stream"]
  context_tokens = 8000
  [[providers.models]]
  name = "big"
  capabilities = ["chat", "stream", "tools", "json"]
  context_tokens = 128000
[[providers]]
id = "b"
kind = "anthropic"
base_url = "http://127.0.0.1:2/v1"
  [[providers.models]]
  name = "claude"
  capabilities = ["chat", "stream", "tools", "vision"]
  context_tokens = 200000
[[routes]]
name = "chat"
targets = ["a/small", "a/big", "b/claude"]
[[routes]]
name = "spread"
targets = [{ target = "a/big", priority = 0, weight = 3 }, { target = "b/claude", priority = 0, weight = 1 }]
[[routes]]
name = "gated"
targets = ["b/claude"]
ladder = ["fallback", "downshift", "refuse"]
downshift = ["a/small", "a/big"]
require_validated = true
"#,
        )
        .unwrap()
    }

    /// A published table and what plans read beside it, with a seeded rng.
    struct Fixture {
        table: RouteTable,
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        rng: StdRng,
    }

    impl Fixture {
        fn of(config: &Config) -> Self {
            Fixture {
                table: RouteTable {
                    routes: build_routes(config, &HashMap::new()),
                },
                registry: Arc::new(Registry::default()),
                metrics: Arc::new(Metrics::new()),
                rng: StdRng::seed_from_u64(7),
            }
        }

        fn plan(
            &mut self,
            route: &str,
            needs: &Needs,
            pin: Option<&str>,
            now: Instant,
        ) -> Result<Plan, PlanError> {
            self.plan_for(route, Purpose::Chat(needs), pin, now)
        }

        fn plan_for(
            &mut self,
            route: &str,
            purpose: Purpose<'_>,
            pin: Option<&str>,
            now: Instant,
        ) -> Result<Plan, PlanError> {
            let at = Planner {
                registry: &self.registry,
                metrics: &self.metrics,
            };
            self.table
                .plan_for(at, &mut self.rng, route, purpose, pin, now)
        }
    }

    fn state() -> Fixture {
        Fixture::of(&config())
    }

    fn names(p: &Plan) -> Vec<String> {
        p.candidates
            .iter()
            .map(|c| format!("{}/{}", c.provider, c.model))
            .collect()
    }

    #[test]
    fn require_validated_downshifts_only_to_validated_targets_unless_pinned() {
        use crate::state::validation::record::TargetValidation;
        let mut s = state();
        let plan = |s: &mut Fixture, pin: Option<&str>| {
            names(
                &s.plan("gated", &Needs::default(), pin, Instant::now())
                    .unwrap(),
            )
        };
        assert_eq!(plan(&mut s, None), ["b/claude"], "nothing validated yet");
        let target = TargetValidation::sample;
        let mut records = Records::default();
        records.routes.insert(
            "gated".into(),
            RouteValidation {
                route: "gated".into(),
                validated_unix_ms: 1,
                set: "s".into(),
                set_sha256: "0".into(),
                targets: vec![target("a/small", false), target("a/big", true)],
            },
        );
        s.registry.set_validations(Arc::new(records));
        assert_eq!(plan(&mut s, None), ["b/claude", "a/big"]);
        // A golden run reaches the unvalidated one, and only it.
        assert_eq!(plan(&mut s, Some("a/small")), ["a/small"]);
        let e = s
            .plan("gated", &Needs::default(), Some("b/other"), Instant::now())
            .unwrap_err();
        assert!(
            format!("{e:?}").contains("not one of the route's targets"),
            "{e:?}"
        );
    }

    #[test]
    fn plan_keeps_route_order_and_marks_primary() {
        let p = state()
            .plan("chat", &Needs::default(), None, Instant::now())
            .unwrap();
        assert_eq!(names(&p), ["a/small", "a/big", "b/claude"]);
        assert_eq!(p.candidates.iter().filter(|c| c.primary).count(), 1);
        assert!(p.candidates[0].primary);
        assert_eq!(p.max_attempts, 3);
    }

    #[test]
    fn tools_never_land_on_a_model_without_them() {
        let needs = Needs {
            tools: true,
            ..Needs::default()
        };
        let p = state().plan("chat", &needs, None, Instant::now()).unwrap();
        assert_eq!(names(&p), ["a/big", "b/claude"]);
        assert!(
            !p.candidates[0].primary,
            "the primary was filtered out; the rest is failover traffic"
        );
    }

    #[test]
    fn context_and_vision_filter() {
        let needs = Needs {
            vision: true,
            min_context_tokens: 150_000,
            ..Needs::default()
        };
        let p = state().plan("chat", &needs, None, Instant::now()).unwrap();
        assert_eq!(names(&p), ["b/claude"]);
    }

    #[test]
    fn nothing_capable_fails_closed_naming_what_is_missing() {
        let mut s = state();
        let needs = Needs {
            json: true,
            vision: true,
            ..Needs::default()
        };
        match s.plan("chat", &needs, None, Instant::now()).unwrap_err() {
            PlanError::NoCapableTarget { missing, .. } => {
                assert!(missing.contains(&"json".to_string()));
                assert!(missing.contains(&"vision".to_string()));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            s.plan("nope", &Needs::default(), None, Instant::now())
                .unwrap_err(),
            PlanError::UnknownRoute("nope".into())
        );
    }

    #[test]
    fn equal_priority_targets_share_load_by_weight() {
        let mut s = state();
        let mut first_big = 0;
        for _ in 0..4000 {
            let p = s
                .plan("spread", &Needs::default(), None, Instant::now())
                .unwrap();
            if &*p.candidates[0].model == "big" {
                first_big += 1;
            }
        }
        // weight 3 : 1 -> about 75 % first.
        assert!((2800..=3200).contains(&first_big), "{first_big}");
    }

    #[test]
    fn sparse_evidence_keeps_the_route_order() {
        let h = |score, evidence| Health { score, evidence };
        // The primary failed 2 of 4: no evidence, no reordering.
        assert_eq!(bands(&[h(0.5, false), h(1.0, false)]).as_slice(), [0, 0]);
        // Only one side has evidence: still the operator's order.
        assert_eq!(bands(&[h(0.3, true), h(1.0, false)]).as_slice(), [0, 0]);
        // Both have evidence: the bands apply.
        assert_eq!(bands(&[h(0.3, true), h(1.0, true)]).as_slice(), [3, 0]);
        assert_eq!(
            bands(&[h(0.3, true)]).as_slice(),
            [0],
            "alone: nothing to compare"
        );
    }

    #[test]
    fn a_demoted_target_keeps_a_trickle_and_is_shown() {
        let mut s = state();
        let live = [
            Health {
                score: 0.2,
                evidence: true,
            },
            Health {
                score: 1.0,
                evidence: true,
            },
        ];
        let b = bands(&live);
        assert!(b[0] > b[1]);
        // The trickle: about TRICKLE of plans keep a demoted target in place.
        let kept = (0..10_000).filter(|_| s.rng.random_bool(TRICKLE)).count();
        assert!((400..=600).contains(&kept), "{kept}");
        let t = &s.table.routes["chat"].targets[0];
        let metrics = Metrics::new();
        observe_demotion("chat", t, true, &metrics);
        assert!(metrics
            .render()
            .contains(r#"switchyard_target_demoted{route="chat",provider="a",model="small"} 1"#));
        observe_demotion("chat", t, false, &metrics);
        assert!(metrics
            .render()
            .contains(r#"switchyard_target_demoted{route="chat",provider="a",model="small"} 0"#));
    }

    #[test]
    fn health_bands_treat_near_equal_scores_as_equal() {
        assert_eq!(band(1.0), band(0.85));
        assert!(band(0.5) > band(0.95));
    }

    fn embeddings_state() -> Fixture {
        let config = Config::from_toml_str(
            r#"
[[providers]]
id = "a"
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
  [[providers.models]]
  name = "chat-model"
  [[providers.models]]
  name = "text-embedding-3-small"
  capabilities = ["embeddings"]
[[providers]]
id = "b"
kind = "openai"
base_url = "http://127.0.0.1:2/v1"
  [[providers.models]]
  name = "te3-small"
  capabilities = ["embeddings"]
  family = "text-embedding-3-small"
  [[providers.models]]
  name = "other-embed"
  capabilities = ["embeddings"]
[[routes]]
name = "embed"
targets = ["a/chat-model", "a/text-embedding-3-small", "b/other-embed", "b/te3-small"]
[[routes]]
name = "any"
targets = ["a/text-embedding-3-small", "b/other-embed"]
embedding_family_failover = "any"
[[routes]]
name = "chat"
targets = ["a/chat-model"]
"#,
        )
        .unwrap();
        Fixture::of(&config)
    }

    #[test]
    fn embeddings_fail_over_only_within_the_first_targets_family() {
        let mut s = embeddings_state();
        let mut plan = |route: &str, pin: Option<&str>| {
            s.plan_for(route, Purpose::Embeddings, pin, Instant::now())
        };
        let p = plan("embed", None).unwrap();
        // The chat model is not a candidate; `b/other-embed` is another
        // family; `b/te3-small` declares the first target's family.
        assert_eq!(names(&p), ["a/text-embedding-3-small", "b/te3-small"]);
        // Numbered among the embeddings targets: the first is the primary.
        assert!(p.candidates[0].primary && p.candidates[0].position == 0);
        assert!(!p.candidates[1].primary && p.candidates[1].position == 2);
        // A route may allow any family.
        let p = plan("any", None).unwrap();
        assert_eq!(names(&p), ["a/text-embedding-3-small", "b/other-embed"]);
        // A pin names its one target, whatever its family.
        let p = plan("embed", Some("b/other-embed")).unwrap();
        assert_eq!(names(&p), ["b/other-embed"]);
        // A route without embeddings targets says what is missing.
        let e = plan("chat", None).unwrap_err();
        assert_eq!(
            e,
            PlanError::NoCapableTarget {
                route: "chat".into(),
                missing: vec!["embeddings".into()],
            }
        );
        // And chat plans never see the embeddings purpose's filter.
        let p = s
            .plan("embed", &Needs::default(), None, Instant::now())
            .unwrap();
        assert_eq!(p.candidates.len(), 4);
    }

    /// The router actor alone, on `config` with a budget of `ratio` per
    /// plan and no floor, as requests see it.
    async fn router_with_budget(ratio: f64) -> (ActorRef<RouterMsg>, Arc<Registry>, Arc<Metrics>) {
        let config = config_with_ratio(ratio);
        let (registry, metrics) = (Arc::new(Registry::default()), Arc::new(Metrics::new()));
        let args = RouterArgs {
            config: Arc::new(config),
            registry: registry.clone(),
            metrics: metrics.clone(),
        };
        let (router, _) = Actor::spawn(None, RouterActor, args).await.unwrap();
        registry.set_router(router.clone());
        (router, registry, metrics)
    }

    async fn withdraw(router: &ActorRef<RouterMsg>, route: &str) -> bool {
        let msg = |reply| RouterMsg::WithdrawRetry {
            route: route.to_string(),
            reply,
        };
        router.call(msg, None).await.unwrap().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn plans_counted_in_the_tally_are_the_budget_before_any_withdrawal() {
        let (router, registry, _) = router_with_budget(0.5).await;
        let table = registry.route_table().unwrap();
        let tally = table.tally("chat").unwrap();
        for _ in 0..4 {
            tally.planned();
        }
        // No tick has passed (the clock is paused): the withdrawal folds them.
        let granted: Vec<bool> = [
            withdraw(&router, "chat").await,
            withdraw(&router, "chat").await,
            withdraw(&router, "chat").await,
        ]
        .into();
        assert_eq!(granted, [true, true, false], "4 plans at 0.5 pay 2 retries");
        assert!(
            !withdraw(&router, "spread").await,
            "another route's plans are its own"
        );
        router.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_counted_in_the_tally_are_the_failover_rate_a_scrape_and_status_see() {
        let (router, registry, metrics) = router_with_budget(0.1).await;
        let tally = registry.route_table().unwrap();
        let tally = tally.tally("chat").unwrap();
        tally.served(true);
        for _ in 0..3 {
            tally.served(false);
        }
        crate::actors::client::fold_tallies(&registry).await;
        let text = metrics.render();
        assert!(
            text.contains("switchyard_failover_rate{route=\"chat\"} 0.75"),
            "{text}"
        );
        let status = router.call(RouterMsg::Status, None).await.unwrap().unwrap();
        let chat = status.iter().find(|r| r.name == "chat").unwrap();
        assert_eq!(chat.failover_rate, 0.75);
        router.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_tick_folds_a_quiet_routers_tallies_in() {
        let (router, registry, metrics) = router_with_budget(0.5).await;
        registry
            .route_table()
            .unwrap()
            .tally("chat")
            .unwrap()
            .planned();
        tokio::task::yield_now().await;
        assert!(
            !metrics
                .render()
                .contains("switchyard_retry_budget_remaining{route=\"chat\"}"),
            "nothing has folded it yet"
        );
        tokio::time::sleep(FOLD_EVERY + Duration::from_millis(1)).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(
            metrics
                .render()
                .contains("switchyard_retry_budget_remaining{route=\"chat\"} 0.5"),
            "{}",
            metrics.render()
        );
        router.stop(None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_keeps_a_routes_tally_for_requests_planned_from_the_old_table() {
        let (router, registry, _) = router_with_budget(0.5).await;
        let old = registry.route_table().unwrap();
        let reload = |reply| RouterMsg::Reload(Arc::new(config_with_ratio(0.5)), reply);
        router.call(reload, None).await.unwrap().unwrap();
        let new = registry.route_table().unwrap();
        assert!(!Arc::ptr_eq(&old, &new), "a new table is published");
        old.tally("chat").unwrap().planned();
        new.tally("chat").unwrap().planned();
        assert!(withdraw(&router, "chat").await, "both plans count: 2 x 0.5");
        assert!(!withdraw(&router, "chat").await);
        router.stop(None);
    }

    fn config_with_ratio(ratio: f64) -> Config {
        let mut config = config();
        config.retry_budget.ratio = ratio;
        config.retry_budget.min_per_sec = 0.0;
        config
    }
}
