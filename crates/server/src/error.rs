//! Request-phase errors: why a request ended without a complete answer.
//! Classified once here; `api::errors` gives each the row of the one error table
//! every surface (gRPC, the HTTP envelopes) renders.

use std::time::Duration;

use crate::policy::outcome::{Failure, OutcomeClass};

/// How a request failed, as the caller should learn it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// The request itself is malformed (field named in the message).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("unknown route `{0}`")]
    UnknownRoute(String),
    /// No or an unknown bearer token (where it is expected, named in the message).
    #[error("{0}")]
    Unauthenticated(String),
    /// The request message or body is larger than `limits.max_request_bytes`.
    #[error("request exceeds the limit of {limit} bytes (limits.max_request_bytes)")]
    RequestTooLarge { limit: usize },
    /// The call's metadata (headers) is larger than `limits.max_metadata_bytes`.
    #[error("request metadata of {size} bytes exceeds the limit of {limit} bytes (limits.max_metadata_bytes)")]
    MetadataTooLarge { size: usize, limit: usize },
    /// The request body did not arrive at the pace the HTTP listeners
    /// require (`server.body_read_timeout`, `server.body_min_rate`).
    #[error("the request body did not arrive in time ({received} bytes received; server.body_read_timeout, server.body_min_rate)")]
    BodyTooSlow { received: u64 },
    /// No target of the route declares every needed capability.
    #[error("no target of route `{route}` has {}", missing.join(", "))]
    NoCapableTarget { route: String, missing: Vec<String> },
    /// The caller's deadline passed.
    #[error("deadline exceeded after {attempts} upstream attempt(s)")]
    DeadlineExceeded { attempts: u32 },
    /// The caller stopped reading its stream for longer than `server.send_timeout`.
    #[error("the caller did not read the stream for {waited:?} (server.send_timeout); the request was dropped")]
    SlowConsumer { waited: Duration },
    /// Every candidate refused locally (concurrency ceilings): shed, not queued.
    #[error("all targets of route `{route}` are at their concurrency ceiling")]
    Saturated { route: String },
    /// No target could serve before any output was sent; `failure` is the last one.
    #[error("no target could serve: {provider} {}: {}", failure.class, failure.message)]
    Exhausted {
        /// Boxed, as every large payload of this error is: the error is in
        /// every request's future and every slot of its event channel.
        failure: Box<Failure>,
        provider: String,
        attempts: u32,
    },
    /// The serving upstream failed after output reached the caller.
    #[error("stream from {provider} failed after {tokens_emitted} chunk(s): {}: {}; the partial output is incomplete and must be discarded", failure.class, failure.message)]
    MidStream {
        failure: Box<Failure>,
        provider: String,
        tokens_emitted: u32,
        attempts: u32,
    },
    /// The server is shutting down and the drain timeout passed.
    #[error("server is draining; retry on another replica")]
    Draining,
    /// A per-tenant limit (concurrency or rate) refused the request.
    #[error("tenant `{tenant}` is over its {limit} limit")]
    TenantLimit {
        tenant: String,
        limit: &'static str,
        retry_after: Option<Duration>,
    },
    /// No key of any target had room in its rate windows (configured or
    /// reported by the upstream), within the route's `admission_wait`.
    #[error("no key of route `{route}` has room in its rate windows")]
    RateLimited { route: String, retry_in: Duration },
    /// Every capable target is tripped, cooling down or forced open.
    #[error("no healthy target for route `{route}`")]
    NoHealthyTarget {
        route: String,
        retry_in: Option<Duration>,
    },
    /// The route's retry budget refused another attempt.
    #[error("retry budget of route `{route}` exhausted after {attempts} attempt(s)")]
    RetryBudgetExhausted {
        route: String,
        last: Option<(Box<Failure>, String)>,
        attempts: u32,
    },
    /// The remaining deadline is below every candidate's p95 time to first token.
    #[error("remaining deadline is below the targets' p95 time to first token ({p95_ttft:?})")]
    DeadlineTooShort { p95_ttft: Duration },
    /// The tenant's spend cap over the window is reached.
    #[error("tenant `{tenant}` reached its spend cap ({spent_usd:.4} of {cap_usd:.4} USD)")]
    CostCap {
        tenant: String,
        spent_usd: f64,
        cap_usd: f64,
        retry_in: Duration,
    },
    /// The job queue refused the job (its bounds).
    #[error("{0}")]
    QueueFull(String),
    /// The job queue is not configured or its storage failed.
    #[error("job queue unavailable: {0}")]
    QueueUnavailable(String),
    #[error("no job `{0}`")]
    JobNotFound(String),
    /// A stored job can no longer be read.
    #[error("{0}")]
    JobCorrupt(String),
    /// A request with the same idempotency key is being served now.
    #[error("a request with this idempotency key is in flight")]
    IdempotencyKeyInUse,
    /// The idempotency key was used before with a different request.
    #[error("this idempotency key was used with a different request")]
    IdempotencyKeyReused,
    /// The shared state (Redis) could not be reached, and this request's
    /// guarantee (a stored job, one generation per key) depends on it.
    #[error("shared state unavailable: {0}")]
    StateUnavailable(String),
    /// Switchyard itself could not act (an actor did not answer).
    #[error("router unavailable: {0}")]
    Unavailable(String),
    /// No stored response of this id for the caller's tenant (OpenAI's wording).
    #[error("Response with id '{0}' not found.")]
    ResponseNotFound(String),
    /// `previous_response_id` names no stored response of the caller's
    /// tenant (OpenAI's wording and code).
    #[error("Previous response with id '{0}' not found.")]
    PreviousResponseNotFound(String),
    /// A response cannot be stored: the tenant is at a `[responses]` bound.
    #[error("tenant `{tenant}` holds {held} of {max} ({limit}); delete stored responses or send `store: false`")]
    ResponsesFull {
        tenant: String,
        limit: &'static str,
        held: u64,
        max: u64,
    },
    /// No stream of this tenant has that resume token (or it expired long ago).
    #[error("no stream of this tenant has that resume token")]
    ResumeNotFound,
    /// The stream's journal lived out `resume.ttl` after its last event.
    #[error("the stream's journal expired (resume.ttl after its last event)")]
    ResumeExpired,
    /// The stream passed a journal bound: it holds nothing to resume.
    #[error("the stream is not resumable: it passed {0}")]
    NotResumable(&'static str),
    /// The stream's writer is gone (its replica died) before it finished.
    #[error("the stream's replica stopped before it finished; it cannot be resumed")]
    ResumeOwnerGone,
    /// The caller hung up and its stream was cancelled (`on_caller_gone =
    /// "cancel"`): what a reconnect to it learns.
    #[error("the stream was cancelled when its caller hung up (on_caller_gone = \"cancel\"; send an idempotency key, or set \"finish\", to have it complete)")]
    CallerGone,
    /// How a journaled stream ended, replayed to a resumed caller: the row's
    /// reason, the message and the retry hint it was first told with.
    #[error("{message}")]
    Journaled {
        reason: String,
        message: String,
        retry_after: Option<Duration>,
    },
}

