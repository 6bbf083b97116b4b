//! A stream's resume journal, seen from the request path: the tee that
//! writes every item a journaled stream sends (`JournalTee`, renewing its
//! owner's lease while it lives), what one journaled item is on the wire
//! (`encode`, `decode`), and the `Follower`, which streams a journal back to a
//! caller that reconnected: what it holds, then the live tail, then its end.
//! The store itself (embedded or Redis, bounds, leases, tenants) is
//! `state::journal`.

use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

use crate::error::RequestError;
use crate::sink::{Event, EventSink, Item, Tee};
use crate::state::journal::{
    Appended, Appends, Journal, JournalError, Kept, Owner, Reader, ResumeToken, Tail,
};

/// The longest a follower waits on the tail before it looks again: how
/// late, past its lease, it notices that a stream's writer died.
const FOLLOW_WAIT: Duration = Duration::from_secs(1);
use crate::state::{StateError, StateFaults};

/// Names the error table's row of a request error (`api::errors::reason`),
/// given by the door that builds the tee: a journaled error is replayed
/// with the reason it was first told with.
pub type Reason = fn(&RequestError) -> &'static str;

/// One journaled item, as stored. `E` is the event, owned when read back
/// and borrowed when written (no copy of each event on the stream's path).
#[derive(serde::Serialize, serde::Deserialize)]
enum Record<E> {
    Event(E),
    Error {
        reason: String,
        message: String,
        #[serde(default)]
        retry_after_ms: Option<u64>,
    },
}

/// What `item` is stored as.
fn record(item: &Item, reason: Reason) -> Record<&Event> {
    match item {
        Ok(event) => Record::Event(event),
        Err(e) => Record::Error {
            reason: reason(e).to_string(),
            message: e.to_string(),
            retry_after_ms: e.retry_after().map(|d| d.as_millis() as u64),
        },
    }
}

/// The stored form of `item`.
pub fn encode(item: &Item, reason: Reason) -> Result<Bytes, serde_json::Error> {
    // Written into this thread's buffer and copied out at its exact size:
    // one allocation per item (`to_vec` grew a vector, and a `Bytes` made
    // from a vector with room to spare allocates its owner too).
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        let written = serde_json::to_writer(&mut *buf, &record(item, reason))
            .map(|()| Bytes::copy_from_slice(buf));
        if buf.capacity() > MAX_SCRATCH {
            *buf = Vec::new();
        }
        written
    })
}

/// The stored form of each of `items`, numbered on from the first's
/// number: written one after another, each after its length, into this
/// thread's buffer and copied out once (`Appends`): one allocation a
/// batch, whatever its size; a batch of one is that item's encoding.
pub fn encode_batch(items: &[(u64, Item)], reason: Reason) -> Result<Appends, serde_json::Error> {
    if let [(seq, item)] = items {
        return encode(item, reason).map(|bytes| Appends::one(*seq, bytes));
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        for (_, item) in items {
            let written = Appends::write(buf, |out| {
                serde_json::to_writer(&mut *out, &record(item, reason))
            });
            if let Err(e) = written {
                buf.clear();
                return Err(e);
            }
        }
        let all = Bytes::copy_from_slice(buf);
        if buf.capacity() > MAX_SCRATCH {
            *buf = Vec::new();
        }
        let first = items.first().map_or(0, |(seq, _)| *seq);
        let count = u32::try_from(items.len()).unwrap_or(u32::MAX);
        Ok(Appends::framed(first, count, all))
    })
}

