//! Configuration: one strictly validated TOML file. Unknown fields are errors,
//! every error names the dotted path of the bad value, and secrets appear only
//! as the *name* of an environment variable. Pure data plus validation; no I/O
//! beyond reading the file and the environment variables it names.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

pub mod duration;

pub use crate::policy::backoff::Backoff;
pub use crate::policy::breaker::BreakerConfig;
pub use crate::policy::budget::RetryBudgetConfig;
pub use crate::policy::cooldown::CooldownConfig;
pub use crate::policy::health::HealthConfig;
pub use crate::upstream::ProviderKind;

/// A configuration error, naming the dotted path of the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    /// Dotted path such as `providers[0].kind` (empty for the whole file).
    pub path: String,
    pub message: String,
}

impl ConfigError {
    fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub providers: Vec<ProviderConfig>,
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    #[serde(default)]
    pub auth: AuthConfig,
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Retries and failovers together, per route, as a share of first attempts.
    #[serde(default)]
    pub retry_budget: RetryBudgetConfig,
    /// Full-jitter backoff before retrying the same target.
    #[serde(default)]
    pub backoff: Backoff,
    #[serde(default)]
    pub idempotency: IdempotencyConfig,
    #[serde(default)]
    pub admin: AdminConfig,
    #[serde(default)]
    pub cache: CacheConfig,
    #[serde(default)]
    pub cost: CostConfig,
    /// The durable job queue (`SubmitJob`, the `queue` rung); off when absent.
    #[serde(default)]
    pub queue: Option<QueueConfig>,
    /// Where jobs, idempotency records, cost reservations and tenant limits live.
    #[serde(default)]
    pub state: StateConfig,
    /// Where golden-set validations are kept (`switchyard golden`).
    #[serde(default)]
    pub golden: Option<GoldenConfig>,
    /// Stored Responses (`previous_response_id`, `GET /v1/responses/{id}`).
    #[serde(default)]
    pub responses: ResponsesConfig,
}

/// `[responses]`: how long stored Responses API responses are kept and how
/// much each tenant may keep (past either bound a `store` is refused, named).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesConfig {
    #[serde(with = "crate::config::duration")]
    pub ttl: Duration,
    /// Stored responses per tenant, at most.
    pub max_per_tenant: usize,
    /// Bytes of stored responses (each with its whole conversation) per tenant.
    pub max_bytes_per_tenant: usize,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        ResponsesConfig {
            ttl: Duration::from_secs(30 * 24 * 3600),
            max_per_tenant: 10_000,
            max_bytes_per_tenant: 256 * 1024 * 1024,
        }
    }
}

/// `[golden]`: the validation record file. Read at start and whenever it
/// changes (replicas sharing a volume see each other's validations);
/// written when `Admin.RecordValidation` stores a route's validation.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GoldenConfig {
    pub record: std::path::PathBuf,
}

/// `[cache]`: the in-process response cache.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Memory bound of stored answers; least recently used go first.
    pub max_bytes: usize,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

/// `[cost]`: per-tenant spend caps over a sliding window.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CostConfig {
    #[serde(with = "crate::config::duration")]
    pub window: Duration,
    /// Cap for tenants without their own (none when absent).
    pub default_cap_usd: Option<f64>,
    /// Caps by tenant.
    pub tenant_caps_usd: std::collections::BTreeMap<String, f64>,
}

impl Default for CostConfig {
    fn default() -> Self {
        CostConfig {
            window: Duration::from_secs(3600),
            default_cap_usd: None,
            tenant_caps_usd: Default::default(),
        }
    }
}

/// `[state]`: the embedded backend (in-process, the SQLite queue file) or
/// Redis, shared by every replica that names the same server.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StateConfig {
    pub backend: StateBackend,
    /// Environment variable holding the `redis://` or `rediss://` URL
    /// (password included).
    pub redis_url_env: String,
    /// Prefix of every key (no `{` or `}`: hash tags follow it).
    pub key_prefix: String,
    /// Longest wait for one Redis call.
    #[serde(with = "crate::config::duration")]
    pub timeout: Duration,
    /// A tenant slot or an unfinished idempotency claim lapses this long
    /// after its last renewal (renewed every third of it while its request lives).
    #[serde(with = "crate::config::duration")]
    pub lease: Duration,
}

impl Default for StateConfig {
    fn default() -> Self {
        StateConfig {
            backend: StateBackend::Embedded,
            redis_url_env: "SWITCHYARD_REDIS_URL".into(),
            key_prefix: "switchyard:".into(),
            timeout: Duration::from_millis(250),
            lease: Duration::from_secs(20),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    Embedded,
    Redis,
}

/// `[queue]`: the durable job queue and its drain.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// SQLite file (WAL mode); created if missing.
    pub path: std::path::PathBuf,
    /// Jobs waiting or running, all tenants.
    pub max_jobs: usize,
    /// Jobs waiting or running per tenant.
    pub max_jobs_per_tenant: usize,
    /// Drain rate once capacity returns.
    pub drain: crate::policy::token_bucket::TokenBucketConfig,
    /// A job not finished within this after it was accepted expires.
    #[serde(with = "crate::config::duration")]
    pub job_ttl: Duration,
    /// The largest file `POST /v1/files` takes (a batch's input).
    pub max_file_bytes: usize,
    /// Requests (lines) in one batch, at most.
    pub max_batch_lines: usize,
    /// How long uploaded files, batch records and their output files are kept.
    #[serde(with = "crate::config::duration")]
    pub file_ttl: Duration,
    /// Start even when `path` exists but holds no queue (a file truncated
    /// to 0 bytes, or another file): an empty queue is made in it. Off by
    /// default, so a damaged file is never silently taken for an empty queue.
    pub accept_empty_file: bool,
    /// Batch API uploads one tenant keeps at once (refused past it).
    pub max_files_per_tenant: usize,
    /// Bytes one tenant keeps (uploads, batch records and outputs); uploads
    /// and new batches are refused past it.
    pub max_file_bytes_per_tenant: usize,
    /// Bytes every tenant keeps together: the budget of stored blobs.
    pub max_stored_bytes: usize,
    /// The longest wait for one chunk (1 MiB) of a big blob on Redis; chunks
    /// travel outside `state.timeout` and the request path's breaker.
    #[serde(with = "crate::config::duration")]
    pub blob_timeout: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            path: std::path::PathBuf::from("switchyard-queue.sqlite3"),
            max_jobs: 10_000,
            max_jobs_per_tenant: 1_000,
            drain: Default::default(),
            job_ttl: Duration::from_secs(24 * 3600),
            max_file_bytes: 64 * 1024 * 1024,
            max_batch_lines: 10_000,
            file_ttl: Duration::from_secs(7 * 24 * 3600),
            accept_empty_file: false,
            max_files_per_tenant: 100,
            max_file_bytes_per_tenant: 256 * 1024 * 1024,
            max_stored_bytes: 1024 * 1024 * 1024,
            blob_timeout: Duration::from_secs(5),
        }
    }
}

/// `[admin]`: the operator API.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Environment variable holding the admin bearer token. Without it the
    /// Admin service is open when caller auth is open, and disabled otherwise.
    pub token_env: Option<String>,
}

/// `[idempotency]`: how long finished answers are replayed for their key.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    #[serde(with = "crate::config::duration")]
    pub ttl: Duration,
    pub max_entries: usize,
    /// Most bytes of stored answers (embedded backend); the expired, then
    /// the oldest-expiring, go first.
    pub max_bytes: usize,
}

impl Default for IdempotencyConfig {
    fn default() -> Self {
        IdempotencyConfig {
            ttl: Duration::from_secs(24 * 3600),
            max_entries: 100_000,
            max_bytes: 64 * 1024 * 1024,
        }
    }
}

/// How callers authenticate.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// No authentication (local use): the caller's `tenant` field is trusted.
    /// Logged as a warning at start.
    #[default]
    Open,
    /// Bearer tokens in the `authorization` metadata, mapped to tenants.
    Tokens,
}

