//! The Anthropic door's error envelope: `{"type":"error","error":{"type",
//! "message","details":{"error_code"}},"request_id"}` with the Anthropic
//! status and type of the error table's row, `retry-after` and `request-id`.
//! The `error_code` is the `ErrorInfo` reason every other surface reports.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::api::door::{insert, insert_static};
use crate::api::errors::{CallerError, Kind};
use crate::error::RequestError;

/// An error in Anthropic's shape, with its HTTP status.
#[derive(Debug, Clone)]
pub(crate) struct AnthropicError {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) message: String,
    pub(crate) code: &'static str,
    pub(crate) retry_after: Option<Duration>,
}

impl AnthropicError {
    /// Renders `e`'s row.
    pub(crate) fn new(e: CallerError) -> Self {
        let entry = e.entry();
        AnthropicError {
            status: entry.anthropic_status(),
            kind: entry.anthropic_type,
            message: e.message,
            code: entry.reason,
            retry_after: e.retry_after,
        }
    }

    /// A 400 for a body this door cannot take; `message` names the field.
    pub(super) fn invalid(message: String) -> Self {
        AnthropicError::new(CallerError::new(Kind::InvalidRequest, message))
    }

    pub(crate) fn from_request(err: &RequestError) -> Self {
        AnthropicError::new(CallerError::from(err))
    }

    pub(super) fn internal(message: &str) -> Self {
        AnthropicError::new(CallerError::internal(message))
    }

    pub(crate) fn body(&self, request_id: &str) -> Value {
        json!({
            "type": "error",
            "error": {
                "type": self.kind,
                "message": self.message,
                "details": {"error_code": self.code},
            },
            "request_id": request_id,
        })
    }

    pub(super) fn response(&self, request_id: &str) -> Response {
        let mut r = (self.status, axum::Json(self.body(request_id))).into_response();
        let h = r.headers_mut();
        crate::api::door::retry_after(h, self.retry_after);
        insert(h, "request-id", request_id);
        insert(h, "x-request-id", request_id);
        // Anthropic SDKs honour this over their own guess.
        let retry = matches!(self.status.as_u16(), 408 | 409 | 429 | 500..=599);
        insert_static(h, "x-should-retry", if retry { "true" } else { "false" });
        r
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn request_errors_take_anthropic_statuses_and_types() {
        let cases = [
            (
                RequestError::UnknownRoute("x".into()),
                404,
                "not_found_error",
            ),
            (
                RequestError::InvalidRequest("messages: bad".into()),
                400,
                "invalid_request_error",
            ),
            (
                RequestError::Unauthenticated("no".into()),
                401,
                "authentication_error",
            ),
            (RequestError::Draining, 529, "overloaded_error"),
            (
                RequestError::Saturated { route: "r".into() },
                429,
                "rate_limit_error",
            ),
            (
                RequestError::DeadlineExceeded { attempts: 1 },
                504,
                "timeout_error",
            ),
            (
                RequestError::RequestTooLarge { limit: 1 },
                413,
                "request_too_large",
            ),
            (
                RequestError::IdempotencyKeyInUse,
                409,
                "invalid_request_error",
            ),
        ];
        for (err, status, kind) in cases {
            let e = AnthropicError::from_request(&err);
            assert_eq!((e.status.as_u16(), e.kind), (status, kind), "{err:?}");
        }
        let e = AnthropicError::from_request(&RequestError::Draining);
        let body = e.body("r1");
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["details"]["error_code"], "SERVER_DRAINING");
        assert_eq!(body["request_id"], "r1");
        let r = e.response("r1");
        assert_eq!(r.headers()["retry-after"], "1");
        assert_eq!(r.headers()["x-should-retry"], "true");
    }
}