thread_local! {
    /// `encode`'s buffer, reused by every item on this thread.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A larger buffer (one item was large) is not kept.
const MAX_SCRATCH: usize = 64 * 1024;

/// The item a stored record was (an unreadable one ends the stream with
/// INTERNAL rather than passing for an event).
pub fn decode(bytes: &[u8]) -> Item {
    match serde_json::from_slice::<Record<Event>>(bytes) {
        Ok(Record::Event(event)) => Ok(event),
        Ok(Record::Error {
            reason,
            message,
            retry_after_ms,
        }) => Err(RequestError::Journaled {
            reason,
            message,
            retry_after: retry_after_ms.map(Duration::from_millis),
        }),
        Err(e) => Err(RequestError::Journaled {
            reason: "INTERNAL".into(),
            message: format!("a journaled event is unreadable: {e}"),
            retry_after: None,
        }),
    }
}

/// Writes a stream's items to its journal, as their owner.
pub struct JournalTee {
    journal: Journal,
    token: ResumeToken,
    owner: Owner,
    reason: Reason,
    /// Every item so far is stored.
    whole: bool,
    /// Keeps the owner's lease while the stream lives (dropped with the tee).
    _lease: Kept,
    /// This stream's place among the replica's journaled streams
    /// (`resume.max_streams`), held while it lives.
    _slot: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl JournalTee {
    /// Opens a journal for one of `tenant`'s streams; `None` (the stream
    /// goes unresumable, and says so in `Finished.resumable`) when the
    /// store has no room or cannot be reached.
    pub async fn open(
        journal: &Journal,
        tenant: &str,
        request: &[u8],
        lease: Duration,
        faults: Arc<StateFaults>,
        reason: Reason,
    ) -> Option<JournalTee> {
        let token = ResumeToken::generate();
        let owner = Owner::generate();
        if let Err(e) = journal.open(tenant, &token, &owner, request).await {
            tracing::debug!(error = %e, "the stream is not journaled");
            return None;
        }
        Some(JournalTee::adopt(
            journal, token, owner, lease, faults, reason,
        ))
    }

    /// Writes a journal `owner` already holds (a takeover's claim).
    pub fn adopt(
        journal: &Journal,
        token: ResumeToken,
        owner: Owner,
        lease: Duration,
        faults: Arc<StateFaults>,
        reason: Reason,
    ) -> JournalTee {
        let kept = journal.keep(&token, &owner, lease, faults);
        JournalTee {
            journal: journal.clone(),
            token,
            owner,
            reason,
            whole: true,
            _lease: kept,
            _slot: None,
        }
    }

    /// Holds `slot` for as long as the stream is journaled.
    pub fn holding(mut self, slot: tokio::sync::OwnedSemaphorePermit) -> JournalTee {
        self._slot = Some(slot);
        self
    }
}

/// The stream's last item: `Finished`, `Queued` or an error.
fn ends(item: &Item) -> bool {
    matches!(item, Err(_) | Ok(Event::Finished(_)) | Ok(Event::Queued(_)))
}

impl JournalTee {
    /// Takes what an append answered: the stream stays whole only while
    /// every item was stored.
    fn stored(&mut self, stored: Result<Appended, JournalError>) {
        match stored {
            Ok(Appended::Stored) => {}
            Ok(Appended::NotResumable(bound)) => {
                tracing::info!(
                    bound = bound.key(),
                    "the stream passed its journal bound: it is not resumable"
                );
                self.whole = false;
            }
            Err(e) => {
                tracing::debug!(error = %e, "journal append failed: the stream is not resumable");
                self.whole = false;
            }
        }
    }
}

impl JournalTee {
    /// Appends `events` (finishing the journal after them when the last
    /// ends the stream). In process that is done before this returns, and
    /// the future handed back is `Done`, boxed with no allocation; on Redis
    /// it is the round trip.
    fn put(&mut self, events: Result<Appends, serde_json::Error>, last: bool) -> BoxFuture<'_, ()> {
        let events = events.map_err(|e| {
            JournalError::Unavailable(StateError::Unavailable(format!(
                "an event could not be encoded: {e}"
            )))
        });
        if let Journal::Embedded(j) = &self.journal {
            let j = j.clone();
            let stored = events.and_then(|e| j.append_many(&self.token, &self.owner, e));
            self.stored(stored);
            if last && self.whole {
                self.finished(j.finish(&self.token, &self.owner));
            }
            return Box::pin(Done);
        }
        Box::pin(async move {
            let stored = match events {
                Ok(e) => self.journal.append_many(&self.token, &self.owner, e).await,
                Err(e) => Err(e),
            };
            self.stored(stored);
            if last && self.whole {
                let finished = self.journal.finish(&self.token, &self.owner).await;
                self.finished(finished);
            }
        })
    }

    fn finished(&self, finished: Result<(), JournalError>) {
        if let Err(e) = finished {
            tracing::debug!(error = %e, "journal finish failed");
        }
    }
}

/// A future already complete. Of no size, so boxing it allocates nothing.
struct Done;

impl std::future::Future for Done {
    type Output = ();

    fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        std::task::Poll::Ready(())
    }
}

