//! The OpenAI door's errors: OpenAI's error JSON (`type`, `param`, `code` =
//! the `ErrorInfo` reason) with the HTTP status the error table gives,
//! `retry-after` and `x-request-id`.

use super::*;

/// An error in OpenAI's shape, with its HTTP status.
#[derive(Debug, Clone)]
pub(crate) struct HttpError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
    pub(crate) kind: &'static str,
    pub(crate) param: Option<String>,
    pub(crate) code: &'static str,
    pub(crate) retry_after: Option<Duration>,
}

impl HttpError {
    pub(crate) fn invalid(mut message: String, param: Option<String>) -> Self {
        // Values from the body are echoed here: cut like every other refusal.
        crate::api::status::truncate(&mut message, crate::api::status::MAX_MESSAGE);
        HttpError {
            status: StatusCode::BAD_REQUEST,
            message,
            kind: "invalid_request_error",
            param,
            code: "INVALID_REQUEST",
            retry_after: None,
        }
    }

    /// The one mapping from a request error to an HTTP status and error type.
    pub(crate) fn from_request(err: &RequestError) -> Self {
        let (status, kind) = http_status(err);
        let param = match err {
            RequestError::UnknownRoute(_) => Some("model".to_string()),
            RequestError::PreviousResponseNotFound(_) => Some("previous_response_id".to_string()),
            RequestError::InvalidRequest(m) => m
                .split_once(": ")
                .map(|(field, _)| field)
                .filter(|f| !f.is_empty() && !f.contains(' '))
                // The gRPC contract's `route` is this door's `model`.
                .map(|f| if f == "route" { "model" } else { f })
                .map(str::to_string),
            _ => None,
        };
        let mut message = err.to_string();
        crate::api::status::truncate(&mut message, crate::api::status::MAX_MESSAGE);
        HttpError {
            status,
            message,
            kind,
            param,
            code: crate::api::status::openai_code(err).unwrap_or_else(|| reason(err)),
            retry_after: err.retry_after(),
        }
    }

    pub(crate) fn internal(message: &str) -> Self {
        HttpError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: "INTERNAL",
            retry_after: None,
        }
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
        let mut r = (self.status, axum::Json(self.body())).into_response();
        let h = r.headers_mut();
        crate::api::door::retry_after(h, self.retry_after);
        insert(h, "x-request-id", request_id);
        r
    }
}

pub(crate) async fn not_found(request: Request) -> Response {
    HttpError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "no endpoint {} {} (the HTTP doors serve POST /v1/chat/completions, POST /v1/responses, POST /v1/embeddings, GET /v1/models, GET /v1/models/{{id}}, POST /v1/messages and POST /v1/messages/count_tokens)",
            request.method(),
            request.uri().path()
        ),
        kind: "invalid_request_error",
        param: None,
        code: "UNKNOWN_ENDPOINT",
        retry_after: None,
    }
    .into_response_plain()
}

impl HttpError {
    pub(crate) fn into_response_plain(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
