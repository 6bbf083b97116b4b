//! The OpenAI-compatible HTTP front door (`[server] http_listen`):
//! `POST /v1/chat/completions` (SSE or one `chat.completion`) and `GET
//! /v1/models`. A request becomes a `proto::CompletionRequest` and goes through
//! `convert::request_spec` and the same `Dispatcher` as gRPC; `model` names a
//! route. Errors use OpenAI's error JSON with the `ErrorInfo` reason as `code`.

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
use tokio::sync::mpsc;

use super::auth::Authenticator;
use super::convert;
use super::intake::{Arrival, Door, Intake};
use super::status::{http_status, reason};
use crate::chat::{Chunk, FinishReason};
use crate::error::RequestError;
use crate::proto;
use crate::reload::Reloader;
use crate::sink::{Event, Item, QueuedJob};

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

/// An error in OpenAI's shape, with its HTTP status.
#[derive(Debug, Clone)]
struct HttpError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<String>,
    code: &'static str,
    retry_after: Option<Duration>,
}

impl HttpError {
    fn invalid(message: String, param: Option<String>) -> Self {
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
    fn from_request(err: &RequestError) -> Self {
        let (status, kind) = http_status(err);
        let param = match err {
            RequestError::UnknownRoute(_) => Some("model".to_string()),
            RequestError::InvalidRequest(m) => m
                .split_once(": ")
                .map(|(field, _)| field)
                .filter(|f| !f.is_empty() && !f.contains(' '))
                .map(str::to_string),
            _ => None,
        };
        HttpError {
            status,
            message: err.to_string(),
            kind,
            param,
            code: reason(err),
            retry_after: err.retry_after(),
        }
    }

    fn internal(message: &str) -> Self {
        HttpError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: "INTERNAL",
            retry_after: None,
        }
    }

    fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }

    fn response(&self, request_id: &str) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        let h = r.headers_mut();
        if let Some(delay) = self.retry_after {
            let secs = delay.as_millis().div_ceil(1000);
            insert(h, "retry-after", &secs.to_string());
            insert(h, "retry-after-ms", &delay.as_millis().to_string());
        }
        insert(h, "x-request-id", request_id);
        r
    }
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

