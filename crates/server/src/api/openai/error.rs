//! The OpenAI-shaped error envelope, for every door that speaks OpenAI's
//! wire (Chat Completions, Responses, embeddings, models, Batch and Files):
//! `{"error":{"message","type","param","code"}}` with the status, type and
//! code (the `ErrorInfo` reason, or OpenAI's own code) of the error table's
//! row, `retry-after` and `x-request-id`.

use std::time::Duration;

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::api::door::insert;
use crate::api::errors::{CallerError, Kind};
use crate::error::RequestError;

/// An error in OpenAI's shape, with its HTTP status: a row of the table
/// rendered, plus the request field it is about.
#[derive(Debug, Clone)]
pub(crate) struct OpenAiError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) param: Option<String>,
    pub(crate) code: &'static str,
    pub(crate) retry_after: Option<Duration>,
}

impl OpenAiError {
    /// Renders `e`'s row; `param` names the request field it is about.
    pub(crate) fn new(e: CallerError, param: Option<String>) -> Self {
        let entry = e.entry();
        OpenAiError {
            status: entry.http,
            message: e.message,
            kind: entry.openai_type,
            param,
            code: entry.openai_code(),
            retry_after: e.retry_after,
        }
    }

    /// An error of `kind` about no particular field.
    pub(crate) fn of(kind: Kind, message: impl Into<String>) -> Self {
        OpenAiError::new(CallerError::new(kind, message), None)
    }

    /// A 400 for a body this door cannot take; `param` names the field.
    pub(crate) fn invalid(message: String, param: Option<String>) -> Self {
        OpenAiError::new(CallerError::new(Kind::InvalidRequest, message), param)
    }

    /// A request error, with the field it names where there is one.
    pub(crate) fn from_request(err: &RequestError) -> Self {
        OpenAiError::new(CallerError::from(err), param(err))
    }

    pub(crate) fn internal(message: impl Into<String>) -> Self {
        OpenAiError::new(CallerError::internal(message), None)
    }

    pub(crate) fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }

    pub(crate) fn response(&self, request_id: &str) -> Response {
        let mut r = self.response_without_id();
        insert(r.headers_mut(), "x-request-id", request_id);
        r
    }

    fn response_without_id(&self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        let h = r.headers_mut();
        crate::api::door::retry_after(h, self.retry_after);
        if self.kind == "insufficient_quota" {
            // A quota frees up as files expire, not in seconds: SDKs that
            // honour this header do not retry.
            insert(h, "x-should-retry", "false");
        }
        r
    }
}

/// The request field an error is about: the gRPC contract's `route` is
/// this door's `model`; an invalid request's message starts with its field.
fn param(err: &RequestError) -> Option<String> {
    match err {
        RequestError::UnknownRoute(_) => Some("model".to_string()),
        RequestError::PreviousResponseNotFound(_) => Some("previous_response_id".to_string()),
        RequestError::InvalidRequest(m) => m
            .split_once(": ")
            .map(|(field, _)| field)
            .filter(|f| !f.is_empty() && !f.contains(' '))
            .map(|f| if f == "route" { "model" } else { f })
            .map(str::to_string),
        _ => None,
    }
}

/// What every path no door serves is answered with.
pub(crate) async fn not_found(request: Request) -> Response {
    OpenAiError::of(
        Kind::UnknownEndpoint,
        format!(
            "no endpoint {} {} (the HTTP doors serve POST /v1/chat/completions, POST /v1/responses, POST /v1/embeddings, GET /v1/models, GET /v1/models/{{id}}, POST /v1/messages and POST /v1/messages/count_tokens)",
            request.method(),
            request.uri().path()
        ),
    )
    .response_without_id()
}
