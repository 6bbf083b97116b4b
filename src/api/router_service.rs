//! The gRPC `switchyard.v1.Router` service. Each call is validated, handed to
//! a request task, and answered from that task's bounded channel. Response
//! headers wait for the first event, so anything that fails before the first
//! token is a plain status the caller can act on.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::Instrument;

use super::auth::Tenant;
use super::convert;
use super::jobs;
use super::status::to_status;
use super::tenants::TenantLimiter;
use crate::config::LimitsConfig;
use crate::dispatch::Dispatcher;
use crate::error::RequestError;
use crate::proto;
use crate::request::RequestSpec;
use crate::sink::{EventSink, Item};

pub type EventStream = Pin<Box<dyn Stream<Item = Result<proto::CompletionEvent, Status>> + Send>>;

/// The service; cheap to clone.
#[derive(Clone)]
pub struct RouterService {
    dispatcher: Arc<Dispatcher>,
    buffer: usize,
    limits: Arc<LimitsConfig>,
    tenants: Arc<TenantLimiter>,
    /// Prefix unique to this process, so ids from replicas don't collide.
    id_prefix: Arc<str>,
    next_id: Arc<AtomicU64>,
}

impl RouterService {
    fn jobs(&self) -> Result<Arc<crate::queue::jobs::Jobs>, Status> {
        self.dispatcher.jobs.clone().ok_or_else(|| {
            to_status(&RequestError::QueueUnavailable(
                "no [queue] is configured".into(),
            ))
        })
    }

    pub fn new(dispatcher: Arc<Dispatcher>, buffer: usize, limits: LimitsConfig) -> Self {
        let prefix: u32 = rand::random();
        RouterService {
            dispatcher,
            buffer,
            tenants: TenantLimiter::new(&limits),
            limits: Arc::new(limits),
            id_prefix: format!("{prefix:08x}").into(),
            next_id: Arc::new(AtomicU64::new(1)),
        }
    }

