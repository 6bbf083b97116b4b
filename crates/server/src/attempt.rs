//! One upstream attempt: send the request with the permit it was given, read
//! the body under first-token, idle and overall deadlines, decode it with the
//! provider kind's [`Wire`] (chosen once; no per-kind branch here), pipe
//! chunks into the sink as they arrive, and return exactly one classified end. It decides nothing and reports to no actor.
//! Every byte it holds is bounded: the SSE line and event, the error and
//! whole bodies, and the output forwarded (a stream that ignores `max_tokens`
//! is cut as a protocol error, not passed on).

use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use http_body_util::BodyExt;
use tokio::time::{timeout_at, Instant};

use crate::chat::{Chunk, FinishReason};
use crate::policy::outcome::{Failure, OutcomeClass};
use crate::policy::rate_window::Reported;
use crate::sink::{ClientGone, EventSink};
use crate::spares::{Lent, Spares};
use crate::upstream::client::{json_body, read_capped, Error, Response};
use crate::upstream::endpoint::{Endpoint, Secret};
use crate::upstream::keys::Lease;
use crate::upstream::pool::StreamSlot;
use crate::upstream::sse::SseEvent;
use crate::upstream::wire::{Body, Call, Refused, Wire};
use crate::upstream::{classify, ratelimit, ChatRequest, Completion, Dropped};

/// Largest error body read from an upstream (the rest is ignored).
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Largest non-streamed response body accepted.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// Most output one attempt may forward, whatever `max_tokens` says.
pub const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;
/// Non-empty deltas past `max_tokens` tolerated before a stream is cut: a
/// tool call's opening and closing fragments may come on their own.
const DELTA_SLACK: u32 = 8;
/// Bytes a token may take before a stream counts as past its `max_tokens`
/// (no tokenizer's tokens come near it; only a runaway stream does).
const MAX_BYTES_PER_TOKEN: usize = 64;

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptEnd {
    /// The stream passed its completion predicate.
    Completed(Completion),
    /// The upstream failed, classified.
    Failed(Failure),
    /// The caller went away; the upstream request was dropped.
    ClientGone,
    /// The caller's deadline passed; the upstream request was dropped.
    DeadlineExceeded,
}

impl AttemptEnd {
    /// The class reported to the provider actor.
    pub fn class(&self) -> OutcomeClass {
        match self {
            AttemptEnd::Completed(c) => match c.finish_reason {
                FinishReason::Refusal | FinishReason::ContentFilter => OutcomeClass::Refusal,
                _ => OutcomeClass::Ok,
            },
            AttemptEnd::Failed(f) => f.class,
            AttemptEnd::ClientGone | AttemptEnd::DeadlineExceeded => OutcomeClass::Cancelled,
        }
    }
}

/// The end plus what was measured on the way.
#[derive(Debug, Clone)]
pub struct AttemptResult {
    pub end: AttemptEnd,
    /// Key-local answers on the way (several keys): key name and event.
    pub key_events: Vec<(String, &'static str)>,
    /// Time to the first forwarded chunk.
    pub ttft: Option<Duration>,
    pub elapsed: Duration,
    pub upstream_request_id: Option<String>,
    /// The key (of a provider with several) the upstream answered with.
    pub key: Option<String>,
    /// What each answering key's rate-limit headers reported (reset times
    /// relative to the answer), by key name, and when the answer came.
    pub reported: Vec<(String, Reported, Instant)>,
}

/// Rate-window admission of a key the attempt moves to after a key-local
/// refusal (the task holds the store; the first key was admitted before).
pub trait KeyAdmit: Sync {
    /// Holds one request on key `name`, or the wait until its window resets.
    fn admit<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<(), Duration>>;
}

/// Everything one attempt needs.
pub struct AttemptInput<'a> {
    pub endpoint: &'a Endpoint,
    /// With `model` set to the target's model.
    pub chat: &'a ChatRequest,
    /// The caller's deadline.
    pub deadline: Instant,
    /// 1-based attempt number, sent upstream as `x-switchyard-attempt`.
    pub attempt: u32,
    /// Send with this key of a provider with several while it is usable
    /// (prompt-cache affinity, or the key admission held a window on).
    pub key: Option<&'a str>,
    /// Keys are rate-window bounded: any key but `key` is admitted here first.
    pub admit: Option<&'a dyn KeyAdmit>,
}

