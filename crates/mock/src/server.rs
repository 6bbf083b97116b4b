//! The mock's HTTP side: its own accept loop (so `refuse` can close and rebind
//! the port and `abort` can RST one connection), the axum router, the
//! provider endpoints and the `/_mock/*` control endpoints.
//! Control requests are never logged and never faulted.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper::service::Service as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::faults::{Fault, FaultSpec, FaultState, Preset};
use super::limits::{self, Charge, HeaderStyle, Limits, LimitsSpec, LimitsView};
use super::log::{Attempt, Log, RequestRecord};
use super::script::{self, ConnCtl, Step};
use super::ttft::{Ttft, TtftBucket};
use super::wire::{self, Gen, Parsed};
use super::MockKind;

/// Largest request body accepted.
const BODY_LIMIT: usize = 64 * 1024 * 1024;
/// Request headers copied into the log.
const LOGGED_HEADERS: &[&str] = &[
    "x-switchyard-attempt",
    "x-request-id",
    "idempotency-key",
    "x-stainless-retry-count",
    "anthropic-beta",
];

/// Settings changeable at run time via `PUT /_mock/config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MockConfig {
    /// Tokens per completion.
    pub tokens: u32,
    /// Delay between tokens in ms.
    pub token_delay_ms: u64,
    /// Requests served at once before answering over capacity (0 = unlimited).
    pub max_concurrency: u32,
}

/// Partial update of [`MockConfig`] and the TTFT distribution.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigPatch {
    tokens: Option<u32>,
    token_delay_ms: Option<u64>,
    max_concurrency: Option<u32>,
    ttft: Option<Vec<TtftBucket>>,
    ttft_seed: Option<u64>,
}

/// `GET|PUT /_mock/config`: [`MockConfig`] and the TTFT distribution.
#[derive(Debug, Serialize)]
struct ConfigView {
    #[serde(flatten)]
    config: MockConfig,
    ttft: Vec<TtftBucket>,
    ttft_seed: u64,
}

/// A request to the accept loop to stop listening for a while.
pub(crate) struct RefuseCmd {
    pub duration: Duration,
    /// Generation of the refuse spec, cleared when listening resumes.
    pub generation: u64,
    /// Answered once the listener is closed.
    pub ack: Option<oneshot::Sender<()>>,
}

/// State shared by the accept loop, the handlers and the [`super::MockHandle`].
pub(crate) struct Shared {
    pub kind: MockKind,
    pub log: Arc<Log>,
    config: Mutex<MockConfig>,
    faults: Mutex<FaultState>,
    refuse_tx: mpsc::UnboundedSender<RefuseCmd>,
    /// Per-key answers (`PUT /_mock/keys`), for providers with several keys.
    keys: Mutex<KeyRules>,
    /// Gemini: prompt prefixes seen, for implicit cache reads.
    implicit_cache: Mutex<super::gemini::ImplicitCache>,
    /// How tool calls are answered (`PUT /_mock/tools`).
    tools: Mutex<ToolScript>,
    /// OpenAI's automatic prompt cache (warm prefixes).
    openai_cache: Mutex<super::openai_cache::AutoCache>,
    /// Anthropic: warm prompt prefixes (signed thinking needs no state).
    prompt_cache: Mutex<super::anthropic_cache::PromptCache>,
    /// Per-key rate-limit windows (`PUT /_mock/limits`).
    limits: Mutex<Limits>,
    /// Time-to-first-token distribution (`ttft` of `PUT /_mock/config`).
    ttft: Mutex<Ttft>,
}

/// A scripted tool call (`PUT /_mock/tools`), so an agent's tool loop can run
/// against the mock: which offered tool is called with which arguments, and
/// whether a request whose last message is a tool result is answered with
/// text (the loop ends) instead of another call.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ToolScript {
    /// Call this tool (when the request offers it) instead of the first.
    pub name: Option<String>,
    /// The call's whole arguments (JSON text), instead of `{"query":"tok0 ..."}`.
    pub arguments: Option<String>,
    /// After a tool result, answer with text.
    pub text_after_result: bool,
}

