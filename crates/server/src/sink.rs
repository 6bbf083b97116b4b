//! The event sink: the request task's end of the bounded channel to the
//! caller. It holds back `Started` until the first chunk of an attempt (so a
//! failure before it stays invisible and can fail over), knows whether output
//! was committed, notices when the caller went away, and gives up on a caller
//! that stops reading (the request's deadline and `server.send_timeout` bound
//! every send), so a slow consumer never holds a provider permit. It numbers
//! every item it sends (`seq`, from 1) and, for a journaled stream, writes
//! each one to its [`Tee`] first, so a caller can resume the stream from any
//! item it holds. `Events` is the door's end: it never ends without a
//! terminal item, and tells each item's number.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::chat::{Chunk, FinishReason, Usage};
use crate::error::RequestError;
use crate::policy::continuation::Seam;
use crate::spares::{self, Spares};

/// Which rung of the degradation ladder served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Tier {
    Primary,
    Fallback,
    Downshift,
    Cache,
    /// A stored answer to a near-identical question (the semantic cache).
    SemanticCache,
    Queued,
    Refused,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Primary => "primary",
            Tier::Fallback => "fallback",
            Tier::Downshift => "downshift",
            Tier::Cache => "cache",
            Tier::SemanticCache => "semantic_cache",
            Tier::Queued => "queued",
            Tier::Refused => "refused",
        }
    }
}

/// Announces the attempt whose output follows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Started {
    pub provider: Arc<str>,
    pub model: Arc<str>,
    pub attempt: u32,
    pub tier: Tier,
    pub request_id: Arc<str>,
    /// What the target's wire could not carry and was left out.
    #[serde(default)]
    pub dropped: Vec<String>,
    /// The stream's resume token, stamped by a journaled stream's sink.
    #[serde(default)]
    pub resume_token: Option<Arc<str>>,
}

/// The last event of a served request.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Finished {
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub usage_estimated: bool,
    pub provider: Arc<str>,
    pub model: Arc<str>,
    pub tier: Tier,
    pub attempts: u32,
    pub request_id: Arc<str>,
    pub upstream_request_id: Option<String>,
    /// Replayed from an idempotency record, not generated now.
    pub replayed: bool,
    /// For a cached answer: how old it is.
    pub cache_age: Option<std::time::Duration>,
    /// For a semantic cache answer: the cosine similarity of its question.
    #[serde(default)]
    pub cache_similarity: Option<f32>,
    /// What the serving attempt cost, from the target's price table.
    pub cost_usd: f64,
    /// The upstream service tier that served, when it said.
    #[serde(default)]
    pub service_tier: Option<String>,
    /// The answer's reasoning blocks, with their signatures.
    #[serde(default)]
    pub reasoning: Vec<crate::chat::ReasoningBlock>,
    /// What the serving attempt's wire left out.
    #[serde(default)]
    pub dropped: Vec<String>,
    /// The whole stream is in its journal (stamped by the sink).
    #[serde(default)]
    pub resumable: bool,
    /// A second attempt was started for a slow first token (`hedge`).
    pub hedged: bool,
    /// On a hedged request, the attempt that answered (0 otherwise).
    pub won_attempt: u32,
}

/// Another attempt continues the answer the caller holds (`mid_stream =
/// "continue"`): only its new text follows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Continued {
    /// The attempt that failed after output.
    pub failed_attempt: u32,
    pub provider: String,
    pub model: String,
    /// The continuing attempt's number.
    pub attempt: u32,
    /// The last item the caller holds from before the seam (stamped by the sink).
    pub at_seq: u64,
}

/// What flows to the caller, in order: `Started`, chunks, then `Finished`
/// (or `Reset` and a new `Started`, or `Continued` and more chunks).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Event {
    /// Boxed, like `Finished`: the channel's slots are as large as its
    /// largest event, and every open stream holds a block of 32.
    Started(Box<Started>),
    Chunk(Chunk),
    Reset {
        reason: String,
        failed_attempt: u32,
    },
    /// Boxed, like `Queued`: the channel's slots are as large as its
    /// largest event, and every open stream holds a block of them.
    Finished(Box<Finished>),
    /// The `queue` rung accepted the request as a job (the last event).
    Queued(Box<QueuedJob>),
    /// Boxed like `Finished`: rare, and the channel's slots stay small.
    Continued(Box<Continued>),
    /// This replica is leaving: the stream ends unfinished; resume it
    /// elsewhere with its token after `after_seq`. Never journaled.
    Moved {
        resume_token: Arc<str>,
        after_seq: u64,
    },
}

/// A job accepted for a request, with its place in the queue.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QueuedJob {
    pub record: crate::job::JobRecord,
    pub position: u64,
    pub eta: std::time::Duration,
}

/// One item of the channel: an event, or the terminal error.
pub type Item = Result<Event, RequestError>;

/// Item `seq` as the channel carries it: the error boxed (it comes at most
/// once, and every slot of every open stream's channel is as large as
/// this: 48 bytes instead of 80).
pub type Slot = (u64, Result<Event, Box<RequestError>>);

fn slot(seq: u64, item: Item) -> Slot {
    (seq, item.map_err(Box::new))
}

/// Where a journaled stream's items are written too, before the caller gets
/// them, so the caller can resume from any item it holds (`task::journal`
/// writes them to the resume journal).
pub trait Tee: Send + Sync {
    /// The resume token callers name the stream by.
    fn token(&self) -> &Arc<str>;
    /// Writes item `seq`; the stream's last is `Finished`, `Queued` or an
    /// error. A failed write leaves the stream unresumable, never stalled.
    fn write<'a>(&'a mut self, seq: u64, item: &'a Item)
        -> futures_util::future::BoxFuture<'a, ()>;
    /// Writes items that were ready together, in order, in as few store
    /// calls as the store allows (one on Redis); the same as writing them
    /// one by one.
    fn write_batch<'a>(
        &'a mut self,
        items: &'a [(u64, Item)],
    ) -> futures_util::future::BoxFuture<'a, ()> {
        Box::pin(async move {
            for (seq, item) in items {
                self.write(*seq, item).await;
            }
        })
    }
    /// Every item so far was stored: a reconnect gets the whole stream.
    fn whole(&self) -> bool;
    /// The writer leaves without ending the stream (a drain): another
    /// replica may take it over at once.
    fn release(&mut self) -> futures_util::future::BoxFuture<'_, ()>;
}

/// The caller hung up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;

/// Why the request task stopped sending to a caller that still holds its
/// end: read by the door after the buffered events.
type Abandoned = Arc<OnceLock<RequestError>>;

