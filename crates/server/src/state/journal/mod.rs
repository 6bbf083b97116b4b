//! The resume journal of streamed completions, in one home: this face
//! (`Journal`, its `Reader` and the vocabulary both backends speak), the
//! in-process journal (`embedded`: bounded by `resume.max_total_bytes`, a
//! `watch` per stream for the live tail) and the fleet's on Redis (`redis`:
//! a Redis Stream per request and a small metadata hash, one Lua script per
//! mutation, the tail read with `XREAD BLOCK`).
//!
//! A journal holds one stream's events as opaque encoded bytes, numbered
//! from 1 in order, under a random `ResumeToken` bound to its tenant:
//! another tenant's token is `NotFound`, never the stream; a token past its
//! lifetime (`resume.ttl` after the last write) is `Expired` for as long
//! again, then `NotFound`. Past `resume.max_bytes_per_stream` (or, embedded,
//! `resume.max_total_bytes`) the append that crossed the bound says so, the
//! journal drops its events and is not resumable from then on (later
//! appends are refused without storing anything); nothing is cut silently.
//!
//! The generation writing a journal is its `Owner`, holding a lease
//! (`state.lease`) it renews; a lapsed lease (the replica died) lets a
//! resume on another replica `claim` the journal and continue the stream,
//! and the old owner's late appends are then `Fenced`. On Redis the lease
//! is clocked by Redis `TIME`. Redis failures are `Unavailable`, counted
//! under `switchyard_state_errors_total{function="journal"}`; what the
//! request task does then (stream on, unresumable) is its decision.
//!
//! The request's sink writes the journal through `task::journal`'s tee; the
//! doors read it back to resume.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;

use crate::config::ResumeConfig;
use crate::state::redis::lease::Renewal;
use crate::state::redis::Redis;
use crate::state::StateError;
use crate::state::StateFaults;

pub mod embedded;
mod redis;

pub use self::redis::RedisJournal;
pub use embedded::EmbeddedJournal;

/// Most events one read returns.
pub const MAX_BATCH: usize = 256;
/// The longest one read waits for the live tail.
pub const MAX_WAIT: Duration = Duration::from_secs(30);

/// A journal's lifetime and bounds, and the owner's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// A journal lives this long after its last write (and answers
    /// `Expired` for as long again).
    pub ttl: Duration,
    pub max_bytes_per_stream: u64,
    /// Every journal of the process together (embedded only).
    pub max_total_bytes: u64,
    /// An owner that stops renewing loses the journal this long after its
    /// last renewal.
    pub lease: Duration,
}

impl Bounds {
    pub fn of(resume: &ResumeConfig, lease: Duration) -> Bounds {
        Bounds {
            ttl: resume.ttl,
            max_bytes_per_stream: resume.max_bytes_per_stream as u64,
            max_total_bytes: resume.max_total_bytes as u64,
            lease,
        }
    }
}

/// The bound a journal passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `resume.max_bytes_per_stream`.
    PerStream,
    /// `resume.max_total_bytes` (embedded).
    Total,
}

impl Bound {
    /// The config key that sets it.
    pub fn key(self) -> &'static str {
        match self {
            Bound::PerStream => "resume.max_bytes_per_stream",
            Bound::Total => "resume.max_total_bytes",
        }
    }
}

/// Names one stream's journal: 128 random bits, URL-safe base64 (22
/// characters), carrying nothing else. It is a capability: never logged.
/// Shared, not copied, by the stream's sink, tee and journal.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ResumeToken(Arc<str>);

/// Characters of a token.
const TOKEN_LEN: usize = 22;

impl ResumeToken {
    /// The token's text, shared rather than copied.
    pub fn shared(&self) -> &Arc<str> {
        &self.0
    }

    pub fn generate() -> ResumeToken {
        let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let bits: [u8; 16] = rand::random();
        // Encoded on the stack and copied once.
        let mut text = [0u8; TOKEN_LEN];
        if let Ok(TOKEN_LEN) = engine.encode_slice(bits, &mut text) {
            if let Ok(text) = std::str::from_utf8(&text) {
                return ResumeToken(Arc::from(text));
            }
        }
        ResumeToken(Arc::from(engine.encode(bits)))
    }

