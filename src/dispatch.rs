//! The request task: one per call. It asks the router actor for a plan, walks
//! the candidates — each attempt admitted by the target's provider actor, each
//! retry or failover granted by the route's budget, never past the deadline or
//! after the caller left — reports every attempt's one outcome, and ends with
//! an answer or one classified error. Policy comes from the actors and the
//! pure policy structs; this module carries it out.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::actors::provider::{self, Permit, ProviderMsg, Refusal, TrafficClass};
use crate::actors::recovery::RecoveryMsg;
use crate::actors::registry::{ProviderEntry, Registry};
use crate::actors::router::{Candidate, Plan, PlanError, RouterMsg};
use crate::actors::CALL_TIMEOUT;
use crate::attempt::{self, AttemptEnd, AttemptInput};
use crate::chat::{ChatRequest, Usage};
use crate::config::Rung;
use crate::error::RequestError;
use crate::policy::affinity::{self, PrefixHash, Warm};
use crate::policy::backoff::Backoff;
use crate::policy::next::{next, Next, Outcome, Tried, View};
use crate::request::RequestSpec;
use crate::semantic::SemanticCache;
use crate::sink::{Event, EventSink, Finished, QueuedJob, Started, Tier};
use crate::state::affinity::AffinityMemory;
use crate::state::cache::ResponseCache;
use crate::state::cost::{CostLedger, OnOutage, Reservation};
use crate::state::idempotency::{Idempotency, KeyClaim};
use crate::state::jobs::{Jobs, OwnedJob};
use crate::telemetry::metrics::{Metrics, ServedLabels, ShedLabels, TargetSeries};

/// Shared by all request tasks.
pub struct Dispatcher {
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub idempotency: Arc<Idempotency>,
    pub cache: Arc<ResponseCache>,
    /// Near-repeat answers of the routes with a `semantic_cache`.
    pub semantic: Arc<SemanticCache>,
    pub cost: Arc<CostLedger>,
    /// Where prompt-cache affinity remembers warm prefixes.
    pub affinity: Arc<AffinityMemory>,
    pub backoff: Backoff,
    pub default_deadline: Duration,
    /// The durable job queue, when configured.
    pub jobs: Option<Arc<Jobs>>,
    /// Cancelled when the drain timeout passes: remaining requests end with
    /// UNAVAILABLE (SERVER_DRAINING) and their upstream calls are dropped.
    pub abort: CancellationToken,
    /// Requests running now.
    pub active: AtomicUsize,
}

/// Samples of a target's TTFT needed before deadline-aware admission trusts its p95.
const MIN_TTFT_SAMPLES: u64 = 5;

/// One request's walk, as each attempt sees it.
struct Call<'a> {
    spec: &'a RequestSpec,
    plan: &'a Plan,
    candidate: &'a Candidate,
    deadline: Instant,
    affinity: Option<&'a Affinity>,
}

/// A request's prompt-cache affinity, on a route with `cache_affinity`.
struct Affinity {
    /// Its cacheable prefixes, longest first.
    prefixes: Vec<PrefixHash>,
    /// Where the longest warm one was answered, if any is.
    warm: Option<Warm>,
    ttl: Duration,
}

/// What one request holds against its tenant's cap and has spent so far.
struct Bill<'a> {
    tenant: &'a str,
    /// The request's deadline (a hold outlives it by a margin).
    deadline: Instant,
    held: Vec<Reservation>,
    spent: f64,
    /// What a hold does while the fleet ledger is away (the route's `fail_closed`).
    on_outage: OnOutage,
}

/// What a completed attempt adds to `Finished`.
struct Served {
    attempts: u32,
    upstream_request_id: Option<String>,
}

/// How long past its deadline a request task may run before it is ended.
const OVERRUN_GRACE: Duration = Duration::from_secs(5);

/// What a request task has reached, for `Dispatcher::run`.
struct Progress {
    /// The route is known to exist: only then may it label a metric.
    planned: AtomicBool,
    /// The whole request's deadline, once computed.
    deadline: tokio::sync::watch::Sender<Option<Instant>>,
}

impl Default for Progress {
    fn default() -> Self {
        Progress {
            planned: AtomicBool::new(false),
            deadline: tokio::sync::watch::Sender::new(None),
        }
    }
}

impl Progress {
    /// Resolves `OVERRUN_GRACE` after the deadline (never before it is known).
    async fn overrun(&self) {
        let mut rx = self.deadline.subscribe();
        let deadline = match rx.wait_for(Option::is_some).await {
            Ok(d) => *d,
            Err(_) => None,
        };
        match deadline {
            Some(d) => tokio::time::sleep_until(d + OVERRUN_GRACE).await,
            None => std::future::pending().await,
        }
    }
}

