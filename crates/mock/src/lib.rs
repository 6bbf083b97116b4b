//! `mock-upstream`: a fault-injecting OpenAI- and Anthropic-compatible HTTP
//! server used by every integration test, drill and benchmark. It serves both
//! `POST /v1/chat/completions` and `POST /v1/messages` (deterministic text:
//! token `i` is `"tok{i} "`), logs every request, and injects faults on demand.
//! With OpenAI's `response_format: {"type":"json_object"}` the answer is the
//! JSON object `{"answer":"tok0 tok1 ..."}`; with `json_schema` (or Anthropic's
//! `output_config.format`) it is an instance of the schema, and a tool whose parameters name properties gets
//! arguments shaped by them (`schema.rs`). OpenAI `reasoning_effort`
//! answers with `reasoning_content` first, and a repeated long prompt reports
//! `cached_tokens` as OpenAI's automatic prompt cache would (`openai_cache.rs`).
//! Anthropic (`/v1/messages`, Bedrock, Vertex): prompt caching by
//! `cache_control` markers with their TTLs (usage reports
//! `cache_creation_input_tokens` / `cache_read_input_tokens`), and with
//! `thinking` on, a signed thinking block first; a thinking block sent back
//! with another signature is a 400 `invalid_request_error` (see
//! `anthropic_cache.rs`).
//! `POST /v1/embeddings` answers with a deterministic bag-of-words vector
//! (see [`embeddings`]). Gemini's `:streamGenerateContent?alt=sse` and
//! `:generateContent` (AI Studio's and Vertex's paths) take the same faults,
//! rendered in Google's shapes (see `gemini`).
//! It never forwards anything anywhere and never stores credentials.
//!
//! # Control API (never logged, never faulted)
//! - `PUT /_mock/faults` (a [`FaultSpec`], replaces the current one; `{}` clears),
//!   `GET /_mock/faults` (current spec; `times` shows what is left).
//! - `GET /_mock/requests` (JSON array of [`RequestRecord`]), `DELETE /_mock/requests`.
//! - `GET /_mock/stats` → `{"in_flight":n,"max_in_flight":n,"requests":n}` ([`Stats`]).
//! - `PUT /_mock/keys` → `{"rate_limited":[key],"refused":[key],"labels":{key:label}}`:
//!   keys answered 429 or 401 whatever the fault, and labels their requests
//!   are logged with (`key_label`).
//! - `GET|PUT /_mock/config` → `{"tokens":16,"token_delay_ms":0,"max_concurrency":0}`
//!   (PUT takes any subset of the fields).
//! - `PUT /_mock/tools` → `{"name":"f","arguments":"{\"city\":\"Paris\"}","text_after_result":true}`:
//!   tool calls name that offered tool with those whole arguments, and a request
//!   whose last message is a tool result gets text (an agent's loop ends); `{}` resets.
//!
//! # FaultSpec JSON
//! `{"type": T, ...params, "times": N?, "fraction": F?, "seed": S?}`. `times`: the
//! next N selected requests only; `fraction`: each request is selected with
//! probability F from an RNG seeded with `seed` (default `--seed`), reseeded
//! on every PUT. `after_tokens` defaults to 0. Types:
//! ```json
//! {"type":"none"}
//! {"type":"status","status":503,"headers":{"retry-after":"2"}}
//! {"type":"status","preset":"rate_limit"}   // also insufficient_quota, spend_limit,
//!   // request_too_large, overloaded, slow_down, server_error, auth, invalid,
//!   // context_length, not_found; "body":"raw text" overrides the body
//! {"type":"refuse","duration_ms":500}       // port closed, then rebound
//! {"type":"hang"}
//! {"type":"slow_first_token","delay_ms":2000}
//! {"type":"abort","after_tokens":3,"reset":true}
//! {"type":"stall","after_tokens":3}
//! {"type":"error_event","after_tokens":0,"error_type":"overloaded_error","message":"Overloaded","then_done":false}
//! {"type":"refusal","after_tokens":2}
//! {"type":"no_terminator"}
//! {"type":"malformed","after_tokens":1,"close":false}
//! {"type":"empty_done"}
//! {"type":"legacy_error","code":400}
//! {"type":"flood","tokens":100000,"token_bytes":0}   // ignores max_tokens; tokens padded to token_bytes
//! {"type":"huge_line","bytes":160000000}             // one SSE line that never ends, then a stall
//! {"type":"trickle","after_tokens":2,"byte_delay_ms":1000}  // the next frame one byte at a time
//! {"type":"second_choice"}                           // OpenAI: every token again as choice 1
//! {"type":"off_schema"}                              // OpenAI JSON mode: {"reply":..} where {"answer":..} is the norm
//! {"type":"orphan_delta"}                            // Anthropic: input_json_delta for an unopened block
//! ```
//! Non-streaming requests: `error_event` becomes the matching HTTP error
//! (529/503 overloaded by default), `refusal` a `content_filter`/`refusal`
//! body, `malformed` a cut JSON body, `empty_done`/`legacy_error` an empty 200,
//! `abort` a cut connection, `stall` headers only. Over capacity (in flight ≥
//! `max_concurrency` > 0) answers 503 (OpenAI) / 529 (Anthropic) at once.

