//! The event sink: the request task's end of the bounded channel to the
//! caller. It holds back `Started` until the first chunk of an attempt (so a
//! failure before it stays invisible and can fail over), knows whether output
//! was committed, and notices when the caller went away.

use tokio::sync::mpsc;

use crate::chat::{Chunk, FinishReason, Usage};
use crate::error::RequestError;

/// Which rung of the degradation ladder served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Tier {
    Primary,
    Fallback,
    Downshift,
    Cache,
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
            Tier::Queued => "queued",
            Tier::Refused => "refused",
        }
    }
}

/// Announces the attempt whose output follows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Started {
    pub provider: String,
    pub model: String,
    pub attempt: u32,
    pub tier: Tier,
    pub request_id: String,
}

/// The last event of a served request.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Finished {
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub usage_estimated: bool,
    pub provider: String,
    pub model: String,
    pub tier: Tier,
    pub attempts: u32,
    pub request_id: String,
    pub upstream_request_id: Option<String>,
    /// Replayed from an idempotency record, not generated now.
    pub replayed: bool,
    /// For a cached answer: how old it is.
    pub cache_age: Option<std::time::Duration>,
    /// What the serving attempt cost, from the target's price table.
    pub cost_usd: f64,
}

/// What flows to the caller, in order: `Started`, chunks, then `Finished`
/// (or `Reset` and a new `Started`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Event {
    Started(Started),
    Chunk(Chunk),
    Reset {
        reason: String,
        failed_attempt: u32,
    },
    Finished(Finished),
    /// The `queue` rung accepted the request as a job (the last event).
    Queued(QueuedJob),
}

/// A job accepted for a request, with its place in the queue.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct QueuedJob {
    pub record: crate::queue::JobRecord,
    pub position: u64,
    pub eta: std::time::Duration,
}

/// One item of the channel: an event, or the terminal error.
pub type Item = Result<Event, RequestError>;

/// The caller hung up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientGone;

/// The request task's side of the channel.
pub struct EventSink {
    /// `None` for a sink that discards everything (synthetic probes).
    tx: Option<mpsc::Sender<Item>>,
    /// `Started` of the current attempt, sent with its first chunk.
    pending_start: Option<Started>,
    /// Chunks forwarded in the current attempt.
    attempt_chunks: u32,
    /// Any event reached the caller (the gRPC response headers are out).
    committed: bool,
    /// Characters of output forwarded in the current attempt (usage estimates).
    attempt_chars: usize,
    /// The caller buffers the whole answer (unary): partial output can be
    /// discarded with a `Reset`, so nothing is ever committed.
    buffered: bool,
    /// Events of the current answer, kept for the idempotency record and cache.
    recording: Option<Vec<Event>>,
    /// Called with the recorded answer just before `Finished` is sent, so a
    /// duplicate arriving right after the caller's answer already finds it.
    on_finish: Option<FinishHook>,
}

/// Stores a finished answer (idempotency record, response cache).
pub type FinishHook =
    Box<dyn FnOnce(Vec<Event>) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>;

impl EventSink {
    pub fn new(tx: mpsc::Sender<Item>, buffered: bool) -> Self {
        EventSink {
            tx: Some(tx),
            pending_start: None,
            attempt_chunks: 0,
            committed: false,
            attempt_chars: 0,
            buffered,
            recording: None,
            on_finish: None,
        }
    }

    /// A sink with no caller behind it: output is counted and dropped, and it
    /// never reports the caller gone.
    pub fn discard() -> Self {
        EventSink {
            tx: None,
            pending_start: None,
            attempt_chunks: 0,
            committed: false,
            attempt_chars: 0,
            buffered: true,
            recording: None,
            on_finish: None,
        }
    }

    /// Begins a new attempt; `Started` is sent with its first chunk.
    pub fn begin_attempt(&mut self, started: Started) {
        self.pending_start = Some(started);
        self.attempt_chunks = 0;
        self.attempt_chars = 0;
    }