impl ToolScript {
    /// Applies the script to a parsed request.
    fn apply(&self, dialect: MockKind, body: &serde_json::Value, parsed: &mut Parsed) {
        if parsed.tool.is_none() {
            return;
        }
        if self.text_after_result && wire::ends_with_tool_result(dialect, body) {
            parsed.tool = None;
            return;
        }
        if let Some(name) = &self.name {
            if wire::offers_tool(dialect, body, name) {
                parsed.tool = Some(name.clone());
                parsed.tool_schema = wire::tool_schema(dialect, body, name);
            }
        }
        parsed.args = self.arguments.clone();
    }
}

/// Keys (test values, never logged) that get a 429 or a 401 whatever the fault.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct KeyRules {
    pub rate_limited: Vec<String>,
    pub refused: Vec<String>,
    /// Key -> the label its requests are logged with (`key_label`).
    pub labels: BTreeMap<String, String>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(crate) fn new(
        kind: MockKind,
        config: MockConfig,
        seed: u64,
        started: Instant,
    ) -> (Arc<Shared>, mpsc::UnboundedReceiver<RefuseCmd>) {
        let (refuse_tx, refuse_rx) = mpsc::unbounded_channel();
        let shared = Shared {
            kind,
            log: Arc::new(Log::new(started)),
            config: Mutex::new(config),
            faults: Mutex::new(FaultState::new(seed)),
            refuse_tx,
            keys: Mutex::new(KeyRules::default()),
            implicit_cache: Mutex::default(),
            tools: Mutex::new(ToolScript::default()),
            openai_cache: Mutex::default(),
            prompt_cache: Mutex::default(),
            limits: Mutex::default(),
            ttft: Mutex::new(Ttft::new(seed)),
        };
        (Arc::new(shared), refuse_rx)
    }

    pub(crate) fn config(&self) -> MockConfig {
        *lock(&self.config)
    }

    /// The fault for the next request (and counts it against `times`).
    pub(crate) fn pick_fault(&self) -> Fault {
        lock(&self.faults).pick().unwrap_or(Fault::None)
    }

    pub(crate) fn current_fault(&self) -> FaultSpec {
        lock(&self.faults).current()
    }

    /// Replaces the rate-limit config and resets every window.
    pub(crate) fn set_limits(&self, spec: LimitsSpec) -> Result<(), String> {
        lock(&self.limits).set(spec, Instant::now())
    }

    /// Every limited key's window, by label.
    pub(crate) fn limits_view(&self) -> LimitsView {
        let labels = lock(&self.keys).labels.clone();
        lock(&self.limits).view(&labels, Instant::now())
    }

    fn config_view(&self) -> ConfigView {
        let ttft = lock(&self.ttft);
        ConfigView {
            config: self.config(),
            ttft: ttft.buckets().to_vec(),
            ttft_seed: ttft.seed(),
        }
    }

    pub(crate) fn clear_refuse(&self, generation: u64) {
        lock(&self.faults).clear_if(generation);
    }

    /// Installs `spec`; a `refuse` also tells the accept loop to close the port.
    /// The returned receiver fires once the listener is closed.
    pub(crate) fn set_fault(&self, spec: FaultSpec) -> Option<oneshot::Receiver<()>> {
        let refuse = match spec.fault {
            Fault::Refuse { duration_ms } => Some(Duration::from_millis(duration_ms)),
            _ => None,
        };
        let generation = lock(&self.faults).set(spec);
        let duration = refuse?;
        let (ack, rx) = oneshot::channel();
        let cmd = RefuseCmd {
            duration,
            generation,
            ack: Some(ack),
        };
        self.refuse_tx.send(cmd).ok()?;
        Some(rx)
    }
}

// ---- Accept loop ------------------------------------------------------------

