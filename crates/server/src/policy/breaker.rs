//! The circuit breaker of one provider x model: closed, open, half-open, plus
//! admin overrides. Owns admission and trip accounting only: it sees classified
//! outcomes (never HTTP), trips on trip-class failures alone (throttles, caller
//! errors and local rejections are excluded), and never sleeps or publishes:
//! the provider actor calls it with `now` and publishes what it returns.

use std::collections::VecDeque;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use tokio::time::Instant;

use super::outcome::OutcomeClass;
use super::window::Buckets;

/// Buckets the failure-rate window is split into.
const WINDOW_BUCKETS: u32 = 10;
/// Failure classes kept for the trip report.
const RECENT: usize = 5;

/// Breaker settings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Trip on this many trip-class failures in a row (a success resets the
    /// run; excluded outcomes neither count nor reset). Default 5; 0 disables.
    pub consecutive_failures: u32,
    /// Trip when trip-class failures reach this share of the calls in `window`
    /// (once `min_calls` is reached). Default 0.5; above 1 disables.
    pub failure_rate: f64,
    /// Sliding window of the failure rate, in 10 buckets. Default 30 s.
    #[serde(with = "crate::config::duration")]
    pub window: Duration,
    /// Calls (successes plus trip-class failures) the window needs before the
    /// rate may trip. Default 20.
    pub min_calls: u32,
    /// Open period of the first trip; each trip without a healthy spell in
    /// between doubles it. Default 30 s.
    #[serde(with = "crate::config::duration")]
    pub open_for: Duration,
    /// Cap of the grown open period (before jitter). Staying closed this long
    /// also resets the growth to `open_for`. Default 300 s.
    #[serde(with = "crate::config::duration")]
    pub max_open_for: Duration,
    /// Up to this fraction of the open period is added at random, so replicas
    /// do not re-probe in lockstep (Envoy `max_ejection_time_jitter`). In
    /// [0, 1]. Default 0.1.
    pub jitter: f64,
    /// Probes admitted at once while half-open; this many successes close the
    /// breaker. Default 1; 0 acts as 1.
    pub half_open_probes: u32,
    /// A probe that has not reported after this long re-opens the breaker
    /// (resilience4j `maxWaitDurationInHalfOpenState`). Default 30 s.
    #[serde(with = "crate::config::duration")]
    pub probe_timeout: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            consecutive_failures: 5,
            failure_rate: 0.5,
            window: Duration::from_secs(30),
            min_calls: 20,
            open_for: Duration::from_secs(30),
            max_open_for: Duration::from_secs(300),
            jitter: 0.1,
            half_open_probes: 1,
            probe_timeout: Duration::from_secs(30),
        }
    }
}

/// The breaker's state, as a label for logs, metrics and transitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Closed,
    Open,
    HalfOpen,
    ForcedOpen,
    ForcedClosed,
}

impl Phase {
    /// Stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Closed => "closed",
            Phase::Open => "open",
            Phase::HalfOpen => "half_open",
            Phase::ForcedOpen => "forced_open",
            Phase::ForcedClosed => "forced_closed",
        }
    }
}

/// A snapshot for publishing (e.g. on a `watch`) so the router need not ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    /// Refusing traffic; a probe is admitted after `retry_in`.
    Open {
        retry_in: Duration,
    },
    /// Admitting probes only.
    HalfOpen,
    /// Refused by an admin until `retry_in` passes (`None`: until cleared).
    ForcedOpen {
        retry_in: Option<Duration>,
    },
    /// Admitting everything, tripping on nothing, by an admin.
    ForcedClosed,
}

impl BreakerState {
    /// The label of this state.
    pub fn phase(self) -> Phase {
        match self {
            BreakerState::Closed => Phase::Closed,
            BreakerState::Open { .. } => Phase::Open,
            BreakerState::HalfOpen => Phase::HalfOpen,
            BreakerState::ForcedOpen { .. } => Phase::ForcedOpen,
            BreakerState::ForcedClosed => Phase::ForcedClosed,
        }
    }
}

/// Why [`Breaker::admit`] said no. A local rejection: never a provider failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BreakerRefusal {
    #[error("breaker open; a probe is allowed in {retry_in:?}")]
    Open { retry_in: Duration },
    #[error("breaker half-open and its probes are in flight")]
    HalfOpenBusy,
    #[error("breaker forced open")]
    ForcedOpen { retry_in: Option<Duration> },
}

impl BreakerRefusal {
    /// When the breaker may admit again, if known.
    pub fn retry_in(&self) -> Option<Duration> {
        match self {
            BreakerRefusal::Open { retry_in } => Some(*retry_in),
            BreakerRefusal::ForcedOpen { retry_in } => *retry_in,
            BreakerRefusal::HalfOpenBusy => None,
        }
    }
}

/// Permission for one attempt; hand it back to [`Breaker::record`] with the
/// outcome. Deliberately not `Clone`: one admission, one result.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "every admitted attempt must report its outcome"]
pub struct Ticket {
    /// The breaker generation that admitted it; results of older ones are ignored.
    generation: u64,
    /// The half-open probe slot it holds, if it is a probe.
    probe: Option<usize>,
}

impl Ticket {
    /// The generation that admitted this ticket.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether this ticket is a half-open probe.
    pub fn is_probe(&self) -> bool {
        self.probe.is_some()
    }

