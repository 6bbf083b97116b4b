//! The degradation ladder of one request, as pure decisions: which rung the
//! request task tries after its live targets failed (given the route's
//! rungs, the live error and what the caller already holds), and what a
//! queued job's failed run does next. [`policy::next`](super::next) decides
//! each attempt; this decides the request. No I/O, no time: the request
//! task asks and obeys.

use std::time::Duration;

use crate::config::Rung;
use crate::error::RequestError;

/// What the ladder needs to know about the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    /// Output of a live attempt reached the caller (a streaming caller
    /// cannot be given a stored or queued answer instead).
    pub committed: bool,
    /// The request is a queued job's run: it never goes to the queue again.
    pub from_queue: bool,
}

/// What the request task does next after its live targets failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Try `rung`, the route's rung at index `at`; if it cannot serve, ask
    /// again from `at + 1`.
    Try { rung: Rung, at: usize },
    /// End with the live error.
    Stop,
}

/// The next rung to try at or after index `from` of `rungs`, once the live
/// targets failed with `live`. Only errors a lower rung may make up for
/// (no target could serve: not the caller's own mistakes, not a deadline)
/// descend, and never once the caller holds live output. `fallback` and
/// `downshift` were the live walk's own targets; `refuse` ends the walk;
/// `queue` is skipped for a job's own run.
pub fn after_live(rungs: &[Rung], from: usize, live: &RequestError, caller: Caller) -> Step {
    if !live.may_descend_ladder() || caller.committed {
        return Step::Stop;
    }
    for (at, &rung) in rungs.iter().enumerate().skip(from) {
        match rung {
            Rung::Cache | Rung::SemanticCache => return Step::Try { rung, at },
            Rung::Queue if !caller.from_queue => return Step::Try { rung, at },
            Rung::Refuse => return Step::Stop,
            Rung::Fallback | Rung::Downshift | Rung::Queue => {}
        }
    }
    Step::Stop
}

/// The stored answers a request is served from before any live attempt,
/// in order, with how old each may be: the exact cache within the route's
/// `serve_fresh_within`, then the semantic cache within its `fresh_within`.
/// Anything older waits for the live targets to fail (`after_live`).
pub fn before_live(
    exact_within: Option<Duration>,
    semantic_within: Option<Duration>,
) -> Vec<(Rung, Duration)> {
    [
        exact_within.map(|d| (Rung::Cache, d)),
        semantic_within.map(|d| (Rung::SemanticCache, d)),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// What becomes of a queued job whose run ended with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobRun {
    /// Back in the queue: no target could take it yet (or this replica is
    /// draining); it runs again when capacity returns.
    Requeue,
    /// Failed for good: the error is the job's answer.
    Fail,
}

/// A job's failed run is requeued when the error is one a lower rung may
/// make up for (capacity may return) or the server is draining; any other
/// error (the request's own, a deadline) fails the job.
pub fn after_job_run(error: &RequestError) -> JobRun {
    if error.may_descend_ladder() || matches!(error, RequestError::Draining) {
        JobRun::Requeue
    } else {
        JobRun::Fail
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const FRESH: Caller = Caller {
        committed: false,
        from_queue: false,
    };

    /// An error a lower rung may make up for: every target is tripped.
    fn no_target() -> RequestError {
        RequestError::NoHealthyTarget {
            route: "chat".into(),
            retry_in: Some(Duration::from_secs(5)),
        }
    }

    /// Every rung the ladder tries, in order, when none of them serves.
    fn walk(rungs: &[Rung], live: &RequestError, caller: Caller) -> Vec<Rung> {
        let mut tried = Vec::new();
        let mut from = 0;
        while let Step::Try { rung, at } = after_live(rungs, from, live, caller) {
            tried.push(rung);
            from = at + 1;
        }
        tried
    }

    #[test]
    fn rungs_are_tried_in_the_routes_order_skipping_the_live_ones() {
        let rungs = [
            Rung::Fallback,
            Rung::Downshift,
            Rung::SemanticCache,
            Rung::Cache,
            Rung::Queue,
        ];
        assert_eq!(
            walk(&rungs, &no_target(), FRESH),
            [Rung::SemanticCache, Rung::Cache, Rung::Queue]
        );
        assert_eq!(
            after_live(&rungs, 0, &no_target(), FRESH),
            Step::Try {
                rung: Rung::SemanticCache,
                at: 2
            }
        );
    }

    #[test]
    fn refuse_ends_the_walk_before_the_rungs_after_it() {
        let rungs = [Rung::Cache, Rung::Refuse, Rung::Queue];
        assert_eq!(walk(&rungs, &no_target(), FRESH), [Rung::Cache]);
        assert_eq!(after_live(&rungs, 1, &no_target(), FRESH), Step::Stop);
    }

    #[test]
    fn a_committed_caller_gets_no_stored_or_queued_answer() {
        let rungs = [Rung::Cache, Rung::Queue];
        let committed = Caller {
            committed: true,
            ..FRESH
        };
        assert_eq!(after_live(&rungs, 0, &no_target(), committed), Step::Stop);
    }

    #[test]
    fn the_callers_own_errors_and_deadlines_never_descend() {
        let rungs = [Rung::Cache, Rung::Queue];
        let invalid = RequestError::InvalidRequest("messages: empty".into());
        assert_eq!(after_live(&rungs, 0, &invalid, FRESH), Step::Stop);
        let late = RequestError::DeadlineExceeded { attempts: 2 };
        assert_eq!(after_live(&rungs, 0, &late, FRESH), Step::Stop);
    }

    #[test]
    fn a_jobs_own_run_never_queues_again() {
        let rungs = [Rung::Queue, Rung::Cache];
        let job = Caller {
            from_queue: true,
            ..FRESH
        };
        assert_eq!(walk(&rungs, &no_target(), job), [Rung::Cache]);
        assert_eq!(
            walk(&rungs, &no_target(), FRESH),
            [Rung::Queue, Rung::Cache]
        );
    }

    #[test]
    fn a_route_without_stored_or_queued_rungs_stops_at_once() {
        let rungs = [Rung::Fallback, Rung::Downshift];
        assert_eq!(after_live(&rungs, 0, &no_target(), FRESH), Step::Stop);
        assert_eq!(after_live(&[], 0, &no_target(), FRESH), Step::Stop);
    }

    #[test]
    fn fresh_answers_come_before_live_exact_first_and_only_where_the_route_allows() {
        let s = Duration::from_secs;
        assert_eq!(before_live(None, None), []);
        assert_eq!(before_live(Some(s(60)), None), [(Rung::Cache, s(60))]);
        assert_eq!(
            before_live(Some(s(60)), Some(s(5))),
            [(Rung::Cache, s(60)), (Rung::SemanticCache, s(5))]
        );
        assert_eq!(before_live(None, Some(s(5))), [(Rung::SemanticCache, s(5))]);
    }

    #[test]
    fn a_job_run_is_requeued_while_capacity_may_return_and_failed_otherwise() {
        assert_eq!(after_job_run(&no_target()), JobRun::Requeue);
        assert_eq!(after_job_run(&RequestError::Draining), JobRun::Requeue);
        let invalid = RequestError::InvalidRequest("messages: empty".into());
        assert_eq!(after_job_run(&invalid), JobRun::Fail);
        let late = RequestError::DeadlineExceeded { attempts: 1 };
        assert_eq!(after_job_run(&late), JobRun::Fail);
    }
}