/// The request task's side of the channel.
pub struct EventSink {
    /// `None` for a sink that discards everything (synthetic probes).
    tx: Option<mpsc::Sender<Slot>>,
    /// Set once the sink gave up on the caller; every later send fails.
    abandoned: Abandoned,
    /// The request's deadline: no send waits past it.
    deadline: Option<Instant>,
    /// Longest one send may wait for the caller to make room.
    send_timeout: Duration,
    /// Bytes of the recording so far, and its cap.
    recorded_bytes: usize,
    max_recorded_bytes: usize,
    /// `Started` of the current attempt, sent with its first chunk.
    pending_start: Option<Box<Started>>,
    /// `Continued` of a continuing attempt, sent with its first chunk
    /// (boxed as the event boxes it: rare, and every open stream holds a
    /// sink).
    pending_continued: Option<Box<Continued>>,
    /// Where a continuing attempt's text meets what the caller holds.
    seam: Option<Seam>,
    /// The answer's text so far (what a continuation is given), and
    /// whether a tool call was being streamed in it.
    answer_text: String,
    tool_call_open: bool,
    /// What the sent `Started` said was dropped (for `Finished`).
    sent_dropped: Vec<String>,
    /// Chunks forwarded in the current attempt.
    attempt_chunks: u32,
    /// Any event reached the caller (the gRPC response headers are out).
    committed: bool,
    /// Characters of output forwarded in the current attempt (usage estimates).
    attempt_chars: usize,
    /// How the caller takes the answer.
    delivery: Delivery,
    /// Events of the current answer, kept for the idempotency record and cache.
    recording: Option<Vec<Event>>,
    /// Called with the recorded answer just before `Finished` is sent, so a
    /// duplicate arriving right after the caller's answer already finds it.
    on_finish: Option<FinishHook>,
    /// The number of the last item sent (the first is 1).
    seq: u64,
    /// The stream's journal, when it has one.
    tee: Option<Box<dyn Tee>>,
    /// The caller hanging up does not end the request: the answer completes
    /// into the journal (`on_caller_gone = "finish"`, with a tee only).
    finish_when_gone: bool,
    /// The stream's last item (`Finished`, `Queued`, an error) was sent.
    ended: bool,
    /// The number of the last item the caller was handed (an item can be
    /// journaled and then cut off by a drain before it is delivered).
    delivered: u64,
    /// Items are being held to be journaled together ([`Self::hold`]).
    holding: bool,
    /// The held items, numbered, not yet journaled or handed out.
    held: Vec<(u64, Item)>,
}

/// The most items held for one journal write; more are written at once.
const MAX_HELD: usize = 64;

/// Spare held-item lists kept per thread.
const POOLED_HELD: usize = 8;

thread_local! {
    /// Lists for held items, lent to a sink from [`EventSink::hold`] until
    /// it releases them: a stream holds one only while a read's items are
    /// journaled, so lists are reused across streams (none grows per
    /// stream) and a slow stream keeps none between its reads.
    static HELD: Spares<Vec<(u64, Item)>> = const { Spares::new(POOLED_HELD, MAX_HELD) };
}

/// Stores a finished answer (idempotency record, response cache).
pub type FinishHook =
    Box<dyn FnOnce(Vec<Event>) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

/// The door's end of a request's channel. It yields the request task's items
/// in order and, if the task gave up on this caller (it stopped reading past
/// the deadline or `server.send_timeout`), that error last.
pub struct Events {
    rx: mpsc::Receiver<Slot>,
    abandoned: Abandoned,
    ended: bool,
    /// The number of the last item returned.
    seq: u64,
    /// A reconnect: the caller holds the items up to this one.
    after: u64,
    /// The request itself, when it runs inside this receiver's polls
    /// ([`Events::drive`]) rather than as a spawned task.
    driver: Option<Driver>,
}

/// A request's whole future (the request task's body).
pub type Driver = Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl Events {
    /// Runs `driver` (the request) inside this receiver's polls, in the
    /// door's own task: no spawned task, no wake of another task per item.
    /// Only for a door that reads until its answer is whole (a buffered
    /// answer): a stream's door stops polling while its caller reads
    /// slowly, and the request must not stop with it. If this receiver is
    /// dropped before the request ends (the caller left, the answer came
    /// before the settlement, the deadline passed), the request goes on as
    /// a spawned task, so it settles exactly as one always did.
    pub fn drive(&mut self, driver: Driver) {
        self.driver = Some(driver);
    }

    /// Polls the driven request, if any, until it waits or ends.
    fn poll_driver(&mut self, cx: &mut Context<'_>) {
        if let Some(d) = self.driver.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                self.driver = None;
            }
        }
    }

    pub async fn recv(&mut self) -> Option<Item> {
        std::future::poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The number of the item `recv` returned last (`CompletionEvent.seq`,
    /// the SSE `id`): the same on a resumed stream.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Marks a reconnect whose caller holds the items up to `after`: its
    /// door sends only what follows (an SSE door still reads the rest, to
    /// frame what follows as the first stream did).
    pub fn resumed_after(&mut self, after: u64) {
        self.after = after;
    }

    /// The item the reconnecting caller holds up to (0 for a new stream).
    pub fn after(&self) -> u64 {
        self.after
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.poll_driver(cx);
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some((seq, item))) => {
                self.seq = seq;
                Poll::Ready(Some(item.map_err(|e| *e)))
            }
            Poll::Ready(None) if !self.ended => {
                self.ended = true;
                self.seq += 1;
                Poll::Ready(self.abandoned.get().cloned().map(Err))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        // The request outlives its caller's wait: it finishes on its own.
        if let Some(driver) = self.driver.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => {
                    rt.spawn(driver);
                }
                Err(_) => tracing::warn!("a request was dropped outside the runtime: not finished"),
            }
        }
    }
}

impl futures_util::Stream for Events {
    type Item = Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        self.get_mut().poll_recv(cx)
    }
}

/// How a sink's sends are bounded.
#[derive(Debug, Clone, Copy)]
pub struct SendLimits {
    /// `server.stream_buffer`: events held for the caller.
    pub buffer: usize,
    /// `server.send_timeout`.
    pub send_timeout: Duration,
    /// `limits.max_recorded_bytes`: the largest answer kept for the
    /// idempotency record and the response cache.
    pub max_recorded_bytes: usize,
}

impl Default for SendLimits {
    fn default() -> Self {
        SendLimits {
            buffer: 64,
            send_timeout: Duration::from_secs(10),
            max_recorded_bytes: 4 * 1024 * 1024,
        }
    }
}

