//! The request task: one per call (a stream's own task; a buffered answer's
//! runs in its door's task until the door stops waiting, then on its own).
//! [`Tasks::run`] claims the idempotency key, plans from the router's
//! published route table, serves a fresh stored answer if
//! the route allows one, reserves the cost, walks the live targets
//! (`live.rs`), settles the bill (`bill.rs`), and then takes each rung of the
//! degradation ladder that [`policy::ladder`](crate::policy::ladder) names:
//! a stored answer (`stored.rs`) or the queue (`queued.rs`). Policy comes
//! from the actors and the pure policy tables; this folder carries it out.
//! An embeddings call is the same walk without a ladder (`embed.rs`).

mod admit;
mod bill;
mod continuation;
mod embed;
mod hedge;
pub mod journal;
mod live;
mod queued;
mod stored;
mod takeover;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::actors::client::Actors;
use crate::actors::registry::Registry;
use crate::actors::router::Plan;
use crate::config::{OnCallerGone, Rung};
use crate::error::RequestError;
use crate::policy::backoff::Backoff;
use crate::policy::ladder::{self, Step};
use crate::policy::next::Outcome;
use crate::request::RequestSpec;
use crate::semantic::SemanticCache;
use crate::sink::{EventSink, Tier};
use crate::state::affinity::AffinityMemory;
use crate::state::cache::ResponseCache;
use crate::state::cost::CostLedger;
use crate::state::idempotency::{Idempotency, KeyClaim};
use crate::state::jobs::Jobs;
use crate::state::journal::{Journal, ResumeToken};
use crate::state::limits::KeyLimits;
use crate::state::StateFaults;
use crate::telemetry::metrics::{Metrics, ServedLabels, ShedLabels};

pub use queued::CheckedJob;
pub use takeover::Decode;

/// What every request task shares. Built whole from [`Parts`].
pub struct Tasks {
    actors: Actors,
    metrics: Arc<Metrics>,
    idempotency: Arc<Idempotency>,
    cache: Arc<ResponseCache>,
    /// Near-repeat answers of the routes with a `semantic_cache`.
    semantic: Arc<SemanticCache>,
    cost: Arc<CostLedger>,
    /// Where prompt-cache affinity remembers warm prefixes.
    affinity: Arc<AffinityMemory>,
    /// Every key's rate windows.
    limits: Arc<KeyLimits>,
    backoff: Backoff,
    default_deadline: Duration,
    /// The durable job queue, when configured.
    jobs: Option<Arc<Jobs>>,
    /// The resume journal of streamed answers.
    journal: Journal,
    /// `resume.enabled`: streams are journaled.
    journaling: bool,
    /// `resume.max_streams`: streams journaled at once.
    journal_slots: Arc<tokio::sync::Semaphore>,
    /// How long a journal's owner holds it unrenewed (`state.lease`).
    journal_lease: Duration,
    /// Counts the journal's Redis failures (lease renewals).
    journal_faults: Arc<StateFaults>,
    /// Names a journaled error's row (`api::errors::reason`).
    reason: journal::Reason,
    /// A journal's stored request as a spec again (a takeover).
    decode: Decode,
    /// Cancelled when the drain timeout passes: remaining requests end with
    /// UNAVAILABLE (SERVER_DRAINING) and their upstream calls are dropped.
    abort: CancellationToken,
    /// Requests running now.
    active: AtomicUsize,
}

/// What [`Tasks`] is built from.
pub struct Parts {
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub idempotency: Arc<Idempotency>,
    pub cache: Arc<ResponseCache>,
    pub semantic: Arc<SemanticCache>,
    pub cost: Arc<CostLedger>,
    pub affinity: Arc<AffinityMemory>,
    pub limits: Arc<KeyLimits>,
    pub backoff: Backoff,
    pub default_deadline: Duration,
    pub jobs: Option<Arc<Jobs>>,
    pub journal: Journal,
    pub journaling: bool,
    pub journal_streams: usize,
    pub journal_lease: Duration,
    pub reason: journal::Reason,
    pub decode: Decode,
}

/// How long past its deadline a request task may run before it is ended.
const OVERRUN_GRACE: Duration = Duration::from_secs(5);