/// Where an attempt's output goes: the caller's sink, or one lane of a
/// hedged request (`Lane`), read by the task that picks the winner.
pub trait Out: Send {
    /// Resolves when nobody will read the output any more.
    fn closed(&self) -> impl std::future::Future<Output = ()> + Send;
    /// Passes one chunk on.
    fn chunk(
        &mut self,
        chunk: crate::chat::Chunk,
    ) -> impl std::future::Future<Output = Result<(), ClientGone>> + Send;
    /// What the attempt's wire left out of the request.
    fn set_dropped(&mut self, dropped: Vec<String>);
    /// The chunks until [`Out::release`] were ready together (one network
    /// read): they may be stored as one batch before they go out.
    fn hold(&mut self) {}
    /// Sends what [`Out::hold`] kept.
    fn release(&mut self) -> impl std::future::Future<Output = Result<(), ClientGone>> + Send {
        std::future::ready(Ok(()))
    }
}

impl Out for EventSink {
    fn closed(&self) -> impl std::future::Future<Output = ()> + Send {
        EventSink::closed(self)
    }
    fn chunk(
        &mut self,
        chunk: crate::chat::Chunk,
    ) -> impl std::future::Future<Output = Result<(), ClientGone>> + Send {
        EventSink::chunk(self, chunk)
    }
    fn set_dropped(&mut self, dropped: Vec<String>) {
        EventSink::set_dropped(self, dropped);
    }
    fn hold(&mut self) {
        EventSink::hold(self);
    }
    fn release(&mut self) -> impl std::future::Future<Output = Result<(), ClientGone>> + Send {
        EventSink::release(self)
    }
}

/// What a hedged attempt's lane carries.
#[derive(Debug)]
pub enum LaneItem {
    Dropped(Vec<String>),
    Chunk(crate::chat::Chunk),
}

/// One hedged attempt's output, buffered in a bounded channel until the
/// task knows whether this attempt answers; dropping the receiver ends it.
pub struct Lane(pub tokio::sync::mpsc::Sender<LaneItem>);

impl Out for Lane {
    fn closed(&self) -> impl std::future::Future<Output = ()> + Send {
        self.0.closed()
    }
    async fn chunk(&mut self, chunk: crate::chat::Chunk) -> Result<(), ClientGone> {
        self.0
            .send(LaneItem::Chunk(chunk))
            .await
            .map_err(|_| ClientGone)
    }
    fn set_dropped(&mut self, dropped: Vec<String>) {
        // Sent before any chunk: the lane has room.
        let _ = self.0.try_send(LaneItem::Dropped(dropped));
    }
}

/// Runs one attempt into its own lane (a hedged request).
pub async fn run_in_lane(input: AttemptInput<'_>, mut lane: Lane) -> AttemptResult {
    run(input, &mut lane).await
}

