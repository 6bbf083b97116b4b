//! Every key's rate windows (`policy::rate_window`), per process or, on
//! Redis, for the fleet: one atomic script per reservation, clocked by
//! Redis, like the cost ledger's. A key is asked about only once it is
//! bounded: it has a configured `rpm`/`tpm`, or an upstream reported its
//! windows in this process (every replica reads the headers of its own
//! answers). When Redis does not answer, this replica's own windows decide
//! (a rate window is a courtesy to the upstream, not a wall: traffic goes
//! on) and the failure counts in `switchyard_state_errors_total{function="limits"}`.
//!
//! Bounded: one entry per configured key (providers × keys), each Redis hash
//! expiring a minute after its last window ends.

mod redis;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::policy::rate_window::{Hold, KeyWindow, Limits, Priority, Reported, Room};
use crate::state::redis::Redis;
use crate::state::StateFaults;

/// Most keys whose windows a process keeps (a config names far fewer).
const MAX_KEYS: usize = 4096;
/// How often a replica reads which keys the fleet learned windows for.
const REFRESH: Duration = Duration::from_secs(1);

/// Where a reservation was held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Local,
    Fleet,
}

/// A request that fit a key: hand it back to `settle`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reservation {
    /// `provider/key`.
    pub id: String,
    pub hold: Hold,
    pub held: Held,
}

/// The windows of every key.
pub struct KeyLimits {
    local: Mutex<Local>,
    fleet: Option<(Redis, Arc<StateFaults>)>,
    epoch: Instant,
}

#[derive(Default)]
struct Local {
    windows: HashMap<String, KeyWindow>,
    /// Keys an upstream reported windows for.
    reported: HashSet<String>,
    /// Providers with such a key.
    reporting: HashSet<String>,
    /// What each key had left when last asked (status, metrics).
    room: HashMap<String, Room>,
}

impl Default for KeyLimits {
    fn default() -> Self {
        KeyLimits::embedded()
    }
}

impl KeyLimits {
    /// Windows kept in this process.
    pub fn embedded() -> Self {
        KeyLimits {
            local: Mutex::default(),
            fleet: None,
            epoch: Instant::now(),
        }
    }

