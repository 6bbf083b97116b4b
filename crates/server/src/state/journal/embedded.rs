//! Stream journals in one process: a map from token to journal behind one
//! mutex (`Book`, every call given `now`), an expiry index, and a `watch`
//! per journal (made for its first reader) that wakes its readers on an
//! append, a finish, a drop or its writer's end. A writer's lease is held
//! while the writer lives (`Hold`), not renewed: the journal dies with the
//! process anyway. A journal keeps each batch the tee wrote whole (one
//! buffer, as `Appends` framed it) and cuts events out of it for a reader.
//! Every journal counts `OVERHEAD` bytes plus its events, each with an
//! `ENTRY_OVERHEAD`, against `resume.max_total_bytes` (so
//! tombstones of expired ones are bounded too, and the bound is the memory
//! held, not only the bytes written); nothing here awaits while holding the
//! lock.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::{Duration, Instant};

use super::{
    events_in, Appended, Appends, Batch, Bound, Bounds, Claim, Entry, JournalError, Owner,
    ResumeToken, Tail, MAX_BATCH,
};

/// Bytes a journal costs before its events: its entry in the map and the
/// expiry index, its names, and the channel that wakes its readers.
/// Measured, not summed from sizes: a release build's RSS grew 1.9 KB per
/// journal of one-token streams (20,000 of them, against the same run with
/// `resume.enabled = false`), so that `max_total_bytes` bounds the memory
/// the journals take (it counted 256 before).
pub const OVERHEAD: u64 = 2048;

/// Bytes an event costs beside its own: a slot in the journal's list (40;
/// a batch of events shares one, and writes a 4-byte length before each)
/// and, measured like [`OVERHEAD`], as much again in the allocator's size
/// classes and the list's growth (with 64-token streams, one event a
/// batch, the journals held 1.37x the bound when only the slot was
/// counted). A token event is about as small as this.
pub const ENTRY_OVERHEAD: u64 = 80;

/// An owner's lease held by its live writer (`EmbeddedJournal::hold`);
/// dropping it ends the lease at once, waking the journal's readers so a
/// reader of an unfinished stream learns its writer is gone.
pub struct Hold {
    journal: Arc<EmbeddedJournal>,
    token: ResumeToken,
    owner: Owner,
}

impl Drop for Hold {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut book = self.journal.book();
        if let Ok(stream) = book.owned(&self.token, &self.owner) {
            stream.held = false;
            stream.lease_until = stream.lease_until.min(now);
            if !stream.finished {
                stream.changed();
            }
        }
    }
}

/// Room for this many batches when a journal's first comes.
const FIRST_BATCHES: usize = 8;

/// The in-process journals; share behind an `Arc`.
pub struct EmbeddedJournal {
    book: Mutex<Book>,
}