/// `[auth]`: caller authentication.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    pub mode: AuthMode,
    /// File of `tenant:token` lines (`#` comments), e.g. a mounted Secret.
    pub tokens_file: Option<std::path::PathBuf>,
    /// Environment variable holding `tenant:token` pairs separated by `,` or newlines.
    pub tokens_env: Option<String>,
}

/// `[limits]`: input limits, each answered with a precise error.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest gRPC request message, in bytes.
    pub max_request_bytes: usize,
    /// Most messages in one request.
    pub max_messages: usize,
    /// Most bytes of message content in one request.
    pub max_prompt_bytes: usize,
    /// Most tools in one request.
    pub max_tools: usize,
    /// Highest `max_tokens` a caller may ask for (a route may set a lower one).
    pub max_tokens: u32,
    /// Concurrent requests per tenant (0 = unlimited).
    pub tenant_max_concurrent: u32,
    /// Sustained requests per second per tenant (0 = unlimited).
    pub tenant_rate_per_sec: f64,
    /// Burst above the rate per tenant.
    pub tenant_burst: u32,
    /// Largest metadata (all headers of one call, HPACK-counted: name +
    /// value + 32 per entry) a gRPC call or HTTP request may carry; over it
    /// the one call is refused (METADATA_TOO_LARGE / HTTP 431).
    pub max_metadata_bytes: usize,
    /// Longest caller-chosen identifier (tenant, idempotency key, route
    /// name, request id).
    pub max_id_bytes: usize,
    /// Largest answer kept for an idempotency record or the response cache;
    /// a larger one is served but not kept.
    pub max_recorded_bytes: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_bytes: 4 * 1024 * 1024,
            max_messages: 10_000,
            max_prompt_bytes: 2 * 1024 * 1024,
            max_tools: 128,
            max_tokens: 128_000,
            tenant_max_concurrent: 0,
            tenant_rate_per_sec: 0.0,
            tenant_burst: 0,
            max_recorded_bytes: 4 * 1024 * 1024,
            max_metadata_bytes: 16 * 1024,
            max_id_bytes: 256,
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

/// `[server]`: listeners and request-wide defaults.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// gRPC listener (Router, health, reflection).
    pub grpc_listen: SocketAddr,
    /// Admin HTTP listener: `/metrics`, `/healthz`, `/readyz`.
    pub admin_listen: SocketAddr,
    /// The HTTP doors (OpenAI and Anthropic shapes); off when absent in a
    /// config file (`serve` without one opens them on 127.0.0.1:8080), and
    /// `serve --http-listen` overrides it.
    pub http_listen: Option<SocketAddr>,
    pub log_format: LogFormat,
    /// Re-read the config file when it changes (a ConfigMap update).
    pub watch_config: bool,
    /// Deadline for a request that carries no `grpc-timeout` and whose route sets none.
    #[serde(with = "crate::config::duration")]
    pub default_deadline: Duration,
    /// Events buffered per stream between the upstream task and the client.
    pub stream_buffer: usize,
    /// Longest a request waits for its caller to read (room in
    /// `stream_buffer`) before it is dropped with SLOW_CONSUMER and its
    /// upstream call and permit are released. The deadline bounds it too.
    #[serde(with = "crate::config::duration")]
    pub send_timeout: Duration,
    /// On SIGTERM, how long in-flight streams may run before they are ended
    /// with UNAVAILABLE (SERVER_DRAINING).
    #[serde(with = "crate::config::duration")]
    pub drain_timeout: Duration,
    /// TLS for the gRPC listener (off when absent).
    pub tls: Option<TlsConfig>,
    /// Open connections per listener; more are closed on accept (counted
    /// in `switchyard_connections_refused_total`, with a WARN).
    pub max_connections: usize,
    pub http_max_connections: usize,
    pub admin_max_connections: usize,
    /// HTTP listeners: longest a client may take to send a request's headers.
    #[serde(with = "crate::config::duration")]
    pub header_read_timeout: Duration,
    /// HTTP listeners: a connection with no request in flight this long is closed.
    #[serde(with = "crate::config::duration")]
    pub connection_idle_timeout: Duration,
    /// HTTP listeners: longest wait for the first or the next piece of a
    /// request body, and the grace before `body_min_rate` applies; a body
    /// later than this is answered 408 and its connection closed.
    #[serde(with = "crate::config::duration")]
    pub body_read_timeout: Duration,
    /// HTTP listeners: after `body_read_timeout`, a request body must have
    /// averaged at least this many bytes per second since its first byte
    /// was awaited (0 = no rate check).
    pub body_min_rate: u64,
}

/// `[server.tls]`: PEM files, re-read on config reload.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
    /// When set, callers must present a certificate signed by this CA.
    #[serde(default)]
    pub client_ca: Option<std::path::PathBuf>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            http_listen: None,
            log_format: LogFormat::Pretty,
            default_deadline: Duration::from_secs(120),
            stream_buffer: 64,
            send_timeout: Duration::from_secs(10),
            drain_timeout: Duration::from_secs(20),
            tls: None,
            watch_config: true,
            max_connections: 4096,
            http_max_connections: 1024,
            admin_max_connections: 64,
            header_read_timeout: Duration::from_secs(10),
            connection_idle_timeout: Duration::from_secs(60),
            body_read_timeout: Duration::from_secs(10),
            body_min_rate: 16 * 1024,
        }
    }
}

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
}

fn default_key_weight() -> u32 {
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

fn default_auth_cooldown() -> Duration {
    Duration::from_secs(300)
}

fn default_max_concurrency() -> u32 {
    64
}
fn default_failover_max_concurrency() -> u32 {
    16
}
fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}
fn default_first_token_timeout() -> Duration {
    Duration::from_secs(30)
}
fn default_idle_timeout() -> Duration {
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

/// USD per million tokens. Prompt-cache prices default from the input
/// price with the provider's published multipliers (Anthropic: reads 0.1x,
/// 5-minute writes 1.25x, 1-hour writes 2x; OpenAI: reads 0.5x, writes 1x;
/// Gemini: reads 0.25x, writes 1x); reasoning tokens bill as output.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    #[serde(alias = "cache_read")]
    pub cache_read_per_mtok: Option<f64>,
    #[serde(alias = "cache_write_5m")]
    pub cache_write_5m_per_mtok: Option<f64>,
    #[serde(alias = "cache_write_1h")]
    pub cache_write_1h_per_mtok: Option<f64>,
}

/// Prompt-cache prices per million tokens: read, 5-minute write, 1-hour write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachePrices {
    pub read: f64,
    pub write_5m: f64,
    pub write_1h: f64,
}

impl Price {
    /// Plain input and output (estimates and reservations).
    pub fn cost(&self, input_tokens: u32, output_tokens: u32) -> f64 {
        (f64::from(input_tokens) * self.input_per_mtok
            + f64::from(output_tokens) * self.output_per_mtok)
            / 1e6
    }

    /// The prompt-cache prices on `dialect`'s wire: configured, or from the
    /// input price with the provider's multipliers.
    pub fn cache_prices(&self, dialect: crate::chat::Dialect) -> CachePrices {
        use crate::chat::Dialect;
        let input = self.input_per_mtok;
        let (read, write_5m, write_1h) = match dialect {
            Dialect::Anthropic => (0.1, 1.25, 2.0),
            Dialect::Openai => (0.5, 1.0, 1.0),
            Dialect::Gemini => (0.25, 1.0, 1.0),
        };
        CachePrices {
            read: self.cache_read_per_mtok.unwrap_or(input * read),
            write_5m: self.cache_write_5m_per_mtok.unwrap_or(input * write_5m),
            write_1h: self.cache_write_1h_per_mtok.unwrap_or(input * write_1h),
        }
    }

