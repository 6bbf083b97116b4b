//! A listener's connection cap, with its metrics. On the HTTP listeners
//! (doors, admin) a connection at the cap first makes room: the connection
//! quiet the longest (no request in flight: byte-less, half-sent headers or
//! an idle keep-alive) is closed for it, as nginx drains reusable
//! connections, so idle sockets can never keep a request or a probe out.
//! Only when every connection has a request in flight is the new one closed
//! on accept. Both count in `switchyard_connections_refused_total`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::telemetry::metrics::{ListenerLabels, Metrics};

/// How often a connection closed at the cap is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Longest the accept loop waits for a connection it closed to give its
/// place back (it only has to notice; a request in flight finishes first).
const MAKE_ROOM_WAIT: Duration = Duration::from_secs(1);

/// What a connection is doing: for its own idle timer and for the gate
/// choosing which idle connection makes room.
pub struct Activity {
    /// When the connection was accepted.
    since: Instant,
    /// Requests whose response has not ended.
    in_flight: AtomicUsize,
    /// Requests begun on this connection.
    begun: AtomicU64,
    /// Milliseconds from `since` to the last request's end.
    last_end_ms: AtomicU64,
    /// Picked to make room (so it is not picked twice).
    closing: AtomicBool,
}

impl Activity {
    fn new(since: Instant) -> Self {
        Activity {
            since,
            in_flight: AtomicUsize::new(0),
            begun: AtomicU64::new(0),
            last_end_ms: AtomicU64::new(0),
            closing: AtomicBool::new(false),
        }
    }

    /// Since when no request has been in flight (`None` while one is).
    pub fn quiet_since(&self) -> Option<Instant> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last = Duration::from_millis(self.last_end_ms.load(Ordering::Relaxed));
        Some(crate::policy::clock::after(self.since, last))
    }

    /// No request has begun on this connection yet.
    pub fn untouched(&self) -> bool {
        self.begun.load(Ordering::Relaxed) == 0
    }
}

/// Held by a request until its response body ends or is dropped.
pub struct InFlight {
    activity: Arc<Activity>,
}

impl InFlight {
    pub fn begin(activity: &Arc<Activity>) -> Self {
        activity.begun.fetch_add(1, Ordering::Relaxed);
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            activity: activity.clone(),
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.activity;
        let ms = a.since.elapsed().as_millis() as u64;
        a.last_end_ms.store(ms, Ordering::Relaxed);
        a.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The connection to close for room: of those not already closing, the
/// one quiet the longest. Pure: `(id, quiet since)` pairs in, an id out.
pub fn quietest(conns: impl IntoIterator<Item = (u64, Option<Instant>)>) -> Option<u64> {
    conns
        .into_iter()
        .filter_map(|(id, quiet)| quiet.map(|q| (q, id)))
        .min()
        .map(|(_, id)| id)
}

/// One open connection, as the gate sees it.
struct Entry {
    activity: Arc<Activity>,
    /// Cancelled to close the connection for room.
    close: CancellationToken,
}

/// The open connections of an HTTP listener (at most its cap).
#[derive(Default)]
struct Open {
    next_id: u64,
    conns: HashMap<u64, Entry>,
}

/// The connection cap of one listener, with its metrics.
#[derive(Clone)]
pub struct Gate {
    name: &'static str,
    max: usize,
    permits: Arc<Semaphore>,
    /// HTTP listeners: the open connections, so a quiet one can make room.
    open_conns: Option<Arc<Mutex<Open>>>,
    open: Gauge,
    refused: Counter,
    /// When the last WARN went out, and how many were closed since.
    warned: Arc<Mutex<(Option<Instant>, u64)>>,
}

/// A connection's place under the cap; released when the connection closes.
pub struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
    /// What the connection does (its idle timer reads it).
    pub activity: Arc<Activity>,
    /// Cancelled when the gate closes this connection to make room.
    pub close: CancellationToken,
    /// Where it is registered (HTTP listeners), removed on drop.
    registered: Option<(Arc<Mutex<Open>>, u64)>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
        if let Some((open, id)) = self.registered.take() {
            if let Ok(mut o) = open.lock() {
                o.conns.remove(&id);
            }
        }
    }
}

impl Gate {
    /// A cap of `max`; `make_room`: close the quietest connection for a new
    /// one at the cap (HTTP listeners) instead of refusing it.
    pub fn new(name: &'static str, max: usize, make_room: bool, metrics: &Metrics) -> Self {
        let labels = ListenerLabels { listener: name };
        Gate {
            name,
            max,
            permits: Arc::new(Semaphore::new(max)),
            open_conns: make_room.then(Arc::default),
            open: metrics.connections.get_or_create(&labels).clone(),
            refused: metrics.connections_refused.get_or_create(&labels).clone(),
            warned: Arc::default(),
        }
    }

