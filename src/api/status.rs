//! The one place a [`RequestError`] (and an [`AdminError`]) becomes a gRPC
//! status, with `google.rpc.ErrorInfo` (reason, provider, upstream request
//! id) and `RetryInfo` when a retry time is known. Upstream auth bodies never pass:
//! `Failure::message` is already sanitised, and auth failures get a fixed text.

use std::collections::HashMap;

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::RequestError;
use crate::policy::outcome::OutcomeClass;

/// `ErrorInfo.domain` of every Switchyard error.
pub const DOMAIN: &str = "switchyard.dev";

/// Maps a request error to the status the caller receives.
pub fn to_status(err: &RequestError) -> Status {
    let (code, reason, mut meta) = classify(err);
    for value in meta.values_mut() {
        truncate(value, MAX_META_VALUE);
    }
    let mut details = ErrorDetails::with_error_info(reason, DOMAIN, meta);
    if let Some(delay) = err.retry_after() {
        details.set_retry_info(Some(delay));
    }
    let mut message = err.to_string();
    truncate(&mut message, MAX_MESSAGE);
    Status::with_error_details(code, message, details)
}

/// What the Admin API refuses. Each answers with `ErrorInfo` in the same
/// domain as a request error, so an operator's tooling decodes one table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdminError {
    #[error("the admin API is disabled: set admin.token_env to enable it")]
    Disabled,
    /// A field of the request is missing or wrong; `field` names it.
    #[error("{field}: {message}")]
    InvalidArgument {
        field: &'static str,
        message: String,
    },
    #[error("provider: unknown provider `{0}`")]
    UnknownProvider(String),
    /// The provider does not serve this model (its own words).
    #[error("model: {0}")]
    UnknownModel(String),
    #[error("route: unknown route `{0}`")]
    UnknownRoute(String),
    /// The provider's actor did not answer in time (restarting or stuck).
    #[error("provider actor did not answer")]
    ProviderUnavailable(String),
    /// The validation record file could not be written.
    #[error("the record file: {0}")]
    RecordFile(String),
}

/// Maps an Admin API refusal to its status, with `ErrorInfo`.
pub fn admin_status(err: &AdminError) -> Status {
    let mut meta = HashMap::new();
    let (code, reason) = match err {
        AdminError::Disabled => (Code::PermissionDenied, "ADMIN_DISABLED"),
        AdminError::InvalidArgument { field, .. } => {
            meta.insert("field".to_string(), (*field).to_string());
            (Code::InvalidArgument, "INVALID_ARGUMENT")
        }
        AdminError::UnknownProvider(p) => {
            meta.insert("provider".to_string(), p.clone());
            (Code::NotFound, "UNKNOWN_PROVIDER")
        }
        AdminError::UnknownModel(_) => (Code::NotFound, "UNKNOWN_MODEL"),
        AdminError::UnknownRoute(r) => {
            meta.insert("route".to_string(), r.clone());
            (Code::NotFound, "UNKNOWN_ROUTE")
        }
        AdminError::ProviderUnavailable(p) => {
            meta.insert("provider".to_string(), p.clone());
            (Code::Unavailable, "PROVIDER_UNAVAILABLE")
        }
        AdminError::RecordFile(_) => (Code::Unavailable, "VALIDATION_STORE_UNAVAILABLE"),
    };
    for value in meta.values_mut() {
        truncate(value, MAX_META_VALUE);
    }
    let mut message = err.to_string();
    truncate(&mut message, MAX_MESSAGE);
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, DOMAIN, meta),
    )
}

/// Longest `grpc-message` sent: whatever a caller or upstream put into an
/// error's text, the status itself always fits the response headers.
pub const MAX_MESSAGE: usize = 1024;
/// Longest ErrorInfo metadata value.
const MAX_META_VALUE: usize = 256;

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

