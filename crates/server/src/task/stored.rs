//! Stored answers in the request task: the exact response cache and the
//! semantic cache as rungs of the ladder (fresh ones before the live
//! targets when the route allows it, any age after they failed), the
//! recording that fills both caches and completes the idempotency key, and
//! the replay that serves a stored answer labelled with its tier, age and
//! similarity. Whether a rung is taken is `policy::ladder`'s decision.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

use super::Tasks;
use crate::actors::router::Plan;
use crate::config::Rung;
use crate::error::RequestError;
use crate::policy::ladder;
use crate::request::{CacheOwner, RequestSpec};
use crate::semantic::lookup::{self, Pending};
use crate::sink::{Event, EventSink, Finished, Tier};
use crate::state::idempotency::{Fingerprint, KeyGuard};

/// A request's digests, computed only when a cache or an idempotency key
/// needs them.
pub(super) struct Keys<'a> {
    spec: &'a RequestSpec,
    digest: OnceLock<Fingerprint>,
}

impl<'a> Keys<'a> {
    pub(super) fn new(spec: &'a RequestSpec) -> Self {
        Keys {
            spec,
            digest: OnceLock::new(),
        }
    }

    /// The request's fingerprint (the idempotency store's, and the cache key's base).
    pub(super) fn fingerprint(&self) -> Fingerprint {
        *self.digest.get_or_init(|| self.spec.fingerprint())
    }

    /// The response cache's key: the request within `owner`'s scope.
    fn cache_key(&self, owner: CacheOwner<'_>) -> Fingerprint {
        self.spec.cache_key(&self.fingerprint(), owner)
    }
}

/// Where a request may find a stored answer.
pub(super) struct Lookup<'a> {
    keys: Keys<'a>,
    /// Its tenant's scope (or every tenant's, on a route that shares its caches).
    owner: CacheOwner<'a>,
    /// The question on its way to the semantic cache, on a route with one
    /// (boxed: every open stream's request holds a lookup, and most routes
    /// have no semantic cache).
    semantic: Option<Box<Pending>>,
}

