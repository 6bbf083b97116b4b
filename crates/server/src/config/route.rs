//! `[[routes]]`: targets with weights, the ladder, caches, affinity,
//! semantic cache and the per-route policies.
use super::*;

/// A route's `embedding_family_failover`: which other targets an embeddings
/// request may fail over to.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum FamilyFailover {
    /// Only targets of the family of the route's first `embeddings` target
    /// (vectors of other models are not comparable).
    #[default]
    Same,
    /// Any `embeddings` target of the route.
    Any,
}

/// What a route does when its serving upstream fails after output was sent.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum MidStreamPolicy {
    /// End the stream with UNAVAILABLE (UPSTREAM_STREAM_TRUNCATED).
    #[default]
    Fail,
    /// Send `Reset` (the caller discards the partial output) and serve from the next target.
    Reset,
    /// Keep the partial output: a target that can continue it (declares
    /// `continuation`, see `policy::continuation`) is given it as an
    /// assistant prefill and only its new text follows a `Continued` event;
    /// where none can, as `reset` (or `fail` for a caller that cannot reset).
    Continue,
}

/// What a journaled stream's request does when its caller hangs up.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnCallerGone {
    /// The answer completes into the journal and is billed once: a
    /// reconnect (resume token or idempotency key) gets all of it.
    Finish,
    /// The upstream request is cancelled at once; what streamed is billed.
    Cancel,
}

/// One target of a route: `"provider/model"`, or a table with a priority and weight.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteTarget {
    /// `provider/model`.
    pub target: String,
    /// Lower is preferred; defaults to the position in the list. Targets of
    /// equal priority (and equal health) share load by `weight`.
    pub priority: Option<u32>,
    pub weight: u32,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RouteTargetRepr {
    Name(String),
    Table(RouteTargetTable),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteTargetTable {
    target: String,
    #[serde(default)]
    priority: Option<u32>,
    #[serde(default = "default_weight")]
    weight: u32,
}

pub(super) fn default_weight() -> u32 {
    1
}

impl<'de> Deserialize<'de> for RouteTarget {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match RouteTargetRepr::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected \"provider/model\" or { target = \"provider/model\", priority = N, weight = N }",
            )
        })? {
            RouteTargetRepr::Name(target) => Ok(RouteTarget {
                target,
                priority: None,
                weight: 1,
            }),
            RouteTargetRepr::Table(t) => Ok(RouteTarget {
                target: t.target,
                priority: t.priority,
                weight: t.weight,
            }),
        }
    }
}

impl From<&str> for RouteTarget {
    fn from(target: &str) -> Self {
        RouteTarget {
            target: target.to_string(),
            priority: None,
            weight: 1,
        }
    }
}

