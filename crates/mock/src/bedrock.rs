//! The mock's Amazon Bedrock side: `POST /model/{model}/invoke-with-response-stream`
//! checks the SigV4 signature (recomputed with AWS's signer when
//! `MOCK_AWS_SECRET_ACCESS_KEY` is set, else its shape), answers like the
//! Anthropic dialect, and re-frames that answer as the binary AWS event
//! stream: each SSE event becomes a `chunk` frame (base64 JSON), an `error`
//! event an exception frame, and an error response Bedrock's
//! `x-amzn-ErrorType` with `{"message"}`.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::limits::WindowRefused;
use super::server::{completion_as, Shared};
use super::MockKind;
use switchyard::upstream::bedrock::{chunk_frame, exception_frame, sign, AwsCredentials};
use switchyard::upstream::sse::{SseEvent, SseParser};

fn refuse(status: StatusCode, kind: &str, message: &str) -> Response {
    let mut r = (status, axum::Json(json!({ "message": message }))).into_response();
    if let Ok(v) = HeaderValue::from_str(kind) {
        r.headers_mut().insert("x-amzn-errortype", v);
    }
    r
}

/// `None` when the request carries a valid signature; else why not.
fn check_signature(headers: &HeaderMap, path_and_query: &str, body: &[u8]) -> Option<String> {
    let Some(auth) = headers.get("authorization").and_then(|v| v.to_str().ok()) else {
        return Some("no Authorization header".into());
    };
    let Some(rest) = auth.strip_prefix("AWS4-HMAC-SHA256 Credential=") else {
        return Some(format!(
            "not a SigV4 Authorization: {}",
            auth.split(' ').next().unwrap_or("")
        ));
    };
    let scope: Vec<&str> = rest.split(',').next().unwrap_or("").split('/').collect();
    let [akid, _date, region, service, "aws4_request"] = scope[..] else {
        return Some("malformed credential scope".into());
    };
    if service != "bedrock" {
        return Some(format!("signed for service `{service}`, not bedrock"));
    }
    let Some(amz_date) = headers.get("x-amz-date").and_then(|v| v.to_str().ok()) else {
        return Some("no x-amz-date header".into());
    };
    let Ok(secret) = std::env::var("MOCK_AWS_SECRET_ACCESS_KEY") else {
        return None;
    };
    // Recompute over the headers the caller signed, at the time it signed.
    let signed: Vec<&str> = auth
        .split("SignedHeaders=")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .map(|s| s.split(';').collect())
        .unwrap_or_default();
    let mut input = HeaderMap::new();
    for name in signed {
        if matches!(
            name,
            "host" | "x-amz-date" | "x-amz-security-token" | "x-amz-content-sha256"
        ) {
            continue;
        }
        if let Some(v) = headers.get(name) {
            if let Ok(n) = axum::http::HeaderName::from_bytes(name.as_bytes()) {
                input.insert(n, v.clone());
            }
        }
    }
    let host = headers
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let url = format!("http://{host}{path_and_query}");
    let Some(time) = parse_amz_date(amz_date) else {
        return Some(format!("x-amz-date `{amz_date}` is not a date"));
    };
    let creds = AwsCredentials {
        access_key_id: akid.to_string(),
        secret_access_key: switchyard::upstream::endpoint::Secret::new(secret),
        session_token: headers
            .get("x-amz-security-token")
            .and_then(|v| v.to_str().ok())
            .map(|t| switchyard::upstream::endpoint::Secret::new(t.to_string())),
    };
    let Ok(expected) = sign(&url, &input, body, region, &creds, time) else {
        return Some("the request cannot be signed again".into());
    };
    let want = expected.get("authorization").and_then(|v| v.to_str().ok());
    (want != Some(auth)).then(|| "the signature does not match".to_string())
}

/// `20251201T120000Z` (SigV4's basic ISO 8601) as a time.
fn parse_amz_date(s: &str) -> Option<std::time::SystemTime> {
    let p = |r: std::ops::Range<usize>| s.get(r);
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        p(0..4)?,
        p(4..6)?,
        p(6..8)?,
        p(9..11)?,
        p(11..13)?,
        p(13..15)?
    );
    humantime_serde::re::humantime::parse_rfc3339(&rfc3339).ok()
}

/// Bedrock's error name for an HTTP status.
fn error_type(status: u16) -> &'static str {
    match status {
        400 => "ValidationException",
        401 | 403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        429 => "ThrottlingException",
        503 | 529 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

pub(super) async fn invoke_stream(
    s: State<Arc<Shared>>,
    Path(model): Path<String>,
    req: Request,
) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 16 * 1024 * 1024)
        .await
        .unwrap_or_default();
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    if let Some(why) = check_signature(&parts.headers, &pq, &bytes) {
        return refuse(StatusCode::FORBIDDEN, "InvalidSignatureException", &why);
    }
    let req = Request::from_parts(parts, Body::from(bytes));
    let answer = completion_as(s, MockKind::Anthropic, req, Some(model)).await;
    let status = answer.status();
    if !status.is_success() {
        // A rate-limit window's `retry-after` survives the re-framing.
        let retry_after = answer
            .extensions()
            .get::<WindowRefused>()
            .and_then(|_| answer.headers().get("retry-after").cloned());
        let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let message = v["error"]["message"].as_str().unwrap_or("mock error");
        let code = if status.as_u16() == 529 {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            status
        };
        let mut r = refuse(code, error_type(status.as_u16()), message);
        if let Some(v) = retry_after {
            r.headers_mut().insert("retry-after", v);
        }
        return r;
    }
    let mut parser = SseParser::new();
    let frames = answer.into_body().into_data_stream().map(move |chunk| {
        let chunk = chunk?;
        let mut events = Vec::new();
        let _ = parser.feed(&chunk, &mut events);
        Ok::<_, axum::Error>(Bytes::from(
            events.iter().flat_map(frame_of).collect::<Vec<u8>>(),
        ))
    });
    let mut r = Response::new(Body::from_stream(frames));
    r.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/vnd.amazon.eventstream"),
    );
    r
}

/// One SSE event of the Anthropic answer as its event-stream frame.
fn frame_of(e: &SseEvent) -> Vec<u8> {
    if e.event.as_deref() == Some("error") {
        let v: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
        let kind = match v["error"]["type"].as_str() {
            Some("overloaded_error") => "serviceUnavailableException",
            Some("rate_limit_error") => "throttlingException",
            _ => "modelStreamErrorException",
        };
        return exception_frame(kind, v["error"]["message"].as_str().unwrap_or("error"));
    }
    chunk_frame(&e.data)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates_parse() {
        let t = parse_amz_date("20150830T123600Z").unwrap();
        assert_eq!(
            t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(),
            1_440_938_160
        );
    }
}
