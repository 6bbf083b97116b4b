//! The callers a benchmark compares: Switchyard over gRPC (a few HTTP/2
//! channels), the mock's OpenAI endpoint called straight with reqwest, and
//! the naive baselines (an immediate-retry loop, a static primary/secondary
//! client with buffered answers). Each call yields one [`Outcome`], with its
//! latency measured from the *scheduled* start so queueing counts, and what
//! the answer said about itself (usage; Switchyard's tier and cost).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::BenchError;
use switchyard::proto;
use switchyard::proto::router_client::RouterClient;

/// How one caller request ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcome {
    /// The request's number in its load run (0-based, in schedule order).
    pub index: u64,
    /// Scheduled start, seconds after the run began.
    pub at: f64,
    pub ok: bool,
    pub latency_ms: f64,
    /// Time to the first token (buffered answers: the whole answer).
    pub ttft_ms: Option<f64>,
    /// Upstream attempts this request caused, as far as the caller knows.
    pub attempts: u32,
    pub tokens: u32,
    /// `CODE REASON` (gRPC), `HTTP 503`, or `transport: ...`.
    pub error: Option<String>,
    /// What a successful answer said about itself.
    pub answer: Option<Answer>,
}

/// What an answer reported about itself: the usage (a mock's, or
/// Switchyard's `Finished.usage`) and, from Switchyard, tier and cost.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Answer {
    /// Tokens in and out, when the answer carried usage.
    pub usage: Option<(u32, u32)>,
    /// Switchyard's tier name (`TIER_PRIMARY`, `TIER_CACHE`, ...).
    pub tier: Option<&'static str>,
    /// Switchyard's `cost_usd` (0 for cache hits).
    pub cost_usd: f64,
    /// Switchyard's `cache_similarity` (semantic cache hits).
    pub cache_similarity: f32,
    /// Switchyard's `Finished.hedged`: a second attempt was started.
    pub hedged: bool,
    /// Switchyard's `Finished.won_attempt` (0 unless hedged).
    pub won_attempt: u32,
}

impl Answer {
    fn from_switchyard(
        tier: i32,
        usage: Option<&proto::Usage>,
        cost_usd: f64,
        cache_similarity: f32,
    ) -> Answer {
        Answer {
            usage: usage.map(|u| (u.input_tokens, u.output_tokens)),
            tier: proto::Tier::try_from(tier).ok().map(|t| t.as_str_name()),
            cost_usd,
            cache_similarity,
            ..Answer::default()
        }
    }
}

impl Outcome {
    fn failed(t0: Instant, attempts: u32, error: String) -> Outcome {
        Outcome {
            latency_ms: ms(t0.elapsed()),
            attempts,
            error: Some(error),
            ..Outcome::default()
        }
    }

    /// The error's first word: a gRPC code name, `HTTP`, `transport`, `timeout`.
    pub fn error_kind(&self) -> Option<&str> {
        self.error
            .as_deref()
            .map(|e| e.split_whitespace().next().unwrap_or(e))
    }
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The conversation a call sends: an optional system prompt, one user turn.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub system: Option<Arc<str>>,
    pub user: Arc<str>,
}

impl Default for Prompt {
    /// The one-word question most scenarios send.
    fn default() -> Self {
        Prompt {
            system: None,
            user: "benchmark".into(),
        }
    }
}

impl Prompt {
    /// `(role, content)` in order.
    fn turns(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let system = self.system.as_deref().map(|s| ("system", s));
        system.into_iter().chain([("user", &*self.user)])
    }

    pub(crate) fn proto(&self) -> Vec<proto::Message> {
        self.turns()
            .map(|(role, content)| proto::Message {
                role: role.into(),
                content: content.into(),
                ..Default::default()
            })
            .collect()
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        self.turns()
            .map(|(role, content)| serde_json::json!({"role": role, "content": content}))
            .collect()
    }
}