impl EmbeddedJournal {
    pub fn new(bounds: Bounds) -> EmbeddedJournal {
        EmbeddedJournal {
            book: Mutex::new(Book::new(bounds)),
        }
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn open(
        &self,
        tenant: &str,
        token: &ResumeToken,
        owner: &Owner,
    ) -> Result<(), JournalError> {
        self.book().open(tenant, token, owner, Instant::now())
    }

    /// One event (tests; the tee appends batches).
    #[cfg(test)]
    pub fn append(
        &self,
        token: &ResumeToken,
        owner: &Owner,
        seq: u64,
        event: Bytes,
    ) -> Result<Appended, JournalError> {
        self.append_many(token, owner, Appends::one(seq, event))
    }

    /// Appends a batch numbered on from the journal's last, under one lock,
    /// kept whole as the tee wrote it.
    pub fn append_many(
        &self,
        token: &ResumeToken,
        owner: &Owner,
        events: Appends,
    ) -> Result<Appended, JournalError> {
        self.book().append(token, owner, events, Instant::now())
    }

    pub fn finish(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        self.book().finish(token, owner, Instant::now())
    }

    pub fn renew(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        self.book().renew(token, owner, Instant::now())
    }

    pub fn claim(
        &self,
        tenant: &str,
        token: &ResumeToken,
        owner: &Owner,
    ) -> Result<Claim, JournalError> {
        self.book().claim(tenant, token, owner, Instant::now())
    }

    /// Ends the owner's lease now.
    pub fn release(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        let now = Instant::now();
        let mut book = self.book();
        book.purge(now);
        let stream = book.owned(token, owner)?;
        stream.lease_until = now;
        stream.held = false;
        Ok(())
    }

    /// Holds `owner`'s lease for as long as the returned guard lives, in
    /// place of renewing it: the writer shares this process with its
    /// journal, so its lease ends when the writer does (dropped after its
    /// stream, or by a panic or the runtime's end), no later and no sooner,
    /// with no task and no timer per stream.
    pub fn hold(self: &Arc<Self>, token: &ResumeToken, owner: &Owner) -> Hold {
        if let Ok(stream) = self.book().owned(token, owner) {
            stream.held = true;
        }
        Hold {
            journal: self.clone(),
            token: token.clone(),
            owner: *owner,
        }
    }

    /// Events after `after_seq`; when there are none and the owner holds
    /// its lease, waits up to `wait` for a change and reads once more.
    pub async fn read(
        &self,
        tenant: &str,
        token: &ResumeToken,
        after_seq: u64,
        wait: Duration,
    ) -> Result<Batch, JournalError> {
        let (batch, mut changes) = self.book().read(tenant, token, after_seq, Instant::now())?;
        if !batch.events.is_empty() || batch.tail != Tail::Live || wait.is_zero() {
            return Ok(batch);
        }
        // A dropped sender (the journal was purged) ends the wait at once.
        let _ = tokio::time::timeout(wait, changes.changed()).await;
        let (batch, _) = self.book().read(tenant, token, after_seq, Instant::now())?;
        Ok(batch)
    }

    /// Bytes held by every journal (events plus `OVERHEAD` each).
    pub fn total_bytes(&self) -> u64 {
        self.book().total
    }
}

/// Every journal of the process, with the clock passed in.
struct Book {
    bounds: Bounds,
    journals: HashMap<ResumeToken, Slot>,
    /// (when the slot may next change: expiry, or a tombstone's end; its
    /// token). One entry per slot; a live slot's may be earlier than its
    /// `expires_at` (a write does not move it; `purge` does when it is due).
    expiry: BTreeSet<(Instant, std::sync::Arc<str>)>,
    /// Bytes held: events with their `ENTRY_OVERHEAD`, plus `OVERHEAD`
    /// per slot.
    total: u64,
}

/// One journal, or its tombstone once expired.
struct Slot {
    /// Inline (`CompactString`) when it is short, as tenant names are.
    tenant: compact_str::CompactString,
    /// `ttl` after the last write.
    expires_at: Instant,
    /// None once expired: the tombstone answers `Expired` until
    /// `expires_at + ttl`.
    stream: Option<Stream>,
}

struct Stream {
    owner: Owner,
    lease_until: Instant,
    /// Its owner's writer lives in this process and holds the lease for as
    /// long as it lives (`Hold`): it does not lapse until then.
    held: bool,
    finished: bool,
    /// The bound passed, once the journal is not resumable (and empty).
    dropped: Option<Bound>,
    /// Its batches as the tee wrote them, each with the number of its last
    /// event (the first is the previous batch's last plus one, or 1).
    batches: Vec<Stored>,
    /// The events' own bytes (what `max_bytes_per_stream` bounds).
    bytes: u64,
    /// Bumped on every change, waking readers; made when the first reader
    /// comes (most streams are never read back).
    changes: Option<watch::Sender<u64>>,
}

/// One batch as the tee wrote it ([`Appends`]).
struct Stored {
    last_seq: u64,
    bytes: Bytes,
}

impl Stream {
    /// Events `from + 1` to `to`, each a slice of its batch.
    fn entries(&self, from: u64, to: u64) -> Vec<Entry> {
        let mut entries = Vec::with_capacity(to.saturating_sub(from) as usize);
        let at = self.batches.partition_point(|b| b.last_seq <= from);
        let mut first = at
            .checked_sub(1)
            .map_or(1, |before| self.batches[before].last_seq + 1);
        for batch in &self.batches[at..] {
            if first > to {
                break;
            }
            let count = u32::try_from(batch.last_seq + 1 - first).unwrap_or(u32::MAX);
            let wanted = events_in(first, count, &batch.bytes)
                .skip_while(|(seq, _)| *seq <= from)
                .take_while(|(seq, _)| *seq <= to);
            entries.extend(wanted.map(|(seq, event)| Entry {
                seq,
                event: batch.bytes.slice_ref(event),
            }));
            first = batch.last_seq + 1;
        }
        entries
    }