/// Which timer fired.
enum Expired {
    Deadline,
    Timeout(&'static str),
}

fn expired(limit: Instant, deadline: Instant, what: &'static str) -> Expired {
    if limit >= deadline {
        Expired::Deadline
    } else {
        Expired::Timeout(what)
    }
}

/// Runs one attempt to its end.
// Not an `async fn`, on purpose: one keeps its by-value argument twice in
// its future, and this future is part of every streaming request.
#[allow(clippy::manual_async_fn)]
pub fn run<'a, O: Out>(
    input: AttemptInput<'a>,
    sink: &'a mut O,
) -> impl std::future::Future<Output = AttemptResult> + 'a {
    async move {
        let started = Instant::now();
        let max_tokens = input.chat.max_tokens;
        let mut meta = Meta {
            reported: Vec::new(),
            key_events: Vec::new(),
            started,
            ttft: None,
            upstream_request_id: None,
            key: None,
            output: Output {
                chunks: 0,
                bytes: 0,
                max_chunks: max_tokens,
                max_bytes: max_tokens
                    .map_or(MAX_ANSWER_BYTES, |t| t as usize * MAX_BYTES_PER_TOKEN)
                    .clamp(4096, MAX_ANSWER_BYTES),
            },
        };
        let end = run_inner(&input, sink, &mut meta).await;
        AttemptResult {
            end,
            key_events: meta.key_events,
            ttft: meta.ttft,
            elapsed: started.elapsed(),
            upstream_request_id: meta.upstream_request_id,
            key: meta.key,
            reported: meta.reported,
        }
    }
}