async fn not_found(request: Request) -> Response {
    HttpError {
        status: StatusCode::NOT_FOUND,
        message: format!(
            "no endpoint {} {} (this front door serves POST /v1/chat/completions and GET /v1/models)",
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
    fn into_response_plain(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

// ---- request body ---------------------------------------------------------

#[derive(Deserialize, Default)]
struct ChatBody {
    model: Option<String>,
    messages: Option<Vec<InMessage>>,
    max_tokens: Option<u32>,
    max_completion_tokens: Option<u32>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    stop: Option<Stop>,
    tools: Option<Vec<InTool>>,
    tool_choice: Option<Value>,
    response_format: Option<InResponseFormat>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u32>,
}

#[derive(Deserialize)]
struct InMessage {
    role: String,
    content: Option<Content>,
    tool_calls: Option<Vec<InToolCall>>,
    tool_call_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize)]
struct InToolCall {
    id: String,
    function: InFunctionCall,
}

#[derive(Deserialize)]
struct InFunctionCall {
    name: String,
    #[serde(default)]
    arguments: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct InTool {
    #[serde(rename = "type")]
    kind: String,
    function: InFunction,
}

#[derive(Deserialize)]
struct InFunction {
    name: String,
    description: Option<String>,
    parameters: Option<Value>,
}

#[derive(Deserialize)]
struct InResponseFormat {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// What the handler needs beyond the gRPC request.
struct Parsed {
    request: proto::CompletionRequest,
    stream: bool,
    include_usage: bool,
}

fn parse(body: &[u8]) -> Result<ChatBody, HttpError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        HttpError::invalid(format!("invalid JSON body: {}", e.inner()), param)
    })
}

/// Maps an OpenAI request onto the gRPC request; `convert::request_spec`
/// validates the rest, exactly as for gRPC.
fn to_proto(b: ChatBody) -> Result<Parsed, HttpError> {
    let bad = |param: &str, msg: String| HttpError::invalid(msg, Some(param.to_string()));
    let model = b.model.unwrap_or_default();
    if model.is_empty() {
        return Err(bad("model", "model: required (a route name)".into()));
    }
    if let Some(n) = b.n {
        if n != 1 {
            return Err(bad("n", format!("n: {n} is not supported (only 1)")));
        }
    }
    let mut messages = Vec::new();
    for (i, m) in b.messages.unwrap_or_default().into_iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system".to_string(),
            _ => m.role,
        };
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.into_iter().enumerate() {
                    if p.kind != "text" {
                        return Err(bad(
                            &format!("messages[{i}].content[{j}].type"),
                            format!(
                                "messages[{i}].content[{j}].type: `{}` is not supported (only `text`)",
                                p.kind
                            ),
                        ));
                    }
                    text.push_str(&p.text.unwrap_or_default());
                }
                text
            }
        };
        let tool_calls = m
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .map(|c| proto::ToolCall {
                id: c.id,
                name: c.function.name,
                arguments: c.function.arguments,
            })
            .collect();
        messages.push(proto::Message {
            role,
            content,
            tool_call_id: m.tool_call_id.unwrap_or_default(),
            tool_calls,
        });
    }
    let mut tools = Vec::new();
    for (i, t) in b.tools.unwrap_or_default().into_iter().enumerate() {
        if t.kind != "function" {
            return Err(bad(
                &format!("tools[{i}].type"),
                format!(
                    "tools[{i}].type: `{}` is not supported (only `function`)",
                    t.kind
                ),
            ));
        }
        let parameters_json = match t.function.parameters {
            None => String::new(),
            Some(p) if p.is_object() => p.to_string(),
            Some(_) => {
                return Err(bad(
                    &format!("tools[{i}].function.parameters"),
                    format!(
                        "tools[{i}].function.parameters: must be a JSON object (a JSON Schema)"
                    ),
                ))
            }
        };
        tools.push(proto::Tool {
            name: t.function.name,
            description: t.function.description.unwrap_or_default(),
            parameters_json,
        });
    }
    match b.tool_choice {
        None => {}
        Some(Value::String(s)) if s == "auto" => {}
        // The model must not call a tool: it is not offered one.
        Some(Value::String(s)) if s == "none" => tools.clear(),
        Some(other) => {
            return Err(bad(
                "tool_choice",
                format!("tool_choice: {other} is not supported (only \"auto\" or \"none\")"),
            ))
        }
    }
    let response_format = match b.response_format.map(|f| f.kind) {
        None => proto::ResponseFormat::Unspecified,
        Some(k) if k == "text" => proto::ResponseFormat::Text,
        Some(k) if k == "json_object" => proto::ResponseFormat::JsonObject,
        Some(k) => {
            return Err(bad(
                "response_format.type",
                format!("response_format.type: `{k}` is not supported (text or json_object)"),
            ))
        }
    };
    let stop = match b.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    let stream = b.stream.unwrap_or(false);
    Ok(Parsed {
        request: proto::CompletionRequest {
            route: model,
            messages,
            max_tokens: b.max_completion_tokens.or(b.max_tokens).unwrap_or(0),
            temperature: b.temperature,
            idempotency_key: String::new(),
            tenant: String::new(),
            requirements: None,
            tools,
            top_p: b.top_p,
            stop,
            response_format: response_format as i32,
        },
        stream,
        include_usage: stream
            && b.stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
    })
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

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The identity every chunk of one answer repeats.
struct Ids {
    id: String,
    created: u64,
    /// The route the caller named (not the serving target: failover stays
    /// invisible except in `x-switchyard-served-by`).
    model: String,
}

/// Which attempt served, for the response headers.
struct Served {
    by: String,
    tier: &'static str,
    attempts: u32,
}

