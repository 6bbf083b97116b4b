//! The OpenAI-compatible HTTP front door (`[server] http_listen`, shared
//! with the Anthropic door through `door`):
//! `POST /v1/chat/completions` (SSE or one `chat.completion`), `POST
//! /v1/embeddings` ([`embeddings`]) and `GET /v1/models[/{id}]` ([`models`]).
//! A chat request becomes a `proto::CompletionRequest` and goes through
//! `convert::request_spec` and the same `Dispatcher` as gRPC; `model` names a
//! route. Errors use OpenAI's error JSON with the `ErrorInfo` reason as `code`.

mod embeddings;
pub(crate) mod error;
#[cfg(test)]
mod fuzz;
mod models;
mod request;
mod response;
mod stream;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{json, Value};

pub(crate) use error::not_found;
use error::*;
use request::*;
use response::*;
use stream::*;

use crate::api::door::{self, insert, served_headers, HttpState};
use crate::api::intake::Door;
use crate::api::status::{http_status, reason};
use crate::chat::{Chunk, FinishReason};
use crate::error::RequestError;
use crate::proto;
use crate::sink::{Event, Events};

/// The OpenAI door's routes (mounted with the Anthropic door by `door::router`).
pub fn routes() -> axum::Router<Arc<HttpState>> {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::retrieve))
}

/// A Chat Completions body (a batch line's `body`) as the gRPC request, or
/// the refusal's message.
pub(crate) fn chat_request(body: &[u8]) -> Result<proto::CompletionRequest, String> {
    parse(body)
        .and_then(to_proto)
        .map(|p| p.request)
        .map_err(|e| e.message)
}

/// A stored answer as the `chat.completion` a batch's output line carries.
pub(crate) fn completion_json(
    id: &str,
    created: u64,
    model: &str,
    r: proto::CompletionResponse,
) -> Value {
    let ids = Ids {
        id: id.to_string(),
        created,
        model: model.to_string(),
    };
    completion(&ids, r)
}

// ---- handlers -------------------------------------------------------------

async fn chat_completions(State(s): State<Arc<HttpState>>, request: Request) -> Response {
    let request_id = s.request_id(request.headers());
    match chat(&s, request, &request_id).await {
        Ok(r) => r,
        Err(e) => e.response(&request_id),
    }
}

async fn chat(s: &HttpState, request: Request, request_id: &str) -> Result<Response, HttpError> {
    let (parts, body) = request.into_parts();
    let refused = |e: RequestError| HttpError::from_request(&e);
    s.check_metadata(&parts.headers).map_err(refused)?;
    let tenant = s.authenticate(&parts.headers).map_err(refused)?;
    let bytes = s.read_body(body, &parts.headers).await.map_err(refused)?;
    let parsed = to_proto(parse(&bytes)?)?;
    let parsed_model = parsed.request.route.clone();
    let mut rx = s
        .start(
            Door::OpenAi,
            parsed.request,
            tenant,
            request_id,
            &parts.headers,
            parsed.stream,
        )
        .await
        .map_err(refused)?;
    let ids = Ids {
        id: format!("chatcmpl-{request_id}"),
        created: now_secs(),
        model: parsed_model,
    };
    if parsed.stream {
        stream(rx, ids, parsed.include_usage, request_id).await
    } else {
        match door::assemble(&mut rx).await {
            Ok(door::Unary::Queued(q)) => Ok(door::queued(&q, request_id)),
            Ok(door::Unary::Answer(done, served)) => {
                let mut r = axum::Json(completion(&ids, done)).into_response();
                served_headers(r.headers_mut(), served.as_ref(), request_id);
                Ok(r)
            }
            Err(Some(e)) => Err(refused(e)),
            Err(None) => Err(HttpError::internal("request ended without an answer")),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn body(v: Value) -> Result<Parsed, HttpError> {
        to_proto(parse(v.to_string().as_bytes())?)
    }

    #[test]
    fn maps_openai_fields_onto_the_grpc_request() {
        let p = body(json!({
            "model": "chat",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}
            ],
            "max_completion_tokens": 7, "max_tokens": 9, "temperature": 0.5, "top_p": 0.9,
            "stop": "END",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "response_format": {"type": "json_object"},
            "stream": true, "stream_options": {"include_usage": true},
            "user": "ignored", "seed": 1
        }))
        .unwrap();
        let r = &p.request;
        assert_eq!(r.route, "chat");
        assert_eq!(r.messages[0].role, "system");
        assert_eq!(r.messages[1].content, "ab");
        assert_eq!(r.messages[2].tool_calls[0].name, "f");
        assert_eq!(r.messages[3].tool_call_id, "c1");
        assert_eq!(r.max_tokens, 7);
        assert_eq!(r.stop, vec!["END".to_string()]);
        assert_eq!(r.tools[0].parameters_json, r#"{"type":"object"}"#);
        assert_eq!(r.response_format, proto::ResponseFormat::JsonObject as i32);
        assert!(p.stream && p.include_usage);
    }

    #[test]
    fn tool_choice_required_and_named_map_onto_the_contract() {
        use proto::tool_choice::Mode;
        let choice = |c: Value| {
            body(json!({"model": "m", "messages": [], "tool_choice": c}))
                .map(|p| p.request.tool_choice.map(|t| (t.mode, t.name)))
        };
        assert_eq!(
            choice(json!("required")).unwrap(),
            Some((Mode::Any as i32, String::new()))
        );
        assert_eq!(
            choice(json!({"type": "function", "function": {"name": "f"}})).unwrap(),
            Some((Mode::Tool as i32, "f".to_string()))
        );
        assert_eq!(
            choice(json!("none")).unwrap(),
            Some((Mode::None as i32, String::new()))
        );
        let e = choice(json!({"type": "function"})).err().unwrap();
        assert_eq!(e.param.as_deref(), Some("tool_choice.function.name"));
        let e = choice(json!("sometimes")).err().unwrap();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn rejections_name_the_field() {
        let e = body(json!({"messages": []})).err().unwrap();
        assert_eq!(e.param.as_deref(), Some("model"));
        let e = body(json!({"model": "m", "messages": "hi"})).err().unwrap();
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = body(json!({"model": "m", "messages": [{"role": "user",
            "content": [{"type": "image_url"}]}]}))
        .err()
        .unwrap();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        let e = body(json!({"model": "m", "messages": [], "n": 2}))
            .err()
            .unwrap();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn request_errors_map_to_http_statuses() {
        let e = HttpError::from_request(&RequestError::UnknownRoute("x".into()));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.code, "UNKNOWN_ROUTE");
        assert_eq!(e.param.as_deref(), Some("model"));
        let e = HttpError::from_request(&RequestError::InvalidRequest(
            "messages[0].role: `x` is bad".into(),
        ));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = HttpError::from_request(&RequestError::Draining);
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(Duration::from_secs(1)));
        let e = HttpError::from_request(&RequestError::IdempotencyKeyInUse);
        assert_eq!(e.status, StatusCode::CONFLICT);
        let e = HttpError::from_request(&RequestError::DeadlineExceeded { attempts: 1 });
        assert_eq!(e.status, StatusCode::GATEWAY_TIMEOUT);
        let e = HttpError::from_request(&RequestError::Saturated { route: "r".into() });
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
    }
}
