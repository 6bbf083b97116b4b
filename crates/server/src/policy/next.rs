//! The next step of a request, as one pure decision table: given what was
//! tried (per candidate), the latest outcome, the deadline left, the
//! candidates' p95 time to first token and the route's policy, it answers
//! FailOver{to} / Retry{to, after} / Reset / Stop{error} / Done. Time and
//! randomness come in as arguments; the request task obeys and decides nothing.

use std::time::Duration;

use rand::Rng;
use smallvec::SmallVec;

use crate::config::MidStreamPolicy;
use crate::error::RequestError;
use crate::policy::backoff::Backoff;
use crate::policy::outcome::{Failure, OutcomeClass};

/// The route's part of the decision.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutePolicy {
    pub route: std::sync::Arc<str>,
    /// Upstream attempts per request, all targets together.
    pub max_attempts: u32,
    pub mid_stream: MidStreamPolicy,
    /// Never retried or failed over once sent.
    pub side_effects: bool,
    /// When the plan is empty because every target is tripped: when one returns.
    pub unavailable_for: Option<Duration>,
}

/// Where one candidate stands within this request.
#[derive(Debug, Clone, PartialEq)]
enum Slot {
    Untried,
    /// Refused locally (ceiling, breaker, cooldown, p95 above the deadline).
    Skipped,
    /// Sent, and failed `n` times; the last failure is kept (boxed: a slot
    /// stays two words, and a request that never fails stores none).
    Failed {
        failure: Box<Failure>,
        n: u32,
    },
}

/// Candidates whose slots are kept without an allocation of their own.
const INLINE_SLOTS: usize = 4;

/// What was tried so far in one request. The table updates it.
#[derive(Debug, Clone)]
pub struct Tried {
    slots: SmallVec<[Slot; INLINE_SLOTS]>,
    /// Upstream attempts sent (ended or running).
    attempts: u32,
    /// The candidate chosen last, whose outcome comes next.
    current: Option<usize>,
    /// The last failure and the candidate it came from (boxed, as a slot's:
    /// every open stream's request holds this struct).
    last: Option<(usize, Box<Failure>)>,
    /// A candidate refused for being at its concurrency ceiling.
    saturated: bool,
    /// The smallest p95 TTFT that did not fit the deadline.
    below_p95: Option<Duration>,
    /// Chunks the caller received from the attempt that failed last.
    emitted: u32,
    /// Attempts counted here that this request task did not send (a dead
    /// replica's, on a takeover): they were paid for where they were sent.
    unpaid: u32,
    /// The soonest a locally refused candidate may take traffic again.
    refused_retry_in: Option<Duration>,
    /// The soonest reset of a key window that refused a candidate.
    limited: Option<Duration>,
}

/// What happened since the last answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Nothing yet: the request begins.
    Begin,
    /// The chosen candidate refused admission locally (it was not sent).
    Refused {
        saturated: bool,
        retry_in: Option<Duration>,
    },
    /// No key of the chosen candidate had room in its rate windows (it
    /// was not sent); the soonest window resets in `retry_in`.
    Limited { retry_in: Duration },
    /// The chosen candidate admitted it, but the route's budget refused one
    /// more attempt (it was not sent).
    NoBudget,
    /// The chosen candidate's attempt failed. `committed`: output reached a
    /// streaming caller; `had_output`: a buffered caller holds partial output.
    Failed {
        failure: Failure,
        committed: bool,
        had_output: bool,
        /// Chunks the caller received from this attempt.
        tokens_emitted: u32,
    },
    /// The attempt's caller deadline passed during it.
    DeadlineExceeded,
    /// The caller was told to discard its partial output.
    ResetSent,
    /// After `Continue`: the candidate that can continue the partial
    /// answer, or `None` when no candidate can.
    ContinueOn(Option<usize>),
    /// A takeover: another replica's attempt on candidate `from` streamed
    /// output to the caller and the replica died; the caller holds it.
    TakeOver { from: usize },
    /// The attempt completed (or the caller went away).
    Completed,
}