    /// Its owner holds the lease: more events may come.
    fn live(&self, now: Instant) -> bool {
        self.held || self.lease_until > now
    }

    fn changed(&self) {
        if let Some(changes) = &self.changes {
            changes.send_modify(|n| *n += 1);
        }
    }

    fn last_seq(&self) -> u64 {
        self.batches.last().map_or(0, |b| b.last_seq)
    }

    /// What the events count against `max_total_bytes`.
    fn held(&self) -> u64 {
        self.bytes + self.last_seq() * ENTRY_OVERHEAD
    }
}

impl Book {
    fn new(bounds: Bounds) -> Book {
        Book {
            bounds,
            journals: HashMap::new(),
            expiry: BTreeSet::new(),
            total: 0,
        }
    }

    /// Turns expired journals into tombstones and forgets old tombstones.
    fn purge(&mut self, now: Instant) {
        while self.expiry.first().is_some_and(|(at, _)| *at <= now) {
            let Some((at, token)) = self.expiry.pop_first() else {
                break;
            };
            let key = ResumeToken(token);
            let Some(slot) = self.journals.get_mut(&key) else {
                continue;
            };
            // Touched since this entry was written: it fires again then.
            if slot.stream.is_some() && slot.expires_at > at {
                self.expiry.insert((slot.expires_at, key.0));
                continue;
            }
            if let Some(stream) = slot.stream.take() {
                self.total -= stream.held();
                self.expiry
                    .insert((slot.expires_at + self.bounds.ttl, key.0));
            } else {
                self.journals.remove(&key);
                self.total -= OVERHEAD;
            }
        }
    }

    /// Moves a slot's expiry to `ttl` after now. The index keeps the
    /// earlier entry, which `purge` moves on when it comes due: a write
    /// costs no index update and no allocation.
    fn touch(&mut self, token: &ResumeToken, now: Instant) {
        let ttl = self.bounds.ttl;
        if let Some(slot) = self.journals.get_mut(token) {
            slot.expires_at = now + ttl;
        }
    }

    fn open(
        &mut self,
        tenant: &str,
        token: &ResumeToken,
        owner: &Owner,
        now: Instant,
    ) -> Result<(), JournalError> {
        self.purge(now);
        if self.total + OVERHEAD > self.bounds.max_total_bytes {
            return Err(JournalError::NotResumable(Bound::Total));
        }
        if self.journals.contains_key(token) {
            // 128 random bits collided: refuse rather than share a journal.
            return Err(JournalError::Fenced);
        }
        let stream = Stream {
            owner: *owner,
            lease_until: now + self.bounds.lease,
            held: false,
            finished: false,
            dropped: None,
            batches: Vec::new(),
            bytes: 0,
            changes: None,
        };
        let expires_at = now + self.bounds.ttl;
        self.journals.insert(
            token.clone(),
            Slot {
                tenant: tenant.into(),
                expires_at,
                stream: Some(stream),
            },
        );
        self.expiry.insert((expires_at, token.0.clone()));
        self.total += OVERHEAD;
        Ok(())
    }

