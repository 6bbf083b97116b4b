//! The breaker in front of Redis: pure arithmetic over consecutive failures
//! with `now` passed in. Three failures in a row open it for a second; then
//! one call goes through as a probe and its outcome closes or reopens it. It
//! never does I/O or logging: the client wires it to calls and logs transitions.

use std::time::Duration;

use tokio::time::Instant;

/// Consecutive failures that open the breaker.
pub(crate) const FAILURES_TO_OPEN: u32 = 3;
/// How long an open breaker fails calls fast before letting a probe through.
pub(crate) const OPEN_FOR: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
    Open {
        until: Instant,
    },
    /// One probe is in flight; everyone else fails fast.
    HalfOpen,
}

/// What the breaker lets a caller do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// A normal call; report its outcome with this generation.
    Call(u64),
    /// The single probe after the open period; report its outcome.
    Probe(u64),
    /// Fail fast; the breaker stays open this much longer (zero while probing).
    Reject(Duration),
}

/// A state change worth logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transition {
    Opened,
    Reopened,
    Closed,
}

/// The breaker's state. Outcomes carry the generation they were admitted in,
/// so a late answer from before a transition is ignored.
#[derive(Debug)]
pub(crate) struct Breaker {
    /// Failures in a row while closed.
    failures: u32,
    state: State,
    /// Bumped on every state change.
    generation: u64,
}

impl Breaker {
    pub(crate) fn new() -> Self {
        Breaker {
            failures: 0,
            state: State::Closed,
            generation: 0,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.state == State::Closed
    }

    fn set(&mut self, state: State) {
        self.state = state;
        self.generation += 1;
    }

    pub(crate) fn admit(&mut self, now: Instant) -> Admit {
        match self.state {
            State::Closed => Admit::Call(self.generation),
            State::Open { until } if now >= until => {
                self.set(State::HalfOpen);
                Admit::Probe(self.generation)
            }
            State::Open { until } => Admit::Reject(until - now),
            State::HalfOpen => Admit::Reject(Duration::ZERO),
        }
    }

    pub(crate) fn success(&mut self, generation: u64) -> Option<Transition> {
        if generation != self.generation {
            return None;
        }
        self.failures = 0;
        match self.state {
            State::Closed => None,
            _ => {
                self.set(State::Closed);
                Some(Transition::Closed)
            }
        }
    }

    pub(crate) fn failure(&mut self, generation: u64, now: Instant) -> Option<Transition> {
        if generation != self.generation {
            return None;
        }
        match self.state {
            State::Closed => {
                self.failures += 1;
                if self.failures >= FAILURES_TO_OPEN {
                    self.failures = 0;
                    self.set(State::Open {
                        until: now + OPEN_FOR,
                    });
                    Some(Transition::Opened)
                } else {
                    None
                }
            }
            State::HalfOpen => {
                self.set(State::Open {
                    until: now + OPEN_FOR,
                });
                Some(Transition::Reopened)
            }
            State::Open { .. } => None,
        }
    }

    /// The probe's caller went away before it finished: let the next caller probe.
    pub(crate) fn abandoned(&mut self, generation: u64, now: Instant) {
        if generation == self.generation && self.state == State::HalfOpen {
            self.set(State::Open { until: now });
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn generation(a: Admit) -> u64 {
        match a {
            Admit::Call(g) | Admit::Probe(g) => g,
            Admit::Reject(_) => panic!("rejected"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn two_failures_stay_closed_the_third_opens_for_a_second() {
        let mut b = Breaker::new();
        let now = Instant::now();
        for _ in 0..2 {
            let g = generation(b.admit(now));
            assert_eq!(b.failure(g, now), None);
        }
        assert!(b.is_closed());
        let g = generation(b.admit(now));
        assert_eq!(b.failure(g, now), Some(Transition::Opened));
        assert!(!b.is_closed());
        assert_eq!(b.admit(now), Admit::Reject(OPEN_FOR));
        let later = now + Duration::from_millis(999);
        assert_eq!(b.admit(later), Admit::Reject(Duration::from_millis(1)));
        let at = now + OPEN_FOR;
        let probe = b.admit(at);
        assert!(matches!(probe, Admit::Probe(_)));
        assert_eq!(
            b.admit(at),
            Admit::Reject(Duration::ZERO),
            "one probe at a time"
        );
        assert_eq!(b.success(generation(probe)), Some(Transition::Closed));
        assert!(b.is_closed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_probe_reopens_and_a_success_resets_the_count() {
        let mut b = Breaker::new();
        let now = Instant::now();
        let g = generation(b.admit(now));
        b.failure(g, now);
        b.failure(g, now);
        b.success(g);
        b.failure(g, now);
        b.failure(g, now);
        assert!(b.is_closed(), "a success in between resets the count");
        b.failure(g, now);
        assert!(!b.is_closed());
        let t = now + OPEN_FOR;
        let p = generation(b.admit(t));
        assert_eq!(b.failure(p, t), Some(Transition::Reopened));
        assert!(matches!(b.admit(t), Admit::Reject(d) if d == OPEN_FOR));
    }

    #[tokio::test(start_paused = true)]
    async fn late_outcomes_from_an_earlier_generation_are_ignored() {
        let mut b = Breaker::new();
        let now = Instant::now();
        let old = generation(b.admit(now));
        for _ in 0..3 {
            b.failure(old, now);
        }
        assert_eq!(b.success(old), None, "a late success does not close it");
        assert!(!b.is_closed());
        let p = generation(b.admit(now + OPEN_FOR));
        b.abandoned(p, now + OPEN_FOR);
        assert!(
            matches!(b.admit(now + OPEN_FOR), Admit::Probe(_)),
            "an abandoned probe lets the next caller probe"
        );
    }
}
