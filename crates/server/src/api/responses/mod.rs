//! The OpenAI Responses API door (on the HTTP listener beside the Chat
//! Completions and Anthropic doors): `POST /v1/responses` (one `response`
//! object, or typed SSE events), `GET /v1/responses/{id}` (also as a stream
//! from event N), `DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`
//! and `GET /v1/responses/{id}/input_items`. A request becomes a
//! `proto::CompletionRequest` and starts through the one intake (tenants,
//! limits, cost caps, idempotency, the ladder and failover as on every
//! door); `model` names a route or a pinned `provider/model`. With `store`
//! (the default) the response and its conversation are kept in the state
//! backend for `previous_response_id` on any replica; `background: true`
//! runs it as a durable job on the queue. Errors are OpenAI's shape from the
//! one error table.

mod request;
mod response;
mod store;
mod stream;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Path, Request, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::api::door::{self, served_headers, HttpState, Served};
use crate::api::intake::{Arrival, Door};
use crate::api::openai::error::OpenAiError;
use crate::chat::FinishReason;
use crate::error::RequestError;
use crate::proto;
use crate::sink::{Event, Events};
use crate::state::jobs::Jobs;
use crate::state::responses::ResponseStore;

use request::{Ask, ToolNames};
use response::{object, usage_json, Meta, Output, Status};
use store::Record;

/// What the Responses door's handlers share.
pub struct ResponsesApi {
    http: Arc<HttpState>,
    /// Part of every response id (with the time and random bits).
    seq: AtomicU64,
}

/// The Responses door's routes, with their own state.
pub fn routes(http: Arc<HttpState>) -> axum::Router {
    let api = Arc::new(ResponsesApi {
        http,
        seq: AtomicU64::new(0),
    });
    axum::Router::new()
        .route("/v1/responses", post(create))
        .route("/v1/responses/{id}", get(retrieve).delete(delete))
        .route("/v1/responses/{id}/cancel", post(cancel))
        .route("/v1/responses/{id}/input_items", get(input_items))
        .with_state(api)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ResponsesApi {
    fn store(&self) -> Result<&ResponseStore, RequestError> {
        self.http
            .responses
            .as_deref()
            .ok_or_else(|| RequestError::Unavailable("no response store is configured".into()))
    }

    fn jobs(&self) -> Option<Arc<Jobs>> {
        self.http.intake.jobs()
    }

    /// A fresh response id: `resp_`, the time, a counter and 64 random bits.
    fn new_id(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed) & 0xffff;
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        format!("resp_{ms:012x}{n:04x}{:016x}", rand::random::<u64>())
    }

    /// Authenticates the caller and runs `f` with its tenant ("default" in
    /// open mode), rendering errors in OpenAI's shape.
    async fn answer<F, Fut>(self: Arc<Self>, request: Request, f: F) -> Response
    where
        F: FnOnce(Arc<Self>, String, Request, Arc<str>) -> Fut,
        Fut: std::future::Future<Output = Result<Response, OpenAiError>>,
    {
        let request_id = self.http.request_id(request.headers());
        let checked = self
            .http
            .check_metadata(request.headers())
            .and_then(|()| self.http.authenticate(request.headers()));
        let result = match checked {
            Ok(tenant) => {
                let tenant = tenant.unwrap_or_else(|| "default".into());
                f(self.clone(), tenant, request, request_id.clone()).await
            }
            Err(e) => Err(OpenAiError::from_request(&e)),
        };
        result.unwrap_or_else(|e| e.response(&request_id))
    }
}

fn refused(e: RequestError) -> OpenAiError {
    OpenAiError::from_request(&e)
}

/// A JSON answer with the request id.
fn json_answer(body: Value, request_id: &str) -> Response {
    let mut r = axum::Json(body).into_response();
    door::insert(r.headers_mut(), "x-request-id", request_id);
    r
}

// ---- POST /v1/responses ----------------------------------------------------

async fn create(State(api): State<Arc<ResponsesApi>>, request: Request) -> Response {
    api.answer(request, |api, tenant, request, request_id| async move {
        let (parts, body) = request.into_parts();
        let bytes = api
            .http
            .read_body(body, &parts.headers)
            .await
            .map_err(refused)?;
        let ask = request::parse(&bytes)?;
        api.create(ask, tenant, &parts.headers, &request_id).await
    })
    .await
}

/// The conversation a request continues: the previous response's, when it
/// names one (it must be final), and the tool names it mapped.
struct Continued {
    conversation: Vec<proto::Message>,
    names: ToolNames,
}