/// What the request task does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Send to candidate `to` now (its first attempt in this request).
    FailOver { to: usize },
    /// Send to candidate `to` again after `after`.
    Retry { to: usize, after: Duration },
    /// Tell the caller to discard what it has (`reason`), then report `ResetSent`.
    Reset { reason: String },
    /// The caller keeps what it has: find a target that can continue it
    /// (`policy::continuation`) and report `ContinueOn`.
    Continue { reason: String },
    /// End with this error.
    Stop(RequestError),
    /// Nothing more to do.
    Done,
}

/// The live facts the table reads.
pub struct View<'a> {
    pub policy: &'a RoutePolicy,
    /// Time left before the caller's deadline.
    pub remaining: Duration,
    /// Per candidate, its p95 TTFT once enough samples back it.
    pub p95_ttft: &'a [Option<Duration>],
    /// Per candidate, its provider id (errors name it).
    pub providers: &'a [&'a str],
    pub backoff: &'a Backoff,
    /// The caller can discard output it holds (a buffered caller, a gRPC
    /// stream): a failure after output may be replaced after a `Reset`.
    /// An HTTP stream's client cannot, so the failure ends the request.
    pub caller_can_reset: bool,
}

impl View<'_> {
    fn provider(&self, idx: usize) -> String {
        self.providers
            .get(idx)
            .map_or_else(String::new, |p| p.to_string())
    }
}

impl Tried {
    pub fn new(candidates: usize) -> Self {
        Tried {
            slots: SmallVec::from_elem(Slot::Untried, candidates),
            attempts: 0,
            current: None,
            last: None,
            saturated: false,
            below_p95: None,
            refused_retry_in: None,
            limited: None,
            emitted: 0,
            unpaid: 0,
        }
    }

    /// Attempts sent so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// One more attempt needs the route's budget: every attempt after the
    /// first this request task sends.
    pub fn needs_budget(&self) -> bool {
        self.attempts > self.unpaid
    }

    /// The chosen candidate is being sent now.
    pub fn sent(&mut self) {
        self.attempts += 1;
    }

    /// The first candidate after `from`, in plan order, not tried yet in
    /// this request (where a hedge goes).
    pub fn untried_after(&self, from: usize) -> Option<usize> {
        (from + 1..self.slots.len()).find(|i| self.slots[*i] == Slot::Untried)
    }

    /// The candidate whose outcome comes next is `idx` (a hedge won).
    pub fn now_on(&mut self, idx: usize) {
        self.current = Some(idx);
    }

    /// The candidate chosen last.
    pub fn current(&self) -> Option<usize> {
        self.current
    }

    fn skip_current(&mut self) {
        if let Some(i) = self.current {
            self.slots[i] = Slot::Skipped;
        }
    }
}

/// The decision table. Updates `tried` with `outcome` and answers what to do.
pub fn next(tried: &mut Tried, outcome: Outcome, view: &View<'_>, rng: &mut impl Rng) -> Next {
    match outcome {
        Outcome::Begin | Outcome::ResetSent => {}
        Outcome::ContinueOn(on) => return continue_on(tried, on, view),
        Outcome::TakeOver { from } => return take_over(tried, from, view),
        Outcome::Completed => return Next::Done,
        Outcome::DeadlineExceeded => {
            return Next::Stop(RequestError::DeadlineExceeded {
                attempts: tried.attempts,
            })
        }
        Outcome::Refused {
            saturated,
            retry_in,
        } => {
            tried.saturated |= saturated;
            if let Some(d) = retry_in {
                tried.refused_retry_in = Some(tried.refused_retry_in.map_or(d, |r| r.min(d)));
            }
            tried.skip_current();
        }
        Outcome::Limited { retry_in } => {
            tried.limited = Some(tried.limited.map_or(retry_in, |r| r.min(retry_in)));
            tried.skip_current();
        }
        Outcome::NoBudget => {
            return Next::Stop(RequestError::RetryBudgetExhausted {
                route: view.policy.route.to_string(),
                last: tried.last.clone().map(|(i, f)| (f, view.provider(i))),
                attempts: tried.attempts,
            })
        }
        Outcome::Failed {
            failure,
            committed,
            had_output,
            tokens_emitted,
        } => {
            let step = after_failure(
                tried,
                failure,
                (committed, had_output, tokens_emitted),
                view,
            );
            if let Some(step) = step {
                return step;
            }
        }
    }
    pick(tried, view, rng)
}

