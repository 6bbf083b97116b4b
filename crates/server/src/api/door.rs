//! What the HTTP front doors (OpenAI- and Anthropic-shaped) share: their
//! state, the router that mounts both on `[server] http_listen`, the
//! caller's request id, the metadata and body bounds, reading a JSON body,
//! `model` → route (or a
//! pinned target), and the served-by headers. Each door only parses its own
//! body and renders its own answers and errors; both start requests through
//! the one intake.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use futures_util::FutureExt;
use http_body_util::BodyExt;
use serde_json::json;

use crate::api::auth::Authenticator;
use crate::api::convert;
use crate::api::intake::{Arrival, Door, Intake};
use crate::api::listener::{Direct, Dispatch, Routes};
use crate::error::RequestError;
use crate::proto;
use crate::reload::Reloader;
use crate::sink::{Event, Events, QueuedJob};

/// What the front doors' handlers share.
pub struct HttpState {
    pub intake: Arc<Intake>,
    pub auth: Authenticator,
    /// The config in force, for `/v1/models` and `model` lookups (follows reloads).
    pub reloader: Arc<Reloader>,
    /// Stored Responses API responses (`None`: the Responses door stores nothing).
    pub responses: Option<Arc<crate::state::responses::ResponseStore>>,
}

impl HttpState {
    pub fn new(intake: Arc<Intake>, auth: Authenticator, reloader: Arc<Reloader>) -> Self {
        HttpState {
            intake,
            auth,
            reloader,
            responses: None,
        }
    }

    /// Where the Responses door keeps responses.
    pub fn with_responses(mut self, store: Arc<crate::state::responses::ResponseStore>) -> Self {
        self.responses = Some(store);
        self
    }

    /// The caller's `x-request-id` when it is sane, else a fresh one.
    pub fn request_id(&self, headers: &HeaderMap) -> Arc<str> {
        caller_request_id(headers).unwrap_or_else(|| self.intake.request_id())
    }

    /// The caller's tenant from `Authorization: Bearer` (`None` in open mode).
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Option<String>, RequestError> {
        let value = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        self.auth.authenticate(value)
    }

    /// `model` names a route; a route and one of its targets as
    /// `route@provider/model` (pinned to that target under that route's
    /// policies); or one target as `provider/model`: then the request runs
    /// on the first route that lists it, pinned to that target (the route's
    /// policies, budget and ladder still apply).
    pub fn route_and_pin(&self, model: &str) -> Result<(String, Option<String>), RequestError> {
        let config = self.reloader.config();
        let routes = || config.iter().flat_map(|c| c.routes.iter());
        let unknown = || RequestError::UnknownRoute(model.to_string());
        if let Some((route, target)) = split_route_pin(model) {
            let route = routes()
                .find(|r| r.name == route && r.targets.iter().any(|t| t.target == target))
                .ok_or_else(unknown)?;
            return Ok((route.name.clone(), Some(target.to_string())));
        }
        if !model.contains('/') {
            return Ok((model.to_string(), None));
        }
        let route = routes()
            .find(|r| r.targets.iter().any(|t| t.target == model))
            .ok_or_else(unknown)?;
        Ok((route.name.clone(), Some(model.to_string())))
    }

    /// Every name the doors take as `model` now, in config order: the
    /// routes, then each route's targets as `provider/model` (a pin on the
    /// first route that lists it), then every `route@provider/model`. Every
    /// authenticated tenant may call every route.
    pub fn models(&self) -> Vec<ListedModel> {
        let Some(config) = self.reloader.config() else {
            return Vec::new();
        };
        let owner = |target: &str| target.split('/').next().unwrap_or_default().to_string();
        let routes = config.routes.iter().map(|r| ListedModel {
            id: r.name.clone(),
            owned_by: "switchyard".to_string(),
        });
        let mut pins: Vec<ListedModel> = Vec::new();
        for t in config.routes.iter().flat_map(|r| r.targets.iter()) {
            if !pins.iter().any(|p| p.id == t.target) {
                pins.push(ListedModel {
                    id: t.target.clone(),
                    owned_by: owner(&t.target),
                });
            }
        }
        let route_pins = config.routes.iter().flat_map(|r| {
            r.targets.iter().map(move |t| ListedModel {
                id: format!("{}@{}", r.name, t.target),
                owned_by: owner(&t.target),
            })
        });
        routes.chain(pins).chain(route_pins).collect()
    }

