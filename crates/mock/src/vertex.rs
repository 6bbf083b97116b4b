//! The mock's Google side for Vertex AI: `POST /token` (the OAuth2 JWT
//! bearer grant: an RS256 assertion, checked against
//! `MOCK_GCP_PUBLIC_KEY_FILE` when set, for scope cloud-platform and this
//! endpoint as audience) issues access tokens; `POST /v1/projects/{p}/
//! locations/{l}/publishers/anthropic/models/{model}:streamRawPredict`
//! takes only a token it issued and answers in the Anthropic dialect.
//! `GET /_mock/tokens` counts the grants.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::limits::WindowRefused;
use super::server::{completion_as, Shared};
use super::MockKind;

static ISSUED: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);
static GRANTS: AtomicU64 = AtomicU64::new(0);

fn google_error(status: StatusCode, name: &str, message: &str) -> Response {
    let body = json!({"error": {"code": status.as_u16(), "message": message, "status": name}});
    (status, axum::Json(body)).into_response()
}

fn oauth_error(error: &str, why: &str) -> Response {
    let body = json!({"error": error, "error_description": why});
    (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
}

/// `POST /token`.
pub(super) async fn token(req: Request) -> Response {
    let host = req
        .headers()
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let body = axum::body::to_bytes(req.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let form: Vec<(String, String)> = form_urlencoded::parse(&body).into_owned().collect();
    let field = |k: &str| form.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
    if field("grant_type") != Some("urn:ietf:params:oauth:grant-type:jwt-bearer") {
        return oauth_error("unsupported_grant_type", "expected the JWT bearer grant");
    }
    let Some(jwt) = field("assertion") else {
        return oauth_error("invalid_request", "no assertion");
    };
    if let Err(why) = check_assertion(jwt, &format!("http://{host}/token")) {
        return oauth_error("invalid_grant", &why);
    }
    let n = GRANTS.fetch_add(1, Ordering::Relaxed) + 1;
    let token = format!("ya29.mock-{n}");
    if let Ok(mut issued) = ISSUED.lock() {
        issued.insert(token.clone());
    }
    axum::Json(json!({"access_token": token, "expires_in": 3599, "token_type": "Bearer"}))
        .into_response()
}

fn check_assertion(jwt: &str, audience: &str) -> Result<(), String> {
    let header = jsonwebtoken::decode_header(jwt).map_err(|e| format!("not a JWT: {e}"))?;
    if header.alg != jsonwebtoken::Algorithm::RS256 {
        return Err(format!("alg {:?}, not RS256", header.alg));
    }
    let Ok(path) = std::env::var("MOCK_GCP_PUBLIC_KEY_FILE") else {
        return Ok(());
    };
    let pem = std::fs::read(&path).map_err(|e| format!("mock key {path}: {e}"))?;
    let key = jsonwebtoken::DecodingKey::from_rsa_pem(&pem).map_err(|e| e.to_string())?;
    let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    v.set_audience(&[audience]);
    let data =
        jsonwebtoken::decode::<Value>(jwt, &key, &v).map_err(|e| format!("assertion: {e}"))?;
    if data.claims["scope"] != "https://www.googleapis.com/auth/cloud-platform" {
        return Err("scope is not cloud-platform".into());
    }
    Ok(())
}

/// Whether `headers` carry a bearer token `/token` issued.
pub(super) fn issued_bearer(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| ISSUED.lock().is_ok_and(|issued| issued.contains(t)))
}

/// `GET /_mock/tokens`.
pub(super) async fn grants() -> Response {
    axum::Json(json!({ "grants": GRANTS.load(Ordering::Relaxed) })).into_response()
}

/// `POST .../models/{model}:streamRawPredict`.
pub(super) async fn stream_raw_predict(
    s: State<Arc<Shared>>,
    Path((_project, _location, model_action)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let Some(model) = model_action.strip_suffix(":streamRawPredict") else {
        return google_error(StatusCode::NOT_FOUND, "NOT_FOUND", "unknown method");
    };
    if !issued_bearer(req.headers()) {
        return google_error(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token.",
        );
    }
    let model = model.to_string();
    let answer = completion_as(s, MockKind::Anthropic, req, Some(model)).await;
    let status = answer.status();
    if status.is_success() {
        return answer;
    }
    // Errors come back in Google's shape, as Vertex sends them (with a
    // rate-limit window's `retry-after`).
    let retry_after = answer
        .extensions()
        .get::<WindowRefused>()
        .and_then(|_| answer.headers().get("retry-after").cloned());
    let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let message = v["error"]["message"].as_str().unwrap_or("mock error");
    let (code, name) = match status.as_u16() {
        400 => (status, "INVALID_ARGUMENT"),
        401 => (status, "UNAUTHENTICATED"),
        403 => (status, "PERMISSION_DENIED"),
        404 => (status, "NOT_FOUND"),
        429 => (status, "RESOURCE_EXHAUSTED"),
        503 | 529 => (StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE"),
        _ => (status, "INTERNAL"),
    };
    let mut r = google_error(code, name, message);
    if let Some(v) = retry_after {
        r.headers_mut().insert("retry-after", v);
    }
    r
}