/// Records a failed attempt; answers when it ends the request or needs a reset.
fn after_failure(
    tried: &mut Tried,
    failure: Failure,
    (committed, had_output, tokens_emitted): (bool, bool, u32),
    view: &View<'_>,
) -> Option<Next> {
    let policy = view.policy;
    let idx = tried.current?;
    let n = match &tried.slots[idx] {
        Slot::Failed { n, .. } => n + 1,
        _ => 1,
    };
    let reason = format!("{} from {}", failure.class, view.provider(idx));
    tried.slots[idx] = Slot::Failed {
        failure: Box::new(failure.clone()),
        n,
    };
    tried.last = Some((idx, Box::new(failure.clone())));
    if committed {
        let replaceable = failure.class.fail_over() && !policy.side_effects;
        if policy.mid_stream == MidStreamPolicy::Continue && replaceable {
            tried.emitted = tokens_emitted;
            return Some(Next::Continue { reason });
        }
        let may_reset =
            policy.mid_stream == MidStreamPolicy::Reset && view.caller_can_reset && replaceable;
        if !may_reset {
            return Some(Next::Stop(RequestError::MidStream {
                tokens_emitted,
                failure: Box::new(failure),
                provider: view.provider(idx),
                attempts: tried.attempts,
            }));
        }
        return Some(Next::Reset { reason });
    }
    let sent = failure.class != OutcomeClass::Connect;
    let stop = (!failure.class.fail_over() && failure.should_retry != Some(true))
        || (policy.side_effects && sent);
    if stop {
        return Some(Next::Stop(RequestError::Exhausted {
            failure: Box::new(failure),
            provider: view.provider(idx),
            attempts: tried.attempts,
        }));
    }
    // A buffered caller holds partial output: it discards it first.
    had_output.then_some(Next::Reset { reason })
}

/// A takeover counts the dead replica's attempt as one that failed after
/// output: the answer can only be continued (never reset, whatever the
/// route says: its reader cannot discard what it holds), and not at all on
/// a route with side effects.
fn take_over(tried: &mut Tried, from: usize, view: &View<'_>) -> Next {
    let failure = Failure::new(
        OutcomeClass::Truncated,
        "the replica serving the stream stopped",
    );
    let Some(slot) = tried.slots.get_mut(from) else {
        return Next::Done;
    };
    *slot = Slot::Failed {
        failure: Box::new(failure.clone()),
        n: 1,
    };
    tried.attempts += 1;
    tried.unpaid += 1;
    tried.current = Some(from);
    tried.last = Some((from, Box::new(failure.clone())));
    if view.policy.side_effects {
        return Next::Stop(RequestError::MidStream {
            tokens_emitted: 0,
            failure: Box::new(failure),
            provider: view.provider(from),
            attempts: tried.attempts,
        });
    }
    Next::Continue {
        reason: format!("the replica serving {} stopped", view.provider(from)),
    }
}

/// After `Continue`: the continuing attempt goes to `on` while the request
/// has attempts and time left; with no candidate able to continue, the
/// caller that can discard its output is reset (the walk goes on as for
/// `reset`), any other gets the failure.
fn continue_on(tried: &mut Tried, on: Option<usize>, view: &View<'_>) -> Next {
    let Some((idx, failure)) = tried.last.clone() else {
        return Next::Done;
    };
    let cut = |tried: &Tried| {
        Next::Stop(RequestError::MidStream {
            tokens_emitted: tried.emitted,
            failure: failure.clone(),
            provider: view.provider(idx),
            attempts: tried.attempts,
        })
    };
    match on {
        Some(_) if tried.attempts >= view.policy.max_attempts => cut(tried),
        Some(_) if view.remaining.is_zero() => Next::Stop(RequestError::DeadlineExceeded {
            attempts: tried.attempts,
        }),
        Some(to) => {
            tried.current = Some(to);
            Next::FailOver { to }
        }
        None if view.caller_can_reset => Next::Reset {
            reason: format!("{} from {}", failure.class, view.provider(idx)),
        },
        None => cut(tried),
    }
}

