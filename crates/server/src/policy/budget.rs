//! The retry budget (tower `TpsBudget` / Finagle semantics): retries and
//! failovers together may add at most `ratio` of first attempts, plus a small
//! floor, over a sliding `ttl`. Owns only the accounting; it never decides
//! whether a class is retryable, and a refusal is a local decision, never a
//! provider failure (invariant I6).

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::window::Buckets;

/// Slots the ttl is split into (as tower and Finagle do).
const SLOTS: u32 = 10;
/// Fixed-point scale: one retry costs this many units; a deposit earns
/// `ratio * SCALE` units, so ratios are exact to 1/1000.
const SCALE: i64 = 1000;

/// Retry budget settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetryBudgetConfig {
    /// Retries (and failovers) allowed per first attempt, in [0, 1000].
    /// Default 0.1 (SRE ch. 21: load grows at most to 1.1x).
    pub ratio: f64,
    /// Retries per second allowed without any first attempt: the floor that lets
    /// a quiet router still retry. Default 1.0, i.e. 10 free retries per 10 s ttl
    /// (tower and Linkerd use 10/s, sized for busier services).
    pub min_per_sec: f64,
    /// How long a deposit (and the floor's use) counts. Default 10 s.
    #[serde(with = "crate::config::duration")]
    pub ttl: Duration,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        RetryBudgetConfig {
            ratio: 0.1,
            min_per_sec: 1.0,
            ttl: Duration::from_secs(10),
        }
    }
}

/// A token bucket whose deposits expire after the ttl. Every operation counts
/// in one of `SLOTS` buckets; an entry counts for more than `ttl * 9/10` and at
/// most `ttl`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryBudget {
    /// Units earned per first attempt, `ratio * SCALE`.
    deposit_units: i64,
    /// Units always available, `min_per_sec * ttl * SCALE`; withdrawals against
    /// it expire like deposits do, so it refills over a ttl.
    reserve: i64,
    /// Net units (deposits minus withdrawals) per slot.
    slots: Buckets<i64>,
}

impl RetryBudget {
    /// An empty budget (only the reserve is available).
    pub fn new(config: &RetryBudgetConfig, now: Instant) -> Self {
        let units = |x: f64| (x * SCALE as f64).round().max(0.0) as i64;
        RetryBudget {
            deposit_units: units(config.ratio.min(1000.0)),
            reserve: units(config.min_per_sec * config.ttl.as_secs_f64()),
            slots: Buckets::new(now, config.ttl, SLOTS),
        }
    }

    /// A first attempt happened: earn `ratio` of a retry.
    pub fn deposit(&mut self, now: Instant) {
        self.deposit_many(1, now);
    }

    /// `n` first attempts happened: earn `ratio` of a retry for each.
    pub fn deposit_many(&mut self, n: u64, now: Instant) {
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let slot = self.slots.current(now);
        *slot = slot.saturating_add(self.deposit_units.saturating_mul(n));
    }

    /// Spend one retry or failover if the budget allows it.
    pub fn try_withdraw(&mut self, now: Instant) -> bool {
        if self.balance(now) < SCALE {
            return false;
        }
        *self.slots.current(now) -= SCALE;
        true
    }

    /// Retries available now, for metrics (may be fractional; may be negative
    /// briefly when deposits expire before the withdrawals they paid for).
    pub fn remaining(&self, now: Instant) -> f64 {
        self.balance(now) as f64 / SCALE as f64
    }

