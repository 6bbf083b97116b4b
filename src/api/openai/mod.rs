//! The OpenAI-compatible HTTP front door (`[server] http_listen`):
//! `POST /v1/chat/completions` (SSE or one `chat.completion`) and `GET
//! /v1/models`. A request becomes a `proto::CompletionRequest` and goes through
//! `convert::request_spec` and the same `Dispatcher` as gRPC; `model` names a
//! route. Errors use OpenAI's error JSON with the `ErrorInfo` reason as `code`.

mod error;
#[cfg(test)]
mod fuzz;
mod request;
mod response;
mod stream;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::{json, Value};

use error::*;
use request::*;
use response::*;
use stream::*;

use crate::api::auth::Authenticator;
use crate::api::convert;
use crate::api::intake::{Arrival, Door, Intake};
use crate::api::status::{http_status, reason};
use crate::chat::{Chunk, FinishReason};
use crate::error::RequestError;
use crate::proto;
use crate::reload::Reloader;
use crate::sink::{Event, Events, QueuedJob};

/// What the front door's handlers share.
pub struct HttpState {
    pub intake: Arc<Intake>,
    pub auth: Authenticator,
    /// The config in force, for `/v1/models` (follows reloads).
    pub reloader: Arc<Reloader>,
}

impl HttpState {
    pub fn new(intake: Arc<Intake>, auth: Authenticator, reloader: Arc<Reloader>) -> Self {
        HttpState {
            intake,
            auth,
            reloader,
        }
    }

    /// The caller's `x-request-id` when it is sane, else a fresh one.
    fn request_id(&self, headers: &HeaderMap) -> String {
        caller_request_id(headers).unwrap_or_else(|| self.intake.request_id())
    }

    /// The caller's tenant (`None` in open mode), or 401.
    fn authenticate(&self, headers: &HeaderMap) -> Result<Option<String>, HttpError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        self.auth
            .authenticate(value)
            .map_err(|e| HttpError::from_request(&e))
    }
}

/// The caller's `x-request-id`, when it is sane.
fn caller_request_id(headers: &HeaderMap) -> Option<String> {
    let theirs = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 128
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        });
    theirs.map(str::to_string)
}

/// The front door's routes.
pub fn router(state: Arc<HttpState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .fallback(not_found)
        .with_state(state)
}

// ---- handlers -------------------------------------------------------------

async fn models(State(s): State<Arc<HttpState>>, request: Request) -> Response {
    let request_id = s.request_id(request.headers());
    if let Err(e) = s.authenticate(request.headers()) {
        return e.response(&request_id);
    }
    let data: Vec<Value> = s
        .reloader
        .config()
        .map(|c| {
            c.routes
                .iter()
                .map(|r| {
                    json!({
                        "id": r.name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "switchyard",
                        "targets": r.targets.iter().map(|t| t.target.clone()).collect::<Vec<_>>(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let mut r = axum::Json(json!({"object": "list", "data": data})).into_response();
    insert(r.headers_mut(), "x-request-id", &request_id);
    r
}

async fn chat_completions(State(s): State<Arc<HttpState>>, request: Request) -> Response {
    let request_id = s.request_id(request.headers());
    match chat(&s, request, &request_id).await {
        Ok(r) => r,
        Err(e) => e.response(&request_id),
    }
}

/// `model` names a route, or one target as `provider/model`: then the
/// request runs on the first route that lists it, pinned to that target (the
/// route's policies, budget and ladder still apply).
fn route_and_pin(s: &HttpState, model: &str) -> Result<(String, Option<String>), HttpError> {
    if !model.contains('/') {
        return Ok((model.to_string(), None));
    }
    let config = s.reloader.config();
    let route = config
        .iter()
        .flat_map(|c| c.routes.iter())
        .find(|r| r.targets.iter().any(|t| t.target == model))
        .ok_or_else(|| HttpError::from_request(&RequestError::UnknownRoute(model.to_string())))?;
    Ok((route.name.clone(), Some(model.to_string())))
}

async fn chat(s: &HttpState, request: Request, request_id: &str) -> Result<Response, HttpError> {
    let (parts, body) = request.into_parts();
    let limit = s.intake.limits().max_metadata_bytes;
    let size = crate::api::grpc_limits::metadata_size(&parts.headers);
    if size > limit {
        return Err(HttpError::from_request(&RequestError::MetadataTooLarge {
            size,
            limit,
        }));
    }
    let tenant = s.authenticate(&parts.headers)?;
    let bytes = read_body(body, s.intake.limits().max_request_bytes, &parts.headers).await?;
    let parsed = to_proto(parse(&bytes)?)?;
    let mut request = parsed.request;
    let parsed_model = request.route.clone();
    if let Some(key) = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
    {
        request.idempotency_key = key.to_string();
    }
    let (route, pin) = route_and_pin(s, &request.route)?;
    request.route = route.clone();
    let started = s
        .intake
        .start(Arrival {
            door: Door::OpenAi,
            request,
            tenant,
            request_id: Some(request_id.to_string()),
            deadline: None,
            trace: Some(tonic::metadata::MetadataMap::from_headers(
                parts.headers.clone(),
            )),
            buffered: !parsed.stream,
            pin,
        })
        .await
        .map_err(|e| HttpError::from_request(&e))?;
    let mut rx = started.rx;
    let ids = Ids {
        id: format!("chatcmpl-{request_id}"),
        created: now_secs(),
        model: parsed_model,
    };
    if parsed.stream {
        stream(rx, ids, parsed.include_usage, request_id).await
    } else {
        let mut assembler = convert::Assembler::default();
        let mut served = None;
        while let Some(item) = rx.recv().await {
            let event = item.map_err(|e| HttpError::from_request(&e))?;
            if let Event::Queued(q) = &event {
                return Ok(queued(q, request_id));
            }
            if let Event::Finished(f) = &event {
                served = Some(Served {
                    by: format!("{}/{}", f.provider, f.model),
                    tier: f.tier.as_str(),
                    attempts: f.attempts,
                });
            }
            if let Some(done) = assembler.push(event) {
                let mut r = axum::Json(completion(&ids, done)).into_response();
                served_headers(r.headers_mut(), served.as_ref(), request_id);
                return Ok(r);
            }
        }
        Err(HttpError::internal("request ended without an answer"))
    }
}

/// Reads the body up to the request size limit (413 beyond it).
async fn read_body(body: Body, limit: usize, headers: &HeaderMap) -> Result<Bytes, HttpError> {
    let too_large = || HttpError::from_request(&RequestError::RequestTooLarge { limit });
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(too_large())
        }
        Err(e) => Err(HttpError::invalid(
            format!("cannot read the request body: {e}"),
            None,
        )),
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