/// `[[routes]]`: a name callers use and the targets that may serve it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub name: String,
    /// In fallback order; the first is the primary.
    pub targets: Vec<RouteTarget>,
    /// Upstream attempts per request across all targets (retries and failovers included).
    #[serde(default = "default_max_attempts")]
    pub max_attempts: u32,
    #[serde(default)]
    pub mid_stream: MidStreamPolicy,
    /// What a streamed request does when its caller hangs up; unset:
    /// `finish` for a request with an idempotency key, `cancel` otherwise.
    #[serde(default)]
    pub on_caller_gone: Option<OnCallerGone>,
    /// The upstream call has effects beyond its answer: never retried or
    /// failed over once a request was sent (a refused connection still fails over).
    #[serde(default)]
    pub side_effects: bool,
    /// `max_tokens` for requests that leave it at 0.
    #[serde(default)]
    pub default_max_tokens: Option<u32>,
    /// The upstream service tier asked for, passed to the providers that take
    /// that value: OpenAI `auto`, `default`, `flex`, `priority`; Anthropic
    /// `auto`, `standard_only`. Others never see it.
    #[serde(default)]
    pub service_tier: Option<String>,
    /// Deadline for requests without `grpc-timeout` (overrides the server default).
    #[serde(default, with = "crate::config::duration::option")]
    pub deadline: Option<Duration>,
    /// The rungs that may answer when the live targets cannot, in order.
    #[serde(default = "default_ladder")]
    pub ladder: Vec<Rung>,
    /// Cheaper targets validated for this route, tried after the regular
    /// ones when the ladder has `downshift`; answers are marked DOWNSHIFT.
    #[serde(default)]
    pub downshift: Vec<RouteTarget>,
    /// How long a good answer stays in the response cache (the `cache` rung
    /// and `serve_fresh_within` read it).
    #[serde(default = "default_cache_ttl", with = "crate::config::duration")]
    pub cache_ttl: Duration,
    /// Answer from the cache, without an upstream call, when a stored answer
    /// is younger than this (off when absent).
    #[serde(default, with = "crate::config::duration::option")]
    pub serve_fresh_within: Option<Duration>,
    /// Highest `max_tokens` a caller may ask for on this route.
    #[serde(default)]
    pub max_tokens_limit: Option<u32>,
    /// Near-repeat questions answered from earlier answers (opt in).
    #[serde(default)]
    pub semantic_cache: Option<SemanticCacheConfig>,
    /// The `downshift` rung uses only targets the route's last golden-set
    /// validation (`switchyard golden`) passed.
    #[serde(default)]
    pub require_validated: bool,
    /// The route's exact and semantic caches are shared by every tenant
    /// (public content only). Off: each tenant reads only its own answers.
    #[serde(default)]
    pub shared_across_tenants: bool,
    /// While the fleet's cost ledger (Redis) cannot be asked, a capped
    /// tenant's requests are refused (STATE_UNAVAILABLE) instead of spending
    /// this replica's allowance.
    #[serde(default)]
    pub fail_closed: bool,
    /// `/v1/embeddings` and `Router.Embed`: fail over only within the
    /// family of the route's first `embeddings` target (`same`), or to any
    /// of its `embeddings` targets (`any`).
    #[serde(default)]
    pub embedding_family_failover: FamilyFailover,
    /// Prompt-cache affinity (opt in): requests whose cacheable prefix
    /// hashes the same go to the target and key where it is warm.
    #[serde(default)]
    pub cache_affinity: Option<CacheAffinityConfig>,
    /// How long a request that no key of any target has room for (their
    /// rate windows, configured or reported) waits for the earliest window
    /// to reset before RATE_LIMITED; bounded by the request's deadline.
    #[serde(default, with = "crate::config::duration")]
    pub admission_wait: Duration,
    /// `interactive` (the default) or `batch`: batch work yields a short
    /// window to waiting interactive requests (jobs and Batch API lines
    /// are batch on any route).
    #[serde(default)]
    pub priority: TrafficPriority,
    /// The share of a key's window batch work may use while interactive
    /// requests wait for it, in (0, 1].
    #[serde(default = "default_batch_share")]
    pub batch_share: f64,
    /// Hedged first tokens: `hedge = { after = "p95" | "<duration>", max_extra = 1 }`.
    #[serde(default)]
    pub hedge: Option<HedgeConfig>,
}

/// A route's `priority`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum TrafficPriority {
    #[default]
    Interactive,
    Batch,
}

pub(super) fn default_batch_share() -> f64 {
    0.5
}

/// A route's `hedge`: when the first attempt has produced no token by
/// `after`, a second attempt starts on the next eligible target; the first
/// to produce a token answers and the other is cancelled.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HedgeConfig {
    pub after: HedgeAfter,
    /// Extra attempts per request, each paid from the retry budget.
    #[serde(default = "default_max_extra")]
    pub max_extra: u32,
}

fn default_max_extra() -> u32 {
    1
}

/// When a hedge starts: the target's p95 time to first token, or a fixed wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HedgeAfter {
    P95,
    After(Duration),
}