    /// The ticket [`Breaker::admit`] hands out while generation
    /// `generation` admits everything ([`Breaker::gate`]), taken without
    /// asking the breaker: the provider's published admission gate.
    pub fn through_gate(generation: u64) -> Ticket {
        Ticket {
            generation,
            probe: None,
        }
    }
}

/// An admin override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forced {
    /// Refuse everything until `until` (`None`: until cleared); then half-open.
    Open { until: Option<Instant> },
    /// Admit everything and never trip until `until` (`None`: until cleared);
    /// then closed with fresh counts.
    Closed { until: Option<Instant> },
}

/// What the closed breaker had seen when it tripped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tripped {
    /// Trip-class failures in a row.
    pub consecutive: u32,
    /// Trip-class failures in the rate window.
    pub window_failures: u64,
    /// Successes plus trip-class failures in the rate window.
    pub window_calls: u64,
    /// The last few trip-class failures, oldest first.
    pub recent: Vec<OutcomeClass>,
}

/// Why a transition happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// Closed -> open: `consecutive_failures` in a row.
    ConsecutiveFailures(Tripped),
    /// Closed -> open: the windowed failure rate reached `failure_rate`.
    FailureRate(Tripped),
    /// Half-open -> open: a probe failed with this class.
    ProbeFailed(OutcomeClass),
    /// Half-open -> open: a probe did not report within `probe_timeout`.
    ProbeTimeout,
    /// Open -> half-open: the open period is over.
    OpenElapsed,
    /// Half-open -> closed: `half_open_probes` probes succeeded.
    ProbesSucceeded,
    /// An admin override started.
    Forced,
    /// An admin override ended (expired or cleared).
    ForceEnded,
}

/// A state change, for the actor to log and publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub from: Phase,
    pub to: Phase,
    pub cause: Cause,
    /// For `to == Open`: how long it stays open, jitter included.
    pub open_for: Option<Duration>,
    /// The generation the breaker entered.
    pub generation: u64,
}

/// Tallies of the current generation (cleared on every transition).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Tickets handed out.
    pub admitted: u64,
    /// Results of `OutcomeClass::is_success` classes.
    pub successes: u64,
    /// Trip-class failures.
    pub failures: u64,
    /// Excluded results (cancellations, caller errors, throttles).
    pub excluded: u64,
    /// Trip-class failures since the last success.
    pub consecutive_failures: u32,
}

/// Successes and trip-class failures in one window bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Calls {
    successes: u64,
    failures: u64,
}

/// How a class counts for the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Success,
    Failure,
    Excluded,
}

impl Kind {
    fn of(class: OutcomeClass) -> Kind {
        if class.trips_breaker() {
            Kind::Failure
        } else if class.is_success() {
            Kind::Success
        } else {
            Kind::Excluded
        }
    }
}

/// The unforced state machine.
#[derive(Debug, Clone, PartialEq)]
enum State {
    Closed,
    Open {
        until: Instant,
    },
    HalfOpen {
        /// One entry per probe slot: when its probe was admitted.
        probes: Vec<Option<Instant>>,
        /// Probes that succeeded in this half-open spell.
        successes: u32,
    },
}

/// The breaker of one provider x model.
#[derive(Debug, Clone)]
pub struct Breaker {
    /// See [`BreakerConfig`].
    config: BreakerConfig,
    /// The state machine underneath any override.
    state: State,
    /// An admin override, while one is set.
    forced: Option<Forced>,
    /// Bumped on every transition; stale tickets are ignored.
    generation: u64,
    /// Tallies of this generation.
    counts: Counts,
    /// Successes and trip-class failures over `config.window` (closed only).
    window: Buckets<Calls>,
    /// The last few trip-class failures of this generation.
    recent: VecDeque<OutcomeClass>,
    /// Trips since the last healthy spell; the open period grows with it.
    trips: u32,
    /// When the breaker last closed (or was created).
    closed_since: Instant,
    /// Jitter source, seeded by the caller.
    rng: StdRng,
}

