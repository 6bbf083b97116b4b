//! `GET /v1/models` and `GET /v1/models/{id}` in Anthropic's shape, for
//! callers that send `anthropic-version` (Claude Code's gateway model
//! discovery, the Anthropic SDKs' `models.list()`): `{"data":[{"type":
//! "model","id","display_name","created_at"}],"has_more","first_id",
//! "last_id"}`, paged by `limit` (1 to 1000, default 20), `after_id` and
//! `before_id`. The names are the OpenAI door's (`HttpState::models`).

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::error::AnthropicError;
use crate::api::door::{insert, started_unix, HttpState, ListedModel};
use crate::api::errors::{CallerError, Kind};

fn model_json(m: &ListedModel) -> Value {
    let created = std::time::UNIX_EPOCH + std::time::Duration::from_secs(started_unix());
    json!({
        "type": "model",
        "id": m.id,
        "display_name": m.id,
        "created_at": humantime_serde::re::humantime::format_rfc3339_seconds(created).to_string(),
    })
}

/// One page of the list, from the `limit`, `after_id` and `before_id`
/// query parameters; refusals name the parameter.
fn page<'a>(models: &'a [ListedModel], query: &str) -> Result<(&'a [ListedModel], bool), String> {
    let mut limit = 20usize;
    let (mut after, mut before) = (None, None);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| format!("limit: `{v}` is not an integer from 1 to 1000"))?;
            }
            "after_id" => after = Some(v.into_owned()),
            "before_id" => before = Some(v.into_owned()),
            _ => {}
        }
    }
    let position = |id: &str, param: &str| {
        models
            .iter()
            .position(|m| m.id == id)
            .ok_or_else(|| format!("{param}: `{id}` is not a listed model"))
    };
    Ok(match (after, before) {
        (Some(a), _) => {
            let start = position(&a, "after_id")? + 1;
            let end = (start + limit).min(models.len());
            (&models[start..end], end < models.len())
        }
        (None, Some(b)) => {
            let end = position(&b, "before_id")?;
            let start = end.saturating_sub(limit);
            (&models[start..end], start > 0)
        }
        (None, None) => {
            let end = limit.min(models.len());
            (&models[..end], end < models.len())
        }
    })
}

/// Anthropic clients send `x-api-key`; `Authorization: Bearer` works too.
fn authenticated(s: &HttpState, request: &Request) -> Result<(), AnthropicError> {
    super::authenticate(s, request.headers())
        .map(|_| ())
        .map_err(|e| AnthropicError::from_request(&e))
}

fn ok(body: Value, request_id: &str) -> Response {
    let mut r = axum::Json(body).into_response();
    insert(r.headers_mut(), "request-id", request_id);
    insert(r.headers_mut(), "x-request-id", request_id);
    r
}

pub(crate) fn list(s: &HttpState, request: &Request) -> Response {
    let request_id = s.request_id(request.headers());
    if let Err(e) = authenticated(s, request) {
        return e.response(&request_id);
    }
    let models = s.models();
    let (page, has_more) = match page(&models, request.uri().query().unwrap_or_default()) {
        Ok(p) => p,
        Err(why) => return AnthropicError::invalid(why).response(&request_id),
    };
    let body = json!({
        "data": page.iter().map(model_json).collect::<Vec<_>>(),
        "has_more": has_more,
        "first_id": page.first().map(|m| &m.id),
        "last_id": page.last().map(|m| &m.id),
    });
    ok(body, &request_id)
}

pub(crate) fn retrieve(s: &HttpState, id: &str, request: &Request) -> Response {
    let request_id = s.request_id(request.headers());
    if let Err(e) = authenticated(s, request) {
        return e.response(&request_id);
    }
    match s.models().iter().find(|m| m.id == id) {
        Some(m) => ok(model_json(m), &request_id),
        None => {
            let e = CallerError::new(
                Kind::UnknownRoute,
                format!("model: `{id}` is not a route or a pinned target here"),
            );
            AnthropicError::new(e).response(&request_id)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn models(n: usize) -> Vec<ListedModel> {
        (0..n)
            .map(|i| ListedModel {
                id: format!("m{i}"),
                owned_by: "switchyard".into(),
            })
            .collect()
    }

    fn ids(p: (&[ListedModel], bool)) -> (Vec<&str>, bool) {
        (p.0.iter().map(|m| m.id.as_str()).collect(), p.1)
    }

    #[test]
    fn pages_by_limit_after_and_before() {
        let m = models(5);
        assert_eq!(ids(page(&m, "").unwrap()).0.len(), 5);
        assert_eq!(ids(page(&m, "limit=2").unwrap()), (vec!["m0", "m1"], true));
        assert_eq!(
            ids(page(&m, "limit=2&after_id=m1").unwrap()),
            (vec!["m2", "m3"], true)
        );
        assert_eq!(ids(page(&m, "after_id=m3").unwrap()), (vec!["m4"], false));
        assert_eq!(
            ids(page(&m, "limit=2&before_id=m3").unwrap()),
            (vec!["m1", "m2"], true)
        );
        assert!(!ids(page(&m, "limit=1000").unwrap()).1);
        assert!(page(&m, "limit=0").unwrap_err().starts_with("limit: "));
        assert!(page(&m, "after_id=zz")
            .unwrap_err()
            .starts_with("after_id: "));
    }
}
