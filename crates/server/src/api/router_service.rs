//! The gRPC `switchyard.v1.Router` service. Each call is validated, handed to
//! a request task, and answered from that task's bounded channel. Response
//! headers wait for the first event, so anything that fails before the first
//! token is a plain status the caller can act on.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::auth::Tenant;
use super::convert;
use super::errors::{to_status, CallerError};
use super::intake::{Arrival, Door, Intake, Started};
use super::jobs;
use crate::error::RequestError;
use crate::proto;
use crate::sink::Item;

pub type EventStream = Pin<Box<dyn Stream<Item = Result<proto::CompletionEvent, Status>> + Send>>;

/// The service; cheap to clone.
#[derive(Clone)]
pub struct RouterService {
    intake: Arc<Intake>,
}

impl RouterService {
    fn jobs(&self) -> Result<Arc<crate::state::jobs::Jobs>, Status> {
        self.intake.jobs().ok_or_else(|| {
            to_status(&RequestError::QueueUnavailable(
                "no [queue] is configured".into(),
            ))
        })
    }

    pub fn new(intake: Arc<Intake>) -> Self {
        RouterService { intake }
    }

    /// The gRPC request as the intake takes it.
    fn arrival(
        request: Request<proto::CompletionRequest>,
        deadline: Option<Instant>,
        buffered: bool,
    ) -> Arrival {
        let tenant = caller(&request);
        let (metadata, _, request) = request.into_parts();
        Arrival {
            door: Door::Grpc,
            request,
            tenant,
            request_id: None,
            deadline,
            trace: Some(metadata),
            buffered,
            pin: None,
        }
    }

    async fn start(
        &self,
        request: Request<proto::CompletionRequest>,
        buffered: bool,
    ) -> Result<Waiting, Status> {
        let deadline = caller_deadline(&request);
        let started = self
            .intake
            .start(Self::arrival(request, deadline, buffered))
            .await
            .map_err(|e| to_status(&e))?;
        let timer = started
            .deadline
            .map(|d| Box::pin(tokio::time::sleep_until(d)));
        Ok(Waiting { started, timer })
    }
}

/// A started request task, seen from the handler.
struct Waiting {
    started: Started,
    /// The deadline's one timer, shared by every wait of the request.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Waiting {
    /// The next item, or DEADLINE_EXCEEDED once the deadline passes. tonic
    /// itself answers CANCELLED when a handler outlives `grpc-timeout`; the
    /// margin lets Switchyard's own, precise status reach the caller first.
    async fn next(&mut self) -> Option<Item> {
        let Some(timer) = self.timer.as_mut() else {
            return self.started.rx.recv().await;
        };
        tokio::select! {
            biased;
            item = self.started.rx.recv() => item,
            _ = timer.as_mut() => {
                Some(Err(RequestError::DeadlineExceeded { attempts: 0 }))
            }
        }
    }
}

/// The caller's `grpc-timeout` as a deadline, less the reply margin.
fn caller_deadline<T>(request: &Request<T>) -> Option<Instant> {
    request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(convert::parse_grpc_timeout)
        .map(|t| crate::policy::clock::after(Instant::now(), t.saturating_sub(deadline_margin(t))))
}

/// How much earlier than the caller's deadline Switchyard gives up, so its
/// answer arrives before the caller's (or tonic's) own timer fires.
fn deadline_margin(timeout: Duration) -> Duration {
    (timeout / 10).min(Duration::from_millis(20))
}

/// The authenticated tenant of a call (`None` in open auth mode).
fn caller<T>(request: &Request<T>) -> Option<String> {
    request.extensions().get::<Tenant>().map(|t| t.0.clone())
}

fn with_request_id<T>(mut response: Response<T>, id: &str) -> Response<T> {
    // Copied into the arena: the value lives until the head is written.
    if let Ok(v) = tonic::metadata::MetadataValue::try_from(crate::arena::concat(&[id.as_bytes()]))
    {
        response.metadata_mut().insert("x-request-id", v);
    }
    response
}

/// `x-switchyard-dropped` in the initial metadata: what the serving
/// target's wire left out (also in `Finished.dropped`).
fn with_dropped<T>(mut response: Response<T>, dropped: &[String]) -> Response<T> {
    let mut h = axum::http::HeaderMap::new();
    super::door::dropped_header(&mut h, dropped);
    if let Some(v) = h.remove("x-switchyard-dropped") {
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(v.as_bytes()) {
            response.metadata_mut().insert("x-switchyard-dropped", v);
        }
    }
    response
}

/// `x-switchyard-resume-token` in the initial metadata: the stream's
/// journal, for `ResumeCompletion` (also in `Started.resume_token`).
fn with_resume_token<T>(mut response: Response<T>, token: Option<&str>) -> Response<T> {
    if let Some(v) = token.and_then(|t| t.parse().ok()) {
        response
            .metadata_mut()
            .insert("x-switchyard-resume-token", v);
    }
    response
}