    /// Forwards one chunk (after the pending `Started`).
    pub async fn chunk(&mut self, chunk: Chunk) -> Result<(), ClientGone> {
        if let Some(started) = self.pending_start.take() {
            self.send(Event::Started(started)).await?;
        }
        self.attempt_chars += match &chunk {
            Chunk::Text(t) => t.len(),
            Chunk::ToolCall { arguments, .. } => arguments.len(),
        };
        self.attempt_chunks += 1;
        self.send(Event::Chunk(chunk)).await
    }

    /// Tells the caller to discard the failed attempt's output.
    pub async fn reset(&mut self, reason: String, failed_attempt: u32) -> Result<(), ClientGone> {
        self.send(Event::Reset {
            reason,
            failed_attempt,
        })
        .await
    }

    /// Sends the final event (and `Started` if the answer had no chunk).
    pub async fn finish(&mut self, finished: Finished) -> Result<(), ClientGone> {
        if let Some(started) = self.pending_start.take() {
            self.send(Event::Started(started)).await?;
        }
        self.send(Event::Finished(finished)).await
    }

    /// Keeps a copy of the answer's events (a `Reset` starts over) and hands
    /// it to `on_finish` right before the answer's `Finished` goes out.
    pub fn record(&mut self, on_finish: FinishHook) {
        self.recording = Some(Vec::new());
        self.on_finish = Some(on_finish);
    }

    /// Sends a stored event as is.
    pub async fn replay(&mut self, event: Event) -> Result<(), ClientGone> {
        self.send(event).await
    }

    /// Answers with a job instead of tokens (the `queue` rung).
    pub async fn queued(&mut self, job: QueuedJob) -> Result<(), ClientGone> {
        self.pending_start = None;
        self.send(Event::Queued(job)).await
    }

    /// Ends the request with an error.
    pub async fn fail(&mut self, error: RequestError) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(Err(error)).await;
        }
    }

    /// Output of the current attempt reached a streaming caller: the attempt
    /// can no longer be replaced transparently.
    pub fn committed(&self) -> bool {
        !self.buffered && self.committed
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

    /// Resolves when the caller has gone away.
    pub async fn closed(&self) {
        match &self.tx {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    }

    pub fn is_closed(&self) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.is_closed())
    }

    async fn send(&mut self, event: Event) -> Result<(), ClientGone> {
        if let Some(recording) = &mut self.recording {
            if matches!(event, Event::Reset { .. }) {
                recording.clear();
            } else {
                recording.push(event.clone());
            }
            if matches!(event, Event::Finished(_)) {
                if let (Some(hook), Some(events)) = (self.on_finish.take(), self.recording.take()) {
                    hook(events).await;
                }
            }
        }
        if let Some(tx) = &self.tx {
            tx.send(Ok(event)).await.map_err(|_| ClientGone)?;
        }
        self.committed = true;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn started(attempt: u32) -> Started {
        Started {
            provider: "p".into(),
            model: "m".into(),
            attempt,
            tier: Tier::Primary,
            request_id: "r".into(),
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
            cost_usd: 0.0,
        }
    }

    fn drain(rx: &mut mpsc::Receiver<Item>) -> Vec<Event> {
        let mut out = Vec::new();
        while let Ok(item) = rx.try_recv() {
            out.push(item.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn started_waits_for_the_first_chunk_so_a_failed_attempt_is_invisible() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut sink = EventSink::new(tx, false);
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

    #[tokio::test]
    async fn a_buffered_caller_is_never_committed() {
        let (tx, _rx) = mpsc::channel(16);
        let mut sink = EventSink::new(tx, true);
        sink.begin_attempt(started(1));
        sink.chunk(Chunk::Text("partial".into())).await.unwrap();
        assert!(!sink.committed(), "a unary caller can still be failed over");
        assert!(sink.attempt_had_output(), "but it must be told to reset");
    }

    #[tokio::test]
    async fn the_recording_restarts_at_a_reset_and_is_stored_before_finished() {
        let (tx, rx) = mpsc::channel(16);
        let rx = Arc::new(Mutex::new(rx));
        let mut sink = EventSink::new(tx, false);
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

    #[tokio::test]
    async fn a_caller_that_went_away_is_seen() {
        let (tx, rx) = mpsc::channel(1);
        let mut sink = EventSink::new(tx, false);
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
