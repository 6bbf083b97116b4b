//! Hedged first tokens (a route's `hedge = { after, max_extra }`): when the
//! first attempt of a request has produced no token by `after` (its
//! target's p95 time to first token, or a fixed wait), a second attempt
//! starts on the next target not tried yet, admitted and paid from the
//! retry budget like any other (so a brownout cannot double the load).
//! Each attempt writes into its own bounded lane; the first to produce a
//! token answers and the other is dropped at once, which closes its
//! upstream connection. Only before the first token, never on a route
//! with side effects, never for a continuation.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use super::live::{attempt_input, attempt_span, begin, close_span, Ask, Call, Turn};
use super::Tasks;
use crate::attempt::{self, AttemptEnd, AttemptResult, Lane, LaneItem};
use crate::chat::ChatRequest;
use crate::config::HedgeAfter;
use crate::policy::next::{Outcome, Tried};
use crate::sink::EventSink;
use crate::telemetry::metrics::RouteOutcomeLabels;

/// Chunks a lane holds before its attempt waits for the task to read.
const LANE: usize = 64;

/// Where a hedge would go and when.
pub(super) struct Hedge {
    pub(super) after: Duration,
    pub(super) to: usize,
}

/// How a hedged attempt ended.
pub(super) struct Hedged<'f> {
    /// The side whose result the walk reads: the one that produced a token
    /// first, else the last to fail; `None` when the caller left.
    pub(super) end: Option<Side<'f>>,
    /// A second attempt was started.
    pub(super) hedged: bool,
    /// Sides that failed before any token (reported, never billed).
    pub(super) failed: Vec<Done<'f>>,
}

/// An attempt that ended: its candidate, turn, number and result.
pub(super) struct Done<'f> {
    pub(super) idx: usize,
    pub(super) turn: Turn<'f>,
    pub(super) attempt: u32,
    pub(super) result: AttemptResult,
}

/// The answering side.
pub(super) type Side<'f> = Done<'f>;

type Running<'f> = Pin<Box<dyn Future<Output = (Turn<'f>, AttemptResult)> + Send + 'f>>;

/// One attempt in flight and its lane. Dropping it drops the attempt (its
/// upstream connection closes; its permit reports itself cancelled).
struct Lanes<'f> {
    idx: usize,
    attempt: u32,
    fut: Running<'f>,
    rx: mpsc::Receiver<LaneItem>,
    dropped: Vec<String>,
}

/// What one side did.
enum Step<'f> {
    Dropped(Vec<String>),
    Chunk(crate::chat::Chunk),
    Ended(Box<(Turn<'f>, AttemptResult)>),
}

async fn step<'f>(side: &mut Option<Lanes<'f>>) -> Step<'f> {
    let Some(s) = side else {
        return std::future::pending().await;
    };
    tokio::select! {
        biased;
        item = s.rx.recv() => match item {
            Some(LaneItem::Dropped(d)) => Step::Dropped(d),
            Some(LaneItem::Chunk(c)) => Step::Chunk(c),
            // The lane closes when its attempt ends.
            None => {
                Step::Ended(Box::new((&mut s.fut).await))
            }
        },
        ended = &mut s.fut => Step::Ended(Box::new(ended)),
    }
}

impl Tasks {
    /// Whether the attempt about to start on `call.candidate` is hedged.
    pub(super) fn hedge_for(
        &self,
        call: &Call<'_>,
        tried: &Tried,
        sink: &EventSink,
    ) -> Option<Hedge> {
        let h = call.plan.traffic.hedge?;
        if call.continues.is_some()
            || call.plan.side_effects
            || sink.committed()
            || tried.attempts() > 1
        {
            return None;
        }
        let to = tried.untried_after(tried.current()?)?;
        let after = match h.after {
            HedgeAfter::After(d) => d,
            HedgeAfter::P95 => self.p95_ttft(call.candidate)?,
        };
        (after < call.deadline.saturating_duration_since(Instant::now()))
            .then_some(Hedge { after, to })
    }

    fn count_hedge(&self, route: &str, outcome: &'static str) {
        self.metrics
            .hedges
            .get_or_create(&RouteOutcomeLabels {
                route: route.to_string(),
                outcome,
            })
            .inc();
    }