    /// A token a caller sent, if it has a token's shape.
    pub fn parse(text: &str) -> Option<ResumeToken> {
        let shaped = text.len() == TOKEN_LEN
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(text)
                .is_ok_and(|b| b.len() == 16);
        shaped.then(|| ResumeToken(Arc::from(text)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for ResumeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ResumeToken(..)")
    }
}

/// The generation writing a journal: one per request task, a new one per
/// takeover. 32 hex digits held inline: no allocation to make or copy one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner([u8; 32]);

impl Owner {
    pub fn generate() -> Owner {
        let mut text = [0; 32];
        crate::state::token_in(&mut text);
        Owner(text)
    }

    pub fn as_str(&self) -> &str {
        // `token_in` writes ASCII hex digits only.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

/// One journaled event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub seq: u64,
    /// The event as the tee encoded it.
    pub event: Bytes,
}

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    Stored,
    /// Not stored: the journal passed (now, or before) this bound and is
    /// not resumable; tell the caller `Finished.resumable = false`.
    NotResumable(Bound),
}

/// The journal's state as a reader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tail {
    /// Its owner holds the lease: more events may come.
    Live,
    /// Not finished and its owner's lease lapsed: `claim` it to continue.
    Orphaned,
    /// Its owner finished it: no event follows `last_seq`.
    Finished,
}

/// One read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Events after the position read from, in order, at most `MAX_BATCH`.
    pub events: Vec<Entry>,
    pub tail: Tail,
    /// The last event the journal holds.
    pub last_seq: u64,
}

impl Batch {
    /// The events read reach the end of a finished stream.
    pub fn ends_stream(&self, after_seq: u64) -> bool {
        let reached = self.events.last().map_or(after_seq, |e| e.seq);
        self.tail == Tail::Finished && reached >= self.last_seq
    }
}

/// What a takeover found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// The journal is the claimer's now; the stream continues after `last_seq`.
    Taken { last_seq: u64 },
    /// Another owner's lease is live: read the tail instead.
    Held,
    /// Finished: nothing to continue, read it.
    Finished,
}

/// Why a journal call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// No such token for this tenant (or it expired long ago).
    #[error("no such resume token")]
    NotFound,
    /// The token's journal lived out `resume.ttl` (RESUME_EXPIRED).
    #[error("the resume token expired")]
    Expired,
    /// The journal passed a bound and holds nothing to resume.
    #[error("the stream is not resumable: it passed {}", .0.key())]
    NotResumable(Bound),
    /// Another owner took the journal over.
    #[error("the journal has another owner")]
    Fenced,
    #[error("event {got} out of order: the next is {expected}")]
    OutOfOrder { expected: u64, got: u64 },
    /// Appended to after its owner finished it.
    #[error("the journal is finished")]
    Finished,
    #[error(transparent)]
    Unavailable(#[from] StateError),
}

/// Events that were ready together, numbered on from `first_seq`, as the
/// tee encoded them, in one buffer: one event is its encoding alone; more
/// are each written after their length (4 bytes, little-endian). A batch
/// is one allocation whatever its size (a slice of a shared buffer per
/// event would cost one more), and the in-process journal keeps it whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appends {
    first_seq: u64,
    count: u32,
    bytes: Bytes,
}

/// The length written before each event of a batch of more than one.
pub const LENGTH_BYTES: usize = 4;

impl Appends {
    /// One event.
    pub fn one(seq: u64, event: Bytes) -> Appends {
        Appends {
            first_seq: seq,
            count: 1,
            bytes: event,
        }
    }

    /// `count` events from `first_seq`, written by [`Self::write`] into
    /// `bytes` (one event: its encoding alone).
    pub fn framed(first_seq: u64, count: u32, bytes: Bytes) -> Appends {
        Appends {
            first_seq,
            count,
            bytes,
        }
    }

    /// Writes one event of a batch of more than one into `out`: its
    /// length, then what `encode` writes. An event is far under 4 GiB (an
    /// attempt's output is cut at 8 MiB: docs/limits.md).
    pub fn write<E>(
        out: &mut Vec<u8>,
        encode: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
    ) -> Result<(), E> {
        let at = out.len();
        out.extend_from_slice(&[0; LENGTH_BYTES]);
        encode(out)?;
        let len = u32::try_from(out.len() - at - LENGTH_BYTES).unwrap_or(u32::MAX);
        out[at..at + LENGTH_BYTES].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }

    /// Events numbered on from the first of `events`, which follow one
    /// another, framed as the tee frames them.
    #[cfg(test)]
    pub fn of(events: &[(u64, Bytes)]) -> Appends {
        match events {
            [(seq, event)] => Appends::one(*seq, event.clone()),
            _ => {
                let mut out = Vec::new();
                for (_, event) in events {
                    let _ = Appends::write(&mut out, |o| {
                        o.extend_from_slice(event);
                        Ok::<(), std::convert::Infallible>(())
                    });
                }
                Appends::framed(
                    events.first().map_or(0, |(seq, _)| *seq),
                    u32::try_from(events.len()).unwrap_or(u32::MAX),
                    Bytes::from(out),
                )
            }
        }
    }

    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    pub fn len(&self) -> usize {
        self.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The buffer as written (what the in-process journal keeps).
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// The events' own bytes, without their lengths.
    pub fn event_bytes(&self) -> u64 {
        if self.count == 1 {
            self.bytes.len() as u64
        } else {
            self.events().map(|(_, e)| e.len() as u64).sum()
        }
    }

    /// Each event, numbered, borrowed from the buffer.
    pub fn events(&self) -> impl Iterator<Item = (u64, &[u8])> + '_ {
        events_in(self.first_seq, self.count, &self.bytes)
    }
}

/// The `count` events numbered on from `first_seq` in `bytes`, as
/// [`Appends`] wrote them; a buffer cut short yields what it holds whole.
pub fn events_in(first_seq: u64, count: u32, bytes: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    let mut rest = bytes;
    (first_seq..first_seq + u64::from(count)).map_while(move |seq| {
        if count == 1 {
            return Some((seq, std::mem::take(&mut rest)));
        }
        let (len, tail) = rest.split_first_chunk::<LENGTH_BYTES>()?;
        let event = tail.get(..u32::from_le_bytes(*len) as usize)?;
        rest = &tail[event.len()..];
        Some((seq, event))
    })
}

/// A writer's lease, kept while this lives (`Journal::keep`).
pub enum Kept {
    Held(embedded::Hold),
    Renewed(Renewal),
}

/// Stream journals: in process, or shared by the fleet on Redis.
#[derive(Clone)]
pub enum Journal {
    Embedded(Arc<EmbeddedJournal>),
    Redis {
        journal: RedisJournal,
        faults: Arc<StateFaults>,
    },
}

impl Journal {
    pub fn embedded(bounds: Bounds) -> Journal {
        Journal::Embedded(Arc::new(EmbeddedJournal::new(bounds)))
    }

    pub fn redis(redis: Redis, faults: Arc<StateFaults>, bounds: Bounds) -> Journal {
        Journal::Redis {
            journal: RedisJournal::new(redis, bounds),
            faults,
        }
    }

    /// Whether `open` keeps the request a stream answers (on Redis, for a
    /// takeover by another replica).
    pub fn keeps_requests(&self) -> bool {
        matches!(self, Journal::Redis { .. })
    }

    /// A Redis failure, counted and logged.
    fn fault(faults: &StateFaults, e: JournalError, consequence: &str) -> JournalError {
        if let JournalError::Unavailable(err) = &e {
            faults.record("journal", err, consequence);
        }
        e
    }

    /// A new journal named `token` (fresh from `ResumeToken::generate`),
    /// owned by `owner` for `tenant`; `NotResumable(Total)` when the process
    /// has no room for one more (stream it unresumable).
    /// `request` is what the stream answers, kept (on Redis) so another
    /// replica can continue the stream when this one dies; an embedded
    /// journal dies with its process and keeps none.
    pub async fn open(
        &self,
        tenant: &str,
        token: &ResumeToken,
        owner: &Owner,
        request: &[u8],
    ) -> Result<(), JournalError> {
        match self {
            Journal::Embedded(j) => j.open(tenant, token, owner),
            Journal::Redis { journal, faults } => journal
                .open(tenant, token, owner, request)
                .await
                .map_err(|e| Self::fault(faults, e, "the stream is not resumable")),
        }
    }