impl Tee for JournalTee {
    fn token(&self) -> &Arc<str> {
        self.token.shared()
    }

    fn write<'a>(&'a mut self, seq: u64, item: &'a Item) -> BoxFuture<'a, ()> {
        if !self.whole {
            return Box::pin(Done);
        }
        let events = encode(item, self.reason).map(|bytes| Appends::one(seq, bytes));
        self.put(events, ends(item))
    }

    fn write_batch<'a>(&'a mut self, items: &'a [(u64, Item)]) -> BoxFuture<'a, ()> {
        if !self.whole || items.is_empty() {
            return Box::pin(Done);
        }
        let last = items.last().is_some_and(|(_, item)| ends(item));
        self.put(encode_batch(items, self.reason), last)
    }

    fn whole(&self) -> bool {
        self.whole
    }

    fn release(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Err(e) = self.journal.release(&self.token, &self.owner).await {
                tracing::debug!(error = %e, "journal release failed: its lease lapses instead");
            }
        })
    }
}

/// Why a journal could not be read, as the caller learns it.
pub fn resume_error(e: JournalError) -> RequestError {
    match e {
        JournalError::NotFound => RequestError::ResumeNotFound,
        JournalError::Expired => RequestError::ResumeExpired,
        JournalError::NotResumable(bound) => RequestError::NotResumable(bound.key()),
        JournalError::Unavailable(e) => {
            RequestError::StateUnavailable(format!("the resume journal cannot be read: {e}"))
        }
        other => RequestError::Unavailable(format!("the resume journal: {other}")),
    }
}

/// A journal being streamed back, its token already checked.
pub struct Follower {
    reader: Reader,
    tenant: String,
    token: ResumeToken,
}

impl Follower {
    /// Checks the token against `tenant` before anything streams: another
    /// tenant's, an unknown or an expired one is refused here.
    pub async fn open(
        journal: &Journal,
        tenant: &str,
        token: &ResumeToken,
        after_seq: u64,
    ) -> Result<Follower, RequestError> {
        let reader = journal
            .reader(tenant, token, after_seq)
            .await
            .map_err(resume_error)?;
        Ok(Follower {
            reader,
            tenant: tenant.to_string(),
            token: token.clone(),
        })
    }

    /// Whose journal, and which.
    pub fn names(&self) -> (&str, &ResumeToken) {
        (&self.tenant, &self.token)
    }