impl Dispatcher {
    pub fn new(
        registry: Arc<Registry>,
        metrics: Arc<Metrics>,
        idempotency: Arc<Idempotency>,
        cache: Arc<ResponseCache>,
        cost: Arc<CostLedger>,
        backoff: Backoff,
        default_deadline: Duration,
    ) -> Self {
        Dispatcher {
            registry,
            metrics,
            idempotency,
            cache,
            semantic: SemanticCache::new(),
            cost,
            affinity: Arc::default(),
            jobs: None,
            backoff,
            default_deadline,
            abort: CancellationToken::new(),
            active: AtomicUsize::new(0),
        }
    }

    /// Runs the request to its end; the outcome reaches the caller through `sink`.
    pub async fn run(self: Arc<Self>, spec: RequestSpec, mut sink: EventSink) {
        self.active.fetch_add(1, Ordering::Relaxed);
        let progress = Progress::default();
        let result = tokio::select! {
            r = self.serve(&spec, &mut sink, &progress) => r,
            _ = self.abort.cancelled() => Err(RequestError::Draining),
            _ = progress.overrun() => {
                // Every wait inside has its own timer; this is the net under
                // them, so no task (and no permit it holds) outlives its deadline.
                tracing::error!(request_id = %spec.request_id, route = %spec.route, grace = ?OVERRUN_GRACE, "request still running past its deadline: ended");
                Err(RequestError::DeadlineExceeded { attempts: 0 })
            }
        };
        let planned = progress.planned.load(Ordering::Relaxed);
        if let Err(e) = result {
            if let Some(reason) = e.shed_reason().filter(|_| planned) {
                self.metrics
                    .shed
                    .get_or_create(&ShedLabels {
                        route: spec.route.clone(),
                        reason,
                    })
                    .inc();
            }
            sink.fail(e).await;
        }
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    /// The whole request: cost cap, idempotency, fresh cache hits, the live
    /// targets, then the rest of the degradation ladder.
    async fn serve(
        &self,
        spec: &RequestSpec,
        sink: &mut EventSink,
        progress: &Progress,
    ) -> Result<(), RequestError> {
        // Computed only when a cache or an idempotency key needs it.
        let digest = std::sync::OnceLock::new();
        let fingerprint = || *digest.get_or_init(|| spec.fingerprint());
        let guard = match spec.scoped_key() {
            None => None,
            Some(key) => match self
                .idempotency
                .claim(&key, fingerprint(), Instant::now())
                .await?
            {
                KeyClaim::Fresh(guard) => Some(guard),
                KeyClaim::Replay(events) => {
                    replay(sink, &events, spec, |f| f.replayed = true).await;
                    return Ok(());
                }
                KeyClaim::InUse => return Err(RequestError::IdempotencyKeyInUse),
                KeyClaim::Mismatch => return Err(RequestError::IdempotencyKeyReused),
            },
        };
        let mut plan = self.plan(spec).await?;
        progress.planned.store(true, Ordering::Relaxed);
        if let (Some(limit), Some(asked)) = (plan.max_tokens_limit, spec.chat.max_tokens) {
            if asked > limit {
                return Err(RequestError::InvalidRequest(format!(
                    "max_tokens: {asked} exceeds route `{}`'s limit of {limit}",
                    plan.route
                )));
            }
        }
        // The response cache's key: the request within its tenant's scope
        // (or every tenant's, on a route that shares its caches).
        let owner = spec.cache_owner(plan.shared_across_tenants);
        let cache_key = || spec.cache_key(&fingerprint(), owner);
        if let Some(fresh) = plan.serve_fresh_within {
            if let Some(hit) = self.cache.get(&cache_key(), Some(fresh), Instant::now()) {
                self.serve_stored(sink, spec, &plan.route, Stored::exact(&hit), 0)
                    .await;
                return Ok(());
            }
        }
        let semantic = self.semantic_begin(spec, &plan);
        if let Some(p) = semantic.as_ref().filter(|p| p.cfg.fresh_within.is_some()) {
            if let Some(hit) = self.semantic_hit(p, true).await {
                self.serve_stored(sink, spec, &plan.route, Stored::semantic(&hit), 0)
                    .await;
                return Ok(());
            }
        }
        let caches = plan.has_rung(Rung::Cache) || plan.serve_fresh_within.is_some();
        if caches || guard.is_some() || semantic.is_some() {
            let cache = caches.then(|| (self.cache.clone(), plan.cache_ttl, cache_key()));
            let fill = semantic
                .clone()
                .map(|p| (self.semantic.clone(), self.metrics.clone(), p));
            sink.record(Box::new(move |events| {
                Box::pin(async move {
                    // An answer a cache rung served is stored already (and
                    // storing it again would reset its age).
                    let fresh = !events.iter().any(|e| {
                        matches!(e, Event::Finished(f) if matches!(f.tier, Tier::Cache | Tier::SemanticCache))
                    });
                    if let Some((semantic, metrics, pending)) = fill.filter(|_| fresh) {
                        crate::semantic::lookup::fill(semantic, metrics, pending, events.clone());
                    }
                    if let Some((cache, ttl, key)) = cache.filter(|_| fresh) {
                        cache.put(key, events.clone(), ttl, Instant::now());
                    }
                    if let Some(guard) = guard {
                        guard.complete(events).await;
                    }
                })
            }));
        }
        // The whole request's deadline: every attempt and the cost hold fit it.
        let deadline = spec.deadline.unwrap_or_else(|| {
            crate::policy::clock::after(
                Instant::now(),
                plan.deadline.unwrap_or(self.default_deadline),
            )
        });
        sink.set_deadline(deadline);
        progress.deadline.send_replace(Some(deadline));
        let mut bill = self.reserve(spec, &plan, deadline).await?;
        let affinity = self.affinity_place(spec, &mut plan).await;
        let live = self
            .drive(spec, &plan, affinity.as_ref(), sink, &mut bill)
            .await;
        self.settle(bill).await;
        match live {
            Ok(()) => Ok(()),
            Err(e) if e.may_descend_ladder() && !sink.committed() => {
                // The rest of the ladder, in the route's order.
                for rung in &plan.ladder {
                    match rung {
                        Rung::Cache => {
                            if let Some(hit) = self.cache.get(&cache_key(), None, Instant::now()) {
                                tracing::warn!(request_id = %spec.request_id, route = %plan.route, age_ms = hit.age.as_millis() as u64, error = %e, "no live answer; serving the cached one");
                                self.serve_stored(
                                    sink,
                                    spec,
                                    &plan.route,
                                    Stored::exact(&hit),
                                    e.attempts(),
                                )
                                .await;
                                return Ok(());
                            }
                        }
                        Rung::SemanticCache => {
                            let Some(p) = &semantic else { continue };
                            if let Some(hit) = self.semantic_hit(p, false).await {
                                tracing::warn!(request_id = %spec.request_id, route = %plan.route, age_ms = hit.age.as_millis() as u64, similarity = hit.similarity, error = %e, "no live answer; serving the closest stored one");
                                self.serve_stored(
                                    sink,
                                    spec,
                                    &plan.route,
                                    Stored::semantic(&hit),
                                    e.attempts(),
                                )
                                .await;
                                return Ok(());
                            }
                        }
                        Rung::Queue if !spec.from_queue => {
                            let job = self.enqueue(spec).await?;
                            tracing::warn!(request_id = %spec.request_id, route = %plan.route, error = %e, "no live answer; queued");
                            self.count_served(&plan.route, Tier::Queued, "queue");
                            let _ = sink.queued(job).await;
                            return Ok(());
                        }
                        Rung::Refuse => break,
                        Rung::Fallback | Rung::Downshift | Rung::Queue => {}
                    }
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Accepts a validated request as a durable job and wakes the recovery actor.
    pub async fn enqueue(&self, spec: &RequestSpec) -> Result<QueuedJob, RequestError> {
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| RequestError::QueueUnavailable("no [queue] is configured".into()))?;
        let request = spec
            .source
            .as_ref()
            .ok_or_else(|| RequestError::QueueUnavailable("the request cannot be stored".into()))?;
        let record = jobs
            .submit(OwnedJob {
                tenant: spec.tenant.clone(),
                route: spec.route.clone(),
                idempotency_key: spec.idempotency_key.clone(),
                fingerprint: spec.fingerprint().to_vec(),
                request: request.to_vec(),
            })
            .await?;
        if let Some(recovery) = self.registry.recovery() {
            let _ = recovery.cast(RecoveryMsg::JobsWaiting);
        }
        let (position, eta) = jobs.eta(&record).await;
        tracing::info!(request_id = %spec.request_id, job = %record.id, position, "accepted as a job");
        Ok(QueuedJob {
            record,
            position,
            eta,
        })
    }

    /// Holds the request's maximum cost against the tenant's cap, at the
    /// dearest candidate: the prompt estimate at the dearest input rate it
    /// may be billed at there (a cache write of the whole prompt, at the
    /// longest marked TTL's price on an Anthropic target; on an upstream
    /// that caches on its own, whichever of input, read and write is
    /// dearest) plus `max_tokens` (else the model's context) at its output
    /// price. It settles to the real, cache-aware cost.
    async fn reserve<'a>(
        &self,
        spec: &'a RequestSpec,
        plan: &Plan,
        deadline: Instant,
    ) -> Result<Bill<'a>, RequestError> {
        let mut bill = Bill {
            tenant: &spec.tenant,
            deadline,
            held: Vec::new(),
            spent: 0.0,
            on_outage: if plan.fail_closed {
                OnOutage::Refuse
            } else {
                OnOutage::Allowance
            },
        };
        if !self.cost.has_cap(&spec.tenant) {
            return Ok(bill);
        }
        let prompt = prompt_tokens(&spec.chat);
        let marked = spec.chat.longest_cache_ttl();
        let asked = spec.chat.max_tokens.or(plan.default_max_tokens);
        let max_usd = plan
            .candidates
            .iter()
            .filter_map(|c| {
                let entry = self.registry.provider(&c.provider)?;
                let model = entry.runtime.model(&c.model)?;
                let output = asked.unwrap_or(model.context_tokens.saturating_sub(prompt));
                let dialect = entry.runtime.kind.dialect();
                Some(model.price.max_cost(dialect, marked, prompt, output))
            })
            .fold(0.0, f64::max);
        self.hold(&mut bill, max_usd).await?;
        Ok(bill)
    }

    /// Adds `usd` to what the request holds, or refuses with COST_CAP (or
    /// STATE_UNAVAILABLE on a `fail_closed` route while the ledger is away).
    async fn hold(&self, bill: &mut Bill<'_>, usd: f64) -> Result<(), RequestError> {
        // Held past the deadline by a margin, so a live request never loses it.
        let hold =
            bill.deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(30);
        match self
            .cost
            .reserve(bill.tenant, usd, hold, bill.on_outage)
            .await
        {
            Ok(Some(r)) => {
                bill.held.push(r);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(refused) => Err(refused.into_error(bill.tenant)),
        }
    }

    /// Settles what the request held to what it really cost.
    async fn settle(&self, mut bill: Bill<'_>) {
        let mut held = bill.held.drain(..);
        match held.next() {
            Some(first) => self.cost.settle(first, bill.spent).await,
            None => self.cost.charge(bill.tenant, bill.spent).await,
        }
        for rest in held {
            self.cost.settle(rest, 0.0).await;
        }
    }

    /// On a `cache_affinity` route, the request's cacheable prefixes and
    /// where the longest warm one was answered; that target goes first in
    /// the plan (the policy in `policy::affinity`).
    async fn affinity_place(&self, spec: &RequestSpec, plan: &mut Plan) -> Option<Affinity> {
        let ttl = plan.cache_affinity?;
        let prefixes = affinity::prefixes(&spec.chat, &spec.tenant, &plan.route);
        if prefixes.is_empty() {
            return None;
        }
        let warm = self.affinity.recall(&spec.tenant, &prefixes).await;
        if let Some(w) = &warm {
            affinity::place(&mut plan.candidates, |c| {
                !c.downshift && w.is(&c.provider, &c.model)
            });
        }
        Some(Affinity {
            prefixes,
            warm,
            ttl,
        })
    }

    /// An answer on a `cache_affinity` route: counts whether it came from
    /// where its prefix was warm, and remembers it there (with `key`) for
    /// the route's ttl. Done before `Finished` goes out, so the caller's
    /// next turn finds it.
    async fn affinity_remember(&self, call: &Call<'_>, key: Option<String>) {
        let Some(a) = call.affinity else { return };
        let c = call.candidate;
        let verdict = affinity::verdict(a.warm.as_ref(), &c.provider, &c.model);
        self.metrics
            .cache_affinity
            .get_or_create(&crate::telemetry::metrics::AffinityLabels {
                route: call.plan.route.clone(),
                result: verdict.as_str(),
            })
            .inc();
        let warm = Warm {
            provider: c.provider.clone(),
            model: c.model.clone(),
            key,
        };
        self.affinity
            .remember(&call.spec.tenant, &a.prefixes, &warm, a.ttl)
            .await;
    }

    /// Counts an answered request by route, tier and who answered.
    fn count_served(&self, route: &str, tier: Tier, provider: &str) {
        self.metrics
            .served
            .get_or_create(&ServedLabels {
                route: route.to_string(),
                tier: tier.as_str(),
                provider: provider.to_string(),
            })
            .inc();
    }

    pub async fn plan(&self, spec: &RequestSpec) -> Result<Plan, RequestError> {
        let router = self
            .registry
            .router()
            .ok_or_else(|| RequestError::Unavailable("router actor is not running".into()))?;
        let answer = router
            .call(
                |reply| RouterMsg::Plan {
                    route: spec.route.clone(),
                    needs: spec.needs.clone(),
                    pin: spec.pin.clone(),
                    reply,
                },
                Some(CALL_TIMEOUT),
            )
            .await;
        match answer {
            Ok(CallResult::Success(Ok(plan))) => Ok(plan),
            Ok(CallResult::Success(Err(e))) => Err(match e {
                PlanError::UnknownRoute(r) => RequestError::UnknownRoute(r),
                PlanError::NoCapableTarget { route, missing } => {
                    RequestError::NoCapableTarget { route, missing }
                }
            }),
            _ => Err(RequestError::Unavailable(
                "router actor did not answer".into(),
            )),
        }
    }

    /// Asks the route's budget for one more attempt.
    pub(crate) async fn withdraw(&self, route: &str) -> bool {
        let Some(router) = self.registry.router() else {
            return false;
        };
        matches!(
            router
                .call(
                    |reply| RouterMsg::WithdrawRetry {
                        route: route.to_string(),
                        reply,
                    },
                    Some(CALL_TIMEOUT),
                )
                .await,
            Ok(CallResult::Success(true))
        )
    }

    /// The live part of the ladder: asks the decision table what to do after
    /// each event and does it. It holds no policy of its own.
    async fn drive(
        &self,
        spec: &RequestSpec,
        plan: &Plan,
        affinity: Option<&Affinity>,
        sink: &mut EventSink,
        bill: &mut Bill<'_>,
    ) -> Result<(), RequestError> {
        let deadline = bill.deadline;
        let mut chat = spec.chat.clone();
        if chat.max_tokens.is_none() {
            chat.max_tokens = plan.default_max_tokens;
        }
        let policy = plan.policy();
        let providers: Vec<&str> = plan
            .candidates
            .iter()
            .map(|c| c.provider.as_str())
            .collect();
        // Read once per request: the targets' p95 barely moves within one.
        let p95: Vec<Option<Duration>> = plan.candidates.iter().map(|c| self.p95_ttft(c)).collect();
        let mut tried = Tried::new(plan.candidates.len());
        let mut outcome = Outcome::Begin;
        loop {
            if sink.is_closed() {
                return Ok(());
            }
            let view = View {
                policy: &policy,
                remaining: deadline.saturating_duration_since(Instant::now()),
                p95_ttft: &p95,
                providers: &providers,
                backoff: &self.backoff,
            };
            // The thread's RNG, held only for the call (it is not `Send`).
            let step = next(&mut tried, outcome, &view, &mut rand::rng());
            let (to, wait) = match step {
                Next::Done => return Ok(()),
                Next::Stop(e) => return Err(e),
                Next::Reset { reason } => {
                    if sink.reset(reason, tried.attempts()).await.is_err() {
                        return Ok(());
                    }
                    outcome = Outcome::ResetSent;
                    continue;
                }
                Next::FailOver { to } => (to, None),
                Next::Retry { to, after } => (to, Some(after)),
            };
            if let Some(wait) = wait {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = sink.closed() => return Ok(()),
                }
            }
            let call = Call {
                spec,
                plan,
                candidate: &plan.candidates[to],
                deadline,
                affinity,
            };
            outcome = self
                .attempt(&call, &mut chat, &mut tried, sink, bill)
                .await?;
        }
    }

    /// One step of the walk: admission by the target's provider actor, the
    /// route's budget for any attempt after the first, then the attempt.
    async fn attempt(
        &self,
        call: &Call<'_>,
        chat: &mut ChatRequest,
        tried: &mut Tried,
        sink: &mut EventSink,
        bill: &mut Bill<'_>,
    ) -> Result<Outcome, RequestError> {
        let candidate = call.candidate;
        let traffic = if candidate.primary {
            TrafficClass::Own
        } else {
            TrafficClass::Failover
        };
        let (entry, mut permit) = match self.admit(candidate, traffic, call.deadline).await {
            Admission::Granted(entry, permit) => (entry, permit),
            Admission::Refused(refusal) => {
                tracing::debug!(provider = %candidate.provider, model = %candidate.model, %refusal, "target refused admission");
                return Ok(Outcome::Refused {
                    saturated: matches!(refusal, Refusal::Saturated(_)),
                    retry_in: refusal.retry_in(),
                });
            }
            Admission::Unreachable => {
                tracing::warn!(provider = %candidate.provider, "provider actor unreachable; skipping it");
                return Ok(Outcome::Refused {
                    saturated: false,
                    retry_in: None,
                });
            }
        };
        // Only an attempt that will really be sent spends the budget: a
        // local refusal above cost nothing.
        if tried.needs_budget() && !self.withdraw(&call.plan.route).await {
            // Dropped unsent: it reports itself cancelled.
            drop(permit);
            return Ok(Outcome::NoBudget);
        }
        tried.sent();
        permit.mark_sent();
        chat.model = candidate.model.clone();
        chat.stream = candidate.streams;
        chat.service_tier = call
            .plan
            .service_tier
            .clone()
            .filter(|t| takes_tier(entry.runtime.kind, t));
        let result = self
            .send(call, &entry, chat, tried.attempts(), traffic, sink)
            .await;
        let billed = self.report(call, &entry, permit, &result, sink);
        if billed > 0.0 {
            // Output before a failure is billed all the same; the next
            // attempt may cost the maximum again, so hold that much more
            // (an expensive fallback chain stops at the cap too).
            bill.spent += billed;
            if !bill.held.is_empty() {
                self.hold(bill, billed).await?;
            }
        }
        self.record_attempt(candidate, &entry, &result);
        Ok(match result.end {
            AttemptEnd::Completed(completion) => {
                self.affinity_remember(call, result.key).await;
                let served = Served {
                    attempts: tried.attempts(),
                    upstream_request_id: result.upstream_request_id,
                };
                bill.spent += self
                    .finish(call, &entry, chat, completion, served, sink)
                    .await;
                Outcome::Completed
            }
            AttemptEnd::ClientGone => Outcome::Completed,
            AttemptEnd::DeadlineExceeded => Outcome::DeadlineExceeded,
            AttemptEnd::Failed(failure) => Outcome::Failed {
                failure,
                committed: sink.committed(),
                had_output: sink.attempt_had_output(),
                tokens_emitted: sink.attempt_chunks(),
            },
        })
    }

    /// Sends the attempt's one outcome to its provider actor and frees its
    /// permit; returns what a failed attempt's output cost.
    fn report(
        &self,
        call: &Call<'_>,
        entry: &ProviderEntry,
        permit: Permit,
        result: &attempt::AttemptResult,
        sink: &EventSink,
    ) -> f64 {
        let model = &call.candidate.model;
        let failed_output_tokens = if matches!(result.end, AttemptEnd::Failed(_)) {
            sink.attempt_chars().div_ceil(4) as u32
        } else {
            0
        };
        self.series(call.candidate, entry)
            .count_attempt(&self.metrics, result.end.class().as_str());
        for (key, event) in &result.key_events {
            self.metrics
                .key_events
                .get_or_create(&crate::telemetry::metrics::KeyLabels {
                    provider: call.candidate.provider.clone(),
                    key: key.clone(),
                    event,
                })
                .inc();
        }
        permit.report(provider::Outcome::of(result, failed_output_tokens));
        let billed = price(entry, model).cost(0, failed_output_tokens);
        self.count_cost(&call.plan.route, call.candidate, billed);
        billed
    }

    /// Sends one attempt inside its span and logs how it ended.
    async fn send(
        &self,
        call: &Call<'_>,
        entry: &ProviderEntry,
        chat: &ChatRequest,
        attempt: u32,
        traffic: TrafficClass,
        sink: &mut EventSink,
    ) -> attempt::AttemptResult {
        let candidate = call.candidate;
        sink.begin_attempt(Started {
            provider: candidate.provider.clone(),
            model: candidate.model.clone(),
            attempt,
            tier: candidate.tier(),
            request_id: call.spec.request_id.clone(),
            dropped: Vec::new(),
        });
        let span = tracing::info_span!(
            "attempt",
            otel.name = %format!("chat {}", candidate.model),
            otel.kind = "client",
            provider = %candidate.provider,
            gen_ai.provider.name = entry.runtime.kind.as_str(),
            gen_ai.request.model = %candidate.model,
            attempt,
            traffic = traffic.as_str(),
            outcome = tracing::field::Empty,
            ttft_ms = tracing::field::Empty,
            output_chars = tracing::field::Empty,
        );
        let result = attempt::run(
            AttemptInput {
                endpoint: &entry.runtime.endpoint,
                chat,
                deadline: call.deadline,
                attempt,
                key: call.affinity.and_then(|a| {
                    affinity::key_for(a.warm.as_ref(), &candidate.provider, &candidate.model)
                }),
            },
            sink,
        )
        .instrument(span.clone())
        .await;
        let class = result.end.class();
        span.record("outcome", class.as_str());
        if let Some(ttft) = result.ttft {
            span.record("ttft_ms", ttft.as_millis() as u64);
        }
        span.record("output_chars", sink.attempt_chars() as u64);
        // Per attempt at DEBUG (it is on the hot path); failures at INFO.
        tracing::debug!(
            request_id = %call.spec.request_id,
            route = %call.plan.route,
            provider = %candidate.provider,
            model = %candidate.model,
            attempt,
            outcome = %class,
            ttft_ms = result.ttft.map(|d| d.as_millis() as u64),
            elapsed_ms = result.elapsed.as_millis() as u64,
            "attempt ended"
        );
        if let AttemptEnd::Failed(f) = &result.end {
            tracing::info!(
                request_id = %call.spec.request_id,
                provider = %candidate.provider,
                model = %candidate.model,
                attempt,
                outcome = %class,
                http_status = f.http_status,
                "attempt failed"
            );
        }
        result
    }

    /// A completed attempt: usage, cost, the served counters, `Finished`.
    /// Returns what the answer cost.
    async fn finish(
        &self,
        call: &Call<'_>,
        entry: &ProviderEntry,
        chat: &ChatRequest,
        completion: crate::chat::Completion,
        served: Served,
        sink: &mut EventSink,
    ) -> f64 {
        let candidate = call.candidate;
        let (usage, usage_estimated) = match completion.usage {
            Some(u) => (u, false),
            None => (estimate_usage(chat, sink.attempt_chars()), true),
        };
        self.record_usage(&call.plan.route, candidate, entry, usage);
        let cost_usd =
            price(entry, &candidate.model).usage_cost(&usage, entry.runtime.kind.dialect());
        self.count_cost(&call.plan.route, candidate, cost_usd);
        self.served(&call.plan.route, candidate, candidate.tier());
        let _ = sink
            .finish(Finished {
                finish_reason: completion.finish_reason,
                usage,
                usage_estimated,
                provider: candidate.provider.clone(),
                model: candidate.model.clone(),
                tier: candidate.tier(),
                attempts: served.attempts,
                request_id: call.spec.request_id.clone(),
                upstream_request_id: served.upstream_request_id,
                replayed: false,
                cache_age: None,
                cache_similarity: None,
                cost_usd,
                service_tier: completion.service_tier,
                reasoning: completion.reasoning,
                dropped: sink.attempt_dropped(),
            })
            .await;
        cost_usd
    }

    /// A target's p95 time to first token, once enough samples back it.
    fn p95_ttft(&self, c: &Candidate) -> Option<Duration> {
        let entry = self.registry.provider(&c.provider)?;
        entry.runtime.with_snapshot(|snapshot| {
            let t = snapshot.models.get(&c.model)?;
            (t.calls >= MIN_TTFT_SAMPLES)
                .then_some(t.p95_ttft)
                .flatten()
        })
    }

    fn record_attempt(
        &self,
        c: &Candidate,
        entry: &ProviderEntry,
        result: &attempt::AttemptResult,
    ) {
        let series = self.series(c, entry);
        series
            .operation_duration
            .observe(result.elapsed.as_secs_f64());
        if let Some(ttft) = result.ttft {
            series.time_to_first_token.observe(ttft.as_secs_f64());
        }
    }

    /// The GenAI token histogram (input counts every prompt token, cached
    /// or not, as the convention asks; output includes reasoning) and the
    /// route's prompt-cache reads and writes.
    fn record_usage(&self, route: &str, c: &Candidate, entry: &ProviderEntry, usage: Usage) {
        let series = self.series(c, entry);
        series.input_tokens.observe(f64::from(usage.total_input()));
        series.output_tokens.observe(f64::from(usage.output_tokens));
        for (kind, n) in [
            ("read", usage.cache_read_input_tokens),
            ("write", usage.cache_write_input_tokens),
        ] {
            if n > 0 {
                self.metrics
                    .prompt_cache_tokens
                    .get_or_create(&crate::telemetry::metrics::PromptCacheLabels {
                        route: route.to_string(),
                        provider: c.provider.clone(),
                        model: c.model.clone(),
                        kind,
                    })
                    .inc_by(u64::from(n));
            }
        }
    }

    /// Adds what an attempt cost to `switchyard_cost_usd_total`.
    fn count_cost(&self, route: &str, c: &Candidate, usd: f64) {
        if usd > 0.0 && usd.is_finite() {
            self.metrics
                .cost_usd
                .get_or_create(&crate::telemetry::metrics::RouteTargetLabels {
                    route: route.to_string(),
                    provider: c.provider.clone(),
                    model: c.model.clone(),
                })
                .inc_by(usd);
        }
    }

    fn series(&self, c: &Candidate, entry: &ProviderEntry) -> Arc<TargetSeries> {
        self.metrics
            .target(entry.runtime.kind.as_str(), &c.provider, &c.model)
    }

    /// Counts an answer served by a live target and tells the router (its
    /// failover rate).
    pub(crate) fn served(&self, route: &str, c: &Candidate, tier: Tier) {
        self.count_served(route, tier, &c.provider);
        if let Some(router) = self.registry.router() {
            let _ = router.cast(RouterMsg::Served {
                route: route.to_string(),
                primary: c.position == 0,
            });
        }
    }
}

/// Replays stored events as a new answer, re-stamped for this request.
async fn replay(
    sink: &mut EventSink,
    events: &[Event],
    spec: &RequestSpec,
    mark: impl Fn(&mut Finished),
) {
    for event in events.iter().cloned() {
        let event = match event {
            Event::Finished(mut f) => {
                f.request_id = spec.request_id.clone();
                mark(&mut f);
                Event::Finished(f)
            }
            Event::Started(mut s) => {
                s.request_id = spec.request_id.clone();
                Event::Started(s)
            }
            other => other,
        };
        if sink.replay(event).await.is_err() {
            return;
        }
    }
}

/// A stored answer about to be served, from either cache.
struct Stored<'a> {
    events: &'a [Event],
    tier: Tier,
    age: Duration,
    similarity: Option<f32>,
}

impl<'a> Stored<'a> {
    fn exact(hit: &'a crate::state::cache::Hit) -> Self {
        Stored {
            events: &hit.events,
            tier: Tier::Cache,
            age: hit.age,
            similarity: None,
        }
    }