/// The HTTP status and OpenAI-style error type an error is answered with on
/// the HTTP doors: derived from the gRPC code, so both doors say the same.
pub fn http_status(err: &RequestError) -> (http::StatusCode, &'static str) {
    use http::StatusCode as H;
    match classify(err).0 {
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            (H::BAD_REQUEST, "invalid_request_error")
        }
        Code::NotFound => (H::NOT_FOUND, "invalid_request_error"),
        Code::Unauthenticated => (H::UNAUTHORIZED, "authentication_error"),
        Code::PermissionDenied => (H::FORBIDDEN, "permission_error"),
        Code::ResourceExhausted if matches!(err, RequestError::RequestTooLarge { .. }) => {
            (H::PAYLOAD_TOO_LARGE, "invalid_request_error")
        }
        Code::ResourceExhausted if matches!(err, RequestError::MetadataTooLarge { .. }) => {
            (H::REQUEST_HEADER_FIELDS_TOO_LARGE, "invalid_request_error")
        }
        Code::ResourceExhausted => (H::TOO_MANY_REQUESTS, "rate_limit_error"),
        Code::DeadlineExceeded if matches!(err, RequestError::BodyTooSlow { .. }) => {
            (H::REQUEST_TIMEOUT, "timeout_error")
        }
        Code::DeadlineExceeded => (H::GATEWAY_TIMEOUT, "timeout_error"),
        Code::Unavailable => (H::SERVICE_UNAVAILABLE, "server_error"),
        Code::Aborted => (H::CONFLICT, "conflict_error"),
        _ => (H::INTERNAL_SERVER_ERROR, "server_error"),
    }
}

/// The HTTP status and `error.type` of an error on the Anthropic door, from
/// the same table: what this table calls unavailable is Anthropic's 529
/// `overloaded_error` (its clients retry it and fail over on it), a timeout
/// is 504 `timeout_error`, a conflict 409.
pub fn anthropic_status(err: &RequestError) -> (http::StatusCode, &'static str) {
    use http::StatusCode as H;
    let (status, _) = http_status(err);
    let kind = match status {
        H::BAD_REQUEST | H::CONFLICT => "invalid_request_error",
        H::UNAUTHORIZED => "authentication_error",
        H::FORBIDDEN => "permission_error",
        H::NOT_FOUND => "not_found_error",
        H::PAYLOAD_TOO_LARGE | H::REQUEST_HEADER_FIELDS_TOO_LARGE => "request_too_large",
        H::TOO_MANY_REQUESTS => "rate_limit_error",
        H::GATEWAY_TIMEOUT | H::REQUEST_TIMEOUT => "timeout_error",
        H::SERVICE_UNAVAILABLE => "overloaded_error",
        _ => "api_error",
    };
    let status = match status {
        H::SERVICE_UNAVAILABLE => H::from_u16(529).unwrap_or(H::SERVICE_UNAVAILABLE),
        other => other,
    };
    (status, kind)
}

/// The `ErrorInfo.reason` an error is reported with.
pub fn reason(err: &RequestError) -> &'static str {
    classify(err).1
}

/// OpenAI's own `error.code` for the errors its API defines one for (the
/// OpenAI doors send it instead of the reason: clients match on it).
pub fn openai_code(err: &RequestError) -> Option<&'static str> {
    match err {
        RequestError::PreviousResponseNotFound(_) => Some("previous_response_not_found"),
        _ => None,
    }
}