    /// Appends events that were ready together, in one call (one script
    /// on Redis, one lock in process).
    pub async fn append_many(
        &self,
        token: &ResumeToken,
        owner: &Owner,
        events: Appends,
    ) -> Result<Appended, JournalError> {
        match self {
            Journal::Embedded(j) => j.append_many(token, owner, events),
            Journal::Redis { journal, faults } => {
                let borrowed: Vec<(u64, &[u8])> = events.events().collect();
                journal
                    .append_many(token, owner, &borrowed)
                    .await
                    .map_err(|e| Self::fault(faults, e, "the stream is not resumable"))
            }
        }
    }

    /// The request the tenant's stream answers, when the journal keeps it
    /// (Redis): what a new owner continues after a takeover.
    pub async fn request(
        &self,
        tenant: &str,
        token: &ResumeToken,
    ) -> Result<Option<Bytes>, JournalError> {
        match self {
            Journal::Embedded(_) => Ok(None),
            Journal::Redis { journal, faults } => journal
                .request(tenant, token)
                .await
                .map_err(|e| Self::fault(faults, e, "the stream cannot be taken over")),
        }
    }

    /// Marks the stream finished by its owner (readers end after its last event).
    pub async fn finish(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        match self {
            Journal::Embedded(j) => j.finish(token, owner),
            Journal::Redis { journal, faults } => journal
                .finish(token, owner)
                .await
                .map_err(|e| Self::fault(faults, e, "a resume waits for the lease to lapse")),
        }
    }

    /// Extends the owner's lease; `Fenced` once another owner took over.
    pub async fn renew(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        match self {
            Journal::Embedded(j) => j.renew(token, owner),
            Journal::Redis { journal, faults } => journal
                .renew(token, owner)
                .await
                .map_err(|e| Self::fault(faults, e, "the lease may lapse")),
        }
    }

    /// Keeps `owner`'s lease for as long as the returned guard lives: held
    /// in place in process (its writer's life is the lease), renewed every
    /// third of `lease` on Redis, where another replica may take over.
    pub fn keep(
        &self,
        token: &ResumeToken,
        owner: &Owner,
        lease: Duration,
        faults: Arc<StateFaults>,
    ) -> Kept {
        match self {
            Journal::Embedded(j) => Kept::Held(j.hold(token, owner)),
            Journal::Redis { .. } => {
                let (journal, token, owner) = (self.clone(), token.clone(), *owner);
                Kept::Renewed(Renewal::start(faults, "journal", lease, move || {
                    let (journal, token) = (journal.clone(), token.clone());
                    async move {
                        match journal.renew(&token, &owner).await {
                            Ok(()) => Ok(true),
                            Err(JournalError::Unavailable(e)) => Err(e),
                            Err(_) => Ok(false),
                        }
                    }
                }))
            }
        }
    }

    /// Ends the owner's lease now (a draining replica), so a resume on
    /// another replica takes the journal over at once.
    pub async fn release(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        match self {
            Journal::Embedded(j) => j.release(token, owner),
            Journal::Redis { journal, faults } => journal
                .release(token, owner)
                .await
                .map_err(|e| Self::fault(faults, e, "a resume waits for the lease to lapse")),
        }
    }

    /// Takes the journal over for `owner` when its lease lapsed.
    pub async fn claim(
        &self,
        tenant: &str,
        token: &ResumeToken,
        owner: &Owner,
    ) -> Result<Claim, JournalError> {
        match self {
            Journal::Embedded(j) => j.claim(tenant, token, owner),
            Journal::Redis { journal, faults } => journal
                .claim(tenant, token, owner)
                .await
                .map_err(|e| Self::fault(faults, e, "the stream cannot be taken over")),
        }
    }

    /// A reader of the tenant's journal from after `after_seq`: checks the
    /// token now, so a wrong one is refused before anything is streamed.
    pub async fn reader(
        &self,
        tenant: &str,
        token: &ResumeToken,
        after_seq: u64,
    ) -> Result<Reader, JournalError> {
        let mut reader = Reader {
            journal: self.clone(),
            tenant: tenant.to_string(),
            token: token.clone(),
            position: after_seq,
            tail: None,
            pending: None,
        };
        let first = reader.read(Duration::ZERO).await?;
        reader.pending = Some(first);
        Ok(reader)
    }
}