    fn request_id(&self) -> String {
        format!(
            "sy-{}-{}",
            self.id_prefix,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Validates and starts the request task; returns its channel.
    /// Validates a request into a spec, with the caller's tenant.
    fn spec(
        &self,
        request: Request<proto::CompletionRequest>,
        deadline: Option<Instant>,
    ) -> Result<RequestSpec, Status> {
        let tenant = request.extensions().get::<Tenant>().map(|t| t.0.clone());
        let mut spec = convert::request_spec(
            request.into_inner(),
            self.request_id(),
            deadline,
            &self.limits,
        )
        .map_err(|e| to_status(&e))?;
        if let Some(tenant) = tenant {
            // An authenticated caller's tenant is its token's, not what it claims.
            spec.tenant = tenant;
        }
        Ok(spec)
    }

    fn start(
        &self,
        request: Request<proto::CompletionRequest>,
        buffered: bool,
    ) -> Result<Started, Status> {
        let deadline = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(convert::parse_grpc_timeout)
            .map(|t| Instant::now() + t.saturating_sub(deadline_margin(t)));
        let metadata = request.metadata().clone();
        let spec = self.spec(request, deadline)?;
        let request_id = spec.request_id.clone();
        let span = tracing::info_span!(
            "request",
            otel.name = %format!("chat {}", spec.route),
            otel.kind = "server",
            request_id = %spec.request_id,
            route = %spec.route,
            gen_ai.operation.name = "chat",
            streaming = !buffered,
        );
        crate::telemetry::tracing::continue_trace(&span, &metadata);
        let (tx, rx) = mpsc::channel(self.buffer);
        let slot = self
            .tenants
            .admit(&spec.tenant, Instant::now())
            .map_err(|e| to_status(&e))?;
        let run = self
            .dispatcher
            .clone()
            .run(spec, EventSink::new(tx, buffered));
        tokio::spawn(
            async move {
                run.await;
                // The tenant's slot is held for the whole request.
                drop(slot);
            }
            .instrument(span),
        );
        Ok(Started {
            request_id,
            rx,
            deadline,
        })
    }
}

/// A started request task, seen from the handler.
struct Started {
    request_id: String,
    rx: mpsc::Receiver<Item>,
    /// The caller's deadline (less the margin), when it sent one.
    deadline: Option<Instant>,
}

impl Started {
    /// The next item, or DEADLINE_EXCEEDED once the deadline passes. tonic
    /// itself answers CANCELLED when a handler outlives `grpc-timeout`; the
    /// margin lets Switchyard's own, precise status reach the caller first.
    async fn next(&mut self) -> Option<Item> {
        let Some(deadline) = self.deadline else {
            return self.rx.recv().await;
        };
        tokio::select! {
            biased;
            item = self.rx.recv() => item,
            _ = tokio::time::sleep_until(deadline) => {
                Some(Err(RequestError::DeadlineExceeded { attempts: 0 }))
            }
        }
    }
}

/// How much earlier than the caller's deadline Switchyard gives up, so its
/// answer arrives before the caller's (or tonic's) own timer fires.
fn deadline_margin(timeout: Duration) -> Duration {
    (timeout / 10).min(Duration::from_millis(20))
}

fn with_request_id<T>(mut response: Response<T>, id: &str) -> Response<T> {
    if let Ok(v) = id.parse() {
        response.metadata_mut().insert("x-request-id", v);
    }
    response
}

#[tonic::async_trait]
impl proto::router_server::Router for RouterService {
    type StreamCompletionStream = EventStream;
    type WatchJobStream = jobs::JobStream;

    async fn submit_job(
        &self,
        request: Request<proto::CompletionRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let jobs = self.jobs()?;
        let spec = self.spec(request, None)?;
        self.dispatcher
            .plan(&spec)
            .await
            .map_err(|e| to_status(&e))?;
        let queued = self
            .dispatcher
            .enqueue(&spec)
            .await
            .map_err(|e| to_status(&e))?;
        drop(jobs);
        Ok(Response::new(convert::job(
            &queued.record,
            queued.position,
            queued.eta,
        )))
    }

    async fn get_job(
        &self,
        request: Request<proto::GetJobRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        let jobs = self.jobs()?;
        Ok(Response::new(
            jobs::get(&jobs, &request.into_inner().id).await?,
        ))
    }

    async fn watch_job(
        &self,
        request: Request<proto::GetJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let jobs = self.jobs()?;
        Ok(Response::new(
            jobs::watch(jobs, request.into_inner().id).await?,
        ))
    }

    async fn stream_completion(
        &self,
        request: Request<proto::CompletionRequest>,
    ) -> Result<Response<Self::StreamCompletionStream>, Status> {
        let mut started = self.start(request, false)?;
        let first = match started.next().await {
            Some(Ok(event)) => event,
            Some(Err(e)) => return Err(to_status(&e)),
            None => return Err(Status::internal("request ended without an answer")),
        };
        let (id, rest) = (started.request_id, ReceiverStream::new(started.rx));
        let stream = futures_util::stream::once(async move { Ok(first) })
            .chain(rest)
            .map(|item| item.map(convert::event).map_err(|e| to_status(&e)));
        Ok(with_request_id(Response::new(Box::pin(stream)), &id))
    }

    async fn complete(
        &self,
        request: Request<proto::CompletionRequest>,
    ) -> Result<Response<proto::CompletionResponse>, Status> {
        let mut started = self.start(request, true)?;
        let id = started.request_id.clone();
        let mut assembler = convert::Assembler::default();
        while let Some(item) = started.next().await {
            match item {
                Ok(event) => {
                    if let Some(response) = assembler.push(event) {
                        return Ok(with_request_id(Response::new(response), &id));
                    }
                }
                Err(e) => return Err(to_status(&e)),
            }
        }
        Err(Status::internal("request ended without an answer"))
    }
}