/// What to ask for.
#[derive(Debug, Clone)]
pub struct Call {
    pub route: Arc<str>,
    pub prompt: Prompt,
    pub stream: bool,
    pub max_tokens: u32,
    pub timeout: Duration,
    /// Each call carries a fresh idempotency key (a claim and a stored answer per call).
    pub keyed: bool,
}

impl Call {
    pub fn new(route: &str, stream: bool, timeout: Duration) -> Call {
        Call {
            route: route.into(),
            prompt: Prompt::default(),
            stream,
            max_tokens: 1000,
            timeout,
            keyed: false,
        }
    }

    /// Every call with its own idempotency key.
    pub fn keyed(mut self) -> Call {
        self.keyed = true;
        self
    }

    /// Sends `prompt` instead of the one-word default.
    pub fn prompt(mut self, prompt: Prompt) -> Call {
        self.prompt = prompt;
        self
    }
}

/// Idempotency keys unique to this bench process.
static NEXT_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// gRPC clients over `n` separate HTTP/2 connections to Switchyard.
#[derive(Clone)]
pub struct Grpc {
    clients: Arc<Vec<RouterClient<Channel>>>,
}

impl Grpc {
    pub async fn connect(addr: SocketAddr, n: usize) -> Result<Grpc, BenchError> {
        let mut clients = Vec::new();
        for _ in 0..n.max(1) {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .map_err(|e| BenchError::start("gRPC client", e))?
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .connect()
                .await
                .map_err(|e| BenchError::start("gRPC client", e))?;
            clients.push(RouterClient::new(ch));
        }
        Ok(Grpc {
            clients: Arc::new(clients),
        })
    }

    /// The client for request `i` (round robin over the connections).
    pub fn client(&self, i: u64) -> RouterClient<Channel> {
        let n = self.clients.len().max(1) as u64;
        self.clients[(i % n) as usize].clone()
    }
}

fn request(call: &Call) -> tonic::Request<proto::CompletionRequest> {
    let mut req = tonic::Request::new(proto::CompletionRequest {
        route: call.route.to_string(),
        messages: call.prompt.proto(),
        max_tokens: call.max_tokens,
        idempotency_key: if call.keyed {
            format!(
                "bench-{}-{}",
                std::process::id(),
                NEXT_KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            )
        } else {
            String::new()
        },
        ..Default::default()
    });
    req.set_timeout(call.timeout);
    req
}

fn status_error(status: &tonic::Status) -> (String, u32) {
    use tonic_types::StatusExt;
    let code = code_name(status.code());
    match status.get_error_details().error_info() {
        Some(info) => {
            let attempts = info
                .metadata
                .get("attempts")
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            (format!("{code} {}", info.reason), attempts)
        }
        None => (format!("{code} {}", status.message()), 0),
    }
}

