//! The semantic cache: answers to near-repeat questions without an
//! inference. Per route, each scope (everything that shapes the answer but
//! the last question: system prompt, earlier turns, sampling, the embedder)
//! has its own HNSW index of question embeddings, so a near-identical
//! question under another system prompt never matches. The store bounds
//! each route by entries and bytes, oldest first, and by its TTL. Filled
//! from the recording of a finished answer; read before routing (a fresh
//! hit) and by the ladder's `semantic_cache` rung. Time is passed in.

pub mod embed;
pub mod index;
pub mod lookup;
pub mod query;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::sink::Event;
use crate::state::idempotency::Fingerprint;
use index::ScopeIndex;

/// A stored answer close enough to the question, with how close and how old.
#[derive(Debug, Clone)]
pub struct Hit {
    pub events: Arc<Vec<Event>>,
    pub similarity: f32,
    pub age: Duration,
}

/// What a lookup found.
#[derive(Debug, Clone)]
pub enum Found {
    Hit(Hit),
    /// Nothing at the threshold (the best similarity seen, if any entry).
    Miss(Option<f32>),
}

/// A route's bounds, from its `semantic_cache` settings.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_entries: usize,
    pub max_bytes: usize,
    pub ttl: Duration,
}

struct Entry {
    events: Arc<Vec<Event>>,
    stored_at: Instant,
    expires: Instant,
    bytes: usize,
}

#[derive(Default)]
struct RouteStore {
    scopes: HashMap<Fingerprint, ScopeIndex<Entry>>,
    /// Insertion order, for eviction and expiry (ids already gone are skipped).
    order: VecDeque<(Fingerprint, usize, Instant)>,
    entries: usize,
    bytes: usize,
    /// The next entry's id: unique across the route's scopes for the
    /// store's life, so a place in `order` never names a later entry.
    next_id: usize,
}

/// Similarity above which a new answer replaces the stored one.
const SAME_QUESTION: f32 = 0.9999;

impl RouteStore {
    fn remove(&mut self, scope: &Fingerprint, id: usize) {
        let Some(index) = self.scopes.get_mut(scope) else {
            return;
        };
        if let Some(e) = index.remove(id) {
            self.entries -= 1;
            self.bytes -= e.bytes;
        }
        if index.is_empty() {
            self.scopes.remove(scope);
        }
    }

    /// Drops expired entries and, past a bound, the oldest.
    fn trim(&mut self, bounds: &Bounds, now: Instant) {
        while let Some(&(scope, id, expires)) = self.order.front() {
            let over = self.entries > bounds.max_entries || self.bytes > bounds.max_bytes;
            let live = self.scopes.get(&scope).is_some_and(|i| i.get(id).is_some());
            if live && !over && expires > now {
                break;
            }
            self.order.pop_front();
            self.remove(&scope, id);
        }
        // Replaced answers leave their place in `order` behind: keep it
        // within a constant of the live entries.
        if self.order.len() > 2 * self.entries + 1024 {
            let scopes = &self.scopes;
            self.order
                .retain(|(s, id, _)| scopes.get(s).is_some_and(|i| i.get(*id).is_some()));
        }
    }
}

/// Every route's semantic entries. Share it behind an `Arc`.
#[derive(Default)]
pub struct SemanticCache {
    routes: Mutex<HashMap<String, RouteStore>>,
}

/// Rough memory of a stored answer and its vector (the graph keeps a copy).
fn size_of(events: &[Event], dim: usize) -> usize {
    crate::state::cache::size_of(events) + dim * 4 * 2 + 256
}

impl SemanticCache {
    pub fn new() -> Arc<Self> {
        Arc::new(SemanticCache::default())
    }

    /// The closest stored answer in `scope`, if at least `threshold` similar,
    /// unexpired and (with `max_age`) fresh enough.
    pub fn lookup(
        &self,
        route: &str,
        scope: &Fingerprint,
        vector: &[f32],
        threshold: f32,
        max_age: Option<Duration>,
        now: Instant,
    ) -> Found {
        let Ok(mut routes) = self.routes.lock() else {
            return Found::Miss(None);
        };
        let Some(store) = routes.get_mut(route) else {
            return Found::Miss(None);
        };
        let Some(index) = store.scopes.get(scope) else {
            return Found::Miss(None);
        };
        let Some((id, similarity)) = index.nearest(vector) else {
            return Found::Miss(None);
        };
        let Some(e) = index.get(id) else {
            return Found::Miss(None);
        };
        let age = now.saturating_duration_since(e.stored_at);
        if similarity < threshold || e.expires <= now || max_age.is_some_and(|m| age > m) {
            return Found::Miss(Some(similarity));
        }
        Found::Hit(Hit {
            events: e.events.clone(),
            similarity,
            age,
        })
    }