    /// Runs `first` (admitted and counted) and, at `hedge.after` without a
    /// token, a second attempt on `hedge.to`; the first to produce a token
    /// streams to the caller and the other is dropped.
    pub(super) async fn hedged<'f>(
        &'f self,
        call: Call<'f>,
        chat: &'f ChatRequest,
        tried: &mut Tried,
        sink: &mut EventSink,
        first: Turn<'f>,
        hedge: Hedge,
    ) -> Hedged<'f> {
        let route = call.plan.route.as_str();
        let first_idx = tried.current().unwrap_or_default();
        let mut a = Some(start(call, chat, first_idx, first, tried.attempts()));
        let mut b: Option<Lanes<'f>> = None;
        // The hedge was due (`due`) and a second attempt started (`hedged`).
        let (mut due, mut hedged) = (false, false);
        let mut failed: Vec<Done<'f>> = Vec::new();
        let timer = tokio::time::sleep(hedge.after);
        tokio::pin!(timer);
        loop {
            let (from_a, event) = tokio::select! {
                biased;
                _ = sink.closed() => {
                    if hedged {
                        self.count_hedge(route, "cancelled");
                    }
                    return Hedged { end: None, hedged, failed };
                }
                e = step(&mut a) => (true, e),
                e = step(&mut b) => (false, e),
                _ = &mut timer, if !due && a.is_some() => {
                    due = true;
                    match self.hedge_turn(call, chat, tried, hedge.to).await {
                        Some(turn) => {
                            hedged = true;
                            b = Some(start(call, chat, hedge.to, turn, tried.attempts()));
                        }
                        None => {}
                    }
                    continue;
                }
            };
            let (side, other) = if from_a {
                (&mut a, &mut b)
            } else {
                (&mut b, &mut a)
            };
            match event {
                Step::Dropped(d) => {
                    if let Some(s) = side.as_mut() {
                        s.dropped = d;
                    }
                }
                Step::Chunk(c) => {
                    let Some(s) = side.take() else { continue };
                    // The other attempt is dropped at once.
                    if other.take().is_some() || !from_a {
                        self.count_hedge(route, if from_a { "lost" } else { "won" });
                    }
                    tried.now_on(s.idx);
                    let end = self.stream_winner(call, sink, s, c).await;
                    return Hedged {
                        end,
                        hedged,
                        failed,
                    };
                }
                Step::Ended(ended) => {
                    let (turn, result) = *ended;
                    let Some(mut s) = side.take() else { continue };
                    let mut chunks = Vec::new();
                    while let Ok(item) = s.rx.try_recv() {
                        if let LaneItem::Chunk(c) = item {
                            chunks.push(c);
                        }
                    }
                    let answered =
                        !chunks.is_empty() || matches!(result.end, AttemptEnd::Completed(_));
                    let done = Done {
                        idx: s.idx,
                        turn,
                        attempt: s.attempt,
                        result,
                    };
                    if answered {
                        if other.take().is_some() || !from_a {
                            self.count_hedge(route, if from_a { "lost" } else { "won" });
                        }
                        tried.now_on(done.idx);
                        let end = self.deliver(call, sink, done, s.dropped, chunks).await;
                        return Hedged {
                            end: Some(end),
                            hedged,
                            failed,
                        };
                    }
                    if other.is_some() {
                        // The other attempt may still answer.
                        failed.push(done);
                        continue;
                    }
                    if hedged && !failed.is_empty() {
                        self.count_hedge(route, "cancelled");
                    }
                    tried.now_on(done.idx);
                    return Hedged {
                        end: Some(done),
                        hedged,
                        failed,
                    };
                }
            }
        }
    }

    /// A turn for the hedge's target, paid from the retry budget; `None`
    /// when it refused or the budget is spent (counted as `budget`).
    async fn hedge_turn<'f>(
        &'f self,
        call: Call<'f>,
        chat: &'f ChatRequest,
        tried: &mut Tried,
        to: usize,
    ) -> Option<Turn<'f>> {
        let candidate = &call.plan.candidates[to];
        let mut hedge_chat = chat.clone();
        hedge_chat.model = candidate.model.clone();
        hedge_chat.stream = candidate.streams;
        let ask = Ask {
            spec: call.spec,
            chat: &hedge_chat,
            traffic: &call.plan.traffic,
            prefer: None,
        };
        let current = tried.current();
        let turn = self
            .take_turn(candidate, &call.plan.route, tried, call.deadline, Some(ask))
            .await;
        if let Some(c) = current {
            tried.now_on(c);
        }
        match turn {
            Ok(turn) => Some(turn),
            Err(outcome) => {
                tracing::debug!(?outcome, provider = %candidate.provider, "no hedge");
                if outcome == Outcome::NoBudget {
                    self.count_hedge(&call.plan.route, "budget");
                }
                None
            }
        }
    }

    /// The winner's first chunk and the rest of its lane to the caller.
    async fn stream_winner<'f>(
        &self,
        call: Call<'f>,
        sink: &mut EventSink,
        mut s: Lanes<'f>,
        first: crate::chat::Chunk,
    ) -> Option<Done<'f>> {
        open(call, sink, s.idx, s.attempt, std::mem::take(&mut s.dropped));
        let mut gone = sink.chunk(first).await.is_err();
        let (turn, mut result) = loop {
            tokio::select! {
                biased;
                item = s.rx.recv(), if !gone => match item {
                    Some(LaneItem::Chunk(c)) => gone = sink.chunk(c).await.is_err(),
                    Some(LaneItem::Dropped(_)) => {}
                    None => break (&mut s.fut).await,
                },
                r = &mut s.fut, if !gone => break r,
                // The caller left: the attempt is dropped unfinished (its
                // permit reports itself cancelled).
                () = std::future::ready(()), if gone => return None,
            }
        };
        while let Ok(item) = s.rx.try_recv() {
            if let LaneItem::Chunk(c) = item {
                if sink.chunk(c).await.is_err() {
                    result = gone_result();
                    break;
                }
            }
        }
        Some(Done {
            idx: s.idx,
            turn,
            attempt: s.attempt,
            result,
        })
    }

    /// A side that answered whole before its lane was read.
    async fn deliver<'f>(
        &self,
        call: Call<'f>,
        sink: &mut EventSink,
        mut done: Done<'f>,
        dropped: Vec<String>,
        chunks: Vec<crate::chat::Chunk>,
    ) -> Done<'f> {
        open(call, sink, done.idx, done.attempt, dropped);
        for c in chunks {
            if sink.chunk(c).await.is_err() {
                done.result = gone_result();
                break;
            }
        }
        done
    }
}