struct Meta {
    reported: Vec<(String, Reported, Instant)>,
    key_events: Vec<(String, &'static str)>,
    /// The key the upstream accepted the call with.
    key: Option<String>,
    started: Instant,
    ttft: Option<Duration>,
    upstream_request_id: Option<String>,
    output: Output,
}

/// What the attempt forwarded, against its bounds.
struct Output {
    chunks: u32,
    bytes: usize,
    /// `max_tokens` as sent: every non-empty delta carries at least one
    /// token (less a few structural fragments, `DELTA_SLACK`).
    max_chunks: Option<u32>,
    max_bytes: usize,
}

impl Output {
    /// Counts `chunk`; `Err` when forwarding it would pass a bound.
    fn admit(&mut self, chunk: &crate::chat::Chunk) -> Result<(), Failure> {
        let bytes = chunk.output_bytes();
        if bytes > 0 {
            self.chunks += 1;
        }
        self.bytes += bytes;
        if let Some(max) = self
            .max_chunks
            .filter(|max| self.chunks > max + DELTA_SLACK)
        {
            return Err(Failure::new(
                OutcomeClass::Protocol,
                format!(
                    "the upstream sent more than max_tokens ({max}) deltas; the stream was cut"
                ),
            ));
        }
        if self.bytes > self.max_bytes {
            return Err(Failure::new(
                OutcomeClass::Protocol,
                format!(
                    "the upstream sent more than {} bytes of output for max_tokens {:?}; the stream was cut",
                    self.max_bytes, self.max_chunks
                ),
            ));
        }
        Ok(())
    }
}

/// Why forwarding stopped.
enum Forward {
    ClientGone,
    /// The output passed its bound; nothing more is forwarded.
    Cut(Failure),
}

async fn run_inner(input: &AttemptInput<'_>, sink: &mut impl Out, meta: &mut Meta) -> AttemptEnd {
    let rt = input.endpoint;
    let wire = rt.kind.wire();
    let first_limit = (meta.started + rt.first_token_timeout).min(input.deadline);
    let bearer = match google_token(rt, sink, meta, first_limit).await {
        Ok(bearer) => bearer,
        Err(end) => return end,
    };
    // The key's lease and the request's place on its connection live as
    // long as the stream.
    let (response, _lease, _slot) =
        match send(input, wire, bearer.as_ref(), sink, meta, first_limit).await {
            Ok(sent) => sent,
            Err(end) => return end,
        };
    // Anthropic and Gemini are always streamed (Anthropic's SDKs refuse long
    // non-streamed calls); the non-streaming path is OpenAI's.
    let end = if input.chat.stream || wire.quirks().always_streamed {
        stream_body(input, wire, response, sink, meta, first_limit).await
    } else {
        whole_body(input, wire, response, sink, meta, first_limit).await
    };
    match end {
        AttemptEnd::Failed(f) => AttemptEnd::Failed(passed_on(f, rt, meta)),
        other => other,
    }
}

/// A Google service account's cached OAuth token (fetched once for all
/// requests); `None` for every other way of signing in.
async fn google_token(
    rt: &Endpoint,
    sink: &mut impl Out,
    meta: &Meta,
    first_limit: Instant,
) -> Result<Option<Secret>, AttemptEnd> {
    let Some(auth) = &rt.vertex else {
        return Ok(None);
    };
    let slot = rt.http.take();
    let token = tokio::select! {
        _ = sink.closed() => return Err(AttemptEnd::ClientGone),
        t = auth.token(slot.client(), first_limit) => t,
    };
    drop(slot);
    match token {
        Ok(t) => Ok(Some(t)),
        Err(f) => Err(AttemptEnd::Failed(passed_on(f, rt, meta))),
    }
}

/// Sends until an upstream answers 2xx: with several keys, a key-local
/// refusal moves the call to another key. `Err` is how the attempt ended.
async fn send<'a>(
    input: &AttemptInput<'a>,
    wire: &dyn Wire,
    bearer: Option<&Secret>,
    sink: &mut impl Out,
    meta: &mut Meta,
    first_limit: Instant,
) -> Result<(Response, Option<Lease>, StreamSlot<'a>), AttemptEnd> {
    let rt = input.endpoint;
    let mut tried = Vec::new();
    // The soonest reset of a key whose window had no room.
    let mut full: Option<Duration> = None;
    loop {
        let lease = match &rt.keys {
            None => None,
            Some(pool) => match pool.pick_preferring(Instant::now(), &tried, input.key) {
                Ok(lease) => Some(lease),
                Err(_) if full.is_some() => {
                    let mut f = Failure::new(
                        OutcomeClass::RateLimited,
                        "every other key of this provider is cooling or has no room in its rate windows",
                    );
                    f.retry_after = full;
                    return Err(AttemptEnd::Failed(passed_on(f, rt, meta)));
                }
                Err(f) => return Err(AttemptEnd::Failed(passed_on(f, rt, meta))),
            },
        };
        let (key, name) = match (&lease, &rt.keys) {
            (Some(l), Some(pool)) => (
                Some(&pool.keys[l.index].secret),
                pool.keys[l.index].name.as_str(),
            ),
            _ => (rt.api_key.as_ref(), crate::upstream::endpoint::SINGLE_KEY),
        };
        if let (Some(l), Some(admit)) = (&lease, input.admit) {
            if input.key != Some(name) {
                if let Err(wait) = admit.admit(name).await {
                    full = Some(full.map_or(wait, |f| f.min(wait)));
                    tried.push(l.index);
                    continue;
                }
            }
        }
        let (response, slot) = send_once(input, wire, bearer, key, sink, first_limit).await?;
        let reported = ratelimit::reported(response.headers(), 0, std::time::SystemTime::now());
        if !reported.is_empty() {
            meta.reported
                .push((name.to_string(), reported, Instant::now()));
        }
        meta.upstream_request_id = request_id(response.headers()).map(|id| rt.upstream_id(id));
        if response.status().is_success() {
            if let (Some(l), Some(pool)) = (&lease, &rt.keys) {
                meta.key = Some(pool.keys[l.index].name.clone());
            }
            return Ok((response, lease, slot));
        }
        let failure = match failed_response(wire, response, sink, first_limit).await {
            Ok(end) => return Err(end),
            Err(f) => f,
        };
        if let (Some(l), Some(pool)) = (&lease, &rt.keys) {
            if let Some(event) =
                pool.note(l.index, failure.class, failure.retry_after, Instant::now())
            {
                let name = pool.keys[l.index].name.clone();
                tracing::warn!(provider = %rt.id, key = %name, ?event, "key-local refusal: the next key serves");
                meta.key_events.push((name, event.as_str()));
                tried.push(l.index);
                continue;
            }
        }
        return Err(AttemptEnd::Failed(passed_on(failure, rt, meta)));
    }
}

