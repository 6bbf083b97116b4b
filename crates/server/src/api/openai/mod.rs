//! The OpenAI-compatible HTTP front door (`[server] http_listen`, shared
//! with the Anthropic door through `door`):
//! `POST /v1/chat/completions` (SSE or one `chat.completion`), `POST
//! /v1/embeddings` ([`embeddings`]) and `GET /v1/models[/{id}]` ([`models`]).
//! A chat request becomes a `proto::CompletionRequest` and goes through
//! `convert::request_spec` and the same request task as gRPC; `model` names a
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
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
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

pub(crate) async fn chat_completions(
    State(s): State<Arc<HttpState>>,
    request: Request,
) -> Response {
    let request_id = s.request_id(request.headers());
    match chat(&s, request, &request_id).await {
        Ok(r) => r,
        Err(e) => e.response(&request_id),
    }
}

async fn chat(
    s: &HttpState,
    request: Request,
    request_id: &Arc<str>,
) -> Result<Response, OpenAiError> {
    let (parts, body) = request.into_parts();
    let refused = |e: RequestError| OpenAiError::from_request(&e);
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
        id: ["chatcmpl-", request_id].concat(),
        created: now_secs(),
        model: parsed_model,
    };
    if parsed.stream {
        stream(rx, ids, parsed.include_usage, request_id).await
    } else {
        match door::assemble(&mut rx).await {
            Ok(door::Unary::Queued(q)) => Ok(door::queued(&q, request_id)),
            Ok(door::Unary::Answer(done, served)) => {
                let mut r = door::json_answer(&Completion::new(&ids, &done));
                served_headers(r.headers_mut(), served, request_id);
                Ok(r)
            }
            Err(Some(e)) => Err(refused(e)),
            Err(None) => Err(OpenAiError::internal("request ended without an answer")),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use std::time::Duration;

    fn body(v: Value) -> Result<Parsed, OpenAiError> {
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
        assert_eq!(
            r.messages[1].parts.len(),
            2,
            "two text parts stay two parts"
        );
        assert_eq!(r.messages[2].tool_calls[0].name, "f");
        assert_eq!(r.messages[3].tool_call_id, "c1");
        assert_eq!(r.max_tokens, 7);
        assert_eq!(r.stop, vec!["END".to_string()]);
        assert_eq!(r.tools[0].parameters_json, r#"{"type":"object"}"#);
        assert_eq!(r.response_format, proto::ResponseFormat::JsonObject as i32);
        assert!(p.stream && p.include_usage);
        let pass = r.passthrough.as_ref().unwrap();
        assert_eq!(pass.dialect, "openai");
        let fields: Value = serde_json::from_str(&pass.fields_json).unwrap();
        assert_eq!(
            fields,
            json!({"user": "ignored", "seed": 1, "max_completion_tokens": 7}),
            "unmodelled fields, and the caller's spelling of max_tokens"
        );
    }

    fn part(p: &proto::ContentPart) -> &proto::content_part::Part {
        p.part.as_ref().unwrap()
    }

    #[test]
    fn images_files_schemas_effort_and_unknown_fields_are_carried() {
        use proto::content_part::Part as P;
        let p = body(json!({
            "model": "chat",
            "messages": [{"role": "user", "name": "ann", "content": [
                {"type": "text", "text": "what?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0xLjQ=", "filename": "a.pdf"}},
                {"type": "file", "file": {"file_data": "JVBERi0xLjQ="}},
                {"type": "text", "text": "cached", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
            ]}],
            "tools": [{"type": "function", "function": {"name": "f", "strict": true,
                "parameters": {"type": "object"}}}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "Person", "strict": true,
                "description": "a person", "schema": {"type": "object", "required": ["name"]}}},
            "reasoning_effort": "high",
            "prompt_cache_key": "session-1", "parallel_tool_calls": false, "logprobs": null
        }))
        .unwrap();
        let r = &p.request;
        let parts = &r.messages[0].parts;
        assert!(matches!(part(&parts[0]), P::Text(t) if t == "what?"));
        match part(&parts[1]) {
            P::Image(i) => {
                assert_eq!(
                    (&i.data[..], i.media_type.as_str(), i.detail.as_str()),
                    (&b"\x89PNG\r\n\x1a\n"[..], "image/png", "low")
                );
                assert!(i.url.is_empty());
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(part(&parts[2]), P::Image(i) if i.url == "https://example.com/cat.jpg" && i.data.is_empty())
        );
        for k in [3, 4] {
            match part(&parts[k]) {
                P::Document(d) => {
                    assert_eq!(&d.data[..], b"%PDF-1.4");
                    assert_eq!(d.media_type, "application/pdf");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(part(&parts[3]), P::Document(d) if d.filename == "a.pdf"));
        assert_eq!(parts[5].cache_control.as_ref().unwrap().ttl, "1h");
        assert_eq!(r.tools[0].extra_json, r#"{"strict":true}"#);
        assert_eq!(r.response_format, proto::ResponseFormat::JsonSchema as i32);
        let js = r.json_schema.as_ref().unwrap();
        assert_eq!(
            (js.name.as_str(), js.strict, js.description.as_str()),
            ("Person", true, "a person")
        );
        assert_eq!(js.schema_json, r#"{"required":["name"],"type":"object"}"#);
        assert_eq!(r.reasoning.as_ref().unwrap().effort, "high");
        let pass = r.passthrough.as_ref().unwrap();
        let fields: Value = serde_json::from_str(&pass.fields_json).unwrap();
        assert_eq!(
            fields,
            json!({"prompt_cache_key": "session-1", "parallel_tool_calls": false}),
            "null fields ask for the default and are left out"
        );
        assert_eq!(pass.dropped, vec!["messages[].name".to_string()]);
    }

    #[test]
    fn what_the_contract_cannot_carry_is_refused_by_name() {
        let with = |extra: Value| {
            let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            body(b)
                .err()
                .map(|e| (e.param.unwrap_or_default(), e.message))
        };
        let part = |p: Value| with(json!({"messages": [{"role": "user", "content": [p]}]}));
        let cases = [
            (
                part(json!({"type": "file", "file": {"file_id": "file-abc"}})),
                "messages[0].content[0].file.file_id",
                "Files store",
            ),
            (
                part(
                    json!({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}),
                ),
                "messages[0].content[0].type",
                "input_audio",
            ),
            (
                part(
                    json!({"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}}),
                ),
                "messages[0].content[0].image_url.url",
                "image/tiff",
            ),
            (
                part(json!({"type": "image_url", "image_url": {"url": "ftp://x/y.png"}})),
                "messages[0].content[0].image_url.url",
                "http(s)",
            ),
            (
                part(
                    json!({"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "max"}}),
                ),
                "messages[0].content[0].image_url.detail",
                "auto, low, high",
            ),
            (
                part(json!({"type": "file", "file": {"file_data": "data:image/png;base64,AAAA"}})),
                "messages[0].content[0].file.file_data",
                "image/png",
            ),
            (
                part(json!({"type": "file", "file": {"file_data": "@@@"}})),
                "messages[0].content[0].file.file_data",
                "base64",
            ),
            (
                part(json!({"type": "text", "text": "x", "cache_control": {"type": "persistent"}})),
                "messages[0].content[0].cache_control.type",
                "ephemeral",
            ),
            (
                with(json!({"response_format": {"type": "json_schema"}})),
                "response_format.json_schema",
                "required",
            ),
            (
                with(
                    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}),
                ),
                "response_format.json_schema.name",
                "letters",
            ),
            (
                with(
                    json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}}),
                ),
                "response_format.json_schema.schema",
                "JSON object",
            ),
            (
                with(json!({"reasoning_effort": "extreme"})),
                "reasoning_effort",
                "one of",
            ),
            (
                with(json!({"reasoning_effort": 3})),
                "reasoning_effort",
                "invalid type",
            ),
            (
                with(json!({"functions": [{"name": "f"}]})),
                "functions",
                "tools",
            ),
            (with(json!({"audio": {"voice": "alloy"}})), "audio", "audio"),
            (
                with(json!({"modalities": ["text", "audio"]})),
                "modalities",
                "text",
            ),
            (
                with(
                    json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
                ),
                "tools[0].function.parameters",
                "JSON object",
            ),
        ];
        for (got, param, says) in cases {
            let (p, msg) = got.expect(param);
            assert_eq!(p, param, "{msg}");
            assert!(msg.contains(says), "{param}: {msg}");
        }
        assert!(with(json!({"modalities": ["text"]})).is_none());
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
            "content": [{"type": "video_url"}]}]}))
        .err()
        .unwrap();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].type"));
        let e = body(json!({"model": "m", "messages": [{"role": "user",
            "content": [{"type": "image_url"}]}]}))
        .err()
        .unwrap();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0].image_url"));
        let e = body(json!({"model": "m", "messages": [], "n": 2}))
            .err()
            .unwrap();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn request_errors_map_to_http_statuses() {
        let e = OpenAiError::from_request(&RequestError::UnknownRoute("x".into()));
        assert_eq!(e.status, StatusCode::NOT_FOUND);
        assert_eq!(e.code, "UNKNOWN_ROUTE");
        assert_eq!(e.param.as_deref(), Some("model"));
        let e = OpenAiError::from_request(&RequestError::InvalidRequest(
            "messages[0].role: `x` is bad".into(),
        ));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = OpenAiError::from_request(&RequestError::Draining);
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.retry_after, Some(Duration::from_secs(1)));
        let e = OpenAiError::from_request(&RequestError::IdempotencyKeyInUse);
        assert_eq!(e.status, StatusCode::CONFLICT);
        let e = OpenAiError::from_request(&RequestError::DeadlineExceeded { attempts: 1 });
        assert_eq!(e.status, StatusCode::GATEWAY_TIMEOUT);
        let e = OpenAiError::from_request(&RequestError::Saturated { route: "r".into() });
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
    }
}
