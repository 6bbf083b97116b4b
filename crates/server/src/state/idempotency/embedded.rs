//! Idempotency records in process, scoped `tenant:key`: the first request with a key
//! claims it; a duplicate of a finished request replays the stored answer with
//! no upstream call; a concurrent duplicate is refused; the same key with a
//! different payload is refused. Only successful answers are stored: a failed
//! request releases its key so the caller's retry runs again (an LLM call has
//! no side effect worth pinning an error to). In-process and bounded; the
//! clock is passed in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::Fingerprint;
use crate::sink::Event;

/// What a claim found.
pub enum Claim {
    /// First use: run the request, then `complete` or drop the guard.
    Fresh(ClaimGuard),
    /// A finished request with the same payload: replay these events (its
    /// stream's resume token, if it had one).
    Replay {
        events: Arc<Vec<Event>>,
        resume: Option<String>,
    },
    /// The same key is being served right now (by a stream with this
    /// resume token, if it has one).
    InUse { resume: Option<String> },
    /// The key was used with a different payload.
    Mismatch,
}

enum Entry {
    InFlight {
        fingerprint: Fingerprint,
        claim: u64,
        resume: Option<String>,
    },
    Done {
        fingerprint: Fingerprint,
        events: Arc<Vec<Event>>,
        expires: Instant,
        resume: Option<String>,
    },
}

struct Inner {
    entries: HashMap<String, Entry>,
    next_claim: u64,
    /// Bytes held by finished records (keys and answers).
    bytes: usize,
}

/// About how many bytes a finished record holds.
fn record_bytes(key: &str, events: &[Event]) -> usize {
    key.len() + events.iter().map(crate::sink::event_bytes).sum::<usize>()
}

/// The store; share it behind an `Arc`.
pub struct IdempotencyStore {
    inner: Mutex<Inner>,
    /// How long a finished answer is replayed.
    ttl: Duration,
    /// Most records kept; past it the expired, then the oldest-expiring, go.
    max_entries: usize,
    /// Most bytes of finished records kept, the same way.
    max_bytes: usize,
}