/// Binds `addr` with SO_REUSEADDR, so a `refuse` can rebind the same port.
pub(crate) fn bind(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Serves until `cancel` fires. Phases of a `refuse`: (1) drop the listener,
/// (2) ask open connections to close once idle, (3) wait, (4) rebind.
pub(crate) async fn accept_loop(
    listener: Option<TcpListener>,
    addr: SocketAddr,
    shared: Arc<Shared>,
    mut refuse_rx: mpsc::UnboundedReceiver<RefuseCmd>,
    cancel: CancellationToken,
) {
    let router = router(Arc::clone(&shared));
    let (close_tx, _) = watch::channel(0u64);
    let mut listener = listener;
    let mut down: Option<(Instant, u64)> = None;
    loop {
        if listener.is_none() {
            let (until, generation) = down.unwrap_or((Instant::now(), 0));
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep_until(until) => {}
            }
            match bind(addr) {
                Ok(l) => {
                    listener = Some(l);
                    down = None;
                    shared.clear_refuse(generation);
                }
                Err(e) => {
                    tracing::warn!(%addr, error = %e, "mock-upstream: rebind failed, retrying");
                    down = Some((Instant::now() + Duration::from_millis(20), generation));
                }
            }
            continue;
        }
        let Some(l) = listener.as_ref() else { continue };
        tokio::select! {
            _ = cancel.cancelled() => return,
            cmd = refuse_rx.recv() => {
                let Some(mut cmd) = cmd else { return };
                listener = None;
                close_tx.send_modify(|n| *n += 1);
                down = Some((Instant::now() + cmd.duration, cmd.generation));
                if let Some(ack) = cmd.ack.take() {
                    let _ = ack.send(());
                }
            }
            accepted = l.accept() => match accepted {
                Ok((stream, peer)) => {
                    let conn = serve_conn(stream, peer, router.clone(), cancel.clone(), close_tx.subscribe());
                    tokio::spawn(conn);
                }
                Err(e) => {
                    tracing::debug!(error = %e, "mock-upstream: accept failed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            },
        }
    }
}

/// Serves one connection; drops it hard on `cancel`, gracefully on `close`.
async fn serve_conn(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    cancel: CancellationToken,
    mut close: watch::Receiver<u64>,
) {
    let _ = stream.set_nodelay(true);
    let ctl = Arc::new(ConnCtl {
        peer: Some(peer),
        ..ConnCtl::default()
    });
    let io = TokioIo::new(ConnIo {
        inner: stream,
        ctl: Arc::clone(&ctl),
    });
    let svc = TowerToHyperService::new(router);
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(Arc::clone(&ctl));
        svc.call(req)
    });
    let builder = auto::Builder::new(TokioExecutor::new());
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "mock-upstream: connection ended");
                }
                return;
            }
            changed = close.changed(), if !closing => {
                closing = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// A TCP stream that closes with RST (SO_LINGER 0) when its [`ConnCtl`] says so.
struct ConnIo {
    inner: TcpStream,
    ctl: Arc<ConnCtl>,
}

impl Drop for ConnIo {
    fn drop(&mut self) {
        if self.ctl.reset.load(Ordering::SeqCst) {
            let _ = socket2::SockRef::from(&self.inner).set_linger(Some(Duration::ZERO));
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

// ---- Router -----------------------------------------------------------------

fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/embeddings", post(super::embeddings::embeddings))
        .route(
            "/v1/chat/completions",
            post(|s: State<Arc<Shared>>, r: Request| completion(s, MockKind::Openai, r)),
        )
        .route(
            "/v1/messages",
            post(|s: State<Arc<Shared>>, r: Request| completion(s, MockKind::Anthropic, r)),
        )
        .route(
            "/openai/deployments/{deployment}/chat/completions",
            post(azure_completion),
        )
        .route(
            "/model/{model}/invoke-with-response-stream",
            post(super::bedrock::invoke_stream),
        )
        .route("/token", post(super::vertex::token))
        .route("/_mock/tokens", get(super::vertex::grants))
        .route(
            "/v1/projects/{project}/locations/{location}/publishers/anthropic/models/{model_action}",
            post(super::vertex::stream_raw_predict),
        )
        .route("/v1beta/models/{model_action}", post(super::gemini::ai_studio))
        .route(
            "/v1/projects/{project}/locations/{location}/publishers/google/models/{model_action}",
            post(super::gemini::vertex),
        )
        .route("/_mock/faults", get(get_faults).put(put_faults))
        .route("/_mock/requests", get(get_requests).delete(delete_requests))
        .route("/_mock/stats", get(get_stats))
        .route("/_mock/config", get(get_config).put(put_config))
        .route("/_mock/keys", axum::routing::put(put_keys))
        .route("/_mock/limits", get(get_limits).put(put_limits))
        .route("/_mock/tools", axum::routing::put(put_tools))
        .route("/_mock/health", get(|| async { "ok" }))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(shared)
}

async fn not_found(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    let dialect = if path.contains("messages") {
        MockKind::Anthropic
    } else if path.contains("completions") {
        MockKind::Openai
    } else if path.contains("GenerateContent") || path.contains("generateContent") {
        MockKind::Gemini
    } else {
        s.kind
    };
    let (_, body) = wire::preset_error(dialect, Preset::Invalid, "mock-model", "req_mock");
    let mut body = body;
    let msg = format!("mock-upstream: no route for {path}");
    match dialect {
        MockKind::Openai => body["error"]["message"] = msg.into(),
        MockKind::Anthropic => {
            body["error"]["type"] = "not_found_error".into();
            body["error"]["message"] = msg.into();
        }
        MockKind::Gemini => {
            body["error"] = serde_json::json!({"code": 404, "message": msg, "status": "NOT_FOUND"});
        }
    }
    (StatusCode::NOT_FOUND, Json(body)).into_response()
}

async fn get_faults(State(s): State<Arc<Shared>>) -> Json<FaultSpec> {
    Json(s.current_fault())
}

async fn put_faults(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    let text = String::from_utf8_lossy(&body);
    let text = if text.trim().is_empty() { "{}" } else { &text };
    match FaultSpec::parse(text) {
        Ok(spec) => {
            if let Some(ack) = s.set_fault(spec) {
                let _ = ack.await;
            }
            Json(s.current_fault()).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": e})),
        )
            .into_response(),
    }
}

async fn get_requests(State(s): State<Arc<Shared>>) -> Json<Vec<RequestRecord>> {
    Json(s.log.snapshot())
}

async fn delete_requests(State(s): State<Arc<Shared>>) -> StatusCode {
    s.log.clear();
    StatusCode::NO_CONTENT
}

async fn get_stats(State(s): State<Arc<Shared>>) -> Response {
    Json(s.log.stats()).into_response()
}

async fn get_config(State(s): State<Arc<Shared>>) -> Json<ConfigView> {
    Json(s.config_view())
}

/// Applies a [`ConfigPatch`]; a `ttft` or `ttft_seed` reseeds the TTFT sampler.
async fn put_config(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    let patch = serde_json::from_slice::<ConfigPatch>(&body)
        .map_err(|e| e.to_string())
        .and_then(|p| match &p.ttft {
            Some(b) => Ttft::validate(b).map(|()| p),
            None => Ok(p),
        });
    match patch {
        Ok(p) => {
            {
                let mut c = lock(&s.config);
                c.tokens = p.tokens.unwrap_or(c.tokens);
                c.token_delay_ms = p.token_delay_ms.unwrap_or(c.token_delay_ms);
                c.max_concurrency = p.max_concurrency.unwrap_or(c.max_concurrency);
            }
            if p.ttft.is_some() || p.ttft_seed.is_some() {
                // Validated above: cannot fail.
                let _ = lock(&s.ttft).set(p.ttft, p.ttft_seed);
            }
            Json(s.config_view()).into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": e})),
        )
            .into_response(),
    }
}

async fn get_limits(State(s): State<Arc<Shared>>) -> Json<LimitsView> {
    Json(s.limits_view())
}

/// Replaces the rate-limit config (`{}` or an empty body clears it).
async fn put_limits(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    let spec = if body.iter().all(u8::is_ascii_whitespace) {
        Ok(LimitsSpec::default())
    } else {
        serde_json::from_slice::<LimitsSpec>(&body).map_err(|e| e.to_string())
    };
    match spec.and_then(|spec| s.set_limits(spec)) {
        Ok(()) => Json(s.limits_view()).into_response(),
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": e})),
        )
            .into_response(),
    }
}

async fn put_keys(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match serde_json::from_slice::<KeyRules>(&body) {
        Ok(rules) => {
            *lock(&s.keys) = rules;
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

async fn put_tools(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    match serde_json::from_slice::<ToolScript>(&body) {
        Ok(script) => {
            *lock(&s.tools) = script;
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": e.to_string()})),
        )
            .into_response(),
    }
}

/// The key a request carries, in whichever header its dialect uses.
fn request_key(headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    bearer
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| headers.get("api-key").and_then(|v| v.to_str().ok()))
        .or_else(|| headers.get("x-goog-api-key").and_then(|v| v.to_str().ok()))
        .map(str::to_string)
}

// ---- Provider endpoints -----------------------------------------------------

pub(super) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn unix_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn new_record(
    dialect: MockKind,
    parts: &axum::http::request::Parts,
    body: &serde_json::Value,
    parsed: &Parsed,
) -> RequestRecord {
    let headers = &parts.headers;
    let selected: BTreeMap<String, String> = LOGGED_HEADERS
        .iter()
        .filter_map(|h| {
            let v = headers.get(*h)?.to_str().ok()?;
            Some(((*h).to_owned(), v.to_owned()))
        })
        .collect();
    RequestRecord {
        seq: 0,
        path: parts.uri.path().to_owned(),
        dialect,
        model: parsed.model.clone(),
        stream: parsed.stream,
        max_tokens: parsed.max_tokens,
        has_tools: parsed.tool.is_some(),
        body: body.clone(),
        authorization_present: headers.contains_key(header::AUTHORIZATION)
            || headers.contains_key("x-api-key")
            || headers.contains_key("api-key")
            || headers.contains_key("x-goog-api-key"),
        headers: selected,
        arrived_ms: 0.0,
        finished_ms: None,
        status: None,
        fault: None,
        tokens_sent: 0,
        completed: false,
        client_hung_up: false,
        over_capacity: false,
        http_version: format!("{:?}", parts.version),
        peer: parts
            .extensions
            .get::<Arc<ConnCtl>>()
            .and_then(|c| c.peer)
            .map(|a| a.to_string())
            .unwrap_or_default(),
        ..RequestRecord::default()
    }
}

/// Azure OpenAI's deployment path: OpenAI's wire once Azure's own checks
/// pass (an `api-version` query, the key in `api-key` and never in
/// `Authorization`), refused the way Azure refuses otherwise.
async fn azure_completion(s: State<Arc<Shared>>, req: Request) -> Response {
    let has_version = req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv.starts_with("api-version=") && kv.len() > 12)
    });
    let refuse = |status: StatusCode, code: &str, message: &str| {
        let body = serde_json::json!({"error": {"code": code, "message": message}});
        (status, axum::Json(body)).into_response()
    };
    if !has_version {
        return refuse(
            StatusCode::NOT_FOUND,
            "404",
            "Resource not found (the api-version query parameter is required)",
        );
    }
    if req.headers().contains_key(header::AUTHORIZATION) || !req.headers().contains_key("api-key") {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "401",
            "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.",
        );
    }
    completion(s, MockKind::Openai, req).await
}

