//! The callers a benchmark compares: Switchyard over gRPC (a few HTTP/2
//! channels), the mock's OpenAI endpoint called straight with reqwest, and
//! the naive baselines (an immediate-retry loop, a static primary/secondary
//! client with buffered answers). Each call yields one [`Outcome`], with its
//! latency measured from the *scheduled* start so queueing counts.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::BenchError;
use crate::proto;
use crate::proto::router_client::RouterClient;

/// How one caller request ended.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcome {
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

/// What to ask for.
#[derive(Debug, Clone)]
pub struct Call {
    pub route: Arc<str>,
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
        messages: vec![proto::Message {
            role: "user".into(),
            content: "benchmark".into(),
            ..Default::default()
        }],
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
    match tokio::time::timeout(limit, grpc_inner(&mut client, call, t0, tokens)).await {
        Ok(o) => o,
        Err(_) => Outcome::failed(t0, 0, "timeout (client)".into()),
    }
}

async fn grpc_inner(
    client: &mut RouterClient<Channel>,
    call: &Call,
    t0: Instant,
    counter: Option<&AtomicU64>,
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
                    ..Outcome::default()
                }
            }
            Err(s) => {
                let (e, attempts) = status_error(&s);
                Outcome::failed(t0, attempts, e)
            }
        };
    }
    let mut stream = match client.stream_completion(request(call)).await {
        Ok(resp) => resp.into_inner(),
        Err(s) => {
            let (e, attempts) = status_error(&s);
            return Outcome::failed(t0, attempts, e);
        }
    };
    let mut out = Outcome::default();
    // Bounded: a stream of at most `max_tokens` deltas plus a few events.
    for _ in 0..(call.max_tokens as usize + 64) * 4 {
        match stream.message().await {
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

/// One call to a mock's OpenAI endpoint (`base` is `http://ADDR/v1`).
pub async fn openai_call(
    http: &reqwest::Client,
    base: &str,
    model: &str,
    stream: bool,
    max_tokens: u32,
    t0: Instant,
    timeout: Duration,
) -> Outcome {
    match tokio::time::timeout(
        timeout,
        openai_inner(http, base, model, stream, max_tokens, t0),
    )
    .await
    {
        Ok(o) => o,
        Err(_) => Outcome::failed(t0, 1, "timeout (client)".into()),
    }
}

async fn openai_inner(
    http: &reqwest::Client,
    base: &str,
    model: &str,
    stream: bool,
    max_tokens: u32,
    t0: Instant,
) -> Outcome {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "benchmark"}],
        "stream": stream,
        "max_tokens": max_tokens,
    });
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
    let (ok, tokens) = if stream {
        (count(&buf, b"[DONE]") > 0, count(&buf, CONTENT) as u32)
    } else {
        let text = serde_json::from_slice::<serde_json::Value>(&buf)
            .ok()
            .and_then(|v| {
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .map(String::from)
            });
        match text {
            Some(t) => (true, t.split_whitespace().count() as u32),
            None => (false, 0),
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
        ..Outcome::default()
    }
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

/// Baseline B: primary, then secondary, each a buffered (non-streamed) call.
pub async fn static_failover(
    http: &reqwest::Client,
    bases: &[String],
    t0: Instant,
    timeout: Duration,
) -> Outcome {
    let mut last = Outcome::failed(t0, 0, "no attempt".into());
    for (i, base) in bases.iter().enumerate() {
        let o = openai_call(http, base, "m", false, 1000, t0, timeout).await;
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
