//! Several API keys (or accounts) for one provider. A request uses one key,
//! picked by weight (or the one its prompt-cache prefix is warm on) among
//! the keys not cooling down, not disabled and under
//! their own concurrency ceiling. A key-local answer changes that key only:
//! a 429 or an exhausted quota cools it down (the provider's cooldown
//! lengths, the upstream's `Retry-After` first), a 401/403 disables it until
//! a reload builds a new pool. Keys are known by name; values never leave.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::endpoint::Secret;
use crate::policy::cooldown::CooldownConfig;
use crate::policy::outcome::{Failure, OutcomeClass};
use crate::policy::rate_window::Limits;

/// One key of the pool.
pub struct Key {
    pub name: String,
    pub secret: Secret,
    weight: u32,
    permits: Option<Arc<Semaphore>>,
    state: Mutex<KeyState>,
    /// Its configured rate windows (`rpm`, `tpm`).
    pub limits: Limits,
}

#[derive(Default)]
struct KeyState {
    cooling_until: Option<Instant>,
    disabled: bool,
}

impl Key {
    pub fn new(name: String, secret: Secret, weight: u32, max_concurrency: Option<u32>) -> Self {
        Key {
            name,
            secret,
            weight: weight.max(1),
            permits: max_concurrency.map(|n| Arc::new(Semaphore::new(n as usize))),
            state: Mutex::new(KeyState::default()),
            limits: Limits::default(),
        }
    }

    /// The key with its configured rate windows.
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// A provider's keys.
#[derive(Debug)]
pub struct KeyPool {
    pub keys: Vec<Key>,
    cooldown: CooldownConfig,
}

/// The key an attempt sends with, holding its concurrency slot.
pub struct Lease {
    pub index: usize,
    _permit: Option<OwnedSemaphorePermit>,
}

/// What a key-local answer did to its key (a metric's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyEvent {
    Cooled(&'static str),
    Disabled,
}

impl KeyEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyEvent::Cooled(reason) => reason,
            KeyEvent::Disabled => "disabled",
        }
    }
}

/// One key as operators see it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeyView {
    pub name: String,
    /// `ok`, `cooling` or `disabled`.
    pub state: &'static str,
    pub cooling_remaining_ms: u64,
}

impl KeyPool {
    /// Every key's state now, by name.
    pub fn view(&self, now: Instant) -> Vec<KeyView> {
        self.keys
            .iter()
            .map(|k| {
                let s = k.state.lock().unwrap_or_else(|e| e.into_inner());
                let remaining = s
                    .cooling_until
                    .map_or(Duration::ZERO, |u| u.saturating_duration_since(now));
                KeyView {
                    name: k.name.clone(),
                    state: if s.disabled {
                        "disabled"
                    } else if !remaining.is_zero() {
                        "cooling"
                    } else {
                        "ok"
                    },
                    cooling_remaining_ms: remaining.as_millis() as u64,
                }
            })
            .collect()
    }

    pub fn new(keys: Vec<Key>, cooldown: CooldownConfig) -> Self {
        KeyPool { keys, cooldown }
    }

    /// The keys usable now (not cooling, not disabled), in the order a
    /// request tries them: the `prefer`red one first, the rest by weight.
    pub fn order(&self, now: Instant, prefer: Option<&str>) -> Vec<usize> {
        let mut rest: Vec<usize> = (0..self.keys.len())
            .filter(|i| {
                let s = self.keys[*i]
                    .state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                !s.disabled && s.cooling_until.is_none_or(|u| u <= now)
            })
            .collect();
        let mut order = Vec::with_capacity(rest.len());
        if let Some(at) = rest
            .iter()
            .position(|i| prefer == Some(self.keys[*i].name.as_str()))
        {
            order.push(rest.remove(at));
        }
        let mut rng = rand::rng();
        while !rest.is_empty() {
            let total: u32 = rest.iter().map(|i| self.keys[*i].weight).sum();
            let mut roll = rng.random_range(0..total.max(1));
            let at = rest
                .iter()
                .position(|i| {
                    let w = self.keys[*i].weight;
                    let hit = roll < w;
                    roll = roll.saturating_sub(w);
                    hit
                })
                .unwrap_or(0);
            order.push(rest.remove(at));
        }
        order
    }

    /// A key by weight among those usable now and not in `tried`; else why none.
    pub fn pick(&self, now: Instant, tried: &[usize]) -> Result<Lease, Failure> {
        self.pick_preferring(now, tried, None)
    }