/// `POST /v1/chat/completions` and `POST /v1/messages`.
async fn completion(s: State<Arc<Shared>>, dialect: MockKind, req: Request) -> Response {
    completion_as(s, dialect, req, None).await
}

/// [`completion`], with the request read as if its body named `model` and
/// asked to stream (Bedrock: the path names the model, the call streams);
/// the body is logged as sent.
pub(super) async fn completion_as(
    State(s): State<Arc<Shared>>,
    dialect: MockKind,
    req: Request,
    streamed_model: Option<String>,
) -> Response {
    let (parts, body) = req.into_parts();
    let conn = parts.extensions.get::<Arc<ConnCtl>>().cloned();
    let bytes = axum::body::to_bytes(body, BODY_LIMIT)
        .await
        .unwrap_or_default();
    let json: Option<serde_json::Value> = serde_json::from_slice(&bytes).ok();
    let body_json = json.clone().unwrap_or(serde_json::Value::Null);
    let mut parsed = match &streamed_model {
        None => Parsed::from_body(dialect, &body_json),
        Some(model) => {
            let mut as_read = body_json.clone();
            // Gemini names the streaming call in its path; the others stream here.
            let stream =
                dialect != MockKind::Gemini || parts.uri.path().ends_with(":streamGenerateContent");
            if let Some(o) = as_read.as_object_mut() {
                o.insert("model".into(), model.clone().into());
                o.insert("stream".into(), stream.into());
            }
            Parsed::from_body(dialect, &as_read)
        }
    };
    if dialect == MockKind::Gemini {
        parsed.cached_tokens = lock(&s.implicit_cache).read(&body_json);
    }
    lock(&s.tools).apply(dialect, &body_json, &mut parsed);
    let cfg = s.config();
    let record = new_record(dialect, &parts, &body_json, &parsed);
    let attempt = s.log.begin(record, cfg.max_concurrency);
    let key = request_key(&parts.headers);
    if let Some(label) = key
        .as_ref()
        .and_then(|k| lock(&s.keys).labels.get(k).cloned())
    {
        attempt.set_key_label(label);
    }
    // Charged at arrival, before any fault (a refused or over-capacity
    // request still counts, as real providers count it).
    let charge_tokens =
        u64::from(parsed.input_tokens) + u64::from(parsed.max_tokens.unwrap_or(cfg.tokens));
    let charge = lock(&s.limits).charge(
        key.as_deref().unwrap_or_default(),
        charge_tokens,
        Instant::now(),
    );
    let ctx = Answer {
        dialect,
        parsed,
        body: body_json,
        parsed_ok: json.is_some(),
        conn,
        key,
        cfg,
    };
    let Some(charge) = charge else {
        return answer(&s, ctx, attempt).await;
    };
    attempt.set_rate(
        u32::try_from(charge.tokens).unwrap_or(u32::MAX),
        charge.refused.is_some(),
    );
    let style = match dialect {
        MockKind::Openai => HeaderStyle::OpenAi,
        MockKind::Anthropic if parts.uri.path() == "/v1/messages" => HeaderStyle::Anthropic,
        _ => HeaderStyle::None,
    };
    let mut resp = match charge.refused {
        Some(refusal) => {
            let gen = Gen::new(dialect, ctx.parsed, attempt.seq(), cfg.tokens, unix_now());
            let (status, body) = limits::refusal_body(
                dialect,
                &refusal,
                charge.reset_in,
                gen.model_name(),
                &gen.request_id(),
            );
            let mut resp = error_response(&gen, attempt, status, body, &BTreeMap::new(), None);
            resp.extensions_mut().insert(limits::WindowRefused);
            resp
        }
        None => answer(&s, ctx, attempt).await,
    };
    add_rate_headers(&mut resp, style, &charge);
    resp
}