/// The gRPC code, `ErrorInfo.reason` and metadata of an error.
fn classify(err: &RequestError) -> (Code, &'static str, HashMap<String, String>) {
    let mut meta: HashMap<String, String> = HashMap::new();
    let (code, reason) = match err {
        RequestError::InvalidRequest(_) => (Code::InvalidArgument, "INVALID_REQUEST"),
        RequestError::Unauthenticated(_) => (Code::Unauthenticated, "UNAUTHENTICATED"),
        RequestError::RequestTooLarge { limit } => {
            meta.insert("limit_bytes".into(), limit.to_string());
            (Code::ResourceExhausted, "REQUEST_TOO_LARGE")
        }
        RequestError::MetadataTooLarge { size, limit } => {
            meta.insert("size_bytes".into(), size.to_string());
            meta.insert("limit_bytes".into(), limit.to_string());
            (Code::ResourceExhausted, "METADATA_TOO_LARGE")
        }
        RequestError::BodyTooSlow { received } => {
            meta.insert("received_bytes".into(), received.to_string());
            (Code::DeadlineExceeded, "REQUEST_BODY_TIMEOUT")
        }
        RequestError::UnknownRoute(route) => {
            meta.insert("route".into(), route.clone());
            (Code::NotFound, "UNKNOWN_ROUTE")
        }
        RequestError::NoCapableTarget { route, missing } => {
            meta.insert("route".into(), route.clone());
            meta.insert("missing".into(), missing.join(","));
            (Code::FailedPrecondition, "NO_CAPABLE_TARGET")
        }
        RequestError::DeadlineExceeded { attempts } => {
            if *attempts > 0 {
                meta.insert("attempts".into(), attempts.to_string());
            }
            (Code::DeadlineExceeded, "DEADLINE_EXCEEDED")
        }
        RequestError::SlowConsumer { waited } => {
            meta.insert("waited_ms".into(), waited.as_millis().to_string());
            (Code::DeadlineExceeded, "SLOW_CONSUMER")
        }
        RequestError::Saturated { route } => {
            meta.insert("route".into(), route.clone());
            (Code::ResourceExhausted, "CONCURRENCY_LIMIT")
        }
        RequestError::Exhausted {
            failure,
            provider,
            attempts,
        } => {
            meta.insert("provider".into(), provider.clone());
            meta.insert("attempts".into(), attempts.to_string());
            meta.insert("outcome".into(), failure.class.as_str().into());
            if let Some(id) = &failure.upstream_request_id {
                meta.insert("upstream_request_id".into(), id.clone());
            }
            exhausted_code(failure.class)
        }
        RequestError::MidStream {
            failure,
            provider,
            tokens_emitted,
            attempts,
        } => {
            meta.insert("provider".into(), provider.clone());
            meta.insert("attempts".into(), attempts.to_string());
            meta.insert("tokens_emitted".into(), tokens_emitted.to_string());
            meta.insert("outcome".into(), failure.class.as_str().into());
            if let Some(id) = &failure.upstream_request_id {
                meta.insert("upstream_request_id".into(), id.clone());
            }
            match failure.class {
                OutcomeClass::Protocol => (Code::Internal, "UPSTREAM_PROTOCOL_ERROR"),
                OutcomeClass::Overloaded => (Code::Unavailable, "UPSTREAM_OVERLOADED"),
                _ => (Code::Unavailable, "UPSTREAM_STREAM_TRUNCATED"),
            }
        }
        RequestError::Unavailable(_) => (Code::Unavailable, "ROUTER_UNAVAILABLE"),
        RequestError::Draining => (Code::Unavailable, "SERVER_DRAINING"),
        RequestError::StateUnavailable(_) => (Code::Unavailable, "STATE_UNAVAILABLE"),
        RequestError::NoHealthyTarget { route, .. } => {
            meta.insert("route".into(), route.clone());
            (Code::Unavailable, "NO_HEALTHY_TARGET")
        }
        RequestError::RetryBudgetExhausted {
            route,
            last,
            attempts,
        } => {
            meta.insert("route".into(), route.clone());
            meta.insert("attempts".into(), attempts.to_string());
            if let Some((f, provider)) = last {
                meta.insert("provider".into(), provider.clone());
                meta.insert("outcome".into(), f.class.as_str().into());
            }
            (Code::Unavailable, "RETRY_BUDGET_EXHAUSTED")
        }
        RequestError::DeadlineTooShort { p95_ttft } => {
            meta.insert("p95_ttft_ms".into(), p95_ttft.as_millis().to_string());
            (Code::DeadlineExceeded, "DEADLINE_BELOW_P95_TTFT")
        }
        RequestError::CostCap {
            tenant, cap_usd, ..
        } => {
            meta.insert("tenant".into(), tenant.clone());
            meta.insert("cap_usd".into(), format!("{cap_usd}"));
            (Code::ResourceExhausted, "COST_CAP")
        }
        RequestError::QueueFull(_) => (Code::ResourceExhausted, "QUEUE_FULL"),
        RequestError::QueueUnavailable(_) => (Code::FailedPrecondition, "QUEUE_UNAVAILABLE"),
        RequestError::JobNotFound(id) => {
            meta.insert("job".into(), id.clone());
            (Code::NotFound, "JOB_NOT_FOUND")
        }
        RequestError::JobCorrupt(_) => (Code::DataLoss, "JOB_CORRUPT"),
        RequestError::IdempotencyKeyInUse => (Code::Aborted, "IDEMPOTENCY_KEY_IN_USE"),
        RequestError::IdempotencyKeyReused => (Code::FailedPrecondition, "IDEMPOTENCY_KEY_REUSED"),
        RequestError::TenantLimit { limit, .. } => {
            meta.insert("limit".into(), (*limit).into());
            (Code::ResourceExhausted, "TENANT_LIMIT")
        }
        RequestError::ResponseNotFound(id) => {
            meta.insert("response".into(), id.clone());
            (Code::NotFound, "RESPONSE_NOT_FOUND")
        }
        // OpenAI answers 400 here (an argument of this request is wrong).
        RequestError::PreviousResponseNotFound(id) => {
            meta.insert("response".into(), id.clone());
            (Code::InvalidArgument, "PREVIOUS_RESPONSE_NOT_FOUND")
        }
        RequestError::ResponsesFull { limit, .. } => {
            meta.insert("limit".into(), (*limit).into());
            (Code::FailedPrecondition, "RESPONSES_STORE_FULL")
        }
    };
    (code, reason, meta)
}