impl Lookup<'_> {
    fn cache_key(&self) -> Fingerprint {
        self.keys.cache_key(self.owner)
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

impl Tasks {
    /// Where the request may find a stored answer: its cache keys so far.
    pub(super) fn lookup<'a>(
        &self,
        spec: &'a RequestSpec,
        plan: &Plan,
        keys: Keys<'a>,
    ) -> Lookup<'a> {
        Lookup {
            keys,
            owner: spec.cache_owner(plan.shared_across_tenants),
            semantic: None,
        }
    }

    /// Serves a fresh stored answer before any live attempt, where the
    /// route allows it (`policy::ladder::before_live`): the exact cache
    /// within `serve_fresh_within`, then the semantic cache within its
    /// `fresh_within`. The question is sent to be embedded (on a route with
    /// a semantic cache) once the exact cache has not answered, for this
    /// rung or the ones after the live targets.
    pub(super) async fn serve_fresh(
        &self,
        lookup: &mut Lookup<'_>,
        spec: &RequestSpec,
        plan: &Plan,
        sink: &mut EventSink,
    ) -> bool {
        let semantic_within = plan.semantic.as_ref().and_then(|c| c.fresh_within);
        for (rung, within) in ladder::before_live(plan.serve_fresh_within, semantic_within) {
            let served = match rung {
                Rung::Cache => {
                    match self
                        .cache
                        .get(&lookup.cache_key(), Some(within), Instant::now())
                    {
                        Some(hit) => {
                            self.serve_stored(sink, spec, &plan.route, Stored::exact(&hit), 0)
                                .await;
                            true
                        }
                        None => false,
                    }
                }
                _ => {
                    self.begin_semantic(lookup, spec, plan);
                    match lookup.semantic.as_ref() {
                        Some(p) => {
                            match lookup::hit(&self.semantic, &self.metrics, p, true).await {
                                Some(hit) => {
                                    self.serve_stored(
                                        sink,
                                        spec,
                                        &plan.route,
                                        Stored::semantic(&hit),
                                        0,
                                    )
                                    .await;
                                    true
                                }
                                None => false,
                            }
                        }
                        None => false,
                    }
                }
            };
            if served {
                return true;
            }
        }
        self.begin_semantic(lookup, spec, plan);
        false
    }

    /// Sends the question to be embedded, once (a route with a semantic cache).
    fn begin_semantic(&self, lookup: &mut Lookup<'_>, spec: &RequestSpec, plan: &Plan) {
        if lookup.semantic.is_none() {
            lookup.semantic = lookup::begin(&self.actors, &self.metrics, spec, plan).map(Box::new);
        }
    }

    /// Keeps the answer once it is finished: into the exact cache (on a
    /// route that serves from it), the semantic cache (on a route with
    /// one), and the idempotency key's record.
    pub(super) fn record(
        &self,
        lookup: &Lookup<'_>,
        plan: &Plan,
        guard: Option<KeyGuard>,
        sink: &mut EventSink,
    ) {
        let caches = plan.has_rung(Rung::Cache) || plan.serve_fresh_within.is_some();
        if !caches && guard.is_none() && lookup.semantic.is_none() {
            return;
        }
        let cache = caches.then(|| (self.cache.clone(), plan.cache_ttl, lookup.cache_key()));
        let fill = lookup
            .semantic
            .as_deref()
            .cloned()
            .map(|p| (self.semantic.clone(), self.metrics.clone(), p));
        sink.record(Box::new(move |events| {
            Box::pin(async move {
                // An answer a cache rung served is stored already (and
                // storing it again would reset its age).
                let fresh = !events.iter().any(|e| {
                    matches!(e, Event::Finished(f) if matches!(f.tier, Tier::Cache | Tier::SemanticCache))
                });
                if let Some((semantic, metrics, pending)) = fill.filter(|_| fresh) {
                    lookup::fill(semantic, metrics, pending, events.clone());
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

    /// The `cache` rung: the last good answer, of any age.
    pub(super) async fn serve_cached(
        &self,
        lookup: &Lookup<'_>,
        spec: &RequestSpec,
        plan: &Plan,
        sink: &mut EventSink,
        e: &RequestError,
    ) -> bool {
        let Some(hit) = self.cache.get(&lookup.cache_key(), None, Instant::now()) else {
            return false;
        };
        tracing::warn!(request_id = %spec.request_id, route = %plan.route, age_ms = hit.age.as_millis() as u64, error = %e, "no live answer; serving the cached one");
        let stored = Stored::exact(&hit);
        self.serve_stored(sink, spec, &plan.route, stored, e.attempts())
            .await;
        true
    }

    /// The `semantic_cache` rung: the closest stored answer, of any age.
    pub(super) async fn serve_similar(
        &self,
        lookup: &Lookup<'_>,
        spec: &RequestSpec,
        plan: &Plan,
        sink: &mut EventSink,
        e: &RequestError,
    ) -> bool {
        let Some(p) = &lookup.semantic else {
            return false;
        };
        let Some(hit) = lookup::hit(&self.semantic, &self.metrics, p, false).await else {
            return false;
        };
        tracing::warn!(request_id = %spec.request_id, route = %plan.route, age_ms = hit.age.as_millis() as u64, similarity = hit.similarity, error = %e, "no live answer; serving the closest stored one");
        let stored = Stored::semantic(&hit);
        self.serve_stored(sink, spec, &plan.route, stored, e.attempts())
            .await;
        true
    }

    /// Serves a stored answer labelled as such (its tier, age and, from the
    /// semantic cache, similarity); it cost nothing now. Counts it served
    /// and, for the semantic tier, what it deflected.
    async fn serve_stored(
        &self,
        sink: &mut EventSink,
        spec: &RequestSpec,
        route: &std::sync::Arc<str>,
        stored: Stored<'_>,
        attempts: u32,
    ) {
        self.count_served(route, stored.tier, &stored.tier.as_str().into());
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

/// Replays stored events as a new answer, re-stamped for this request.
pub(super) async fn replay(
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