/// `RESOURCE_EXHAUSTED` for `Code::ResourceExhausted`.
pub fn code_name(code: tonic::Code) -> String {
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// One Switchyard call, streamed or unary, timed from `t0`.
pub async fn grpc_call(client: RouterClient<Channel>, call: &Call, t0: Instant) -> Outcome {
    grpc_call_counting(client, call, t0, None).await
}

/// Like [`grpc_call`]; every delta received also bumps `tokens`.
pub async fn grpc_call_counting(
    mut client: RouterClient<Channel>,
    call: &Call,
    t0: Instant,
    tokens: Option<&AtomicU64>,
) -> Outcome {
    let limit = call.timeout + Duration::from_secs(1);
    match tokio::time::timeout(limit, grpc_inner(&mut client, call, t0, tokens, None)).await {
        Ok(o) => o,
        Err(_) => Outcome::failed(t0, 0, "timeout (client)".into()),
    }
}

/// The error of a stream the caller gave up on (see [`grpc_stream_or_abandon`]).
pub const ABANDONED: &str = "CANCELLED no first token in time (client)";

/// A streamed call (timed from `t0`) that the caller abandons, dropping the
/// stream as a client's own timeout does, when no token has arrived
/// `first_token_within` after it was sent; the outcome's error is then
/// [`ABANDONED`].
pub async fn grpc_stream_or_abandon(
    mut client: RouterClient<Channel>,
    call: &Call,
    t0: Instant,
    first_token_within: Duration,
) -> Outcome {
    let limit = call.timeout + Duration::from_secs(1);
    let abandon_at = Instant::now() + first_token_within;
    let inner = grpc_inner(&mut client, call, t0, None, Some(abandon_at));
    match tokio::time::timeout(limit, inner).await {
        Ok(o) => o,
        Err(_) => Outcome::failed(t0, 0, "timeout (client)".into()),
    }
}

async fn grpc_inner(
    client: &mut RouterClient<Channel>,
    call: &Call,
    t0: Instant,
    counter: Option<&AtomicU64>,
    abandon_at: Option<Instant>,
) -> Outcome {
    if !call.stream {
        return match client.complete(request(call)).await {
            Ok(resp) => {
                let c = resp.into_inner();
                let latency = ms(t0.elapsed());
                Outcome {
                    ok: true,
                    latency_ms: latency,
                    ttft_ms: Some(latency),
                    attempts: c.attempts,
                    tokens: c.text.split_whitespace().count() as u32,
                    answer: Some(Answer::from_switchyard(
                        c.tier,
                        c.usage.as_ref(),
                        c.cost_usd,
                        c.cache_similarity,
                    )),
                    ..Outcome::default()
                }
            }
            Err(s) => {
                let (e, attempts) = status_error(&s);
                Outcome::failed(t0, attempts, e)
            }
        };
    }
    let abandoned = || Outcome::failed(t0, 0, ABANDONED.into());
    let opened = client.stream_completion(request(call));
    let opened = match abandon_at {
        Some(at) => match tokio::time::timeout_at(at, opened).await {
            Ok(r) => r,
            Err(_) => return abandoned(),
        },
        None => opened.await,
    };
    let mut stream = match opened {
        Ok(resp) => resp.into_inner(),
        Err(s) => {
            let (e, attempts) = status_error(&s);
            return Outcome::failed(t0, attempts, e);
        }
    };
    let mut out = Outcome::default();
    // Bounded: a stream of at most `max_tokens` deltas plus a few events.
    for _ in 0..(call.max_tokens as usize + 64) * 4 {
        let next = stream.message();
        let next = match abandon_at.filter(|_| out.ttft_ms.is_none()) {
            // Dropping the stream cancels the call (RST_STREAM).
            Some(at) => match tokio::time::timeout_at(at, next).await {
                Ok(m) => m,
                Err(_) => return abandoned(),
            },
            None => next.await,
        };
        match next {
            Ok(Some(ev)) => match ev.event {
                Some(proto::completion_event::Event::Delta(d)) => {
                    if out.ttft_ms.is_none() && !d.text.is_empty() {
                        out.ttft_ms = Some(ms(t0.elapsed()));
                    }
                    out.tokens += 1;
                    if let Some(c) = counter {
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Some(proto::completion_event::Event::Reset(_)) => out.tokens = 0,
                Some(proto::completion_event::Event::Finished(f)) => {
                    out.ok = true;
                    out.attempts = f.attempts;
                    out.answer = Some(Answer {
                        hedged: f.hedged,
                        won_attempt: f.won_attempt,
                        ..Answer::from_switchyard(
                            f.tier,
                            f.usage.as_ref(),
                            f.cost_usd,
                            f.cache_similarity,
                        )
                    });
                }
                _ => {}
            },
            Ok(None) => break,
            Err(s) => {
                let (e, attempts) = status_error(&s);
                out.error = Some(e);
                out.attempts = attempts;
                out.ok = false;
                break;
            }
        }
    }
    if !out.ok && out.error.is_none() {
        out.error = Some("INTERNAL stream ended without Finished".into());
    }
    out.latency_ms = ms(t0.elapsed());
    out
}

/// A plain HTTP client like the one Switchyard uses upstream (HTTP/1.1 pool).
pub fn http_client() -> Result<reqwest::Client, BenchError> {
    reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(60))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| BenchError::start("HTTP client", e))
}

const CONTENT: &[u8] = b"\"content\":\"tok";

fn count(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).filter(|w| *w == needle).count()
}