    /// A route of that name is configured now.
    pub fn knows_route(&self, name: &str) -> bool {
        self.reloader
            .config()
            .iter()
            .flat_map(|c| c.routes.iter())
            .any(|r| r.name == name)
    }

    /// Starts a parsed request through the intake: the `idempotency-key`
    /// header, `model` resolved to its route (and pin), tracing context from
    /// the headers. `stream = false` buffers for one assembled answer.
    pub async fn start(
        &self,
        door: Door,
        mut request: proto::CompletionRequest,
        tenant: Option<String>,
        request_id: &Arc<str>,
        headers: &HeaderMap,
        stream: bool,
    ) -> Result<Events, RequestError> {
        if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
            request.idempotency_key = key.to_string();
        }
        // A reconnect of the key's stream: the caller holds its events up
        // to `Last-Event-ID` (without a key, the header names nothing). The
        // Responses door resumes by `starting_after` on a stored response.
        let after = match headers.get("last-event-id") {
            Some(v)
                if stream
                    && !request.idempotency_key.is_empty()
                    && matches!(door, Door::OpenAi | Door::Anthropic) =>
            {
                Some(last_event_id(v)?)
            }
            _ => None,
        };
        request.resume_after_seq = after;
        // A route's name (no `/`) is the route as sent, not copied.
        let pin = if request.route.contains('/') {
            let (route, pin) = self.route_and_pin(&request.route)?;
            request.route = route;
            pin
        } else {
            None
        };
        let started = self
            .intake
            .start(Arrival {
                door,
                request,
                tenant,
                request_id: Some(request_id.clone()),
                deadline: None,
                trace: crate::telemetry::tracing::trace_context(headers),
                buffered: !stream,
                pin,
            })
            .await?;
        let mut rx = started.rx;
        rx.resumed_after(after.unwrap_or(0));
        Ok(rx)
    }

    /// The request's headers fit `limits.max_metadata_bytes`.
    pub fn check_metadata(&self, headers: &HeaderMap) -> Result<(), RequestError> {
        let limit = self.intake.limits().max_metadata_bytes;
        let size = crate::api::grpc_limits::metadata_size(headers);
        if size > limit {
            return Err(RequestError::MetadataTooLarge { size, limit });
        }
        Ok(())
    }

    /// Reads the body up to `limits.max_request_bytes` (REQUEST_TOO_LARGE beyond).
    pub async fn read_body(&self, body: Body, headers: &HeaderMap) -> Result<Bytes, RequestError> {
        read_body_up_to(body, headers, self.intake.limits().max_request_bytes).await
    }
}

/// Reads a body up to `limit` bytes (REQUEST_TOO_LARGE beyond, before
/// reading when `content-length` says so). The listener paces every body:
/// one that stalls or trickles is REQUEST_BODY_TIMEOUT (HTTP 408).
pub async fn read_body_up_to(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, RequestError> {
    check_declared_length(headers, limit)?;
    match collect(http_body_util::Limited::new(body, limit)).await {
        Ok(bytes) => Ok(bytes),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(RequestError::RequestTooLarge { limit })
        }
        Err(e) => match crate::api::listener::BodyTimedOut::find(&*e) {
            Some(t) => Err(RequestError::BodyTooSlow {
                received: t.received,
            }),
            None => Err(RequestError::InvalidRequest(format!(
                "cannot read the request body: {e}"
            ))),
        },
    }
}

/// A body's data frames as one `Bytes`: a body of one frame (most are) is
/// that frame, with no list of frames and no copy; a longer one is copied
/// once into one buffer. Trailers are not read.
async fn collect<B>(mut body: B) -> Result<Bytes, B::Error>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    let mut first: Option<Bytes> = None;
    let mut joined = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        match &first {
            None => first = Some(data),
            Some(f) => {
                if joined.is_empty() {
                    joined.extend_from_slice(f);
                }
                joined.extend_from_slice(&data);
            }
        }
    }
    Ok(if joined.is_empty() {
        first.unwrap_or_default()
    } else {
        joined.freeze()
    })
}

/// REQUEST_TOO_LARGE when `content-length` says the body is over `limit`.
pub fn check_declared_length(headers: &HeaderMap, limit: usize) -> Result<(), RequestError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(RequestError::RequestTooLarge { limit });
    }
    Ok(())
}

