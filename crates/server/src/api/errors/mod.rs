//! The one error table: every error a caller can see, on every surface (gRPC,
//! the OpenAI-shaped doors and Batch, the Anthropic door, the Admin API).
//! Each [`Kind`] is one row ([`Kind::entry`]): its gRPC code, its own HTTP
//! status, the `ErrorInfo` reason and metadata keys, whether `RetryInfo` is
//! sent, and the OpenAI and Anthropic envelope types. [`request`] and [`admin`]
//! say which row an error is; [`CallerError`] carries it to a renderer
//! ([`grpc`] here, the door's own `error.rs` for each HTTP envelope), which
//! reads the row and decides nothing of its own.

pub mod admin;
pub mod grpc;
pub mod request;

use std::time::Duration;

use http::StatusCode;
use tonic::Code;

pub use admin::AdminError;
pub use grpc::{admin_status, to_status};
pub use request::reason;

/// `ErrorInfo.domain` of every Switchyard error.
pub const DOMAIN: &str = "switchyard.dev";

/// Longest error text sent (`grpc-message`, an envelope's `message`):
/// whatever a caller or upstream put into it, the status always fits the
/// response headers.
pub const MAX_MESSAGE: usize = 1024;
/// Longest ErrorInfo metadata value.
pub const MAX_META_VALUE: usize = 256;

/// Whether an error carries `RetryInfo` (and an HTTP `retry-after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Never: retrying the same call cannot help, or nothing says when.
    Never,
    /// When a time is known (the upstream's `Retry-After`, a limiter's refill).
    IfKnown,
    /// Always, with a default of one second when nothing better is known.
    Always,
}

/// One row of the table: everything a caller sees of one kind of error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// `ErrorInfo.reason`; the `code` of the OpenAI envelope and Anthropic's
    /// `details.error_code`.
    pub reason: &'static str,
    pub grpc: Code,
    /// The HTTP status of every HTTP door (Anthropic's says 529 for 503).
    pub http: StatusCode,
    /// `error.type` of the OpenAI envelope.
    pub openai_type: &'static str,
    /// `error.type` of the Anthropic envelope.
    pub anthropic_type: &'static str,
    pub retry: Retry,
    /// The `ErrorInfo.metadata` keys this row may carry.
    pub meta: &'static [&'static str],
    /// OpenAI's own `error.code` where its API defines one (clients match on it).
    pub openai_code: Option<&'static str>,
}

impl Entry {
    /// The Anthropic door's status: Anthropic's 529 `overloaded_error` (its
    /// clients retry it and fail over on it) where the others say 503.
    pub fn anthropic_status(&self) -> StatusCode {
        match self.http {
            StatusCode::SERVICE_UNAVAILABLE => {
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE)
            }
            other => other,
        }
    }

    /// The OpenAI envelope's `code`.
    pub fn openai_code(&self) -> &'static str {
        self.openai_code.unwrap_or(self.reason)
    }

    /// The `error.code` of a failed Responses API response.
    pub fn responses_code(&self) -> &'static str {
        match self.http.as_u16() {
            429 => "rate_limit_exceeded",
            400 | 404 | 413 => "invalid_prompt",
            _ => "server_error",
        }
    }
}

