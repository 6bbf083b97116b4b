//! The semantic cache in the request path. A request on a route with a
//! `semantic_cache` gets its question embedded in a task of its own, right
//! after planning, through the embedder's provider actor (admission,
//! breaker, ceilings, one outcome report) like any attempt. The live path
//! never waits for it: only a fresh-hit lookup does, and never longer than
//! the route's `lookup_timeout`; an embedder that is slow or down means a
//! skipped cache, never a failed request. The finished answer is stored
//! from the recording, in the background, with the same embedding.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{BoxFuture, FutureExt, Shared};
use tokio::time::{timeout_at, Instant};

use super::{embed, index, query, Bounds, Found, Hit, SemanticCache};
use crate::actors::client::{Actors, Admission};
use crate::actors::provider::{self, TrafficClass};
use crate::actors::router::Plan;
use crate::chat::FinishReason;
use crate::config::SemanticCacheConfig;
use crate::policy::outcome::OutcomeClass;
use crate::request::RequestSpec;
use crate::sink::Event;
use crate::state::idempotency::Fingerprint;
use crate::telemetry::metrics::{AttemptLabels, EmbedLabels, Metrics, RouteLabels, SemanticLabels};

/// How long the fill may wait for a question's embedding (lookups wait
/// only `lookup_timeout`).
const FILL_WAIT: Duration = Duration::from_secs(10);

/// One request's question on its way to the semantic cache.
#[derive(Clone)]
pub struct Pending {
    route: String,
    pub cfg: Arc<SemanticCacheConfig>,
    scope: Fingerprint,
    /// A lookup waits for the embedding until then: `lookup_timeout` after
    /// the start, and never more than half the caller's remaining deadline.
    lookup_until: Instant,
    /// The question's unit vector, or `None` if the embedder did not give one.
    vector: Shared<BoxFuture<'static, Option<Arc<Vec<f32>>>>>,
}

impl Pending {
    fn bounds(&self) -> Bounds {
        Bounds {
            max_entries: self.cfg.max_entries,
            max_bytes: self.cfg.max_bytes,
            ttl: self.cfg.ttl,
        }
    }
}

fn count(metrics: &Metrics, route: &str, result: &'static str) {
    metrics
        .semantic
        .lookups
        .get_or_create(&SemanticLabels {
            route: route.to_string(),
            result,
        })
        .inc();
}

/// Starts embedding the request's question if its route has a semantic
/// cache and the request may use it.
pub(crate) fn begin(
    actors: &Actors,
    metrics: &Arc<Metrics>,
    spec: &RequestSpec,
    plan: &Plan,
) -> Option<Pending> {
    let cfg = plan.semantic.clone()?;
    let owner = spec.cache_owner(plan.shared_across_tenants);
    let q = match query::query(spec, plan.side_effects, owner, &cfg) {
        Ok(q) => q,
        Err(skip) => {
            tracing::debug!(request_id = %spec.request_id, route = %plan.route, reason = skip.as_str(), "semantic cache not used");
            count(metrics, &plan.route, "ineligible");
            return None;
        }
    };
    let started = Instant::now();
    let task = tokio::spawn(embed_question(
        actors.clone(),
        metrics.clone(),
        plan.route.to_string(),
        cfg.clone(),
        q.question,
        started + FILL_WAIT,
    ));
    let vector = async move { task.await.ok().flatten() }.boxed().shared();
    let budget = spec.deadline.map_or(cfg.lookup_timeout, |d| {
        cfg.lookup_timeout
            .min(d.saturating_duration_since(started) / 2)
    });
    Some(Pending {
        route: plan.route.to_string(),
        cfg,
        scope: q.scope,
        lookup_until: started + budget,
        vector,
    })
}