    /// [`KeyPool::pick`], but the `prefer`red key when it is usable
    /// (prompt-cache affinity).
    pub fn pick_preferring(
        &self,
        now: Instant,
        tried: &[usize],
        prefer: Option<&str>,
    ) -> Result<Lease, Failure> {
        let mut usable = Vec::new();
        let mut soonest: Option<Duration> = None;
        let mut saturated = false;
        for (i, key) in self.keys.iter().enumerate() {
            if tried.contains(&i) {
                continue;
            }
            let state = key.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.disabled {
                continue;
            }
            if let Some(until) = state.cooling_until.filter(|u| *u > now) {
                let wait = until - now;
                soonest = Some(soonest.map_or(wait, |s| s.min(wait)));
                continue;
            }
            drop(state);
            match &key.permits {
                None => usable.push((i, None)),
                Some(sem) => match sem.clone().try_acquire_owned() {
                    Ok(p) => usable.push((i, Some(p))),
                    Err(_) => saturated = true,
                },
            }
        }
        if let Some(at) = usable
            .iter()
            .position(|(i, _)| prefer == Some(self.keys[*i].name.as_str()))
        {
            let (index, permit) = usable.swap_remove(at);
            return Ok(Lease {
                index,
                _permit: permit,
            });
        }
        let total: u32 = usable.iter().map(|(i, _)| self.keys[*i].weight).sum();
        if total > 0 {
            let mut roll = rand::rng().random_range(0..total);
            for (i, permit) in usable {
                let w = self.keys[i].weight;
                if roll < w {
                    return Ok(Lease {
                        index: i,
                        _permit: permit,
                    });
                }
                roll -= w;
            }
        }
        Err(match (soonest, saturated) {
            (Some(wait), _) => {
                let mut f = Failure::new(
                    OutcomeClass::RateLimited,
                    "every key of this provider is cooling down",
                );
                f.retry_after = Some(wait);
                f
            }
            (None, true) => Failure::new(
                OutcomeClass::Overloaded,
                "every key of this provider is at its concurrency ceiling",
            ),
            (None, false) => Failure::new(
                OutcomeClass::Auth,
                "every key of this provider was refused (401/403); a reload re-enables them",
            ),
        })
    }

    /// Applies a key-local outcome to key `index`; `None` if the class is
    /// not key-local (the provider's breaker and cooldown see it instead).
    pub fn note(
        &self,
        index: usize,
        class: OutcomeClass,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> Option<KeyEvent> {
        let key = self.keys.get(index)?;
        let mut state = key.state.lock().unwrap_or_else(|e| e.into_inner());
        if class == OutcomeClass::Auth {
            state.disabled = true;
            return Some(KeyEvent::Disabled);
        }
        let wait = self.cooldown.cooldown_for(class, retry_after)?;
        state.cooling_until = Some(crate::policy::clock::after(now, wait));
        Some(KeyEvent::Cooled(if class == OutcomeClass::Quota {
            "quota"
        } else {
            "rate_limited"
        }))
    }

    /// Every key's secret (for redaction).
    pub fn secrets(&self) -> impl Iterator<Item = &Secret> {
        self.keys.iter().map(|k| &k.secret)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn pool(keys: &[(&str, u32, Option<u32>)]) -> KeyPool {
        KeyPool::new(
            keys.iter()
                .map(|(n, w, c)| Key::new(n.to_string(), Secret::new(format!("sk-{n}")), *w, *c))
                .collect(),
            CooldownConfig::default(),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn weights_split_the_traffic() {
        let p = pool(&[("a", 3, None), ("b", 1, None)]);
        let mut a = 0;
        for _ in 0..4000 {
            if p.pick(Instant::now(), &[]).unwrap().index == 0 {
                a += 1;
            }
        }
        assert!((2800..3200).contains(&a), "{a} of 4000 to the weight-3 key");
    }

    #[tokio::test(start_paused = true)]
    async fn a_preferred_key_serves_while_usable_and_then_the_weights_do() {
        let p = pool(&[("a", 100, None), ("b", 1, Some(1))]);
        let now = Instant::now();
        for _ in 0..50 {
            assert_eq!(p.pick_preferring(now, &[], Some("b")).unwrap().index, 1);
        }
        // At its ceiling, cooling or already tried: another key serves.
        let held = p.pick_preferring(now, &[], Some("b")).unwrap();
        assert_eq!(p.pick_preferring(now, &[], Some("b")).unwrap().index, 0);
        drop(held);
        assert_eq!(p.pick_preferring(now, &[1], Some("b")).unwrap().index, 0);
        p.note(
            1,
            OutcomeClass::RateLimited,
            Some(Duration::from_secs(5)),
            now,
        );
        assert_eq!(p.pick_preferring(now, &[], Some("b")).unwrap().index, 0);
        assert_eq!(p.pick_preferring(now, &[], Some("gone")).unwrap().index, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_limited_key_cools_alone_and_comes_back() {
        let p = pool(&[("a", 1, None), ("b", 1, None)]);
        let now = Instant::now();
        assert_eq!(
            p.note(
                0,
                OutcomeClass::RateLimited,
                Some(Duration::from_secs(2)),
                now
            ),
            Some(KeyEvent::Cooled("rate_limited"))
        );
        for _ in 0..50 {
            assert_eq!(p.pick(now, &[]).unwrap().index, 1);
        }
        // Both cooling: the soonest wait is told.
        p.note(
            1,
            OutcomeClass::RateLimited,
            Some(Duration::from_secs(5)),
            now,
        );
        let e = p.pick(now, &[]).err().unwrap();
        assert_eq!(e.class, OutcomeClass::RateLimited);
        assert_eq!(e.retry_after, Some(Duration::from_secs(2)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(p.pick(Instant::now(), &[]).unwrap().index, 0);
        assert_eq!(
            p.note(0, OutcomeClass::ServerError, None, now),
            None,
            "not key-local"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_key_is_disabled_and_ceilings_hold() {
        let p = pool(&[("a", 1, Some(1)), ("b", 1, None)]);
        let now = Instant::now();
        assert_eq!(
            p.note(1, OutcomeClass::Auth, None, now),
            Some(KeyEvent::Disabled)
        );
        let held = p.pick(now, &[]).unwrap();
        assert_eq!(held.index, 0);
        assert_eq!(
            p.pick(now, &[]).err().unwrap().class,
            OutcomeClass::Overloaded
        );
        drop(held);
        assert_eq!(
            p.pick(now, &[0]).err().unwrap().class,
            OutcomeClass::Auth,
            "a tried key is skipped"
        );
    }
}