/// What [`answer`] needs of a request the mock read.
struct Answer {
    dialect: MockKind,
    parsed: Parsed,
    /// The JSON body (`null` if it did not parse).
    body: serde_json::Value,
    /// The body parsed as JSON.
    parsed_ok: bool,
    conn: Option<Arc<ConnCtl>>,
    key: Option<String>,
    cfg: MockConfig,
}

/// Adds a limited key's rate-limit headers (after its charge) to `resp`.
fn add_rate_headers(resp: &mut Response, style: HeaderStyle, charge: &Charge) {
    for (k, v) in limits::headers(style, charge, SystemTime::now()) {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::from_str(&v)) {
            resp.headers_mut().insert(k, v);
        }
    }
}

/// Serves a request its rate-limit window let through: key rules,
/// capacity, the fault, then the answer.
async fn answer(s: &Arc<Shared>, ctx: Answer, attempt: Attempt) -> Response {
    let Answer {
        dialect,
        parsed,
        body: body_json,
        parsed_ok,
        conn,
        key,
        cfg,
    } = ctx;
    let fault = lock(&s.faults).pick().unwrap_or(Fault::None);
    let mut gen = match fault {
        Fault::Flood {
            tokens,
            token_bytes,
        } => Gen::ignoring_max_tokens(dialect, parsed, attempt.seq(), tokens, unix_now())
            .padded(token_bytes),
        Fault::OffSchema => {
            Gen::new(dialect, parsed, attempt.seq(), cfg.tokens, unix_now()).off_schema()
        }
        _ => Gen::new(dialect, parsed, attempt.seq(), cfg.tokens, unix_now()),
    };

    let rule = {
        let rules = lock(&s.keys);
        let has = |list: &[String]| key.as_ref().is_some_and(|k| list.contains(k));
        if has(&rules.refused) {
            Some(Preset::Auth)
        } else if has(&rules.rate_limited) {
            Some(Preset::RateLimit)
        } else {
            None
        }
    };
    if let Some(preset) = rule {
        let (status, body) =
            wire::preset_error(dialect, preset, gen.model_name(), &gen.request_id());
        let headers: BTreeMap<String, String> = if preset == Preset::RateLimit {
            [("retry-after".to_string(), "30".to_string())].into()
        } else {
            BTreeMap::new()
        };
        attempt.set_fault(Some(if preset == Preset::Auth {
            "key_refused"
        } else {
            "key_rate_limited"
        }));
        return error_response(&gen, attempt, status, body, &headers, None);
    }
    if attempt.over_capacity() {
        let (status, body) = wire::over_capacity(dialect, &gen.request_id());
        return error_response(&gen, attempt, status, body, &BTreeMap::new(), None);
    }
    if !parsed_ok {
        let (status, body) = wire::bad_json(dialect, &gen.request_id());
        return error_response(&gen, attempt, status, body, &BTreeMap::new(), None);
    }
    if dialect == MockKind::Gemini {
        if let Some((status, body)) = super::gemini::check_signatures(&body_json) {
            attempt.set_fault(Some("thought_signature"));
            return error_response(&gen, attempt, status, body, &BTreeMap::new(), None);
        }
    }
    if dialect == MockKind::Anthropic {
        let served = lock(&s.prompt_cache).serve(&body_json, attempt.seq(), unix_now_ms());
        match served {
            Ok(extras) => gen = gen.with_anthropic(extras),
            Err((status, body)) => {
                attempt.set_fault(Some("invalid_thinking"));
                return error_response(&gen, attempt, status, body, &BTreeMap::new(), None);
            }
        }
    }
    if fault != Fault::None {
        attempt.set_fault(Some(fault.name()));
    }
    if dialect == MockKind::Openai && answers(&fault, gen.req.stream) {
        gen.req.cached_tokens = openai_cached_tokens(s, &body_json, &gen.req);
    }
    let delay = Duration::from_millis(cfg.token_delay_ms);
    match &fault {
        Fault::Hang => {
            let _attempt = attempt;
            std::future::pending::<()>().await;
            unreachable_response()
        }
        Fault::Refuse { .. } => {
            // Arrived on a connection opened before the port closed: cut it.
            respond(
                &gen,
                attempt,
                200,
                vec![Step::Abort { reset: true }],
                conn,
                false,
            )
        }
        Fault::Status { .. } => status_response(&gen, attempt, &fault),
        Fault::ErrorEvent { error_type, .. } if !gen.req.stream => {
            let preset = match error_type.as_deref() {
                None | Some("overloaded_error") => Preset::Overloaded,
                Some("rate_limit_error") => Preset::RateLimit,
                _ => Preset::ServerError,
            };
            let (code, body) =
                wire::preset_error(dialect, preset, gen.model_name(), &gen.request_id());
            error_response(&gen, attempt, code, body, &BTreeMap::new(), None)
        }
        _ => {
            let mut steps = if gen.req.stream {
                script::stream_steps(&gen, &fault, delay)
            } else {
                script::json_steps(&gen, &fault)
            };
            // A slow first token: after the head, before the first byte of the body.
            if let Some(ms) = lock(&s.ttft).sample() {
                attempt.set_ttft(ms);
                if ms > 0 {
                    steps.insert(0, Step::Sleep(Duration::from_millis(ms)));
                }
            }
            let sse = gen.req.stream;
            respond(&gen, attempt, 200, steps, conn, sse)
        }
    }
}