/// Reads one journal in order: what it holds, then the live tail.
pub struct Reader {
    journal: Journal,
    tenant: String,
    token: ResumeToken,
    /// The last event returned.
    position: u64,
    /// The Redis connection the tail waits on (its own: `XREAD BLOCK`
    /// would stall every call sharing a connection).
    tail: Option<self::redis::Tailer>,
    /// The batch read when the reader was made.
    pending: Option<Batch>,
}

impl Reader {
    /// The last event returned so far.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The next events; when there are none yet, waits up to `wait` (at
    /// most `MAX_WAIT`) for the owner to append or finish.
    pub async fn next(&mut self, wait: Duration) -> Result<Batch, JournalError> {
        let batch = match self.pending.take() {
            Some(b) if !b.events.is_empty() || b.tail != Tail::Live => b,
            _ => self.read(wait.min(MAX_WAIT)).await?,
        };
        if let Some(last) = batch.events.last() {
            self.position = last.seq;
        }
        Ok(batch)
    }

    async fn read(&mut self, wait: Duration) -> Result<Batch, JournalError> {
        match &self.journal {
            Journal::Embedded(j) => j.read(&self.tenant, &self.token, self.position, wait).await,
            Journal::Redis { journal, faults } => journal
                .read(
                    &self.tenant,
                    &self.token,
                    self.position,
                    wait,
                    &mut self.tail,
                )
                .await
                .map_err(|e| Journal::fault(faults, e, "the stream cannot be resumed")),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_one_buffer_whose_events_read_back_in_order() {
        let events: Vec<(u64, Bytes)> = vec![
            (7, Bytes::from_static(b"{\"a\":1}")),
            (8, Bytes::new()),
            (9, Bytes::from(vec![b'x'; 300])),
        ];
        let batch = Appends::of(&events);
        assert_eq!((batch.first_seq(), batch.len()), (7, 3));
        let got: Vec<(u64, &[u8])> = batch.events().collect();
        let want: Vec<(u64, &[u8])> = events.iter().map(|(s, e)| (*s, &e[..])).collect();
        assert_eq!(got, want);
        assert_eq!(batch.event_bytes(), 7 + 300);
        let bytes = batch.into_bytes();
        assert_eq!(bytes.len(), 3 * LENGTH_BYTES + 7 + 300);
        // One event is its bytes alone, with no length.
        let one = Appends::of(&events[..1]);
        assert_eq!(one.clone().into_bytes(), events[0].1);
        assert_eq!(one.events().collect::<Vec<_>>(), [(7, &events[0].1[..])]);
        // A buffer cut short yields the events it holds whole, no more.
        let cut: Vec<u64> = events_in(7, 3, &bytes[..bytes.len() - 1])
            .map(|(seq, _)| seq)
            .collect();
        assert_eq!(cut, [7, 8]);
        assert_eq!(events_in(7, 3, &bytes[..2]).count(), 0);
    }

    #[test]
    fn tokens_are_128_random_url_safe_bits_and_parse_back() {
        let a = ResumeToken::generate();
        let b = ResumeToken::generate();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 22);
        assert_eq!(ResumeToken::parse(a.as_str()), Some(a.clone()));
        assert_eq!(ResumeToken::parse(""), None);
        assert_eq!(ResumeToken::parse(&format!("{}x", a.as_str())), None);
        assert_eq!(ResumeToken::parse("aaaaaaaaaaaaaaaaaaaa/+"), None);
        assert_eq!(format!("{a:?}"), "ResumeToken(..)", "never printed");
        let (one, two) = (Owner::generate(), Owner::generate());
        assert_ne!(one, two);
        assert_eq!(one.as_str().len(), 32);
        assert!(
            one.as_str().bytes().all(|b| b.is_ascii_hexdigit()),
            "{one:?}"
        );
    }

    #[test]
    fn a_batch_ends_the_stream_only_at_the_last_event_of_a_finished_one() {
        let e = |seq| Entry {
            seq,
            event: Bytes::from_static(b"x"),
        };
        let b = |events, tail| Batch {
            events,
            tail,
            last_seq: 3,
        };
        assert!(b(vec![e(2), e(3)], Tail::Finished).ends_stream(1));
        assert!(!b(vec![e(2)], Tail::Finished).ends_stream(1));
        assert!(b(vec![], Tail::Finished).ends_stream(3));
        assert!(!b(vec![e(2), e(3)], Tail::Live).ends_stream(1));
    }
}