/// One request with one key, up to its response headers.
/// The request's place on its connection comes back with the answer.
async fn send_once<'a>(
    input: &AttemptInput<'a>,
    wire: &dyn Wire,
    bearer: Option<&Secret>,
    key: Option<&Secret>,
    sink: &mut impl Out,
    first_limit: Instant,
) -> Result<(Response, StreamSlot<'a>), AttemptEnd> {
    let mut dropped = Dropped::default();
    let request =
        build_request(input, wire, bearer, key, &mut dropped).map_err(AttemptEnd::Failed)?;
    if !dropped.is_empty() {
        sink.set_dropped(dropped.into_names());
    }
    let slot = input.endpoint.http.take();
    let sending = slot
        .client()
        .send(request.url, request.headers, request.body);
    let response = tokio::select! {
        _ = sink.closed() => return Err(AttemptEnd::ClientGone),
        r = timeout_at(first_limit, sending) => r,
    };
    match response {
        Err(_) => Err(timed_out(expired(
            first_limit,
            input.deadline,
            "no response headers before the first-token timeout",
        ))),
        Ok(Err(e)) => Err(AttemptEnd::Failed(classify::classify_transport(&e))),
        Ok(Ok(r)) => Ok((r, slot)),
    }
}

/// A small count as a header value (`x-switchyard-attempt`,
/// `x-switchyard-attempts`): a static string for 0-9 (allocating none), the
/// number written out after.
pub(crate) fn attempt_number(attempt: u32) -> http::HeaderValue {
    const DIGITS: [&str; 10] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"];
    match DIGITS.get(attempt as usize) {
        Some(digit) => http::HeaderValue::from_static(digit),
        None => http::HeaderValue::from(attempt),
    }
}

/// A non-2xx answer: its classified failure, or how the attempt ended
/// anyway (the caller left; the wire read an answer, e.g. Azure's content
/// filter).
async fn failed_response(
    wire: &dyn Wire,
    response: Response,
    sink: &mut impl Out,
    first_limit: Instant,
) -> Result<AttemptEnd, Failure> {
    let status = response.status();
    let headers = response.headers().clone();
    let body = tokio::select! {
        _ = sink.closed() => return Ok(AttemptEnd::ClientGone),
        b = timeout_at(first_limit, read_capped(response, MAX_ERROR_BODY)) => b.unwrap_or_default(),
    };
    match wire.refused(status.as_u16(), &headers, &body) {
        Refused::Answered(completion) => Ok(AttemptEnd::Completed(completion)),
        Refused::Failed(failure) => Err(failure),
    }
}

/// A failure as it may travel on: the request id filled in, the endpoint's
/// key redacted from anything the upstream wrote, its wait capped.
fn passed_on(mut f: Failure, rt: &Endpoint, meta: &Meta) -> Failure {
    f.upstream_request_id = f
        .upstream_request_id
        .map(|id| rt.upstream_id(&id))
        .or_else(|| meta.upstream_request_id.clone());
    f.message = rt.redact(&f.message);
    f.retry_after = f.retry_after.map(|d| d.min(rt.max_retry_after));
    f
}

fn timed_out(e: Expired) -> AttemptEnd {
    match e {
        Expired::Deadline => AttemptEnd::DeadlineExceeded,
        Expired::Timeout(what) => AttemptEnd::Failed(Failure::new(OutcomeClass::Timeout, what)),
    }
}

/// The attempt's HTTP request, and what its wire left out of the caller's.
fn build_request(
    input: &AttemptInput<'_>,
    wire: &dyn Wire,
    bearer: Option<&Secret>,
    key: Option<&Secret>,
    dropped: &mut Dropped,
) -> Result<Outgoing, Failure> {
    let rt = input.endpoint;
    dropped.door(input.chat);
    let call = Call {
        chat: input.chat,
        endpoint: rt,
        key: key.map(Secret::expose),
        bearer: bearer.map(Secret::expose),
        now: std::time::SystemTime::now(),
    };
    let request = wire.request(&call, dropped)?;
    let mut headers = request.headers;
    headers.insert(
        http::HeaderName::from_static("x-switchyard-attempt"),
        attempt_number(input.attempt),
    );
    let body = match request.body {
        Body::Json(body) => json_body(&mut headers, &body),
        Body::Bytes(body) => body,
    };
    Ok(Outgoing {
        url: request.url,
        headers,
        body,
    })
}