    /// The owner's live journal.
    fn owned(&mut self, token: &ResumeToken, owner: &Owner) -> Result<&mut Stream, JournalError> {
        let slot = self.journals.get_mut(token).ok_or(JournalError::NotFound)?;
        let stream = slot.stream.as_mut().ok_or(JournalError::Expired)?;
        if stream.owner != *owner {
            return Err(JournalError::Fenced);
        }
        Ok(stream)
    }

    /// The tenant's live journal.
    fn of_tenant(
        &mut self,
        tenant: &str,
        token: &ResumeToken,
    ) -> Result<&mut Stream, JournalError> {
        let slot = self.journals.get_mut(token).ok_or(JournalError::NotFound)?;
        if slot.tenant != tenant {
            return Err(JournalError::NotFound);
        }
        slot.stream.as_mut().ok_or(JournalError::Expired)
    }

    fn append(
        &mut self,
        token: &ResumeToken,
        owner: &Owner,
        batch: Appends,
        now: Instant,
    ) -> Result<Appended, JournalError> {
        self.purge(now);
        let (per_stream, max_total, total) = (
            self.bounds.max_bytes_per_stream,
            self.bounds.max_total_bytes,
            self.total,
        );
        let stream = self.owned(token, owner)?;
        if stream.finished {
            return Err(JournalError::Finished);
        }
        if let Some(bound) = stream.dropped {
            return Ok(Appended::NotResumable(bound));
        }
        if batch.is_empty() {
            return Ok(Appended::Stored);
        }
        let expected = stream.last_seq() + 1;
        if batch.first_seq() != expected {
            return Err(JournalError::OutOfOrder {
                expected,
                got: batch.first_seq(),
            });
        }
        let (size, count) = (batch.event_bytes(), batch.len() as u64);
        let passed = if stream.bytes + size > per_stream {
            Some(Bound::PerStream)
        } else if total + size + count * ENTRY_OVERHEAD > max_total {
            Some(Bound::Total)
        } else {
            None
        };
        if let Some(bound) = passed {
            let freed = stream.held();
            stream.batches = Vec::new();
            stream.bytes = 0;
            stream.dropped = Some(bound);
            stream.changed();
            self.total -= freed;
            self.touch(token, now);
            return Ok(Appended::NotResumable(bound));
        }
        if stream.batches.capacity() == 0 {
            // Growing from 4, as a list does, would take one more
            // allocation before a stream's first tokens are in.
            stream.batches.reserve_exact(FIRST_BATCHES);
        }
        stream.batches.push(Stored {
            last_seq: expected + count - 1,
            bytes: batch.into_bytes(),
        });
        stream.bytes += size;
        stream.changed();
        self.total += size + count * ENTRY_OVERHEAD;
        self.touch(token, now);
        Ok(Appended::Stored)
    }

    fn finish(
        &mut self,
        token: &ResumeToken,
        owner: &Owner,
        now: Instant,
    ) -> Result<(), JournalError> {
        self.purge(now);
        let stream = self.owned(token, owner)?;
        stream.finished = true;
        // It grows no more. Its list's slots (40 bytes each) within twice
        // its events are within what `ENTRY_OVERHEAD` counts for each; a
        // list with more spare room (a short stream in its first room)
        // gives it back.
        if stream.batches.capacity() as u64 > 2 * stream.last_seq() {
            stream.batches.shrink_to_fit();
        }
        stream.changed();
        self.touch(token, now);
        Ok(())
    }

    fn renew(
        &mut self,
        token: &ResumeToken,
        owner: &Owner,
        now: Instant,
    ) -> Result<(), JournalError> {
        self.purge(now);
        let lease = self.bounds.lease;
        self.owned(token, owner)?.lease_until = now + lease;
        Ok(())
    }

