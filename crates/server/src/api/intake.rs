//! The one request start every front door uses (gRPC, the OpenAI HTTP doors,
//! SubmitJob, the job runner, and embeddings calls): validation into a `RequestSpec`, the
//! authenticated tenant, per-tenant limits, the request id, the span with the
//! caller's trace context, and the request task (spawned for a stream; run
//! inside the door's receiver for a buffered answer, `sink::Events::drive`),
//! or the job stored for it (`submit`). Cost reservation and idempotency run
//! first thing in that task (`task::Tasks::run`), so no door can skip them
//! either. Nothing that enforces a limit lives in a door.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::FutureExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::convert;
use crate::config::LimitsConfig;
use crate::embeddings::{EmbedSpec, Embedded};
use crate::error::RequestError;
use crate::proto;
use crate::request::RequestSpec;
use crate::sink::{self, Delivery, Events, QueuedJob, SendLimits};
use crate::state::tenants::{Slot, TenantLimits};
use crate::task::{CheckedJob, Tasks};

/// Which front door a request came through (span attribute, id prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    Grpc,
    OpenAi,
    /// The OpenAI Responses API door (a background response's job runs as `Job`).
    Responses,
    Anthropic,
    /// A line of an OpenAI batch, accepted into the queue: the queue's caps
    /// bound it, not the per-request tenant limits.
    Batch,
    /// A queued job's run: its limits were applied when it was submitted.
    Job,
}

impl Door {
    fn as_str(self) -> &'static str {
        match self {
            Door::Grpc => "grpc",
            Door::OpenAi => "openai",
            Door::Responses => "responses",
            Door::Anthropic => "anthropic",
            Door::Batch => "batch",
            Door::Job => "job",
        }
    }
}

/// A request as a front door received it, in the gRPC contract's shape.
pub struct Arrival {
    pub door: Door,
    pub request: proto::CompletionRequest,
    /// The authenticated tenant (`None` in open auth mode).
    pub tenant: Option<String>,
    /// An id the caller supplied and the door accepted, else one is made.
    pub request_id: Option<Arc<str>>,
    /// The caller's deadline (less the reply margin), when it set one.
    pub deadline: Option<Instant>,
    /// Headers or metadata carrying a W3C `traceparent`.
    pub trace: Option<tonic::metadata::MetadataMap>,
    /// The caller gets one assembled answer (unary, non-streaming HTTP, jobs).
    pub buffered: bool,
    /// Only this `provider/model` target of the route may serve.
    pub pin: Option<String>,
}

/// A started request task, seen from its door.
pub struct Started {
    pub request_id: Arc<str>,
    pub rx: Events,
    /// The caller's deadline, when it sent one.
    pub deadline: Option<Instant>,
    /// The stream's resume token (the `x-switchyard-resume-token` header),
    /// when it is journaled.
    pub resume_token: Option<Arc<str>>,
}

/// Validated, admitted and ready to spawn (or to store as a job).
pub struct Admitted {
    pub spec: RequestSpec,
    /// The tenant's concurrency slot, held as long as the request runs.
    pub slot: Option<Slot>,
    span: tracing::Span,
}

/// Why a request could not become a job.
#[derive(Debug)]
pub enum JobRefusal {
    /// The request itself (validation, the tenant's limits).
    Request(RequestError),
    /// Its route (unknown, or no target has what it needs).
    Route(RequestError),
}

/// The intake; shared by every door.
pub struct Intake {
    tasks: Arc<Tasks>,
    tenants: TenantLimits,
    limits: LimitsConfig,
    /// How each request's sends to its caller are bounded.
    send: SendLimits,
    /// Prefix unique to this process, so ids from replicas don't collide.
    id_prefix: String,
    next_id: AtomicU64,
}

impl Intake {
    pub fn new(
        tasks: Arc<Tasks>,
        tenants: TenantLimits,
        limits: LimitsConfig,
        send: SendLimits,
    ) -> Arc<Self> {
        let prefix: u32 = rand::random();
        Arc::new(Intake {
            tasks,
            tenants,
            limits,
            send,
            id_prefix: format!("{prefix:08x}"),
            next_id: AtomicU64::new(1),
        })
    }

    pub fn limits(&self) -> &LimitsConfig {
        &self.limits
    }