/// How a caller takes its answer, which decides what a failure after
/// output may still do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// One assembled answer (unary, non-streaming HTTP, jobs): partial
    /// output is discarded with a `Reset`, so nothing is ever committed.
    Buffered,
    /// A stream whose client discards what it holds on a `Reset` (gRPC).
    Resettable,
    /// A stream whose client cannot discard what it holds (the HTTP doors'
    /// SSE): once output is out, a failed attempt ends the stream.
    Final,
}

/// Appends a token's text to the answer so far: room for 256 bytes at
/// first (a short answer, such as 16 tokens, is allocated once), growing
/// fourfold while it is short, by doubling after 1 KB.
fn push_growing(answer: &mut String, text: &str) {
    let need = answer.len() + text.len();
    if need > answer.capacity() && need <= 1024 {
        answer.reserve_exact((need * 4).max(256) - answer.len());
    }
    answer.push_str(text);
}

/// A request's channel: the task's sink and the door's events.
pub fn channel(limits: SendLimits, delivery: Delivery) -> (EventSink, Events) {
    let (tx, rx) = mpsc::channel(limits.buffer.max(1));
    let mut sink = EventSink::new(tx, delivery);
    // The sink's own flag, shared (a second one would be one more
    // allocation a request).
    let abandoned = sink.abandoned.clone();
    sink.send_timeout = limits.send_timeout;
    sink.max_recorded_bytes = limits.max_recorded_bytes;
    let events = Events {
        rx,
        abandoned,
        ended: false,
        seq: 0,
        after: 0,
        driver: None,
    };
    (sink, events)
}

impl EventSink {
    pub fn new(tx: mpsc::Sender<Slot>, delivery: Delivery) -> Self {
        Self::with(Some(tx), delivery)
    }

    /// A sink with no caller behind it: output is counted and dropped, and it
    /// never reports the caller gone.
    pub fn discard() -> Self {
        Self::with(None, Delivery::Buffered)
    }

    fn with(tx: Option<mpsc::Sender<Slot>>, delivery: Delivery) -> Self {
        let limits = SendLimits::default();
        EventSink {
            tx,
            abandoned: Abandoned::default(),
            deadline: None,
            send_timeout: limits.send_timeout,
            recorded_bytes: 0,
            max_recorded_bytes: limits.max_recorded_bytes,
            pending_start: None,
            pending_continued: None,
            seam: None,
            answer_text: String::new(),
            tool_call_open: false,
            sent_dropped: Vec::new(),
            attempt_chunks: 0,
            committed: false,
            attempt_chars: 0,
            delivery,
            recording: None,
            on_finish: None,
            seq: 0,
            tee: None,
            finish_when_gone: false,
            ended: false,
            delivered: 0,
            holding: false,
            held: Vec::new(),
        }
    }

    /// Ends the caller's stream without ending the answer (this replica is
    /// draining): the caller gets `Moved` with the resume token and resumes
    /// elsewhere, where the journal is taken over. False when the stream
    /// cannot move (not journaled whole, or no output reached the caller:
    /// then it fails as before and is retried whole).
    pub async fn moved(&mut self) -> bool {
        let Some(tee) = self.tee.as_mut() else {
            return false;
        };
        if !tee.whole() || !self.committed || self.ended {
            return false;
        }
        self.ended = true;
        // Held items were neither journaled nor handed out: whoever takes
        // the journal over goes on from what it holds.
        self.held.clear();
        tee.release().await;
        // Resume after what the caller was handed: an item journaled but
        // cut off by the drain before it went out is the resume's first.
        let at = self.delivered;
        let moved = Event::Moved {
            resume_token: tee.token().clone(),
            after_seq: at,
        };
        self.seq = at;
        let _ = self.deliver(at, Ok(moved)).await;
        true
    }

    /// Ends a journaled stream that stopped without its last item (its
    /// caller hung up and the request was cancelled): the journal says so,
    /// so a reconnect learns it at once instead of waiting on a lease.
    pub async fn close(&mut self) {
        if self.ended {
            return;
        }
        if let Some(tee) = &mut self.tee {
            self.ended = true;
            // What was held is journaled (nobody is there to hand it to).
            let held = std::mem::take(&mut self.held);
            tee.write_batch(&held).await;
            self.seq += 1;
            tee.write(self.seq, &Err(RequestError::CallerGone)).await;
        }
    }

    /// Items sent from now until [`Self::release`] are journaled together,
    /// in one write, and then handed to the caller in order (a journaled
    /// stream only: the upstream reader holds the events of one network
    /// read, so a 16-token burst costs one journal call, not 16). At most
    /// `MAX_HELD` are held; more are written at once.
    pub fn hold(&mut self) {
        self.holding = self.tee.is_some();
        if self.holding && self.held.capacity() == 0 {
            self.held = spares::take(&HELD);
        }
    }

    /// Journals the held items in one write and hands them to the caller.
    pub async fn release(&mut self) -> Result<(), ClientGone> {
        self.holding = false;
        self.flush_held().await
    }

    async fn flush_held(&mut self) -> Result<(), ClientGone> {
        if self.held.is_empty() {
            if !self.holding && self.held.capacity() != 0 {
                spares::give(&HELD, std::mem::take(&mut self.held));
            }
            return Ok(());
        }
        let mut held = std::mem::take(&mut self.held);
        if let Some(tee) = &mut self.tee {
            tee.write_batch(&held).await;
        }
        let mut result = Ok(());
        for (seq, item) in held.drain(..) {
            if result.is_ok() {
                result = self.deliver(seq, item).await;
            }
        }
        // Kept while it holds on; lent back to the thread once released.
        if self.holding {
            self.held = held;
        } else {
            spares::give(&HELD, held);
        }
        result
    }

    /// A sink with no caller of its own: it writes on into a journal taken
    /// over after item `seq`, whose readers hold the answer so far (so it
    /// is committed from the start, and its text is `held`).
    pub fn journal_only(tee: Box<dyn Tee>, seq: u64, held: String, tool_call_open: bool) -> Self {
        let mut sink = Self::with(None, Delivery::Final);
        sink.tee = Some(tee);
        sink.seq = seq;
        sink.committed = true;
        sink.answer_text = held;
        sink.tool_call_open = tool_call_open;
        sink
    }

    /// Writes every item to `tee` too (a journaled stream); with
    /// `finish_when_gone`, the caller hanging up no longer ends the request.
    pub fn set_tee(&mut self, tee: Box<dyn Tee>, finish_when_gone: bool) {
        self.tee = Some(tee);
        self.finish_when_gone = finish_when_gone;
    }

    /// Whether the caller hanging up lets the request finish into its
    /// journal (the route's `on_caller_gone`; only a journaled stream can).
    pub fn finish_when_gone(&mut self, finish: bool) {
        self.finish_when_gone = finish;
    }