/// Whether the request gets an answer (and so counts for prompt caching).
fn answers(fault: &Fault, stream: bool) -> bool {
    match fault {
        Fault::Hang | Fault::Refuse { .. } | Fault::Status { .. } => false,
        Fault::ErrorEvent { .. } => stream,
        _ => true,
    }
}

/// The cached prompt tokens of an answered OpenAI request: its messages
/// (the text the mock counts tokens on) under its model and tools.
fn openai_cached_tokens(s: &Shared, body: &serde_json::Value, req: &Parsed) -> u32 {
    let namespace = format!(
        "{}\n{}",
        req.model.as_deref().unwrap_or_default(),
        body.get("tools").map(|t| t.to_string()).unwrap_or_default()
    );
    let prompt = body
        .get("messages")
        .map(|m| m.to_string())
        .unwrap_or_default();
    lock(&s.openai_cache).serve(
        &namespace,
        prompt.as_bytes(),
        req.input_tokens,
        Instant::now(),
    )
}

fn unreachable_response() -> Response {
    StatusCode::INTERNAL_SERVER_ERROR.into_response()
}

fn request_id_header(dialect: MockKind) -> HeaderName {
    match dialect {
        MockKind::Openai | MockKind::Gemini => HeaderName::from_static("x-request-id"),
        MockKind::Anthropic => HeaderName::from_static("request-id"),
    }
}