    /// Windows shared by the fleet on `redis`.
    pub fn redis(redis: Redis, faults: Arc<StateFaults>) -> Self {
        KeyLimits {
            fleet: Some((redis, faults)),
            ..KeyLimits::embedded()
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// On Redis, for the process's life: every `REFRESH` the keys another
    /// replica learned windows for are bounded here too, so no replica sends
    /// into a window the fleet knows is full just because it has not had an
    /// answer from that key itself. Nothing to do in process.
    pub async fn upkeep(self: Arc<Self>) {
        let Some((redis, faults)) = &self.fleet else {
            return;
        };
        let mut tick = tokio::time::interval(REFRESH);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match redis.limits_reporting(MAX_KEYS).await {
                Ok(ids) => self.mark_reporting(ids),
                Err(e) => faults.record(
                    "limits",
                    &e,
                    "keys other replicas learned are not known here",
                ),
            }
        }
    }

    fn mark_reporting(&self, ids: Vec<String>) {
        let mut local = self.local();
        for id in ids {
            if local.reported.len() >= MAX_KEYS {
                break;
            }
            if let Some((provider, _)) = id.split_once('/') {
                if !local.reporting.contains(provider) {
                    local.reporting.insert(provider.to_string());
                }
                local.reported.insert(id);
            }
        }
    }

    /// Whether admission asks about any key of `provider`: it has
    /// `configured` limits or an upstream reported windows for one of its
    /// keys (one lookup, no allocation: the hot path asks it per attempt).
    pub fn may_bound(&self, provider: &str, configured: bool) -> bool {
        configured || self.local().reporting.contains(provider)
    }

    /// Whether admission asks about key `id` at all.
    pub fn bounded(&self, id: &str, limits: Limits) -> bool {
        !limits.is_empty() || self.local().reported.contains(id)
    }

    /// Holds one request of `tokens` on key `id` if every window has room;
    /// else how long until the soonest full window resets.
    pub async fn reserve(
        &self,
        id: &str,
        limits: Limits,
        tokens: u64,
        priority: Priority,
    ) -> Result<Reservation, Duration> {
        if let Some((redis, faults)) = &self.fleet {
            match redis.limits_reserve(id, limits, tokens, priority).await {
                Ok((result, room)) => {
                    self.note_room(id, room);
                    return result.map(|hold| Reservation {
                        id: id.to_string(),
                        hold,
                        held: Held::Fleet,
                    });
                }
                Err(e) => faults.record("limits", &e, "rate windows are this replica's own"),
            }
        }
        let now = self.now_ms();
        let mut local = self.local();
        if local.windows.len() >= MAX_KEYS && !local.windows.contains_key(id) {
            return Ok(Reservation {
                id: id.to_string(),
                hold: Hold {
                    tokens: 0,
                    window_start_ms: 0,
                },
                held: Held::Local,
            });
        }
        let window = local.windows.entry(id.to_string()).or_default();
        let result = window.reserve(limits, tokens, priority, now);
        let room = window.room(limits, now);
        local.room.insert(id.to_string(), room);
        result.map(|hold| Reservation {
            id: id.to_string(),
            hold,
            held: Held::Local,
        })
    }

    /// The request was answered, having used `tokens` (0: refused or never
    /// sent; `None`: unknown, failed or cut). Learn what the answer
    /// reported first: until then its hold keeps its room taken.
    pub async fn settle(&self, r: &Reservation, tokens: Option<u64>) {
        match (r.held, &self.fleet) {
            (Held::Fleet, Some((redis, faults))) => {
                if let Err(e) = redis.limits_settle(&r.id, r.hold, tokens).await {
                    faults.record("limits", &e, "a reservation was not settled");
                }
            }
            _ => {
                if let Some(w) = self.local().windows.get_mut(&r.id) {
                    w.settle(r.hold, tokens);
                }
            }
        }
    }

    /// An upstream reported key `id`'s windows (reset times relative to
    /// now), answering the request `answering` held, if any (settle it
    /// after).
    pub async fn learn(
        &self,
        provider: &str,
        id: &str,
        limits: Limits,
        reported: Reported,
        answering: Option<&Reservation>,
    ) {
        if reported.is_empty() {
            return;
        }
        let now = self.now_ms();
        {
            let mut local = self.local();
            if local.reported.len() < MAX_KEYS {
                local.reported.insert(id.to_string());
                if !local.reporting.contains(provider) {
                    local.reporting.insert(provider.to_string());
                }
            }
            let absolute = shift(reported, now);
            let hold = answering.filter(|r| r.held == Held::Local).map(|r| r.hold);
            if let Some(w) = local.windows.get_mut(id) {
                w.learn_answer(absolute, hold, now);
            } else if local.windows.len() < MAX_KEYS {
                let mut w = KeyWindow::default();
                w.learn(absolute, now);
                local.windows.insert(id.to_string(), w);
            }
            if let Some(w) = local.windows.get_mut(id) {
                let room = w.room(limits, now);
                local.room.insert(id.to_string(), room);
            }
        }
        if let Some((redis, faults)) = &self.fleet {
            let hold = answering.filter(|r| r.held == Held::Fleet).map(|r| r.hold);
            match redis.limits_learn(id, limits, reported, hold).await {
                Ok(room) => self.note_room(id, room),
                Err(e) => faults.record("limits", &e, "reported windows were not shared"),
            }
        }
    }

    fn note_room(&self, id: &str, room: Room) {
        let mut local = self.local();
        if local.room.len() < MAX_KEYS || local.room.contains_key(id) {
            local.room.insert(id.to_string(), room);
        }
    }

    /// Key `id`'s window sizes (requests, tokens): the stricter of
    /// `limits` and what an upstream reported to this process.
    pub fn sizes(&self, id: &str, limits: Limits) -> (Option<u64>, Option<u64>) {
        match self.local().windows.get(id) {
            Some(w) => w.sizes(limits),
            None => (limits.rpm, limits.tpm),
        }
    }

    /// What key `id` had left when last asked.
    pub fn room(&self, id: &str) -> Option<Room> {
        self.local().room.get(id).copied()
    }
}

/// `reported` with its reset times (relative to now) moved to `now_ms`.
fn shift(mut reported: Reported, now_ms: u64) -> Reported {
    for left in [&mut reported.requests, &mut reported.tokens]
        .into_iter()
        .flatten()
    {
        left.reset_at_ms += now_ms;
    }
    reported
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::policy::rate_window::Left;

    #[tokio::test(start_paused = true)]
    async fn a_reported_empty_window_holds_until_its_reset_then_lapses() {
        let limits = KeyLimits::embedded();
        let none = Limits::default();
        assert!(!limits.bounded("p/a", none));
        assert!(!limits.may_bound("p", false));
        limits
            .learn(
                "p",
                "p/a",
                none,
                Reported {
                    requests: None,
                    tokens: Some(Left {
                        remaining: 0,
                        reset_at_ms: 2_000,
                        limit: None,
                    }),
                },
                None,
            )
            .await;
        assert!(limits.bounded("p/a", none));
        assert!(limits.may_bound("p", false) && !limits.may_bound("q", false));
        let wait = limits
            .reserve("p/a", none, 100, Priority::Interactive)
            .await
            .unwrap_err();
        assert!(wait <= Duration::from_secs(2) && wait > Duration::from_millis(1_900));
        assert_eq!(limits.room("p/a").unwrap().tokens, Some(0));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(limits
            .reserve("p/a", none, 100, Priority::Interactive)
            .await
            .is_ok());
    }

    /// Two replicas on one Redis: what one holds and has not had answered
    /// stays counted against the report the other learns, so together they
    /// never send more than the upstream said it has room for.
    #[tokio::test]
    async fn on_redis_a_report_leaves_every_replicas_outstanding_holds_counted() {
        use crate::state::redis::testutil::RedisServer;
        let Some(server) = RedisServer::start() else {
            return;
        };
        let replica = || {
            let faults = StateFaults::new(Arc::new(crate::telemetry::metrics::Metrics::new()));
            KeyLimits::redis(server.client(), faults)
        };
        let (a, b) = (replica(), replica());
        let none = Limits::default();
        let mut held = Vec::new();
        for i in 0..4 {
            let r = if i % 2 == 0 { &a } else { &b };
            held.push(
                r.reserve("p/k", none, 1_000, Priority::Interactive)
                    .await
                    .unwrap(),
            );
        }
        // B's first request is answered: the upstream counted only it.
        let report = Reported {
            requests: None,
            tokens: Some(Left {
                remaining: 9_000,
                reset_at_ms: 30_000,
                limit: Some(10_000),
            }),
        };
        b.learn("p", "p/k", none, report, Some(&held[1])).await;
        b.settle(&held[1], Some(20)).await;
        assert_eq!(
            b.room("p/k").unwrap().tokens,
            Some(6_000),
            "the three still out on both replicas are not in the report"
        );
        for i in 0..6 {
            let r = if i % 2 == 0 { &a } else { &b };
            assert!(
                r.reserve("p/k", none, 1_000, Priority::Interactive)
                    .await
                    .is_ok(),
                "request {i}"
            );
        }
        assert!(a
            .reserve("p/k", none, 1_000, Priority::Interactive)
            .await
            .is_err());
        // The rest answered; the last report is the upstream's whole count.
        for i in [0, 2, 3] {
            a.settle(&held[i], Some(20)).await;
        }
        let report = Reported {
            requests: None,
            tokens: Some(Left {
                remaining: 1_000,
                reset_at_ms: 29_500,
                limit: Some(10_000),
            }),
        };
        a.learn("p", "p/k", none, report, None).await;
        assert_eq!(a.room("p/k").unwrap().tokens, Some(0), "six still out");
    }

    #[tokio::test(start_paused = true)]
    async fn a_configured_window_is_settled_to_real_usage() {
        let limits = KeyLimits::embedded();
        let tpm = Limits {
            rpm: None,
            tpm: Some(1_000),
        };
        let r = limits
            .reserve("p/a", tpm, 1_000, Priority::Interactive)
            .await
            .unwrap();
        assert!(limits
            .reserve("p/a", tpm, 1, Priority::Interactive)
            .await
            .is_err());
        limits.settle(&r, Some(300)).await;
        assert!(limits
            .reserve("p/a", tpm, 700, Priority::Interactive)
            .await
            .is_ok());
    }
}
