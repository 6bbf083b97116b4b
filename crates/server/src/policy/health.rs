//! Health of one provider x model over a sliding window: success rate, p95
//! latency and time to first token, folded into a score in [0, 1] the router
//! uses to rank targets. Owns only the statistics; it never trips anything
//! (the breaker does) and never sees excluded outcomes as failures.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::outcome::OutcomeClass;
use super::window::Buckets;

/// Health window settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// Span of the sliding window. Default 60 s.
    #[serde(with = "crate::config::duration")]
    pub window: Duration,
    /// Buckets the window is split into; old data leaves one bucket at a time.
    /// Default 12 (5 s each).
    pub buckets: u32,
    /// Pseudo-successes added to the success rate, so a target with few calls
    /// (or none) scores near healthy and one failure out of one does not sink
    /// it. Default 5.
    pub prior_successes: u32,
    /// p95 latency at or under this scores full marks; above it the score falls
    /// as `latency_target / p95`. Default 30 s (whole streamed completions).
    #[serde(with = "crate::config::duration")]
    pub latency_target: Duration,
    /// Calls in the window before the score may reorder a route: below it
    /// the route order holds and the breaker alone protects. Default 20.
    pub min_calls: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            window: Duration::from_secs(60),
            buckets: 12,
            prior_successes: 5,
            latency_target: Duration::from_secs(30),
            min_calls: 20,
        }
    }
}

/// Latency histogram bins: upper bounds of `2^(i/4)` ms (about 19 % apart),
/// from 1 ms to about 17 min; the last bin also takes everything slower.
const BINS: usize = 81;
/// `2^(j/4) * 1000` for j in 0..4: microseconds of the bins in the first octave.
const QUARTER_OCTAVE_US: [u64; 4] = [1000, 1189, 1414, 1682];

/// Upper bound of latency bin `i`.
const fn bin_upper_us(i: usize) -> u64 {
    QUARTER_OCTAVE_US[i % 4] << (i / 4)
}

/// The bin a latency falls in.
fn bin_of(latency: Duration) -> usize {
    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    (0..BINS)
        .find(|&i| us <= bin_upper_us(i))
        .unwrap_or(BINS - 1)
}

/// A fixed log-scale latency histogram.
#[derive(Debug, Clone, PartialEq)]
struct Histogram([u32; BINS]);

impl Default for Histogram {
    fn default() -> Self {
        Histogram([0; BINS])
    }
}

/// One bucket's tallies.
#[derive(Debug, Clone, Default, PartialEq)]
struct Tally {
    /// Successful calls (`OutcomeClass::is_success`).
    successes: u64,
    /// Calls that ended in any non-excluded failure.
    failures: u64,
    /// Calls excluded from health (cancelled, caller errors, throttles).
    excluded: u64,
    /// Whole-call latency of successful calls.
    latency: Histogram,
    /// Time to first token of successful calls.
    ttft: Histogram,
}

/// One finished attempt, as the health window sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// How the attempt ended.
    pub class: OutcomeClass,
    /// Whole-attempt latency; used for successes only.
    pub latency: Option<Duration>,
    /// Time to first token; used for successes only.
    pub ttft: Option<Duration>,
}

/// Sliding-window health of one target.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthWindow {
    /// See [`HealthConfig`].
    config: HealthConfig,
    /// The tallies, one per bucket.
    buckets: Buckets<Tally>,
}

impl HealthWindow {
    /// An empty window: it scores 1.0 until calls arrive.
    pub fn new(config: HealthConfig, now: Instant) -> Self {
        let buckets = Buckets::new(now, config.window, config.buckets);
        HealthWindow { config, buckets }
    }

    /// Record one finished attempt. Latencies of failures and excluded calls
    /// are ignored: a fast connect failure must not make a target look quick.
    pub fn record(&mut self, sample: Sample, now: Instant) {
        let tally = self.buckets.current(now);
        if sample.class.is_excluded() {
            tally.excluded += 1;
        } else if sample.class.is_success() {
            tally.successes += 1;
            if let Some(latency) = sample.latency {
                tally.latency.0[bin_of(latency)] += 1;
            }
            if let Some(ttft) = sample.ttft {
                tally.ttft.0[bin_of(ttft)] += 1;
            }
        } else {
            tally.failures += 1;
        }
    }