/// Every row of the table, by name. A reason may name two rows when the
/// same failure is told differently before and after output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    // The request itself.
    InvalidRequest,
    Unauthenticated,
    RequestTooLarge,
    MetadataTooLarge,
    RequestBodyTimeout,
    UnknownRoute,
    NoCapableTarget,
    DeadlineExceeded,
    SlowConsumer,
    DeadlineBelowP95Ttft,
    // Refused before any upstream answered.
    ConcurrencyLimit,
    TenantLimit,
    CostCap,
    RateLimited,
    NoHealthyTarget,
    RetryBudgetExhausted,
    ServerDraining,
    RouterUnavailable,
    StateUnavailable,
    // No target could serve before output, by the last failure's class.
    UpstreamInvalidRequest,
    UpstreamRequestTooLarge,
    UpstreamRateLimited,
    ProviderQuotaExhausted,
    ProviderAuthFailed,
    UpstreamModelNotFound,
    UpstreamProtocolError,
    UpstreamOverloaded,
    UpstreamTimeout,
    UpstreamUnreachable,
    UpstreamServerError,
    UpstreamUnavailable,
    // After output reached the caller.
    UpstreamStreamTruncated,
    MidStreamProtocolError,
    // Jobs, idempotency, stored responses.
    QueueFull,
    QueueUnavailable,
    JobNotFound,
    JobCorrupt,
    IdempotencyKeyInUse,
    IdempotencyKeyReused,
    ResponseNotFound,
    PreviousResponseNotFound,
    ResponsesStoreFull,
    // Resuming a stream.
    ResumeNotFound,
    ResumeExpired,
    StreamNotResumable,
    ResumeOwnerGone,
    StreamCancelled,
    // The Admin API.
    AdminDisabled,
    AdminInvalidArgument,
    UnknownProvider,
    UnknownModel,
    ProviderUnavailable,
    ValidationStoreUnavailable,
    // The HTTP doors and Batch/Files.
    Internal,
    UnknownEndpoint,
    FilesBusy,
    NotFound,
    BatchFinal,
    FileQuota,
    FileStoreFull,
}

/// The metadata of an upstream failure (before or after output).
const UPSTREAM: &[&str] = &[
    "provider",
    "attempts",
    "outcome",
    "upstream_request_id",
    "tokens_emitted",
];

impl Kind {
    /// Every row, in the table's order.
    pub const ALL: [Kind; 60] = {
        use Kind::*;
        [
            InvalidRequest,
            Unauthenticated,
            RequestTooLarge,
            MetadataTooLarge,
            RequestBodyTimeout,
            UnknownRoute,
            NoCapableTarget,
            DeadlineExceeded,
            SlowConsumer,
            DeadlineBelowP95Ttft,
            ConcurrencyLimit,
            TenantLimit,
            CostCap,
            RateLimited,
            NoHealthyTarget,
            RetryBudgetExhausted,
            ServerDraining,
            RouterUnavailable,
            StateUnavailable,
            UpstreamInvalidRequest,
            UpstreamRequestTooLarge,
            UpstreamRateLimited,
            ProviderQuotaExhausted,
            ProviderAuthFailed,
            UpstreamModelNotFound,
            UpstreamProtocolError,
            UpstreamOverloaded,
            UpstreamTimeout,
            UpstreamUnreachable,
            UpstreamServerError,
            UpstreamUnavailable,
            UpstreamStreamTruncated,
            MidStreamProtocolError,
            QueueFull,
            QueueUnavailable,
            JobNotFound,
            JobCorrupt,
            IdempotencyKeyInUse,
            IdempotencyKeyReused,
            ResponseNotFound,
            PreviousResponseNotFound,
            ResponsesStoreFull,
            ResumeNotFound,
            ResumeExpired,
            StreamNotResumable,
            ResumeOwnerGone,
            StreamCancelled,
            AdminDisabled,
            AdminInvalidArgument,
            UnknownProvider,
            UnknownModel,
            ProviderUnavailable,
            ValidationStoreUnavailable,
            Internal,
            UnknownEndpoint,
            FilesBusy,
            NotFound,
            BatchFinal,
            FileQuota,
            FileStoreFull,
        ]
    };