/// What a request task has reached, for `Tasks::run`.
#[derive(Default)]
struct Progress {
    /// The route is known to exist: only then may it label a metric.
    planned: AtomicBool,
    /// The whole request's deadline, once computed, and its announcement:
    /// both live in the task (a watch channel allocated per request).
    deadline: std::sync::Mutex<Option<Instant>>,
    deadline_known: tokio::sync::Notify,
}

impl Progress {
    /// The whole request's deadline is known.
    fn set_deadline(&self, deadline: Instant) {
        *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = Some(deadline);
        self.deadline_known.notify_waiters();
    }

    /// Resolves `OVERRUN_GRACE` after the deadline (never before it is known).
    async fn overrun(&self) {
        let deadline = loop {
            // Registered before the deadline is read: a deadline set in
            // between still wakes this wait.
            let known = self.deadline_known.notified();
            tokio::pin!(known);
            known.as_mut().enable();
            if let Some(d) = *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) {
                break d;
            }
            known.await;
        };
        tokio::time::sleep_until(deadline + OVERRUN_GRACE).await;
    }
}

/// Counts a running request for as long as it lives.
struct Running<'a>(&'a AtomicUsize);

impl<'a> Running<'a> {
    fn count(active: &'a AtomicUsize) -> Self {
        active.fetch_add(1, Ordering::Relaxed);
        Running(active)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Tasks {
    pub fn new(parts: Parts) -> Self {
        Tasks {
            actors: Actors::new(parts.registry, parts.metrics.clone()),
            metrics: parts.metrics.clone(),
            idempotency: parts.idempotency,
            cache: parts.cache,
            semantic: parts.semantic,
            cost: parts.cost,
            affinity: parts.affinity,
            limits: parts.limits,
            backoff: parts.backoff,
            default_deadline: parts.default_deadline,
            jobs: parts.jobs,
            journal: parts.journal,
            journaling: parts.journaling,
            journal_slots: Arc::new(tokio::sync::Semaphore::new(parts.journal_streams)),
            journal_lease: parts.journal_lease,
            journal_faults: StateFaults::new(parts.metrics.clone()),
            reason: parts.reason,
            decode: parts.decode,
            abort: CancellationToken::new(),
            active: AtomicUsize::new(0),
        }
    }

    /// Whether a request's bytes as its caller sent them may be stored: by
    /// the `queue` rung (a queue is configured) or a stream's journal on
    /// Redis (another replica continues the stream from them; an
    /// in-process journal dies with the process and keeps none, so a
    /// stream's request is not encoded for it).
    pub fn stores_requests(&self, streaming: bool) -> bool {
        self.jobs.is_some() || (streaming && self.journaling && self.journal.keeps_requests())
    }

    /// The durable job queue, when configured.
    pub fn jobs(&self) -> Option<Arc<Jobs>> {
        self.jobs.clone()
    }

    /// A journal for one of `tenant`'s streams, written as it streams;
    /// `None` when there is no room for one (the stream goes unresumable).
    pub async fn journal_tee(&self, spec: &RequestSpec) -> Option<journal::JournalTee> {
        if !self.journaling {
            return None;
        }
        // At `resume.max_streams` a new stream goes unjournaled (and says
        // so), rather than the journal crowding out the state every request
        // needs.
        let Ok(slot) = self.journal_slots.clone().try_acquire_owned() else {
            tracing::debug!("resume.max_streams streams are journaled: this one is not");
            return None;
        };
        let request = spec.source.as_deref().map_or(&[][..], Vec::as_slice);
        let tee = journal::JournalTee::open(
            &self.journal,
            &spec.tenant,
            request,
            self.journal_lease,
            self.journal_faults.clone(),
            self.reason,
        )
        .await?;
        Some(tee.holding(slot))
    }

    /// A reconnect to one of `tenant`'s streams by its resume token, checked
    /// before anything streams.
    pub async fn follower(
        &self,
        tenant: &str,
        token: &str,
        after_seq: u64,
    ) -> Result<journal::Follower, RequestError> {
        let token = ResumeToken::parse(token).ok_or(RequestError::ResumeNotFound)?;
        journal::Follower::open(&self.journal, tenant, &token, after_seq).await
    }

    /// Requests (and embeddings calls) running now.
    pub fn running(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Ends every running request with SERVER_DRAINING (the drain timeout passed).
    pub fn abort_all(&self) {
        self.abort.cancel();
    }

    /// Runs the request to its end; the outcome reaches the caller through `sink`.
    ///
    /// This future is what a request costs in memory while it waits (a slow
    /// stream holds it for minutes), and it is moved when it is boxed or
    /// spawned: its rare paths (a follow, the ladder below the live
    /// targets, a hedge, a Redis exchange, a send to a caller who is behind)
    /// are boxed when taken, so their state is not stored in every request.
    #[allow(clippy::manual_async_fn)] // on purpose: see the comment inside
    pub fn run(
        self: Arc<Self>,
        spec: RequestSpec,
        mut sink: EventSink,
    ) -> impl std::future::Future<Output = ()> + Send {
        // An `async` block, not an `async fn`: an `async fn` moves its
        // arguments into locals and keeps both copies (spec and sink,
        // about 0.9 KB a request).
        async move {
            let _running = Running::count(&self.active);
            let progress = Progress::default();
            // Scoped: the pinned body borrows the sink until it is dropped.
            let result = {
                let cut_short = std::pin::pin!(async {
                    tokio::select! {
                        _ = self.abort.cancelled() => Err(RequestError::Draining),
                        _ = progress.overrun() => {
                            // Every wait inside has its own timer; this is the net under
                            // them, so no task (and no permit it holds) outlives its deadline.
                            tracing::error!(request_id = %spec.request_id, route = %spec.route, grace = ?OVERRUN_GRACE, "request still running past its deadline: ended");
                            Err(RequestError::DeadlineExceeded { attempts: 0 })
                        }
                    }
                });
                let serve = std::pin::pin!(self.serve(&spec, &mut sink, &progress));
                crate::rare::unless(serve, cut_short).await
            };
            if let Err(e) = result {
                // Draining with output out: the caller moves to another replica
                // and resumes there; the answer goes on from its journal.
                if e == RequestError::Draining && sink.moved().await {
                    return;
                }
                if progress.planned.load(Ordering::Relaxed) {
                    self.count_shed(&spec.route, &e);
                }
                sink.fail(e).await;
            }
            sink.close().await;
        }
    }

    /// The whole request: idempotency, the plan, fresh stored answers, the
    /// cost hold, the live targets, then the rest of the degradation ladder.
    ///
    /// Its parts are functions of their own so that what each keeps across
    /// its waits is not stored in the others' states: the future is as
    /// large as its largest state, and the streaming one is held longest.
    async fn serve(
        self: &Arc<Self>,
        spec: &RequestSpec,
        sink: &mut EventSink,
        progress: &Progress,
    ) -> Result<(), RequestError> {
        let keys = stored::Keys::new(spec);
        let guard = match self
            .claim(spec, &keys, sink.resume_token().map(|t| &**t))
            .await?
        {
            Claimed::Run(guard) => guard,
            // Boxed (a rare path): see `run`.
            Claimed::Stored(named) => return Box::pin(self.serve_named(spec, sink, named)).await,
        };
        let Some(Prepared {
            plan,
            lookup,
            mut bill,
            affinity,
        }) = self.prepare(spec, sink, progress, keys, guard).await?
        else {
            return Ok(());
        };
        let live = self
            .drive(
                spec,
                &plan,
                affinity.as_deref(),
                sink,
                &mut bill,
                Outcome::Begin,
            )
            .await;
        self.settle(bill).await;
        match live {
            Ok(()) => Ok(()),
            Err(e) => Box::pin(self.descend(spec, &plan, &lookup, sink, e)).await,
        }
    }

    /// A request whose idempotency key already names an answer: its replay,
    /// or (a reconnect) its journal followed.
    async fn serve_named(
        self: &Arc<Self>,
        spec: &RequestSpec,
        sink: &mut EventSink,
        named: Stored,
    ) -> Result<(), RequestError> {
        match named {
            Stored::Replayed(events) => {
                stored::replay(sink, &events, spec, |f| f.replayed = true).await;
                Ok(())
            }
            Stored::Follow { token, stored } => {
                let followed = match self.follower(&spec.tenant, token.as_str(), 0).await {
                    Ok(follower) => self.read_on(follower, sink).await,
                    Err(e) => Err(e),
                };
                match (followed, stored) {
                    // The journal is gone before anything streamed: the
                    // key's stored answer is the same stream.
                    (
                        Err(RequestError::ResumeNotFound | RequestError::ResumeExpired),
                        Some(events),
                    ) => {
                        stored::replay(sink, &events, spec, |f| f.replayed = true).await;
                        Ok(())
                    }
                    (followed, _) => followed,
                }
            }
        }
    }

    /// Everything before the live targets: the plan, a fresh stored answer
    /// (`None`: it served the request), the deadline, the cost hold and
    /// the cache affinity.
    async fn prepare<'a>(
        self: &Arc<Self>,
        spec: &'a RequestSpec,
        sink: &mut EventSink,
        progress: &Progress,
        keys: stored::Keys<'a>,
        guard: Option<crate::state::idempotency::KeyGuard>,
    ) -> Result<Option<Prepared<'a>>, RequestError> {
        let mut plan = self.plan(spec).await?;
        progress.planned.store(true, Ordering::Relaxed);
        sink.finish_when_gone(match plan.on_caller_gone {
            Some(gone) => gone == OnCallerGone::Finish,
            None => spec.idempotency_key.is_some(),
        });
        within_max_tokens(spec, &plan)?;
        let mut lookup = self.lookup(spec, &plan, keys);
        if self.serve_fresh(&mut lookup, spec, &plan, sink).await {
            return Ok(None);
        }
        self.record(&lookup, &plan, guard, sink);
        // The whole request's deadline: every attempt and the cost hold fit it.
        let deadline = spec.deadline.unwrap_or_else(|| {
            let within = plan.deadline.unwrap_or(self.default_deadline);
            crate::policy::clock::after(Instant::now(), within)
        });
        sink.set_deadline(deadline);
        progress.set_deadline(deadline);
        let bill = self.reserve(spec, &plan, deadline).await?;
        let affinity = self.affinity_place(spec, &mut plan).await;
        Ok(Some(Prepared {
            plan,
            lookup,
            bill,
            affinity,
        }))
    }

    /// Claims the request's idempotency key, if it has one, for a stream
    /// journaled as `resume`. A reconnect (`resume_after_seq` set) of a
    /// key's journaled stream follows its journal from the start (the door
    /// skips what the caller holds), or replays its stored answer once the
    /// journal is gone; one whose key no longer names anything is
    /// RESUME_NOT_FOUND unless it held nothing yet.
    async fn claim(
        &self,
        spec: &RequestSpec,
        keys: &stored::Keys<'_>,
        resume: Option<&str>,
    ) -> Result<Claimed, RequestError> {
        let Some(key) = spec.scoped_key() else {
            return Ok(Claimed::Run(None));
        };
        let claim = self
            .idempotency
            .claim(&key, keys.fingerprint(), resume, Instant::now())
            .await?;
        let reconnect = spec.resume_after;
        let journaled = |resume: Option<String>| resume.as_deref().and_then(ResumeToken::parse);
        match claim {
            KeyClaim::Fresh(_) if reconnect.is_some_and(|after| after > 0) => {
                Err(RequestError::ResumeNotFound)
            }
            KeyClaim::Fresh(guard) => Ok(Claimed::Run(Some(guard))),
            KeyClaim::Replay { events, resume } => match (reconnect, journaled(resume)) {
                (Some(_), Some(token)) => Ok(Claimed::Stored(Stored::Follow {
                    token,
                    stored: Some(events),
                })),
                _ => Ok(Claimed::Stored(Stored::Replayed(events))),
            },
            KeyClaim::InUse { resume } => match (reconnect, journaled(resume)) {
                (Some(_), Some(token)) => Ok(Claimed::Stored(Stored::Follow {
                    token,
                    stored: None,
                })),
                _ => Err(RequestError::IdempotencyKeyInUse),
            },
            KeyClaim::Mismatch => Err(RequestError::IdempotencyKeyReused),
        }
    }

    /// The route's ranked targets for this request.
    async fn plan(&self, spec: &RequestSpec) -> Result<Plan, RequestError> {
        self.actors
            .plan(&spec.route, &spec.needs, spec.pin.as_deref())
            .await
    }

    /// The rest of the ladder after the live targets failed with `e`, in the
    /// route's order, each rung as `policy::ladder` says.
    async fn descend(
        &self,
        spec: &RequestSpec,
        plan: &Plan,
        lookup: &stored::Lookup<'_>,
        sink: &mut EventSink,
        e: RequestError,
    ) -> Result<(), RequestError> {
        let caller = ladder::Caller {
            committed: sink.committed(),
            from_queue: spec.from_queue,
        };
        let mut from = 0;
        loop {
            let (rung, at) = match ladder::after_live(&plan.ladder, from, &e, caller) {
                Step::Try { rung, at } => (rung, at),
                Step::Stop => return Err(e),
            };
            from = at + 1;
            let served = match rung {
                Rung::Cache => self.serve_cached(lookup, spec, plan, sink, &e).await,
                Rung::SemanticCache => self.serve_similar(lookup, spec, plan, sink, &e).await,
                Rung::Queue => self.serve_queued(spec, plan, sink, &e).await?,
                Rung::Fallback | Rung::Downshift | Rung::Refuse => false,
            };
            if served {
                return Ok(());
            }
        }
    }

    /// Counts an answered request by route, tier and who answered.
    fn count_served(&self, route: &Arc<str>, tier: Tier, provider: &Arc<str>) {
        self.metrics
            .served
            .get_or_create(&ServedLabels {
                route: route.clone(),
                tier: tier.as_str(),
                provider: provider.clone(),
            })
            .inc();
    }

    /// Counts a request shed for a reason the metric names.
    fn count_shed(&self, route: &str, e: &RequestError) {
        if let Some(reason) = e.shed_reason() {
            self.metrics
                .shed
                .get_or_create(&ShedLabels {
                    route: route.to_string(),
                    reason,
                })
                .inc();
        }
    }
}

/// What a request runs its live targets with ([`Tasks::prepare`]).
struct Prepared<'a> {
    plan: Plan,
    lookup: stored::Lookup<'a>,
    bill: bill::Bill<'a>,
    affinity: Option<Box<live::Affinity>>,
}

