//! Hedged first tokens (a route's `hedge = { after, max_extra }`): when the
//! first attempt of a request has produced no token by `after` (its
//! target's p95 time to first token, or a fixed wait), another attempt
//! starts on the next target not tried yet (again each `after`, up to
//! `max_extra`), admitted and paid from the retry budget like any other
//! (so a brownout cannot double the load). Each attempt writes into its
//! own bounded lane; the first to produce a token answers and the others
//! are dropped at once, which closes their upstream connections. Only before the first token, never on a route
//! with side effects, never for a continuation.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tracing::Instrument;

use super::bill::Bill;
use super::live::{attempt_input, attempt_span, begin, close_span, Ask, Call, Turn};
use super::Tasks;
use crate::attempt::{self, AttemptEnd, AttemptResult, Lane, LaneItem};
use crate::chat::ChatRequest;
use crate::config::HedgeAfter;
use crate::error::RequestError;
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

async fn step<'f>(s: &mut Lanes<'f>) -> Step<'f> {
    tokio::select! {
        biased;
        item = s.rx.recv() => match item {
            Some(LaneItem::Dropped(d)) => Step::Dropped(d),
            Some(LaneItem::Chunk(c)) => Step::Chunk(c),
            // The lane closes when its attempt ends.
            None => Step::Ended(Box::new((&mut s.fut).await)),
        },
        ended = &mut s.fut => Step::Ended(Box::new(ended)),
    }
}

/// The next thing any running attempt did, and which lane did it.
async fn next_step<'f>(lanes: &mut [Lanes<'f>]) -> (usize, Step<'f>) {
    if lanes.is_empty() {
        return std::future::pending().await;
    }
    let steps = lanes
        .iter_mut()
        .enumerate()
        .map(|(i, l)| Box::pin(async move { (i, step(l).await) }));
    futures_util::future::select_all(steps).await.0
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

    /// The attempt on `call.candidate` (admitted: `first`), hedged: the
    /// race, then the conclusion of every attempt it started. Its own
    /// function so the request's future stores none of it unless hedged
    /// (the caller boxes it).
    pub(super) async fn attempt_hedged(
        &self,
        call: &Call<'_>,
        chat: &mut ChatRequest,
        (tried, sink, bill): (&mut Tried, &mut EventSink, &mut Bill<'_>),
        carried: u32,
        first: Turn<'_>,
        hedge: Hedge,
    ) -> Result<Outcome, RequestError> {
        let base = chat.clone();
        let out = self.hedged(*call, &base, tried, sink, first, hedge).await;
        for spare in out.failed {
            let c = Call {
                candidate: &call.plan.candidates[spare.idx],
                ..*call
            };
            self.conclude_unanswered(&c, spare.turn, &spare.result)
                .await;
        }
        let Some(done) = out.end else {
            return Ok(Outcome::Completed);
        };
        let c = Call {
            candidate: &call.plan.candidates[done.idx],
            ..*call
        };
        chat.model = c.candidate.model.clone();
        let won = out.hedged.then_some(done.attempt);
        self.conclude(
            &c,
            chat,
            done.turn,
            done.result,
            (tried, sink, bill),
            (carried, won),
        )
        .await
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

    /// Runs `first` (admitted and counted) and, each `hedge.after` without a
    /// token, one more attempt on the next target not tried yet, up to the
    /// route's `max_extra`; the first to produce a token streams to the
    /// caller and the others are dropped.
    pub(super) async fn hedged<'f>(
        &'f self,
        call: Call<'f>,
        chat: &'f ChatRequest,
        tried: &mut Tried,
        sink: &mut EventSink,
        first: Turn<'f>,
        hedge: Hedge,
    ) -> Hedged<'f> {
        let route = &*call.plan.route;
        let max_extra = call.plan.traffic.hedge.map_or(1, |h| h.max_extra);
        let first_idx = tried.current().unwrap_or_default();
        let first_attempt = tried.attempts();
        let mut lanes = vec![start(call, chat, first_idx, first, first_attempt)];
        // Hedges that came due, the next one's target, and whether any started.
        let (mut due, mut next_to, mut hedged) = (0, Some(hedge.to), false);
        let mut failed: Vec<Done<'f>> = Vec::new();
        let timer = tokio::time::sleep(hedge.after);
        tokio::pin!(timer);
        loop {
            let (i, event) = tokio::select! {
                biased;
                _ = sink.closed() => {
                    if hedged {
                        self.count_hedge(route, "cancelled");
                    }
                    return Hedged { end: None, hedged, failed };
                }
                e = next_step(&mut lanes) => e,
                _ = &mut timer, if due < max_extra && next_to.is_some() && !lanes.is_empty() => {
                    due += 1;
                    let to = next_to.take().unwrap_or_default();
                    if let Some(turn) = self.hedge_turn(call, chat, tried, to).await {
                        hedged = true;
                        lanes.push(start(call, chat, to, turn, tried.attempts()));
                    }
                    next_to = tried.untried_after(to);
                    timer.as_mut().reset(Instant::now() + hedge.after);
                    continue;
                }
            };
            match event {
                Step::Dropped(d) => lanes[i].dropped = d,
                Step::Chunk(c) => {
                    let s = lanes.swap_remove(i);
                    // The other attempts are dropped at once.
                    lanes.clear();
                    self.count_winner(route, hedged, s.attempt == first_attempt);
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
                    let mut s = lanes.swap_remove(i);
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
                        lanes.clear();
                        self.count_winner(route, hedged, done.attempt == first_attempt);
                        tried.now_on(done.idx);
                        let end = self.deliver(call, sink, done, s.dropped, chunks).await;
                        return Hedged {
                            end: Some(end),
                            hedged,
                            failed,
                        };
                    }
                    if !lanes.is_empty() {
                        // Another attempt may still answer.
                        failed.push(done);
                        continue;
                    }
                    if hedged {
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

    /// A hedged request's answer: `lost` when the first attempt gave it,
    /// `won` when an extra one did.
    fn count_winner(&self, route: &str, hedged: bool, first: bool) {
        if hedged {
            self.count_hedge(route, if first { "lost" } else { "won" });
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
        hedge_chat.stream = candidate.streamed(call.buffered);
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
        chat.stream = candidate.streamed(call.buffered);
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
