//! Configuration: one strictly validated TOML file. Unknown fields are errors,
//! every error names the dotted path of the bad value, and secrets appear only
//! as the *name* of an environment variable. Pure data plus validation; no I/O
//! beyond reading the file and the environment variables it names.
//!
//! This file holds the top level and the server-wide sections; `provider`
//! (providers, keys, models), `price` (prices and the cost of usage),
//! `route` (routes and their options), `validate` (a validator per section),
//! `builtin` (the config without `--config`) and `duration` (the bounded
//! duration parser every duration setting uses) the rest.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

mod builtin;
pub mod duration;
mod price;
mod provider;
mod resume;
mod route;
#[cfg(test)]
mod tests;
mod validate;

pub use price::*;
pub use provider::*;
pub use resume::ResumeConfig;
pub use route::*;

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
    /// The resume journal of streamed completions.
    #[serde(default)]
    pub resume: ResumeConfig,
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
    /// Threads of the async runtime that serves requests; absent: one per
    /// core the process may use (tokio's default, which also reads
    /// `TOKIO_WORKER_THREADS`). Read at start only.
    pub worker_threads: Option<usize>,
}

/// The most runtime threads `server.worker_threads` may ask for.
pub const MAX_WORKER_THREADS: usize = 1024;

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
            worker_threads: None,
        }
    }
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
            if p.kind.quirks().auth == crate::upstream::Auth::AwsSigV4 {
                for env in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
                    if std::env::var_os(env).is_none() {
                        missing.push((format!("providers[{i}] (bedrock_anthropic)"), env.into()));
                    }
                }
            }
        }
        missing
    }
}