    /// The dearest rate per million a prompt token may be billed at on
    /// `dialect`'s wire (reservations): an upstream that caches on its own
    /// (OpenAI, Gemini) may read or write any prompt; an Anthropic one only
    /// what a marker covers, at the write price of the longest `marked` TTL.
    pub fn dearest_input_rate(
        &self,
        dialect: crate::chat::Dialect,
        marked: Option<crate::chat::CacheTtl>,
    ) -> f64 {
        use crate::chat::{CacheTtl, Dialect};
        let c = self.cache_prices(dialect);
        let ttl = match dialect {
            Dialect::Anthropic => marked,
            Dialect::Openai | Dialect::Gemini => Some(CacheTtl::FiveMinutes),
        };
        match ttl {
            None => self.input_per_mtok,
            Some(CacheTtl::FiveMinutes) => self.input_per_mtok.max(c.read).max(c.write_5m),
            Some(CacheTtl::OneHour) => self
                .input_per_mtok
                .max(c.read)
                .max(c.write_5m)
                .max(c.write_1h),
        }
    }

    /// The most a request may cost on `dialect`'s wire: every prompt token at
    /// the dearest rate it may be billed at, and `output_tokens` (reasoning
    /// included) at the output price.
    pub fn max_cost(
        &self,
        dialect: crate::chat::Dialect,
        marked: Option<crate::chat::CacheTtl>,
        prompt_tokens: u32,
        output_tokens: u32,
    ) -> f64 {
        (f64::from(prompt_tokens) * self.dearest_input_rate(dialect, marked)
            + f64::from(output_tokens) * self.output_per_mtok)
            / 1e6
    }