fn served_headers(h: &mut HeaderMap, served: Option<&Served>, request_id: &str) {
    if let Some(s) = served {
        insert(h, "x-switchyard-served-by", &s.by);
        insert(h, "x-switchyard-tier", s.tier);
        insert(h, "x-switchyard-attempts", &s.attempts.to_string());
    }
    insert(h, "x-request-id", request_id);
}

fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        // OpenAI has no refusal finish reason; an upstream refusal is an answer
        // the provider's safety layer shaped, the nearest is `content_filter`.
        FinishReason::ContentFilter | FinishReason::Refusal => "content_filter",
    }
}

fn proto_finish_reason(f: i32) -> &'static str {
    match proto::FinishReason::try_from(f) {
        Ok(proto::FinishReason::Length) => "length",
        Ok(proto::FinishReason::ToolCalls) => "tool_calls",
        Ok(proto::FinishReason::ContentFilter | proto::FinishReason::Refusal) => "content_filter",
        _ => "stop",
    }
}

/// A unary answer as a `chat.completion` object.
fn completion(ids: &Ids, r: proto::CompletionResponse) -> Value {
    let tool_calls: Vec<Value> = r
        .tool_calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    let mut message = json!({
        "role": "assistant",
        "content": if r.text.is_empty() && !tool_calls.is_empty() { Value::Null } else { Value::String(r.text) },
        "refusal": null,
    });
    if !tool_calls.is_empty() {
        if let Some(m) = message.as_object_mut() {
            m.insert("tool_calls".into(), Value::Array(tool_calls));
        }
    }
    let usage = r.usage.unwrap_or_default();
    json!({
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "system_fingerprint": null,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": proto_finish_reason(r.finish_reason),
        }],
        "usage": usage_json(usage.input_tokens, usage.output_tokens),
    })
}

fn usage_json(input: u32, output: u32) -> Value {
    json!({
        "prompt_tokens": input,
        "completion_tokens": output,
        "total_tokens": u64::from(input) + u64::from(output),
    })
}

/// The `queue` rung took the request: 202 with the job, not a completion.
fn queued(q: &QueuedJob, request_id: &str) -> Response {
    let job = convert::job(&q.record, q.position, q.eta);
    let body = json!({
        "id": job.id,
        "object": "switchyard.job",
        "state": proto::JobState::try_from(job.state).map_or("UNSPECIFIED", |s| s.as_str_name()),
        "position": job.position,
        "estimated_start_ms": job.estimated_start_ms,
        "route": job.route,
    });
    let mut r = (StatusCode::ACCEPTED, axum::Json(body)).into_response();
    let h = r.headers_mut();
    insert(h, "x-switchyard-tier", "queued");
    insert(h, "x-switchyard-job-id", &job.id);
    insert(h, "x-request-id", request_id);
    r
}

// ---- streaming ------------------------------------------------------------

/// Holds the response until the first event (so a failure before the first
/// token is a plain HTTP error), then streams SSE frames.
async fn stream(
    mut rx: mpsc::Receiver<Item>,
    ids: Ids,
    include_usage: bool,
    request_id: &str,
) -> Result<Response, HttpError> {
    let first = match rx.recv().await {
        None => return Err(HttpError::internal("request ended without an answer")),
        Some(Err(e)) => return Err(HttpError::from_request(&e)),
        Some(Ok(Event::Queued(q))) => return Ok(queued(&q, request_id)),
        Some(Ok(e)) => e,
    };
    let (served, pending) = match first {
        Event::Started(s) => (
            Some(Served {
                by: format!("{}/{}", s.provider, s.model),
                tier: s.tier.as_str(),
                attempts: s.attempt,
            }),
            None,
        ),
        other => (None, Some(other)),
    };
    let sse = Sse {
        rx,
        pending,
        ids,
        include_usage,
        opened: false,
        done: false,
    };
    let body = futures_util::stream::unfold(sse, |mut sse| async move {
        let frames = sse.next().await?;
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(frames)), sse))
    });
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    insert(h, "content-type", "text/event-stream");
    insert(h, "cache-control", "no-cache");
    insert(h, "x-accel-buffering", "no");
    served_headers(h, served.as_ref(), request_id);
    Ok(r)
}

