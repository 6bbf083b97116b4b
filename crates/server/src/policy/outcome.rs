//! Outcome classes: every upstream attempt ends in exactly one of these, and the
//! class alone decides retry, failover and breaker accounting (DESIGN.md §3).
//! Pure data; the wire-level classifiers live in `upstream::classify`.

use std::time::Duration;

/// The single class an attempt ends in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OutcomeClass {
    /// A terminated stream with a finish reason.
    Ok,
    /// The model refused or a content filter stopped it: a content outcome, not a failure.
    Refusal,
    /// 503, 529, Anthropic `overloaded_error`.
    Overloaded,
    /// 500, 502, 504, `api_error`, vLLM `error` finish reason.
    ServerError,
    /// A 200 whose body broke the protocol: malformed JSON/SSE, empty body, HTML page.
    Protocol,
    /// Connect, first-token or idle timeout.
    Timeout,
    /// Connection refused, reset before a response, DNS, TLS.
    Connect,
    /// The body ended without its terminator or finish reason.
    Truncated,
    /// 429 rate limit: the router's own quota at this provider.
    RateLimited,
    /// 429 `insufficient_quota`, `enforced_spend_limit_reached`, billing.
    Quota,
    /// A request larger than this provider's limits ("Request too large"): never
    /// retried here, another provider may take it.
    TooLarge,
    /// 401, 403 with the router's key: the target is misconfigured.
    Auth,
    /// 404 model not found at this provider.
    NotFound,
    /// 400, 413, 422, context too long: the caller's request is wrong.
    Invalid,
    /// The caller went away or its deadline passed: excluded from provider health.
    Cancelled,
}

impl OutcomeClass {
    /// Every class, for metrics that pre-register their label sets.
    pub const ALL: [OutcomeClass; 15] = [
        OutcomeClass::Ok,
        OutcomeClass::Refusal,
        OutcomeClass::Overloaded,
        OutcomeClass::ServerError,
        OutcomeClass::Protocol,
        OutcomeClass::Timeout,
        OutcomeClass::Connect,
        OutcomeClass::Truncated,
        OutcomeClass::RateLimited,
        OutcomeClass::Quota,
        OutcomeClass::TooLarge,
        OutcomeClass::Auth,
        OutcomeClass::NotFound,
        OutcomeClass::Invalid,
        OutcomeClass::Cancelled,
    ];

    /// Stable snake_case name used in logs, metrics and error details.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeClass::Ok => "ok",
            OutcomeClass::Refusal => "refusal",
            OutcomeClass::Overloaded => "overloaded",
            OutcomeClass::ServerError => "server_error",
            OutcomeClass::Protocol => "protocol",
            OutcomeClass::Timeout => "timeout",
            OutcomeClass::Connect => "connect",
            OutcomeClass::Truncated => "truncated",
            OutcomeClass::RateLimited => "rate_limited",
            OutcomeClass::Quota => "quota",
            OutcomeClass::TooLarge => "too_large",
            OutcomeClass::Auth => "auth",
            OutcomeClass::NotFound => "not_found",
            OutcomeClass::Invalid => "invalid",
            OutcomeClass::Cancelled => "cancelled",
        }
    }

    /// A success for breaker and health purposes.
    pub fn is_success(self) -> bool {
        matches!(self, OutcomeClass::Ok | OutcomeClass::Refusal)
    }

    /// Counts toward tripping the breaker (provider-attributable failure).
    pub fn trips_breaker(self) -> bool {
        matches!(
            self,
            OutcomeClass::Overloaded
                | OutcomeClass::ServerError
                | OutcomeClass::Protocol
                | OutcomeClass::Timeout
                | OutcomeClass::Connect
                | OutcomeClass::Truncated
        )
    }

    /// May the same target be tried again for this request (after backoff)?
    pub fn retry_same_target(self) -> bool {
        matches!(
            self,
            OutcomeClass::Overloaded
                | OutcomeClass::ServerError
                | OutcomeClass::Protocol
                | OutcomeClass::RateLimited
        )
    }

    /// May another target serve this request after this failure (before the
    /// first token)?
    pub fn fail_over(self) -> bool {
        !matches!(
            self,
            OutcomeClass::Ok
                | OutcomeClass::Refusal
                | OutcomeClass::Invalid
                | OutcomeClass::Cancelled
        )
    }

    /// Excluded from provider health entirely (neither success nor failure).
    pub fn is_excluded(self) -> bool {
        matches!(
            self,
            OutcomeClass::Cancelled
                | OutcomeClass::Invalid
                | OutcomeClass::TooLarge
                | OutcomeClass::NotFound
                | OutcomeClass::RateLimited
                | OutcomeClass::Quota
                | OutcomeClass::Auth
        )
    }
}

impl std::fmt::Display for OutcomeClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A classified failed attempt: what went wrong and what the upstream asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub class: OutcomeClass,
    /// From `retry-after-ms` / `retry-after` (seconds or HTTP-date), when valid and positive.
    pub retry_after: Option<Duration>,
    /// `x-should-retry`: overrides whether the same target may be retried.
    pub should_retry: Option<bool>,
    /// The upstream HTTP status (200 for failures found inside a stream).
    pub http_status: Option<u16>,
    /// `x-request-id` (OpenAI) or `request-id` (Anthropic).
    pub upstream_request_id: Option<String>,
    /// A short, sanitised description safe to show a caller. Never an upstream
    /// 401/403 body, never a key.
    pub message: String,
}

impl Failure {
    /// A failure with only a class and a message.
    pub fn new(class: OutcomeClass, message: impl Into<String>) -> Self {
        Failure {
            class,
            retry_after: None,
            should_retry: None,
            http_status: None,
            upstream_request_id: None,
            message: message.into(),
        }
    }

    /// Whether this target may be tried again, honouring `x-should-retry`.
    pub fn retry_same_target(&self) -> bool {
        self.should_retry
            .unwrap_or_else(|| self.class.retry_same_target())
    }
}