/// `route@provider/model` as its route and target. A route name has no
/// `/`, so the `@` of a model version (`vertex/claude-sonnet-4-5@20250929`)
/// is never read as one.
fn split_route_pin(model: &str) -> Option<(&str, &str)> {
    let (route, target) = model.split_once('@')?;
    (!route.is_empty() && !route.contains('/') && target.contains('/')).then_some((route, target))
}

/// A name `GET /v1/models` lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedModel {
    pub id: String,
    /// `switchyard` for a route; the provider id for a pinned target.
    pub owned_by: String,
}

/// When the HTTP doors started, in Unix seconds: the `created` time of
/// every listed model.
pub fn started_unix() -> u64 {
    static STARTED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    })
}

/// Both doors, the Batch API and the Responses API, on one listener; the
/// doors' completions answered before the path router ([`Completions`]).
pub fn router(state: Arc<HttpState>) -> Routes {
    started_unix();
    let router = crate::api::openai::routes()
        .merge(crate::api::anthropic::routes())
        .fallback(crate::api::openai::not_found)
        .with_state(state.clone())
        .merge(crate::api::batch::routes(state.clone()))
        .merge(crate::api::responses::routes(state.clone()));
    Routes {
        router,
        direct: Some(Arc::new(Completions(state))),
    }
}

/// `POST /v1/chat/completions` and `POST /v1/messages`, straight to their
/// handlers (the router has the same two routes, for every other method).
struct Completions(Arc<HttpState>);

impl Direct for Completions {
    fn call(&self, request: axum::extract::Request) -> Dispatch {
        if request.method() != axum::http::Method::POST {
            return Dispatch::Router(request);
        }
        let state = axum::extract::State(self.0.clone());
        match request.uri().path() {
            "/v1/chat/completions" => Dispatch::Answer(Box::pin(
                crate::api::openai::chat_completions(state, request),
            )),
            "/v1/messages" => {
                Dispatch::Answer(Box::pin(crate::api::anthropic::messages(state, request)))
            }
            _ => Dispatch::Router(request),
        }
    }
}

/// The caller's `x-request-id`, when it is sane.
fn caller_request_id(headers: &HeaderMap) -> Option<Arc<str>> {
    let theirs = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            !v.is_empty()
                && v.len() <= 128
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        });
    theirs.map(Arc::from)
}

/// Which attempt served, for the response headers.
pub struct Served {
    /// `provider/model` (`x-switchyard-served-by`).
    pub by: Option<HeaderValue>,
    pub tier: &'static str,
    pub attempts: u32,
    /// What the serving target's wire could not carry (`x-switchyard-dropped`).
    pub dropped: Vec<String>,
    /// The stream's journal (`x-switchyard-resume-token`).
    pub resume_token: Option<std::sync::Arc<str>>,
}

impl Served {
    pub fn of_started(s: &crate::sink::Started) -> Self {
        Served {
            by: served_by(&s.provider, &s.model),
            tier: s.tier.as_str(),
            attempts: s.attempt,
            dropped: s.dropped.clone(),
            resume_token: s.resume_token.clone(),
        }
    }

    pub fn of_finished(f: &crate::sink::Finished) -> Self {
        Served {
            by: served_by(&f.provider, &f.model),
            tier: f.tier.as_str(),
            attempts: f.attempts,
            dropped: f.dropped.clone(),
            resume_token: None,
        }
    }
}

/// `provider/model` as a header value, written once into
/// [`crate::arena`]; `None` if a name is not a header value's text.
pub fn served_by(provider: &str, model: &str) -> Option<HeaderValue> {
    let text = crate::arena::concat(&[provider.as_bytes(), b"/", model.as_bytes()]);
    HeaderValue::from_maybe_shared(text).ok()
}

/// `x-switchyard-served-by`, `-tier`, `-attempts`, `-dropped` (when the
/// serving wire left something out), `-resume-token` (a journaled stream)
/// and `x-request-id`.
pub fn served_headers(h: &mut HeaderMap, served: Option<Served>, request_id: &str) {
    if let Some(s) = served {
        // Moved, not cloned: a clone of the value's bytes would allocate.
        if let Some(by) = s.by {
            h.insert(HeaderName::from_static("x-switchyard-served-by"), by);
        }
        h.insert(
            HeaderName::from_static("x-switchyard-tier"),
            HeaderValue::from_static(s.tier),
        );
        h.insert(
            HeaderName::from_static("x-switchyard-attempts"),
            crate::attempt::attempt_number(s.attempts),
        );
        dropped_header(h, &s.dropped);
        if let Some(token) = &s.resume_token {
            insert(h, "x-switchyard-resume-token", token);
        }
    }
    insert(h, "x-request-id", request_id);
}

