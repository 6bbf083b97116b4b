//! Per-target cooldown after throttle signals (429 rate limit, exhausted quota):
//! the target is skipped until a time, without touching its breaker or health
//! (DESIGN.md §3: "it is your quota"). Owns only the "until when" arithmetic; it
//! never classifies responses and never decides on failover.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::outcome::OutcomeClass;

/// Cooldown lengths when the upstream does not say.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CooldownConfig {
    /// After a 429 rate limit without `Retry-After`. Default 1 s.
    #[serde(with = "crate::config::duration")]
    pub rate_limit_cooldown: Duration,
    /// After an exhausted quota or spend limit. Also the minimum when such a
    /// response carries a shorter `Retry-After`: billing does not recover in
    /// seconds, and every hit costs a caller a failover. Default 300 s.
    #[serde(with = "crate::config::duration")]
    pub quota_cooldown: Duration,
    /// The longest wait an upstream may ask for (`Retry-After` and its
    /// kin): a longer one is cut to this, in the cooldown and in what
    /// callers are told. Default 120 s.
    #[serde(with = "crate::config::duration")]
    pub max_retry_after: Duration,
}

impl Default for CooldownConfig {
    fn default() -> Self {
        CooldownConfig {
            rate_limit_cooldown: Duration::from_secs(1),
            quota_cooldown: Duration::from_secs(300),
            max_retry_after: Duration::from_secs(120),
        }
    }
}

impl CooldownConfig {
    /// How long a failure of `class` cools the target down, if at all.
    pub fn cooldown_for(
        &self,
        class: OutcomeClass,
        retry_after: Option<Duration>,
    ) -> Option<Duration> {
        let retry_after = retry_after.map(|d| d.min(self.max_retry_after));
        match class {
            OutcomeClass::RateLimited => Some(retry_after.unwrap_or(self.rate_limit_cooldown)),
            OutcomeClass::Quota => Some(retry_after.unwrap_or_default().max(self.quota_cooldown)),
            _ => None,
        }
    }
}

/// Why a target is cooling down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CooldownKind {
    RateLimited,
    Quota,
}

impl CooldownKind {
    /// Stable snake_case name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            CooldownKind::RateLimited => "rate_limited",
            CooldownKind::Quota => "quota",
        }
    }
}

/// One target's cooldown: at most one deadline, the latest one set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Cooldown {
    /// The deadline and why, while one has been set (it may have passed).
    until: Option<(Instant, CooldownKind)>,
}

impl Cooldown {
    /// Cool down until `until`, unless a later deadline is already set.
    pub fn set(&mut self, until: Instant, kind: CooldownKind) {
        if self.until.is_none_or(|(current, _)| until > current) {
            self.until = Some((until, kind));
        }
    }

    /// Apply a failure: sets a cooldown for rate-limit and quota classes and
    /// returns the deadline now in force; other classes change nothing.
    pub fn note(
        &mut self,
        config: &CooldownConfig,
        class: OutcomeClass,
        retry_after: Option<Duration>,
        now: Instant,
    ) -> Option<Instant> {
        let kind = match class {
            OutcomeClass::RateLimited => CooldownKind::RateLimited,
            OutcomeClass::Quota => CooldownKind::Quota,
            _ => return None,
        };
        let length = config.cooldown_for(class, retry_after)?;
        self.set(crate::policy::clock::after(now, length), kind);
        self.until.map(|(until, _)| until)
    }

    /// Time left while cooling down, `None` once the deadline has passed.
    pub fn active(&self, now: Instant) -> Option<Duration> {
        match self.until {
            Some((until, _)) if until > now => Some(until - now),
            _ => None,
        }
    }

    /// Why the target is cooling down, `None` when it is not.
    pub fn kind(&self, now: Instant) -> Option<CooldownKind> {
        self.active(now).and(self.until.map(|(_, kind)| kind))
    }

