//! The response cache: exact-match answers keyed by the request fingerprint
//! (route, messages, tools, sampling), bounded by bytes with LRU eviction and
//! a TTL per entry. Filled from the recording of a live answer as it streamed
//! (a tee: nothing waits on the cache), read by the `cache` rung and by
//! `serve_fresh_within`. In-process; time is passed in.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lru::LruCache;
use tokio::time::Instant;

use crate::chat::Chunk;
use crate::sink::Event;
use crate::state::idempotency::Fingerprint;

struct Entry {
    events: Arc<Vec<Event>>,
    stored_at: Instant,
    expires: Instant,
    bytes: usize,
}

struct Inner {
    entries: LruCache<Fingerprint, Entry>,
    bytes: usize,
}

/// A stored answer and how old it is.
pub struct Hit {
    pub events: Arc<Vec<Event>>,
    pub age: Duration,
}

pub struct ResponseCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

/// Rough memory of an answer.
pub(crate) fn size_of(events: &[Event]) -> usize {
    events
        .iter()
        .map(|e| match e {
            Event::Chunk(Chunk::Text(t)) => t.len() + 32,
            Event::Chunk(Chunk::ToolCall(call)) => {
                call.arguments.len()
                    + call.name.as_ref().map_or(0, String::len)
                    + call.id.as_ref().map_or(0, String::len)
                    + 48
            }
            _ => 128,
        })
        .sum::<usize>()
        + 64
}

impl ResponseCache {
    pub fn new(max_bytes: usize) -> Arc<Self> {
        Arc::new(ResponseCache {
            inner: Mutex::new(Inner {
                entries: LruCache::unbounded(),
                bytes: 0,
            }),
            max_bytes,
        })
    }

    /// Stores a finished answer for `ttl`.
    pub fn put(&self, key: Fingerprint, events: Vec<Event>, ttl: Duration, now: Instant) {
        let bytes = size_of(&events);
        if bytes > self.max_bytes {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let entry = Entry {
            events: Arc::new(events),
            stored_at: now,
            expires: crate::policy::clock::after(now, ttl),
            bytes,
        };
        if let Some(old) = inner.entries.put(key, entry) {
            inner.bytes -= old.bytes;
        }
        inner.bytes += bytes;
        while inner.bytes > self.max_bytes {
            match inner.entries.pop_lru() {
                Some((_, e)) => inner.bytes -= e.bytes,
                None => break,
            }
        }
    }

    /// The stored answer, if any and not expired, and no older than `max_age`.
    pub fn get(&self, key: &Fingerprint, max_age: Option<Duration>, now: Instant) -> Option<Hit> {
        let mut inner = self.inner.lock().ok()?;
        let expired = inner.entries.peek(key).is_some_and(|e| e.expires <= now);
        if expired {
            if let Some(e) = inner.entries.pop(key) {
                inner.bytes -= e.bytes;
            }
            return None;
        }
        let e = inner.entries.get(key)?;
        let age = now.saturating_duration_since(e.stored_at);
        if max_age.is_some_and(|m| age > m) {
            return None;
        }
        Some(Hit {
            events: e.events.clone(),
            age,
        })
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.inner.lock().map(|i| i.bytes).unwrap_or(0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Vec<Event> {
        vec![Event::Chunk(Chunk::Text(text.into()))]
    }

    #[tokio::test(start_paused = true)]
    async fn hits_expire_and_age() {
        let c = ResponseCache::new(1 << 20);
        let t0 = Instant::now();
        c.put([1; 32], answer("hi"), Duration::from_secs(10), t0);
        let hit = c.get(&[1; 32], None, t0 + Duration::from_secs(3)).unwrap();
        assert_eq!(hit.age, Duration::from_secs(3));
        assert!(
            c.get(
                &[1; 32],
                Some(Duration::from_secs(2)),
                t0 + Duration::from_secs(3)
            )
            .is_none(),
            "too old to serve fresh"
        );
        assert!(
            c.get(&[1; 32], None, t0 + Duration::from_secs(10))
                .is_none(),
            "expired"
        );
        assert_eq!(c.bytes(), 0);
        assert!(c.get(&[2; 32], None, t0).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn memory_is_bounded_least_recently_used_first() {
        let t0 = Instant::now();
        let one = size_of(&answer(&"x".repeat(100)));
        let c = ResponseCache::new(one * 3);
        for i in 0..3u8 {
            c.put(
                [i; 32],
                answer(&"x".repeat(100)),
                Duration::from_secs(60),
                t0,
            );
        }
        assert!(c.get(&[0; 32], None, t0).is_some()); // 0 is now recently used
        c.put(
            [9; 32],
            answer(&"x".repeat(100)),
            Duration::from_secs(60),
            t0,
        );
        assert!(c.bytes() <= one * 3);
        assert!(
            c.get(&[1; 32], None, t0).is_none(),
            "the least recently used went first"
        );
        assert!(c.get(&[0; 32], None, t0).is_some());
        assert!(c.get(&[9; 32], None, t0).is_some());
    }
}