    /// Stores an answer to the question `vector` (a unit vector) for the
    /// route's TTL; an answer to the same question replaces the older one.
    pub fn insert(
        &self,
        route: &str,
        scope: Fingerprint,
        vector: Vec<f32>,
        events: Vec<Event>,
        bounds: &Bounds,
        now: Instant,
    ) {
        let bytes = size_of(&events, vector.len());
        if bytes > bounds.max_bytes {
            return;
        }
        let Ok(mut routes) = self.routes.lock() else {
            return;
        };
        let store = routes.entry(route.to_string()).or_default();
        if let Some(index) = store.scopes.get(&scope) {
            if index.dim() != vector.len() {
                // The embedder changed shape: its old vectors cannot compare.
                let ids: Vec<usize> = store
                    .order
                    .iter()
                    .filter(|(s, _, _)| *s == scope)
                    .map(|(_, id, _)| *id)
                    .collect();
                ids.into_iter().for_each(|id| store.remove(&scope, id));
            }
        }
        let same = store
            .scopes
            .get(&scope)
            .and_then(|i| i.nearest(&vector))
            .filter(|(_, s)| *s >= SAME_QUESTION);
        if let Some((id, _)) = same {
            store.remove(&scope, id);
        }
        let expires = crate::policy::clock::after(now, bounds.ttl);
        let dim = vector.len();
        let index = store
            .scopes
            .entry(scope)
            .or_insert_with(|| ScopeIndex::new(dim));
        let entry = Entry {
            events: Arc::new(events),
            stored_at: now,
            expires,
            bytes,
        };
        let id = store.next_id;
        store.next_id += 1;
        if index.insert(id, vector, entry) {
            store.order.push_back((scope, id, expires));
            store.entries += 1;
            store.bytes += bytes;
        }
        store.trim(bounds, now);
    }

    /// Drops what expired on `route` (also done on every insert).
    pub fn expire(&self, route: &str, bounds: &Bounds, now: Instant) {
        if let Ok(mut routes) = self.routes.lock() {
            if let Some(store) = routes.get_mut(route) {
                store.trim(bounds, now);
            }
        }
    }

    /// Drops the routes that no longer have a semantic cache and what
    /// expired on the others (a quiet route's answers do not outlive their
    /// TTL in memory). Returns each kept route's entries and bytes.
    pub fn sweep(
        &self,
        config: &crate::config::Config,
        now: Instant,
    ) -> Vec<(String, usize, usize)> {
        let Ok(mut routes) = self.routes.lock() else {
            return Vec::new();
        };
        let settings: HashMap<&str, Bounds> = config
            .routes
            .iter()
            .filter_map(|r| {
                let s = r.semantic_cache.as_ref()?;
                Some((
                    r.name.as_str(),
                    Bounds {
                        max_entries: s.max_entries,
                        max_bytes: s.max_bytes,
                        ttl: s.ttl,
                    },
                ))
            })
            .collect();
        routes.retain(|name, _| settings.contains_key(name.as_str()));
        routes
            .iter_mut()
            .map(|(name, store)| {
                if let Some(bounds) = settings.get(name.as_str()) {
                    store.trim(bounds, now);
                }
                (name.clone(), store.entries, store.bytes)
            })
            .collect()
    }

