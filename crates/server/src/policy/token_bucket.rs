//! A token bucket for pacing: draining queued jobs into a recovering provider,
//! spacing synthetic probes. Owns only the arithmetic (GCRA on integer
//! nanoseconds, so counts are exact under a paused clock); it never sleeps and
//! never adds jitter of its own: the caller jitters what it schedules.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

/// Token bucket settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TokenBucketConfig {
    /// Tokens added per second once the burst is spent. Default 5.0. Values
    /// below one token a day are treated as one token a day.
    pub rate: f64,
    /// Tokens available at once (and the bucket's size). Default 5; 0 acts as 1.
    pub burst: u32,
}

impl Default for TokenBucketConfig {
    fn default() -> Self {
        TokenBucketConfig {
            rate: 5.0,
            burst: 5,
        }
    }
}

/// A bucket that starts full.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenBucket {
    /// Time between two tokens, `1 s / rate`.
    interval: Duration,
    /// `burst * interval`: how far ahead of `now` the schedule may run.
    tolerance: Duration,
    /// Theoretical arrival time: when the bucket would be full again.
    full_at: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(config: &TokenBucketConfig, now: Instant) -> Self {
        const SLOWEST: Duration = Duration::from_secs(86_400);
        let interval = Duration::try_from_secs_f64(1.0 / config.rate)
            .unwrap_or(SLOWEST)
            .clamp(Duration::from_nanos(1), SLOWEST);
        TokenBucket {
            interval,
            tolerance: interval.saturating_mul(config.burst.max(1)),
            full_at: now,
        }
    }

    /// Take one token if one is available now.
    pub fn try_take(&mut self, now: Instant) -> bool {
        if self.time_until_available(now).is_zero() {
            self.full_at = self.full_at.max(now) + self.interval;
            true
        } else {
            false
        }
    }

    /// Zero when a token is available now, else how long until one is.
    pub fn time_until_available(&self, now: Instant) -> Duration {
        let after_take = self.full_at.max(now) + self.interval;
        after_take
            .saturating_duration_since(now)
            .saturating_sub(self.tolerance)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn bucket(rate: f64, burst: u32) -> TokenBucket {
        TokenBucket::new(&TokenBucketConfig { rate, burst }, Instant::now())
    }

    fn take_all(b: &mut TokenBucket) -> u32 {
        let mut n = 0;
        while b.try_take(Instant::now()) {
            n += 1;
        }
        n
    }

    #[tokio::test(start_paused = true)]
    async fn burst_then_exactly_rate_per_second() {
        let mut b = bucket(5.0, 5);
        assert_eq!(take_all(&mut b), 5);
        assert_eq!(
            b.time_until_available(Instant::now()),
            Duration::from_millis(200)
        );
        advance(Duration::from_millis(199)).await;
        assert_eq!(take_all(&mut b), 0);
        advance(Duration::from_millis(1)).await;
        assert_eq!(take_all(&mut b), 1);
        for _ in 0..10 {
            advance(Duration::from_secs(1)).await;
            assert_eq!(take_all(&mut b), 5);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_bucket_refills_to_burst_and_no_more() {
        let mut b = bucket(2.0, 3);
        assert_eq!(take_all(&mut b), 3);
        advance(Duration::from_secs(60)).await;
        assert_eq!(take_all(&mut b), 3);
        advance(Duration::from_millis(500)).await;
        assert_eq!(take_all(&mut b), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_rates_wait_whole_intervals() {
        let mut b = bucket(0.5, 1);
        assert!(b.try_take(Instant::now()));
        assert_eq!(
            b.time_until_available(Instant::now()),
            Duration::from_secs(2)
        );
        advance(Duration::from_millis(1500)).await;
        assert_eq!(
            b.time_until_available(Instant::now()),
            Duration::from_millis(500)
        );
        assert!(!b.try_take(Instant::now()));
        advance(Duration::from_millis(500)).await;
        assert!(b.try_take(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn nonsense_settings_stay_usable() {
        let mut zero = bucket(0.0, 0);
        assert_eq!(take_all(&mut zero), 1, "burst 0 acts as 1");
        assert_eq!(
            zero.time_until_available(Instant::now()),
            Duration::from_secs(86_400)
        );
        let mut nan = bucket(f64::NAN, 2);
        assert_eq!(take_all(&mut nan), 2);
    }

    #[test]
    fn deserializes_with_defaults() {
        let c: TokenBucketConfig = toml::from_str("rate = 1.5").unwrap();
        assert_eq!(
            c,
            TokenBucketConfig {
                rate: 1.5,
                burst: 5
            }
        );
        assert!(toml::from_str::<TokenBucketConfig>("per_sec = 1.5").is_err());
    }
}
