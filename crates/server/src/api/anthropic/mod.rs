//! The Anthropic Messages front door, beside the OpenAI door on `[server]
//! http_listen`: `POST /v1/messages` (Anthropic's SSE events, or one
//! `message`) and `POST /v1/messages/count_tokens` (Switchyard's estimate).
//! A request becomes a `proto::CompletionRequest` and starts through the
//! same intake as every other door; `model` names a route or a
//! `provider/model` target. Errors use Anthropic's error JSON with the
//! status from the one error table (`api::errors`).

mod blocks;
pub(crate) mod error;
#[cfg(test)]
mod fuzz;
pub(crate) mod models;
mod request;
mod response;
mod stream;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use crate::api::door::{self, served_headers, HttpState, Served};
use crate::api::intake::Door;
use crate::error::RequestError;

use error::AnthropicError;

/// The Anthropic door's routes (mounted with the OpenAI door by `door::router`).
pub fn routes() -> axum::Router<Arc<HttpState>> {
    axum::Router::new()
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
}

/// Anthropic clients send `x-api-key`; `Authorization: Bearer` works too.
fn authenticate(s: &HttpState, headers: &HeaderMap) -> Result<Option<String>, RequestError> {
    match headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        Some(key) if headers.get(axum::http::header::AUTHORIZATION).is_none() => {
            s.auth.authenticate(Some(&format!("Bearer {}", key.trim())))
        }
        _ => s.authenticate(headers),
    }
}

pub(crate) async fn messages(State(s): State<Arc<HttpState>>, request: Request) -> Response {
    let request_id = s.request_id(request.headers());
    match serve(&s, request, &request_id).await {
        Ok(r) => r,
        Err(e) => e.response(&request_id),
    }
}

async fn serve(
    s: &HttpState,
    request: Request,
    request_id: &Arc<str>,
) -> Result<Response, AnthropicError> {
    let (parts, body) = request.into_parts();
    let refused = |e: RequestError| AnthropicError::from_request(&e);
    s.check_metadata(&parts.headers).map_err(refused)?;
    let tenant = authenticate(s, &parts.headers).map_err(refused)?;
    let bytes = s.read_body(body, &parts.headers).await.map_err(refused)?;
    let mut parsed = request::to_proto(request::parse(&bytes)?, request::Use::Messages)?;
    request::with_betas(&mut parsed.request, &parts.headers);
    let model = parsed.request.route.clone();
    let mut rx = s
        .start(
            Door::Anthropic,
            parsed.request,
            tenant,
            request_id,
            &parts.headers,
            parsed.stream,
        )
        .await
        .map_err(refused)?;
    let ids = response::Ids {
        id: ["msg_", request_id].concat(),
        model,
    };
    if parsed.stream {
        return stream::stream(rx, ids, request_id).await;
    }
    match door::assemble(&mut rx).await {
        Ok(door::Unary::Queued(q)) => Ok(door::queued(&q, request_id)),
        Ok(door::Unary::Answer(done, served)) => {
            let mut r = door::json_answer(&response::message(&ids, done));
            headers(r.headers_mut(), served, request_id);
            Ok(r)
        }
        Err(Some(e)) => Err(refused(e)),
        Err(None) => Err(AnthropicError::internal("request ended without an answer")),
    }
}

/// The served-by headers and Anthropic's `request-id`.
fn headers(h: &mut HeaderMap, served: Option<Served>, request_id: &str) {
    served_headers(h, served, request_id);
    door::insert(h, "request-id", request_id);
}

/// `POST /v1/messages/count_tokens`: the same estimate the router bills by
/// when an upstream reports no usage (about four characters a token over
/// the system prompt, messages and tool definitions), not a tokenizer's count.
async fn count_tokens(State(s): State<Arc<HttpState>>, request: Request) -> Response {
    let request_id = s.request_id(request.headers());
    let answer = async {
        let (parts, body) = request.into_parts();
        let refused = |e: RequestError| AnthropicError::from_request(&e);
        s.check_metadata(&parts.headers).map_err(refused)?;
        authenticate(&s, &parts.headers).map_err(refused)?;
        let bytes = s.read_body(body, &parts.headers).await.map_err(refused)?;
        let parsed = request::to_proto(request::parse(&bytes)?, request::Use::CountTokens)?;
        let (route, _) = s.route_and_pin(&parsed.request.route).map_err(refused)?;
        if !s.knows_route(&route) {
            return Err(refused(RequestError::UnknownRoute(route)));
        }
        Ok::<_, AnthropicError>(request::estimate_tokens(&parsed.request))
    }
    .await;
    match answer {
        Ok(tokens) => {
            let mut r = axum::Json(json!({ "input_tokens": tokens })).into_response();
            headers(r.headers_mut(), None, &request_id);
            r
        }
        Err(e) => e.response(&request_id),
    }
}