    /// Streams every item to `sink` until the stream's last one; a writer
    /// gone before it is RESUME_OWNER_GONE (run again after a takeover to
    /// read on from where it stopped).
    pub async fn run(&mut self, sink: &mut EventSink) -> Result<(), RequestError> {
        loop {
            let from = self.reader.position();
            let batch = self.reader.next(FOLLOW_WAIT).await.map_err(resume_error)?;
            for entry in &batch.events {
                let item = decode(&entry.event);
                let last = item.is_err();
                if sink.forward(entry.seq, item).await.is_err() || last {
                    return Ok(());
                }
            }
            if batch.ends_stream(from) {
                return Ok(());
            }
            if batch.tail == Tail::Orphaned {
                return Err(RequestError::ResumeOwnerGone);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::chat::Chunk;
    use crate::sink::{channel, Delivery, SendLimits};
    use crate::state::journal::Bounds;

    fn reason(e: &RequestError) -> &'static str {
        match e {
            RequestError::DeadlineExceeded { .. } => "DEADLINE_EXCEEDED",
            _ => "INTERNAL",
        }
    }

    #[test]
    fn an_item_comes_back_as_it_went_in_and_an_error_keeps_its_reason() {
        let chunk: Item = Ok(Event::Chunk(Chunk::Text("hé".into())));
        assert_eq!(decode(&encode(&chunk, reason).unwrap()), chunk);
        let late: Item = Err(RequestError::DeadlineExceeded { attempts: 2 });
        match decode(&encode(&late, reason).unwrap()) {
            Err(RequestError::Journaled {
                reason, message, ..
            }) => {
                assert_eq!(reason, "DEADLINE_EXCEEDED");
                assert_eq!(message, "deadline exceeded after 2 upstream attempt(s)");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            decode(b"{not json"),
            Err(RequestError::Journaled { reason, .. }) if reason == "INTERNAL"
        ));
    }

    #[test]
    fn a_batch_is_stored_as_its_items_one_by_one_would_be() {
        let items: Vec<(u64, Item)> = vec![
            (4, Ok(Event::Chunk(Chunk::Text("hé".into())))),
            (5, Ok(Event::Chunk(Chunk::Text(Default::default())))),
            (6, Err(RequestError::DeadlineExceeded { attempts: 2 })),
        ];
        let batch = encode_batch(&items, reason).unwrap();
        let seqs: Vec<u64> = batch.events().map(|(seq, _)| seq).collect();
        assert_eq!(seqs, [4, 5, 6]);
        for ((_, item), (_, bytes)) in items.iter().zip(batch.events()) {
            assert_eq!(bytes, &encode(item, reason).unwrap()[..]);
        }
        let own: u64 = items
            .iter()
            .map(|(_, item)| encode(item, reason).unwrap().len() as u64)
            .sum();
        assert_eq!(batch.event_bytes(), own, "their own bytes, not the lengths");
        assert!(encode_batch(&[], reason).unwrap().is_empty());
        // One item is its encoding alone.
        let one = encode_batch(&items[..1], reason).unwrap();
        assert_eq!(one, Appends::one(4, encode(&items[0].1, reason).unwrap()));
    }

    #[tokio::test]
    async fn a_follower_gets_every_item_after_its_position_under_the_same_numbers() {
        let journal = Journal::embedded(Bounds {
            ttl: Duration::from_secs(60),
            max_bytes_per_stream: 1 << 20,
            max_total_bytes: 1 << 24,
            lease: Duration::from_secs(20),
        });
        let faults = StateFaults::new(Arc::default());
        let tee = JournalTee::open(&journal, "t", b"", Duration::from_secs(20), faults, reason)
            .await
            .unwrap();
        let token = ResumeToken::parse(tee.token()).unwrap();
        let (mut writer, _caller) = channel(SendLimits::default(), Delivery::Final);
        writer.set_tee(Box::new(tee), false);
        for t in ["a", "b", "c"] {
            writer
                .replay(Event::Chunk(Chunk::Text(t.into())))
                .await
                .unwrap();
        }
        let follower = {
            let (journal, token) = (journal.clone(), token.clone());
            tokio::spawn(async move {
                let (mut sink, mut events) = channel(SendLimits::default(), Delivery::Final);
                let run = tokio::spawn(async move {
                    let mut follower = Follower::open(&journal, "t", &token, 1).await.unwrap();
                    follower.run(&mut sink).await.unwrap();
                });
                let mut got = Vec::new();
                while let Some(item) = events.recv().await {
                    got.push((events.seq(), item));
                }
                run.await.unwrap();
                got
            })
        };
        // The live tail reaches the follower, then the stream's end.
        writer
            .fail(RequestError::DeadlineExceeded { attempts: 1 })
            .await;
        let got = follower.await.unwrap();
        assert_eq!(
            got.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
            [2, 3, 4],
            "after the caller's position, numbered as first sent"
        );
        assert_eq!(got[0].1, Ok(Event::Chunk(Chunk::Text("b".into()))));
        assert!(
            matches!(&got[2].1, Err(RequestError::Journaled { reason, .. }) if reason == "DEADLINE_EXCEEDED")
        );

        // Another tenant's follower is refused before anything streams.
        assert_eq!(
            Follower::open(&journal, "other", &token, 0).await.err(),
            Some(RequestError::ResumeNotFound)
        );
    }
}
