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
//! - `GET|PUT /_mock/config` → `{"tokens":16,"token_delay_ms":0,"max_concurrency":0,"ttft":[],"ttft_seed":0}`
//!   (PUT takes any subset of the fields). `ttft`: a time-to-first-token
//!   distribution, `[{"p":0.95,"ms":20},{"p":0.05,"ms":4000}]` (weights are
//!   normalised; `[]` clears); each answered (2xx) request draws one delay
//!   from an RNG seeded with `ttft_seed` (default `--seed`; reseeded by a PUT
//!   naming `ttft` or `ttft_seed`) and waits it after the response head,
//!   before the first body byte (so before the first token, streamed or
//!   not). A client leaving during the wait is noticed at once (hyper drops
//!   the body; logged as `client_hung_up` with `hung_up_ms`). The log gets
//!   `ttft_ms` (the draw), `first_token_ms` and `hung_up_ms` (ms since start).
//! - `PUT /_mock/limits` → per-key rate-limit windows (replaces the config and
//!   resets every counter; `{}` clears):
//!   `{"window_ms":60000,"default":{"rpm":N,"tpm":N},"keys":{"<key as sent>":{"rpm":N,"tpm":N,"used_requests":N,"used_tokens":N}}}`,
//!   every field optional; a key's unset `rpm`/`tpm` falls back to `default`'s,
//!   a key with neither is unlimited; `used_*` pre-load its first window
//!   (opened at the PUT). A key (the request's Bearer, `x-api-key`, `api-key`
//!   or `x-goog-api-key`; none counts as the empty key) gets a fixed window of
//!   `window_ms` from its first request; a request is charged 1 request and
//!   `input_tokens + max_tokens` (the configured `tokens` when it names none)
//!   at arrival, before any fault (a faulted or over-capacity request is still
//!   charged); one that would pass `rpm` or `tpm` is not charged and gets the
//!   kind's 429 (OpenAI `rate_limit_exceeded` with type `requests`/`tokens`,
//!   Anthropic `rate_limit_error`, Gemini `RESOURCE_EXHAUSTED`) with
//!   `retry-after`. Every response of a limited key carries, after its
//!   charge, OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`
//!   (OpenAI and Azure paths; resets like `59.874s`, `6m0s`) or Anthropic's
//!   `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,reset}`
//!   (`/v1/messages` only; RFC 3339 resets), each pair only for a limit set.
//!   The log gets `rate_tokens` and `rate_limited`.
//!   `GET /_mock/limits` → `{"window_ms":n,"keys":{"<label>":{"rpm":n,"tpm":n,"used_requests":n,
//!   "used_tokens":n,"peak_requests":n,"peak_tokens":n,"limited":n,"window_remaining_ms":n}}}`,
//!   labelled by `PUT /_mock/keys` or as the key's first 6 characters and `…`
//!   (never the key).
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
mod limits;
mod log;
mod openai_cache;
mod schema;
mod script;
mod server;
mod ttft;
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
pub use limits::{KeyLimit, KeyUsage, Limit, LimitsSpec, LimitsView};
pub use log::{RequestRecord, Stats};
pub use server::MockConfig;
pub use ttft::TtftBucket;
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

    /// Same as `PUT /_mock/limits`: replaces the rate-limit config and
    /// resets every window (an error for a `window_ms` of 0).
    pub fn set_limits(&self, spec: LimitsSpec) -> Result<(), String> {
        self.shared.set_limits(spec)
    }

    /// Same as `GET /_mock/limits`.
    pub fn limits(&self) -> LimitsView {
        self.shared.limits_view()
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
