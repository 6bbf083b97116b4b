//! `GET /v1/models` and `GET /v1/models/{id}`: every name the doors take as
//! `model` (the routes, then each route's targets as a pinned
//! `provider/model`) in OpenAI's shape, or, for a caller that sends
//! `anthropic-version`, in Anthropic's (`api::anthropic::models`). An
//! unknown id is a 404 in the caller's shape.

use axum::extract::Path;

use super::*;
use crate::api::door::{started_unix, ListedModel};

/// Anthropic's SDKs and Claude Code send this header on every call.
fn from_anthropic(request: &Request) -> bool {
    request.headers().contains_key("anthropic-version")
}

fn model_json(m: &ListedModel) -> Value {
    json!({
        "id": m.id,
        "object": "model",
        "created": started_unix(),
        "owned_by": m.owned_by,
    })
}

pub(super) async fn list(State(s): State<Arc<HttpState>>, request: Request) -> Response {
    if from_anthropic(&request) {
        return crate::api::anthropic::models::list(&s, &request);
    }
    let request_id = s.request_id(request.headers());
    if let Err(e) = s.authenticate(request.headers()) {
        return OpenAiError::from_request(&e).response(&request_id);
    }
    let data: Vec<Value> = s.models().iter().map(model_json).collect();
    let mut r = axum::Json(json!({"object": "list", "data": data})).into_response();
    insert(r.headers_mut(), "x-request-id", &request_id);
    r
}

pub(super) async fn retrieve(
    State(s): State<Arc<HttpState>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    if from_anthropic(&request) {
        return crate::api::anthropic::models::retrieve(&s, &id, &request);
    }
    let request_id = s.request_id(request.headers());
    if let Err(e) = s.authenticate(request.headers()) {
        return OpenAiError::from_request(&e).response(&request_id);
    }
    match s.models().iter().find(|m| m.id == id) {
        Some(m) => {
            let mut r = axum::Json(model_json(m)).into_response();
            insert(r.headers_mut(), "x-request-id", &request_id);
            r
        }
        None => OpenAiError::from_request(&RequestError::UnknownRoute(id)).response(&request_id),
    }
}