impl ResponsesApi {
    async fn continued(&self, ask: &Ask, tenant: &str) -> Result<Continued, OpenAiError> {
        let Some(id) = &ask.previous_response_id else {
            return Ok(Continued {
                conversation: Vec::new(),
                names: ask.names.clone(),
            });
        };
        let record = self
            .load(tenant, id)
            .await
            .map_err(refused)?
            .ok_or_else(|| refused(RequestError::PreviousResponseNotFound(id.clone())))?;
        if !record.done {
            return Err(request::bad(
                "previous_response_id",
                format_args!(
                    "response `{id}` is still {}: continue from it once it is final",
                    record.status()
                ),
            ));
        }
        let mut names = record.names.clone();
        names.extend(ask.names.clone());
        Ok(Continued {
            conversation: record.conversation().map_err(refused)?,
            names,
        })
    }

    async fn create(
        self: Arc<Self>,
        ask: Ask,
        tenant: String,
        headers: &HeaderMap,
        request_id: &Arc<str>,
    ) -> Result<Response, OpenAiError> {
        let continued = self.continued(&ask, &tenant).await?;
        let mut request = ask.request.clone();
        request.messages = ask.messages(&continued.conversation);
        let mut conversation = continued.conversation;
        conversation.extend(ask.input.iter().cloned());
        let mut meta = Meta {
            id: self.new_id(),
            created_at: now_secs(),
            background: ask.background,
            store: ask.store,
            previous_response_id: ask.previous_response_id.clone(),
            echo: ask.echo.clone(),
        };
        if ask.background {
            return self
                .background(
                    ask.stream,
                    request,
                    meta,
                    conversation,
                    continued.names,
                    tenant,
                    headers,
                    request_id,
                )
                .await;
        }
        if meta.store {
            match self.store().map_err(refused)?.room(&tenant).await {
                Ok(()) => {}
                // Served anyway; the answer says it was not stored.
                Err(RequestError::StateUnavailable(_)) => meta.store = false,
                Err(e) => return Err(refused(e)),
            }
        }
        let rx = self
            .http
            .start(
                Door::Responses,
                request,
                Some(tenant.clone()),
                request_id,
                headers,
                ask.stream,
            )
            .await
            .map_err(refused)?;
        let keep = meta.store.then(|| stream::Keep {
            api: self.clone(),
            tenant,
            conversation,
            names: continued.names.clone(),
        });
        if ask.stream {
            stream::live(rx, meta, continued.names, keep, request_id).await
        } else {
            unary(rx, meta, continued.names, keep, request_id).await
        }
    }

    /// Accepts a background response: its request as a job on the queue,
    /// its record (queued) in the store; answers at once.
    #[allow(clippy::too_many_arguments)]
    async fn background(
        self: Arc<Self>,
        stream: bool,
        mut request: proto::CompletionRequest,
        meta: Meta,
        conversation: Vec<proto::Message>,
        names: ToolNames,
        tenant: String,
        headers: &HeaderMap,
        request_id: &Arc<str>,
    ) -> Result<Response, OpenAiError> {
        if self.jobs().is_none() {
            return Err(refused(RequestError::QueueUnavailable(
                "background responses run on the job queue; configure [queue]".into(),
            )));
        }
        let store = self.store().map_err(refused)?;
        store.room(&tenant).await.map_err(refused)?;
        if let Some(key) = headers.get("idempotency-key").and_then(|v| v.to_str().ok()) {
            request.idempotency_key = key.to_string();
        }
        let (route, pin) = self.http.route_and_pin(&request.route).map_err(refused)?;
        request.route = route;
        // The job's stored request carries the pin.
        request.target = pin.unwrap_or_default();
        let queued = self
            .http
            .intake
            .submit(Arrival {
                door: Door::Responses,
                request,
                tenant: Some(tenant.clone()),
                request_id: Some(request_id.clone()),
                deadline: None,
                trace: crate::telemetry::tracing::trace_context(headers),
                buffered: true,
                pin: None,
            })
            .await
            .map_err(refused)?;
        let response = object(&meta, &Status::Queued, Vec::new(), Value::Null);
        let record = Record::new(
            meta,
            response.clone(),
            conversation,
            names,
            Some(queued.record.id.clone()),
            false,
        );
        if let Err(e) = store
            .put(&tenant, &record.meta.id, record.encode(), false)
            .await
        {
            if let Some(jobs) = self.jobs() {
                let _ = jobs
                    .cancel(&queued.record.id, "its response could not be stored")
                    .await;
            }
            return Err(refused(e));
        }
        tracing::info!(response = %record.meta.id, job = %queued.record.id, "background response queued");
        if stream {
            return Ok(stream::replay(
                self.clone(),
                tenant,
                record,
                None,
                request_id,
            ));
        }
        Ok(json_answer(response, request_id))
    }
}