    /// A slot for a new connection: a free one, or one a quiet connection
    /// gives up; `None` (counted and logged) when every connection is busy.
    pub async fn admit(&self) -> Option<Slot> {
        if let Ok(permit) = self.permits.clone().try_acquire_owned() {
            return Some(self.slot(permit));
        }
        self.refused.inc();
        self.warn();
        if !self.close_quietest() {
            return None;
        }
        let permit = tokio::time::timeout(MAKE_ROOM_WAIT, self.permits.clone().acquire_owned())
            .await
            .ok()?
            .ok()?;
        Some(self.slot(permit))
    }

    /// Asks the quietest open connection to close; false when none is quiet.
    fn close_quietest(&self) -> bool {
        let Some(open) = &self.open_conns else {
            return false;
        };
        let Ok(o) = open.lock() else {
            return false;
        };
        let candidates = o.conns.iter().filter_map(|(id, e)| {
            let closing = e.activity.closing.load(Ordering::Relaxed);
            (!closing).then(|| (*id, e.activity.quiet_since()))
        });
        let Some(entry) = quietest(candidates).and_then(|id| o.conns.get(&id)) else {
            return false;
        };
        entry.activity.closing.store(true, Ordering::Relaxed);
        entry.close.cancel();
        true
    }

    fn slot(&self, permit: OwnedSemaphorePermit) -> Slot {
        self.open.inc();
        let activity = Arc::new(Activity::new(Instant::now()));
        let close = CancellationToken::new();
        let registered = self.open_conns.as_ref().and_then(|open| {
            let mut o = open.lock().ok()?;
            let id = o.next_id;
            o.next_id += 1;
            o.conns.insert(
                id,
                Entry {
                    activity: activity.clone(),
                    close: close.clone(),
                },
            );
            Some((open.clone(), id))
        });
        Slot {
            _permit: permit,
            open: self.open.clone(),
            activity,
            close,
            registered,
        }
    }

    fn warn(&self) {
        let Ok(mut w) = self.warned.lock() else {
            return;
        };
        w.1 += 1;
        let due = w.0.is_none_or(|at| at.elapsed() >= WARN_EVERY);
        if due {
            tracing::warn!(
                listener = self.name,
                limit = self.max,
                closed = w.1,
                "connection limit reached; the connection quiet the longest is closed to make room, a new one is closed on accept when none is quiet"
            );
            *w = (Some(Instant::now()), 0);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_connection_quiet_the_longest_makes_room_and_a_busy_one_never() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(
            quietest([(1, Some(t0 + s(5))), (2, Some(t0 + s(1))), (3, None)]),
            Some(2)
        );
        assert_eq!(quietest([(3, None), (4, None)]), None);
        assert_eq!(quietest([]), None);
    }

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_a_quiet_connection_is_closed_for_the_new_one() {
        let metrics = Metrics::new();
        let gate = Gate::new("http", 2, true, &metrics);
        let busy = gate.admit().await.unwrap();
        let _request = InFlight::begin(&busy.activity);
        tokio::time::advance(Duration::from_secs(1)).await;
        let quiet = gate.admit().await.unwrap();
        // The third: the quiet one is told to close, and its place is taken
        // once it has.
        let quiet_close = quiet.close.clone();
        let closer = tokio::spawn(async move {
            quiet_close.cancelled().await;
            drop(quiet);
        });
        let third = gate.admit().await.expect("room was made");
        closer.await.unwrap();
        assert!(!busy.close.is_cancelled(), "the busy one stays");
        // Busy and the third (untouched, so quiet): the third goes next.
        let third_close = third.close.clone();
        tokio::spawn(async move {
            third_close.cancelled().await;
            drop(third);
        });
        assert!(gate.admit().await.is_some());
        assert!(!busy.close.is_cancelled());
    }

    #[tokio::test(start_paused = true)]
    async fn with_every_connection_busy_or_no_room_making_the_new_one_is_refused() {
        let metrics = Metrics::new();
        let http = Gate::new("http", 1, true, &metrics);
        let busy = http.admit().await.unwrap();
        let _request = InFlight::begin(&busy.activity);
        assert!(http.admit().await.is_none());
        let grpc = Gate::new("grpc", 1, false, &metrics);
        let _held = grpc.admit().await.unwrap();
        assert!(grpc.admit().await.is_none());
        let m = metrics.render();
        assert!(
            m.contains("switchyard_connections_refused_total{listener=\"http\"} 1"),
            "{m}"
        );
        assert!(
            m.contains("switchyard_connections_refused_total{listener=\"grpc\"} 1"),
            "{m}"
        );
    }
}