/// The SSE side of one streaming answer.
struct Sse {
    rx: mpsc::Receiver<Item>,
    /// An event read before the headers went out, not yet framed.
    pending: Option<Event>,
    ids: Ids,
    include_usage: bool,
    opened: bool,
    done: bool,
}

fn frame(v: &Value) -> String {
    format!("data: {v}\n\n")
}

impl Sse {
    fn chunk(&self, delta: Value, finish: Option<&str>) -> String {
        let mut v = json!({
            "id": self.ids.id,
            "object": "chat.completion.chunk",
            "created": self.ids.created,
            "model": self.ids.model,
            "system_fingerprint": null,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        });
        if self.include_usage {
            if let Some(o) = v.as_object_mut() {
                o.insert("usage".into(), Value::Null);
            }
        }
        frame(&v)
    }

    /// The next frames to send; `None` once the stream is over.
    async fn next(&mut self) -> Option<String> {
        if self.done {
            return None;
        }
        if !self.opened {
            self.opened = true;
            return Some(self.chunk(json!({"role": "assistant", "content": ""}), None));
        }
        loop {
            let item = match self.pending.take() {
                Some(e) => Some(Ok(e)),
                None => self.rx.recv().await,
            };
            match item {
                // Only the first attempt's `Started` precedes output; a later
                // one can't come (the stream ends at a `Reset`).
                Some(Ok(Event::Started(_))) => continue,
                Some(Ok(Event::Chunk(Chunk::Text(text)))) => {
                    return Some(self.chunk(json!({ "content": text }), None))
                }
                Some(Ok(Event::Chunk(Chunk::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                }))) => {
                    let mut call = json!({"index": index});
                    let mut function = json!({ "arguments": arguments });
                    if let (Some(c), Some(id)) = (call.as_object_mut(), id) {
                        c.insert("id".into(), Value::String(id));
                        c.insert("type".into(), Value::String("function".into()));
                    }
                    if let (Some(f), Some(name)) = (function.as_object_mut(), name) {
                        f.insert("name".into(), Value::String(name));
                    }
                    if let Some(c) = call.as_object_mut() {
                        c.insert("function".into(), function);
                    }
                    return Some(self.chunk(json!({ "tool_calls": [call] }), None));
                }
                Some(Ok(Event::Finished(f))) => {
                    self.done = true;
                    let mut out = self.chunk(json!({}), Some(finish_reason(f.finish_reason)));
                    if self.include_usage {
                        out.push_str(&frame(&json!({
                            "id": self.ids.id,
                            "object": "chat.completion.chunk",
                            "created": self.ids.created,
                            "model": self.ids.model,
                            "system_fingerprint": null,
                            "choices": [],
                            "usage": usage_json(f.usage.input_tokens, f.usage.output_tokens),
                        })));
                    }
                    out.push_str("data: [DONE]\n\n");
                    return Some(out);
                }
                // OpenAI clients cannot discard output they already have: the
                // route's `mid_stream = "reset"` ends this stream like `fail`.
                Some(Ok(Event::Reset {
                    reason: why,
                    failed_attempt,
                })) => {
                    self.done = true;
                    return Some(frame(
                        &HttpError {
                            status: StatusCode::SERVICE_UNAVAILABLE,
                            message: format!(
                                "the stream failed after output was sent (attempt {failed_attempt}: {why}); the partial output is incomplete and must be discarded"
                            ),
                            kind: "server_error",
                            param: None,
                            code: "UPSTREAM_STREAM_TRUNCATED",
                            retry_after: None,
                        }
                        .body(),
                    ));
                }
                Some(Ok(Event::Queued(_))) | None => {
                    self.done = true;
                    return Some(frame(
                        &HttpError::internal("the stream ended without a finish").body(),
                    ));
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(frame(&HttpError::from_request(&e).body()));
                }
            }
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