/// An attempt's request as it goes out.
struct Outgoing {
    url: crate::upstream::wire::Url,
    headers: http::HeaderMap,
    body: bytes::Bytes,
}

fn request_id(headers: &http::HeaderMap) -> Option<&str> {
    ["x-request-id", "request-id"]
        .iter()
        .find_map(|h| headers.get(*h)?.to_str().ok())
}

async fn stream_body(
    input: &AttemptInput<'_>,
    wire: &dyn Wire,
    response: Response,
    sink: &mut impl Out,
    meta: &mut Meta,
    first_limit: Instant,
) -> AttemptEnd {
    let rt = input.endpoint;
    let mut body = response.into_body().into_data_stream();
    let mut parser = wire.framer();
    let mut decoder = wire.decoder();
    let mut events = Lent::from(&EVENTS);
    let mut chunks = Lent::from(&CHUNKS);
    let mut last_activity = Instant::now();
    // One timer for the whole stream, moved as the limit moves.
    let timer = tokio::time::sleep_until(first_limit);
    tokio::pin!(timer);
    loop {
        let limit = if meta.ttft.is_none() {
            first_limit
        } else {
            (last_activity + rt.idle_timeout).min(input.deadline)
        };
        if timer.deadline() != limit {
            timer.as_mut().reset(limit);
        }
        let what = if meta.ttft.is_none() {
            "no token before the first-token timeout"
        } else {
            "stream went idle past the idle timeout"
        };
        // Bytes that are already there win over the timer, as they did
        // inside `timeout_at`.
        let first = tokio::select! {
            biased;
            n = body.next() => n,
            _ = &mut timer => return timed_out(expired(limit, input.deadline, what)),
            _ = sink.closed() => return AttemptEnd::ClientGone,
        };
        // The events of this read, and of every read already waiting behind
        // it, go out together (a journaled stream stores them in one write),
        // also when one of them ends the attempt.
        sink.hold();
        let mut next = Some(first);
        let mut reads = 0;
        let mut ended = None;
        while let Some(read) = next.take() {
            match read_step(
                read,
                &mut parser,
                &mut decoder,
                &mut events,
                &mut chunks,
                sink,
                meta,
            )
            .await
            {
                Step::More { active } => {
                    if active {
                        last_activity = Instant::now();
                    }
                }
                Step::End(end) => {
                    ended = Some(end);
                    break;
                }
            }
            reads += 1;
            if reads < MAX_READS_PER_BATCH {
                next = body.next().now_or_never();
            }
        }
        if sink.release().await.is_err() {
            return AttemptEnd::ClientGone;
        }
        if let Some(end) = ended {
            return end;
        }
    }
}

/// Reads already waiting that join one batch at most (its events go out,
/// and are journaled, together).
const MAX_READS_PER_BATCH: usize = 16;

thread_local! {
    /// A stream's lists for one read's events and their decoded chunks,
    /// lent for the stream by the thread it starts on (`spares`).
    static EVENTS: Spares<Vec<SseEvent>> = const { Spares::new(8, 64) };
    static CHUNKS: Spares<Vec<Chunk>> = const { Spares::new(8, 64) };
}

/// What one read of an upstream stream left to do.
enum Step {
    /// Read on (`active`: it completed an event).
    More {
        active: bool,
    },
    End(AttemptEnd),
}