impl Breaker {
    /// A closed breaker. `seed` feeds the open-period jitter.
    pub fn new(config: BreakerConfig, now: Instant, seed: u64) -> Self {
        let window = Buckets::new(now, config.window, WINDOW_BUCKETS);
        Breaker {
            config,
            state: State::Closed,
            forced: None,
            generation: 0,
            counts: Counts::default(),
            window,
            recent: VecDeque::with_capacity(RECENT),
            trips: 0,
            closed_since: now,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// A breaker for a restarted provider actor: it comes back half-open, so
    /// nothing but probes reaches the provider until one succeeds.
    pub fn restarted(config: BreakerConfig, now: Instant, seed: u64) -> Self {
        let mut breaker = Breaker::new(config, now, seed);
        breaker.state = breaker.half_open();
        breaker
    }

    /// Ask to send one attempt. Applies time-driven transitions first (call
    /// [`Self::tick`] before it to observe them).
    pub fn admit(&mut self, now: Instant) -> Result<Ticket, BreakerRefusal> {
        let _ = self.tick(now);
        let probe = match (self.forced, &mut self.state) {
            (Some(Forced::Open { until }), _) => {
                let retry_in = until.map(|until| until.saturating_duration_since(now));
                return Err(BreakerRefusal::ForcedOpen { retry_in });
            }
            (Some(Forced::Closed { .. }), _) | (None, State::Closed) => None,
            (None, State::Open { until }) => {
                let retry_in = until.saturating_duration_since(now);
                return Err(BreakerRefusal::Open { retry_in });
            }
            (None, State::HalfOpen { probes, .. }) => {
                let free = probes.iter().position(Option::is_none);
                let slot = free.ok_or(BreakerRefusal::HalfOpenBusy)?;
                probes[slot] = Some(now);
                Some(slot)
            }
        };
        self.counts.admitted += 1;
        Ok(Ticket {
            generation: self.generation,
            probe,
        })
    }

    /// Report the outcome of an admitted attempt. Results from an older
    /// generation are ignored; excluded classes only release a probe slot.
    pub fn record(
        &mut self,
        ticket: Ticket,
        class: OutcomeClass,
        now: Instant,
    ) -> Option<Transition> {
        if let Some(transition) = self.tick(now) {
            // The ticket's generation is over: the result no longer counts.
            return Some(transition);
        }
        if ticket.generation != self.generation {
            return None;
        }
        let kind = Kind::of(class);
        self.count(kind);
        if self.forced.is_some() {
            return None;
        }
        match self.state {
            State::Closed => self.record_closed(kind, class, now),
            State::HalfOpen { .. } => self.record_probe(ticket.probe, kind, class, now),
            State::Open { .. } => None,
        }
    }

    /// Apply time-driven transitions: an override expiring, the open period
    /// ending, a probe timing out. At most one happens per call.
    #[must_use]
    pub fn tick(&mut self, now: Instant) -> Option<Transition> {
        if let Some(forced) = self.forced {
            let until = match forced {
                Forced::Open { until } | Forced::Closed { until } => until,
            };
            return match until {
                Some(until) if now >= until => Some(self.end_force(forced, now)),
                _ => None,
            };
        }
        match &self.state {
            State::Open { until } if now >= *until => {
                let half_open = self.half_open();
                Some(self.enter(half_open, Cause::OpenElapsed, None, now))
            }
            State::HalfOpen { probes, .. }
                if probes.iter().flatten().any(|admitted| {
                    now >= crate::policy::clock::after(*admitted, self.config.probe_timeout)
                }) =>
            {
                Some(self.open(Cause::ProbeTimeout, now))
            }
            _ => None,
        }
    }

    /// Start an admin override. Tickets already out are ignored from now on.
    pub fn force(&mut self, forced: Forced) -> Transition {
        let from = self.phase();
        self.forced = Some(forced);
        self.next_generation();
        Transition {
            from,
            to: self.phase(),
            cause: Cause::Forced,
            open_for: None,
            generation: self.generation,
        }
    }

    /// End an admin override now: forced open goes half-open, forced closed
    /// goes closed with fresh counts. `None` when there was none.
    pub fn clear_force(&mut self, now: Instant) -> Option<Transition> {
        let forced = self.forced?;
        Some(self.end_force(forced, now))
    }

    /// A snapshot for publishing. Exact for time-driven transitions except a
    /// probe timeout, which shows once [`Self::tick`] or another call applies it.
    pub fn state(&self, now: Instant) -> BreakerState {
        match (self.forced, &self.state) {
            (Some(Forced::Open { until: Some(until) }), _) if now >= until => {
                BreakerState::HalfOpen
            }
            (Some(Forced::Open { until }), _) => BreakerState::ForcedOpen {
                retry_in: until.map(|until| until.saturating_duration_since(now)),
            },
            (Some(Forced::Closed { until: Some(until) }), _) if now >= until => {
                BreakerState::Closed
            }
            (Some(Forced::Closed { .. }), _) => BreakerState::ForcedClosed,
            (None, State::Closed) => BreakerState::Closed,
            (None, State::Open { until }) if now >= *until => BreakerState::HalfOpen,
            (None, State::Open { until }) => BreakerState::Open {
                retry_in: until.saturating_duration_since(now),
            },
            (None, State::HalfOpen { .. }) => BreakerState::HalfOpen,
        }
    }

    /// The current generation: bumped on every transition.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The generation whose tickets may be taken without asking
    /// ([`Ticket::through_gate`]): `Some` only while the breaker admits
    /// every attempt with no time-driven change pending (closed, no
    /// override). Half-open probes and overrides always go through
    /// [`Self::admit`].
    pub fn gate(&self) -> Option<u64> {
        matches!((self.forced, &self.state), (None, State::Closed)).then_some(self.generation)
    }

    /// Tallies since the last transition.
    pub fn counts(&self) -> Counts {
        self.counts
    }

    /// Half-open probes admitted and not yet reported.
    pub fn outstanding_probes(&self) -> usize {
        match &self.state {
            State::HalfOpen { probes, .. } if self.forced.is_none() => {
                probes.iter().flatten().count()
            }
            _ => 0,
        }
    }

    fn record_closed(
        &mut self,
        kind: Kind,
        class: OutcomeClass,
        now: Instant,
    ) -> Option<Transition> {
        let calls = self.window.current(now);
        match kind {
            Kind::Success => calls.successes += 1,
            Kind::Failure => calls.failures += 1,
            Kind::Excluded => return None,
        }
        if kind != Kind::Failure {
            return None;
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(class);
        let cause = self.trip_cause(now)?;
        Some(self.open(cause, now))
    }

    fn record_probe(
        &mut self,
        probe: Option<usize>,
        kind: Kind,
        class: OutcomeClass,
        now: Instant,
    ) -> Option<Transition> {
        let needed = self.probe_slots();
        let State::HalfOpen { probes, successes } = &mut self.state else {
            return None;
        };
        if let Some(slot) = probe.and_then(|slot| probes.get_mut(slot)) {
            *slot = None;
        }
        match kind {
            Kind::Excluded => None,
            Kind::Success => {
                *successes += 1;
                (*successes as usize >= needed)
                    .then(|| self.enter(State::Closed, Cause::ProbesSucceeded, None, now))
            }
            Kind::Failure => Some(self.open(Cause::ProbeFailed(class), now)),
        }
    }

    /// Which trip rule, if any, the closed breaker now meets.
    fn trip_cause(&self, now: Instant) -> Option<Cause> {
        let (failures, calls) = self.window.live(now).fold((0, 0), |(f, c), b| {
            (f + b.failures, c + b.successes + b.failures)
        });
        let tripped = Tripped {
            consecutive: self.counts.consecutive_failures,
            window_failures: failures,
            window_calls: calls,
            recent: self.recent.iter().copied().collect(),
        };
        let limit = self.config.consecutive_failures;
        if limit > 0 && tripped.consecutive >= limit {
            return Some(Cause::ConsecutiveFailures(tripped));
        }
        let rate_met = failures as f64 >= self.config.failure_rate * calls as f64;
        (calls > 0 && calls >= u64::from(self.config.min_calls) && rate_met)
            .then_some(Cause::FailureRate(tripped))
    }

    fn count(&mut self, kind: Kind) {
        let counts = &mut self.counts;
        match kind {
            Kind::Success => {
                counts.successes += 1;
                counts.consecutive_failures = 0;
            }
            Kind::Failure => {
                counts.failures += 1;
                counts.consecutive_failures = counts.consecutive_failures.saturating_add(1);
            }
            Kind::Excluded => counts.excluded += 1,
        }
    }

    /// Trip (from closed) or re-open (from half-open) for a grown period.
    fn open(&mut self, cause: Cause, now: Instant) -> Transition {
        let healthy_for = now.saturating_duration_since(self.closed_since);
        if self.state == State::Closed && healthy_for >= self.config.max_open_for {
            self.trips = 0;
        }
        self.trips = self.trips.saturating_add(1);
        let period = self.open_period();
        let until = now
            .checked_add(period)
            .unwrap_or_else(|| crate::policy::clock::after(now, self.config.max_open_for));
        self.enter(State::Open { until }, cause, Some(period), now)
    }

    /// `min(max_open_for, open_for * 2^(trips-1))` plus up to `jitter` of it.
    fn open_period(&mut self) -> Duration {
        let base = self.config.open_for;
        let cap = self.config.max_open_for.max(base);
        let grown = match 1u32.checked_shl(self.trips.saturating_sub(1)) {
            Some(factor) => base.saturating_mul(factor),
            None => Duration::MAX,
        }
        .min(cap);
        let fraction = self.config.jitter.clamp(0.0, 1.0) * self.rng.random::<f64>();
        let jitter =
            Duration::try_from_secs_f64(grown.as_secs_f64() * fraction).unwrap_or(Duration::ZERO);
        grown.saturating_add(jitter)
    }

    fn end_force(&mut self, forced: Forced, now: Instant) -> Transition {
        let state = match forced {
            Forced::Open { .. } => self.half_open(),
            Forced::Closed { .. } => State::Closed,
        };
        self.enter(state, Cause::ForceEnded, None, now)
    }

    /// Move the unforced machine to `state`, ending any override.
    fn enter(
        &mut self,
        state: State,
        cause: Cause,
        open_for: Option<Duration>,
        now: Instant,
    ) -> Transition {
        let from = self.phase();
        self.forced = None;
        if state == State::Closed && self.state != State::Closed {
            self.closed_since = now;
        }
        self.state = state;
        self.next_generation();
        Transition {
            from,
            to: self.phase(),
            cause,
            open_for,
            generation: self.generation,
        }
    }

    /// A new generation: fresh counts, window and failure history.
    fn next_generation(&mut self) {
        self.generation += 1;
        self.counts = Counts::default();
        self.window.clear();
        self.recent.clear();
    }

    fn phase(&self) -> Phase {
        match (self.forced, &self.state) {
            (Some(Forced::Open { .. }), _) => Phase::ForcedOpen,
            (Some(Forced::Closed { .. }), _) => Phase::ForcedClosed,
            (None, State::Closed) => Phase::Closed,
            (None, State::Open { .. }) => Phase::Open,
            (None, State::HalfOpen { .. }) => Phase::HalfOpen,
        }
    }

    fn half_open(&self) -> State {
        State::HalfOpen {
            probes: vec![None; self.probe_slots()],
            successes: 0,
        }
    }

    fn probe_slots(&self) -> usize {
        self.config.half_open_probes.max(1) as usize
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::{Arc, Mutex};
    use tokio::time::advance;
    use OutcomeClass::{Cancelled, Ok as Success, Overloaded, Quota, RateLimited, ServerError};

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Defaults without jitter, so open periods are exact.
    fn exact() -> BreakerConfig {
        BreakerConfig {
            jitter: 0.0,
            ..BreakerConfig::default()
        }
    }

    fn breaker(config: BreakerConfig) -> Breaker {
        Breaker::new(config, Instant::now(), 7)
    }

    /// Admit one attempt now and report `class` for it.
    fn call(b: &mut Breaker, class: OutcomeClass) -> Option<Transition> {
        let now = Instant::now();
        let ticket = b.admit(now).unwrap();
        b.record(ticket, class, now)
    }

    /// Trip a default breaker with five server errors.
    fn trip(b: &mut Breaker) -> Transition {
        for _ in 0..4 {
            assert_eq!(call(b, ServerError), None);
        }
        call(b, ServerError).unwrap()
    }

    /// Wait out the open period and fail the probe; returns the new open period.
    async fn fail_probe(b: &mut Breaker) -> Duration {
        let BreakerState::Open { retry_in } = b.state(Instant::now()) else {
            panic!("not open: {:?}", b.state(Instant::now()));
        };
        advance(retry_in).await;
        let t = call(b, Overloaded).unwrap();
        assert_eq!((t.from, t.to), (Phase::HalfOpen, Phase::Open));
        assert_eq!(t.cause, Cause::ProbeFailed(Overloaded));
        t.open_for.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn four_failures_stay_closed_the_fifth_opens() {
        let mut b = breaker(exact());
        for _ in 0..4 {
            assert_eq!(call(&mut b, ServerError), None);
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
        assert_eq!(
            b.counts(),
            Counts {
                admitted: 4,
                failures: 4,
                consecutive_failures: 4,
                ..Counts::default()
            }
        );
        let t = call(&mut b, Overloaded).unwrap();
        assert_eq!((t.from, t.to), (Phase::Closed, Phase::Open));
        assert_eq!(t.open_for, Some(secs(30)));
        assert_eq!(t.generation, 1);
        assert_eq!(
            t.cause,
            Cause::ConsecutiveFailures(Tripped {
                consecutive: 5,
                window_failures: 5,
                window_calls: 5,
                recent: vec![
                    ServerError,
                    ServerError,
                    ServerError,
                    ServerError,
                    Overloaded
                ],
            })
        );
        assert_eq!(b.counts(), Counts::default(), "counts cleared on the trip");
        assert_eq!(
            b.admit(Instant::now()),
            Err(BreakerRefusal::Open { retry_in: secs(30) })
        );
        assert_eq!(b.counts().admitted, 0, "refusals are not attempts");
    }

    #[tokio::test(start_paused = true)]
    async fn a_success_resets_the_consecutive_count() {
        let mut b = breaker(exact());
        for _ in 0..4 {
            call(&mut b, ServerError);
        }
        assert_eq!(call(&mut b, Success), None);
        assert_eq!(b.counts().consecutive_failures, 0);
        for _ in 0..4 {
            assert_eq!(call(&mut b, ServerError), None);
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
        assert!(call(&mut b, ServerError).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn excluded_classes_neither_count_nor_reset() {
        let mut b = breaker(exact());
        for _ in 0..4 {
            call(&mut b, ServerError);
        }
        for class in OutcomeClass::ALL.into_iter().filter(|c| c.is_excluded()) {
            for _ in 0..10 {
                assert_eq!(call(&mut b, class), None, "{class}");
            }
        }
        let counts = b.counts();
        assert_eq!((counts.failures, counts.excluded), (4, 70));
        assert_eq!(counts.consecutive_failures, 4);
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
        assert!(call(&mut b, ServerError).is_some(), "the run was not reset");
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limits_and_quota_never_trip() {
        let mut b = breaker(exact());
        for _ in 0..100 {
            assert_eq!(call(&mut b, RateLimited), None);
            assert_eq!(call(&mut b, Quota), None);
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_trips_at_min_calls_and_not_before() {
        let mut b = breaker(exact());
        // F F S, six times: 18 calls, 12 failures, never more than 2 in a row.
        for _ in 0..6 {
            call(&mut b, ServerError);
            call(&mut b, ServerError);
            call(&mut b, Success);
        }
        assert_eq!(call(&mut b, ServerError), None, "19 calls: under min_calls");
        let t = call(&mut b, ServerError).unwrap();
        let Cause::FailureRate(tripped) = t.cause else {
            panic!("{:?}", t.cause);
        };
        assert_eq!((tripped.window_failures, tripped.window_calls), (14, 20));
        assert_eq!(tripped.consecutive, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_trips_exactly_at_the_threshold() {
        let mut b = breaker(exact());
        for _ in 0..9 {
            call(&mut b, Success);
            assert_eq!(call(&mut b, ServerError), None);
        }
        call(&mut b, Success);
        // 20 calls, 10 failures: 50 % >= 50 %.
        let t = call(&mut b, ServerError).unwrap();
        assert!(matches!(t.cause, Cause::FailureRate(_)));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_below_the_threshold_never_trips() {
        let mut b = breaker(exact());
        for _ in 0..100 {
            call(&mut b, Success);
            call(&mut b, Success);
            assert_eq!(call(&mut b, ServerError), None);
        }
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
    }

    /// 19 calls (9 failures), then `wait`, then one more failure.
    async fn nineteen_then_a_failure_after(wait: Duration) -> Option<Transition> {
        let mut b = breaker(exact());
        for _ in 0..9 {
            call(&mut b, Success);
            call(&mut b, ServerError);
        }
        call(&mut b, Success);
        advance(wait).await;
        call(&mut b, ServerError)
    }

    #[tokio::test(start_paused = true)]
    async fn old_window_entries_age_out() {
        // Still inside the 30 s window: 20 calls, 10 failures trips.
        assert!(nineteen_then_a_failure_after(ms(29_999)).await.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn old_window_entries_age_out_after_the_window() {
        assert_eq!(nineteen_then_a_failure_after(secs(30)).await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn open_until_the_period_ends_then_half_open() {
        let mut b = breaker(exact());
        trip(&mut b);
        advance(secs(30) - ms(1)).await;
        assert_eq!(b.tick(Instant::now()), None);
        assert_eq!(
            b.state(Instant::now()),
            BreakerState::Open { retry_in: ms(1) }
        );
        assert_eq!(
            b.admit(Instant::now()),
            Err(BreakerRefusal::Open { retry_in: ms(1) })
        );
        advance(ms(1)).await;
        assert_eq!(b.state(Instant::now()), BreakerState::HalfOpen);
        let t = b.tick(Instant::now()).unwrap();
        assert_eq!(
            (t.from, t.to, t.cause),
            (Phase::Open, Phase::HalfOpen, Cause::OpenElapsed)
        );
        let probe = b.admit(Instant::now()).unwrap();
        assert!(probe.is_probe());
        let t = b.record(probe, Success, Instant::now()).unwrap();
        assert_eq!(
            (t.from, t.to, t.cause),
            (Phase::HalfOpen, Phase::Closed, Cause::ProbesSucceeded)
        );
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_admits_one_probe_and_an_excluded_result_releases_it() {
        let mut b = breaker(exact());
        trip(&mut b);
        advance(secs(30)).await;
        let first = b.admit(Instant::now()).unwrap();
        for _ in 0..3 {
            assert_eq!(b.admit(Instant::now()), Err(BreakerRefusal::HalfOpenBusy));
        }
        assert_eq!(b.outstanding_probes(), 1);
        // The caller cancelled the probe: it must not wedge the breaker.
        assert_eq!(b.record(first, Cancelled, Instant::now()), None);
        assert_eq!(b.outstanding_probes(), 0);
        assert_eq!(b.state(Instant::now()), BreakerState::HalfOpen);
        let second = b.admit(Instant::now()).unwrap();
        assert_eq!(b.admit(Instant::now()), Err(BreakerRefusal::HalfOpenBusy));
        assert_eq!(
            b.record(second, Success, Instant::now()).unwrap().to,
            Phase::Closed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn several_probes_must_all_succeed() {
        let mut b = breaker(BreakerConfig {
            half_open_probes: 3,
            ..exact()
        });
        trip(&mut b);
        advance(secs(30)).await;
        let probes: Vec<Ticket> = (0..3).map(|_| b.admit(Instant::now()).unwrap()).collect();
        assert_eq!(b.admit(Instant::now()), Err(BreakerRefusal::HalfOpenBusy));
        let mut probes = probes.into_iter();
        assert_eq!(
            b.record(probes.next().unwrap(), Success, Instant::now()),
            None
        );
        assert_eq!(
            b.record(probes.next().unwrap(), Success, Instant::now()),
            None
        );
        let t = b
            .record(probes.next().unwrap(), Success, Instant::now())
            .unwrap();
        assert_eq!(t.to, Phase::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn probe_timeout_returns_to_open() {
        let mut b = breaker(exact());
        trip(&mut b);
        advance(secs(30)).await;
        let hung = b.admit(Instant::now()).unwrap();
        advance(secs(30) - ms(1)).await;
        assert_eq!(b.tick(Instant::now()), None);
        advance(ms(1)).await;
        let t = b.tick(Instant::now()).unwrap();
        assert_eq!(
            (t.from, t.to, t.cause),
            (Phase::HalfOpen, Phase::Open, Cause::ProbeTimeout)
        );
        assert_eq!(
            t.open_for,
            Some(secs(60)),
            "a timed-out probe counts as a failure"
        );
        // The hung probe finally answers: too late to count.
        assert_eq!(b.record(hung, Success, Instant::now()), None);
        assert_eq!(
            b.state(Instant::now()),
            BreakerState::Open { retry_in: secs(60) }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_out_probe_is_noticed_by_record_too() {
        let mut b = breaker(exact());
        trip(&mut b);
        advance(secs(30)).await;
        let hung = b.admit(Instant::now()).unwrap();
        advance(secs(31)).await;
        let t = b.record(hung, Success, Instant::now()).unwrap();
        assert_eq!(t.cause, Cause::ProbeTimeout);
    }

    #[tokio::test(start_paused = true)]
    async fn open_period_doubles_up_to_the_cap() {
        let mut b = breaker(exact());
        assert_eq!(trip(&mut b).open_for, Some(secs(30)));
        let mut periods = Vec::new();
        for _ in 0..6 {
            periods.push(fail_probe(&mut b).await);
        }
        assert_eq!(periods, [60, 120, 240, 300, 300, 300].map(secs));
    }

    #[tokio::test(start_paused = true)]
    async fn growth_resets_after_staying_closed_for_max_open_for() {
        let mut b = breaker(exact());
        trip(&mut b);
        assert_eq!(fail_probe(&mut b).await, secs(60));
        advance(secs(60)).await;
        assert_eq!(call(&mut b, Success).unwrap().to, Phase::Closed);
        // Closed only briefly: the next trip keeps growing.
        advance(secs(299)).await;
        assert_eq!(trip(&mut b).open_for, Some(secs(120)));
        advance(secs(120)).await;
        call(&mut b, Success);
        // Closed for 300 s: back to the base period.
        advance(secs(300)).await;
        assert_eq!(trip(&mut b).open_for, Some(secs(30)));
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_stays_within_its_fraction_and_spreads() {
        let config = BreakerConfig::default();
        let mut firsts = Vec::new();
        for seed in 0..50 {
            let mut b = Breaker::new(config.clone(), Instant::now(), seed);
            let first = trip(&mut b).open_for.unwrap();
            assert!(first >= secs(30) && first <= secs(33), "{first:?}");
            firsts.push(first);
            for _ in 0..5 {
                fail_probe(&mut b).await;
            }
            let capped = fail_probe(&mut b).await;
            assert!(capped >= secs(300) && capped <= secs(330), "{capped:?}");
        }
        firsts.sort();
        firsts.dedup();
        assert!(firsts.len() > 40, "replicas must not re-probe in lockstep");
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_result_from_before_the_trip_is_ignored() {
        let mut b = breaker(exact());
        let slow = b.admit(Instant::now()).unwrap();
        let before = b.generation();
        trip(&mut b);
        assert_ne!(b.generation(), before);
        advance(secs(30)).await;
        let probe = b.admit(Instant::now()).unwrap();
        // The slow request fails now: it must not re-open the half-open breaker.
        assert_eq!(b.record(slow, ServerError, Instant::now()), None);
        assert_eq!(b.state(Instant::now()), BreakerState::HalfOpen);
        assert_eq!(b.counts().failures, 0);
        assert_eq!(
            b.record(probe, Success, Instant::now()).unwrap().to,
            Phase::Closed
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_result_does_not_change_the_new_counts() {
        let mut b = breaker(exact());
        let slow = b.admit(Instant::now()).unwrap();
        trip(&mut b);
        advance(secs(30)).await;
        call(&mut b, Success);
        for _ in 0..4 {
            call(&mut b, ServerError);
        }
        assert_eq!(b.record(slow, Success, Instant::now()), None);
        assert_eq!(
            b.counts().consecutive_failures,
            4,
            "not reset by a stale success"
        );
        assert_eq!(b.counts().successes, 0);
        assert!(call(&mut b, ServerError).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_gate_is_open_only_while_closed_and_its_tickets_count_like_admitted_ones() {
        let mut b = breaker(exact());
        let generation = b.gate().expect("a new breaker admits everything");
        // A ticket taken through the gate records like one from `admit`.
        for _ in 0..4 {
            let t = Ticket::through_gate(generation);
            assert_eq!(b.record(t, ServerError, Instant::now()), None);
        }
        let t = Ticket::through_gate(generation);
        assert!(
            b.record(t, ServerError, Instant::now()).is_some(),
            "the fifth trips"
        );
        assert_eq!(b.gate(), None, "open: every attempt asks");
        // A gate ticket of the tripped generation is stale.
        let stale = Ticket::through_gate(generation);
        advance(secs(30)).await;
        assert_eq!(
            b.gate(),
            None,
            "half-open: probes are handed out one by one"
        );
        let probe = b.admit(Instant::now()).unwrap();
        assert!(probe.is_probe());
        assert_eq!(b.record(stale, Success, Instant::now()), None);
        assert_eq!(b.gate(), None, "a stale success does not close it");
        let closed = b.record(probe, Success, Instant::now());
        assert_eq!(closed.map(|t| t.to), Some(Phase::Closed));
        assert!(
            b.gate().is_some_and(|g| g > generation),
            "open again, a new generation"
        );
        let _ = b.force(Forced::Closed { until: None });
        assert_eq!(b.gate(), None, "an override always asks");
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_breaker_starts_half_open() {
        let mut b = Breaker::restarted(exact(), Instant::now(), 1);
        assert_eq!(b.state(Instant::now()), BreakerState::HalfOpen);
        let probe = b.admit(Instant::now()).unwrap();
        assert_eq!(b.admit(Instant::now()), Err(BreakerRefusal::HalfOpenBusy));
        let t = b.record(probe, ServerError, Instant::now()).unwrap();
        assert_eq!(
            (t.from, t.to, t.open_for),
            (Phase::HalfOpen, Phase::Open, Some(secs(30)))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn forced_open_refuses_until_its_time_then_probes() {
        let mut b = breaker(exact());
        let in_flight = b.admit(Instant::now()).unwrap();
        let until = Instant::now() + secs(10);
        let t = b.force(Forced::Open { until: Some(until) });
        assert_eq!(
            (t.from, t.to, t.cause),
            (Phase::Closed, Phase::ForcedOpen, Cause::Forced)
        );
        assert_eq!(
            b.admit(Instant::now()),
            Err(BreakerRefusal::ForcedOpen {
                retry_in: Some(secs(10))
            })
        );
        assert_eq!(b.record(in_flight, ServerError, Instant::now()), None);
        advance(secs(10)).await;
        assert_eq!(b.state(Instant::now()), BreakerState::HalfOpen);
        let t = b.tick(Instant::now()).unwrap();
        assert_eq!(
            (t.from, t.to, t.cause),
            (Phase::ForcedOpen, Phase::HalfOpen, Cause::ForceEnded)
        );
        assert!(b.admit(Instant::now()).unwrap().is_probe());
    }

    #[tokio::test(start_paused = true)]
    async fn forced_open_without_a_time_lasts_until_cleared() {
        let mut b = breaker(exact());
        b.force(Forced::Open { until: None });
        advance(secs(100_000)).await;
        assert_eq!(b.tick(Instant::now()), None);
        assert_eq!(
            b.state(Instant::now()),
            BreakerState::ForcedOpen { retry_in: None }
        );
        let t = b.clear_force(Instant::now()).unwrap();
        assert_eq!(t.to, Phase::HalfOpen);
        assert_eq!(b.clear_force(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn forced_closed_admits_everything_and_never_trips() {
        let mut b = breaker(exact());
        trip(&mut b);
        b.force(Forced::Closed { until: None });
        for _ in 0..50 {
            assert_eq!(call(&mut b, ServerError), None);
        }
        assert_eq!(b.state(Instant::now()), BreakerState::ForcedClosed);
        assert_eq!(b.counts().failures, 50);
        let t = b.clear_force(Instant::now()).unwrap();
        assert_eq!((t.from, t.to), (Phase::ForcedClosed, Phase::Closed));
        assert_eq!(b.counts(), Counts::default());
        for _ in 0..4 {
            assert_eq!(call(&mut b, ServerError), None);
        }
        assert!(call(&mut b, ServerError).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn forced_closed_with_a_time_expires_to_closed() {
        let mut b = breaker(exact());
        b.force(Forced::Closed {
            until: Some(Instant::now() + secs(5)),
        });
        advance(secs(5)).await;
        assert_eq!(b.state(Instant::now()), BreakerState::Closed);
        assert_eq!(b.tick(Instant::now()).unwrap().to, Phase::Closed);
    }

    /// gobreaker `TestCircuitBreakerInParallel`: counts are exact under contention.
    #[test]
    fn counts_are_exact_from_many_threads() {
        const THREADS: u64 = 8;
        const CALLS: u64 = 10_000;
        let now = Instant::now();
        let b = Arc::new(Mutex::new(Breaker::new(exact(), now, 1)));
        let handles: Vec<_> = (0..THREADS)
            .map(|thread| {
                let b = Arc::clone(&b);
                std::thread::spawn(move || {
                    let class = if thread % 2 == 0 { Success } else { Cancelled };
                    for _ in 0..CALLS {
                        let ticket = b.lock().unwrap().admit(now).unwrap();
                        assert_eq!(b.lock().unwrap().record(ticket, class, now), None);
                    }
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap();
        }
        let b = b.lock().unwrap();
        assert_eq!(
            b.counts(),
            Counts {
                admitted: THREADS * CALLS,
                successes: THREADS / 2 * CALLS,
                excluded: THREADS / 2 * CALLS,
                ..Counts::default()
            }
        );
        assert_eq!(b.state(now), BreakerState::Closed);
    }

    #[test]
    fn deserializes_with_defaults() {
        let c: BreakerConfig = toml::from_str("open_for = \"1m\"\nhalf_open_probes = 3").unwrap();
        assert_eq!(
            c,
            BreakerConfig {
                open_for: secs(60),
                half_open_probes: 3,
                ..BreakerConfig::default()
            }
        );
        assert!(toml::from_str::<BreakerConfig>("threshold = 5").is_err());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit,
        /// Report the held ticket at this index (mod the count) with a class.
        Record(usize, usize),
        Advance(u64),
        Tick,
        ForceOpen,
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => Just(Op::Admit),
            6 => (any::<usize>(), 0..OutcomeClass::ALL.len()).prop_map(|(i, c)| Op::Record(i, c)),
            3 => (0u64..8_000).prop_map(Op::Advance),
            1 => Just(Op::Tick),
            1 => Just(Op::ForceOpen),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// Whatever happens, no more than `half_open_probes` probes are out, and
        /// the breaker's own count matches the probe tickets actually held.
        #[test]
        fn never_more_probes_than_configured(
            ops in proptest::collection::vec(op(), 1..400),
            half_open_probes in 1u32..=3,
            consecutive_failures in 1u32..=3,
            seed in any::<u64>(),
        ) {
            let config = BreakerConfig {
                consecutive_failures,
                min_calls: 4,
                open_for: secs(1),
                max_open_for: secs(8),
                probe_timeout: secs(5),
                half_open_probes,
                ..BreakerConfig::default()
            };
            let t0 = Instant::now();
            let mut now = t0;
            let mut b = Breaker::new(config, t0, seed);
            let mut held: Vec<Ticket> = Vec::new();
            for op in ops {
                match op {
                    Op::Admit => {
                        if let Ok(ticket) = b.admit(now) {
                            held.push(ticket);
                        }
                    }
                    Op::Record(i, c) if !held.is_empty() => {
                        let ticket = held.swap_remove(i % held.len());
                        let _ = b.record(ticket, OutcomeClass::ALL[c], now);
                    }
                    Op::Record(..) => {}
                    Op::Advance(n) => now += ms(n),
                    Op::Tick => {
                        let _ = b.tick(now);
                    }
                    Op::ForceOpen => {
                        b.force(Forced::Open { until: Some(now + secs(2)) });
                    }
                    Op::Clear => {
                        let _ = b.clear_force(now);
                    }
                }
                let live_probes = held
                    .iter()
                    .filter(|t| t.is_probe() && t.generation() == b.generation())
                    .count();
                prop_assert!(live_probes <= half_open_probes as usize);
                prop_assert_eq!(live_probes, b.outstanding_probes());
            }
        }
    }
}