/// Reads a buffered answer into one response object.
async fn unary(
    mut rx: Events,
    meta: Meta,
    names: ToolNames,
    keep: Option<stream::Keep>,
    request_id: &str,
) -> Result<Response, OpenAiError> {
    let mut output = Output::new(&meta.id, names.clone());
    let mut frames = Vec::new();
    let served;
    let (status, usage) = loop {
        match rx.recv().await {
            None => return Err(OpenAiError::internal("request ended without an answer")),
            Some(Err(e)) => return Err(refused(e)),
            Some(Ok(Event::Queued(q))) => return Ok(door::queued(&q, request_id)),
            // A buffered call is never journaled, so it never moves.
            Some(Ok(Event::Moved { .. })) => return Err(refused(RequestError::Draining)),
            Some(Ok(Event::Started(_) | Event::Continued(_))) => {}
            Some(Ok(Event::Chunk(c))) => {
                output.push(c, &mut frames);
                frames.clear();
            }
            Some(Ok(Event::Reset { .. })) => output = Output::new(&meta.id, names.clone()),
            Some(Ok(Event::Finished(f))) => {
                served = Some(Served::of_finished(&f));
                let usage = crate::api::content::usage_proto(&f.usage, f.usage_estimated);
                break (Status::of_finish(f.finish_reason), usage_json(&usage));
            }
        }
    };
    output.finish(!matches!(status, Status::Completed), &mut frames);
    let mut response = object(&meta, &status, output.items_json(), usage);
    if let Some(keep) = keep {
        let record = keep.record(&meta, &response, &output);
        if !keep.put(&meta.id, record).await {
            if let Some(o) = response.as_object_mut() {
                o.insert("store".into(), json!(false));
            }
        }
    }
    let mut r = axum::Json(response).into_response();
    served_headers(r.headers_mut(), served, request_id);
    Ok(r)
}

// ---- GET, DELETE, cancel, input_items --------------------------------------

/// `stream` and `starting_after` of a retrieve.
fn replay_query(request: &Request) -> Result<(bool, Option<u64>), OpenAiError> {
    let mut stream = false;
    let mut after = None;
    for (k, v) in form_urlencoded::parse(request.uri().query().unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "stream" => stream = v == "true",
            "starting_after" => {
                after = Some(v.parse::<u64>().map_err(|_| {
                    request::bad("starting_after", "must be a non-negative integer")
                })?)
            }
            _ => {}
        }
    }
    Ok((stream, after))
}

async fn retrieve(
    State(api): State<Arc<ResponsesApi>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, request, request_id| async move {
        let (stream, after) = replay_query(&request)?;
        let record = api.found(&tenant, &id).await?;
        if stream {
            return Ok(stream::replay(
                api.clone(),
                tenant,
                record,
                after,
                &request_id,
            ));
        }
        Ok(json_answer(record.response, &request_id))
    })
    .await
}

async fn delete(
    State(api): State<Arc<ResponsesApi>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, _request, request_id| async move {
        let record = api.load(&tenant, &id).await.map_err(refused)?;
        let deleted = api
            .store()
            .map_err(refused)?
            .delete(&tenant, &id)
            .await
            .map_err(refused)?;
        let Some(record) = record.filter(|_| deleted) else {
            return Err(refused(RequestError::ResponseNotFound(id)));
        };
        // A background response deleted before it ran does not run.
        if let (Some(job), false, Some(jobs)) = (&record.job, record.done, api.jobs()) {
            let _ = jobs.cancel(job, "its response was deleted").await;
        }
        Ok(json_answer(
            json!({"id": id, "object": "response", "deleted": true}),
            &request_id,
        ))
    })
    .await
}

async fn cancel(
    State(api): State<Arc<ResponsesApi>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, _request, request_id| async move {
        let record = api.found(&tenant, &id).await?;
        if !record.meta.background {
            return Err(OpenAiError::invalid(
                "Only responses created with the `background` parameter set to `true` can be cancelled.".into(),
                None,
            ));
        }
        if record.done {
            return Ok(json_answer(record.response, &request_id));
        }
        // A queued job never runs; a running one finishes upstream (and is
        // billed) but its answer is discarded: the response stays cancelled.
        if let (Some(job), Some(jobs)) = (&record.job, api.jobs()) {
            let _ = jobs.cancel(job, "cancelled by the caller").await;
        }
        let output = Output::new(&id, record.names.clone());
        let cancelled = record
            .finished(&Status::Cancelled, &output, Value::Null)
            .map_err(refused)?;
        let stored = api
            .finish(&tenant, cancelled)
            .await
            .map_err(refused)?
            .ok_or_else(|| refused(RequestError::ResponseNotFound(id)))?;
        Ok(json_answer(stored.response, &request_id))
    })
    .await
}

async fn input_items(
    State(api): State<Arc<ResponsesApi>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, request, request_id| async move {
        let record = api.found(&tenant, &id).await?;
        let list = store::input_item_list(&record, request.uri().query())?;
        Ok(json_answer(list, &request_id))
    })
    .await
}
