//! The Anthropic door's errors: `{"type":"error","error":{"type","message",
//! "details":{"error_code"}},"request_id"}` with the status the error table
//! gives (`status::anthropic_status`), `retry-after` and `request-id`. The
//! `error_code` is the `ErrorInfo` reason every other surface reports.

use std::time::Duration;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::api::door::insert;
use crate::api::status::{anthropic_status, reason, truncate, MAX_MESSAGE};
use crate::error::RequestError;

/// An error in Anthropic's shape, with its HTTP status.
#[derive(Debug, Clone)]
pub(super) struct AnthropicError {
    pub(super) status: StatusCode,
    pub(super) kind: &'static str,
    pub(super) message: String,
    pub(super) code: &'static str,
    pub(super) retry_after: Option<Duration>,
}

impl AnthropicError {
    /// A 400 for a body this door cannot take; `message` names the field.
    pub(super) fn invalid(mut message: String) -> Self {
        truncate(&mut message, MAX_MESSAGE);
        AnthropicError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            message,
            code: "INVALID_REQUEST",
            retry_after: None,
        }
    }

    pub(super) fn from_request(err: &RequestError) -> Self {
        let (status, kind) = anthropic_status(err);
        let mut message = err.to_string();
        truncate(&mut message, MAX_MESSAGE);
        AnthropicError {
            status,
            kind,
            message,
            code: reason(err),
            retry_after: err.retry_after(),
        }
    }

    pub(super) fn internal(message: &str) -> Self {
        AnthropicError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "api_error",
            message: message.into(),
            code: "INTERNAL",
            retry_after: None,
        }
    }

    /// A stream that failed after output: Anthropic clients raise on an
    /// `error` event, so the partial answer is never taken for a whole one.
    pub(super) fn truncated(message: String) -> Self {
        AnthropicError {
            status: StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
            kind: "overloaded_error",
            message,
            code: "UPSTREAM_STREAM_TRUNCATED",
            retry_after: None,
        }
    }

    pub(super) fn body(&self, request_id: &str) -> Value {
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
        insert(h, "x-should-retry", if retry { "true" } else { "false" });
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
