//! The job side of the Router service — `SubmitJob`, `GetJob`, `WatchJob` —
//! and the job runner the recovery actor drives: claim the oldest job, route
//! it like any request (buffered), store its answer once, or put it back when
//! no target can take it yet.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::Stream;
use tokio::sync::mpsc;
use tonic::Status;

use super::convert;
use super::errors::to_status;
use super::intake::{Arrival, Door, Intake};
use crate::actors::recovery::{JobRunner, RunOutcome};
use crate::error::RequestError;
use crate::policy::ladder::{self, JobRun};
use crate::policy::token_bucket::TokenBucketConfig;
use crate::proto;
use crate::sink::Events;
use crate::state::jobs::JobRecord;
use crate::state::jobs::{DrainTurn, Jobs};

pub type JobStream = Pin<Box<dyn Stream<Item = Result<proto::Job, Status>> + Send>>;

/// The API view of a job, with its place in the queue.
pub async fn view(jobs: &Jobs, record: &JobRecord) -> proto::Job {
    let (position, eta) = jobs.eta(record).await;
    convert::job(record, position, eta)
}

/// The job `id` as `caller` may see it: another tenant's job does not exist
/// for it (NOT_FOUND, exactly as an unknown id). `caller` is the
/// authenticated tenant; `None` in open auth mode, where nobody is.
pub async fn get(jobs: &Jobs, id: &str, caller: Option<&str>) -> Result<proto::Job, Status> {
    match jobs.get(id).await {
        Ok(Some(record)) if caller.is_none_or(|t| t == record.tenant) => {
            Ok(view(jobs, &record).await)
        }
        Ok(_) => Err(to_status(&RequestError::JobNotFound(id.to_string()))),
        Err(e) => Err(to_status(&RequestError::from(e))),
    }
}

/// Streams the job at each change until it is final (as [`get`] sees it).
pub async fn watch(
    jobs: Arc<Jobs>,
    id: String,
    caller: Option<String>,
) -> Result<JobStream, Status> {
    let mut changes = jobs.subscribe();
    let first = get(&jobs, &id, caller.as_deref()).await?;
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let mut last = first;
        let done = |j: &proto::Job| {
            j.state == proto::JobState::Succeeded as i32
                || j.state == proto::JobState::Failed as i32
                || j.state == proto::JobState::Expired as i32
        };
        if tx.send(Ok(last.clone())).await.is_err() || done(&last) {
            return;
        }
        loop {
            tokio::select! {
                changed = changes.recv() => match changed {
                    Ok(changed) if changed != id => continue,
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
                // Refresh the estimate now and then, and cover lost notices.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = tx.closed() => return,
            }
            let Ok(job) = get(&jobs, &id, caller.as_deref()).await else {
                return;
            };
            if job != last {
                last = job.clone();
                if tx.send(Ok(job)).await.is_err() || done(&last) {
                    return;
                }
            }
        }
    });
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// Builds the runner the recovery actor drives.
pub fn runner(jobs: Arc<Jobs>, intake: Arc<Intake>, drain: TokenBucketConfig) -> JobRunner {
    Arc::new(move || {
        let (jobs, intake, drain) = (jobs.clone(), intake.clone(), drain.clone());
        Box::pin(async move { run_one(&jobs, &intake, drain).await })
    })
}

/// One run: a token from the drain bucket, the oldest job, its request
/// through the intake (buffered), the answer stored once.
async fn run_one(jobs: &Jobs, intake: &Intake, drain: TokenBucketConfig) -> RunOutcome {
    match jobs.drain_turn(drain).await {
        DrainTurn::Go => {}
        DrainTurn::Throttled => return RunOutcome::Throttled,
        DrainTurn::Unavailable => return RunOutcome::NoCapacity,
    }
    let job = match jobs.claim().await {
        Ok(Some(job)) => job,
        Ok(None) => return RunOutcome::Idle,
        Err(e) => {
            tracing::error!(error = %e, "job queue: claim failed");
            return RunOutcome::NoCapacity;
        }
    };
    let Some(claim) = job.claim.clone() else {
        return RunOutcome::Finished;
    };
    let answer = match start(intake, &job).await {
        Ok(rx) => answer(jobs, &job.id, &claim, rx).await,
        Err(e) => Err(e),
    };
    store(jobs, &job, &claim, answer).await
}

/// The stored request, started through the intake as a job run.
async fn start(intake: &Intake, job: &JobRecord) -> Result<Events, RequestError> {
    let request = <proto::CompletionRequest as prost::Message>::decode(job.request.as_slice())
        .map_err(|e| RequestError::JobCorrupt(format!("stored request unreadable: {e}")))?;
    let started = intake
        .start(Arrival {
            door: Door::Job,
            request,
            tenant: Some(job.tenant.clone()),
            request_id: Some(format!("{}-{}", job.id, job.attempts).into()),
            deadline: None,
            trace: None,
            buffered: true,
            pin: None,
        })
        .await?;
    Ok(started.rx)
}

/// Assembles the run's answer, renewing the job's lease while it lives (so
/// only a dead replica's lease lapses).
async fn answer(
    jobs: &Jobs,
    id: &str,
    claim: &str,
    mut rx: Events,
) -> Result<proto::CompletionResponse, RequestError> {
    let mut assembler = convert::Assembler::default();
    let mut renew = tokio::time::interval(jobs.lease / 3);
    renew.tick().await;
    loop {
        let item = tokio::select! {
            item = rx.recv() => item,
            _ = renew.tick() => {
                if let Ok(false) = jobs.renew(id, claim).await {
                    tracing::warn!(job = %id, "job lease lost to another replica; this run's answer will be dropped");
                }
                continue;
            }
        };
        match item {
            Some(Ok(event)) => {
                if let Some(response) = assembler.push(event) {
                    return Ok(response);
                }
            }
            Some(Err(e)) => return Err(e),
            None => {
                return Err(RequestError::Unavailable(
                    "the run ended without an answer".into(),
                ))
            }
        }
    }
}

/// Stores a run's end: the answer once (a stale claim cannot overwrite it),
/// the job back in the queue or failed, as `policy::ladder` says.
async fn store(
    jobs: &Jobs,
    job: &JobRecord,
    claim: &str,
    answer: Result<proto::CompletionResponse, RequestError>,
) -> RunOutcome {
    match answer {
        Ok(response) => {
            let bytes = prost::Message::encode_to_vec(&response);
            match jobs.succeed(&job.id, claim, bytes).await {
                Ok(true) => tracing::info!(job = %job.id, attempts = job.attempts, "job succeeded"),
                Ok(false) => {
                    tracing::warn!(job = %job.id, "job finished elsewhere; this answer is dropped")
                }
                Err(e) => {
                    tracing::error!(job = %job.id, error = %e, "job queue: storing the answer failed")
                }
            }
            RunOutcome::Finished
        }
        Err(e) => match ladder::after_job_run(&e) {
            JobRun::Requeue => {
                let _ = jobs.release(&job.id, claim).await;
                RunOutcome::NoCapacity
            }
            JobRun::Fail => {
                let reason = crate::api::errors::reason(&e);
                let _ = jobs.fail(&job.id, claim, e.to_string(), reason).await;
                RunOutcome::Finished
            }
        },
    }
}
