//! The in-process affinity memory: prefix digest -> where it is warm, in a
//! bounded LRU (the least recently used prefix goes first), each entry
//! expiring `ttl` after the answer that last used it. The digests carry the
//! tenant, so no tenant can read another's. Time is passed in.

use std::num::NonZeroUsize;
use std::time::Duration;

use lru::LruCache;
use tokio::time::Instant;

use crate::policy::affinity::{PrefixHash, Warm};

/// Prefixes remembered in process, all tenants together (about 150 bytes
/// each: some 10 MB at most).
pub const MAX_ENTRIES: usize = 65_536;

struct Entry {
    warm: Warm,
    expires: Instant,
}

/// Bounded LRU of warm prefixes.
pub struct Memory {
    entries: LruCache<PrefixHash, Entry>,
}

impl Memory {
    pub fn new(max_entries: usize) -> Memory {
        Memory {
            entries: LruCache::new(NonZeroUsize::new(max_entries).unwrap_or(NonZeroUsize::MIN)),
        }
    }

    /// Where the longest of `prefixes` still warm was answered.
    pub fn recall(&mut self, prefixes: &[PrefixHash], now: Instant) -> Option<Warm> {
        for p in prefixes {
            match self.entries.get(p) {
                Some(e) if e.expires > now => return Some(e.warm.clone()),
                Some(_) => {
                    self.entries.pop(p);
                }
                None => {}
            }
        }
        None
    }

    /// `prefixes` are warm at `warm` for `ttl` from `now`.
    pub fn remember(&mut self, prefixes: &[PrefixHash], warm: &Warm, ttl: Duration, now: Instant) {
        let expires = crate::policy::clock::after(now, ttl);
        for p in prefixes {
            self.entries.put(
                *p,
                Entry {
                    warm: warm.clone(),
                    expires,
                },
            );
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::policy::affinity::{key_for, place, verdict, Verdict};

    const TTL: Duration = Duration::from_secs(300);

    fn warm(p: &str, key: Option<&str>) -> Warm {
        Warm {
            provider: p.into(),
            model: "m".into(),
            key: key.map(str::to_string),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_prefix_stays_warm_for_its_ttl_from_the_last_answer_that_used_it() {
        let mut m = Memory::new(16);
        let p = [[1u8; 32]];
        m.remember(&p, &warm("a", None), TTL, Instant::now());
        tokio::time::advance(TTL - Duration::from_secs(1)).await;
        assert_eq!(m.recall(&p, Instant::now()), Some(warm("a", None)));
        // Reused: refreshed for another ttl.
        m.remember(&p, &warm("a", None), TTL, Instant::now());
        tokio::time::advance(TTL - Duration::from_secs(1)).await;
        assert!(m.recall(&p, Instant::now()).is_some());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(m.recall(&p, Instant::now()), None, "cold at its ttl");
        assert!(m.is_empty(), "an expired entry is dropped when met");
    }

    #[tokio::test(start_paused = true)]
    async fn the_longest_warm_prefix_wins_and_the_memory_is_bounded() {
        let mut m = Memory::new(3);
        let now = Instant::now();
        let (long, short) = ([2u8; 32], [3u8; 32]);
        m.remember(&[short], &warm("a", None), TTL, now);
        m.remember(&[long], &warm("b", None), TTL, now);
        assert_eq!(m.recall(&[long, short], now).unwrap().provider, "b");
        assert_eq!(m.recall(&[[9u8; 32], short], now).unwrap().provider, "a");
        // Three more push out the least recently used.
        for i in 10..13u8 {
            m.remember(&[[i; 32]], &warm("c", None), TTL, now);
        }
        assert_eq!(m.len(), 3);
        assert_eq!(m.recall(&[long], now), None);
        assert_eq!(m.recall(&[short], now), None);
    }

    /// The request task's walk, step by step: 20 requests of one prefix on
    /// a route whose order alternates between two equal targets stay on the
    /// first target that answered, with its key; its failure moves them all.
    #[tokio::test(start_paused = true)]
    async fn twenty_requests_of_one_prefix_stay_on_one_target_until_it_fails() {
        let mut m = Memory::new(16);
        let prefix = [[7u8; 32]];
        let mut served = Vec::new();
        let mut verdicts = Vec::new();
        let mut keys = Vec::new();
        let mut failing: Option<&str> = None;
        for i in 0..20 {
            if i == 12 {
                failing = served.last().copied();
            }
            // Equal weights: the router's order alternates.
            let mut plan = if i % 2 == 0 {
                vec!["a", "b"]
            } else {
                vec!["b", "a"]
            };
            let now = Instant::now();
            let remembered = m.recall(&prefix, now);
            if let Some(w) = &remembered {
                place(&mut plan, |t| w.is(t, "m"));
            }
            // The walk: the first that does not fail serves.
            let to = *plan.iter().find(|t| Some(**t) != failing).unwrap();
            let key = key_for(remembered.as_ref(), to, "m")
                .map(str::to_string)
                .unwrap_or_else(|| format!("{to}-key{}", i % 3));
            verdicts.push(verdict(remembered.as_ref(), to, "m"));
            m.remember(&prefix, &warm(to, Some(&key)), TTL, now);
            served.push(to);
            keys.push(key);
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        let first = served[0];
        assert!(served[..12].iter().all(|t| *t == first), "{served:?}");
        assert!(served[12..].iter().all(|t| *t != first), "{served:?}");
        assert!(
            keys[..12].iter().all(|k| *k == keys[0]),
            "one key: {keys:?}"
        );
        assert!(keys[12..].iter().all(|k| *k == keys[12]), "{keys:?}");
        assert_eq!(verdicts[0], Verdict::Miss);
        assert_eq!(verdicts.iter().filter(|v| **v == Verdict::Hit).count(), 18);
        assert_eq!(verdicts[12], Verdict::Move);
    }
}