/// A response whose body plays `steps`.
pub(super) fn respond(
    gen: &Gen,
    attempt: Attempt,
    status: u16,
    steps: Vec<Step>,
    conn: Option<Arc<ConnCtl>>,
    sse: bool,
) -> Response {
    attempt.set_status(status);
    let mut resp = Response::new(script::into_body(steps, attempt, conn));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    let h = resp.headers_mut();
    let ct = if sse {
        "text/event-stream; charset=utf-8"
    } else {
        "application/json"
    };
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
    if sse {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    if let Ok(v) = HeaderValue::from_str(&gen.request_id()) {
        h.insert(request_id_header(gen.dialect), v);
    }
    resp
}

/// The answer of a `status` fault: its status, preset body (or raw
/// body) and headers, in the request's dialect.
pub(super) fn status_response(gen: &Gen, attempt: Attempt, fault: &Fault) -> Response {
    let Fault::Status {
        status,
        preset,
        headers,
        body,
    } = fault
    else {
        return error_response(
            gen,
            attempt,
            500,
            serde_json::json!({}),
            &BTreeMap::new(),
            None,
        );
    };
    let preset = preset.unwrap_or_else(|| Preset::for_status(status.unwrap_or(500)));
    let (preset_status, preset_body) =
        wire::preset_error(gen.dialect, preset, gen.model_name(), &gen.request_id());
    let code = status.unwrap_or(preset_status);
    let raw = body.as_ref().map(|b| Bytes::from(b.clone()));
    error_response(gen, attempt, code, preset_body, headers, raw)
}

/// An error response: `body` (or `raw`) with `status` and extra `headers`.
pub(super) fn error_response(
    gen: &Gen,
    attempt: Attempt,
    status: u16,
    body: serde_json::Value,
    headers: &BTreeMap<String, String>,
    raw: Option<Bytes>,
) -> Response {
    let bytes = raw.unwrap_or_else(|| Bytes::from(body.to_string()));
    let mut resp = respond(
        gen,
        attempt,
        status,
        vec![Step::Data(bytes, 0)],
        None,
        false,
    );
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::from_str(v)) {
            resp.headers_mut().insert(k, v);
        }
    }
    resp
}
