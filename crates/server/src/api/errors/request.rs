//! Which row of the table a [`RequestError`] is, with its metadata values:
//! the one place a request error is classified for callers. Upstream auth
//! bodies never pass: `Failure::message` is already sanitised, and auth
//! failures get a fixed text.

use crate::error::RequestError;
use crate::policy::outcome::{Failure, OutcomeClass};

use super::{CallerError, Kind};

/// The `ErrorInfo.reason` a request error is reported with.
pub fn reason(err: &RequestError) -> &'static str {
    kind(err).entry().reason
}

impl From<&RequestError> for CallerError {
    fn from(err: &RequestError) -> Self {
        let caught = CallerError::new(kind(err), err.to_string()).retry_after(err.retry_after());
        meta(err)
            .into_iter()
            .fold(caught, |c, (key, value)| c.meta(key, value))
    }
}

/// The row of a request error.
pub fn kind(err: &RequestError) -> Kind {
    match err {
        RequestError::InvalidRequest(_) => Kind::InvalidRequest,
        RequestError::Unauthenticated(_) => Kind::Unauthenticated,
        RequestError::RequestTooLarge { .. } => Kind::RequestTooLarge,
        RequestError::MetadataTooLarge { .. } => Kind::MetadataTooLarge,
        RequestError::BodyTooSlow { .. } => Kind::RequestBodyTimeout,
        RequestError::UnknownRoute(_) => Kind::UnknownRoute,
        RequestError::NoCapableTarget { .. } => Kind::NoCapableTarget,
        RequestError::DeadlineExceeded { .. } => Kind::DeadlineExceeded,
        RequestError::SlowConsumer { .. } => Kind::SlowConsumer,
        RequestError::Saturated { .. } => Kind::ConcurrencyLimit,
        RequestError::Exhausted { failure, .. } => exhausted(failure.class),
        RequestError::MidStream { failure, .. } => match failure.class {
            OutcomeClass::Protocol => Kind::MidStreamProtocolError,
            OutcomeClass::Overloaded => Kind::UpstreamOverloaded,
            _ => Kind::UpstreamStreamTruncated,
        },
        RequestError::Unavailable(_) => Kind::RouterUnavailable,
        RequestError::Draining => Kind::ServerDraining,
        RequestError::StateUnavailable(_) => Kind::StateUnavailable,
        RequestError::NoHealthyTarget { .. } => Kind::NoHealthyTarget,
        RequestError::RateLimited { .. } => Kind::RateLimited,
        RequestError::RetryBudgetExhausted { .. } => Kind::RetryBudgetExhausted,
        RequestError::DeadlineTooShort { .. } => Kind::DeadlineBelowP95Ttft,
        RequestError::CostCap { .. } => Kind::CostCap,
        RequestError::QueueFull(_) => Kind::QueueFull,
        RequestError::QueueUnavailable(_) => Kind::QueueUnavailable,
        RequestError::JobNotFound(_) => Kind::JobNotFound,
        RequestError::JobCorrupt(_) => Kind::JobCorrupt,
        RequestError::IdempotencyKeyInUse => Kind::IdempotencyKeyInUse,
        RequestError::IdempotencyKeyReused => Kind::IdempotencyKeyReused,
        RequestError::TenantLimit { .. } => Kind::TenantLimit,
        RequestError::ResponseNotFound(_) => Kind::ResponseNotFound,
        RequestError::PreviousResponseNotFound(_) => Kind::PreviousResponseNotFound,
        RequestError::ResponsesFull { .. } => Kind::ResponsesStoreFull,
        RequestError::ResumeNotFound => Kind::ResumeNotFound,
        RequestError::ResumeExpired => Kind::ResumeExpired,
        RequestError::NotResumable(_) => Kind::StreamNotResumable,
        RequestError::ResumeOwnerGone => Kind::ResumeOwnerGone,
        RequestError::CallerGone => Kind::StreamCancelled,
        RequestError::Journaled { reason, .. } => Kind::of_reason(reason).unwrap_or(Kind::Internal),
    }
}