impl IdempotencyStore {
    pub fn new(ttl: Duration, max_entries: usize, max_bytes: usize) -> Arc<Self> {
        Arc::new(IdempotencyStore {
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                next_claim: 0,
                bytes: 0,
            }),
            ttl,
            max_entries: max_entries.max(1),
            max_bytes,
        })
    }

    /// Claims `key` for a request with this fingerprint, whose stream has
    /// the journal `resume` (if any).
    pub fn claim(
        self: &Arc<Self>,
        key: &str,
        fingerprint: Fingerprint,
        resume: Option<&str>,
        now: Instant,
    ) -> Claim {
        let Ok(mut inner) = self.inner.lock() else {
            return Claim::InUse { resume: None };
        };
        match inner.entries.get(key) {
            Some(Entry::InFlight {
                fingerprint: f,
                resume,
                ..
            }) if *f == fingerprint => {
                return Claim::InUse {
                    resume: resume.clone(),
                }
            }
            Some(Entry::InFlight { .. }) => return Claim::Mismatch,
            Some(Entry::Done {
                fingerprint: f,
                events,
                expires,
                resume,
            }) if *expires > now => {
                return if *f == fingerprint {
                    Claim::Replay {
                        events: events.clone(),
                        resume: resume.clone(),
                    }
                } else {
                    Claim::Mismatch
                };
            }
            _ => {}
        }
        if inner.entries.len() >= self.max_entries {
            evict(&mut inner, now, |i| i.entries.len() < self.max_entries);
        }
        inner.next_claim += 1;
        let claim = inner.next_claim;
        inner.entries.insert(
            key.to_string(),
            Entry::InFlight {
                fingerprint,
                claim,
                resume: resume.map(str::to_string),
            },
        );
        Claim::Fresh(ClaimGuard {
            store: self.clone(),
            key: key.to_string(),
            claim,
            done: false,
        })
    }

    /// Records currently held (in flight or finished).
    pub fn len(&self) -> usize {
        self.inner.lock().map(|i| i.entries.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held by finished records.
    pub fn bytes(&self) -> usize {
        self.inner.lock().map(|i| i.bytes).unwrap_or(0)
    }
}

/// Makes room until `enough`: drops expired records, then the ones expiring first.
fn evict(inner: &mut Inner, now: Instant, enough: impl Fn(&Inner) -> bool) {
    let mut freed = 0;
    inner.entries.retain(|k, e| match e {
        Entry::Done {
            expires, events, ..
        } if *expires <= now => {
            freed += record_bytes(k, events);
            false
        }
        _ => true,
    });
    inner.bytes -= freed;
    while !enough(inner) {
        let oldest = inner
            .entries
            .iter()
            .filter_map(|(k, e)| match e {
                Entry::Done { expires, .. } => Some((k.clone(), *expires)),
                Entry::InFlight { .. } => None,
            })
            .min_by_key(|(_, t)| *t)
            .map(|(k, _)| k);
        let Some(k) = oldest else { break };
        if let Some(Entry::Done { events, .. }) = inner.entries.remove(&k) {
            inner.bytes -= record_bytes(&k, &events);
        }
    }
}

/// A held claim. Dropping it without `complete` releases the key.
pub struct ClaimGuard {
    store: Arc<IdempotencyStore>,
    key: String,
    claim: u64,
    done: bool,
}

impl ClaimGuard {
    /// Stores the finished answer for replay.
    /// An answer larger than the store's byte bound is not kept (the key
    /// is released, as for a failure).
    pub fn complete(mut self, events: Vec<Event>, now: Instant) {
        let size = record_bytes(&self.key, &events);
        if size > self.store.max_bytes {
            return;
        }
        self.done = true;
        let expires = crate::policy::clock::after(now, self.store.ttl);
        let max_bytes = self.store.max_bytes;
        if let Ok(mut inner) = self.store.inner.lock() {
            if let Some(Entry::InFlight {
                fingerprint,
                claim,
                resume,
            }) = inner.entries.get(&self.key)
            {
                if *claim == self.claim {
                    let (fingerprint, resume) = (*fingerprint, resume.clone());
                    evict(&mut inner, now, |i| i.bytes + size <= max_bytes);
                    inner.bytes += size;
                    inner.entries.insert(
                        self.key.clone(),
                        Entry::Done {
                            fingerprint,
                            events: Arc::new(events),
                            expires,
                            resume,
                        },
                    );
                }
            }
        }
    }
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Ok(mut inner) = self.store.inner.lock() {
            if matches!(inner.entries.get(&self.key), Some(Entry::InFlight { claim, .. }) if *claim == self.claim)
            {
                inner.entries.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::chat::Chunk;

    const A: Fingerprint = [1; 32];
    const B: Fingerprint = [2; 32];

    fn events() -> Vec<Event> {
        vec![Event::Chunk(Chunk::Text("hi".into()))]
    }

    #[tokio::test(start_paused = true)]
    async fn replay_after_completion_then_expiry() {
        let store = IdempotencyStore::new(Duration::from_secs(60), 100, 1 << 20);
        let now = Instant::now();
        let Claim::Fresh(guard) = store.claim("t:k", A, None, now) else {
            panic!()
        };
        assert!(matches!(
            store.claim("t:k", A, None, now),
            Claim::InUse { .. }
        ));
        assert!(matches!(store.claim("t:k", B, None, now), Claim::Mismatch));
        guard.complete(events(), now);
        match store.claim("t:k", A, None, now) {
            Claim::Replay { events: e, .. } => assert_eq!(*e, events()),
            _ => panic!("expected a replay"),
        }
        assert!(matches!(store.claim("t:k", B, None, now), Claim::Mismatch));
        let later = now + Duration::from_secs(61);
        assert!(
            matches!(store.claim("t:k", A, None, later), Claim::Fresh(_)),
            "a key past its TTL runs again"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_request_releases_its_key() {
        let store = IdempotencyStore::new(Duration::from_secs(60), 100, 1 << 20);
        let now = Instant::now();
        let Claim::Fresh(guard) = store.claim("t:k", A, None, now) else {
            panic!()
        };
        drop(guard);
        assert!(store.is_empty());
        assert!(matches!(store.claim("t:k", A, None, now), Claim::Fresh(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn keys_are_scoped_and_the_store_is_bounded() {
        let store = IdempotencyStore::new(Duration::from_secs(60), 3, 1 << 20);
        let now = Instant::now();
        for i in 0..10 {
            let Claim::Fresh(g) =
                store.claim(&format!("t:{i}"), A, None, now + Duration::from_secs(i))
            else {
                panic!()
            };
            g.complete(events(), now + Duration::from_secs(i));
        }
        assert!(store.len() <= 3);
        assert!(
            matches!(store.claim("other:9", A, None, now), Claim::Fresh(_)),
            "another tenant's key is separate"
        );
    }
}