    fn claim(
        &mut self,
        tenant: &str,
        token: &ResumeToken,
        owner: &Owner,
        now: Instant,
    ) -> Result<Claim, JournalError> {
        self.purge(now);
        let lease = self.bounds.lease;
        let stream = self.of_tenant(tenant, token)?;
        if let Some(bound) = stream.dropped {
            return Err(JournalError::NotResumable(bound));
        }
        if stream.finished {
            return Ok(Claim::Finished);
        }
        if stream.owner != *owner && stream.live(now) {
            return Ok(Claim::Held);
        }
        stream.owner = *owner;
        stream.lease_until = now + lease;
        stream.held = false;
        Ok(Claim::Taken {
            last_seq: stream.last_seq(),
        })
    }

    /// A batch after `after_seq` and a receiver that sees later changes.
    fn read(
        &mut self,
        tenant: &str,
        token: &ResumeToken,
        after_seq: u64,
        now: Instant,
    ) -> Result<(Batch, watch::Receiver<u64>), JournalError> {
        self.purge(now);
        let stream = self.of_tenant(tenant, token)?;
        if let Some(bound) = stream.dropped {
            return Err(JournalError::NotResumable(bound));
        }
        let changes = stream
            .changes
            .get_or_insert_with(|| watch::channel(0).0)
            .subscribe();
        let last_seq = stream.last_seq();
        let from = after_seq.min(last_seq);
        let to = (from + MAX_BATCH as u64).min(last_seq);
        let tail = if stream.finished {
            Tail::Finished
        } else if !stream.live(now) {
            Tail::Orphaned
        } else {
            Tail::Live
        };
        let batch = Batch {
            events: stream.entries(from, to),
            tail,
            last_seq,
        };
        Ok((batch, changes))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const LEASE: Duration = Duration::from_secs(20);
    const TTL: Duration = Duration::from_secs(600);

    fn journal(per_stream: u64, total: u64) -> EmbeddedJournal {
        EmbeddedJournal::new(Bounds {
            ttl: TTL,
            max_bytes_per_stream: per_stream,
            max_total_bytes: total,
            lease: LEASE,
        })
    }

    fn ev(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    async fn all(j: &EmbeddedJournal, tenant: &str, t: &ResumeToken, after: u64) -> Batch {
        j.read(tenant, t, after, Duration::ZERO).await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn events_are_read_back_in_order_after_a_position_and_end_when_finished() {
        let j = journal(1000, 100_000);
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o).unwrap();
            t
        };
        for seq in 1..=5 {
            assert_eq!(
                j.append(&t, &o, seq, Bytes::from(format!("e{seq}")))
                    .unwrap(),
                Appended::Stored
            );
        }
        let b = all(&j, "a", &t, 2).await;
        let seqs: Vec<u64> = b.events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![3, 4, 5]);
        assert_eq!(b.events[0].event, Bytes::from_static(b"e3"));
        assert_eq!((b.tail, b.last_seq), (Tail::Live, 5));
        assert_eq!(
            j.append(&t, &o, 7, ev(1)).unwrap_err(),
            JournalError::OutOfOrder {
                expected: 6,
                got: 7
            }
        );
        j.finish(&t, &o).unwrap();
        let b = all(&j, "a", &t, 2).await;
        assert!(b.ends_stream(2));
        assert_eq!(
            j.append(&t, &o, 6, ev(1)).unwrap_err(),
            JournalError::Finished
        );
        assert_eq!(j.total_bytes(), OVERHEAD + 10 + 5 * ENTRY_OVERHEAD);
    }

    fn capacity(j: &EmbeddedJournal, t: &ResumeToken, o: &Owner) -> usize {
        j.book().owned(t, o).unwrap().batches.capacity()
    }

    fn batch(from: u64, to: u64) -> Appends {
        let events: Vec<(u64, Bytes)> = (from..=to)
            .map(|seq| (seq, Bytes::from(format!("e{seq}"))))
            .collect();
        Appends::of(&events)
    }

