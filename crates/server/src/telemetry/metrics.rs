//! Prometheus metrics: OpenTelemetry GenAI names where they apply
//! (`gen_ai_client_operation_duration_seconds`, `gen_ai_client_token_usage`,
//! `gen_ai_server_time_to_first_token_seconds`) plus Switchyard's own SLIs
//! per provider x model and per route. Labels are bounded: provider, model,
//! route, outcome class, tier, traffic class; never request ids or tenants.
//! Recording is lock-free per series; rendering happens at scrape time.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// GenAI semantic-convention labels, in Prometheus form.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GenAiLabels {
    pub gen_ai_provider_name: String,
    pub gen_ai_request_model: String,
    pub gen_ai_operation_name: &'static str,
    /// Switchyard's provider id (a provider name can have several).
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TokenLabels {
    pub gen_ai_provider_name: String,
    pub gen_ai_request_model: String,
    pub gen_ai_operation_name: &'static str,
    pub provider: String,
    pub gen_ai_token_type: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub provider: String,
    pub model: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    pub provider: String,
    pub model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    pub provider: String,
    pub model: String,
    pub from: &'static str,
    pub to: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrafficLabels {
    pub provider: String,
    pub traffic: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub provider: String,
    pub model: String,
    pub reason: &'static str,
}

/// One of a provider's keys, by name (never its value).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabels {
    pub provider: String,
    pub key: String,
    /// `rate_limited`, `quota` or `disabled`.
    pub event: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WindowLabels {
    pub provider: String,
    pub key: String,
    /// `requests` or `tokens`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOutcomeLabels {
    pub route: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActorCallLabels {
    pub actor: &'static str,
    pub message: &'static str,
}

/// The request path's asks of the actors, each series resolved once:
/// `switchyard_actor_calls_total` (`withdraw_retry` and `admit` are calls,
/// `report` a cast; `gate` counts provider permits taken straight from the
/// semaphores, with no message; the bench divides each by the requests
/// served).
#[derive(Clone, Debug)]
pub struct ActorCalls {
    /// Casts: an attempt's outcome, as its provider actor received it.
    pub report: Counter,
    pub withdraw_retry: Counter,
    pub admit: Counter,
    pub gate: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServedLabels {
    /// Shared with the plan: counting an answer copies no string.
    pub route: std::sync::Arc<str>,
    pub tier: &'static str,
    pub provider: std::sync::Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShedLabels {
    pub route: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteTargetLabels {
    pub route: String,
    pub provider: String,
    pub model: String,
}

/// Prompt-cache tokens of served answers, per route and target.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PromptCacheLabels {
    pub route: String,
    pub provider: String,
    pub model: String,
    /// `read` or `write`.
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AffinityLabels {
    pub route: String,
    /// `hit` (served where its prefix was warm), `miss` (no prefix
    /// remembered) or `move` (served elsewhere; the memory moved).
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// `grpc`, `http` or `admin`.
    pub listener: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// The state function that failed: `jobs`, `idempotency`, `cost`, `tenant_limits`, `drain`, `affinity`.
    pub function: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SemanticLabels {
    pub route: String,
    /// `hit`, `miss`, `embedder_slow`, `embedder_unavailable`, `ineligible`.
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EmbedLabels {
    pub route: String,
    /// `ok`, or the failure's outcome class, `refused` or `timeout`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeflectedLabels {
    pub route: String,
    /// `input` or `output`.
    pub gen_ai_token_type: &'static str,
}

/// The semantic cache's series, per route.
pub struct SemanticMetrics {
    pub lookups: Family<SemanticLabels, Counter>,
    pub similarity: Family<RouteLabels, Histogram>,
    pub embed_duration: Family<EmbedLabels, Histogram>,
    pub deflected_tokens: Family<DeflectedLabels, Counter>,
    pub deflected_cost: Family<RouteLabels, Counter<f64, AtomicU64>>,
    pub entries: Family<RouteLabels, Gauge>,
    pub bytes: Family<RouteLabels, Gauge>,
}

impl SemanticMetrics {
    /// What the cache holds for `route` now.
    pub fn set_size(&self, route: String, entries: usize, bytes: usize) {
        let labels = RouteLabels { route };
        self.entries.get_or_create(&labels).set(entries as i64);
        self.bytes.get_or_create(&labels).set(bytes as i64);
    }

    fn register(registry: &mut Registry) -> Self {
        let lookups = Family::<SemanticLabels, Counter>::default();
        registry.register(
            "switchyard_semantic_cache_lookups",
            "Semantic cache lookups by result (hit rate = hit / (hit + miss + embedder_*))",
            lookups.clone(),
        );
        let similarity = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.92, 0.94, 0.96, 0.98, 0.99, 1.0,
            ])
        });
        registry.register(
            "switchyard_semantic_cache_similarity",
            "Cosine similarity of the closest stored question, per lookup that found one",
            similarity.clone(),
        );
        let embed_duration = Family::<EmbedLabels, Histogram>::new_with_constructor(|| {
            // 1 ms .. ~16 s
            Histogram::new(exponential_buckets(0.001, 2.0, 15))
        });
        registry.register_with_unit(
            "switchyard_semantic_cache_embed_duration",
            "Time to embed a question (admission and the embeddings call)",
            prometheus_client::registry::Unit::Seconds,
            embed_duration.clone(),
        );
        let deflected_tokens = Family::<DeflectedLabels, Counter>::default();
        registry.register(
            "switchyard_semantic_cache_deflected_tokens",
            "Tokens of the answers served from the semantic cache instead of an inference",
            deflected_tokens.clone(),
        );
        let deflected_cost = Family::<RouteLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "switchyard_semantic_cache_deflected_cost_usd",
            "What the answers served from the semantic cache cost when generated",
            deflected_cost.clone(),
        );
        let entries = Family::<RouteLabels, Gauge>::default();
        registry.register(
            "switchyard_semantic_cache_entries",
            "Answers held by the semantic cache",
            entries.clone(),
        );
        let bytes = Family::<RouteLabels, Gauge>::default();
        registry.register(
            "switchyard_semantic_cache_bytes",
            "Approximate memory held by the semantic cache",
            bytes.clone(),
        );
        SemanticMetrics {
            lookups,
            similarity,
            embed_duration,
            deflected_tokens,
            deflected_cost,
            entries,
            bytes,
        }
    }
}

fn latency_histogram() -> Histogram {
    // 5 ms .. ~82 s
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

fn token_histogram() -> Histogram {
    // 1 .. ~1M tokens, the GenAI convention's advice
    Histogram::new(exponential_buckets(1.0, 4.0, 11))
}

/// The series one target (provider x model) records into on every attempt,
/// resolved once and kept: the hot path builds and hashes no label sets.
pub struct TargetSeries {
    pub operation_duration: Histogram,
    pub time_to_first_token: Histogram,
    pub input_tokens: Histogram,
    pub output_tokens: Histogram,
    /// The wire kind it was resolved for (a reload may change a provider's).
    kind: &'static str,
    provider: String,
    model: String,
    /// Attempt counters by outcome class (a handful per target).
    attempts: std::sync::RwLock<Vec<(&'static str, Counter)>>,
}

impl TargetSeries {
    /// Counts one sent attempt of this target.
    pub fn count_attempt(&self, metrics: &Metrics, outcome: &'static str) {
        let found = self.attempts.read().ok().and_then(|a| {
            a.iter()
                .find(|(o, _)| *o == outcome)
                .map(|(_, c)| c.clone())
        });
        let counter = found.unwrap_or_else(|| {
            let c = metrics
                .attempts
                .get_or_create(&AttemptLabels {
                    provider: self.provider.clone(),
                    model: self.model.clone(),
                    outcome,
                })
                .clone();
            if let Ok(mut a) = self.attempts.write() {
                a.push((outcome, c.clone()));
            }
            c
        });
        counter.inc();
    }
}

/// provider -> model -> its series. Bounded by the configured targets (a
/// removed provider's few handles stay, as its series do in the families).
type TargetCache = std::collections::HashMap<
    String,
    std::collections::HashMap<String, std::sync::Arc<TargetSeries>>,
>;

/// Every metric Switchyard records. Share it behind an `Arc`.
pub struct Metrics {
    registry: Registry,
    targets: std::sync::RwLock<TargetCache>,
    pub operation_duration: Family<GenAiLabels, Histogram>,
    pub token_usage: Family<TokenLabels, Histogram>,
    pub time_to_first_token: Family<GenAiLabels, Histogram>,
    pub attempts: Family<AttemptLabels, Counter>,
    pub breaker_state: Family<TargetLabels, Gauge>,
    pub breaker_transitions: Family<TransitionLabels, Counter>,
    pub in_flight: Family<TrafficLabels, Gauge>,
    pub permits_refused: Family<RefusalLabels, Counter>,
    pub cooldowns: Family<RefusalLabels, Counter>,
    pub key_events: Family<KeyLabels, Counter>,
    /// What each key has left in its stricter window of each kind.
    pub key_window_remaining: Family<WindowLabels, Gauge>,
    /// Each key's window size (the stricter of configured and reported).
    pub key_window_limit: Family<WindowLabels, Gauge>,
    /// Requests that found no key with room: `admitted` after waiting,
    /// `rate_limited` when the wait ran out.
    pub admission_waits: Family<RouteOutcomeLabels, Counter>,
    /// Request-path asks of the actors, by actor and message.
    pub actor_calls: Family<ActorCallLabels, Counter>,
    /// Hedged requests: `won` (the extra attempt answered first), `lost`
    /// (the first did), `cancelled` (neither produced a token), `budget`
    /// (the retry budget refused the extra attempt).
    pub hedges: Family<RouteOutcomeLabels, Counter>,
    pub failed_stream_tokens: Family<TargetLabels, Counter>,
    pub served: Family<ServedLabels, Counter>,
    pub failover_rate: Family<RouteLabels, Gauge<f64, AtomicU64>>,
    pub shed: Family<ShedLabels, Counter>,
    pub retry_budget_remaining: Family<RouteLabels, Gauge<f64, AtomicU64>>,
    pub queue_depth: Gauge,
    pub queue_oldest_age: Gauge<f64, AtomicU64>,
    pub target_demoted: Family<RouteTargetLabels, Gauge>,
    pub state_errors: Family<StateLabels, Counter>,
    pub connections: Family<ListenerLabels, Gauge>,
    pub connections_refused: Family<ListenerLabels, Counter>,
    pub concurrency_limit: Family<TrafficLabels, Gauge>,
    pub ready: Gauge,
    /// Threads of the async runtime (`server.worker_threads`), read at scrape.
    pub runtime_workers: Gauge,
    pub semantic: SemanticMetrics,
    /// What answers cost (served, and output billed on failed streams).
    pub cost_usd: Family<RouteTargetLabels, Counter<f64, AtomicU64>>,
    pub prompt_cache_tokens: Family<PromptCacheLabels, Counter>,
    pub cache_affinity: Family<AffinityLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let operation_duration =
            Family::<GenAiLabels, Histogram>::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "gen_ai_client_operation_duration",
            "GenAI operation duration (one upstream attempt)",
            prometheus_client::registry::Unit::Seconds,
            operation_duration.clone(),
        );
        let token_usage = Family::<TokenLabels, Histogram>::new_with_constructor(token_histogram);
        registry.register(
            "gen_ai_client_token_usage",
            "Tokens used per operation, by gen_ai_token_type (input/output)",
            token_usage.clone(),
        );
        let time_to_first_token =
            Family::<GenAiLabels, Histogram>::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "gen_ai_server_time_to_first_token",
            "Time from sending the request to the first token",
            prometheus_client::registry::Unit::Seconds,
            time_to_first_token.clone(),
        );
        let attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "switchyard_upstream_attempts",
            "Upstream attempts by outcome class",
            attempts.clone(),
        );
        let breaker_state = Family::<TargetLabels, Gauge>::default();
        registry.register(
            "switchyard_breaker_state",
            "Breaker state per provider x model: 0 closed, 1 half-open, 2 open",
            breaker_state.clone(),
        );
        let breaker_transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "switchyard_breaker_transitions",
            "Breaker state transitions",
            breaker_transitions.clone(),
        );
        let in_flight = Family::<TrafficLabels, Gauge>::default();
        registry.register(
            "switchyard_in_flight",
            "Upstream requests in flight by traffic class (own, failover)",
            in_flight.clone(),
        );
        let permits_refused = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "switchyard_permits_refused",
            "Admissions refused locally (ceiling, breaker, cooldown); never counted against the provider",
            permits_refused.clone(),
        );
        let cooldowns = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "switchyard_cooldowns",
            "Cooldowns started (rate_limited, quota, auth)",
            cooldowns.clone(),
        );
        let key_events = Family::<KeyLabels, Counter>::default();
        registry.register(
            "switchyard_key_events",
            "Key-local answers of a provider with several keys: the key cooled (rate_limited, quota) or was disabled (401/403)",
            key_events.clone(),
        );
        let key_window_remaining = Family::<WindowLabels, Gauge>::default();
        registry.register(
            "switchyard_key_window_remaining",
            "What a key has left in its stricter rate window (configured rpm/tpm or reported by the upstream), by kind (requests, tokens)",
            key_window_remaining.clone(),
        );
        let key_window_limit = Family::<WindowLabels, Gauge>::default();
        registry.register(
            "switchyard_key_window_limit",
            "A key's window size per minute, by kind (requests, tokens): the stricter of its configured rpm/tpm and what the upstream's rate-limit headers say (`switchyard plan` reads it as the upstream's ceiling)",
            key_window_limit.clone(),
        );
        let admission_waits = Family::<RouteOutcomeLabels, Counter>::default();
        registry.register(
            "switchyard_admission_waits",
            "Requests no key had room for in its rate windows: admitted after waiting, or rate_limited",
            admission_waits.clone(),
        );
        let actor_calls = Family::<ActorCallLabels, Counter>::default();
        registry.register(
            "switchyard_actor_calls",
            "What requests asked of the actors: router withdraw_retry and provider admit (calls), provider report (a cast: an attempt's outcome, counted where the actor receives it), and provider gate (a permit taken from the semaphores while the provider's gate was open, no message). A plan and an answer are counted in their route's tally, no message, and are not here",
            actor_calls.clone(),
        );
        let hedges = Family::<RouteOutcomeLabels, Counter>::default();
        registry.register(
            "switchyard_hedges",
            "Hedged first tokens: won (the extra attempt answered), lost (the first did), cancelled (neither produced a token), budget (no budget for the extra attempt)",
            hedges.clone(),
        );
        let failed_stream_tokens = Family::<TargetLabels, Counter>::default();
        registry.register(
            "switchyard_failed_stream_tokens",
            "Output tokens billed on streams that failed after output",
            failed_stream_tokens.clone(),
        );
        let served = Family::<ServedLabels, Counter>::default();
        registry.register(
            "switchyard_requests_served",
            "Requests answered, by route, tier and provider",
            served.clone(),
        );
        let failover_rate = Family::<RouteLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "switchyard_failover_rate",
            "Share of a route's recent requests served by a non-primary target (last 60 s)",
            failover_rate.clone(),
        );
        let shed = Family::<ShedLabels, Counter>::default();
        registry.register(
            "switchyard_requests_shed",
            "Requests refused without an upstream answer, by reason",
            shed.clone(),
        );
        let retry_budget_remaining = Family::<RouteLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "switchyard_retry_budget_remaining",
            "Retries and failovers the route's budget allows right now",
            retry_budget_remaining.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "switchyard_queue_depth",
            "Jobs waiting in the durable queue",
            queue_depth.clone(),
        );
        let queue_oldest_age = Gauge::<f64, AtomicU64>::default();
        registry.register_with_unit(
            "switchyard_queue_oldest_job_age",
            "Age of the oldest waiting job",
            prometheus_client::registry::Unit::Seconds,
            queue_oldest_age.clone(),
        );
        let target_demoted = Family::<RouteTargetLabels, Gauge>::default();
        registry.register(
            "switchyard_target_demoted",
            "1 while health evidence ranks a target below its place in the route order",
            target_demoted.clone(),
        );
        let state_errors = Family::<StateLabels, Counter>::default();
        registry.register(
            "switchyard_state_errors",
            "Calls to the shared state (Redis) that failed or timed out, by function",
            state_errors.clone(),
        );
        let connections = Family::<ListenerLabels, Gauge>::default();
        registry.register(
            "switchyard_connections",
            "Open client connections, by listener",
            connections.clone(),
        );
        let connections_refused = Family::<ListenerLabels, Counter>::default();
        registry.register(
            "switchyard_connections_refused",
            "Connections closed on accept because the listener was at its connection limit",
            connections_refused.clone(),
        );
        let concurrency_limit = Family::<TrafficLabels, Gauge>::default();
        registry.register(
            "switchyard_concurrency_limit",
            "Configured ceiling per provider: traffic=\"all\" max_concurrency, \"failover\" failover_max_concurrency",
            concurrency_limit.clone(),
        );
        let ready = Gauge::default();
        registry.register(
            "switchyard_ready",
            "1 while /readyz answers 200 (started, not draining, some route can serve)",
            ready.clone(),
        );
        let runtime_workers = Gauge::default();
        registry.register(
            "switchyard_runtime_worker_threads",
            "Threads of the async runtime that serves requests (server.worker_threads; default one per core)",
            runtime_workers.clone(),
        );
        let semantic = SemanticMetrics::register(&mut registry);
        let cost_usd = Family::<RouteTargetLabels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "switchyard_cost_usd",
            "What upstream answers cost at the models' prices (cache reads and writes at theirs, reasoning as output), failed streams' output included",
            cost_usd.clone(),
        );
        let prompt_cache_tokens = Family::<PromptCacheLabels, Counter>::default();
        registry.register(
            "switchyard_prompt_cache_tokens",
            "Prompt tokens of served answers read from (kind=read) or written to (kind=write) the upstream's prompt cache",
            prompt_cache_tokens.clone(),
        );
        let cache_affinity = Family::<AffinityLabels, Counter>::default();
        registry.register(
            "switchyard_cache_affinity",
            "Answers of cache_affinity routes: served where their prefix was warm (hit), with no prefix remembered (miss), or elsewhere, the memory moved (move)",
            cache_affinity.clone(),
        );
        if super::alloc::enabled() {
            registry.register_collector(Box::new(super::alloc::AllocCollector));
        }
        Metrics {
            registry,
            semantic,
            cost_usd,
            prompt_cache_tokens,
            cache_affinity,
            targets: std::sync::RwLock::default(),
            connections,
            connections_refused,
            concurrency_limit,
            ready,
            runtime_workers,
            target_demoted,
            state_errors,
            operation_duration,
            token_usage,
            time_to_first_token,
            attempts,
            breaker_state,
            breaker_transitions,
            in_flight,
            permits_refused,
            cooldowns,
            key_events,
            key_window_remaining,
            key_window_limit,
            admission_waits,
            actor_calls,
            hedges,
            failed_stream_tokens,
            served,
            failover_rate,
            shed,
            retry_budget_remaining,
            queue_depth,
            queue_oldest_age,
        }
    }

    /// The actor-call counters, resolved.
    pub fn actor_calls(&self) -> ActorCalls {
        let series = |actor, message| {
            self.actor_calls
                .get_or_create(&ActorCallLabels { actor, message })
                .clone()
        };
        ActorCalls {
            report: series("provider", "report"),
            withdraw_retry: series("router", "withdraw_retry"),
            admit: series("provider", "admit"),
            gate: series("provider", "gate"),
        }
    }

    /// The series of `provider`/`model` (of wire kind `kind`), resolved on
    /// first use.
    pub fn target(
        &self,
        kind: &'static str,
        provider: &str,
        model: &str,
    ) -> std::sync::Arc<TargetSeries> {
        let cached = self
            .targets
            .read()
            .ok()
            .and_then(|t| t.get(provider)?.get(model).cloned())
            .filter(|s| s.kind == kind);
        if let Some(series) = cached {
            return series;
        }
        let labels = GenAiLabels {
            gen_ai_provider_name: kind.to_string(),
            gen_ai_request_model: model.to_string(),
            gen_ai_operation_name: "chat",
            provider: provider.to_string(),
        };
        let tokens = |kind_of: &'static str| {
            self.token_usage
                .get_or_create(&TokenLabels {
                    gen_ai_provider_name: kind.to_string(),
                    gen_ai_request_model: model.to_string(),
                    gen_ai_operation_name: "chat",
                    provider: provider.to_string(),
                    gen_ai_token_type: kind_of,
                })
                .clone()
        };
        let series = std::sync::Arc::new(TargetSeries {
            operation_duration: self.operation_duration.get_or_create(&labels).clone(),
            time_to_first_token: self.time_to_first_token.get_or_create(&labels).clone(),
            input_tokens: tokens("input"),
            output_tokens: tokens("output"),
            kind,
            provider: provider.to_string(),
            model: model.to_string(),
            attempts: std::sync::RwLock::default(),
        });
        if let Ok(mut t) = self.targets.write() {
            t.entry(provider.to_string())
                .or_default()
                .insert(model.to_string(), series.clone());
        }
        series
    }

    /// Counts one upstream attempt that was sent, where it was sent (the
    /// request task or a probe), so a provider actor's restart loses none.
    pub fn count_attempt(&self, provider: &str, model: &str, outcome: &'static str) {
        self.attempts
            .get_or_create(&AttemptLabels {
                provider: provider.to_string(),
                model: model.to_string(),
                outcome,
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// Content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_series_are_resolved_once_and_record_into_the_families() {
        let m = Metrics::new();
        let a = m.target("openai", "primary", "m");
        let b = m.target("openai", "primary", "m");
        assert!(std::sync::Arc::ptr_eq(&a, &b), "one series per target");
        a.count_attempt(&m, "success");
        b.count_attempt(&m, "success");
        a.count_attempt(&m, "server_error");
        a.operation_duration.observe(0.5);
        a.input_tokens.observe(3.0);
        let text = m.render();
        for line in [
            r#"switchyard_upstream_attempts_total{provider="primary",model="m",outcome="success"} 2"#,
            r#"switchyard_upstream_attempts_total{provider="primary",model="m",outcome="server_error"} 1"#,
            r#"gen_ai_client_operation_duration_seconds_count{gen_ai_provider_name="openai",gen_ai_request_model="m",gen_ai_operation_name="chat",provider="primary"} 1"#,
            r#"gen_ai_client_token_usage_count{gen_ai_provider_name="openai",gen_ai_request_model="m",gen_ai_operation_name="chat",provider="primary",gen_ai_token_type="input"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        let other = m.target("openai", "primary", "n");
        assert!(!std::sync::Arc::ptr_eq(&a, &other));
        // A reload that changes the provider's kind gets series of the new kind.
        let renamed = m.target("azure_openai", "primary", "m");
        assert!(!std::sync::Arc::ptr_eq(&a, &renamed));
        renamed.operation_duration.observe(0.1);
        assert!(m
            .render()
            .contains(r#"gen_ai_provider_name="azure_openai",gen_ai_request_model="m""#));
    }
}