    /// The durable job queue, when configured.
    pub fn jobs(&self) -> Option<Arc<crate::state::jobs::Jobs>> {
        self.tasks.jobs()
    }

    /// A fresh request id, shared by the request's events and its door.
    pub fn request_id(&self) -> Arc<str> {
        use std::io::Write;
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Written on the stack and copied once (a `String` turned into an
        // `Arc<str>` would be a second allocation).
        let mut buf = [0u8; 64];
        let mut rest = &mut buf[..];
        if write!(rest, "sy-{}-{n}", self.id_prefix).is_ok() {
            let len = 64 - rest.len();
            if let Ok(id) = std::str::from_utf8(&buf[..len]) {
                return Arc::from(id);
            }
        }
        Arc::from(format!("sy-{}-{n}", self.id_prefix))
    }

    /// Validates and admits a request: the spec, the tenant's slot and the span.
    pub async fn admit(&self, arrival: Arrival) -> Result<Admitted, RequestError> {
        let request_id = arrival.request_id.unwrap_or_else(|| self.request_id());
        // The request as it was sent, for the `queue` rung and a stream's
        // journal, which store it; not encoded where nothing can. An `Arc`
        // (8 bytes), not `Bytes` (32): every open stream's request holds it.
        let source = self
            .tasks
            .stores_requests(!arrival.buffered)
            .then(|| Arc::new(prost::Message::encode_to_vec(&arrival.request)));
        let mut spec =
            convert::request_spec(arrival.request, request_id, arrival.deadline, &self.limits)?;
        spec.source = source;
        if let Some(tenant) = arrival.tenant {
            // An authenticated caller's tenant is its token's, not what it claims.
            spec.tenant = tenant;
        }
        // The HTTP doors pin by `model = "provider/model"`; gRPC by `target`.
        if arrival.pin.is_some() {
            spec.pin = arrival.pin;
        }
        let slot = match arrival.door {
            Door::Job => {
                // A job run never goes to the queue again, and the job's own
                // idempotency key was checked when it was submitted.
                spec.from_queue = true;
                spec.idempotency_key = None;
                None
            }
            Door::Batch => None,
            Door::Grpc | Door::OpenAi | Door::Responses | Door::Anthropic => {
                Some(self.tenants.admit(&spec.tenant).await?)
            }
        };
        let span = tracing::info_span!(
            "request",
            otel.name = %format!("chat {}", spec.route),
            otel.kind = "server",
            request_id = %spec.request_id,
            route = %spec.route,
            gen_ai.operation.name = "chat",
            streaming = !arrival.buffered,
            api = arrival.door.as_str(),
        );
        if let Some(trace) = &arrival.trace {
            crate::telemetry::tracing::continue_trace(&span, trace);
        }
        Ok(Admitted { spec, slot, span })
    }

    /// Admits the request and spawns its task; the door reads the answer
    /// from the returned channel.
    pub async fn start(&self, arrival: Arrival) -> Result<Started, RequestError> {
        let delivery = match (arrival.buffered, arrival.door) {
            (true, _) => Delivery::Buffered,
            (false, Door::Grpc) => Delivery::Resettable,
            (false, _) => Delivery::Final,
        };
        let deadline = arrival.deadline;
        let admitted = self.admit(arrival).await?;
        Ok(self.spawn(admitted, delivery, deadline).await)
    }

    /// A reconnect to one of the caller's streams by its resume token
    /// (`ResumeCompletion`): every item after `after_seq`, then the live
    /// tail, from this replica or any other of the fleet. The token is
    /// checked against the tenant before anything streams.
    pub async fn resume(
        &self,
        tenant: Option<String>,
        claimed_tenant: &str,
        token: &str,
        after_seq: u64,
    ) -> Result<Started, RequestError> {
        let tenant = tenant.unwrap_or_else(|| match claimed_tenant {
            "" => "default".to_string(),
            t => t.to_string(),
        });
        let follower = self.tasks.follower(&tenant, token, after_seq).await?;
        let slot = self.tenants.admit(&tenant).await?;
        let (mut sink, rx) = sink::channel(self.send, Delivery::Resettable);
        let request_id = self.request_id();
        let span = tracing::info_span!(
            "resume",
            otel.name = "resume",
            otel.kind = "server",
            request_id = %request_id,
        );
        let tasks = self.tasks.clone();
        tokio::spawn(
            async move {
                if let Err(e) = tasks.read_on(follower, &mut sink).await {
                    sink.fail(e).await;
                }
                drop(slot);
            }
            .instrument(span),
        );
        Ok(Started {
            request_id,
            rx,
            deadline: None,
            resume_token: Some(Arc::from(token)),
        })
    }

    /// Stores the request as a job instead of running it (SubmitJob, a
    /// background response): admitted, its route planned, then queued.
    pub async fn submit(&self, arrival: Arrival) -> Result<QueuedJob, RequestError> {
        let Admitted { spec, slot, .. } = self.admit(arrival).await?;
        let job = self.tasks.check_job(spec).await?;
        let queued = self.tasks.submit(&job).await;
        // The tenant's slot is held until the job is stored.
        drop(slot);
        queued
    }

    /// Admits a request and plans its route, so it may be stored as a job
    /// later (a batch checks every line before it stores any).
    pub async fn check_job(&self, arrival: Arrival) -> Result<CheckedJob, JobRefusal> {
        let admitted = self.admit(arrival).await.map_err(JobRefusal::Request)?;
        self.tasks
            .check_job(admitted.spec)
            .await
            .map_err(JobRefusal::Route)
    }

    /// Stores a checked request as a job.
    pub async fn submit_checked(&self, job: &CheckedJob) -> Result<QueuedJob, RequestError> {
        self.tasks.submit(job).await
    }

    /// An embeddings call through the same intake: the authenticated
    /// tenant, the tenant's limits (its slot held as long as the call runs),
    /// the request id and the span with the caller's trace context. The call
    /// runs in a task of its own, so its bill is settled even if the caller
    /// leaves.
    pub async fn embed(
        &self,
        door: Door,
        mut spec: EmbedSpec,
        tenant: Option<String>,
        trace: Option<&tonic::metadata::MetadataMap>,
    ) -> Result<Embedded, RequestError> {
        if let Some(tenant) = tenant {
            spec.tenant = tenant;
        }
        spec.validate(&self.limits)?;
        let slot = self.tenants.admit(&spec.tenant).await?;
        let span = tracing::info_span!(
            "request",
            otel.name = %format!("embeddings {}", spec.route),
            otel.kind = "server",
            request_id = %spec.request_id,
            route = %spec.route,
            gen_ai.operation.name = "embeddings",
            api = door.as_str(),
        );
        if let Some(trace) = trace {
            crate::telemetry::tracing::continue_trace(&span, trace);
        }
        // The slot is dropped when the call ends (`map`, not an `async`
        // block: that would store the call's future twice).
        let run = self.tasks.clone().embed(spec).map(move |result| {
            drop(slot);
            result
        });
        let task = tokio::spawn(run.instrument(span));
        task.await
            .map_err(|e| RequestError::Unavailable(format!("the embeddings task ended: {e}")))?
    }

    /// Spawns an admitted request's task. A stream (not a reconnect) is
    /// journaled, so its caller can resume it.
    pub async fn spawn(
        &self,
        admitted: Admitted,
        delivery: Delivery,
        deadline: Option<Instant>,
    ) -> Started {
        let Admitted { spec, slot, span } = admitted;
        let request_id = spec.request_id.clone();
        let (mut sink, rx) = sink::channel(self.send, delivery);
        if let Some(deadline) = deadline {
            sink.set_deadline(deadline);
        }
        if delivery != Delivery::Buffered && spec.resume_after.is_none() {
            let tee = self.tasks.journal_tee(&spec).await;
            if let Some(tee) = tee {
                sink.set_tee(Box::new(tee), false);
            }
        }
        let resume_token = sink.resume_token().cloned();
        // The tenant's slot is held for the whole request. Not an `async`
        // block around `run`: one would store the request's future twice
        // (the moved-in future and the one it awaits, about 6 KB each).
        let run = self
            .tasks
            .clone()
            .run(spec, sink)
            .map(move |()| drop(slot))
            .instrument(span);
        let mut rx = rx;
        if delivery == Delivery::Buffered {
            // The door reads a buffered answer to its end: the request runs
            // in the door's task (spawned only if the door stops waiting).
            rx.drive(Box::pin(run));
        } else {
            tokio::spawn(run);
        }
        Started {
            request_id,
            rx,
            deadline,
            resume_token,
        }
    }
}