/// What to ask a mock's OpenAI endpoint directly.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub model: &'a str,
    pub prompt: &'a Prompt,
    pub stream: bool,
    pub max_tokens: u32,
    /// A stream asks for the usage chunk (`stream_options.include_usage`),
    /// as Switchyard does upstream; a buffered answer always has usage.
    pub include_usage: bool,
}

/// One call to a mock's OpenAI endpoint (`base` is `http://ADDR/v1`), with
/// the one-word default prompt.
pub async fn openai_call(
    http: &reqwest::Client,
    base: &str,
    model: &str,
    stream: bool,
    max_tokens: u32,
    t0: Instant,
    timeout: Duration,
) -> Outcome {
    let prompt = Prompt::default();
    let ask = Ask {
        model,
        prompt: &prompt,
        stream,
        max_tokens,
        include_usage: false,
    };
    openai_ask(http, base, &ask, t0, timeout).await
}

/// One call to a mock's OpenAI endpoint as `ask` says.
pub async fn openai_ask(
    http: &reqwest::Client,
    base: &str,
    ask: &Ask<'_>,
    t0: Instant,
    timeout: Duration,
) -> Outcome {
    match tokio::time::timeout(timeout, openai_inner(http, base, ask, t0)).await {
        Ok(o) => o,
        Err(_) => Outcome::failed(t0, 1, "timeout (client)".into()),
    }
}

async fn openai_inner(http: &reqwest::Client, base: &str, ask: &Ask<'_>, t0: Instant) -> Outcome {
    let stream = ask.stream;
    let mut body = serde_json::json!({
        "model": ask.model,
        "messages": ask.prompt.json(),
        "stream": stream,
        "max_tokens": ask.max_tokens,
    });
    if stream && ask.include_usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    let resp = match http
        .post(format!("{base}/chat/completions"))
        .json(&body)
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return Outcome::failed(t0, 1, format!("transport: {e}")),
    };
    let status = resp.status();
    if !status.is_success() {
        let _ = resp.bytes().await;
        return Outcome::failed(t0, 1, format!("HTTP {}", status.as_u16()));
    }
    let mut resp = resp;
    let mut buf: Vec<u8> = Vec::new();
    let mut ttft = None;
    // Bounded by the body: the mock ends every response.
    for _ in 0..1_000_000 {
        match resp.chunk().await {
            Ok(Some(c)) => {
                let from = buf.len().saturating_sub(CONTENT.len());
                buf.extend_from_slice(&c);
                if stream && ttft.is_none() && count(&buf[from..], CONTENT) > 0 {
                    ttft = Some(ms(t0.elapsed()));
                }
            }
            Ok(None) => break,
            Err(e) => return Outcome::failed(t0, 1, format!("transport: body: {e}")),
        }
    }
    let latency = ms(t0.elapsed());
    let (ok, tokens, usage) = if stream {
        let usage = ask.include_usage.then(|| stream_usage(&buf)).flatten();
        (
            count(&buf, b"[DONE]") > 0,
            count(&buf, CONTENT) as u32,
            usage,
        )
    } else {
        let v = serde_json::from_slice::<serde_json::Value>(&buf).unwrap_or_default();
        match v["choices"][0]["message"]["content"].as_str() {
            Some(t) => (true, t.split_whitespace().count() as u32, usage_of(&v)),
            None => (false, 0, None),
        }
    };
    Outcome {
        ok,
        latency_ms: latency,
        ttft_ms: if stream { ttft } else { Some(latency) },
        attempts: 1,
        tokens,
        error: if ok {
            None
        } else {
            Some("INTERNAL malformed answer".into())
        },
        answer: ok.then(|| Answer {
            usage,
            ..Answer::default()
        }),
        ..Outcome::default()
    }
}