/// The winner (attempt `attempt` on candidate `idx`) begins on the
/// caller's sink, with what its wire left out.
fn open(call: Call<'_>, sink: &mut EventSink, idx: usize, attempt: u32, dropped: Vec<String>) {
    let winner = Call {
        candidate: &call.plan.candidates[idx],
        ..call
    };
    begin(&winner, attempt, sink);
    sink.set_dropped(dropped);
}

/// What an attempt whose caller left reports.
fn gone_result() -> AttemptResult {
    AttemptResult {
        end: AttemptEnd::ClientGone,
        key_events: Vec::new(),
        ttft: None,
        elapsed: Duration::ZERO,
        upstream_request_id: None,
        key: None,
        reported: Vec::new(),
    }
}

/// Starts the attempt of `turn` on candidate `idx` into a new lane.
fn start<'f>(
    call: Call<'f>,
    chat: &'f ChatRequest,
    idx: usize,
    turn: Turn<'f>,
    attempt: u32,
) -> Lanes<'f> {
    let (tx, rx) = mpsc::channel(LANE);
    let fut: Running<'f> = Box::pin(async move {
        let candidate = &call.plan.candidates[idx];
        let c = Call { candidate, ..call };
        let mut chat = chat.clone();
        chat.model = candidate.model.clone();
        chat.stream = candidate.streams;
        chat.service_tier = call
            .plan
            .service_tier
            .clone()
            .filter(|t| turn.entry.runtime.kind.quirks().takes_service_tier(t));
        let span = attempt_span(candidate, &turn.entry, attempt, turn.traffic);
        let input = attempt_input(&c, &turn.entry, &chat, attempt, turn.windows.as_ref());
        let result = attempt::run_in_lane(input, Lane(tx))
            .instrument(span.clone())
            .await;
        close_span(&span, &result, 0);
        (turn, result)
    });
    Lanes {
        idx,
        attempt,
        fut,
        rx,
        dropped: Vec::new(),
    }
}