    /// Successes plus failures in the window (excluded calls do not count).
    pub fn calls(&self, now: Instant) -> u64 {
        self.sum(now, |t| t.successes + t.failures)
    }

    /// Enough calls in the window for the score to mean something.
    pub fn has_evidence(&self, now: Instant) -> bool {
        self.calls(now) >= u64::from(self.config.min_calls)
    }

    /// Excluded calls in the window, for metrics.
    pub fn excluded(&self, now: Instant) -> u64 {
        self.sum(now, |t| t.excluded)
    }

    /// Raw success rate, `None` when the window holds no calls.
    pub fn success_rate(&self, now: Instant) -> Option<f64> {
        let calls = self.calls(now);
        (calls > 0).then(|| self.sum(now, |t| t.successes) as f64 / calls as f64)
    }

    /// p95 latency of successful calls, as the upper bound of its histogram
    /// bin (at most about 19 % high); `None` without samples.
    pub fn p95_latency(&self, now: Instant) -> Option<Duration> {
        self.p95(now, |t| &t.latency)
    }

    /// p95 time to first token of successful calls, like [`Self::p95_latency`].
    pub fn p95_ttft(&self, now: Instant) -> Option<Duration> {
        self.p95(now, |t| &t.ttft)
    }

    /// `smoothed_success_rate * latency_factor`, in [0, 1], where
    /// `smoothed_success_rate = (successes + prior) / (calls + prior)` and
    /// `latency_factor = min(1, latency_target / p95_latency)` (1 without
    /// latency samples). An empty window scores 1.0, so an unknown provider,
    /// or one whose failures have aged out, gets traffic again.
    pub fn score(&self, now: Instant) -> f64 {
        let prior = u64::from(self.config.prior_successes);
        let successes = self.sum(now, |t| t.successes) + prior;
        let calls = self.calls(now) + prior;
        let rate = if calls == 0 {
            1.0
        } else {
            successes as f64 / calls as f64
        };
        let latency = match self.p95_latency(now) {
            Some(p95) if p95 > self.config.latency_target => {
                self.config.latency_target.as_secs_f64() / p95.as_secs_f64()
            }
            _ => 1.0,
        };
        rate * latency
    }

    fn sum(&self, now: Instant, field: impl Fn(&Tally) -> u64) -> u64 {
        self.buckets.live(now).map(field).sum()
    }

