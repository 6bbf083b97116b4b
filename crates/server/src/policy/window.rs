//! A ring of fixed-width time buckets: the sliding window behind the breaker's
//! failure rate, the health window and the retry budget. Crate-private plumbing;
//! it knows nothing about outcomes, only "which bucket is `now` in" and "which
//! buckets are still live". No clock of its own: every call takes `now`.

use std::time::Duration;

use tokio::time::Instant;

/// `count` buckets of `width` each; a value written at `t` stays live for more
/// than `(count - 1) * width` and at most `count * width` after `t`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Buckets<T> {
    /// Bucket boundaries are aligned to this instant.
    start: Instant,
    /// Width of one bucket, never zero.
    width: Duration,
    /// `(absolute bucket index, value)`; slot `i % len` holds bucket `i`.
    slots: Vec<(u64, T)>,
}

impl<T: Default + Clone> Buckets<T> {
    /// A window of `span` split into `count` buckets (at least one bucket of at
    /// least 1 ns).
    pub(crate) fn new(start: Instant, span: Duration, count: u32) -> Self {
        let count = count.max(1);
        let width = (span / count).max(Duration::from_nanos(1));
        Buckets {
            start,
            width,
            slots: vec![(0, T::default()); count as usize],
        }
    }

    /// The bucket `now` falls in, created empty if it was stale.
    pub(crate) fn current(&mut self, now: Instant) -> &mut T {
        let index = self.index(now);
        let len = self.slots.len() as u64;
        let slot = &mut self.slots[(index % len) as usize];
        if slot.0 != index {
            *slot = (index, T::default());
        }
        &mut slot.1
    }

    /// The buckets still inside the window at `now`.
    pub(crate) fn live(&self, now: Instant) -> impl Iterator<Item = &T> {
        let current = self.index(now);
        let len = self.slots.len() as u64;
        self.slots
            .iter()
            .filter(move |(index, _)| *index <= current && index.saturating_add(len) > current)
            .map(|(_, value)| value)
    }

    /// Forget everything.
    pub(crate) fn clear(&mut self) {
        for slot in &mut self.slots {
            *slot = (0, T::default());
        }
    }

    fn index(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.start).as_nanos();
        u64::try_from(elapsed / self.width.as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn values_live_between_count_minus_one_and_count_widths() {
        let t0 = Instant::now();
        let mut b: Buckets<u32> = Buckets::new(t0, Duration::from_secs(10), 10);
        *b.current(t0 + Duration::from_millis(500)) += 1;
        let sum = |b: &Buckets<u32>, ms| b.live(t0 + Duration::from_millis(ms)).sum::<u32>();
        assert_eq!(sum(&b, 500), 1);
        assert_eq!(sum(&b, 9_999), 1);
        assert_eq!(sum(&b, 10_000), 0);
        // A new write into the same ring slot replaces the stale bucket.
        *b.current(t0 + Duration::from_millis(10_100)) += 5;
        assert_eq!(sum(&b, 10_100), 5);
    }
}
