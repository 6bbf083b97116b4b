//! How long to wait before trying the same target again: AWS "full jitter"
//! backoff, and the rule that a valid `Retry-After` wins over it. Owns only the
//! arithmetic: it never sleeps, never decides whether a class may be retried
//! (`outcome.rs` does), and never returns a wait that does not fit the caller's
//! remaining deadline (invariant I4).

use std::time::Duration;

use rand::Rng;
use serde::Deserialize;

/// Backoff settings; the struct is also the calculator (it holds no state).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Backoff {
    /// Ceiling of the first retry's delay; each further retry doubles it.
    /// Default 100 ms.
    #[serde(with = "crate::config::duration")]
    pub base: Duration,
    /// Ceiling of any backoff delay, whatever the attempt number. Default 5 s.
    #[serde(with = "crate::config::duration")]
    pub cap: Duration,
    /// Positive jitter added to a `Retry-After` wait, as a fraction of it, in
    /// [0, 1]. Default 0.1: `Retry-After: 2` waits between 2.0 s and 2.2 s, never
    /// less than the upstream asked for.
    pub retry_after_jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(100),
            cap: Duration::from_secs(5),
            retry_after_jitter: 0.1,
        }
    }
}

impl Backoff {
    /// `min(cap, base * 2^attempt)`, saturating: never overflows for any `attempt`.
    /// `attempt` is 0 for the first retry.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let grown = match 1u32.checked_shl(attempt) {
            Some(factor) => self.base.saturating_mul(factor),
            None if self.base.is_zero() => Duration::ZERO,
            None => Duration::MAX,
        };
        grown.min(self.cap)
    }

    /// Full jitter: uniform in `[0, ceiling(attempt)]`.
    pub fn delay(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        uniform(self.ceiling(attempt), rng)
    }

    /// The wait before retry number `attempt` (0-based) of the same target, or
    /// `None` when it would not fit: the caller then fails over or gives up
    /// instead of sleeping past its deadline.
    ///
    /// `retry_after` (already validated positive by the classifier) wins over the
    /// backoff and gets up to `retry_after_jitter` of positive jitter. Any
    /// returned wait is strictly less than `remaining`, so time is left for the
    /// attempt itself.
    pub fn retry_wait(
        &self,
        attempt: u32,
        retry_after: Option<Duration>,
        remaining: Duration,
        rng: &mut impl Rng,
    ) -> Option<Duration> {
        let wait = match retry_after {
            Some(asked) if asked >= remaining => return None,
            Some(asked) => {
                // Never let the jitter push the wait to or past the deadline.
                let room = remaining - asked - Duration::from_nanos(1);
                let jitter = scaled(asked, self.retry_after_jitter).min(room);
                asked + uniform(jitter, rng)
            }
            None => self.delay(attempt, rng),
        };
        (wait < remaining).then_some(wait)
    }
}

/// `d * fraction` for a fraction in [0, 1]; zero for anything invalid.
fn scaled(d: Duration, fraction: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * fraction.clamp(0.0, 1.0))
        .unwrap_or(Duration::ZERO)
}

