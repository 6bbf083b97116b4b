//! The queue: a request stored durably as a job, either as the `queue`
//! rung after the live targets failed (the caller gets a `Queued` answer)
//! or asked for up front (SubmitJob, a background response, a batch line,
//! all through `Intake::submit`). A job is only stored once its route has
//! planned it ([`CheckedJob`]), and is never reported accepted unless it was.

use super::Tasks;
use crate::actors::router::Plan;
use crate::error::RequestError;
use crate::request::RequestSpec;
use crate::sink::{EventSink, QueuedJob, Tier};
use crate::state::jobs::OwnedJob;

/// A request its route can plan: the only kind that is stored as a job.
pub struct CheckedJob {
    spec: RequestSpec,
}

impl Tasks {
    /// Plans the request's route (an unknown route, or one with no capable
    /// target, is refused now rather than when the job runs).
    pub async fn check_job(&self, spec: RequestSpec) -> Result<CheckedJob, RequestError> {
        self.plan(&spec).await?;
        Ok(CheckedJob { spec })
    }

    /// Stores a checked request as a job and wakes the recovery actor.
    pub async fn submit(&self, job: &CheckedJob) -> Result<QueuedJob, RequestError> {
        self.enqueue(&job.spec).await
    }

    /// The `queue` rung: the request stored as a job, the caller told so.
    pub(super) async fn serve_queued(
        &self,
        spec: &RequestSpec,
        plan: &Plan,
        sink: &mut EventSink,
        e: &RequestError,
    ) -> Result<bool, RequestError> {
        let job = self.enqueue(spec).await?;
        tracing::warn!(request_id = %spec.request_id, route = %plan.route, error = %e, "no live answer; queued");
        self.count_served(&plan.route, Tier::Queued, &"queue".into());
        let _ = sink.queued(job).await;
        Ok(true)
    }

    /// Accepts a validated request as a durable job and wakes the recovery actor.
    async fn enqueue(&self, spec: &RequestSpec) -> Result<QueuedJob, RequestError> {
        let jobs = self
            .jobs
            .as_ref()
            .ok_or_else(|| RequestError::QueueUnavailable("no [queue] is configured".into()))?;
        let request = spec
            .source
            .as_ref()
            .ok_or_else(|| RequestError::QueueUnavailable("the request cannot be stored".into()))?;
        let job = OwnedJob {
            tenant: spec.tenant.clone(),
            route: spec.route.clone(),
            idempotency_key: spec.idempotency_key.clone(),
            fingerprint: spec.fingerprint().to_vec(),
            request: request.to_vec(),
        };
        let record = jobs.submit(job).await?;
        self.actors.jobs_waiting();
        let (position, eta) = jobs.eta(&record).await;
        tracing::info!(request_id = %spec.request_id, job = %record.id, position, "accepted as a job");
        Ok(QueuedJob {
            record,
            position,
            eta,
        })
    }
}
