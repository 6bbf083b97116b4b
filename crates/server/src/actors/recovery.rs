//! The recovery actor: drains the durable job queue once capacity returns.
//! It wakes on breaker-closed events (from provider actors), on new jobs and
//! on a slow tick, and releases job runs through a token bucket with jitter so
//! a recovering provider is not hit by the whole backlog at once. It decides
//! how many runs may start; the runs themselves (SQLite, upstream calls)
//! happen in spawned tasks through the runner it was given.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use rand::Rng;
use tokio::time::Instant;

use crate::policy::token_bucket::{TokenBucket, TokenBucketConfig};

/// How one job run ended, as the runner reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunOutcome {
    /// The job finished (succeeded or failed for good).
    Finished,
    /// No target could take it yet; it went back to the queue.
    NoCapacity,
    /// The queue was empty.
    Idle,
    /// The fleet's drain bucket had no token: try again at the next tick.
    Throttled,
}

/// Runs one queued job (claims it, routes it, stores the outcome).
pub type JobRunner = Arc<dyn Fn() -> BoxFuture<'static, RunOutcome> + Send + Sync>;

pub enum RecoveryMsg {
    /// A target's breaker closed: capacity is back.
    BreakerClosed { provider: String, model: String },
    /// A job was accepted.
    JobsWaiting,
    /// Periodic wake-up.
    Tick,
    /// A run ended.
    RunEnded(RunOutcome),
}

/// What the actor starts with (kept by the supervisor for restarts).
#[derive(Clone)]
pub struct RecoveryArgs {
    pub runner: JobRunner,
    pub drain: TokenBucketConfig,
    /// Runs at once, at most.
    pub max_running: usize,
}

pub struct RecoveryActor;

/// Mutable state.
pub struct RecoveryState {
    args: RecoveryArgs,
    /// Paces run starts.
    bucket: TokenBucket,
    /// Runs in flight.
    running: usize,
    /// No capacity seen: wait for a breaker to close (or this time) before trying again.
    paused_until: Option<Instant>,
    /// The queue looked empty: wait for a new job (or a tick) before claiming.
    idle: bool,
    /// When the queue was last looked at while idle.
    looked: Instant,
}

/// How long a no-capacity pause lasts without a breaker-closed event.
const PAUSE: Duration = Duration::from_secs(1);
/// How often an idle queue is looked at again. No wake-up may be relied on
/// alone: in a fleet other replicas add jobs (and lose leases) without
/// telling this one, and here a run that put its job back can end after
/// another run found the queue empty.
const IDLE_LOOK: Duration = Duration::from_secs(1);
/// Tick period.
const TICK: Duration = Duration::from_millis(50);

impl RecoveryState {
    /// Starts as many runs as the bucket allows now.
    fn release(&mut self, myself: &ActorRef<RecoveryMsg>, now: Instant) {
        if self.idle || self.paused_until.is_some_and(|t| t > now) {
            return;
        }
        self.paused_until = None;
        let rate = self.args.drain.rate.max(0.001);
        while self.running < self.args.max_running && self.bucket.try_take(now) {
            self.running += 1;
            let runner = self.args.runner.clone();
            let me = myself.clone();
            // Jitter within one token's interval spreads arrivals upstream.
            let jitter = Duration::from_secs_f64(rand::rng().random_range(0.0..1.0) / rate);
            tokio::spawn(async move {
                tokio::time::sleep(jitter).await;
                let outcome = runner().await;
                let _ = me.cast(RecoveryMsg::RunEnded(outcome));
            });
        }
    }
}

impl Actor for RecoveryActor {
    type Msg = RecoveryMsg;
    type State = RecoveryState;
    type Arguments = RecoveryArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(TICK, || RecoveryMsg::Tick);
        let now = Instant::now();
        Ok(RecoveryState {
            bucket: TokenBucket::new(&args.drain, now),
            args,
            running: 0,
            paused_until: None,
            idle: false,
            looked: now,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        match message {
            RecoveryMsg::BreakerClosed { provider, model } => {
                tracing::info!(%provider, %model, "breaker closed: draining queued jobs");
                state.paused_until = None;
                state.idle = false;
            }
            RecoveryMsg::JobsWaiting => state.idle = false,
            RecoveryMsg::Tick => {
                if state.idle && now - state.looked >= IDLE_LOOK {
                    state.idle = false;
                    state.looked = now;
                }
            }
            RecoveryMsg::RunEnded(outcome) => {
                state.running = state.running.saturating_sub(1);
                match outcome {
                    RunOutcome::Finished => {}
                    RunOutcome::NoCapacity => state.paused_until = Some(now + PAUSE),
                    RunOutcome::Idle => state.idle = state.running == 0,
                    RunOutcome::Throttled => {}
                }
            }
        }
        state.release(&myself, now);
        Ok(())
    }
}