    fn p95(&self, now: Instant, hist: impl Fn(&Tally) -> &Histogram) -> Option<Duration> {
        let mut merged = [0u64; BINS];
        for tally in self.buckets.live(now) {
            for (total, count) in merged.iter_mut().zip(hist(tally).0.iter()) {
                *total += u64::from(*count);
            }
        }
        let n: u64 = merged.iter().sum();
        if n == 0 {
            return None;
        }
        // The smallest bin holding at least 95 % of the samples (nearest rank).
        let rank = (n * 95).div_ceil(100);
        let mut seen = 0;
        let bin = merged.iter().position(|count| {
            seen += count;
            seen >= rank
        })?;
        Some(Duration::from_micros(bin_upper_us(bin)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn ok(latency_ms: u64) -> Sample {
        Sample {
            class: OutcomeClass::Ok,
            latency: Some(Duration::from_millis(latency_ms)),
            ttft: Some(Duration::from_millis(latency_ms / 10)),
        }
    }

    fn of(class: OutcomeClass) -> Sample {
        Sample {
            class,
            latency: Some(Duration::from_millis(1)),
            ttft: None,
        }
    }

    fn window() -> HealthWindow {
        HealthWindow::new(HealthConfig::default(), Instant::now())
    }

    fn bin_upper(latency: Duration) -> Duration {
        Duration::from_micros(bin_upper_us(bin_of(latency)))
    }

    #[test]
    fn bins_are_increasing_and_cover_the_range() {
        assert_eq!(bin_upper_us(0), 1000);
        assert_eq!(bin_upper_us(4), 2000);
        assert_eq!(bin_upper_us(BINS - 1), 1000 << 20);
        assert!((1..BINS).all(|i| bin_upper_us(i) > bin_upper_us(i - 1)));
        assert_eq!(bin_of(Duration::ZERO), 0);
        assert_eq!(bin_of(Duration::from_millis(1)), 0);
        assert_eq!(bin_of(Duration::from_micros(1001)), 1);
        assert_eq!(bin_of(Duration::from_secs(100_000)), BINS - 1);
    }

    #[tokio::test(start_paused = true)]
    async fn empty_window_scores_like_a_healthy_one() {
        let w = window();
        let now = Instant::now();
        assert_eq!(w.calls(now), 0);
        assert_eq!(w.success_rate(now), None);
        assert_eq!(w.p95_latency(now), None);
        assert_eq!(w.score(now), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn counts_rate_and_score() {
        let mut w = window();
        let now = Instant::now();
        for _ in 0..15 {
            w.record(ok(100), now);
        }
        for _ in 0..5 {
            w.record(of(OutcomeClass::ServerError), now);
        }
        for _ in 0..7 {
            w.record(of(OutcomeClass::Cancelled), now);
        }
        assert_eq!(w.calls(now), 20);
        assert_eq!(w.excluded(now), 7);
        assert_eq!(w.success_rate(now), Some(0.75));
        // (15 + 5) / (20 + 5); p95 100 ms is under the 30 s target.
        assert_eq!(w.score(now), 0.8);
    }

    #[tokio::test(start_paused = true)]
    async fn excluded_classes_never_lower_the_score() {
        let mut w = window();
        let now = Instant::now();
        for class in OutcomeClass::ALL.into_iter().filter(|c| c.is_excluded()) {
            w.record(of(class), now);
        }
        assert_eq!(w.calls(now), 0);
        assert_eq!(w.excluded(now), 7);
        assert_eq!(w.score(now), 1.0);
    }

    #[tokio::test(start_paused = true)]
    async fn p95_is_the_bin_of_the_95th_percentile_sample() {
        let mut w = window();
        let now = Instant::now();
        for _ in 0..95 {
            w.record(ok(100), now);
        }
        for _ in 0..5 {
            w.record(ok(5000), now);
        }
        assert_eq!(
            w.p95_latency(now),
            Some(bin_upper(Duration::from_millis(100)))
        );
        assert_eq!(w.p95_ttft(now), Some(bin_upper(Duration::from_millis(10))));
        w.record(ok(5000), now);
        assert_eq!(
            w.p95_latency(now),
            Some(bin_upper(Duration::from_millis(5000)))
        );
        // Failures' latencies are ignored.
        let failure = Sample {
            class: OutcomeClass::Timeout,
            latency: Some(Duration::from_secs(60)),
            ttft: None,
        };
        w.record(failure, now);
        assert_eq!(
            w.p95_latency(now),
            Some(bin_upper(Duration::from_millis(5000)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn slow_p95_lowers_the_score_proportionally() {
        let config = HealthConfig {
            prior_successes: 0,
            latency_target: Duration::from_micros(bin_upper_us(40)),
            ..HealthConfig::default()
        };
        let mut w = HealthWindow::new(config, Instant::now());
        let now = Instant::now();
        // Bin 44 is exactly one octave above bin 40.
        w.record(ok(bin_upper_us(44) / 1000), now);
        assert_eq!(
            w.p95_latency(now),
            Some(Duration::from_micros(bin_upper_us(44)))
        );
        assert_eq!(w.score(now), 0.5);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_age_out_so_a_recovered_provider_climbs_back() {
        let mut w = window();
        for _ in 0..20 {
            w.record(of(OutcomeClass::Connect), Instant::now());
        }
        assert_eq!(w.score(Instant::now()), 0.2);
        // 5 s buckets: the failures are still in the window 55 s later.
        advance(Duration::from_secs(55)).await;
        w.record(ok(100), Instant::now());
        assert_eq!(w.calls(Instant::now()), 21);
        advance(Duration::from_secs(5)).await;
        assert_eq!(w.calls(Instant::now()), 1);
        assert_eq!(w.success_rate(Instant::now()), Some(1.0));
        assert_eq!(w.score(Instant::now()), 1.0);
        advance(Duration::from_secs(60)).await;
        assert_eq!(w.calls(Instant::now()), 0);
        assert_eq!(w.p95_latency(Instant::now()), None);
    }

    #[test]
    fn deserializes_with_defaults() {
        let c: HealthConfig = toml::from_str("window = \"2m\"\nbuckets = 24").unwrap();
        assert_eq!(c.window, Duration::from_secs(120));
        assert_eq!(c.buckets, 24);
        assert_eq!(c.prior_successes, 5);
        assert!(toml::from_str::<HealthConfig>("size = 3").is_err());
    }
}