/// Longest `x-switchyard-dropped` value: the names are Switchyard's own and
/// a door's field paths, bounded in number; the header stays well under any
/// proxy's header limit.
const MAX_DROPPED_HEADER: usize = 2048;

/// `x-switchyard-dropped: a, b, c`: what the serving target's wire did not
/// carry (absent when nothing was left out). A caller's field names are in
/// it, so anything but visible ASCII (and `,`) becomes `_`; the list is cut
/// at a whole name past [`MAX_DROPPED_HEADER`] bytes, ending `...`.
pub fn dropped_header(h: &mut HeaderMap, dropped: &[String]) {
    if dropped.is_empty() {
        return;
    }
    let mut value = String::new();
    for name in dropped {
        let name: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_graphic() && c != ',' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if value.len() + name.len() + 2 > MAX_DROPPED_HEADER {
            value.push_str(", ...");
            break;
        }
        if !value.is_empty() {
            value.push_str(", ");
        }
        value.push_str(&name);
    }
    insert(h, "x-switchyard-dropped", &value);
}

/// The `queue` rung took the request: 202 with the job, not an answer (the
/// same body on both doors).
pub fn queued(q: &QueuedJob, request_id: &str) -> Response {
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
    insert_static(h, "x-switchyard-tier", "queued");
    insert(h, "x-switchyard-job-id", &job.id);
    insert(h, "x-request-id", request_id);
    r
}

/// How a streamed answer opens, read before any response header goes out
/// (so a failure before the first token is a plain HTTP error).
pub enum Opening {
    /// The `queue` rung took it: answer with [`queued`].
    Queued(QueuedJob),
    /// Stream it: who serves (when the first event says), and an event
    /// read but not yet framed.
    Stream {
        served: Option<Served>,
        pending: Option<Event>,
    },
}

/// The event a reconnecting caller holds up to: `Last-Event-ID` as sent in
/// the stream's `id:` lines.
fn last_event_id(v: &HeaderValue) -> Result<u64, RequestError> {
    v.to_str()
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| {
            RequestError::InvalidRequest(
                "Last-Event-ID: not an event id of this stream (a whole number from its `id:` lines)"
                    .into(),
            )
        })
}

/// Reads the first event. `Err(None)`: the request ended without an answer.
pub async fn open(rx: &mut Events) -> Result<Opening, Option<RequestError>> {
    Ok(match rx.recv().await {
        None => return Err(None),
        Some(Err(e)) => return Err(Some(e)),
        Some(Ok(Event::Queued(q))) => Opening::Queued(*q),
        Some(Ok(Event::Started(s))) => Opening::Stream {
            served: Some(Served::of_started(&s)),
            pending: None,
        },
        Some(Ok(other)) => Opening::Stream {
            served: None,
            pending: Some(other),
        },
    })
}

/// How a buffered (unary) answer ended.
pub enum Unary {
    /// The assembled answer and who served it.
    Answer(proto::CompletionResponse, Option<Served>),
    /// The `queue` rung took it: answer with [`queued`].
    Queued(QueuedJob),
}

/// Reads a buffered request's events to its one answer. `Err(None)`: the
/// request ended without one.
pub async fn assemble(rx: &mut Events) -> Result<Unary, Option<RequestError>> {
    let mut assembler = convert::Assembler::default();
    let mut served = None;
    while let Some(item) = rx.recv().await {
        let event = item.map_err(Some)?;
        match &event {
            Event::Queued(q) => return Ok(Unary::Queued((**q).clone())),
            Event::Finished(f) => served = Some(Served::of_finished(f)),
            _ => {}
        }
        if let Some(done) = assembler.push(event) {
            return Ok(Unary::Answer(done, served));
        }
    }
    Err(None)
}

/// The headers of every streamed answer.
pub fn sse_headers(h: &mut HeaderMap, served: Option<Served>, request_id: &str) {
    // Room for all of them at once: a map grown past its first 6 allocates
    // its two tables again.
    h.reserve(SSE_HEADERS);
    insert_static(h, "content-type", "text/event-stream");
    insert_static(h, "cache-control", "no-cache");
    insert_static(h, "x-accel-buffering", "no");
    served_headers(h, served, request_id);
}

