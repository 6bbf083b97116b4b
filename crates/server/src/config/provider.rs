//! `[[providers]]` and their `[[providers.models]]`: kinds, keys,
//! timeouts, capabilities, context and family.
use super::*;

/// A capability a model may declare and a request may need.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    Chat,
    Stream,
    Tools,
    Json,
    /// Takes image parts.
    Vision,
    /// Takes document parts (PDF).
    Pdf,
    /// Reasons on request (effort or budget) and returns signed reasoning.
    Reasoning,
    /// Structured output against a JSON Schema.
    #[serde(rename = "json_schema")]
    JsonSchema,
    /// Caches prompt prefixes (with markers, or on its own).
    #[serde(rename = "prompt_cache")]
    PromptCache,
    /// Continues a trailing assistant message (prefill): a broken stream can
    /// be continued on it.
    Continuation,
    /// Serves OpenAI-compatible `/v1/embeddings` (a route's `semantic_cache.embedder`).
    Embeddings,
}

impl Capability {
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Chat => "chat",
            Capability::Stream => "stream",
            Capability::Tools => "tools",
            Capability::Json => "json",
            Capability::Vision => "vision",
            Capability::Pdf => "pdf",
            Capability::Reasoning => "reasoning",
            Capability::JsonSchema => "json_schema",
            Capability::PromptCache => "prompt_cache",
            Capability::Continuation => "continuation",
            Capability::Embeddings => "embeddings",
        }
    }
}

/// `[[providers]]`: one upstream endpoint, owned by one provider actor.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub id: String,
    pub kind: ProviderKind,
    /// Base URL including the version prefix, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Name of the environment variable holding the API key (never the key).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Several keys instead of `api_key_env`: one is picked per request by
    /// weight; a key-local 429, quota or 401/403 changes that key only.
    #[serde(default)]
    pub keys: Option<Vec<KeyConfig>>,
    /// `azure_openai`: the `api-version` query parameter (e.g. `2024-10-21`).
    #[serde(default)]
    pub api_version: Option<String>,
    /// `bedrock_anthropic`: the AWS region the requests are signed for;
    /// `vertex_anthropic`: the Vertex location.
    #[serde(default)]
    pub region: Option<String>,
    /// `vertex_anthropic`: the Google Cloud project.
    #[serde(default)]
    pub project: Option<String>,
    /// `vertex_anthropic`: the environment variable naming the service
    /// account JSON file (default `GOOGLE_APPLICATION_CREDENTIALS`).
    #[serde(default)]
    pub credentials_file_env: Option<String>,
    /// Ceiling on concurrent requests of all traffic.
    #[serde(default = "default_max_concurrency")]
    pub max_concurrency: u32,
    /// Lower ceiling on concurrent failover traffic (requests for which this
    /// provider is not the route's first target).
    #[serde(default = "default_failover_max_concurrency")]
    pub failover_max_concurrency: u32,
    #[serde(default = "default_connect_timeout", with = "crate::config::duration")]
    pub connect_timeout: Duration,
    /// Speak HTTP/2 without TLS (h2c, "prior knowledge") to an `http://`
    /// upstream that serves it: every request multiplexed over one
    /// connection instead of one HTTP/1.1 connection each. `https://`
    /// upstreams negotiate HTTP/2 by ALPN and need no setting.
    #[serde(default)]
    pub http2_prior_knowledge: bool,
    /// Call the upstream streaming even for a caller that takes one
    /// assembled answer (unary gRPC, non-streaming HTTP, jobs), so that
    /// `first_token_timeout` and `idle_timeout` tell a hung upstream from a
    /// long answer. `false`: such a caller's request goes upstream
    /// non-streamed, one JSON body (less work per request), which must
    /// arrive whole within `first_token_timeout`. OpenAI-shaped kinds only:
    /// the others are always streamed.
    #[serde(default = "default_stream_unary")]
    pub stream_unary: bool,
    /// Time from sending the request to the first token.
    #[serde(
        default = "default_first_token_timeout",
        with = "crate::config::duration"
    )]
    pub first_token_timeout: Duration,
    /// Longest silence between two chunks of a stream.
    #[serde(default = "default_idle_timeout", with = "crate::config::duration")]
    pub idle_timeout: Duration,
    /// Breaker per model of this provider.
    #[serde(default)]
    pub breaker: BreakerConfig,
    /// Sliding health window per model (success rate, p95 latency and TTFT).
    #[serde(default)]
    pub health: HealthConfig,
    /// Cooldowns after rate limits and exhausted quota (they never trip the breaker).
    #[serde(default)]
    pub cooldown: CooldownConfig,
    /// After a 401/403 the target is skipped this long (or until a reload):
    /// the router's key is wrong, retrying will not fix it.
    #[serde(default = "default_auth_cooldown", with = "crate::config::duration")]
    pub auth_cooldown: Duration,
    /// Probe a tripped target with a synthetic `max_tokens: 1` request instead
    /// of a user's request, so no caller is spent on a dead provider.
    #[serde(default)]
    pub synthetic_probes: bool,
    /// Requests per minute of the provider's key (each of its `keys`
    /// unless a key sets its own); with the limits the upstream reports in
    /// its rate-limit headers, the stricter wins.
    #[serde(default)]
    pub rpm: Option<u64>,
    /// Tokens per minute of the provider's key (each of its `keys` unless
    /// a key sets its own).
    #[serde(default)]
    pub tpm: Option<u64>,
    pub models: Vec<ModelConfig>,
}