/// The closest stored answer at the route's threshold (younger than
/// `fresh_within` when `fresh`), waiting for the question's embedding
/// no longer than the route's `lookup_timeout` (or half the caller's
/// remaining deadline, if less).
pub(crate) async fn hit(
    cache: &SemanticCache,
    metrics: &Metrics,
    p: &Pending,
    fresh: bool,
) -> Option<Hit> {
    let vector = match timeout_at(p.lookup_until, p.vector.clone()).await {
        Ok(Some(v)) => v,
        Ok(None) => {
            count(metrics, &p.route, "embedder_unavailable");
            return None;
        }
        Err(_) => {
            count(metrics, &p.route, "embedder_slow");
            return None;
        }
    };
    let max_age = if fresh { p.cfg.fresh_within } else { None };
    let found = cache.lookup(
        &p.route,
        &p.scope,
        &vector,
        p.cfg.threshold,
        max_age,
        Instant::now(),
    );
    let similarity = |s: f32| {
        metrics
            .semantic
            .similarity
            .get_or_create(&RouteLabels {
                route: p.route.clone(),
            })
            .observe(f64::from(s));
    };
    match found {
        Found::Hit(hit) => {
            similarity(hit.similarity);
            count(metrics, &p.route, "hit");
            Some(hit)
        }
        Found::Miss(best) => {
            best.map(similarity);
            count(metrics, &p.route, "miss");
            None
        }
    }
}

/// Stores a finished answer under its question, in the background (the
/// caller's `Finished` does not wait). Refusals are not stored.
pub(crate) fn fill(
    cache: Arc<SemanticCache>,
    metrics: Arc<Metrics>,
    p: Pending,
    events: Vec<Event>,
) {
    let refused = events.iter().any(|e| {
        matches!(e, Event::Finished(f) if matches!(f.finish_reason, FinishReason::Refusal | FinishReason::ContentFilter))
    });
    if refused {
        return;
    }
    tokio::spawn(async move {
        let Some(vector) = p.vector.clone().await else {
            return;
        };
        let bounds = p.bounds();
        cache.insert(
            &p.route,
            p.scope,
            vector.as_ref().clone(),
            events,
            &bounds,
            Instant::now(),
        );
        let (entries, bytes) = cache.size(&p.route);
        metrics.semantic.set_size(p.route, entries, bytes);
    });
}

/// Embeds one question through the embedder's provider actor; `None` when
/// it could not (refused, failed, past `limit`). Records the duration.
async fn embed_question(
    actors: Actors,
    metrics: Arc<Metrics>,
    route: String,
    cfg: Arc<SemanticCacheConfig>,
    question: String,
    limit: Instant,
) -> Option<Arc<Vec<f32>>> {
    let (provider, model) = cfg.embedder.split_once('/')?;
    let started = Instant::now();
    let result = embed_once(&actors, &metrics, provider, model, &question, limit).await;
    let outcome = match &result {
        Ok(_) => "ok",
        Err(why) => why,
    };
    metrics
        .semantic
        .embed_duration
        .get_or_create(&EmbedLabels {
            route: route.clone(),
            outcome,
        })
        .observe(started.elapsed().as_secs_f64());
    match result {
        Ok(v) => index::normalized(v).map(Arc::new),
        Err(why) => {
            tracing::debug!(%route, embedder = %cfg.embedder, outcome = why, "no embedding: the semantic cache is skipped");
            None
        }
    }
}

/// One embeddings call, admitted and reported like an attempt. The error
/// is the outcome label.
async fn embed_once(
    actors: &Actors,
    metrics: &Metrics,
    provider_id: &str,
    model: &str,
    question: &str,
    limit: Instant,
) -> Result<Vec<f32>, &'static str> {
    let admission = actors
        .take_permit(provider_id, &model.into(), TrafficClass::Own, limit)
        .await;
    let (entry, mut permit) = match admission {
        Admission::Granted(entry, permit) => (entry, permit),
        Admission::Refused(_) | Admission::Unreachable => return Err("refused"),
    };
    permit.mark_sent();
    let sent = Instant::now();
    let answer = timeout_at(
        limit,
        embed::fetch(&entry.runtime.endpoint, model, question),
    )
    .await;
    let class = match &answer {
        Ok(Ok(_)) => OutcomeClass::Ok,
        Ok(Err(f)) => f.class,
        Err(_) => OutcomeClass::Timeout,
    };
    metrics
        .attempts
        .get_or_create(&AttemptLabels {
            provider: provider_id.to_string(),
            model: model.to_string(),
            outcome: class.as_str(),
        })
        .inc();
    permit.report(provider::Outcome {
        class,
        retry_after: match &answer {
            Ok(Err(f)) => f.retry_after,
            _ => None,
        },
        elapsed: sent.elapsed(),
        ttft: None,
        failed_output_tokens: 0,
    });
    match answer {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(_)) => Err(class.as_str()),
        Err(_) => Err("timeout"),
    }
}