/// The most headers a stream's response has: three of its own, up to six of
/// [`served_headers`], and room for what the door adds.
const SSE_HEADERS: usize = 12;

/// `retry-after` (seconds, rounded up) and `retry-after-ms`.
pub fn retry_after(h: &mut HeaderMap, delay: Option<std::time::Duration>) {
    if let Some(delay) = delay {
        let secs = delay.as_millis().div_ceil(1000);
        insert(h, "retry-after", &secs.to_string());
        insert(h, "retry-after-ms", &delay.as_millis().to_string());
    }
}

/// Sets a header when the value is a valid header value.
/// Room for a short completion's JSON: the answer is written once, where
/// axum's `Json` starts at 128 bytes and grows (measured: four allocations
/// for a 16-token answer).
const JSON_ANSWER_BYTES: usize = 1024;

/// A 200 with `value` as its JSON body.
pub fn json_answer<T: serde::Serialize>(value: &T) -> Response {
    match crate::arena::json(JSON_ANSWER_BYTES, value) {
        Ok(body) => {
            let mut r = Response::new(Body::from(body));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `name: value`, the value copied into [`crate::arena`] (it lives until
/// the response's head is written); left out if it is not a header
/// value's text.
pub fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_maybe_shared(crate::arena::concat(&[value.as_bytes()])) {
        headers.insert(HeaderName::from_static(name), v);
    }
}

/// `name: value` for a value written in the code (no copy at all).
pub fn insert_static(headers: &mut HeaderMap, name: &'static str, value: &'static str) {
    headers.insert(
        HeaderName::from_static(name),
        HeaderValue::from_static(value),
    );
}

/// A door's server-sent-event encoder: the frames of one answer, in order.
pub trait SseFrames: Send + 'static {
    /// Writes the next frames at the end of `out`; false (and nothing
    /// written) once the stream is over. Cancel-safe: a call dropped before
    /// it completes has written nothing and loses nothing (it writes only
    /// after its last await).
    fn next_frames(&mut self, out: &mut BytesMut) -> impl Future<Output = bool> + Send;

    /// The stream's events, when its frames are numbered by them: each
    /// group of frames then carries `id: <seq>` of the last event it
    /// framed, and a reconnect's groups up to its `Last-Event-ID` are not
    /// sent.
    fn events(&self) -> Option<&Events> {
        None
    }
}

/// A JSON body read as `T`. Only a body that fails is read again, with
/// `serde_path_to_error`, to name where (it allocates once per key).
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(
    body: &[u8],
) -> Result<T, serde_path_to_error::Error<serde_json::Error>> {
    serde_json::from_slice(body).or_else(|_| {
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(body))
    })
}

/// Numbers the group of frames just written to `out` from `start`: `id:
/// <seq>` in its last frame when the stream is numbered and the group
/// framed a new event (`last` is the id sent last: a `Moved` stream's
/// closing frame repeats no id, so a client's `Last-Event-ID` stays on the
/// last event it holds); the group is taken back out when a reconnecting
/// caller already holds it.
fn number(out: &mut BytesMut, start: usize, events: Option<&Events>, last: &mut u64) {
    let Some(events) = events else {
        return;
    };
    let seq = events.seq();
    if seq <= events.after() {
        out.truncate(start);
        return;
    }
    if seq <= *last || out.len() == start {
        return;
    }
    *last = seq;
    let group = &out[start..];
    let body = group.strip_suffix(b"\n\n").unwrap_or(group);
    let at = start + memchr::memmem::rfind(body, b"\n\n").map_or(0, |i| i + 2);
    let end = out.len();
    // Writing to a `BytesMut` cannot fail.
    let _ = writeln!(out, "id: {seq}");
    let line = out.len() - end;
    out[at..].rotate_right(line);
}

/// Frames that are ready together leave in one body chunk, up to this size.
const COALESCE_BYTES: usize = 16 * 1024;

/// What a stream's frame buffer starts with: a token's frame or two. A
/// body chunk is split off it; once hyper has written the chunks, the next
/// frames reuse the same memory, so a stream allocates for its frames
/// about once, not once a token.
const FRAME_BUFFER: usize = 512;

/// Room made at once when frames ready together (a burst: an upstream read
/// that held many tokens, a reconnect's catch-up) have outgrown
/// [`FRAME_BUFFER`], so the burst does not grow the buffer by doubling (512
/// bytes, 1, 2, 4, 8 KB: five allocations and four copies for a 16-token
/// answer read at once). A stream whose frames ready together stay within
/// [`FRAME_BUFFER`] (a slow stream's token or two) never makes it.
const BURST_BUFFER: usize = 4 * 1024;

/// An answer's frames as the response body. Frames already there when one is
/// sent go out with it (one write instead of one per token); none waits for
/// another.
pub fn sse_body(frames: impl SseFrames) -> Body {
    let state = (frames, 0, BytesMut::new());
    let body = futures_util::stream::unfold(state, |(mut f, mut last, mut out)| async move {
        if out.capacity() == 0 {
            out.reserve(FRAME_BUFFER);
        }
        // A reconnect's groups the caller holds are skipped: wait on.
        while out.is_empty() {
            if !f.next_frames(&mut out).await {
                return None;
            }
            number(&mut out, 0, f.events(), &mut last);
        }
        while out.len() < COALESCE_BYTES {
            let start = out.len();
            match f.next_frames(&mut out).now_or_never() {
                Some(true) => number(&mut out, start, f.events(), &mut last),
                _ => break,
            }
            if out.len() >= FRAME_BUFFER && out.capacity() - out.len() < FRAME_BUFFER {
                out.reserve(BURST_BUFFER);
            }
        }
        let chunk = out.split().freeze();
        Some((Ok::<_, Infallible>(chunk), (f, last, out)))
    });
    Body::from_stream(body)
}

/// One SSE frame at the end of `out`: `event: <name>` when named, then
/// `data: <json>`, serialised in place (the doors' one frame writer).
pub(crate) fn put_frame(out: &mut BytesMut, event: Option<&str>, data: &impl serde::Serialize) {
    use bytes::BufMut;
    if let Some(name) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(name.as_bytes());
        out.put_u8(b'\n');
    }
    out.extend_from_slice(b"data: ");
    // Serialising a value into a buffer cannot fail.
    let _ = serde_json::to_writer((&mut *out).writer(), data);
    out.extend_from_slice(b"\n\n");
}