    /// Each price with its field name (validation).
    fn fields(&self) -> [(&'static str, Option<f64>); 5] {
        [
            ("input_per_mtok", Some(self.input_per_mtok)),
            ("output_per_mtok", Some(self.output_per_mtok)),
            ("cache_read_per_mtok", self.cache_read_per_mtok),
            ("cache_write_5m_per_mtok", self.cache_write_5m_per_mtok),
            ("cache_write_1h_per_mtok", self.cache_write_1h_per_mtok),
        ]
    }

    /// What `usage` cost on `dialect`'s wire: uncached input, cache reads,
    /// cache writes by TTL, and output (reasoning included) each at its price.
    pub fn usage_cost(&self, u: &crate::chat::Usage, dialect: crate::chat::Dialect) -> f64 {
        let c = self.cache_prices(dialect);
        let write_1h = u
            .cache_write_1h_input_tokens
            .min(u.cache_write_input_tokens);
        let write_5m = u.cache_write_input_tokens - write_1h;
        (f64::from(u.input_tokens) * self.input_per_mtok
            + f64::from(u.cache_read_input_tokens) * c.read
            + f64::from(write_5m) * c.write_5m
            + f64::from(write_1h) * c.write_1h
            + f64::from(u.output_tokens) * self.output_per_mtok)
            / 1e6
    }
}

fn default_capabilities() -> Vec<Capability> {
    vec![Capability::Chat, Capability::Stream]
}
fn default_context_tokens() -> u32 {
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

fn default_weight() -> u32 {
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

fn default_affinity_ttl() -> Duration {
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

fn default_semantic_threshold() -> f32 {
    0.92
}
fn default_semantic_entries() -> usize {
    100_000
}
fn default_semantic_bytes() -> usize {
    256 * 1024 * 1024
}
fn default_semantic_ttl() -> Duration {
    Duration::from_secs(3600)
}
fn default_semantic_lookup_timeout() -> Duration {
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

fn default_ladder() -> Vec<Rung> {
    vec![Rung::Fallback, Rung::Refuse]
}

fn default_cache_ttl() -> Duration {
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

impl Config {
    /// Parses and validates a TOML document.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let de =
            toml::Deserializer::parse(text).map_err(|e| ConfigError::new("", e.to_string()))?;
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            // The root is the empty path; a key named `.` or `` is not the root.
            let path = match e.path().to_string() {
                _ if e.path().iter().next().is_none() => String::new(),
                p if p.is_empty() => "\"\"".to_string(),
                p => p,
            };
            let inner = e.into_inner();
            ConfigError::new(path, inner.message().to_string())
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Reads, parses and validates a file.
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::new("", format!("cannot read {}: {e}", path.display())))?;
        Self::from_toml_str(&text)
    }

    /// `[state]`: a Redis backend names its URL variable; the prefix leaves
    /// the hash tags to Switchyard.
    fn validate_state(&self) -> Result<(), ConfigError> {
        let st = &self.state;
        if st.key_prefix.contains(['{', '}']) {
            return Err(ConfigError::new(
                "state.key_prefix",
                format!(
                    "`{}` must not contain `{{` or `}}` (Switchyard adds the hash tags)",
                    st.key_prefix
                ),
            ));
        }
        if st.timeout.is_zero() {
            return Err(ConfigError::new("state.timeout", "must be positive"));
        }
        if st.lease < 3 * st.timeout || st.lease > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "state.lease",
                format!(
                    "{:?} must be at least 3 x state.timeout (it is renewed every third of it) and at most 1h",
                    st.lease
                ),
            ));
        }
        if st.backend == StateBackend::Redis && st.redis_url_env.trim().is_empty() {
            return Err(ConfigError::new(
                "state.redis_url_env",
                "names the environment variable with the redis:// URL",
            ));
        }
        Ok(())
    }

    /// `[queue]`: every file quota can hold at least one file.
    fn validate_queue(&self) -> Result<(), ConfigError> {
        let Some(q) = &self.queue else {
            return Ok(());
        };
        if q.max_files_per_tenant == 0 {
            return Err(ConfigError::new(
                "queue.max_files_per_tenant",
                "must be at least 1",
            ));
        }
        for (field, n) in [
            (
                "queue.max_file_bytes_per_tenant",
                q.max_file_bytes_per_tenant,
            ),
            ("queue.max_stored_bytes", q.max_stored_bytes),
        ] {
            if n < q.max_file_bytes {
                return Err(ConfigError::new(
                    field,
                    format!("{n} is below queue.max_file_bytes ({}): the largest upload could never be kept", q.max_file_bytes),
                ));
            }
        }
        if q.blob_timeout < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "queue.blob_timeout",
                "must be at least 10ms",
            ));
        }
        Ok(())
    }

    fn validate_responses(&self) -> Result<(), ConfigError> {
        let r = &self.responses;
        if r.ttl.is_zero() {
            return Err(ConfigError::new("responses.ttl", "must be positive"));
        }
        if r.max_per_tenant == 0 {
            return Err(ConfigError::new(
                "responses.max_per_tenant",
                "must be at least 1",
            ));
        }
        if r.max_bytes_per_tenant == 0 {
            return Err(ConfigError::new(
                "responses.max_bytes_per_tenant",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// Semantic checks serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // An empty or comment-only file parses into defaults: serving it
        // would be a total outage, so it is not a config.
        if self.providers.is_empty() {
            return Err(ConfigError::new(
                "providers",
                "at least one [[providers]] entry is required",
            ));
        }
        if self.routes.is_empty() {
            return Err(ConfigError::new(
                "routes",
                "at least one [[routes]] entry is required",
            ));
        }
        self.validate_server()?;
        self.validate_state()?;
        self.validate_queue()?;
        self.validate_responses()?;
        for (i, p) in self.providers.iter().enumerate() {
            validate_provider(i, p)?;
            validate_embedding_models(i, p)?;
        }
        let mut ids = HashSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            if !ids.insert(p.id.as_str()) {
                return Err(ConfigError::new(
                    format!("providers[{i}].id"),
                    format!("duplicate provider id `{}`", p.id),
                ));
            }
        }
        self.validate_policies()?;
        let mut routes = HashSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            if !routes.insert(r.name.as_str()) {
                return Err(ConfigError::new(
                    format!("routes[{i}].name"),
                    format!("duplicate route `{}`", r.name),
                ));
            }
            self.validate_route(i, r)?;
        }
        Ok(())
    }

    /// `[server]`.
    fn validate_server(&self) -> Result<(), ConfigError> {
        if self.server.stream_buffer == 0 {
            return Err(ConfigError::new(
                "server.stream_buffer",
                "must be at least 1",
            ));
        }
        if self.server.default_deadline.is_zero() {
            return Err(ConfigError::new(
                "server.default_deadline",
                "must be positive",
            ));
        }
        for (field, n) in [
            ("server.max_connections", self.server.max_connections),
            (
                "server.http_max_connections",
                self.server.http_max_connections,
            ),
            (
                "server.admin_max_connections",
                self.server.admin_max_connections,
            ),
        ] {
            if n == 0 {
                return Err(ConfigError::new(field, "must be at least 1"));
            }
        }
        for (field, d) in [
            (
                "server.header_read_timeout",
                self.server.header_read_timeout,
            ),
            (
                "server.connection_idle_timeout",
                self.server.connection_idle_timeout,
            ),
            ("server.body_read_timeout", self.server.body_read_timeout),
        ] {
            if d < Duration::from_millis(100) {
                return Err(ConfigError::new(field, "must be at least 100ms"));
            }
        }
        if self.server.send_timeout < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "server.send_timeout",
                "must be at least 10ms",
            ));
        }
        Ok(())
    }

    /// `[retry_budget]` and `[backoff]`.
    fn validate_policies(&self) -> Result<(), ConfigError> {
        let b = &self.retry_budget;
        if !(b.ratio >= 0.0 && b.ratio.is_finite()) {
            return Err(ConfigError::new(
                "retry_budget.ratio",
                format!("{} must be a finite non-negative share", b.ratio),
            ));
        }
        if !(b.min_per_sec >= 0.0 && b.min_per_sec.is_finite()) {
            return Err(ConfigError::new(
                "retry_budget.min_per_sec",
                "must be finite and non-negative",
            ));
        }
        if b.ttl < Duration::from_secs(1) || b.ttl > Duration::from_secs(60) {
            return Err(ConfigError::new(
                "retry_budget.ttl",
                format!("{:?} is outside 1s..=60s", b.ttl),
            ));
        }
        if self.backoff.base.is_zero() || self.backoff.cap < self.backoff.base {
            return Err(ConfigError::new(
                "backoff.cap",
                "base must be positive and cap at least base",
            ));
        }
        Ok(())
    }

    /// One route: names, targets, ladder and limits.
    fn validate_route(&self, i: usize, r: &RouteConfig) -> Result<(), ConfigError> {
        if !valid_name(&r.name) {
            return Err(ConfigError::new(
                format!("routes[{i}].name"),
                format!(
                    "`{}` must be non-empty letters, digits, `-`, `_` or `.`",
                    r.name
                ),
            ));
        }
        if r.targets.is_empty() {
            return Err(ConfigError::new(
                format!("routes[{i}].targets"),
                "at least one target is required",
            ));
        }
        let mut seen = HashSet::new();
        for (j, t) in r.targets.iter().enumerate() {
            let path = format!("routes[{i}].targets[{j}]");
            self.resolve_target(&t.target)
                .map_err(|m| ConfigError::new(path.clone(), m))?;
            if !seen.insert(t.target.as_str()) {
                return Err(ConfigError::new(
                    path,
                    format!("duplicate target `{}`", t.target),
                ));
            }
            if t.weight == 0 {
                return Err(ConfigError::new(
                    format!("{path}.weight"),
                    "must be at least 1",
                ));
            }
        }
        for (j, t) in r.downshift.iter().enumerate() {
            self.resolve_target(&t.target)
                .map_err(|m| ConfigError::new(format!("routes[{i}].downshift[{j}]"), m))?;
        }
        if !r.downshift.is_empty() && !r.has_rung(Rung::Downshift) {
            return Err(ConfigError::new(
                format!("routes[{i}].ladder"),
                "downshift targets are set but the ladder has no `downshift` rung",
            ));
        }
        self.validate_semantic(i, r)?;
        if r.require_validated && (r.downshift.is_empty() || !r.has_rung(Rung::Downshift)) {
            return Err(ConfigError::new(
                format!("routes[{i}].require_validated"),
                "is set but the route has no `downshift` targets and rung to restrict",
            ));
        }
        if r.has_rung(Rung::Queue) && self.queue.is_none() {
            return Err(ConfigError::new(
                format!("routes[{i}].ladder"),
                "the `queue` rung needs a [queue] section",
            ));
        }
        if r.ladder.first() != Some(&Rung::Fallback) {
            return Err(ConfigError::new(
                format!("routes[{i}].ladder"),
                "must start with `fallback`",
            ));
        }
        if r.max_attempts == 0 || r.max_attempts > 10 {
            return Err(ConfigError::new(
                format!("routes[{i}].max_attempts"),
                format!("{} is outside 1..=10", r.max_attempts),
            ));
        }
        if let Some(t) = &r.service_tier {
            const TIERS: [&str; 5] = ["auto", "default", "flex", "priority", "standard_only"];
            if !TIERS.contains(&t.as_str()) {
                return Err(ConfigError::new(
                    format!("routes[{i}].service_tier"),
                    format!("`{t}` is not one of {}", TIERS.join(", ")),
                ));
            }
        }
        if r.default_max_tokens == Some(0) {
            return Err(ConfigError::new(
                format!("routes[{i}].default_max_tokens"),
                "must be at least 1",
            ));
        }
        if let Some(a) = &r.cache_affinity {
            if a.ttl < Duration::from_secs(1) || a.ttl > Duration::from_secs(24 * 3600) {
                return Err(ConfigError::new(
                    format!("routes[{i}].cache_affinity.ttl"),
                    format!("{:?} is outside 1s..=24h", a.ttl),
                ));
            }
        }
        if r.deadline.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new(
                format!("routes[{i}].deadline"),
                "must be positive",
            ));
        }
        Ok(())
    }

    /// A route's `semantic_cache` and its `semantic_cache` rung.
    fn validate_semantic(&self, i: usize, r: &RouteConfig) -> Result<(), ConfigError> {
        let path = format!("routes[{i}].semantic_cache");
        let Some(s) = &r.semantic_cache else {
            if r.has_rung(Rung::SemanticCache) {
                return Err(ConfigError::new(
                    format!("routes[{i}].ladder"),
                    "the `semantic_cache` rung needs the route's `semantic_cache` settings",
                ));
            }
            return Ok(());
        };
        let at = self
            .resolve_target(&s.embedder)
            .map_err(|m| ConfigError::new(format!("{path}.embedder"), m))?;
        let p = &self.providers[at.provider];
        if !p.models[at.model].has(Capability::Embeddings) {
            return Err(ConfigError::new(
                format!("{path}.embedder"),
                format!(
                    "`{}` does not declare the `embeddings` capability",
                    s.embedder
                ),
            ));
        }
        if p.kind != ProviderKind::Openai {
            return Err(ConfigError::new(
                format!("{path}.embedder"),
                format!(
                    "provider `{}` is `{}`; embeddings are read from an `openai`-kind provider's /embeddings (vLLM, llama.cpp, Ollama, OpenAI)",
                    p.id,
                    p.kind.as_str()
                ),
            ));
        }
        if !(s.threshold > 0.0 && s.threshold <= 1.0) {
            return Err(ConfigError::new(
                format!("{path}.threshold"),
                format!("{} is outside (0, 1]", s.threshold),
            ));
        }
        if s.max_entries == 0 || s.max_entries > 10_000_000 {
            return Err(ConfigError::new(
                format!("{path}.max_entries"),
                format!("{} is outside 1..=10000000", s.max_entries),
            ));
        }
        if s.max_bytes < 64 * 1024 {
            return Err(ConfigError::new(
                format!("{path}.max_bytes"),
                "must be at least 65536",
            ));
        }
        if s.ttl.is_zero() {
            return Err(ConfigError::new(format!("{path}.ttl"), "must be positive"));
        }
        if !(0.0..=2.0).contains(&s.max_temperature) {
            return Err(ConfigError::new(
                format!("{path}.max_temperature"),
                format!("{} is outside 0..=2", s.max_temperature),
            ));
        }
        if s.lookup_timeout.is_zero() || s.lookup_timeout > Duration::from_secs(10) {
            return Err(ConfigError::new(
                format!("{path}.lookup_timeout"),
                "must be positive and at most 10s",
            ));
        }
        if s.fresh_within.is_some_and(|f| f.is_zero() || f > s.ttl) {
            return Err(ConfigError::new(
                format!("{path}.fresh_within"),
                "must be positive and at most `ttl`",
            ));
        }
        if s.fresh_within.is_none() && !r.has_rung(Rung::SemanticCache) {
            return Err(ConfigError::new(
                path,
                "set `fresh_within` or add the `semantic_cache` rung to the ladder, or the cache is never read",
            ));
        }
        Ok(())
    }

    /// Resolves `provider/model` to indices.
    pub fn resolve_target(&self, target: &str) -> Result<TargetRef, String> {
        let Some((provider, model)) = target.split_once('/') else {
            return Err(format!("`{target}` is not of the form provider/model"));
        };
        let p = self
            .providers
            .iter()
            .position(|p| p.id == provider)
            .ok_or_else(|| format!("unknown provider `{provider}` in `{target}`"))?;
        let m = self.providers[p]
            .models
            .iter()
            .position(|m| m.name == model)
            .ok_or_else(|| format!("provider `{provider}` has no model `{model}` in `{target}`"))?;
        Ok(TargetRef {
            provider: p,
            model: m,
        })
    }

    /// Environment variables the file names that are not set (warned by
    /// `check-config`, fatal at `serve`).
    pub fn missing_env(&self) -> Vec<(String, String)> {
        let mut missing = Vec::new();
        for (i, p) in self.providers.iter().enumerate() {
            if let Some(env) = &p.api_key_env {
                if std::env::var_os(env).is_none() {
                    missing.push((format!("providers[{i}].api_key_env"), env.clone()));
                }
            }
            for (k, key) in p.keys.iter().flatten().enumerate() {
                if std::env::var_os(&key.env).is_none() {
                    missing.push((format!("providers[{i}].keys[{k}].env"), key.env.clone()));
                }
            }
            if p.kind.google_service_account() {
                let env = p.vertex_credentials_env();
                if std::env::var_os(env).is_none() {
                    missing.push((format!("providers[{i}].credentials_file_env"), env.into()));
                }
            }
            if p.kind == ProviderKind::BedrockAnthropic {
                for env in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
                    if std::env::var_os(env).is_none() {
                        missing.push((format!("providers[{i}] (bedrock_anthropic)"), env.into()));
                    }
                }
            }
        }
        missing
    }

    /// The built-in configuration used by `serve` without `--config`: real
    /// providers for whichever of `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` is set,
    /// the given mock base URLs for the others, and one route `chat` spanning both.
    pub fn builtin(openai_mock: Option<&str>, anthropic_mock: Option<&str>) -> Config {
        let openai_url = openai_mock.unwrap_or("https://api.openai.com/v1");
        let anthropic_url = anthropic_mock.unwrap_or("https://api.anthropic.com/v1");
        let all = vec![
            Capability::Chat,
            Capability::Stream,
            Capability::Tools,
            Capability::Json,
            Capability::Vision,
        ];
        let providers = vec![
            ProviderConfig {
                id: "openai".into(),
                kind: ProviderKind::Openai,
                base_url: openai_url.into(),
                keys: None,
                api_version: None,
                region: None,
                project: None,
                credentials_file_env: None,
                api_key_env: openai_mock.is_none().then(|| "OPENAI_API_KEY".into()),
                max_concurrency: default_max_concurrency(),
                failover_max_concurrency: default_failover_max_concurrency(),
                connect_timeout: default_connect_timeout(),
                first_token_timeout: default_first_token_timeout(),
                idle_timeout: default_idle_timeout(),
                breaker: BreakerConfig::default(),
                health: HealthConfig::default(),
                cooldown: CooldownConfig::default(),
                auth_cooldown: default_auth_cooldown(),
                synthetic_probes: false,
                models: vec![
                    ModelConfig {
                        name: "gpt-4o-mini".into(),
                        capabilities: all.clone(),
                        context_tokens: 128_000,
                        price: Price {
                            input_per_mtok: 0.15,
                            output_per_mtok: 0.6,
                            ..Price::default()
                        },
                        family: None,
                    },
                    ModelConfig {
                        name: "text-embedding-3-small".into(),
                        capabilities: vec![Capability::Embeddings],
                        context_tokens: 8191,
                        price: Price {
                            input_per_mtok: 0.02,
                            ..Price::default()
                        },
                        family: None,
                    },
                ],
            },
            ProviderConfig {
                id: "anthropic".into(),
                kind: ProviderKind::Anthropic,
                base_url: anthropic_url.into(),
                keys: None,
                api_version: None,
                region: None,
                project: None,
                credentials_file_env: None,
                api_key_env: anthropic_mock.is_none().then(|| "ANTHROPIC_API_KEY".into()),
                max_concurrency: default_max_concurrency(),
                failover_max_concurrency: default_failover_max_concurrency(),
                connect_timeout: default_connect_timeout(),
                first_token_timeout: default_first_token_timeout(),
                idle_timeout: default_idle_timeout(),
                breaker: BreakerConfig::default(),
                health: HealthConfig::default(),
                cooldown: CooldownConfig::default(),
                auth_cooldown: default_auth_cooldown(),
                synthetic_probes: false,
                models: vec![ModelConfig {
                    name: "claude-sonnet-4-5".into(),
                    capabilities: vec![
                        Capability::Chat,
                        Capability::Stream,
                        Capability::Tools,
                        Capability::Vision,
                    ],
                    context_tokens: 200_000,
                    price: Price {
                        input_per_mtok: 3.0,
                        output_per_mtok: 15.0,
                        cache_read_per_mtok: None,
                        cache_write_5m_per_mtok: None,
                        cache_write_1h_per_mtok: None,
                    },
                    family: None,
                }],
            },
        ];
        Config {
            server: ServerConfig::default(),
            auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            retry_budget: RetryBudgetConfig::default(),
            backoff: Backoff::default(),
            idempotency: IdempotencyConfig::default(),
            admin: AdminConfig::default(),
            cache: CacheConfig::default(),
            cost: CostConfig::default(),
            queue: None,
            state: StateConfig::default(),
            golden: None,
            responses: ResponsesConfig::default(),
            providers,
            routes: vec![
                RouteConfig {
                    name: "chat".into(),
                    targets: vec![
                        "openai/gpt-4o-mini".into(),
                        "anthropic/claude-sonnet-4-5".into(),
                    ],
                    max_attempts: default_max_attempts(),
                    mid_stream: MidStreamPolicy::Fail,
                    side_effects: false,
                    default_max_tokens: None,
                    service_tier: None,
                    deadline: None,
                    ladder: default_ladder(),
                    downshift: Vec::new(),
                    cache_ttl: default_cache_ttl(),
                    serve_fresh_within: None,
                    max_tokens_limit: None,
                    semantic_cache: None,
                    require_validated: false,
                    shared_across_tenants: false,
                    fail_closed: false,
                    embedding_family_failover: FamilyFailover::Same,
                    cache_affinity: None,
                },
                RouteConfig {
                    name: "embed".into(),
                    targets: vec!["openai/text-embedding-3-small".into()],
                    max_attempts: default_max_attempts(),
                    mid_stream: MidStreamPolicy::Fail,
                    side_effects: false,
                    default_max_tokens: None,
                    service_tier: None,
                    deadline: None,
                    ladder: default_ladder(),
                    downshift: Vec::new(),
                    cache_ttl: default_cache_ttl(),
                    serve_fresh_within: None,
                    max_tokens_limit: None,
                    semantic_cache: None,
                    require_validated: false,
                    shared_across_tenants: false,
                    fail_closed: false,
                    embedding_family_failover: FamilyFailover::Same,
                    cache_affinity: None,
                },
            ],
        }
    }
}