/// Chooses the next candidate: any not tried yet, in plan order; else a retry
/// of one that failed with a retryable class (preferring one other than the
/// last to fail), after backoff or its Retry-After when that fits the
/// deadline. Candidates whose p95 TTFT does not fit are skipped.
fn pick(tried: &mut Tried, view: &View<'_>, rng: &mut impl Rng) -> Next {
    loop {
        if tried.attempts >= view.policy.max_attempts {
            return exhausted(tried, view);
        }
        if view.remaining.is_zero() {
            return Next::Stop(RequestError::DeadlineExceeded {
                attempts: tried.attempts,
            });
        }
        let Some((idx, wait)) = choose(tried, view, rng) else {
            return exhausted(tried, view);
        };
        tried.current = Some(idx);
        // Deadline-aware admission: an attempt that cannot produce a first
        // token in time is not started.
        if let Some(p95) = view.p95_ttft.get(idx).copied().flatten() {
            if p95 > view.remaining.saturating_sub(wait.unwrap_or_default()) {
                tried.below_p95 = Some(tried.below_p95.map_or(p95, |b| b.min(p95)));
                tried.skip_current();
                continue;
            }
        }
        return match wait {
            None => Next::FailOver { to: idx },
            Some(after) => Next::Retry { to: idx, after },
        };
    }
}

fn choose(tried: &Tried, view: &View<'_>, rng: &mut impl Rng) -> Option<(usize, Option<Duration>)> {
    if let Some(idx) = tried.slots.iter().position(|s| *s == Slot::Untried) {
        return Some((idx, None));
    }
    let last = tried.last.as_ref().map(|(i, _)| *i);
    let mut retryable: Vec<usize> = tried
        .slots
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Slot::Failed { failure, .. } if failure.retry_same_target()))
        .map(|(i, _)| i)
        .collect();
    retryable.sort_by_key(|i| Some(*i) == last);
    retryable.into_iter().find_map(|idx| {
        let Slot::Failed { failure, n } = &tried.slots[idx] else {
            return None;
        };
        let wait = view.backoff.retry_wait(
            n.saturating_sub(1),
            failure.retry_after,
            view.remaining,
            rng,
        )?;
        Some((idx, Some(wait)))
    })
}