    /// The first row with this reason (a stored error names its row so).
    pub fn of_reason(reason: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.entry().reason == reason)
    }

    /// The table.
    pub const fn entry(self) -> Entry {
        use Kind as K;
        use Retry::{Always, IfKnown, Never};
        match self {
            K::InvalidRequest => bad_request("INVALID_REQUEST", Code::InvalidArgument, &[]),
            K::Unauthenticated => row(
                "UNAUTHENTICATED",
                Code::Unauthenticated,
                StatusCode::UNAUTHORIZED,
                AUTHENTICATION,
            ),
            K::RequestTooLarge => too_large("REQUEST_TOO_LARGE", StatusCode::PAYLOAD_TOO_LARGE)
                .with_meta(&["limit_bytes"]),
            K::MetadataTooLarge => too_large(
                "METADATA_TOO_LARGE",
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            )
            .with_meta(&["size_bytes", "limit_bytes"]),
            K::RequestBodyTimeout => row(
                "REQUEST_BODY_TIMEOUT",
                Code::DeadlineExceeded,
                StatusCode::REQUEST_TIMEOUT,
                TIMEOUT,
            )
            .with_meta(&["received_bytes"]),
            K::UnknownRoute => not_found("UNKNOWN_ROUTE").with_meta(&["route"]),
            K::NoCapableTarget => bad_request(
                "NO_CAPABLE_TARGET",
                Code::FailedPrecondition,
                &["route", "missing"],
            ),
            K::DeadlineExceeded => timeout("DEADLINE_EXCEEDED").with_meta(&["attempts"]),
            K::SlowConsumer => timeout("SLOW_CONSUMER").with_meta(&["waited_ms"]),
            K::DeadlineBelowP95Ttft => {
                timeout("DEADLINE_BELOW_P95_TTFT").with_meta(&["p95_ttft_ms"])
            }
            K::ConcurrencyLimit => rate_limited("CONCURRENCY_LIMIT", Never, &["route"]),
            K::TenantLimit => rate_limited("TENANT_LIMIT", IfKnown, &["limit"]),
            K::CostCap => rate_limited("COST_CAP", Always, &["tenant", "cap_usd"]),
            K::RateLimited => rate_limited("RATE_LIMITED", Always, &["route"]),
            K::NoHealthyTarget => unavailable("NO_HEALTHY_TARGET", Always, &["route"]),
            K::RetryBudgetExhausted => unavailable(
                "RETRY_BUDGET_EXHAUSTED",
                Always,
                &["route", "attempts", "provider", "outcome"],
            ),
            K::ServerDraining => unavailable("SERVER_DRAINING", Always, &[]),
            K::RouterUnavailable => unavailable("ROUTER_UNAVAILABLE", Never, &[]),
            K::StateUnavailable => unavailable("STATE_UNAVAILABLE", Always, &[]),
            K::UpstreamInvalidRequest => {
                bad_request("UPSTREAM_INVALID_REQUEST", Code::InvalidArgument, UPSTREAM)
                    .with_retry(IfKnown)
            }
            // Told as a rate limit (429), as before the table had its own statuses.
            K::UpstreamRequestTooLarge => {
                rate_limited("UPSTREAM_REQUEST_TOO_LARGE", IfKnown, UPSTREAM)
            }
            K::UpstreamRateLimited => rate_limited("UPSTREAM_RATE_LIMITED", IfKnown, UPSTREAM),
            K::ProviderQuotaExhausted => unavailable("PROVIDER_QUOTA_EXHAUSTED", IfKnown, UPSTREAM),
            K::ProviderAuthFailed => unavailable("PROVIDER_AUTH_FAILED", IfKnown, UPSTREAM),
            K::UpstreamModelNotFound => not_found("UPSTREAM_MODEL_NOT_FOUND")
                .with_meta(UPSTREAM)
                .with_retry(IfKnown),
            K::UpstreamProtocolError => unavailable("UPSTREAM_PROTOCOL_ERROR", IfKnown, UPSTREAM),
            K::UpstreamOverloaded => unavailable("UPSTREAM_OVERLOADED", IfKnown, UPSTREAM),
            K::UpstreamTimeout => unavailable("UPSTREAM_TIMEOUT", IfKnown, UPSTREAM),
            K::UpstreamUnreachable => unavailable("UPSTREAM_UNREACHABLE", IfKnown, UPSTREAM),
            K::UpstreamServerError => unavailable("UPSTREAM_SERVER_ERROR", IfKnown, UPSTREAM),
            K::UpstreamUnavailable => unavailable("UPSTREAM_UNAVAILABLE", IfKnown, UPSTREAM),
            K::UpstreamStreamTruncated => {
                unavailable("UPSTREAM_STREAM_TRUNCATED", IfKnown, UPSTREAM)
            }
            K::MidStreamProtocolError => internal("UPSTREAM_PROTOCOL_ERROR", Code::Internal)
                .with_meta(UPSTREAM)
                .with_retry(IfKnown),
            K::QueueFull => rate_limited("QUEUE_FULL", Never, &[]),
            K::QueueUnavailable => bad_request("QUEUE_UNAVAILABLE", Code::FailedPrecondition, &[]),
            K::JobNotFound => not_found("JOB_NOT_FOUND").with_meta(&["job"]),
            K::JobCorrupt => internal("JOB_CORRUPT", Code::DataLoss),
            K::IdempotencyKeyInUse => Entry {
                openai_type: "conflict_error",
                ..row(
                    "IDEMPOTENCY_KEY_IN_USE",
                    Code::Aborted,
                    StatusCode::CONFLICT,
                    INVALID,
                )
            },
            K::IdempotencyKeyReused => {
                bad_request("IDEMPOTENCY_KEY_REUSED", Code::FailedPrecondition, &[])
            }
            K::ResponseNotFound => not_found("RESPONSE_NOT_FOUND").with_meta(&["response"]),
            // OpenAI answers 400 here (an argument of this request is wrong).
            K::PreviousResponseNotFound => Entry {
                openai_code: Some("previous_response_not_found"),
                ..bad_request(
                    "PREVIOUS_RESPONSE_NOT_FOUND",
                    Code::InvalidArgument,
                    &["response"],
                )
            },
            K::ResponsesStoreFull => {
                bad_request("RESPONSES_STORE_FULL", Code::FailedPrecondition, &["limit"])
            }
            K::ResumeNotFound => not_found("RESUME_NOT_FOUND"),
            K::ResumeExpired => not_found("RESUME_EXPIRED"),
            K::StreamNotResumable => row(
                "STREAM_NOT_RESUMABLE",
                Code::FailedPrecondition,
                StatusCode::CONFLICT,
                INVALID,
            ),
            K::ResumeOwnerGone => unavailable("RESUME_OWNER_GONE", Never, &[]),
            K::StreamCancelled => row(
                "STREAM_CANCELLED",
                Code::Cancelled,
                StatusCode::GONE,
                INVALID,
            ),
            K::AdminDisabled => row(
                "ADMIN_DISABLED",
                Code::PermissionDenied,
                StatusCode::FORBIDDEN,
                PERMISSION,
            ),
            K::AdminInvalidArgument => {
                bad_request("INVALID_ARGUMENT", Code::InvalidArgument, &["field"])
            }
            K::UnknownProvider => not_found("UNKNOWN_PROVIDER").with_meta(&["provider"]),
            K::UnknownModel => not_found("UNKNOWN_MODEL"),
            K::ProviderUnavailable => unavailable("PROVIDER_UNAVAILABLE", Never, &["provider"]),
            K::ValidationStoreUnavailable => {
                unavailable("VALIDATION_STORE_UNAVAILABLE", Never, &[])
            }
            K::Internal => internal("INTERNAL", Code::Internal),
            K::UnknownEndpoint => Entry {
                grpc: Code::Unimplemented,
                ..not_found("UNKNOWN_ENDPOINT")
            },
            K::FilesBusy => rate_limited("FILES_BUSY", Never, &[]),
            K::NotFound => not_found("NOT_FOUND"),
            K::BatchFinal => row(
                "BATCH_FINAL",
                Code::FailedPrecondition,
                StatusCode::CONFLICT,
                INVALID,
            ),
            K::FileQuota => over_quota("FILE_QUOTA"),
            K::FileStoreFull => over_quota("FILE_STORE_FULL"),
        }
    }
}