fn check_breaker(b: &BreakerConfig, at: &str) -> Result<(), ConfigError> {
    if !(0.0..=1.0).contains(&b.jitter) {
        return Err(ConfigError::new(
            format!("{at}.jitter"),
            format!("{} is outside 0..=1", b.jitter),
        ));
    }
    if b.failure_rate.is_nan() || b.failure_rate <= 0.0 {
        return Err(ConfigError::new(
            format!("{at}.failure_rate"),
            "must be positive (above 1 disables it)",
        ));
    }
    if b.half_open_probes == 0 {
        return Err(ConfigError::new(
            format!("{at}.half_open_probes"),
            "must be at least 1",
        ));
    }
    if b.open_for.is_zero() || b.max_open_for < b.open_for {
        return Err(ConfigError::new(
            format!("{at}.max_open_for"),
            "open_for must be positive and max_open_for at least open_for",
        ));
    }
    if b.window.is_zero() || b.probe_timeout.is_zero() {
        return Err(ConfigError::new(
            format!("{at}.window"),
            "window and probe_timeout must be positive",
        ));
    }
    Ok(())
}

fn default_max_attempts() -> u32 {
    3
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// One `[[providers]]` entry on its own (ids across entries are checked by the caller).
/// `embeddings` models: on an `openai`-kind provider (its `/embeddings`),
/// with a sane `family`.
fn validate_embedding_models(i: usize, p: &ProviderConfig) -> Result<(), ConfigError> {
    for (j, m) in p.models.iter().enumerate() {
        let at = |field: &str| format!("providers[{i}].models[{j}].{field}");
        if m.has(Capability::Embeddings) && p.kind != ProviderKind::Openai {
            return Err(ConfigError::new(
                at("capabilities"),
                format!(
                    "`embeddings` is served from an `openai`-kind provider's /embeddings (OpenAI, vLLM, llama.cpp, Ollama, TEI), not `{}`",
                    p.kind.as_str()
                ),
            ));
        }
        if let Some(f) = &m.family {
            if f.is_empty() || f.len() > 128 || f.chars().any(char::is_control) {
                return Err(ConfigError::new(
                    at("family"),
                    "must be 1 to 128 printable characters",
                ));
            }
        }
    }
    Ok(())
}

fn validate_provider(i: usize, p: &ProviderConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("providers[{i}].{field}");

    if !valid_name(&p.id) {
        return Err(ConfigError::new(
            at("id"),
            format!("`{}` must be non-empty letters, digits, `-` or `_`", p.id),
        ));
    }
    match reqwest::Url::parse(&p.base_url) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => {}
        _ => {
            return Err(ConfigError::new(
                at("base_url"),
                format!("`{}` is not an http(s) URL", p.base_url),
            ))
        }
    }
    match (p.kind, p.api_version.as_deref()) {
        (ProviderKind::AzureOpenai, None) => {
            return Err(ConfigError::new(
                at("api_version"),
                "required for kind = \"azure_openai\" (e.g. \"2024-10-21\")",
            ))
        }
        (ProviderKind::AzureOpenai, Some(v))
            if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
        {
            return Err(ConfigError::new(
                at("api_version"),
                format!("`{v}` is not an API version (letters, digits and `-`)"),
            ))
        }
        (ProviderKind::AzureOpenai, Some(_)) | (_, None) => {}
        (kind, Some(_)) => {
            return Err(ConfigError::new(
                at("api_version"),
                format!(
                    "only kind = \"azure_openai\" takes an api_version, not `{}`",
                    kind.as_str()
                ),
            ))
        }
    }
    let hosted = p.kind.hosted();
    match (hosted, p.region.as_deref()) {
        (true, None) => {
            return Err(ConfigError::new(
                at("region"),
                format!(
                    "required for kind = \"{}\" (e.g. \"us-east-1\" or \"us-east5\")",
                    p.kind.as_str()
                ),
            ))
        }
        (true, Some(r))
            if r.is_empty()
                || !r
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') =>
        {
            return Err(ConfigError::new(
                at("region"),
                format!("`{r}` is not a region"),
            ))
        }
        (true, Some(_)) | (false, None) => {}
        (false, Some(_)) => {
            return Err(ConfigError::new(
                at("region"),
                format!(
                    "only bedrock_anthropic, vertex_anthropic and vertex_gemini take a region, not `{}`",
                    p.kind.as_str()
                ),
            ))
        }
    }
    let vertex = p.kind.google_service_account();
    match (vertex, p.project.as_deref()) {
        (true, None) => {
            return Err(ConfigError::new(
                at("project"),
                format!(
                    "required for kind = \"{}\" (the Google Cloud project id)",
                    p.kind.as_str()
                ),
            ))
        }
        (true, Some(pr))
            if pr.is_empty()
                || !pr
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') =>
        {
            return Err(ConfigError::new(
                at("project"),
                format!("`{pr}` is not a project id"),
            ))
        }
        (false, Some(_)) => {
            return Err(ConfigError::new(
                at("project"),
                "only kinds vertex_anthropic and vertex_gemini take a project",
            ))
        }
        _ => {}
    }
    if !vertex && p.credentials_file_env.is_some() {
        return Err(ConfigError::new(
            at("credentials_file_env"),
            "only kinds vertex_anthropic and vertex_gemini take a credentials_file_env",
        ));
    }
    if let Some(keys) = &p.keys {
        if p.api_key_env.is_some() {
            return Err(ConfigError::new(
                at("keys"),
                "set either api_key_env or keys, not both",
            ));
        }
        if hosted {
            return Err(ConfigError::new(
                at("keys"),
                format!("`{}` authenticates without API keys", p.kind.as_str()),
            ));
        }
        if keys.is_empty() {
            return Err(ConfigError::new(at("keys"), "must list at least one key"));
        }
        let mut names = std::collections::HashSet::new();
        for (k, key) in keys.iter().enumerate() {
            let at_key = |f: &str| at(&format!("keys[{k}].{f}"));
            if !valid_name(&key.name) || !names.insert(key.name.as_str()) {
                return Err(ConfigError::new(
                    at_key("name"),
                    format!(
                        "`{}` must be a unique name of letters, digits, `-` or `_`",
                        key.name
                    ),
                ));
            }
            if key.env.is_empty() || key.env.contains('=') {
                return Err(ConfigError::new(
                    at_key("env"),
                    format!("`{}` is not an environment variable name", key.env),
                ));
            }
            if key.weight == 0 {
                return Err(ConfigError::new(at_key("weight"), "must be at least 1"));
            }
            if key.max_concurrency == Some(0) {
                return Err(ConfigError::new(
                    at_key("max_concurrency"),
                    "must be at least 1",
                ));
            }
        }
    }
    if p.kind == ProviderKind::Gemini && p.api_key_env.is_none() && p.keys.is_none() {
        return Err(ConfigError::new(
            at("api_key_env"),
            "required for kind = \"gemini\" (or keys): AI Studio takes an API key",
        ));
    }
    if let Some(env) = &p.api_key_env {
        if env.is_empty() || env.contains('=') {
            return Err(ConfigError::new(
                at("api_key_env"),
                format!("`{env}` is not an environment variable name"),
            ));
        }
    }
    if p.max_concurrency == 0 {
        return Err(ConfigError::new(
            at("max_concurrency"),
            "must be at least 1",
        ));
    }
    if p.failover_max_concurrency > p.max_concurrency {
        return Err(ConfigError::new(
            at("failover_max_concurrency"),
            format!(
                "{} exceeds max_concurrency {}",
                p.failover_max_concurrency, p.max_concurrency
            ),
        ));
    }
    for (field, d) in [
        ("connect_timeout", p.connect_timeout),
        ("first_token_timeout", p.first_token_timeout),
        ("idle_timeout", p.idle_timeout),
        ("cooldown.max_retry_after", p.cooldown.max_retry_after),
    ] {
        if d.is_zero() {
            return Err(ConfigError::new(at(field), "must be positive"));
        }
    }
    check_breaker(&p.breaker, &at("breaker"))?;
    if p.health.window.is_zero() || p.health.buckets == 0 {
        return Err(ConfigError::new(
            at("health.window"),
            "window and buckets must be positive",
        ));
    }
    if p.models.is_empty() {
        return Err(ConfigError::new(
            at("models"),
            "at least one model is required",
        ));
    }
    let mut names = HashSet::new();
    for (j, m) in p.models.iter().enumerate() {
        if m.name.is_empty() {
            return Err(ConfigError::new(
                format!("providers[{i}].models[{j}].name"),
                "must not be empty",
            ));
        }
        if !names.insert(m.name.as_str()) {
            return Err(ConfigError::new(
                format!("providers[{i}].models[{j}].name"),
                format!("duplicate model `{}`", m.name),
            ));
        }
        for (field, usd) in m.price.fields() {
            if let Some(usd) = usd.filter(|u| !(u.is_finite() && *u >= 0.0)) {
                return Err(ConfigError::new(
                    format!("providers[{i}].models[{j}].price.{field}"),
                    format!("{usd} must be a finite, non-negative USD per million tokens"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[server]
grpc_listen = "127.0.0.1:50051"
admin_listen = "127.0.0.1:9464"

[[providers]]
id = "primary"
kind = "openai"
base_url = "http://127.0.0.1:8001/v1"
api_key_env = "PRIMARY_API_KEY"
max_concurrency = 64
failover_max_concurrency = 16

  [[providers.models]]
  name = "gpt-4o-mini"
  capabilities = ["chat", "stream", "tools", "json"]
  context_tokens = 128000

[[providers]]
id = "secondary"
kind = "anthropic"
base_url = "http://127.0.0.1:8002/v1"

  [[providers.models]]
  name = "claude-sonnet-4-5"

[[routes]]
name = "chat"
targets = ["primary/gpt-4o-mini", "secondary/claude-sonnet-4-5"]
"#;

    #[test]
    fn the_issue_example_parses() {
        let c = Config::from_toml_str(GOOD).unwrap();
        assert_eq!(c.providers.len(), 2);
        assert_eq!(c.providers[1].max_concurrency, 64);
        assert_eq!(
            c.providers[1].models[0].capabilities,
            vec![Capability::Chat, Capability::Stream]
        );
        assert_eq!(
            c.resolve_target("secondary/claude-sonnet-4-5").unwrap(),
            TargetRef {
                provider: 1,
                model: 0
            }
        );
    }

    fn err(text: &str) -> ConfigError {
        Config::from_toml_str(text).unwrap_err()
    }

    #[test]
    fn embeddings_models_and_their_family() {
        let with = |model: &str, route: &str| {
            GOOD.replace(
                "  name = \"gpt-4o-mini\"\n",
                &format!("  name = \"gpt-4o-mini\"\n{model}\n"),
            )
            .replace(
                "targets = [\"primary/gpt-4o-mini\", \"secondary/claude-sonnet-4-5\"]",
                &format!("targets = [\"primary/gpt-4o-mini\"]\n{route}"),
            )
        };
        let c = Config::from_toml_str(&with(
            "  family = \"te3\"",
            "embedding_family_failover = \"any\"",
        ))
        .unwrap();
        assert_eq!(c.providers[0].models[0].family(), "te3");
        assert_eq!(c.providers[1].models[0].family(), "claude-sonnet-4-5");
        assert_eq!(c.routes[0].embedding_family_failover, FamilyFailover::Any);
        let c = Config::from_toml_str(GOOD).unwrap();
        assert_eq!(c.routes[0].embedding_family_failover, FamilyFailover::Same);
        let e = err(&with("  family = \"\"", ""));
        assert_eq!(e.path, "providers[0].models[0].family");
        let e = err(&with("", "embedding_family_failover = \"some\""));
        assert_eq!(e.path, "routes[0].embedding_family_failover");
        // Embeddings come from an OpenAI-compatible /embeddings only.
        let e = err(&GOOD.replace(
            "  name = \"claude-sonnet-4-5\"",
            "  name = \"claude-sonnet-4-5\"\n  capabilities = [\"embeddings\"]",
        ));
        assert_eq!(e.path, "providers[1].models[0].capabilities");
        assert!(e.message.contains("`anthropic`"), "{e}");
    }

    /// README's worked examples ("Prices and prompt caching"), to the cent.
    #[test]
    fn readme_worked_prices() {
        use crate::chat::{Dialect, Usage};
        let price = |input, output, read| Price {
            input_per_mtok: input,
            output_per_mtok: output,
            cache_read_per_mtok: read,
            ..Price::default()
        };
        let usage = |input, read, write, write_1h, output, reasoning| Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_input_tokens: read,
            cache_write_input_tokens: write,
            cache_write_1h_input_tokens: write_1h,
            reasoning_tokens: reasoning,
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} != {b}");
        // OpenAI: prompt 10,000 with 8,192 cached, 500 out.
        let openai = usage(1808, 8192, 0, 0, 500, 0);
        close(
            price(2.5, 10.0, None).usage_cost(&openai, Dialect::Openai),
            0.01976,
        );
        close(
            price(2.0, 8.0, Some(0.5)).usage_cost(&openai, Dialect::Openai),
            0.011712,
        );
        // Anthropic: a 6,000-token marked prefix written (5m, 1h), then read.
        let sonnet = price(3.0, 15.0, None);
        let cost = |u: &Usage| sonnet.usage_cost(u, Dialect::Anthropic);
        close(cost(&usage(50, 0, 6000, 0, 400, 0)), 0.02865);
        close(cost(&usage(50, 0, 6000, 6000, 400, 0)), 0.04215);
        close(cost(&usage(80, 6000, 0, 0, 400, 0)), 0.00804);
        close(cost(&usage(6080, 0, 0, 0, 400, 0)), 0.02424);
        // Gemini: prompt 10,000 with 8,000 cached, 300 out and 700 thoughts.
        close(
            price(0.3, 2.5, None).usage_cost(&usage(2000, 8000, 0, 0, 1000, 700), Dialect::Gemini),
            0.0037,
        );
    }

    #[test]
    fn prices_are_finite_and_non_negative_and_errors_name_the_field() {
        let priced = |price: &str| {
            GOOD.replace(
                "  name = \"claude-sonnet-4-5\"\n",
                &format!("  name = \"claude-sonnet-4-5\"\n  price = {{ {price} }}\n"),
            )
        };
        let c = Config::from_toml_str(&priced(
            "input_per_mtok = 3.0, output_per_mtok = 15.0, cache_read = 0.3, cache_write_1h = 6.0",
        ))
        .unwrap();
        let p = c.providers[1].models[0].price;
        assert_eq!(
            (p.cache_read_per_mtok, p.cache_write_1h_per_mtok),
            (Some(0.3), Some(6.0))
        );
        for (price, field) in [
            ("input_per_mtok = -1.0", "input_per_mtok"),
            ("output_per_mtok = inf", "output_per_mtok"),
            ("cache_read_per_mtok = nan", "cache_read_per_mtok"),
            ("cache_write_5m = -0.5", "cache_write_5m_per_mtok"),
            ("cache_write_1h_per_mtok = -inf", "cache_write_1h_per_mtok"),
        ] {
            let e = err(&priced(price));
            assert_eq!(
                e.path,
                format!("providers[1].models[0].price.{field}"),
                "{e}"
            );
            assert!(e.message.contains("finite, non-negative"), "{e}");
        }
    }

    #[test]
    fn cache_affinity_takes_a_ttl_within_a_day() {
        let route = "targets = [\"primary/gpt-4o-mini\", \"secondary/claude-sonnet-4-5\"]";
        let with = |extra: &str| GOOD.replace(route, &format!("{route}\n{extra}"));
        let c = Config::from_toml_str(&with("cache_affinity = { ttl = \"5m\" }")).unwrap();
        assert_eq!(
            c.routes[0].cache_affinity,
            Some(CacheAffinityConfig {
                ttl: Duration::from_secs(300)
            })
        );
        assert_eq!(
            Config::from_toml_str(GOOD).unwrap().routes[0].cache_affinity,
            None
        );
        for bad in ["\"0s\"", "\"25h\""] {
            let e = err(&with(&format!("cache_affinity = {{ ttl = {bad} }}")));
            assert_eq!(e.path, "routes[0].cache_affinity.ttl", "{e}");
        }
        let e = err(&with("cache_affinity = { ttl = \"5m\", sticky = true }"));
        assert!(e.path.starts_with("routes[0].cache_affinity"), "{e}");
    }

    #[test]
    fn unknown_field_names_its_path() {
        let e = err(&GOOD.replace(
            "max_concurrency = 64",
            "max_concurrency = 64\nmax_concurency = 3",
        ));
        assert_eq!(e.path, "providers[0].max_concurency");
        assert!(e.message.contains("max_concurency"), "{e}");
    }

    #[test]
    fn bad_kind_names_its_path_and_value() {
        let e = err(&GOOD.replace("kind = \"anthropic\"", "kind = \"antropic\""));
        assert_eq!(e.path, "providers[1].kind");
        assert!(e.message.contains("antropic"), "{e}");
    }

    #[test]
    fn bad_duration_names_its_path() {
        let e = err(&GOOD.replace(
            "max_concurrency = 64\nfailover",
            "idle_timeout = \"soon\"\nmax_concurrency = 64\nfailover",
        ));
        assert_eq!(e.path, "providers[0].idle_timeout");
    }

    #[test]
    fn a_duration_of_centuries_is_refused_with_its_path_not_a_panic_per_request() {
        let route = "targets = [\"primary/gpt-4o-mini\", \"secondary/claude-sonnet-4-5\"]";
        for (key, at, path) in [
            ("cache_ttl", route, "routes[0].cache_ttl"),
            ("deadline", route, "routes[0].deadline"),
            (
                "breaker.open_for",
                "failover_max_concurrency = 16",
                "providers[0].breaker.open_for",
            ),
            (
                "body_read_timeout",
                "admin_listen = \"127.0.0.1:9464\"",
                "server.body_read_timeout",
            ),
            ("ttl", "[idempotency]", "idempotency.ttl"),
        ] {
            let text = if at == "[idempotency]" {
                format!("{GOOD}\n[idempotency]\nttl = \"500000000000y\"\n")
            } else {
                GOOD.replace(at, &format!("{at}\n{key} = \"500000000000y\""))
            };
            let e = err(&text);
            assert_eq!(e.path, path, "{e}");
            assert!(e.message.contains("longer than 10 years"), "{e}");
        }
        // Ten years is still a setting.
        let c =
            Config::from_toml_str(&GOOD.replace(route, &format!("{route}\ncache_ttl = \"3650d\"")))
                .unwrap();
        assert_eq!(c.routes[0].cache_ttl, duration::LONGEST);
    }

    #[test]
    fn unknown_target_names_route_and_index() {
        let e = err(&GOOD.replace("secondary/claude-sonnet-4-5\"]", "secondary/claude-3\"]"));
        assert_eq!(e.path, "routes[0].targets[1]");
        assert!(e.message.contains("claude-3"), "{e}");
    }

    #[test]
    fn targets_take_a_string_or_a_table() {
        let c = Config::from_toml_str(&GOOD.replace(
            "targets = [\"primary/gpt-4o-mini\", \"secondary/claude-sonnet-4-5\"]",
            "targets = [\"primary/gpt-4o-mini\", { target = \"secondary/claude-sonnet-4-5\", priority = 0, weight = 3 }]\nmid_stream = \"reset\"",
        ))
        .unwrap();
        let r = &c.routes[0];
        assert_eq!(r.targets[1].weight, 3);
        assert_eq!(r.targets[1].priority, Some(0));
        assert_eq!(r.mid_stream, MidStreamPolicy::Reset);
        assert_eq!(r.max_attempts, 3);
        let e = err(&GOOD.replace(
            "\"secondary/claude-sonnet-4-5\"]",
            "{ target = \"secondary/claude-sonnet-4-5\", wieght = 3 }]",
        ));
        assert_eq!(e.path, "routes[0].targets[1]");
    }

    #[test]
    fn failover_ceiling_above_total_is_rejected() {
        let e = err(&GOOD.replace(
            "failover_max_concurrency = 16",
            "failover_max_concurrency = 100",
        ));
        assert_eq!(e.path, "providers[0].failover_max_concurrency");
    }

    #[test]
    fn duplicate_provider_is_rejected() {
        let e = err(&GOOD.replace("id = \"secondary\"", "id = \"primary\""));
        assert_eq!(e.path, "providers[1].id");
    }

    #[test]
    fn semantic_cache_settings_are_checked_with_their_paths() {
        let with = |settings: &str, ladder: &str| {
            GOOD.replace(
                "  name = \"gpt-4o-mini\"",
                "  name = \"emb\"\n  capabilities = [\"embeddings\"]\n  [[providers.models]]\n  name = \"gpt-4o-mini\"",
            ) + &format!("ladder = {ladder}\nsemantic_cache = {{ {settings} }}\n")
        };
        let rung = "[\"fallback\", \"semantic_cache\", \"refuse\"]";
        let c = Config::from_toml_str(&with("embedder = \"primary/emb\"", rung)).unwrap();
        let s = c.routes[0].semantic_cache.as_ref().unwrap();
        assert_eq!(s.threshold, 0.92);
        assert_eq!(s.max_entries, 100_000);
        assert_eq!(s.ttl, Duration::from_secs(3600));
        assert!(c.routes[0].has_rung(Rung::SemanticCache));
        for (settings, ladder, path, says) in [
            (
                "embedder = \"primary/gpt-4o-mini\"",
                rung,
                "embedder",
                "embeddings",
            ),
            (
                "embedder = \"secondary/claude-sonnet-4-5\"",
                rung,
                "embedder",
                "embeddings",
            ),
            ("embedder = \"primary/nope\"", rung, "embedder", "no model"),
            (
                "embedder = \"primary/emb\", threshold = 1.5",
                rung,
                "threshold",
                "(0, 1]",
            ),
            (
                "embedder = \"primary/emb\", max_entries = 0",
                rung,
                "max_entries",
                "outside",
            ),
            (
                "embedder = \"primary/emb\", ttl = \"0s\"",
                rung,
                "ttl",
                "positive",
            ),
            (
                "embedder = \"primary/emb\", fresh_within = \"2h\"",
                rung,
                "fresh_within",
                "ttl",
            ),
            (
                "embedder = \"primary/emb\", lookup_timeout = \"1m\"",
                rung,
                "lookup_timeout",
                "10s",
            ),
            (
                "embedder = \"primary/emb\", threshhold = 0.9",
                rung,
                "threshhold",
                "unknown",
            ),
            (
                "embedder = \"primary/emb\"",
                "[\"fallback\", \"refuse\"]",
                "",
                "never read",
            ),
        ] {
            let e = err(&with(settings, ladder));
            let want = if path.is_empty() {
                "routes[0].semantic_cache".to_string()
            } else {
                format!("routes[0].semantic_cache.{path}")
            };
            assert_eq!(e.path, want, "{settings}: {e}");
            assert!(e.message.contains(says), "{settings}: {e}");
        }
        let e = err(&GOOD.replace(
            "targets = [",
            "ladder = [\"fallback\", \"semantic_cache\"]\ntargets = [",
        ));
        assert_eq!(e.path, "routes[0].ladder");
        assert!(e.message.contains("semantic_cache"), "{e}");
    }

    #[test]
    fn builtin_config_is_valid_and_spans_both_kinds() {
        let c = Config::builtin(Some("http://127.0.0.1:1/v1"), Some("http://127.0.0.1:2/v1"));
        c.validate().unwrap();
        assert_eq!(c.routes[0].name, "chat");
        assert!(c.providers.iter().all(|p| p.api_key_env.is_none()));
        let real = Config::builtin(None, None);
        real.validate().unwrap();
        assert_eq!(
            real.providers[0].api_key_env.as_deref(),
            Some("OPENAI_API_KEY")
        );
    }
}