/// Uniform in `[0, max]` at nanosecond resolution.
fn uniform(max: Duration, rng: &mut impl Rng) -> Duration {
    let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.random_range(0..=nanos))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn ceiling_doubles_from_base_up_to_cap() {
        let b = Backoff::default();
        let got: Vec<Duration> = (0..8).map(|n| b.ceiling(n)).collect();
        let want = [100, 200, 400, 800, 1600, 3200, 5000, 5000].map(ms);
        assert_eq!(got, want);
        assert_eq!(b.ceiling(31), ms(5000));
        assert_eq!(b.ceiling(32), ms(5000));
        assert_eq!(b.ceiling(u32::MAX), ms(5000));
    }

    #[test]
    fn zero_base_never_waits() {
        let b = Backoff {
            base: Duration::ZERO,
            ..Backoff::default()
        };
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(b.ceiling(u32::MAX), Duration::ZERO);
        assert_eq!(b.delay(40, &mut rng), Duration::ZERO);
    }

    #[test]
    fn delays_spread_over_the_whole_range() {
        let b = Backoff::default();
        let mut rng = StdRng::seed_from_u64(7);
        let delays: Vec<Duration> = (0..1000).map(|_| b.delay(3, &mut rng)).collect();
        assert!(delays.iter().all(|d| *d <= ms(800)));
        assert!(
            delays.iter().any(|d| *d < ms(100)),
            "full jitter reaches near 0"
        );
        assert!(delays.iter().any(|d| *d > ms(700)), "and near the ceiling");
    }

    #[test]
    fn retry_after_wins_with_small_positive_jitter() {
        let b = Backoff::default();
        let mut rng = StdRng::seed_from_u64(3);
        for attempt in 0..20 {
            let wait = b
                .retry_wait(attempt, Some(ms(2000)), ms(30_000), &mut rng)
                .unwrap();
            assert!(wait >= ms(2000) && wait <= ms(2200), "{wait:?}");
        }
        let exact = Backoff {
            retry_after_jitter: 0.0,
            ..Backoff::default()
        };
        assert_eq!(
            exact.retry_wait(0, Some(ms(2000)), ms(30_000), &mut rng),
            Some(ms(2000))
        );
    }

    #[test]
    fn retry_after_longer_than_the_deadline_is_not_waited_for() {
        let b = Backoff::default();
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(
            b.retry_wait(0, Some(ms(120_000)), ms(10_000), &mut rng),
            None
        );
        assert_eq!(
            b.retry_wait(0, Some(ms(10_000)), ms(10_000), &mut rng),
            None
        );
    }

    #[test]
    fn jitter_is_trimmed_to_fit_the_deadline() {
        let b = Backoff {
            retry_after_jitter: 1.0,
            ..Backoff::default()
        };
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..200 {
            let wait = b.retry_wait(0, Some(ms(900)), ms(1000), &mut rng).unwrap();
            assert!(wait >= ms(900) && wait < ms(1000), "{wait:?}");
        }
    }

    #[test]
    fn no_time_left_means_no_retry() {
        let b = Backoff::default();
        let mut rng = StdRng::seed_from_u64(3);
        assert_eq!(b.retry_wait(0, None, Duration::ZERO, &mut rng), None);
    }

    #[test]
    fn deserializes_with_defaults_and_rejects_unknown_fields() {
        let b: Backoff = toml::from_str("cap = \"2s\"").unwrap();
        assert_eq!(
            b,
            Backoff {
                cap: ms(2000),
                ..Backoff::default()
            }
        );
        assert!(toml::from_str::<Backoff>("max = \"2s\"").is_err());
    }

    proptest! {
        #[test]
        fn delay_is_within_full_jitter_bounds(
            attempt in any::<u32>(),
            base_ms in 0u64..10_000,
            cap_ms in 0u64..100_000,
            seed in any::<u64>(),
        ) {
            let b = Backoff { base: ms(base_ms), cap: ms(cap_ms), retry_after_jitter: 0.1 };
            let mut rng = StdRng::seed_from_u64(seed);
            // An independent model in u128 milliseconds.
            let model = if base_ms == 0 {
                0
            } else if attempt >= 64 {
                cap_ms
            } else {
                u64::try_from((u128::from(base_ms) << attempt).min(u128::from(cap_ms))).unwrap()
            };
            let ceiling = ms(model);
            prop_assert_eq!(b.ceiling(attempt), ceiling);
            prop_assert!(b.delay(attempt, &mut rng) <= ceiling);
        }

        #[test]
        fn retry_wait_never_reaches_remaining(
            attempt in any::<u32>(),
            retry_after_ms in proptest::option::of(1u64..200_000),
            remaining_ms in 0u64..60_000,
            jitter in 0.0f64..=1.0,
            seed in any::<u64>(),
        ) {
            let b = Backoff { retry_after_jitter: jitter, ..Backoff::default() };
            let mut rng = StdRng::seed_from_u64(seed);
            let remaining = ms(remaining_ms);
            let wait = b.retry_wait(attempt, retry_after_ms.map(ms), remaining, &mut rng);
            if let Some(wait) = wait {
                prop_assert!(wait < remaining);
                if let Some(asked) = retry_after_ms {
                    prop_assert!(wait >= ms(asked));
                }
            }
            if let Some(asked) = retry_after_ms {
                prop_assert_eq!(wait.is_some(), asked < remaining_ms);
            }
        }
    }
}