mod anthropic_cache;
mod bedrock;
pub mod embeddings;
mod faults;
mod gemini;
mod log;
mod openai_cache;
mod schema;
mod script;
mod server;
mod vertex;
mod wire;

#[cfg(test)]
mod tests;

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use faults::{Fault, FaultSpec, Preset};
pub use log::{RequestRecord, Stats};
pub use server::MockConfig;
pub use wire::{token_text, AUTH_MARKER};

/// Default wire format of the mock (both endpoints are always served).
#[derive(
    clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum MockKind {
    /// OpenAI Chat Completions.
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// Google Gemini, at AI Studio's and Vertex's paths (`vertex_gemini`
    /// is the same).
    #[value(alias = "vertex_gemini")]
    #[serde(alias = "vertex_gemini")]
    Gemini,
}

impl MockKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MockKind::Openai => "openai",
            MockKind::Anthropic => "anthropic",
            MockKind::Gemini => "gemini",
        }
    }
}

/// Command-line arguments of `switchyard mock-upstream`.
#[derive(clap::Args, Debug, Clone)]
pub struct MockArgs {
    /// Address to listen on (port 0 = ephemeral).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Default wire format for labels; both endpoints are always served.
    #[arg(long, value_enum, default_value = "openai")]
    pub kind: MockKind,
    /// Tokens per completion (the request's max_tokens caps it; hitting the cap ends with length / max_tokens).
    #[arg(long, default_value_t = 16)]
    pub tokens: u32,
    /// Delay between tokens in ms.
    #[arg(long, default_value_t = 0)]
    pub token_delay_ms: u64,
    /// Initial fault, as the JSON body of PUT /_mock/faults.
    #[arg(long)]
    pub fault: Option<String>,
    /// Requests served at once before answering over-capacity (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub max_concurrency: u32,
    /// Seed for random fault selection.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl Default for MockArgs {
    fn default() -> Self {
        MockArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kind: MockKind::Openai,
            tokens: 16,
            token_delay_ms: 0,
            fault: None,
            max_concurrency: 0,
            seed: 0,
        }
    }
}

/// A running mock. Dropping it stops the server too.
pub struct MockHandle {
    addr: SocketAddr,
    kind: MockKind,
    shared: Arc<server::Shared>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

/// Binds, spawns the server and returns at once.
pub async fn start(args: MockArgs) -> std::io::Result<MockHandle> {
    let fault = match &args.fault {
        Some(json) => Some(
            FaultSpec::parse(json)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        ),
        None => None,
    };
    let listener = server::bind(args.listen)?;
    let addr = listener.local_addr()?;
    let config = MockConfig {
        tokens: args.tokens,
        token_delay_ms: args.token_delay_ms,
        max_concurrency: args.max_concurrency,
    };
    let started = tokio::time::Instant::now();
    let (shared, refuse_rx) = server::Shared::new(args.kind, config, args.seed, started);
    let mut listener = Some(listener);
    if let Some(spec) = fault {
        if matches!(spec.fault, Fault::Refuse { .. }) {
            // Close before returning, so nobody connects in between.
            listener = None;
        }
        let _ = shared.set_fault(spec);
    }
    let cancel = CancellationToken::new();
    let task = tokio::spawn(server::accept_loop(
        listener,
        addr,
        Arc::clone(&shared),
        refuse_rx,
        cancel.clone(),
    ));
    Ok(MockHandle {
        addr,
        kind: args.kind,
        shared,
        cancel,
        task: Some(task),
    })
}

/// Starts the mock, prints `mock-upstream listening on http://ADDR kind=KIND`,
/// and serves until SIGINT or SIGTERM.
pub async fn run(args: MockArgs) -> std::io::Result<()> {
    let handle = start(args).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "mock-upstream listening on http://{} kind={}",
            handle.addr(),
            handle.kind.as_str()
        )?;
        out.flush()?;
    }
    shutdown_signal().await?;
    handle.shutdown().await;
    Ok(())
}

#[cfg(unix)]
async fn shutdown_signal() -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
async fn shutdown_signal() -> std::io::Result<()> {
    tokio::signal::ctrl_c().await
}

impl MockHandle {
    /// The bound address (stable across `refuse`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR/v1`, the base URL of both dialects.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Same as `PUT /_mock/faults`. A `refuse` closes the port within
    /// microseconds (asynchronously); use [`MockHandle::apply_fault`] to wait.
    pub fn set_fault(&self, spec: FaultSpec) {
        let _ = self.shared.set_fault(spec);
    }

    /// Like [`MockHandle::set_fault`], but returns only once a `refuse` has
    /// closed the port.
    pub async fn apply_fault(&self, spec: FaultSpec) {
        if let Some(ack) = self.shared.set_fault(spec) {
            let _ = ack.await;
        }
    }

    /// The current fault spec.
    pub fn fault(&self) -> FaultSpec {
        self.shared.current_fault()
    }

    /// Snapshot of the request log.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log.snapshot()
    }

    /// Empties the request log (and restarts `max_in_flight`).
    pub fn clear_requests(&self) {
        self.shared.log.clear()
    }

    /// In-flight counters.
    pub fn stats(&self) -> Stats {
        self.shared.log.stats()
    }

    /// Stops accepting and drops every connection, then waits for the loop.
    pub async fn shutdown(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