impl<'de> Deserialize<'de> for HedgeAfter {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        if text == "p95" {
            return Ok(HedgeAfter::P95);
        }
        humantime::parse_duration(&text)
            .map(HedgeAfter::After)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "hedge.after: `{text}` is neither \"p95\" nor a duration ({e})"
                ))
            })
    }
}

/// A route's `cache_affinity = { ttl = "5m" }`.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CacheAffinityConfig {
    /// How long a prefix counts as warm at the target that last served it
    /// (refreshed by every answer that reuses it): the upstream's cache
    /// lifetime, 1s..=24h.
    #[serde(default = "default_affinity_ttl", with = "crate::config::duration")]
    pub ttl: Duration,
}

pub(super) fn default_affinity_ttl() -> Duration {
    Duration::from_secs(300)
}

/// A route's `semantic_cache = { embedder = "provider/model", threshold = 0.92, ... }`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SemanticCacheConfig {
    /// `provider/model` of a model with the `embeddings` capability on an
    /// `openai`-kind provider (its `/embeddings` endpoint).
    pub embedder: String,
    /// Cosine similarity a stored question needs to answer, in (0, 1].
    #[serde(default = "default_semantic_threshold")]
    pub threshold: f32,
    /// Most answers kept for the route (the oldest go first).
    #[serde(default = "default_semantic_entries")]
    pub max_entries: usize,
    /// Most memory the route's answers and vectors may take.
    #[serde(default = "default_semantic_bytes")]
    pub max_bytes: usize,
    /// How long an answer may be served.
    #[serde(default = "default_semantic_ttl", with = "crate::config::duration")]
    pub ttl: Duration,
    /// Requests with a higher `temperature` never use the cache (a request
    /// that sets none uses it).
    #[serde(default)]
    pub max_temperature: f32,
    /// Longest the embedding of a question may take; past it the cache is
    /// skipped, never the request failed.
    #[serde(
        default = "default_semantic_lookup_timeout",
        with = "crate::config::duration"
    )]
    pub lookup_timeout: Duration,
    /// Serve a hit younger than this before routing (tier SEMANTIC_CACHE,
    /// no inference); without it the cache is only the ladder's rung.
    #[serde(default, with = "crate::config::duration::option")]
    pub fresh_within: Option<Duration>,
}

pub(super) fn default_semantic_threshold() -> f32 {
    0.92
}
pub(super) fn default_semantic_entries() -> usize {
    100_000
}
pub(super) fn default_semantic_bytes() -> usize {
    256 * 1024 * 1024
}
pub(super) fn default_semantic_ttl() -> Duration {
    Duration::from_secs(3600)
}
pub(super) fn default_semantic_lookup_timeout() -> Duration {
    Duration::from_millis(200)
}

/// A rung of the degradation ladder.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Rung {
    /// Other targets of the route (always tried first).
    Fallback,
    /// The route's `downshift` targets.
    Downshift,
    /// The last good answer for the same request, with its age.
    Cache,
    /// The closest earlier answer for a near-identical question
    /// (`semantic_cache`), with its similarity and age.
    #[serde(rename = "semantic_cache")]
    SemanticCache,
    /// Accepted into the durable job queue, finished later.
    Queue,
    /// UNAVAILABLE with RetryInfo.
    Refuse,
}

pub(super) fn default_ladder() -> Vec<Rung> {
    vec![Rung::Fallback, Rung::Refuse]
}

pub(super) fn default_cache_ttl() -> Duration {
    Duration::from_secs(3600)
}

impl RouteConfig {
    pub fn has_rung(&self, rung: Rung) -> bool {
        self.ladder.contains(&rung)
    }
}

/// A route target resolved to indices into `Config::providers` and its models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetRef {
    pub provider: usize,
    pub model: usize,
}

pub(super) fn default_max_attempts() -> u32 {
    3
}