/// Status for "no target could serve", by the last failure's class.
fn exhausted_code(class: OutcomeClass) -> (Code, &'static str) {
    match class {
        OutcomeClass::Invalid => (Code::InvalidArgument, "UPSTREAM_INVALID_REQUEST"),
        OutcomeClass::TooLarge => (Code::ResourceExhausted, "UPSTREAM_REQUEST_TOO_LARGE"),
        OutcomeClass::RateLimited => (Code::ResourceExhausted, "UPSTREAM_RATE_LIMITED"),
        OutcomeClass::Quota => (Code::Unavailable, "PROVIDER_QUOTA_EXHAUSTED"),
        OutcomeClass::Auth => (Code::Unavailable, "PROVIDER_AUTH_FAILED"),
        OutcomeClass::NotFound => (Code::NotFound, "UPSTREAM_MODEL_NOT_FOUND"),
        OutcomeClass::Protocol => (Code::Unavailable, "UPSTREAM_PROTOCOL_ERROR"),
        OutcomeClass::Overloaded => (Code::Unavailable, "UPSTREAM_OVERLOADED"),
        OutcomeClass::Timeout => (Code::Unavailable, "UPSTREAM_TIMEOUT"),
        OutcomeClass::Connect => (Code::Unavailable, "UPSTREAM_UNREACHABLE"),
        OutcomeClass::Truncated => (Code::Unavailable, "UPSTREAM_STREAM_TRUNCATED"),
        OutcomeClass::ServerError => (Code::Unavailable, "UPSTREAM_SERVER_ERROR"),
        OutcomeClass::Ok | OutcomeClass::Refusal | OutcomeClass::Cancelled => {
            (Code::Unavailable, "UPSTREAM_UNAVAILABLE")
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::policy::outcome::Failure;
    use std::time::Duration;

    fn exhausted(class: OutcomeClass) -> RequestError {
        let mut failure = Failure::new(class, "boom");
        failure.retry_after = Some(Duration::from_secs(3));
        failure.upstream_request_id = Some("req_1".into());
        RequestError::Exhausted {
            failure,
            provider: "p".into(),
            attempts: 2,
        }
    }

    #[test]
    fn every_admin_refusal_carries_error_info_in_the_domain() {
        let cases = [
            (
                AdminError::Disabled,
                Code::PermissionDenied,
                "ADMIN_DISABLED",
            ),
            (
                AdminError::InvalidArgument {
                    field: "reason",
                    message: "required when forcing a breaker".into(),
                },
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
            ),
            (
                AdminError::UnknownProvider("nope".into()),
                Code::NotFound,
                "UNKNOWN_PROVIDER",
            ),
            (
                AdminError::UnknownModel("no model `x`".into()),
                Code::NotFound,
                "UNKNOWN_MODEL",
            ),
            (
                AdminError::UnknownRoute("r".into()),
                Code::NotFound,
                "UNKNOWN_ROUTE",
            ),
            (
                AdminError::ProviderUnavailable("p".into()),
                Code::Unavailable,
                "PROVIDER_UNAVAILABLE",
            ),
            (
                AdminError::RecordFile("disk full".into()),
                Code::Unavailable,
                "VALIDATION_STORE_UNAVAILABLE",
            ),
        ];
        for (err, code, reason) in cases {
            let s = admin_status(&err);
            assert_eq!((s.code(), s.message()), (code, err.to_string().as_str()));
            let info = s.get_details_error_info().unwrap();
            assert_eq!(
                (info.reason.as_str(), info.domain.as_str()),
                (reason, DOMAIN)
            );
        }
        let s = admin_status(&AdminError::InvalidArgument {
            field: "reason",
            message: "x".into(),
        });
        assert_eq!(
            s.get_details_error_info().unwrap().metadata["field"],
            "reason"
        );
    }

    #[test]
    fn deadline_is_deadline_exceeded_not_cancelled() {
        let s = to_status(&RequestError::DeadlineExceeded { attempts: 1 });
        assert_eq!(s.code(), Code::DeadlineExceeded);
    }

    #[test]
    fn exhausted_carries_error_info_and_retry_info() {
        let s = to_status(&exhausted(OutcomeClass::Overloaded));
        assert_eq!(s.code(), Code::Unavailable);
        let d = s.get_error_details();
        let info = d.error_info().unwrap();
        assert_eq!(info.reason, "UPSTREAM_OVERLOADED");
        assert_eq!(info.metadata["provider"], "p");
        assert_eq!(info.metadata["upstream_request_id"], "req_1");
        assert_eq!(
            d.retry_info().unwrap().retry_delay,
            Some(Duration::from_secs(3))
        );
    }

    #[test]
    fn caller_errors_and_provider_errors_differ() {
        assert_eq!(
            to_status(&exhausted(OutcomeClass::Invalid)).code(),
            Code::InvalidArgument
        );
        assert_eq!(
            to_status(&exhausted(OutcomeClass::Auth)).code(),
            Code::Unavailable
        );
        assert_eq!(
            to_status(&exhausted(OutcomeClass::RateLimited)).code(),
            Code::ResourceExhausted
        );
        let s = to_status(&RequestError::NoCapableTarget {
            route: "r".into(),
            missing: vec!["tools".into()],
        });
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert!(s.message().contains("tools"));
    }

    #[test]
    fn mid_stream_reasons() {
        let mk = |class| RequestError::MidStream {
            failure: Failure::new(class, "x"),
            provider: "p".into(),
            tokens_emitted: 7,
            attempts: 1,
        };
        let s = to_status(&mk(OutcomeClass::Truncated));
        assert_eq!(s.code(), Code::Unavailable);
        let info = s.get_error_details().error_info().cloned().unwrap();
        assert_eq!(info.reason, "UPSTREAM_STREAM_TRUNCATED");
        assert_eq!(info.metadata["tokens_emitted"], "7");
        assert_eq!(
            to_status(&mk(OutcomeClass::Protocol)).code(),
            Code::Internal
        );
    }
}