    /// The stream's resume token, when it is journaled.
    pub fn resume_token(&self) -> Option<&Arc<str>> {
        self.tee.as_deref().map(Tee::token)
    }

    /// The request runs on without its caller (into the journal).
    fn detached_when_gone(&self) -> bool {
        self.finish_when_gone && self.tee.is_some()
    }

    /// No send waits past `deadline` (the whole request's).
    pub fn set_deadline(&mut self, deadline: Instant) {
        self.deadline = Some(deadline);
    }

    /// Begins a new attempt; `Started` is sent with its first chunk.
    pub fn begin_attempt(&mut self, started: Started) {
        self.pending_start = Some(Box::new(started));
        self.pending_continued = None;
        self.seam = None;
        self.sent_dropped.clear();
        self.attempt_chunks = 0;
        self.attempt_chars = 0;
    }

    /// What the attempt's wire left out: told with its `Started` (a no-op
    /// once that is out: an attempt builds its request before any output).
    pub fn set_dropped(&mut self, dropped: Vec<String>) {
        if let Some(started) = self.pending_start.as_mut() {
            started.dropped = dropped;
        }
    }

    /// What the current attempt's wire left out.
    pub fn attempt_dropped(&self) -> Vec<String> {
        self.pending_start
            .as_ref()
            .map(|s| s.dropped.clone())
            .unwrap_or_else(|| self.sent_dropped.clone())
    }

    /// Forwards one chunk (after the pending `Started`).
    // Not an `async fn`, on purpose: one keeps its by-value argument twice
    // in its future, and this future is part of every streaming request.
    #[allow(clippy::manual_async_fn)]
    pub fn chunk(
        &mut self,
        mut chunk: Chunk,
    ) -> impl std::future::Future<Output = Result<(), ClientGone>> + '_ {
        async move {
            if let (Some(seam), Chunk::Text(text)) = (self.seam.as_mut(), &mut chunk) {
                let passed = seam.pass(text).len();
                text.replace_range(..text.len() - passed, "");
                if text.is_empty() {
                    return Ok(());
                }
            }
            self.announce().await?;
            match &chunk {
                Chunk::Text(t) => {
                    push_growing(&mut self.answer_text, t);
                    self.tool_call_open = false;
                }
                Chunk::ToolCall { .. } => self.tool_call_open = true,
                _ => {}
            }
            self.attempt_chars += chunk.output_bytes();
            self.attempt_chunks += 1;
            self.send(Event::Chunk(chunk)).await
        }
    }

    /// Starts an attempt that continues the answer the caller holds: its
    /// first chunk goes out after `continued`, every text chunk through
    /// `seam`.
    pub fn begin_continuation(&mut self, continued: Continued, seam: Seam) {
        self.pending_start = None;
        self.pending_continued = Some(Box::new(continued));
        self.seam = Some(seam);
        self.sent_dropped.clear();
        self.attempt_chunks = 0;
        self.attempt_chars = 0;
    }

    /// The answer's text the caller holds, and whether a tool call was
    /// being streamed in it (what `policy::continuation` decides on).
    pub fn answer_so_far(&self) -> (&str, bool) {
        (&self.answer_text, self.tool_call_open)
    }

    /// The number of the last item sent.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Tells the caller to discard the failed attempt's output.
    pub async fn reset(&mut self, reason: String, failed_attempt: u32) -> Result<(), ClientGone> {
        self.answer_text.clear();
        self.tool_call_open = false;
        self.send(Event::Reset {
            reason,
            failed_attempt,
        })
        .await
    }

    /// Sends the final event (and `Started` if the answer had no chunk).
    pub async fn finish(&mut self, finished: Finished) -> Result<(), ClientGone> {
        self.announce().await?;
        self.send(Event::Finished(Box::new(finished))).await
    }

    /// Sends the attempt's pending `Started` (or `Continued`), which waits
    /// for its first output.
    async fn announce(&mut self) -> Result<(), ClientGone> {
        if let Some(started) = self.pending_start.take() {
            self.sent_dropped.clone_from(&started.dropped);
            self.send(Event::Started(started)).await?;
        }
        if let Some(mut continued) = self.pending_continued.take() {
            continued.at_seq = self.seq;
            self.send(Event::Continued(continued)).await?;
        }
        Ok(())
    }

    /// Keeps a copy of the answer's events (a `Reset` starts over) and hands
    /// it to `on_finish` right before the answer's `Finished` goes out.
    /// An answer larger than `limits.max_recorded_bytes` is not kept: the
    /// hook is dropped unrun (an idempotency claim is released, nothing is
    /// cached) and the caller still gets the whole answer.
    pub fn record(&mut self, on_finish: FinishHook) {
        self.recording = Some(Vec::new());
        self.recorded_bytes = 0;
        self.on_finish = Some(on_finish);
    }

    /// Sends a stored event as is.
    pub async fn replay(&mut self, event: Event) -> Result<(), ClientGone> {
        self.send(event).await
    }

    /// Sends a journaled item under its own number (a resumed stream):
    /// nothing is recorded, stamped or journaled again.
    pub async fn forward(&mut self, seq: u64, item: Item) -> Result<(), ClientGone> {
        self.seq = seq;
        self.deliver(seq, item).await
    }

    /// Answers with a job instead of tokens (the `queue` rung).
    pub async fn queued(&mut self, job: QueuedJob) -> Result<(), ClientGone> {
        self.pending_start = None;
        self.send(Event::Queued(Box::new(job))).await
    }

    /// Ends the request with an error (bounded like every send: a caller
    /// that does not read gets it after its buffered events).
    pub async fn fail(&mut self, error: RequestError) {
        if self.abandoned.get().is_some() {
            return;
        }
        self.holding = false;
        let _ = self.flush_held().await;
        self.seq += 1;
        self.ended = true;
        let item = Err(error);
        if let Some(tee) = &mut self.tee {
            tee.write(self.seq, &item).await;
        }
        if let Some(tx) = &self.tx {
            if let Err(SendFailed::GaveUp(_)) =
                self.bounded(tx.send(slot(self.seq, item.clone()))).await
            {
                if let Err(error) = item {
                    let _ = self.abandoned.set(error);
                }
            }
        }
    }

    /// Output of the current attempt reached a streaming caller: the attempt
    /// can no longer be replaced transparently.
    pub fn committed(&self) -> bool {
        self.delivery != Delivery::Buffered && self.committed
    }

    /// The caller takes one assembled answer ([`Delivery::Buffered`]).
    pub fn buffered(&self) -> bool {
        self.delivery == Delivery::Buffered
    }

    /// The caller can discard output it holds, so a failed attempt may be
    /// replaced after a `Reset` (`mid_stream = "reset"`).
    pub fn can_reset(&self) -> bool {
        self.delivery != Delivery::Final
    }

    /// Some output of the current attempt was forwarded.
    pub fn attempt_had_output(&self) -> bool {
        self.attempt_chunks > 0
    }

    pub fn attempt_chunks(&self) -> u32 {
        self.attempt_chunks
    }

    pub fn attempt_chars(&self) -> usize {
        self.attempt_chars
    }

    /// Resolves when the caller has gone away (or was given up on).
    pub async fn closed(&self) {
        if self.detached_when_gone() {
            return std::future::pending().await;
        }
        if self.abandoned.get().is_some() {
            return;
        }
        match &self.tx {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    }

    pub fn is_closed(&self) -> bool {
        if self.detached_when_gone() {
            return false;
        }
        self.abandoned.get().is_some() || self.tx.as_ref().is_some_and(|tx| tx.is_closed())
    }

    /// Waits for `send` no longer than `server.send_timeout` and never past
    /// the deadline.
    async fn bounded<T>(
        &self,
        send: impl std::future::Future<Output = Result<(), T>>,
    ) -> Result<(), SendFailed> {
        let stall = crate::policy::clock::after(Instant::now(), self.send_timeout);
        let (limit, error) = match self.deadline {
            Some(d) if d <= stall => (d, RequestError::DeadlineExceeded { attempts: 0 }),
            _ => (
                stall,
                RequestError::SlowConsumer {
                    waited: self.send_timeout,
                },
            ),
        };
        match tokio::time::timeout_at(limit, send).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(SendFailed::Gone),
            Err(_) => Err(SendFailed::GaveUp(error)),
        }
    }

    // Not an `async fn`, on purpose: one keeps its by-value argument twice
    // in its future, and this future is part of every streaming request.
    #[allow(clippy::manual_async_fn)]
    fn send(
        &mut self,
        mut event: Event,
    ) -> impl std::future::Future<Output = Result<(), ClientGone>> + '_ {
        async move {
            if self.abandoned.get().is_some() {
                return Err(ClientGone);
            }
            if !self.holding || self.held.len() >= MAX_HELD {
                self.flush_held().await?;
            }
            if let Some(tee) = &self.tee {
                match &mut event {
                    Event::Started(s) => s.resume_token = Some(tee.token().clone()),
                    Event::Finished(f) => f.resumable = tee.whole(),
                    _ => {}
                }
            }
            if let Some(recording) = &mut self.recording {
                if matches!(event, Event::Reset { .. }) {
                    recording.clear();
                    self.recorded_bytes = 0;
                } else {
                    self.recorded_bytes += event_bytes(&event);
                    recording.push(event.clone());
                }
                if self.recorded_bytes > self.max_recorded_bytes {
                    tracing::warn!(
                        limit = self.max_recorded_bytes,
                        "the answer is larger than limits.max_recorded_bytes: it is not kept for idempotency or the cache"
                    );
                    self.recording = None;
                    self.on_finish = None;
                }
                if matches!(event, Event::Finished(_)) {
                    if let (Some(hook), Some(events)) =
                        (self.on_finish.take(), self.recording.take())
                    {
                        hook(events).await;
                    }
                }
            }
            self.seq += 1;
            self.ended |= matches!(event, Event::Finished(_) | Event::Queued(_));
            let item = Ok(event);
            if self.holding {
                self.held.push((self.seq, item));
                return Ok(());
            }
            if let Some(tee) = &mut self.tee {
                tee.write(self.seq, &item).await;
            }
            self.deliver(self.seq, item).await
        }
    }

    /// Hands item `seq` to the caller, bounded.
    // Not an `async fn`, on purpose: one keeps its by-value argument twice
    // in its future, and this future is part of every streaming request.
    #[allow(clippy::manual_async_fn)]
    fn deliver(
        &mut self,
        seq: u64,
        item: Item,
    ) -> impl std::future::Future<Output = Result<(), ClientGone>> + '_ {
        async move {
            if self.abandoned.get().is_some() {
                return Err(ClientGone);
            }
            if let Some(tx) = &self.tx {
                // Room now (the common case): no timer at all.
                let sent = match tx.try_send(slot(seq, item)) {
                    Ok(()) => {
                        self.committed = true;
                        self.delivered = seq;
                        return Ok(());
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => return self.gone(),
                    Err(mpsc::error::TrySendError::Full(sent)) => sent,
                };
                // Boxed: this wait (about 1.1 KB of future) happens only
                // when the caller is behind, and would otherwise be stored in
                // every request's future.
                match Box::pin(self.bounded(tx.send(sent))).await {
                    Ok(()) => self.delivered = seq,
                    Err(SendFailed::Gone) => return self.gone(),
                    Err(SendFailed::GaveUp(e)) => {
                        tracing::warn!(error = %e, "the caller stopped reading; the request is dropped");
                        let _ = self.abandoned.set(e);
                        return Err(ClientGone);
                    }
                }
            }
            self.committed = true;
            Ok(())
        }
    }

    /// The caller hung up: the request ends, unless it finishes into its
    /// journal (then nothing more is sent to the caller).
    fn gone(&mut self) -> Result<(), ClientGone> {
        if self.detached_when_gone() {
            if self.tx.take().is_some() {
                tracing::info!("the caller hung up: the answer completes into its journal");
            }
            return Ok(());
        }
        Err(ClientGone)
    }
}