impl RequestError {
    /// When the caller may usefully try again, if known.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RequestError::Exhausted { failure, .. } | RequestError::MidStream { failure, .. } => {
                failure.retry_after
            }
            RequestError::TenantLimit { retry_after, .. } => *retry_after,
            RequestError::CostCap { retry_in, .. } => Some(*retry_in),
            RequestError::RateLimited { retry_in, .. } => Some(*retry_in),
            RequestError::NoHealthyTarget { retry_in, .. } => {
                Some(retry_in.unwrap_or(Duration::from_secs(1)))
            }
            RequestError::RetryBudgetExhausted { last, .. } => Some(
                last.as_ref()
                    .and_then(|(f, _)| f.retry_after)
                    .unwrap_or(Duration::from_secs(1)),
            ),
            RequestError::Draining | RequestError::StateUnavailable(_) => {
                Some(Duration::from_secs(1))
            }
            RequestError::Journaled { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The reason label when the request was refused without an upstream
    /// answer (for the shed metric); `None` for upstream failures and caller errors.
    pub fn shed_reason(&self) -> Option<&'static str> {
        Some(match self {
            RequestError::Saturated { .. } => "concurrency",
            RequestError::NoHealthyTarget { .. } => "no_healthy_target",
            RequestError::RetryBudgetExhausted { .. } => "retry_budget",
            RequestError::DeadlineTooShort { .. } => "deadline",
            RequestError::TenantLimit { .. } => "tenant_limit",
            RequestError::CostCap { .. } => "cost_cap",
            RequestError::RateLimited { .. } => "rate_limited",
            RequestError::QueueFull(_) => "queue_full",
            RequestError::Draining => "draining",
            _ => return None,
        })
    }

    /// No live target could answer, for reasons a lower rung (cache, queue)
    /// may make up for. Caller errors and deadlines never descend.
    pub fn may_descend_ladder(&self) -> bool {
        match self {
            RequestError::Exhausted { failure, .. } => !matches!(
                failure.class,
                OutcomeClass::Invalid | OutcomeClass::Cancelled
            ),
            RequestError::NoHealthyTarget { .. }
            | RequestError::RateLimited { .. }
            | RequestError::RetryBudgetExhausted { .. }
            | RequestError::Saturated { .. }
            | RequestError::DeadlineTooShort { .. } => true,
            _ => false,
        }
    }

    /// Upstream attempts made before this error, when known.
    pub fn attempts(&self) -> u32 {
        match self {
            RequestError::Exhausted { attempts, .. }
            | RequestError::MidStream { attempts, .. }
            | RequestError::RetryBudgetExhausted { attempts, .. }
            | RequestError::DeadlineExceeded { attempts } => *attempts,
            _ => 0,
        }
    }

    /// The outcome class behind an upstream failure.
    pub fn upstream_class(&self) -> Option<OutcomeClass> {
        match self {
            RequestError::Exhausted { failure, .. } | RequestError::MidStream { failure, .. } => {
                Some(failure.class)
            }
            _ => None,
        }
    }
}