    /// End the cooldown now (config reload, admin).
    pub fn clear(&mut self) {
        self.until = None;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[tokio::test(start_paused = true)]
    async fn active_until_the_deadline_then_not() {
        let mut c = Cooldown::default();
        assert_eq!(c.active(Instant::now()), None);
        c.set(Instant::now() + secs(2), CooldownKind::RateLimited);
        assert_eq!(c.active(Instant::now()), Some(secs(2)));
        advance(Duration::from_millis(1999)).await;
        assert_eq!(c.active(Instant::now()), Some(Duration::from_millis(1)));
        advance(Duration::from_millis(1)).await;
        assert_eq!(c.active(Instant::now()), None);
        assert_eq!(c.kind(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn set_keeps_the_later_deadline() {
        let now = Instant::now();
        let mut c = Cooldown::default();
        c.set(now + secs(300), CooldownKind::Quota);
        c.set(now + secs(1), CooldownKind::RateLimited);
        assert_eq!(c.active(now), Some(secs(300)));
        assert_eq!(c.kind(now), Some(CooldownKind::Quota));
        c.set(now + secs(400), CooldownKind::RateLimited);
        assert_eq!(c.active(now), Some(secs(400)));
        assert_eq!(c.kind(now), Some(CooldownKind::RateLimited));
        c.clear();
        assert_eq!(c.active(now), None);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_uses_retry_after_or_the_short_default() {
        let cfg = CooldownConfig::default();
        let mut c = Cooldown::default();
        let now = Instant::now();
        let until = c.note(
            &cfg,
            OutcomeClass::RateLimited,
            Some(Duration::from_millis(250)),
            now,
        );
        assert_eq!(until, Some(now + Duration::from_millis(250)));
        let until = c.note(&cfg, OutcomeClass::RateLimited, None, now);
        assert_eq!(until, Some(now + secs(1)));
        advance(secs(1)).await;
        assert_eq!(
            c.active(Instant::now()),
            None,
            "target used again after 1 s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn quota_uses_the_long_default_at_least() {
        let cfg = CooldownConfig::default();
        let mut c = Cooldown::default();
        let now = Instant::now();
        assert_eq!(
            c.note(&cfg, OutcomeClass::Quota, Some(secs(5)), now),
            Some(now + secs(300))
        );
        assert_eq!(c.kind(now), Some(CooldownKind::Quota));
        advance(secs(299)).await;
        assert_eq!(c.active(Instant::now()), Some(secs(1)));
        let later = Instant::now();
        // An upstream's hour is cut to max_retry_after (120 s), below the
        // configured quota minimum, which then holds.
        assert_eq!(
            c.note(&cfg, OutcomeClass::Quota, Some(secs(3600)), later),
            Some(later + secs(300))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_upstream_wait_of_a_year_is_cut_to_max_retry_after() {
        let cfg = CooldownConfig::default();
        let mut c = Cooldown::default();
        let now = Instant::now();
        let year = secs(365 * 24 * 3600);
        assert_eq!(
            c.note(&cfg, OutcomeClass::RateLimited, Some(year), now),
            Some(now + secs(120))
        );
        advance(secs(120)).await;
        assert_eq!(
            c.active(Instant::now()),
            None,
            "healthy again after the cap"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn other_classes_do_not_cool_down() {
        let cfg = CooldownConfig::default();
        let mut c = Cooldown::default();
        for class in OutcomeClass::ALL {
            if !matches!(class, OutcomeClass::RateLimited | OutcomeClass::Quota) {
                assert_eq!(c.note(&cfg, class, Some(secs(9)), Instant::now()), None);
            }
        }
        assert_eq!(c.active(Instant::now()), None);
    }

    #[test]
    fn deserializes_with_defaults() {
        let c: CooldownConfig = toml::from_str("quota_cooldown = \"10m\"").unwrap();
        assert_eq!(c.quota_cooldown, secs(600));
        assert_eq!(c.rate_limit_cooldown, secs(1));
        assert!(toml::from_str::<CooldownConfig>("quota = \"10m\"").is_err());
    }
}