/// Answers a stream: its first item after `after` decides between a plain
/// status (a failure before output) and the stream, whose response headers
/// then carry the request id, what was dropped and the resume token. Every
/// event carries its number; those up to `after` (a reconnect) are skipped.
async fn respond(mut started: Waiting, after: u64) -> Result<Response<EventStream>, Status> {
    let first = loop {
        match started.next().await {
            Some(Ok(_)) if started.started.rx.seq() <= after => continue,
            Some(Ok(event)) => break event,
            Some(Err(e)) => return Err(to_status(&e)),
            // A reconnect after the stream's last event: nothing follows.
            None if after > 0 => {
                let done = futures_util::stream::empty();
                let response = Response::new(Box::pin(done) as EventStream);
                return Ok(with_request_id(response, &started.started.request_id));
            }
            None => {
                return Err(CallerError::internal("request ended without an answer").to_status())
            }
        }
    };
    let first_seq = started.started.rx.seq();
    let (dropped, token) = match &first {
        crate::sink::Event::Started(s) => (s.dropped.clone(), s.resume_token.clone()),
        _ => (Vec::new(), None),
    };
    let token = token.or_else(|| started.started.resume_token.clone());
    let id = started.started.request_id;
    let rest = futures_util::stream::unfold(started.started.rx, |mut rx| async move {
        let item = rx.recv().await?;
        let seq = rx.seq();
        Some(((seq, item), rx))
    });
    let stream = futures_util::stream::once(async move { (first_seq, Ok(first)) })
        .chain(rest)
        .filter(move |(seq, _)| std::future::ready(*seq > after))
        .map(|(seq, item)| {
            item.map(|e| convert::event(seq, e))
                .map_err(|e| to_status(&e))
        });
    let response = with_request_id(Response::new(Box::pin(stream) as EventStream), &id);
    Ok(with_resume_token(
        with_dropped(response, &dropped),
        token.as_deref(),
    ))
}

#[tonic::async_trait]
impl proto::router_server::Router for RouterService {
    type StreamCompletionStream = EventStream;
    type WatchJobStream = jobs::JobStream;

    async fn submit_job(
        &self,
        request: Request<proto::CompletionRequest>,
    ) -> Result<Response<proto::Job>, Status> {
        self.jobs()?;
        let queued = self
            .intake
            .submit(Self::arrival(request, None, true))
            .await
            .map_err(|e| to_status(&e))?;
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
        let caller = caller(&request);
        Ok(Response::new(
            jobs::get(&jobs, &request.into_inner().id, caller.as_deref()).await?,
        ))
    }

    async fn watch_job(
        &self,
        request: Request<proto::GetJobRequest>,
    ) -> Result<Response<Self::WatchJobStream>, Status> {
        let jobs = self.jobs()?;
        let caller = caller(&request);
        Ok(Response::new(
            jobs::watch(jobs, request.into_inner().id, caller).await?,
        ))
    }

    async fn stream_completion(
        &self,
        request: Request<proto::CompletionRequest>,
    ) -> Result<Response<Self::StreamCompletionStream>, Status> {
        // A reconnect skips what the caller already holds.
        let after = request.get_ref().resume_after_seq.unwrap_or(0);
        let started = self.start(request, false).await?;
        respond(started, after).await
    }

    type ResumeCompletionStream = EventStream;

    async fn resume_completion(
        &self,
        request: Request<proto::ResumeRequest>,
    ) -> Result<Response<Self::ResumeCompletionStream>, Status> {
        let tenant = caller(&request);
        let r = request.into_inner();
        let started = self
            .intake
            .resume(tenant, &r.tenant, &r.resume_token, r.after_seq)
            .await
            .map_err(|e| to_status(&e))?;
        respond(
            Waiting {
                started,
                timer: None,
            },
            r.after_seq,
        )
        .await
    }

    async fn embed(
        &self,
        request: Request<proto::EmbedRequest>,
    ) -> Result<Response<proto::EmbedResponse>, Status> {
        let deadline = caller_deadline(&request);
        let tenant = caller(&request);
        let (metadata, _, request) = request.into_parts();
        let id = self.intake.request_id();
        let spec = super::embeddings::spec(request, id.to_string(), deadline)
            .map_err(|e| to_status(&e))?;
        let served = self
            .intake
            .embed(Door::Grpc, spec, tenant, Some(&metadata))
            .await
            .map_err(|e| to_status(&e))?;
        let response = super::embeddings::response(served, id.to_string());
        Ok(with_request_id(Response::new(response), &id))
    }

    async fn complete(
        &self,
        request: Request<proto::CompletionRequest>,
    ) -> Result<Response<proto::CompletionResponse>, Status> {
        let mut started = self.start(request, true).await?;
        let id = started.started.request_id.clone();
        let mut assembler = convert::Assembler::default();
        while let Some(item) = started.next().await {
            match item {
                Ok(event) => {
                    if let Some(response) = assembler.push(event) {
                        let dropped = response.dropped.clone();
                        let response = with_request_id(Response::new(response), &id);
                        return Ok(with_dropped(response, &dropped));
                    }
                }
                Err(e) => return Err(to_status(&e)),
            }
        }
        Err(CallerError::internal("request ended without an answer").to_status())
    }
}
