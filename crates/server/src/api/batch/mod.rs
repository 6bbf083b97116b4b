//! The OpenAI Batch API over the durable job queue, on the HTTP listener:
//! `POST /v1/files`, `GET /v1/files/{id}[/content]`, `POST /v1/batches`,
//! `GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`, in OpenAI's
//! shapes. Each line of a batch's input file becomes one job on the queue
//! (idempotent by batch id and line), admitted and planned through the one
//! intake like `SubmitJob`, drained by the recovery actor's token bucket, so
//! a batch survives SIGKILL and outages. Files and batch records are blobs
//! where the jobs live (SQLite, or Redis for a fleet), charged to their
//! tenant: an upload or a new batch past a quota is a 429 naming it.

mod batches;
mod files;
mod slots;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::Request;
use axum::response::Response;
use axum::routing::{get, post};

use crate::api::door::{insert, HttpState};
use crate::api::errors::{CallerError, Kind};
use crate::api::openai::error::OpenAiError;
use crate::config::QueueConfig;
use crate::error::RequestError;
use crate::state::files::quota::{FileLimits, Refusal};
use crate::state::jobs::Jobs;
use crate::state::jobs::QueueError;

/// What the Batch API's handlers share.
pub struct BatchApi {
    http: Arc<HttpState>,
    config: QueueConfig,
    /// Part of every id (with the time and random bits).
    seq: AtomicU64,
    /// Files held in memory at once (uploads, downloads, validation): each is up
    /// to `queue.max_file_bytes`, so this bounds their sum; shared fairly.
    file_slots: Arc<slots::FileSlots>,
}

/// The Batch API's routes, with their own state.
pub fn routes(http: Arc<HttpState>) -> axum::Router {
    let config = http
        .reloader
        .config()
        .and_then(|c| c.queue.clone())
        .unwrap_or_default();
    let api = Arc::new(BatchApi {
        http,
        config,
        seq: AtomicU64::new(0),
        file_slots: slots::FileSlots::new(slots::FILES_IN_MEMORY),
    });
    axum::Router::new()
        .route("/v1/files", post(files::upload))
        .route("/v1/files/{id}", get(files::retrieve))
        .route("/v1/files/{id}/content", get(files::content))
        .route("/v1/batches", post(batches::create))
        .route("/v1/batches/{id}", get(batches::retrieve))
        .route("/v1/batches/{id}/cancel", post(batches::cancel))
        .with_state(api)
}

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl BatchApi {
    /// A slot for one of `tenant`'s files in memory, or 429 FILES_BUSY while
    /// every slot is taken or the rest are kept for other tenants.
    fn file_slot(&self, tenant: &str) -> Result<slots::FileSlot, OpenAiError> {
        let total = self.file_slots.total();
        let message = match self.file_slots.take(tenant) {
            Ok(slot) => return Ok(slot),
            Err(slots::Busy::Full) => {
                format!("{total} files are being read already; retry shortly")
            }
            Err(slots::Busy::FairShare { held }) => format!(
                "this tenant holds {held} of the {total} file slots and the others are kept for other tenants; retry shortly"
            ),
        };
        Err(OpenAiError::of(Kind::FilesBusy, message))
    }

    /// The bounds on what tenants store.
    fn limits(&self) -> FileLimits {
        FileLimits::from(&self.config)
    }

    fn jobs(&self) -> Result<Arc<Jobs>, OpenAiError> {
        self.http.intake.jobs().ok_or_else(|| {
            OpenAiError::from_request(&RequestError::QueueUnavailable(
                "the Batch API needs a [queue]; none is configured".into(),
            ))
        })
    }

    /// A fresh id: the time, a counter and 64 random bits, in hex (replicas
    /// in containers share pids, so the process is no part of it).
    fn new_id(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed) & 0xffff;
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        format!("{ms:012x}{n:04x}{:016x}", rand::random::<u64>())
    }

    /// Authenticates the caller, runs `f` with its tenant, renders errors.
    async fn answer<F, Fut>(self: Arc<Self>, request: Request, f: F) -> Response
    where
        F: FnOnce(Arc<Self>, String, Request) -> Fut,
        Fut: Future<Output = Result<Response, OpenAiError>>,
    {
        let request_id = self.http.request_id(request.headers());
        let checked = self
            .http
            .check_metadata(request.headers())
            .and_then(|()| self.http.authenticate(request.headers()));
        let result = match checked {
            Ok(tenant) => {
                let tenant = tenant.unwrap_or_else(|| "default".into());
                f(self.clone(), tenant, request).await
            }
            Err(e) => Err(OpenAiError::from_request(&e)),
        };
        match result {
            Ok(mut r) => {
                insert(r.headers_mut(), "x-request-id", &request_id);
                r
            }
            Err(e) => e.response(&request_id),
        }
    }
}

/// A 400 for a request this API cannot take; `param` names the field.
fn invalid(message: impl Into<String>, param: Option<&str>) -> OpenAiError {
    OpenAiError::invalid(message.into(), param.map(str::to_string))
}

/// A 404 for a file or batch the tenant does not have; `param` names the id.
fn not_found(message: String, param: &str) -> OpenAiError {
    OpenAiError::new(
        CallerError::new(Kind::NotFound, message),
        Some(param.to_string()),
    )
}

/// A quota refused what would be stored: 429, in OpenAI's
/// `insufficient_quota` shape.
fn over_quota(r: &Refusal) -> OpenAiError {
    let kind = match r {
        Refusal::Files { .. } | Refusal::Bytes { .. } => Kind::FileQuota,
        Refusal::Budget { .. } => Kind::FileStoreFull,
    };
    OpenAiError::of(kind, r.to_string())
}

impl From<QueueError> for OpenAiError {
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Quota(r) => over_quota(&r),
            e => OpenAiError::from_request(&RequestError::from(e)),
        }
    }
}