/// `(prompt_tokens, completion_tokens)` of an OpenAI body or chunk.
fn usage_of(v: &serde_json::Value) -> Option<(u32, u32)> {
    let n = |k: &str| v["usage"][k].as_u64().and_then(|n| u32::try_from(n).ok());
    Some((n("prompt_tokens")?, n("completion_tokens")?))
}

/// The usage of an OpenAI stream: its last `data:` chunk that has one.
fn stream_usage(body: &[u8]) -> Option<(u32, u32)> {
    body.split(|b| *b == b'\n')
        .rev()
        .filter_map(|line| line.strip_prefix(b"data: "))
        .filter(|data| count(data, b"\"usage\"") > 0)
        .find_map(|data| usage_of(&serde_json::from_slice(data).ok()?))
}

/// Baseline A: one provider, retried at once on any failure, up to `max_attempts`.
pub async fn retry_loop(
    http: &reqwest::Client,
    base: &str,
    stream: bool,
    max_attempts: u32,
    t0: Instant,
    timeout: Duration,
) -> Outcome {
    let mut last = Outcome::failed(t0, 0, "no attempt".into());
    for a in 1..=max_attempts.max(1) {
        let o = openai_call(http, base, "m", stream, 1000, t0, timeout).await;
        last = Outcome { attempts: a, ..o };
        if last.ok {
            break;
        }
    }
    last
}

/// Baseline B: primary, then secondary, streamed (with usage) or buffered;
/// `attempts` says which of `bases` answered (1-based).
pub async fn static_failover(
    http: &reqwest::Client,
    bases: &[String],
    prompt: &Prompt,
    stream: bool,
    t0: Instant,
    timeout: Duration,
) -> Outcome {
    let ask = Ask {
        model: "m",
        prompt,
        stream,
        max_tokens: 1000,
        include_usage: stream,
    };
    let mut last = Outcome::failed(t0, 0, "no attempt".into());
    for (i, base) in bases.iter().enumerate() {
        let o = openai_ask(http, base, &ask, t0, timeout).await;
        last = Outcome {
            attempts: i as u32 + 1,
            ..o
        };
        if last.ok {
            break;
        }
    }
    last
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bench_counts_openai_content_chunks() {
        let body = b"data: {\"choices\":[{\"delta\":{\"content\":\"tok0 \"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"tok1 \"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(count(body, CONTENT), 2);
        assert_eq!(count(body, b"[DONE]"), 1);
    }

    #[test]
    fn bench_reads_openai_usage_from_bodies_and_streams() {
        let body = serde_json::json!({"usage": {"prompt_tokens": 12, "completion_tokens": 3}});
        assert_eq!(usage_of(&body), Some((12, 3)));
        assert_eq!(usage_of(&serde_json::json!({"usage": null})), None);
        let stream =
            b"data: {\"choices\":[{\"delta\":{\"content\":\"tok0 \"}}],\"usage\":null}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":1}}\n\n\
            data: [DONE]\n\n";
        assert_eq!(stream_usage(stream), Some((40, 1)));
        assert_eq!(stream_usage(b"data: [DONE]\n\n"), None);
    }

    #[test]
    fn bench_prompts_keep_the_system_turn_first() {
        let p = Prompt {
            system: Some("be brief".into()),
            user: "hi".into(),
        };
        assert_eq!(
            p.json(),
            serde_json::json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}])
        );
        assert_eq!(p.proto()[1].content, "hi");
        assert_eq!(Prompt::default().proto().len(), 1);
    }

    #[test]
    fn bench_error_kind_is_the_first_word() {
        let o = Outcome {
            error: Some("UNAVAILABLE UPSTREAM_SERVER_ERROR".into()),
            ..Outcome::default()
        };
        assert_eq!(o.error_kind(), Some("UNAVAILABLE"));
        assert_eq!(
            code_name(tonic::Code::ResourceExhausted),
            "RESOURCE_EXHAUSTED"
        );
    }
}
