//! A share over a sliding window: of the events in the last `span`, how many
//! were "hits" (for example requests served by a non-primary target, or
//! attempts that were failover traffic). Pure; time is passed in.

use std::time::Duration;

use tokio::time::Instant;

use super::window::Buckets;

/// Events and hits over a sliding window of 6 buckets.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareWindow {
    /// (events, hits) per bucket.
    buckets: Buckets<(u64, u64)>,
}

impl ShareWindow {
    pub fn new(span: Duration, now: Instant) -> Self {
        ShareWindow {
            buckets: Buckets::new(now, span, 6),
        }
    }

    /// Records one event.
    pub fn record(&mut self, hit: bool, now: Instant) {
        self.record_many(1, u64::from(hit), now);
    }

    /// Records `events` events at once, `hits` of them hits (`hits <= events`).
    pub fn record_many(&mut self, events: u64, hits: u64, now: Instant) {
        let b = self.buckets.current(now);
        b.0 += events;
        b.1 += hits.min(events);
    }

    /// Hits as a share of events in the window (0 when there were none).
    pub fn share(&self, now: Instant) -> f64 {
        let (events, hits) = self
            .buckets
            .live(now)
            .fold((0, 0), |(e, h), (be, bh)| (e + be, h + bh));
        if events == 0 {
            0.0
        } else {
            hits as f64 / events as f64
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn share_covers_the_window_only() {
        let t0 = Instant::now();
        let mut w = ShareWindow::new(Duration::from_secs(60), t0);
        assert_eq!(w.share(t0), 0.0);
        w.record(true, t0);
        w.record(false, t0);
        w.record(false, t0);
        w.record(false, t0);
        assert_eq!(w.share(t0), 0.25);
        let later = t0 + Duration::from_secs(61);
        w.record(false, later);
        assert_eq!(w.share(later), 0.0, "the old events aged out");
        w.record_many(4, 3, later);
        assert_eq!(w.share(later), 0.6, "3 hits of 5 events");
        w.record_many(1, 9, later);
        assert_eq!(w.share(later), 4.0 / 6.0, "hits never exceed events");
    }
}