/// Why a bounded send did not complete.
enum SendFailed {
    /// The caller hung up: nothing to tell it.
    Gone,
    /// The caller holds its end but did not make room in time.
    GaveUp(RequestError),
}

/// About how much memory a recorded event holds.
pub(crate) fn event_bytes(event: &Event) -> usize {
    const OVERHEAD: usize = 64;
    OVERHEAD
        + match event {
            Event::Chunk(Chunk::Text(t)) => t.len(),
            Event::Chunk(Chunk::ToolCall(call)) => {
                call.arguments.len()
                    + call.id.as_ref().map_or(0, String::len)
                    + call.name.as_ref().map_or(0, String::len)
            }
            _ => 0,
        }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_so_far_starts_at_256_bytes_and_grows_fourfold_while_short() {
        // How many times `n` five-byte tokens grew the answer.
        let grow = |answer: &mut String, n: usize| {
            (0..n)
                .filter(|_| {
                    let before = answer.capacity();
                    push_growing(answer, "hello");
                    answer.capacity() != before
                })
                .count()
        };
        let mut answer = String::new();
        assert_eq!(grow(&mut answer, 16), 1, "256 bytes, once");
        assert_eq!(answer.len(), 80);
        assert_eq!(grow(&mut answer, 40), 1, "then 4 x 260");
        assert_eq!((answer.len(), answer.capacity()), (280, 4 * 260));
        push_growing(&mut answer, &"x".repeat(2000));
        assert_eq!(answer.len(), 2280);
        assert!(
            answer.capacity() < 2 * 2280,
            "doubling past 1 KB: {}",
            answer.capacity()
        );
    }
    use std::sync::{Arc, Mutex};

    fn started(attempt: u32) -> Started {
        Started {
            provider: "p".into(),
            model: "m".into(),
            attempt,
            tier: Tier::Primary,
            request_id: "r".into(),
            dropped: Vec::new(),
            resume_token: None,
        }
    }

    fn finished() -> Finished {
        Finished {
            finish_reason: FinishReason::Stop,
            usage: Usage::default(),
            usage_estimated: false,
            provider: "p".into(),
            model: "m".into(),
            tier: Tier::Primary,
            attempts: 1,
            request_id: "r".into(),
            upstream_request_id: None,
            replayed: false,
            cache_age: None,
            cache_similarity: None,
            cost_usd: 0.0,
            service_tier: None,
            reasoning: Vec::new(),
            dropped: Vec::new(),
            resumable: false,
            hedged: false,
            won_attempt: 0,
        }
    }

    fn drain(rx: &mut mpsc::Receiver<Slot>) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok((_, item)) = rx.try_recv() {
            out.push(item.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn started_waits_for_the_first_chunk_so_a_failed_attempt_is_invisible() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut sink = EventSink::new(tx, Delivery::Resettable);
        sink.begin_attempt(started(1));
        assert!(drain(&mut rx).is_empty(), "nothing before the first chunk");
        assert!(!sink.committed() && !sink.attempt_had_output());
        // Attempt 1 failed before output; attempt 2 streams.
        sink.begin_attempt(started(2));
        sink.chunk(Chunk::Text("hi".into())).await.unwrap();
        assert!(sink.committed(), "a streaming caller has output now");
        assert_eq!((sink.attempt_chunks(), sink.attempt_chars()), (1, 2));
        let events = drain(&mut rx);
        assert_eq!(events.len(), 2);
        assert!(matches!(&events[0], Event::Started(s) if s.attempt == 2));
    }

    /// A driven request: sends its items through `sink`, then notes it ended.
    fn request(mut sink: EventSink, ended: Arc<std::sync::atomic::AtomicBool>) -> Driver {
        Box::pin(async move {
            sink.begin_attempt(started(1));
            for _ in 0..100 {
                let _ = sink.chunk(Chunk::Text("x".into())).await;
            }
            let _ = sink.finish(finished()).await;
            // The settlement after the answer (cost, idempotency record).
            tokio::task::yield_now().await;
            ended.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    }

    #[tokio::test]
    async fn a_driven_request_runs_in_the_readers_polls_past_a_full_channel() {
        let limits = SendLimits {
            buffer: 4,
            ..SendLimits::default()
        };
        let (sink, mut events) = channel(limits, Delivery::Buffered);
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        events.drive(request(sink, ended.clone()));
        let mut got = Vec::new();
        while let Some(item) = events.recv().await {
            got.push(item.unwrap());
        }
        // Started, 100 chunks, Finished: through a channel of 4, so the
        // request and its reader took turns in one task.
        assert_eq!(got.len(), 102);
        assert!(matches!(got.last(), Some(Event::Finished(_))));
        assert!(ended.load(std::sync::atomic::Ordering::SeqCst));
        assert!(events.driver.is_none(), "the request ended inside recv");
    }

    #[tokio::test]
    async fn a_driven_request_whose_reader_leaves_finishes_as_a_task() {
        let (sink, mut events) = channel(SendLimits::default(), Delivery::Buffered);
        let ended = Arc::new(std::sync::atomic::AtomicBool::new(false));
        events.drive(request(sink, ended.clone()));
        // The reader takes one item and leaves (a caller that hung up).
        assert!(events.recv().await.is_some());
        assert!(!ended.load(std::sync::atomic::Ordering::SeqCst));
        drop(events);
        for _ in 0..1000 {
            if ended.load(std::sync::atomic::Ordering::SeqCst) {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(
            ended.load(std::sync::atomic::Ordering::SeqCst),
            "the request went on to its end without its reader"
        );
    }

    #[tokio::test]
    async fn a_buffered_caller_is_never_committed() {
        let (tx, _rx) = mpsc::channel(16);
        let mut sink = EventSink::new(tx, Delivery::Buffered);
        sink.begin_attempt(started(1));
        sink.chunk(Chunk::Text("partial".into())).await.unwrap();
        assert!(!sink.committed(), "a unary caller can still be failed over");
        assert!(sink.attempt_had_output(), "but it must be told to reset");
    }

    #[tokio::test]
    async fn the_recording_restarts_at_a_reset_and_is_stored_before_finished() {
        let (tx, rx) = mpsc::channel(16);
        let rx = Arc::new(Mutex::new(rx));
        let mut sink = EventSink::new(tx, Delivery::Resettable);
        // (what was stored, what the caller held at that moment)
        type Seen = Option<(Vec<Event>, Vec<Event>)>;
        let stored: Arc<Mutex<Seen>> = Arc::default();
        let (seen, caller) = (stored.clone(), rx.clone());
        sink.record(Box::new(move |events| {
            Box::pin(async move {
                // What the caller holds when the answer is stored.
                let received = drain(&mut caller.lock().unwrap());
                *seen.lock().unwrap() = Some((events, received));
            })
        }));
        sink.begin_attempt(started(1));
        sink.chunk(Chunk::Text("bad".into())).await.unwrap();
        sink.reset("overloaded".into(), 1).await.unwrap();
        sink.begin_attempt(started(2));
        sink.chunk(Chunk::Text("good".into())).await.unwrap();
        sink.finish(finished()).await.unwrap();
        let (events, received) = stored.lock().unwrap().take().unwrap();
        assert_eq!(received.len(), 5, "Started, chunk, Reset, Started, chunk");
        assert!(
            !received.iter().any(|e| matches!(e, Event::Finished(_))),
            "stored before the caller's Finished"
        );
        assert_eq!(events.len(), 3, "only the served attempt: {events:?}");
        assert!(matches!(&events[1], Event::Chunk(Chunk::Text(t)) if t == "good"));
        assert!(matches!(events[2], Event::Finished(_)));
        let rest = drain(&mut rx.lock().unwrap());
        assert!(matches!(rest.as_slice(), [Event::Finished(_)]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_that_stops_reading_is_given_up_on_and_told_why_last() {
        let limits = SendLimits {
            buffer: 2,
            send_timeout: Duration::from_secs(10),
            max_recorded_bytes: 1 << 20,
        };
        let (mut sink, mut events) = channel(limits, Delivery::Resettable);
        sink.set_deadline(Instant::now() + Duration::from_secs(60));
        sink.begin_attempt(started(1));
        sink.chunk(Chunk::Text("a".into())).await.unwrap(); // Started + chunk fill the buffer
        let t0 = Instant::now();
        assert_eq!(sink.chunk(Chunk::Text("b".into())).await, Err(ClientGone));
        assert_eq!(
            t0.elapsed(),
            Duration::from_secs(10),
            "exactly send_timeout"
        );
        assert!(
            sink.is_closed(),
            "given up on: the attempt sees the caller gone"
        );
        // Later sends fail at once; the error is not queued behind the events.
        sink.fail(RequestError::Draining).await;
        assert_eq!(t0.elapsed(), Duration::from_secs(10));
        drop(sink);
        assert!(matches!(events.recv().await, Some(Ok(Event::Started(_)))));
        assert!(matches!(events.recv().await, Some(Ok(Event::Chunk(_)))));
        assert!(matches!(
            events.recv().await,
            Some(Err(RequestError::SlowConsumer { waited })) if waited == Duration::from_secs(10)
        ));
        assert_eq!(events.recv().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_deadline_bounds_a_send_before_send_timeout_does() {
        let limits = SendLimits {
            buffer: 1,
            ..SendLimits::default()
        };
        let (mut sink, mut events) = channel(limits, Delivery::Resettable);
        sink.set_deadline(Instant::now() + Duration::from_secs(2));
        sink.begin_attempt(started(1));
        let t0 = Instant::now();
        assert_eq!(sink.chunk(Chunk::Text("a".into())).await, Err(ClientGone));
        assert_eq!(t0.elapsed(), Duration::from_secs(2));
        drop(sink);
        assert!(matches!(events.recv().await, Some(Ok(Event::Started(_)))));
        assert!(matches!(
            events.recv().await,
            Some(Err(RequestError::DeadlineExceeded { .. }))
        ));
        // A task that ends normally adds nothing after its last item.
        let (mut sink, mut events) = channel(SendLimits::default(), Delivery::Resettable);
        sink.fail(RequestError::Draining).await;
        drop(sink);
        assert_eq!(events.recv().await, Some(Err(RequestError::Draining)));
        assert_eq!(events.recv().await, None);
    }

    #[tokio::test]
    async fn an_answer_over_the_recording_bound_is_served_but_not_kept() {
        let limits = SendLimits {
            max_recorded_bytes: 1000,
            ..SendLimits::default()
        };
        let (mut sink, mut events) = channel(limits, Delivery::Resettable);
        let kept = Arc::new(Mutex::new(false));
        let flag = kept.clone();
        sink.record(Box::new(move |_| {
            Box::pin(async move {
                *flag.lock().unwrap() = true;
            })
        }));
        sink.begin_attempt(started(1));
        for _ in 0..20 {
            sink.chunk(Chunk::Text("x".repeat(100).into()))
                .await
                .unwrap();
            while let Ok(Some(_)) =
                tokio::time::timeout(Duration::from_millis(1), events.recv()).await
            {}
        }
        sink.finish(finished()).await.unwrap();
        assert!(!*kept.lock().unwrap(), "2 KB recorded against a 1 KB bound");
    }

    /// A tee that keeps what it is given, and can be told it is full.
    static TOK: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from("tok"));

    struct Kept {
        items: Arc<Mutex<Vec<(u64, Item)>>>,
        room: usize,
    }

    impl Tee for Kept {
        fn token(&self) -> &Arc<str> {
            &TOK
        }
        fn write<'a>(
            &'a mut self,
            seq: u64,
            item: &'a Item,
        ) -> futures_util::future::BoxFuture<'a, ()> {
            let mut items = self.items.lock().unwrap();
            if items.len() < self.room {
                items.push((seq, item.clone()));
            }
            Box::pin(async {})
        }
        fn whole(&self) -> bool {
            self.items.lock().unwrap().len() < self.room
        }
        fn release(&mut self) -> futures_util::future::BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    #[tokio::test]
    async fn items_are_numbered_from_one_and_journaled_before_the_caller_gets_them() {
        let (mut sink, mut events) = channel(SendLimits::default(), Delivery::Final);
        let kept = Arc::new(Mutex::new(Vec::new()));
        sink.set_tee(
            Box::new(Kept {
                items: kept.clone(),
                room: 10,
            }),
            false,
        );
        assert_eq!(sink.resume_token().map(|t| &**t), Some("tok"));
        sink.begin_attempt(started(1));
        sink.chunk(Chunk::Text("a".into())).await.unwrap();
        sink.chunk(Chunk::Text("b".into())).await.unwrap();
        sink.finish(finished()).await.unwrap();
        let mut seen = Vec::new();
        for _ in 0..4 {
            let item = events.recv().await.unwrap().unwrap();
            seen.push((events.seq(), item));
        }
        assert_eq!(
            seen.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
        assert!(
            matches!(&seen[0].1, Event::Started(s) if s.resume_token.as_deref() == Some("tok")),
            "Started names the journal"
        );
        assert!(matches!(&seen[3].1, Event::Finished(f) if f.resumable));
        let kept = kept.lock().unwrap();
        assert_eq!(kept.len(), 4);
        assert_eq!(
            kept.iter()
                .map(|(s, i)| (*s, i.clone().unwrap()))
                .collect::<Vec<_>>(),
            seen,
            "the journal holds exactly what the caller got, numbered alike"
        );
    }

    /// A tee that records each store call: its items' numbers.
    struct Batches(Arc<Mutex<Vec<Vec<u64>>>>);

    impl Tee for Batches {
        fn token(&self) -> &Arc<str> {
            &TOK
        }
        fn write<'a>(
            &'a mut self,
            seq: u64,
            _item: &'a Item,
        ) -> futures_util::future::BoxFuture<'a, ()> {
            self.0.lock().unwrap().push(vec![seq]);
            Box::pin(async {})
        }
        fn write_batch<'a>(
            &'a mut self,
            items: &'a [(u64, Item)],
        ) -> futures_util::future::BoxFuture<'a, ()> {
            self.0
                .lock()
                .unwrap()
                .push(items.iter().map(|(seq, _)| *seq).collect());
            Box::pin(async {})
        }
        fn whole(&self) -> bool {
            true
        }
        fn release(&mut self) -> futures_util::future::BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    #[tokio::test]
    async fn held_items_are_journaled_in_one_write_before_any_reaches_the_caller() {
        let (mut sink, mut events) = channel(SendLimits::default(), Delivery::Final);
        let batches = Arc::new(Mutex::new(Vec::new()));
        sink.set_tee(Box::new(Batches(batches.clone())), false);
        sink.begin_attempt(started(1));
        sink.hold();
        for t in ["a", "b", "c"] {
            sink.chunk(Chunk::Text(t.into())).await.unwrap();
        }
        assert!(
            events.rx.try_recv().is_err(),
            "nothing reaches the caller before it is journaled"
        );
        assert!(batches.lock().unwrap().is_empty());
        sink.release().await.unwrap();
        assert_eq!(*batches.lock().unwrap(), vec![vec![1, 2, 3, 4]]);
        for seq in 1..=4 {
            events.recv().await.unwrap().unwrap();
            assert_eq!(events.seq(), seq);
        }
        // Outside a hold, one write per item; a hold never outlives a send
        // made without one (the held items go first, in order).
        sink.hold();
        sink.chunk(Chunk::Text("d".into())).await.unwrap();
        sink.holding = false;
        sink.finish(finished()).await.unwrap();
        assert_eq!(
            *batches.lock().unwrap(),
            vec![vec![1, 2, 3, 4], vec![5], vec![6]]
        );
        // At most MAX_HELD are held (the caller reads on meanwhile).
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        sink.hold();
        for _ in 0..MAX_HELD + 1 {
            sink.chunk(Chunk::Text("e".into())).await.unwrap();
        }
        assert_eq!(batches.lock().unwrap().last().map(Vec::len), Some(MAX_HELD));
    }

    /// A current-thread runtime: every sink below borrows from one
    /// thread's spare lists.
    #[tokio::test(flavor = "current_thread")]
    async fn a_held_list_is_lent_by_the_thread_and_given_back_on_release() {
        let spare = || HELD.with(Spares::len);
        let clear = || HELD.with(|s| (0..s.len()).for_each(|_| drop(s.take())));
        clear();
        let (mut first, mut events) = channel(SendLimits::default(), Delivery::Final);
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        let batches = Arc::new(Mutex::new(Vec::new()));
        first.set_tee(Box::new(Batches(batches.clone())), false);
        first.begin_attempt(started(1));
        first.hold();
        for t in ["a", "b", "c"] {
            first.chunk(Chunk::Text(t.into())).await.unwrap();
        }
        let grown = first.held.as_ptr();
        first.release().await.unwrap();
        assert_eq!(first.held.capacity(), 0, "a released sink keeps no list");
        assert_eq!(spare(), 1);
        // The next stream's hold gets that list, grown, with no allocation.
        let (mut second, mut events) = channel(SendLimits::default(), Delivery::Final);
        tokio::spawn(async move { while events.recv().await.is_some() {} });
        second.set_tee(Box::new(Batches(batches.clone())), false);
        second.begin_attempt(started(1));
        second.hold();
        assert_eq!(spare(), 0);
        assert_eq!(second.held.as_ptr(), grown);
        assert!(second.held.capacity() >= 4);
        // A hold with nothing to write gives it back too.
        second.release().await.unwrap();
        assert_eq!((second.held.capacity(), spare()), (0, 1));
        // The thread keeps a bounded number of spares.
        for _ in 0..POOLED_HELD + 3 {
            spares::give(&HELD, Vec::with_capacity(4));
        }
        assert_eq!(spare(), POOLED_HELD);
        clear();
    }

    #[tokio::test]
    async fn a_stream_without_a_journal_holds_nothing() {
        let (mut sink, mut events) = channel(SendLimits::default(), Delivery::Final);
        sink.begin_attempt(started(1));
        sink.hold();
        sink.chunk(Chunk::Text("a".into())).await.unwrap();
        assert!(events.rx.try_recv().is_ok(), "handed out at once");
    }

    #[tokio::test]
    async fn a_stream_past_its_journal_bound_finishes_unresumable() {
        let (mut sink, mut events) = channel(SendLimits::default(), Delivery::Final);
        let kept = Arc::new(Mutex::new(Vec::new()));
        sink.set_tee(
            Box::new(Kept {
                items: kept,
                room: 2,
            }),
            false,
        );
        sink.begin_attempt(started(1));
        for t in ["a", "b", "c"] {
            sink.chunk(Chunk::Text(t.into())).await.unwrap();
        }
        sink.finish(finished()).await.unwrap();
        drop(sink);
        let mut last = None;
        while let Some(item) = events.recv().await {
            last = Some(item.unwrap());
        }
        assert!(matches!(last, Some(Event::Finished(f)) if !f.resumable));
    }

    #[tokio::test]
    async fn a_detached_stream_finishes_into_its_journal_after_the_caller_hangs_up() {
        let (mut sink, events) = channel(SendLimits::default(), Delivery::Final);
        let kept = Arc::new(Mutex::new(Vec::new()));
        sink.set_tee(
            Box::new(Kept {
                items: kept.clone(),
                room: 10,
            }),
            true,
        );
        sink.begin_attempt(started(1));
        sink.chunk(Chunk::Text("a".into())).await.unwrap();
        drop(events);
        assert!(!sink.is_closed(), "the request runs on");
        sink.chunk(Chunk::Text("b".into())).await.unwrap();
        sink.finish(finished()).await.unwrap();
        assert_eq!(kept.lock().unwrap().len(), 4, "every item is journaled");

        // Without the option (or without a journal) the request ends.
        let (mut sink, events) = channel(SendLimits::default(), Delivery::Final);
        sink.set_tee(
            Box::new(Kept {
                items: Arc::default(),
                room: 10,
            }),
            false,
        );
        drop(events);
        assert!(sink.is_closed());
        sink.begin_attempt(started(1));
        assert_eq!(sink.chunk(Chunk::Text("x".into())).await, Err(ClientGone));
    }

    #[tokio::test]
    async fn a_caller_that_went_away_is_seen() {
        let (tx, rx) = mpsc::channel(1);
        let mut sink = EventSink::new(tx, Delivery::Resettable);
        drop(rx);
        assert!(sink.is_closed());
        sink.begin_attempt(started(1));
        assert_eq!(sink.chunk(Chunk::Text("x".into())).await, Err(ClientGone));
        // A discarding sink (synthetic probes) never reports the caller gone.
        let mut discard = EventSink::discard();
        discard.begin_attempt(started(1));
        assert!(discard.chunk(Chunk::Text("x".into())).await.is_ok());
        assert!(!discard.is_closed());
    }
}

#[cfg(test)]
mod size {
    /// Every open stream holds its channel's blocks of 32 slots of this
    /// size: its large events and its error are boxed (48 bytes; 136
    /// before).
    #[test]
    fn a_channel_slot_stays_small() {
        assert!(
            std::mem::size_of::<super::Slot>() <= 48,
            "{}",
            std::mem::size_of::<super::Slot>()
        );
    }
}