    fn balance(&self, now: Instant) -> i64 {
        self.reserve + self.slots.live(now).sum::<i64>()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokio::time::advance;

    fn budget(ttl_ms: u64, min_per_sec: f64, ratio: f64) -> RetryBudget {
        let config = RetryBudgetConfig {
            ratio,
            min_per_sec,
            ttl: Duration::from_millis(ttl_ms),
        };
        RetryBudget::new(&config, Instant::now())
    }

    #[tokio::test(start_paused = true)]
    async fn many_deposits_at_once_are_as_many_one_by_one() {
        let (mut one_by_one, mut at_once) = (budget(10_000, 0.0, 0.25), budget(10_000, 0.0, 0.25));
        let now = Instant::now();
        for _ in 0..7 {
            one_by_one.deposit(now);
        }
        at_once.deposit_many(7, now);
        assert_eq!(one_by_one, at_once);
        assert_eq!(at_once.remaining(now), 1.75);
        at_once.deposit_many(u64::MAX, now);
        assert!(at_once.remaining(now) > 1.0e12, "saturates, never wraps");
    }

    async fn wait_ms(ms: u64) {
        advance(Duration::from_millis(ms)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn tps_empty() {
        let mut b = budget(1000, 0.0, 1.0);
        assert!(!b.try_withdraw(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn tps_leaky() {
        let mut b = budget(1000, 0.0, 1.0);
        b.deposit(Instant::now());
        wait_ms(3000).await;
        assert!(!b.try_withdraw(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn tps_slots() {
        let mut b = budget(1000, 0.0, 0.5);
        b.deposit(Instant::now());
        b.deposit(Instant::now());
        wait_ms(901).await;
        // 900 ms later the deposits still count.
        assert!(b.try_withdraw(Instant::now()));
        assert!(!b.try_withdraw(Instant::now()));

        // Blank slate.
        wait_ms(2001).await;
        b.deposit(Instant::now());
        wait_ms(301).await;
        b.deposit(Instant::now());
        wait_ms(801).await;
        b.deposit(Instant::now());
        // The first deposit has expired; the 2nd and 3rd make one retry.
        assert!(b.try_withdraw(Instant::now()));
        assert!(!b.try_withdraw(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn tps_reserve() {
        let mut b = budget(1000, 5.0, 1.0);
        for _ in 0..5 {
            assert!(b.try_withdraw(Instant::now()));
        }
        assert!(!b.try_withdraw(Instant::now()));
        // The reserve refills once its withdrawals expire.
        wait_ms(1000).await;
        assert_eq!(b.remaining(Instant::now()), 5.0);
    }

    #[tokio::test(start_paused = true)]
    async fn defaults_allow_ten_percent_plus_ten_per_ttl() {
        let mut b = RetryBudget::new(&RetryBudgetConfig::default(), Instant::now());
        assert_eq!(b.remaining(Instant::now()), 10.0);
        for _ in 0..100 {
            b.deposit(Instant::now());
        }
        assert_eq!(b.remaining(Instant::now()), 20.0);
        let granted = (0..100).filter(|_| b.try_withdraw(Instant::now())).count();
        assert_eq!(granted, 20);
    }

    #[test]
    fn deserializes_with_defaults() {
        let c: RetryBudgetConfig = toml::from_str("ttl = \"30s\"\nratio = 0.2").unwrap();
        assert_eq!(c.ttl, Duration::from_secs(30));
        assert_eq!(c.ratio, 0.2);
        assert_eq!(c.min_per_sec, 1.0);
        assert!(toml::from_str::<RetryBudgetConfig>("percent = 20").is_err());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Deposit,
        Withdraw,
        Advance(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => Just(Op::Deposit),
            3 => Just(Op::Withdraw),
            1 => (1u64..3000).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// I2: for every granted withdrawal at `t`, the withdrawals granted in
        /// `[t - 0.9 ttl, t]` (all still counted at `t`) are at most
        /// `ratio * deposits in (t - ttl, t] + min_per_sec * ttl`.
        #[test]
        fn retries_never_exceed_ratio_of_originals_plus_floor(
            ops in proptest::collection::vec(op(), 1..300),
            ratio_milli in 0u32..=1000,
            min_per_sec in 0u32..=3,
        ) {
            let ratio = f64::from(ratio_milli) / 1000.0;
            let config = RetryBudgetConfig {
                ratio,
                min_per_sec: f64::from(min_per_sec),
                ttl: Duration::from_secs(10),
            };
            let t0 = Instant::now();
            let mut b = RetryBudget::new(&config, t0);
            let mut now = t0;
            let mut deposits: Vec<Instant> = Vec::new();
            let mut withdrawals: Vec<Instant> = Vec::new();
            for op in ops {
                match op {
                    Op::Deposit => {
                        b.deposit(now);
                        deposits.push(now);
                    }
                    Op::Withdraw => {
                        if b.try_withdraw(now) {
                            withdrawals.push(now);
                            let ttl = config.ttl;
                            let live = ttl - ttl / 10;
                            let retries = withdrawals
                                .iter()
                                .filter(|t| now.duration_since(**t) <= live)
                                .count() as i64;
                            let originals = deposits
                                .iter()
                                .filter(|t| now.duration_since(**t) < ttl)
                                .count() as i64;
                            // In units of 1/1000 retry, so the comparison is exact.
                            let allowed = i64::from(ratio_milli) * originals
                                + i64::from(min_per_sec) * 10 * 1000;
                            prop_assert!(
                                retries * 1000 <= allowed,
                                "{} retries against {} originals", retries, originals
                            );
                        }
                    }
                    Op::Advance(ms) => now += Duration::from_millis(ms),
                }
            }
        }
    }
}