    fn semantic(hit: &'a crate::semantic::Hit) -> Self {
        Stored {
            events: &hit.events,
            tier: Tier::SemanticCache,
            age: hit.age,
            similarity: Some(hit.similarity),
        }
    }
}

impl Dispatcher {
    /// Serves a stored answer labelled as such (its tier, age and, from the
    /// semantic cache, similarity); it cost nothing now. Counts it served
    /// and, for the semantic tier, what it deflected.
    async fn serve_stored(
        &self,
        sink: &mut EventSink,
        spec: &RequestSpec,
        route: &str,
        stored: Stored<'_>,
        attempts: u32,
    ) {
        self.count_served(route, stored.tier, stored.tier.as_str());
        if stored.tier == Tier::SemanticCache {
            self.count_deflected(route, stored.events);
        }
        let events: Vec<Event> = stored
            .events
            .iter()
            .cloned()
            .map(|e| match e {
                Event::Started(mut s) => {
                    s.tier = stored.tier;
                    s.attempt = attempts;
                    Event::Started(s)
                }
                other => other,
            })
            .collect();
        replay(sink, &events, spec, |f| {
            f.tier = stored.tier;
            f.cache_age = Some(stored.age);
            f.cache_similarity = stored.similarity;
            f.attempts = attempts;
            f.cost_usd = 0.0;
            f.upstream_request_id = None;
        })
        .await;
    }