/// One of a provider's `keys`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Names the key in metrics, logs and status (never its value).
    pub name: String,
    /// The environment variable holding the key.
    pub env: String,
    #[serde(default = "default_key_weight")]
    pub weight: u32,
    /// This key's own ceiling on requests at once.
    #[serde(default)]
    pub max_concurrency: Option<u32>,
    /// This key's requests per minute (the provider's `rpm` when unset).
    #[serde(default)]
    pub rpm: Option<u64>,
    /// This key's tokens per minute: estimated input plus `max_tokens` are
    /// held at admission and settled to the real usage.
    #[serde(default)]
    pub tpm: Option<u64>,
}

pub(super) fn default_key_weight() -> u32 {
    1
}

impl ProviderConfig {
    /// The variable naming a Vertex provider's service-account file.
    pub fn vertex_credentials_env(&self) -> &str {
        self.credentials_file_env
            .as_deref()
            .unwrap_or("GOOGLE_APPLICATION_CREDENTIALS")
    }
}

pub(super) fn default_auth_cooldown() -> Duration {
    Duration::from_secs(300)
}

pub(super) fn default_max_concurrency() -> u32 {
    64
}
pub(super) fn default_failover_max_concurrency() -> u32 {
    16
}
pub(super) fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
pub(super) fn default_stream_unary() -> bool {
    true
}
pub(super) fn default_first_token_timeout() -> Duration {
    Duration::from_secs(30)
}
pub(super) fn default_idle_timeout() -> Duration {
    Duration::from_secs(30)
}

/// `[[providers.models]]`: a model served by the provider and what it can do.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub name: String,
    #[serde(default = "default_capabilities")]
    pub capabilities: Vec<Capability>,
    #[serde(default = "default_context_tokens")]
    pub context_tokens: u32,
    /// Price in USD per million tokens, for the cost guard and `Finished.cost_usd`.
    #[serde(default)]
    pub price: Price,
    /// An `embeddings` model's family: vectors of one family are comparable,
    /// so `/v1/embeddings` fails over only within it (see the route's
    /// `embedding_family_failover`). Default: the model's name.
    #[serde(default)]
    pub family: Option<String>,
}

pub(super) fn default_capabilities() -> Vec<Capability> {
    vec![Capability::Chat, Capability::Stream]
}
pub(super) fn default_context_tokens() -> u32 {
    8192
}

impl ModelConfig {
    pub fn has(&self, cap: Capability) -> bool {
        self.capabilities.contains(&cap)
    }

    /// The embedding family: `family`, else the model's name.
    pub fn family(&self) -> &str {
        self.family.as_deref().unwrap_or(&self.name)
    }
}