/// Parses one read (`None`: the body ended) and forwards its events; a line
/// or event past its bound ends the stream, after the events completed
/// before it are decoded and forwarded (as they would have been had the
/// bytes arrived in smaller pieces).
async fn read_step(
    read: Option<Result<bytes::Bytes, crate::upstream::client::BodyError>>,
    parser: &mut Box<dyn crate::upstream::wire::Framer>,
    decoder: &mut Box<dyn crate::upstream::StreamDecoder>,
    events: &mut Vec<crate::upstream::sse::SseEvent>,
    chunks: &mut Vec<crate::chat::Chunk>,
    sink: &mut impl Out,
    meta: &mut Meta,
) -> Step {
    let (eof, too_large) = match read {
        Some(Err(e)) => {
            let mut f = classify::classify_transport(&Error::from(e));
            if f.class == OutcomeClass::Connect || f.class == OutcomeClass::Timeout {
                f.class = OutcomeClass::Truncated;
            }
            return Step::End(AttemptEnd::Failed(f));
        }
        Some(Ok(bytes)) => (false, parser.feed(&bytes, events).err()),
        None => (true, parser.finish(events).err()),
    };
    // Idle is measured in events, not bytes: one byte a second must not
    // keep a dead stream alive.
    let active = !events.is_empty();
    // Decoded up to the first bad event, then forwarded in one go: nothing
    // decoded is held across the wait for the caller.
    let mut bad = None;
    for event in events.drain(..) {
        if bad.is_none() {
            bad = decoder.on_event(&event, chunks).err().map(Box::new);
        }
        parser.recycle(event);
    }
    // Forward what the frames carried, even before failing.
    match forward(chunks, sink, meta).await {
        Ok(()) => {}
        Err(Forward::ClientGone) => return Step::End(AttemptEnd::ClientGone),
        Err(Forward::Cut(f)) => return Step::End(AttemptEnd::Failed(f)),
    }
    if let Some(f) = bad {
        return Step::End(AttemptEnd::Failed(*f));
    }
    if let Some(f) = too_large {
        return Step::End(AttemptEnd::Failed(f));
    }
    if eof {
        return Step::End(match decoder.finish() {
            Ok(c) => AttemptEnd::Completed(c),
            Err(f) => AttemptEnd::Failed(f),
        });
    }
    Step::More { active }
}

async fn forward(
    chunks: &mut Vec<crate::chat::Chunk>,
    sink: &mut impl Out,
    meta: &mut Meta,
) -> Result<(), Forward> {
    for chunk in chunks.drain(..) {
        meta.output.admit(&chunk).map_err(Forward::Cut)?;
        if meta.ttft.is_none() {
            meta.ttft = Some(meta.started.elapsed());
        }
        sink.chunk(chunk).await.map_err(|_| Forward::ClientGone)?;
    }
    Ok(())
}

async fn whole_body(
    input: &AttemptInput<'_>,
    wire: &dyn Wire,
    response: Response,
    sink: &mut impl Out,
    meta: &mut Meta,
    first_limit: Instant,
) -> AttemptEnd {
    let body = tokio::select! {
        _ = sink.closed() => return AttemptEnd::ClientGone,
        b = timeout_at(first_limit, read_capped(response, MAX_BODY)) => b,
    };
    let Ok(body) = body else {
        return timed_out(expired(
            first_limit,
            input.deadline,
            "no complete response before the first-token timeout",
        ));
    };
    match wire.decode_whole(&body) {
        Ok((mut chunks, completion)) => match forward(&mut chunks, sink, meta).await {
            Ok(()) => AttemptEnd::Completed(completion),
            Err(Forward::ClientGone) => AttemptEnd::ClientGone,
            Err(Forward::Cut(f)) => AttemptEnd::Failed(f),
        },
        Err(f) => AttemptEnd::Failed(f),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    #[test]
    fn the_attempt_header_writes_every_number() {
        for n in [0, 1, 2, 9, 10, 11, 99, u32::MAX] {
            assert_eq!(super::attempt_number(n).to_str().unwrap(), n.to_string());
        }
    }
}