/// Nothing left to try: the error that says why.
fn exhausted(tried: &Tried, view: &View<'_>) -> Next {
    let policy = view.policy;
    Next::Stop(match &tried.last {
        Some((idx, failure)) => {
            let mut failure = failure.clone();
            failure.retry_after = failure.retry_after.or(tried.refused_retry_in);
            RequestError::Exhausted {
                failure,
                provider: view.provider(*idx),
                attempts: tried.attempts,
            }
        }
        None if tried.limited.is_some() => RequestError::RateLimited {
            route: policy.route.to_string(),
            retry_in: tried.limited.unwrap_or_default(),
        },
        None if tried.saturated => RequestError::Saturated {
            route: policy.route.to_string(),
        },
        None => match tried.below_p95 {
            Some(p95_ttft) => RequestError::DeadlineTooShort { p95_ttft },
            None => RequestError::NoHealthyTarget {
                route: policy.route.to_string(),
                retry_in: tried.refused_retry_in.or(policy.unavailable_for),
            },
        },
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    fn policy() -> RoutePolicy {
        RoutePolicy {
            route: "chat".into(),
            max_attempts: 3,
            mid_stream: MidStreamPolicy::Fail,
            side_effects: false,
            unavailable_for: None,
        }
    }

    struct Case {
        policy: RoutePolicy,
        p95: Vec<Option<Duration>>,
        providers: Vec<&'static str>,
        remaining: Duration,
        backoff: Backoff,
        rng: StdRng,
        tried: Tried,
        caller_can_reset: bool,
    }

    impl Case {
        fn new(candidates: usize) -> Self {
            Case {
                policy: policy(),
                p95: vec![None; candidates],
                providers: ["p0", "p1", "p2", "p3"][..candidates].to_vec(),
                remaining: Duration::from_secs(30),
                backoff: Backoff {
                    base: Duration::from_millis(100),
                    cap: Duration::from_secs(5),
                    retry_after_jitter: 0.0,
                },
                rng: StdRng::seed_from_u64(7),
                tried: Tried::new(candidates),
                caller_can_reset: true,
            }
        }

        fn step(&mut self, outcome: Outcome) -> Next {
            let view = View {
                policy: &self.policy,
                remaining: self.remaining,
                p95_ttft: &self.p95,
                providers: &self.providers,
                backoff: &self.backoff,
                caller_can_reset: self.caller_can_reset,
            };
            // A failure outcome means the chosen candidate was sent.
            if matches!(outcome, Outcome::Failed { .. } | Outcome::DeadlineExceeded) {
                self.tried.sent();
            }
            next(&mut self.tried, outcome, &view, &mut self.rng)
        }

        fn fail(&mut self, class: OutcomeClass) -> Next {
            self.step(Outcome::Failed {
                failure: Failure::new(class, "x"),
                committed: false,
                had_output: false,
                tokens_emitted: 0,
            })
        }
    }

    fn reason(n: &Next) -> &'static str {
        match n {
            Next::Stop(e) => crate::api::errors::reason(e),
            other => panic!("not a stop: {other:?}"),
        }
    }

    #[test]
    fn a_full_rate_window_moves_on_and_ends_rate_limited_with_the_soonest_reset() {
        let mut c = Case::new(3);
        assert_eq!(c.step(Outcome::Begin), Next::FailOver { to: 0 });
        let limited = |s: u64| Outcome::Limited {
            retry_in: Duration::from_secs(s),
        };
        assert_eq!(c.step(limited(9)), Next::FailOver { to: 1 });
        assert_eq!(c.step(limited(2)), Next::FailOver { to: 2 });
        let end = c.step(limited(5));
        assert_eq!(reason(&end), "RATE_LIMITED");
        let Next::Stop(e) = end else { unreachable!() };
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert_eq!(c.tried.attempts(), 0, "nothing was sent");
    }

    #[test]
    fn begins_with_the_first_candidate_then_fails_over_in_order() {
        let mut c = Case::new(3);
        assert_eq!(c.step(Outcome::Begin), Next::FailOver { to: 0 });
        assert_eq!(c.fail(OutcomeClass::Timeout), Next::FailOver { to: 1 });
        assert_eq!(c.fail(OutcomeClass::Connect), Next::FailOver { to: 2 });
        assert_eq!(
            reason(&c.fail(OutcomeClass::ServerError)),
            "UPSTREAM_SERVER_ERROR",
            "max_attempts = 3 spent"
        );
        assert_eq!(c.tried.attempts(), 3);
    }

    /// The fault table: per class, before the first token, with one other
    /// candidate left: what comes next.
    #[test]
    fn per_class_before_the_first_token() {
        use OutcomeClass::*;
        let rows: [(OutcomeClass, &str); 12] = [
            (Overloaded, "failover"),
            (ServerError, "failover"),
            (Protocol, "failover"),
            (Timeout, "failover"),
            (Connect, "failover"),
            (Truncated, "failover"),
            (RateLimited, "failover"),
            (Quota, "failover"),
            (Auth, "failover"),
            (TooLarge, "failover"),
            (NotFound, "failover"),
            (Invalid, "UPSTREAM_INVALID_REQUEST"),
        ];
        for (class, expected) in rows {
            let mut c = Case::new(2);
            c.step(Outcome::Begin);
            let got = match c.fail(class) {
                Next::FailOver { to: 1 } => "failover",
                n => reason(&n),
            };
            assert_eq!(got, expected, "{class}");
        }
    }

    #[test]
    fn a_lone_retryable_target_is_retried_after_backoff_others_stop() {
        use OutcomeClass::*;
        for (class, retried) in [
            (Overloaded, true),
            (ServerError, true),
            (Protocol, true),
            (RateLimited, true),
            (Timeout, false),
            (Connect, false),
            (Truncated, false),
            (Auth, false),
        ] {
            let mut c = Case::new(1);
            c.step(Outcome::Begin);
            match c.fail(class) {
                Next::Retry { to: 0, after } => {
                    assert!(retried, "{class} must not be retried");
                    assert!(after <= Duration::from_millis(100), "{class}: {after:?}");
                }
                Next::Stop(_) => assert!(!retried, "{class} must be retried"),
                other => panic!("{class}: {other:?}"),
            }
        }
    }

    #[test]
    fn backoff_grows_and_retry_after_wins_when_it_fits() {
        let mut c = Case::new(1);
        c.policy.max_attempts = 5;
        c.step(Outcome::Begin);
        let mut f = Failure::new(OutcomeClass::RateLimited, "slow down");
        f.retry_after = Some(Duration::from_secs(2));
        let n = c.step(Outcome::Failed {
            failure: f.clone(),
            committed: false,
            had_output: false,
            tokens_emitted: 0,
        });
        assert_eq!(
            n,
            Next::Retry {
                to: 0,
                after: Duration::from_secs(2)
            },
            "zero jitter: exactly Retry-After"
        );
        c.remaining = Duration::from_secs(1);
        let n = c.step(Outcome::Failed {
            failure: f,
            committed: false,
            had_output: false,
            tokens_emitted: 0,
        });
        assert_eq!(reason(&n), "UPSTREAM_RATE_LIMITED", "2 s does not fit 1 s");
        match &n {
            Next::Stop(e) => assert_eq!(e.retry_after(), Some(Duration::from_secs(2))),
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_other_target_is_retried_before_the_last_to_fail() {
        let mut c = Case::new(2);
        c.policy.max_attempts = 4;
        c.step(Outcome::Begin);
        assert_eq!(c.fail(OutcomeClass::Overloaded), Next::FailOver { to: 1 });
        match c.fail(OutcomeClass::Overloaded) {
            Next::Retry { to: 0, .. } => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_continue_route_keeps_the_output_and_continues_on_the_target_named() {
        let cut = || Outcome::Failed {
            failure: Failure::new(OutcomeClass::Truncated, "cut"),
            committed: true,
            had_output: true,
            tokens_emitted: 3,
        };
        let mut c = Case::new(2);
        c.policy.mid_stream = MidStreamPolicy::Continue;
        c.caller_can_reset = false;
        c.step(Outcome::Begin);
        assert_eq!(
            c.step(cut()),
            Next::Continue {
                reason: "truncated from p0".into()
            }
        );
        assert_eq!(
            c.step(Outcome::ContinueOn(Some(1))),
            Next::FailOver { to: 1 }
        );

        // No candidate can continue: an HTTP stream gets the failure...
        let mut c = Case::new(2);
        c.policy.mid_stream = MidStreamPolicy::Continue;
        c.caller_can_reset = false;
        c.step(Outcome::Begin);
        c.step(cut());
        let n = c.step(Outcome::ContinueOn(None));
        assert_eq!(reason(&n), "UPSTREAM_STREAM_TRUNCATED");
        match n {
            Next::Stop(RequestError::MidStream { tokens_emitted, .. }) => {
                assert_eq!(tokens_emitted, 3)
            }
            other => panic!("{other:?}"),
        }
        // ... a gRPC stream is reset and served again, as under `reset`.
        let mut c = Case::new(2);
        c.policy.mid_stream = MidStreamPolicy::Continue;
        c.step(Outcome::Begin);
        c.step(cut());
        assert_eq!(
            c.step(Outcome::ContinueOn(None)),
            Next::Reset {
                reason: "truncated from p0".into()
            }
        );
        assert_eq!(c.step(Outcome::ResetSent), Next::FailOver { to: 1 });

        // Out of attempts: the caller keeps what it has and gets the failure.
        let mut c = Case::new(2);
        c.policy.mid_stream = MidStreamPolicy::Continue;
        c.policy.max_attempts = 1;
        c.step(Outcome::Begin);
        c.step(cut());
        assert_eq!(
            reason(&c.step(Outcome::ContinueOn(Some(1)))),
            "UPSTREAM_STREAM_TRUNCATED"
        );

        // A route with side effects never continues.
        let mut c = Case::new(2);
        c.policy.mid_stream = MidStreamPolicy::Continue;
        c.policy.side_effects = true;
        c.step(Outcome::Begin);
        assert_eq!(reason(&c.step(cut())), "UPSTREAM_STREAM_TRUNCATED");
    }

    #[test]
    fn a_takeover_continues_after_the_dead_replicas_attempt_whatever_the_route_says() {
        let mut c = Case::new(2);
        c.caller_can_reset = false;
        assert_eq!(
            c.step(Outcome::TakeOver { from: 0 }),
            Next::Continue {
                reason: "the replica serving p0 stopped".into()
            },
            "on a `fail` route too"
        );
        assert_eq!(c.tried.attempts, 1, "the dead replica's attempt counts");
        assert!(
            !c.tried.needs_budget(),
            "but the continuation is this replica's first: not a retry to pay for"
        );
        assert_eq!(
            c.step(Outcome::ContinueOn(Some(1))),
            Next::FailOver { to: 1 }
        );
        let mut c = Case::new(2);
        c.caller_can_reset = false;
        c.step(Outcome::TakeOver { from: 1 });
        assert_eq!(
            reason(&c.step(Outcome::ContinueOn(None))),
            "UPSTREAM_STREAM_TRUNCATED",
            "nothing can continue it: the reader gets the failure"
        );
        let mut c = Case::new(1);
        c.policy.side_effects = true;
        assert_eq!(
            reason(&c.step(Outcome::TakeOver { from: 0 })),
            "UPSTREAM_STREAM_TRUNCATED"
        );
    }

    #[test]
    fn a_reset_route_ends_a_stream_whose_client_cannot_discard_output() {
        let cut = || Outcome::Failed {
            failure: Failure::new(OutcomeClass::Truncated, "cut"),
            committed: true,
            had_output: true,
            tokens_emitted: 3,
        };
        let mut c = Case::new(2);
        c.policy.mid_stream = MidStreamPolicy::Reset;
        c.caller_can_reset = false;
        c.step(Outcome::Begin);
        let n = c.step(cut());
        assert_eq!(reason(&n), "UPSTREAM_STREAM_TRUNCATED");
        assert_eq!(c.tried.attempts, 1, "no second attempt is sent");

        // Before any output reached it, the same client still fails over.
        let mut c = Case::new(2);
        c.policy.mid_stream = MidStreamPolicy::Reset;
        c.caller_can_reset = false;
        c.step(Outcome::Begin);
        let n = c.step(Outcome::Failed {
            failure: Failure::new(OutcomeClass::Truncated, "cut"),
            committed: false,
            had_output: false,
            tokens_emitted: 0,
        });
        assert_eq!(n, Next::FailOver { to: 1 });
    }

    #[test]
    fn mid_stream_follows_the_route_policy() {
        let mut c = Case::new(2);
        c.step(Outcome::Begin);
        let n = c.step(Outcome::Failed {
            failure: Failure::new(OutcomeClass::Truncated, "cut"),
            committed: true,
            had_output: true,
            tokens_emitted: 3,
        });
        assert_eq!(reason(&n), "UPSTREAM_STREAM_TRUNCATED", "fail policy");

        let mut c = Case::new(2);
        c.policy.mid_stream = MidStreamPolicy::Reset;
        c.step(Outcome::Begin);
        let n = c.step(Outcome::Failed {
            failure: Failure::new(OutcomeClass::Overloaded, "529"),
            committed: true,
            had_output: true,
            tokens_emitted: 3,
        });
        assert_eq!(
            n,
            Next::Reset {
                reason: "overloaded from p0".into()
            }
        );
        assert_eq!(c.step(Outcome::ResetSent), Next::FailOver { to: 1 });

        c.policy.side_effects = true;
        let mut c2 = Case::new(2);
        c2.policy = c.policy.clone();
        c2.step(Outcome::Begin);
        let n = c2.step(Outcome::Failed {
            failure: Failure::new(OutcomeClass::Overloaded, "529"),
            committed: true,
            had_output: true,
            tokens_emitted: 3,
        });
        assert_eq!(reason(&n), "UPSTREAM_OVERLOADED", "side effects: no reset");
    }

    #[test]
    fn buffered_partial_output_is_reset_before_failing_over() {
        let mut c = Case::new(2);
        c.step(Outcome::Begin);
        let n = c.step(Outcome::Failed {
            failure: Failure::new(OutcomeClass::Truncated, "cut"),
            committed: false,
            had_output: true,
            tokens_emitted: 0,
        });
        assert!(matches!(n, Next::Reset { .. }));
        assert_eq!(c.step(Outcome::ResetSent), Next::FailOver { to: 1 });
    }

    #[test]
    fn side_effect_routes_stop_once_sent_but_not_on_connect() {
        let mut c = Case::new(2);
        c.policy.side_effects = true;
        c.step(Outcome::Begin);
        assert_eq!(c.fail(OutcomeClass::Connect), Next::FailOver { to: 1 });
        assert_eq!(reason(&c.fail(OutcomeClass::Timeout)), "UPSTREAM_TIMEOUT");
    }

    #[test]
    fn local_refusals_skip_without_spending_attempts() {
        let mut c = Case::new(2);
        assert_eq!(c.step(Outcome::Begin), Next::FailOver { to: 0 });
        let n = c.step(Outcome::Refused {
            saturated: true,
            retry_in: None,
        });
        assert_eq!(n, Next::FailOver { to: 1 });
        let n = c.step(Outcome::Refused {
            saturated: false,
            retry_in: Some(Duration::from_secs(4)),
        });
        assert_eq!(reason(&n), "CONCURRENCY_LIMIT");

        let mut c = Case::new(1);
        c.step(Outcome::Begin);
        let n = c.step(Outcome::Refused {
            saturated: false,
            retry_in: Some(Duration::from_secs(4)),
        });
        assert_eq!(reason(&n), "NO_HEALTHY_TARGET");
        match n {
            Next::Stop(e) => assert_eq!(e.retry_after(), Some(Duration::from_secs(4))),
            _ => unreachable!(),
        }
    }

    #[test]
    fn budget_refusal_stops_with_the_last_failure() {
        let mut c = Case::new(2);
        c.step(Outcome::Begin);
        c.fail(OutcomeClass::Overloaded);
        assert!(c.tried.needs_budget());
        let n = c.step(Outcome::NoBudget);
        assert_eq!(reason(&n), "RETRY_BUDGET_EXHAUSTED");
    }

    #[test]
    fn p95_above_the_deadline_is_skipped_and_named() {
        let mut c = Case::new(2);
        c.remaining = Duration::from_millis(500);
        c.p95 = vec![Some(Duration::from_secs(2)), None];
        assert_eq!(c.step(Outcome::Begin), Next::FailOver { to: 1 });
        let mut c = Case::new(1);
        c.remaining = Duration::from_millis(500);
        c.p95 = vec![Some(Duration::from_secs(2))];
        assert_eq!(reason(&c.step(Outcome::Begin)), "DEADLINE_BELOW_P95_TTFT");
    }

    #[test]
    fn deadline_and_completion() {
        let mut c = Case::new(2);
        c.step(Outcome::Begin);
        assert_eq!(
            reason(&c.step(Outcome::DeadlineExceeded)),
            "DEADLINE_EXCEEDED"
        );
        let mut c = Case::new(2);
        c.remaining = Duration::ZERO;
        assert_eq!(reason(&c.step(Outcome::Begin)), "DEADLINE_EXCEEDED");
        let mut c = Case::new(2);
        c.step(Outcome::Begin);
        assert_eq!(c.step(Outcome::Completed), Next::Done);
    }

    #[test]
    fn an_empty_plan_is_no_healthy_target_with_the_soonest_return() {
        let mut c = Case::new(0);
        c.policy.unavailable_for = Some(Duration::from_secs(9));
        let n = c.step(Outcome::Begin);
        assert_eq!(reason(&n), "NO_HEALTHY_TARGET");
        match n {
            Next::Stop(e) => assert_eq!(e.retry_after(), Some(Duration::from_secs(9))),
            _ => unreachable!(),
        }
    }
}