    /// Entries and bytes held for `route`.
    pub fn size(&self, route: &str) -> (usize, usize) {
        self.routes
            .lock()
            .ok()
            .and_then(|r| r.get(route).map(|s| (s.entries, s.bytes)))
            .unwrap_or((0, 0))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::chat::Chunk;

    fn answer(text: &str) -> Vec<Event> {
        vec![Event::Chunk(Chunk::Text(text.into()))]
    }

    fn unit(v: &[f32]) -> Vec<f32> {
        index::normalized(v.to_vec()).unwrap()
    }

    fn text(hit: &Hit) -> String {
        match &hit.events[0] {
            Event::Chunk(Chunk::Text(t)) => t.to_string(),
            other => panic!("{other:?}"),
        }
    }

    const BOUNDS: Bounds = Bounds {
        max_entries: 100,
        max_bytes: 1 << 20,
        ttl: Duration::from_secs(60),
    };

    #[tokio::test(start_paused = true)]
    async fn a_near_question_hits_in_its_scope_only_and_expires() {
        let c = SemanticCache::new();
        let t0 = Instant::now();
        c.insert(
            "r",
            [1; 32],
            unit(&[1.0, 0.0, 0.0]),
            answer("a"),
            &BOUNDS,
            t0,
        );
        c.insert(
            "r",
            [1; 32],
            unit(&[0.0, 1.0, 0.0]),
            answer("b"),
            &BOUNDS,
            t0,
        );
        let near = unit(&[1.0, 0.1, 0.0]);
        let later = t0 + Duration::from_secs(10);
        let Found::Hit(hit) = c.lookup("r", &[1; 32], &near, 0.9, None, later) else {
            panic!("expected a hit");
        };
        assert_eq!(text(&hit), "a");
        assert!(hit.similarity > 0.99 && hit.similarity < 1.0);
        assert_eq!(hit.age, Duration::from_secs(10));
        // Another scope (another system prompt) and another route never match.
        assert!(matches!(
            c.lookup("r", &[2; 32], &near, 0.9, None, later),
            Found::Miss(None)
        ));
        assert!(matches!(
            c.lookup("x", &[1; 32], &near, 0.9, None, later),
            Found::Miss(None)
        ));
        // Below the threshold: a miss that says how close it came.
        let Found::Miss(Some(best)) =
            c.lookup("r", &[1; 32], &unit(&[1.0, 1.0, 0.0]), 0.9, None, later)
        else {
            panic!("expected a miss with a similarity");
        };
        assert!((best - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-3);
        // Too old for a fresh hit, still good for the rung.
        let fresh = Some(Duration::from_secs(5));
        assert!(matches!(
            c.lookup("r", &[1; 32], &near, 0.9, fresh, later),
            Found::Miss(_)
        ));
        let expired = t0 + Duration::from_secs(60);
        assert!(matches!(
            c.lookup("r", &[1; 32], &near, 0.9, None, expired),
            Found::Miss(_)
        ));
        c.expire("r", &BOUNDS, expired);
        assert_eq!(c.size("r"), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_drops_expired_answers_and_routes_without_a_cache() {
        let c = SemanticCache::new();
        let t0 = Instant::now();
        let config = |semantic: bool| {
            let mut cfg = crate::config::Config::builtin(Some("http://127.0.0.1:1/v1"), None);
            cfg.routes[0].semantic_cache = semantic.then(|| crate::config::SemanticCacheConfig {
                embedder: "x/y".into(),
                threshold: 0.9,
                max_entries: 10,
                max_bytes: 1 << 20,
                ttl: Duration::from_secs(60),
                max_temperature: 0.0,
                lookup_timeout: Duration::from_millis(100),
                fresh_within: None,
            });
            cfg
        };
        let route = config(true).routes[0].name.clone();
        c.insert(&route, [1; 32], unit(&[1.0, 0.0]), answer("a"), &BOUNDS, t0);
        c.insert(
            &route,
            [1; 32],
            unit(&[0.0, 1.0]),
            answer("b"),
            &BOUNDS,
            t0 + Duration::from_secs(30),
        );
        let swept = c.sweep(&config(true), t0 + Duration::from_secs(61));
        assert_eq!(swept.len(), 1);
        assert_eq!(swept[0].1, 1, "the first answer expired");
        assert!(c
            .sweep(&config(false), t0 + Duration::from_secs(62))
            .is_empty());
        assert_eq!(c.size(&route), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn bounded_by_entries_and_bytes_oldest_first_and_same_question_replaced() {
        let c = SemanticCache::new();
        let t0 = Instant::now();
        let bounds = Bounds {
            max_entries: 3,
            ..BOUNDS
        };
        for i in 0..5 {
            let mut v = vec![0.0; 8];
            v[i] = 1.0;
            c.insert("r", [1; 32], v, answer(&i.to_string()), &bounds, t0);
        }
        assert_eq!(c.size("r").0, 3);
        let axis = |i: usize| {
            let mut v = vec![0.0; 8];
            v[i] = 1.0;
            v
        };
        assert!(matches!(
            c.lookup("r", &[1; 32], &axis(0), 0.9, None, t0),
            Found::Miss(_)
        ));
        assert!(matches!(
            c.lookup("r", &[1; 32], &axis(4), 0.9, None, t0),
            Found::Hit(_)
        ));
        // The same question again replaces its answer instead of adding one.
        c.insert("r", [1; 32], axis(4), answer("new"), &bounds, t0);
        assert_eq!(c.size("r").0, 3);
        let Found::Hit(hit) = c.lookup("r", &[1; 32], &axis(4), 0.9, None, t0) else {
            panic!("expected a hit");
        };
        assert_eq!(text(&hit), "new");
        // Bytes: one answer's worth of room keeps one answer.
        let one = size_of(&answer("x"), 8);
        let tight = Bounds {
            max_bytes: one + one / 2,
            ..BOUNDS
        };
        for i in 0..4 {
            c.insert("b", [1; 32], axis(i), answer("x"), &tight, t0);
        }
        assert_eq!(c.size("b"), (1, one));
        // A vector of another dimension starts the scope over.
        c.insert("b", [1; 32], vec![1.0, 0.0], answer("2d"), &tight, t0);
        assert_eq!(c.size("b").0, 1);
        assert!(matches!(
            c.lookup("b", &[1; 32], &[1.0, 0.0], 0.9, None, t0),
            Found::Hit(_)
        ));
        // A scope emptied and started again: the old places in the order
        // never evict the new entries before their time.
        let c = SemanticCache::new();
        let short = Bounds {
            ttl: Duration::from_secs(10),
            ..BOUNDS
        };
        c.insert("s", [1; 32], axis(0), answer("old"), &short, t0);
        c.insert(
            "s",
            [1; 32],
            vec![1.0, 0.0],
            answer("2d"),
            &short,
            t0 + Duration::from_secs(5),
        );
        c.insert(
            "s",
            [1; 32],
            vec![0.0, 1.0],
            answer("2d'"),
            &short,
            t0 + Duration::from_secs(5),
        );
        c.expire("s", &short, t0 + Duration::from_secs(11));
        assert_eq!(c.size("s").0, 2, "the new entries live until t0 + 15 s");
    }
}