/// What the idempotency claim left to do.
enum Claimed {
    /// Run the request (holding the key's guard, if it has a key).
    Run(Option<crate::state::idempotency::KeyGuard>),
    /// Answer from what the key already names.
    Stored(Stored),
}

/// An answer an idempotency key already names.
enum Stored {
    /// The key's first answer, to be replayed.
    Replayed(Arc<Vec<crate::sink::Event>>),
    /// A reconnect: stream the key's journal (or, once it is gone, the
    /// key's stored answer if it finished).
    Follow {
        token: ResumeToken,
        stored: Option<Arc<Vec<crate::sink::Event>>>,
    },
}

/// Refuses a `max_tokens` above the route's limit.
fn within_max_tokens(spec: &RequestSpec, plan: &Plan) -> Result<(), RequestError> {
    match (plan.max_tokens_limit, spec.chat.max_tokens) {
        (Some(limit), Some(asked)) if asked > limit => Err(RequestError::InvalidRequest(format!(
            "max_tokens: {asked} exceeds route `{}`'s limit of {limit}",
            plan.route
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    /// The size of what `f` returns, without calling it.
    fn returned_size<A, B, C, R>(_: &impl Fn(A, B, C) -> R) -> usize {
        std::mem::size_of::<R>()
    }

    /// A request's future is what every open stream holds for its whole
    /// life (a slow stream, for minutes): 5,608 bytes in this (debug)
    /// build today, 8,784 before its parts were split and its rare parts
    /// boxed. In a release build it is about 100 bytes larger and tokio's
    /// task around it takes 6,016 bytes, in mimalloc's 6 KiB size class:
    /// past 6,144 every open stream's task takes the 7 KiB class (it did,
    /// for two commits, when a plan's candidates went inline and the
    /// request's bytes became a 32-byte `Bytes`). Held here.
    #[test]
    fn a_request_future_stays_small() {
        let size = returned_size(&Tasks::run);
        eprintln!("request future: {size} bytes");
        assert!(size <= 5_700, "a request's future is {size} bytes");
    }

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
        progress.set_deadline(deadline);
        let start = Instant::now();
        progress.overrun().await;
        assert_eq!(start.elapsed(), Duration::from_secs(3) + OVERRUN_GRACE);
        assert!(t0.elapsed() > Duration::from_secs(3600));
    }
}