    /// The tokens and cost an answer served from the semantic cache saved.
    fn count_deflected(&self, route: &str, events: &[Event]) {
        let Some(f) = events.iter().find_map(|e| match e {
            Event::Finished(f) => Some(f),
            _ => None,
        }) else {
            return;
        };
        let m = &self.metrics.semantic;
        for (kind, n) in [
            ("input", f.usage.total_input()),
            ("output", f.usage.output_tokens),
        ] {
            m.deflected_tokens
                .get_or_create(&crate::telemetry::metrics::DeflectedLabels {
                    route: route.to_string(),
                    gen_ai_token_type: kind,
                })
                .inc_by(u64::from(n));
        }
        m.deflected_cost
            .get_or_create(&crate::telemetry::metrics::RouteLabels {
                route: route.to_string(),
            })
            .inc_by(f.cost_usd);
    }
}

/// A target's price table entry.
pub(crate) fn price(entry: &ProviderEntry, model: &str) -> crate::config::Price {
    entry
        .runtime
        .model(model)
        .map(|m| m.price)
        .unwrap_or_default()
}

/// The answer to an admission request.
pub(crate) enum Admission {
    Granted(ProviderEntry, Permit),
    Refused(Refusal),
    /// The actor is gone and no new incarnation appeared in time.
    Unreachable,
}

/// How long a request waits for a restarting provider actor to reappear.
const RESTART_GRACE: Duration = Duration::from_millis(500);

impl Dispatcher {
    /// Asks the candidate's provider actor for a permit. If the actor is
    /// being restarted, waits briefly for its next incarnation.
    /// A busy actor is waited for up to the request's deadline (its mailbox
    /// is a queue, not a failure); a dead one up to [`RESTART_GRACE`].
    async fn admit(
        &self,
        candidate: &Candidate,
        traffic: TrafficClass,
        deadline: Instant,
    ) -> Admission {
        admit(
            &self.registry,
            &candidate.provider,
            &candidate.model,
            traffic,
            deadline,
        )
        .await
    }
}

/// Asks a provider actor for a permit to send one call to `model` (see
/// [`Dispatcher::admit`]); the semantic cache's embedder calls come here too.
pub(crate) async fn admit(
    registry: &Registry,
    provider: &str,
    model: &str,
    traffic: TrafficClass,
    deadline: Instant,
) -> Admission {
    let give_up = Instant::now() + RESTART_GRACE;
    loop {
        let Some(entry) = registry.provider(provider) else {
            return Admission::Unreachable;
        };
        let wait = deadline.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return Admission::Unreachable;
        }
        let answer = entry
            .actor
            .call(
                |reply| ProviderMsg::Admit {
                    model: model.to_string(),
                    class: traffic,
                    reply,
                },
                Some(wait),
            )
            .await;
        match answer {
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

/// Whether a provider's API takes that service tier value.
fn takes_tier(kind: crate::upstream::ProviderKind, tier: &str) -> bool {
    use crate::upstream::ProviderKind as K;
    match kind {
        K::Openai => matches!(tier, "auto" | "default" | "flex" | "priority"),
        K::Anthropic => matches!(tier, "auto" | "standard_only"),
        // Azure, the cloud hosts and Gemini take no tier.
        _ => false,
    }
}

/// Rough prompt size, about four characters a token: the messages (with
/// their tool calls) and the tool definitions.
fn prompt_tokens(chat: &ChatRequest) -> u32 {
    let messages: usize = chat
        .messages
        .iter()
        .map(|m| {
            m.content_bytes()
                + m.role.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.len())
                    .sum::<usize>()
        })
        .sum();
    let tools: usize = chat
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    u32::try_from((messages + tools) / 4)
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Rough usage when the upstream sent none: about four characters a token.
fn estimate_usage(chat: &ChatRequest, output_chars: usize) -> Usage {
    Usage::plain(prompt_tokens(chat), output_chars.div_ceil(4) as u32)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_net_under_every_timer_fires_its_grace_after_the_deadline() {
        let progress = Progress::default();
        let t0 = Instant::now();
        // Before the deadline is known (planning), it never fires.
        assert!(
            tokio::time::timeout(Duration::from_secs(3600), progress.overrun())
                .await
                .is_err()
        );
        let deadline = Instant::now() + Duration::from_secs(3);
        progress.deadline.send_replace(Some(deadline));
        let start = Instant::now();
        progress.overrun().await;
        assert_eq!(start.elapsed(), Duration::from_secs(3) + OVERRUN_GRACE);
        assert!(t0.elapsed() > Duration::from_secs(3600));
    }
}