/// An `(OpenAI, Anthropic)` pair of envelope types.
type Types = (&'static str, &'static str);
const INVALID: Types = ("invalid_request_error", "invalid_request_error");
const AUTHENTICATION: Types = ("authentication_error", "authentication_error");
const PERMISSION: Types = ("permission_error", "permission_error");
const TIMEOUT: Types = ("timeout_error", "timeout_error");
const RATE_LIMIT: Types = ("rate_limit_error", "rate_limit_error");

/// A row without metadata or RetryInfo.
const fn row(reason: &'static str, grpc: Code, http: StatusCode, types: Types) -> Entry {
    Entry {
        reason,
        grpc,
        http,
        openai_type: types.0,
        anthropic_type: types.1,
        retry: Retry::Never,
        meta: &[],
        openai_code: None,
    }
}

impl Entry {
    const fn with_meta(self, meta: &'static [&'static str]) -> Entry {
        Entry { meta, ..self }
    }

    const fn with_retry(self, retry: Retry) -> Entry {
        Entry { retry, ..self }
    }
}

/// 400: something in this request is wrong.
const fn bad_request(reason: &'static str, grpc: Code, meta: &'static [&'static str]) -> Entry {
    row(reason, grpc, StatusCode::BAD_REQUEST, INVALID).with_meta(meta)
}

/// 404: what the request names does not exist.
const fn not_found(reason: &'static str) -> Entry {
    row(
        reason,
        Code::NotFound,
        StatusCode::NOT_FOUND,
        ("invalid_request_error", "not_found_error"),
    )
}

/// 413 / 431: the request or its headers are over a limit.
const fn too_large(reason: &'static str, http: StatusCode) -> Entry {
    row(
        reason,
        Code::ResourceExhausted,
        http,
        ("invalid_request_error", "request_too_large"),
    )
}

/// 504: the request's time ran out.
const fn timeout(reason: &'static str) -> Entry {
    row(
        reason,
        Code::DeadlineExceeded,
        StatusCode::GATEWAY_TIMEOUT,
        TIMEOUT,
    )
}

/// 429: a limit refused it for now.
const fn rate_limited(reason: &'static str, retry: Retry, meta: &'static [&'static str]) -> Entry {
    row(
        reason,
        Code::ResourceExhausted,
        StatusCode::TOO_MANY_REQUESTS,
        RATE_LIMIT,
    )
    .with_meta(meta)
    .with_retry(retry)
}

/// 429 in OpenAI's `insufficient_quota` shape: what a tenant stores is
/// over its quota, which frees up as files expire, not in seconds.
const fn over_quota(reason: &'static str) -> Entry {
    row(
        reason,
        Code::ResourceExhausted,
        StatusCode::TOO_MANY_REQUESTS,
        ("insufficient_quota", "rate_limit_error"),
    )
}

/// 503: no one could serve it now; another replica or a later try may.
const fn unavailable(reason: &'static str, retry: Retry, meta: &'static [&'static str]) -> Entry {
    row(
        reason,
        Code::Unavailable,
        StatusCode::SERVICE_UNAVAILABLE,
        ("server_error", "overloaded_error"),
    )
    .with_meta(meta)
    .with_retry(retry)
}

/// 500: Switchyard itself failed.
const fn internal(reason: &'static str, grpc: Code) -> Entry {
    row(
        reason,
        grpc,
        StatusCode::INTERNAL_SERVER_ERROR,
        ("server_error", "api_error"),
    )
}

/// An error as a caller sees it: its row, its text, its metadata values and
/// when to retry. Every surface renders one of these.
#[derive(Debug, Clone, PartialEq)]
pub struct CallerError {
    pub kind: Kind,
    /// Cut to [`MAX_MESSAGE`].
    pub message: String,
    /// `ErrorInfo.metadata`, each value cut to [`MAX_META_VALUE`].
    pub meta: Vec<(&'static str, String)>,
    /// `RetryInfo` and `retry-after`, where the row sends them.
    pub retry_after: Option<Duration>,
}

impl CallerError {
    /// An error of `kind` with no metadata and no retry time.
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        let mut message = message.into();
        truncate(&mut message, MAX_MESSAGE);
        CallerError {
            kind,
            message,
            meta: Vec::new(),
            retry_after: None,
        }
    }

    /// Adds a metadata value, cut to its bound.
    pub fn meta(mut self, key: &'static str, mut value: String) -> Self {
        truncate(&mut value, MAX_META_VALUE);
        self.meta.push((key, value));
        self
    }

    /// When to retry, if known: kept only where the row sends `RetryInfo`.
    pub fn retry_after(mut self, delay: Option<Duration>) -> Self {
        self.retry_after = delay.filter(|_| self.kind.entry().retry != Retry::Never);
        self
    }

    /// Switchyard could not finish the request (an answer went missing).
    pub fn internal(message: impl Into<String>) -> Self {
        CallerError::new(Kind::Internal, message)
    }

    /// This error's row.
    pub fn entry(&self) -> Entry {
        self.kind.entry()
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary, marking the cut.
pub fn truncate(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push_str("...");
}

#[cfg(test)]
mod tests;