/// "No target could serve", by the last failure's class.
fn exhausted(class: OutcomeClass) -> Kind {
    match class {
        OutcomeClass::Invalid => Kind::UpstreamInvalidRequest,
        OutcomeClass::TooLarge => Kind::UpstreamRequestTooLarge,
        OutcomeClass::RateLimited => Kind::UpstreamRateLimited,
        OutcomeClass::Quota => Kind::ProviderQuotaExhausted,
        OutcomeClass::Auth => Kind::ProviderAuthFailed,
        OutcomeClass::NotFound => Kind::UpstreamModelNotFound,
        OutcomeClass::Protocol => Kind::UpstreamProtocolError,
        OutcomeClass::Overloaded => Kind::UpstreamOverloaded,
        OutcomeClass::Timeout => Kind::UpstreamTimeout,
        OutcomeClass::Connect => Kind::UpstreamUnreachable,
        OutcomeClass::Truncated => Kind::UpstreamStreamTruncated,
        OutcomeClass::ServerError => Kind::UpstreamServerError,
        OutcomeClass::Ok | OutcomeClass::Refusal | OutcomeClass::Cancelled => {
            Kind::UpstreamUnavailable
        }
    }
}

/// The `ErrorInfo.metadata` values of a request error.
fn meta(err: &RequestError) -> Vec<(&'static str, String)> {
    match err {
        RequestError::RequestTooLarge { limit } => vec![("limit_bytes", limit.to_string())],
        RequestError::MetadataTooLarge { size, limit } => vec![
            ("size_bytes", size.to_string()),
            ("limit_bytes", limit.to_string()),
        ],
        RequestError::BodyTooSlow { received } => vec![("received_bytes", received.to_string())],
        RequestError::UnknownRoute(route) | RequestError::Saturated { route } => {
            vec![("route", route.clone())]
        }
        RequestError::NoHealthyTarget { route, .. } | RequestError::RateLimited { route, .. } => {
            vec![("route", route.clone())]
        }
        RequestError::NoCapableTarget { route, missing } => {
            vec![("route", route.clone()), ("missing", missing.join(","))]
        }
        RequestError::DeadlineExceeded { attempts } if *attempts > 0 => {
            vec![("attempts", attempts.to_string())]
        }
        RequestError::SlowConsumer { waited } => {
            vec![("waited_ms", waited.as_millis().to_string())]
        }
        RequestError::Exhausted {
            failure,
            provider,
            attempts,
        } => upstream(failure, provider, *attempts, None),
        RequestError::MidStream {
            failure,
            provider,
            tokens_emitted,
            attempts,
        } => upstream(failure, provider, *attempts, Some(*tokens_emitted)),
        RequestError::RetryBudgetExhausted {
            route,
            last,
            attempts,
        } => {
            let mut meta = vec![("route", route.clone()), ("attempts", attempts.to_string())];
            if let Some((f, provider)) = last {
                meta.push(("provider", provider.clone()));
                meta.push(("outcome", f.class.as_str().into()));
            }
            meta
        }
        RequestError::DeadlineTooShort { p95_ttft } => {
            vec![("p95_ttft_ms", p95_ttft.as_millis().to_string())]
        }
        RequestError::CostCap {
            tenant, cap_usd, ..
        } => vec![
            ("tenant", tenant.clone()),
            ("cap_usd", format!("{cap_usd}")),
        ],
        RequestError::JobNotFound(id) => vec![("job", id.clone())],
        RequestError::TenantLimit { limit, .. } | RequestError::ResponsesFull { limit, .. } => {
            vec![("limit", (*limit).into())]
        }
        RequestError::ResponseNotFound(id) | RequestError::PreviousResponseNotFound(id) => {
            vec![("response", id.clone())]
        }
        _ => Vec::new(),
    }
}

/// Who failed, after how many attempts, how, and (after output) how much
/// the caller had received.
fn upstream(
    failure: &Failure,
    provider: &str,
    attempts: u32,
    tokens_emitted: Option<u32>,
) -> Vec<(&'static str, String)> {
    let mut meta = vec![
        ("provider", provider.to_string()),
        ("attempts", attempts.to_string()),
        ("outcome", failure.class.as_str().to_string()),
    ];
    if let Some(n) = tokens_emitted {
        meta.push(("tokens_emitted", n.to_string()));
    }
    if let Some(id) = &failure.upstream_request_id {
        meta.push(("upstream_request_id", id.clone()));
    }
    meta
}