    #[tokio::test(start_paused = true)]
    async fn batches_are_kept_whole_and_read_back_event_by_event_from_any_position() {
        let j = journal(100_000, 1_000_000);
        let o = Owner::generate();
        let t = ResumeToken::generate();
        j.open("a", &t, &o).unwrap();
        // `Started` and 17 tokens, one token alone, usage and `Finished`.
        for b in [batch(1, 18), batch(19, 19), batch(20, 21)] {
            assert_eq!(j.append_many(&t, &o, b).unwrap(), Appended::Stored);
        }
        assert_eq!(capacity(&j, &t, &o), FIRST_BATCHES, "one list, no growth");
        for after in [0, 1, 17, 18, 19, 20, 21, 30] {
            let b = all(&j, "a", &t, after).await;
            let want: Vec<(u64, Bytes)> = (after + 1..=21)
                .map(|seq| (seq, Bytes::from(format!("e{seq}"))))
                .collect();
            let got: Vec<(u64, Bytes)> = b.events.into_iter().map(|e| (e.seq, e.event)).collect();
            assert_eq!(got, want, "after {after}");
            assert_eq!(b.last_seq, 21);
        }
        // Counted as events: their own bytes and an entry each.
        let own: u64 = (1..=21).map(|seq| format!("e{seq}").len() as u64).sum();
        assert_eq!(j.total_bytes(), OVERHEAD + own + 21 * ENTRY_OVERHEAD);
        // A batch must start right after the last event.
        assert_eq!(
            j.append_many(&t, &o, batch(23, 24)).unwrap_err(),
            JournalError::OutOfOrder {
                expected: 22,
                got: 23
            }
        );
        // At most MAX_BATCH events a read.
        let t = ResumeToken::generate();
        j.open("a", &t, &o).unwrap();
        let n = MAX_BATCH as u64 + 5;
        j.append_many(&t, &o, batch(1, n)).unwrap();
        let b = all(&j, "a", &t, 3).await;
        assert_eq!(b.events.len(), MAX_BATCH);
        assert_eq!((b.events[0].seq, b.last_seq), (4, n));
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_list_keeps_its_room_within_what_its_events_count() {
        let j = journal(100_000, 1_000_000);
        let o = Owner::generate();
        // Four batches of 19 events in a room for 8: kept.
        let t = ResumeToken::generate();
        j.open("a", &t, &o).unwrap();
        for b in [batch(1, 16), batch(17, 17), batch(18, 18), batch(19, 19)] {
            j.append_many(&t, &o, b).unwrap();
        }
        j.finish(&t, &o).unwrap();
        assert_eq!(capacity(&j, &t, &o), FIRST_BATCHES);
        // One event in a room for 8: given back.
        let t = ResumeToken::generate();
        j.open("a", &t, &o).unwrap();
        j.append_many(&t, &o, batch(1, 1)).unwrap();
        j.finish(&t, &o).unwrap();
        assert_eq!(capacity(&j, &t, &o), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn another_tenant_gets_not_found_never_the_stream() {
        let j = journal(1000, 100_000);
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o).unwrap();
            t
        };
        j.append(&t, &o, 1, ev(3)).unwrap();
        assert_eq!(
            j.read("b", &t, 0, Duration::ZERO).await.unwrap_err(),
            JournalError::NotFound
        );
        assert_eq!(
            j.claim("b", &t, &Owner::generate()).unwrap_err(),
            JournalError::NotFound
        );
        let unknown = ResumeToken::generate();
        assert_eq!(
            j.read("a", &unknown, 0, Duration::ZERO).await.unwrap_err(),
            JournalError::NotFound
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_journal_expires_ttl_after_its_last_write_then_is_forgotten() {
        let j = journal(1000, 100_000);
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o).unwrap();
            t
        };
        tokio::time::advance(TTL - Duration::from_secs(1)).await;
        j.append(&t, &o, 1, ev(10)).unwrap();
        // The append moved the expiry: a full ttl from it, less a second, it lives.
        tokio::time::advance(TTL - Duration::from_secs(1)).await;
        assert_eq!(all(&j, "a", &t, 0).await.events.len(), 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            j.read("a", &t, 0, Duration::ZERO).await.unwrap_err(),
            JournalError::Expired
        );
        assert_eq!(j.total_bytes(), OVERHEAD, "the events are freed");
        // Another tenant still learns nothing, not even that it expired.
        assert_eq!(
            j.read("b", &t, 0, Duration::ZERO).await.unwrap_err(),
            JournalError::NotFound
        );
        tokio::time::advance(TTL - Duration::from_secs(1)).await;
        assert_eq!(
            j.read("a", &t, 0, Duration::ZERO).await.unwrap_err(),
            JournalError::Expired
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            j.read("a", &t, 0, Duration::ZERO).await.unwrap_err(),
            JournalError::NotFound
        );
        assert_eq!(j.total_bytes(), 0, "the tombstone is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_stream_bound_the_append_says_so_and_later_ones_are_refused() {
        let j = journal(100, 100_000);
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o).unwrap();
            t
        };
        assert_eq!(j.append(&t, &o, 1, ev(60)).unwrap(), Appended::Stored);
        assert_eq!(j.append(&t, &o, 2, ev(40)).unwrap(), Appended::Stored);
        assert_eq!(
            j.total_bytes(),
            OVERHEAD + 100 + 2 * ENTRY_OVERHEAD,
            "exactly at the stream's bound, which counts only its bytes"
        );
        assert_eq!(
            j.append(&t, &o, 3, ev(1)).unwrap(),
            Appended::NotResumable(Bound::PerStream)
        );
        assert_eq!(j.total_bytes(), OVERHEAD, "its events are dropped");
        assert_eq!(
            j.append(&t, &o, 4, ev(1)).unwrap(),
            Appended::NotResumable(Bound::PerStream),
            "refused without a sequence check or storing"
        );
        assert_eq!(j.total_bytes(), OVERHEAD);
        assert_eq!(
            j.read("a", &t, 0, Duration::ZERO).await.unwrap_err(),
            JournalError::NotResumable(Bound::PerStream)
        );
        assert_eq!(
            j.claim("a", &t, &Owner::generate()).unwrap_err(),
            JournalError::NotResumable(Bound::PerStream)
        );
        j.finish(&t, &o).unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn past_the_total_bound_the_stream_that_crosses_it_is_not_resumable() {
        // Room for two journals' overhead and two events of 100 bytes in all.
        let j = journal(1000, 2 * OVERHEAD + 100 + 2 * ENTRY_OVERHEAD);
        let o = Owner::generate();
        let a = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o).unwrap();
            t
        };
        let b = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o).unwrap();
            t
        };
        assert_eq!(
            j.open("a", &ResumeToken::generate(), &o).unwrap_err(),
            JournalError::NotResumable(Bound::Total),
            "no room for a third"
        );
        assert_eq!(j.append(&a, &o, 1, ev(70)).unwrap(), Appended::Stored);
        assert_eq!(j.append(&b, &o, 1, ev(30)).unwrap(), Appended::Stored);
        assert_eq!(
            j.append(&b, &o, 2, ev(1)).unwrap(),
            Appended::NotResumable(Bound::Total)
        );
        assert_eq!(j.total_bytes(), 2 * OVERHEAD + 70 + ENTRY_OVERHEAD);
        assert_eq!(all(&j, "a", &a, 0).await.events.len(), 1, "a is intact");
    }

    #[tokio::test(start_paused = true)]
    async fn the_tail_wait_wakes_on_an_append_and_is_bounded() {
        let j = Arc::new(journal(1000, 100_000));
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o).unwrap();
            t
        };
        let start = Instant::now();
        let reader = {
            let (j, t) = (j.clone(), t.clone());
            tokio::spawn(async move { j.read("a", &t, 0, Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
        j.append(&t, &o, 1, ev(1)).unwrap();
        let b = reader.await.unwrap().unwrap();
        assert_eq!(b.events.len(), 1);
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(2),
            "woken by the append"
        );
        // Nothing comes: the wait ends at its bound with an empty batch.
        let start = Instant::now();
        let b = j.read("a", &t, 1, Duration::from_secs(5)).await.unwrap();
        assert!(b.events.is_empty());
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        // A finish wakes a waiting reader too.
        let reader = {
            let (j, t) = (j.clone(), t.clone());
            tokio::spawn(async move { j.read("a", &t, 1, Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        j.finish(&t, &o).unwrap();
        assert!(reader.await.unwrap().unwrap().ends_stream(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_lease_lets_a_survivor_take_over_and_fences_the_old_owner() {
        let j = journal(1000, 100_000);
        let (old, new) = (Owner::generate(), Owner::generate());
        let t = {
            let t = ResumeToken::generate();
            j.open("a", &t, &old).unwrap();
            t
        };
        j.append(&t, &old, 1, ev(1)).unwrap();
        tokio::time::advance(LEASE - Duration::from_secs(1)).await;
        assert_eq!(j.claim("a", &t, &new).unwrap(), Claim::Held);
        j.renew(&t, &old).unwrap();
        tokio::time::advance(LEASE - Duration::from_secs(1)).await;
        assert_eq!(j.claim("a", &t, &new).unwrap(), Claim::Held, "renewed");
        assert_eq!(all(&j, "a", &t, 1).await.tail, Tail::Live);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(all(&j, "a", &t, 1).await.tail, Tail::Orphaned);
        assert_eq!(
            j.claim("a", &t, &new).unwrap(),
            Claim::Taken { last_seq: 1 }
        );
        assert_eq!(
            j.append(&t, &old, 2, ev(1)).unwrap_err(),
            JournalError::Fenced
        );
        assert_eq!(j.renew(&t, &old).unwrap_err(), JournalError::Fenced);
        assert_eq!(j.append(&t, &new, 2, ev(1)).unwrap(), Appended::Stored);
        j.finish(&t, &new).unwrap();
        assert_eq!(j.claim("a", &t, &old).unwrap(), Claim::Finished);
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_lease_outlives_its_length_and_ends_when_its_writer_is_dropped() {
        let j = Arc::new(journal(1000, 100_000));
        let (old, new) = (Owner::generate(), Owner::generate());
        let t = ResumeToken::generate();
        j.open("a", &t, &old).unwrap();
        let hold = j.hold(&t, &old);
        j.append(&t, &old, 1, ev(1)).unwrap();
        tokio::time::advance(LEASE * 3).await;
        assert_eq!(
            all(&j, "a", &t, 1).await.tail,
            Tail::Live,
            "held, not renewed"
        );
        assert_eq!(j.claim("a", &t, &new).unwrap(), Claim::Held);
        // A reader waiting on the tail is woken by the writer's end.
        let reader = {
            let (j, t) = (j.clone(), t.clone());
            tokio::spawn(async move { j.read("a", &t, 1, Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let start = Instant::now();
        drop(hold);
        assert_eq!(reader.await.unwrap().unwrap().tail, Tail::Orphaned);
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "at once, not a lease later"
        );
        assert_eq!(
            j.claim("a", &t, &new).unwrap(),
            Claim::Taken { last_seq: 1 }
        );
        // The new owner's hold, dropped after its writer finished, ends nothing.
        let hold = j.hold(&t, &new);
        assert_eq!(
            j.append(&t, &old, 2, ev(1)).unwrap_err(),
            JournalError::Fenced
        );
        j.append(&t, &new, 2, ev(1)).unwrap();
        j.finish(&t, &new).unwrap();
        drop(hold);
        assert_eq!(all(&j, "a", &t, 0).await.tail, Tail::Finished);
    }
}