/// Writes `frames` (an encoder's whole group, made as a string) to `out`:
/// the `next_frames` of an encoder that does not write in place.
pub(crate) fn put_frames(out: &mut BytesMut, frames: Option<String>) -> bool {
    match frames {
        Some(f) => {
            out.extend_from_slice(f.as_bytes());
            true
        }
        None => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn frames(parts: &[&'static str]) -> Body {
        let frames = parts
            .iter()
            .map(|p| Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(p.as_bytes()))));
        Body::new(http_body_util::StreamBody::new(futures_util::stream::iter(
            frames.collect::<Vec<_>>(),
        )))
    }

    #[tokio::test]
    async fn a_body_is_read_whole_in_one_frame_or_many_and_refused_past_its_limit() {
        let none = HeaderMap::new();
        let one = read_body_up_to(frames(&["{\"a\":1}"]), &none, 64)
            .await
            .unwrap();
        assert_eq!(&one[..], b"{\"a\":1}");
        for parts in [
            &["", "ab", "", "cd", "e"][..],
            &["ab", "", "cde"],
            &["", "", "abcde"],
        ] {
            let many = read_body_up_to(frames(parts), &none, 64).await.unwrap();
            assert_eq!(&many[..], b"abcde", "{parts:?}");
        }
        let empty = read_body_up_to(frames(&["", ""]), &none, 64).await.unwrap();
        assert!(empty.is_empty());
        let over = read_body_up_to(frames(&["abc", "def"]), &none, 5).await;
        assert!(
            matches!(over, Err(RequestError::RequestTooLarge { limit: 5 })),
            "{over:?}"
        );
    }

    #[test]
    fn a_route_pin_is_split_at_an_at_sign_before_any_slash() {
        assert_eq!(
            split_route_pin("chat@primary/gpt-4o"),
            Some(("chat", "primary/gpt-4o"))
        );
        assert_eq!(
            split_route_pin("claude@vertex/claude-sonnet-4-5@20250929"),
            Some(("claude", "vertex/claude-sonnet-4-5@20250929"))
        );
        assert_eq!(split_route_pin("vertex/claude-sonnet-4-5@20250929"), None);
        assert_eq!(split_route_pin("chat@gpt-4o"), None);
        assert_eq!(split_route_pin("@primary/gpt-4o"), None);
        assert_eq!(split_route_pin("chat"), None);
    }

    #[test]
    fn only_sane_request_ids_are_kept() {
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("abc-1.2:3_x"));
        assert_eq!(caller_request_id(&h).as_deref(), Some("abc-1.2:3_x"));
        h.insert("x-request-id", HeaderValue::from_static("has space"));
        assert_eq!(caller_request_id(&h), None);
        h.insert(
            "x-request-id",
            HeaderValue::from_str(&"a".repeat(129)).unwrap(),
        );
        assert_eq!(caller_request_id(&h), None);
    }

    #[test]
    fn dropped_names_go_out_as_one_bounded_visible_ascii_list() {
        let mut h = HeaderMap::new();
        dropped_header(&mut h, &[]);
        assert!(
            h.get("x-switchyard-dropped").is_none(),
            "absent when nothing was left out"
        );
        let names = vec![
            "cache_control".to_string(),
            "passthrough.seed".to_string(),
            "passthrough.a b,\u{e9}".to_string(),
        ];
        dropped_header(&mut h, &names);
        assert_eq!(
            h["x-switchyard-dropped"],
            "cache_control, passthrough.seed, passthrough.a_b__"
        );
        let many: Vec<String> = (0..1000).map(|i| format!("passthrough.f{i}")).collect();
        dropped_header(&mut h, &many);
        let v = h["x-switchyard-dropped"].to_str().unwrap();
        assert!(
            v.len() <= MAX_DROPPED_HEADER + 5 && v.ends_with(", ..."),
            "{v}"
        );
        assert!(v.starts_with("passthrough.f0, passthrough.f1, "));
    }

    /// Frames fed one at a time through a channel.
    struct Fed(tokio::sync::mpsc::Receiver<String>);

    impl SseFrames for Fed {
        async fn next_frames(&mut self, out: &mut BytesMut) -> bool {
            put_frames(out, self.0.recv().await)
        }
    }

    /// Each event framed as two frames, numbered by the events.
    struct Numbered(Events);

    impl SseFrames for Numbered {
        async fn next_frames(&mut self, out: &mut BytesMut) -> bool {
            let Some(_) = self.0.recv().await else {
                return false;
            };
            let n = self.0.seq();
            let _ = write!(out, "data: a{n}\n\ndata: b{n}\n\n");
            true
        }

        fn events(&self) -> Option<&Events> {
            Some(&self.0)
        }
    }

    #[tokio::test]
    async fn each_group_is_numbered_in_its_last_frame_and_a_reconnect_skips_what_it_holds() {
        use futures_util::StreamExt;
        let (mut sink, mut rx) = crate::sink::channel(
            crate::sink::SendLimits::default(),
            crate::sink::Delivery::Resettable,
        );
        for t in ["x", "y", "z", "w"] {
            let text = crate::chat::Chunk::Text(t.into());
            sink.replay(Event::Chunk(text)).await.unwrap();
        }
        drop(sink);
        rx.resumed_after(2);
        let body = sse_body(Numbered(rx)).into_data_stream();
        let chunks: Vec<Bytes> = body.map(Result::unwrap).collect().await;
        let text: String = chunks
            .iter()
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        assert_eq!(
            text, "data: a3\n\nid: 3\ndata: b3\n\ndata: a4\n\nid: 4\ndata: b4\n\n",
            "groups 1 and 2 are held by the caller"
        );
    }

    #[tokio::test]
    async fn frames_ready_together_leave_in_one_chunk_and_none_waits() {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        for f in ["a\n\n", "b\n\n", "c\n\n"] {
            tx.send(f.to_string()).await.unwrap();
        }
        let mut body = sse_body(Fed(rx)).into_data_stream();
        use futures_util::StreamExt;
        let first = body.next().await.unwrap().unwrap();
        assert_eq!(first, "a\n\nb\n\nc\n\n");
        // Nothing more is there: the next frame goes out alone, when it
        // comes, written right after the first in the stream's one buffer
        // (no allocation of its own).
        tx.send("d\n\n".into()).await.unwrap();
        let second = body.next().await.unwrap().unwrap();
        assert_eq!(second, "d\n\n");
        assert_eq!(
            second.as_ptr() as usize,
            first.as_ptr() as usize + first.len(),
            "the stream's buffer is written on, not a new one"
        );
        drop(tx);
        assert!(body.next().await.is_none());
    }
}
