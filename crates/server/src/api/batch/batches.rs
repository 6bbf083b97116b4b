//! Batches: create (validate every line, then queue one job per line),
//! retrieve (advance the batch from its jobs: progress, expiry, the output
//! and error files once every job is final) and cancel. A batch moves
//! validating -> in_progress -> completed, or failed (a line was invalid or
//! the queue refused it), expired (its window passed first), cancelling ->
//! cancelled. Every step is idempotent, so a batch a crash interrupted
//! resumes on its next read: its jobs are keyed by batch id and line.
//!
//! A read costs the batch's record (its counts), and while it is in
//! progress its line list and its jobs' states: never a job's request or
//! answer, which only the one read that writes the output file loads, one
//! job at a time.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::files::FileMeta;
use super::{invalid, not_found, now_secs, over_quota, BatchApi};
use crate::api::errors::Kind;
use crate::api::intake::{Arrival, Door, JobRefusal};
use crate::api::openai::error::OpenAiError;
use crate::proto;
use crate::state::files::quota::{self, BlobKind};
use crate::state::files::BlobPut;
use crate::state::jobs::JobState;
use crate::task::CheckedJob;

const ENDPOINT: &str = "/v1/chat/completions";
/// OpenAI's bound on `metadata`.
const MAX_METADATA_KEYS: usize = 16;
const MAX_METADATA_VALUE: usize = 512;

/// One request line once queued.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Line {
    custom_id: String,
    /// The `model` the line named (its answer repeats it).
    model: String,
    job: String,
}

/// A batch as stored: its state and counts; the line list is a blob of
/// its own, read only while the batch is in progress.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Batch {
    id: String,
    tenant: String,
    input_file_id: String,
    completion_window: String,
    status: String,
    created_at: u64,
    expires_at: u64,
    in_progress_at: Option<u64>,
    finalizing_at: Option<u64>,
    completed_at: Option<u64>,
    failed_at: Option<u64>,
    expired_at: Option<u64>,
    cancelling_at: Option<u64>,
    cancelled_at: Option<u64>,
    metadata: Option<Value>,
    errors: Vec<Value>,
    output_file_id: Option<String>,
    error_file_id: Option<String>,
    total: u64,
    completed: u64,
    failed: u64,
    /// The line list of a record an older version wrote (read, never written).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    lines: Vec<Line>,
}

impl Batch {
    fn json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "batch",
            "endpoint": ENDPOINT,
            "errors": if self.errors.is_empty() { Value::Null } else {
                json!({"object": "list", "data": self.errors})
            },
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "in_progress_at": self.in_progress_at,
            "expires_at": self.expires_at,
            "finalizing_at": self.finalizing_at,
            "completed_at": self.completed_at,
            "failed_at": self.failed_at,
            "expired_at": self.expired_at,
            "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        })
    }
}

fn key(id: &str) -> String {
    format!("batch:{id}")
}

fn lines_key(id: &str) -> String {
    format!("batch:{id}:lines")
}

/// A line's refusal, in the shape of a batch's `errors.data[]`.
fn line_error(line: usize, param: Option<&str>, message: String) -> Value {
    json!({"code": "invalid_request", "message": message, "param": param, "line": line})
}

#[derive(Deserialize)]
struct CreateBody {
    input_file_id: Option<String>,
    endpoint: Option<String>,
    completion_window: Option<String>,
    metadata: Option<Value>,
}

#[derive(Deserialize)]
struct InputLine {
    custom_id: Option<String>,
    method: Option<String>,
    url: Option<String>,
    body: Option<Value>,
}

impl BatchApi {
    async fn load(&self, tenant: &str, id: &str) -> Result<Batch, OpenAiError> {
        let raw = self.jobs()?.files().get(&key(id), &self.limits()).await?;
        let batch: Option<Batch> = raw.and_then(|b| serde_json::from_slice(&b).ok());
        batch
            .filter(|b| b.tenant == tenant)
            .ok_or_else(|| not_found(format!("no batch `{id}`"), "batch_id"))
    }

    /// Stores `value` as `name`, owed to the batch's tenant.
    async fn put_owed(&self, batch: &Batch, name: &str, value: Vec<u8>) -> Result<(), OpenAiError> {
        let blob = BlobPut {
            name,
            tenant: &batch.tenant,
            kind: BlobKind::Owed,
            ttl: self.config.file_ttl,
        };
        self.jobs()?
            .files()
            .put(blob, value, &self.limits())
            .await?;
        Ok(())
    }

    async fn save(&self, batch: &Batch) -> Result<(), OpenAiError> {
        let bytes = serde_json::to_vec(batch).map_err(|e| OpenAiError::internal(e.to_string()))?;
        self.put_owed(batch, &key(&batch.id), bytes).await
    }

    /// The batch's lines: its own blob (or, for an older record, inline).
    async fn lines(&self, batch: &Batch) -> Result<Vec<Line>, OpenAiError> {
        if !batch.lines.is_empty() {
            return Ok(batch.lines.clone());
        }
        let raw = self
            .jobs()?
            .files()
            .get(&lines_key(&batch.id), &self.limits())
            .await?
            .ok_or_else(|| {
                OpenAiError::internal(format!("batch `{}` lost its line list", batch.id))
            })?;
        serde_json::from_slice(&raw).map_err(|e| OpenAiError::internal(e.to_string()))
    }

    /// Moves a batch as far as its jobs allow; saves it when it changed.
    async fn advance(&self, batch: &mut Batch) -> Result<(), OpenAiError> {
        let before = serde_json::to_vec(&*batch).unwrap_or_default();
        if batch.status == "validating" {
            self.submit(batch).await?;
        }
        if matches!(batch.status.as_str(), "in_progress" | "cancelling") {
            self.progress(batch).await?;
        }
        if serde_json::to_vec(&*batch).unwrap_or_default() != before {
            self.save(batch).await?;
        }
        Ok(())
    }

    /// Validates every line, then queues one job per line (idempotently).
    async fn submit(&self, batch: &mut Batch) -> Result<(), OpenAiError> {
        let _slot = self.file_slot(&batch.tenant)?;
        let data = self.file_data(&batch.tenant, &batch.input_file_id).await?;
        let (specs, errors) = self.validate(batch, &data).await;
        let now = now_secs();
        if !errors.is_empty() {
            batch.errors = errors;
            batch.status = "failed".into();
            batch.failed_at = Some(now);
            return Ok(());
        }
        batch.total = specs.len() as u64;
        let intake = &self.http.intake;
        let mut lines = Vec::with_capacity(specs.len());
        for (n, (custom_id, model, job)) in specs.into_iter().enumerate() {
            match intake.submit_checked(&job).await {
                Ok(q) => lines.push(Line {
                    custom_id,
                    model,
                    job: q.record.id,
                }),
                Err(e) => {
                    // All or nothing: what was queued already is withdrawn.
                    for line in &lines {
                        let _ = self.jobs()?.cancel(&line.job, "batch failed").await;
                    }
                    batch.errors = vec![json!({
                        "code": crate::api::errors::reason(&e),
                        "message": format!("line {}: the queue refused it: {e}", n + 1),
                        "param": null, "line": n + 1,
                    })];
                    batch.status = "failed".into();
                    batch.failed_at = Some(now);
                    return Ok(());
                }
            }
        }
        let list = serde_json::to_vec(&lines).map_err(|e| OpenAiError::internal(e.to_string()))?;
        self.put_owed(batch, &lines_key(&batch.id), list).await?;
        batch.status = "in_progress".into();
        batch.in_progress_at = Some(now);
        Ok(())
    }

    /// Every line parsed, admitted and planned like a `SubmitJob` request.
    async fn validate(
        &self,
        batch: &Batch,
        data: &[u8],
    ) -> (Vec<(String, String, CheckedJob)>, Vec<Value>) {
        let (mut specs, mut errors) = (Vec::new(), Vec::new());
        let mut seen = std::collections::HashSet::new();
        let text = match std::str::from_utf8(data) {
            Ok(t) => t,
            Err(_) => {
                return (
                    specs,
                    vec![line_error(0, None, "the file is not UTF-8".into())],
                )
            }
        };
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if lines.is_empty() {
            errors.push(line_error(0, None, "the file has no requests".into()));
        }
        if lines.len() > self.config.max_batch_lines {
            errors.push(line_error(
                0,
                None,
                format!(
                    "{} requests exceed queue.max_batch_lines ({})",
                    lines.len(),
                    self.config.max_batch_lines
                ),
            ));
            return (specs, errors);
        }
        for (i, raw) in lines.into_iter().enumerate() {
            let n = i + 1;
            if errors.len() >= 100 {
                break;
            }
            match self.line(batch, n, raw, &mut seen).await {
                Ok(spec) => specs.push(spec),
                Err((param, message)) => errors.push(line_error(n, param, message)),
            }
        }
        (specs, errors)
    }

    async fn line(
        &self,
        batch: &Batch,
        n: usize,
        raw: &str,
        seen: &mut std::collections::HashSet<String>,
    ) -> Result<(String, String, CheckedJob), (Option<&'static str>, String)> {
        let line: InputLine =
            serde_json::from_str(raw).map_err(|e| (None, format!("not a JSON object: {e}")))?;
        let custom_id = line
            .custom_id
            .filter(|c| !c.is_empty() && c.len() <= 512)
            .ok_or((
                Some("custom_id"),
                "custom_id: required, 1-512 characters".into(),
            ))?;
        if !seen.insert(custom_id.clone()) {
            return Err((
                Some("custom_id"),
                "custom_id: used by an earlier line".into(),
            ));
        }
        if line.method.as_deref() != Some("POST") {
            return Err((Some("method"), "method: must be POST".into()));
        }
        if line.url.as_deref() != Some(ENDPOINT) {
            return Err((
                Some("url"),
                format!("url: must be {ENDPOINT} (the batch's endpoint)"),
            ));
        }
        let body = line.body.ok_or((Some("body"), "body: required".into()))?;
        let mut request = crate::api::openai::chat_request(body.to_string().as_bytes())
            .map_err(|m| (Some("body"), format!("body: {m}")))?;
        let model = request.route.clone();
        let (route, pin) = self
            .http
            .route_and_pin(&model)
            .map_err(|e| (Some("body.model"), e.to_string()))?;
        request.route = route;
        request.idempotency_key = format!("{}:{n}", batch.id);
        let job = self
            .http
            .intake
            .check_job(Arrival {
                door: Door::Batch,
                request,
                tenant: Some(batch.tenant.clone()),
                request_id: Some(format!("{}-{n}", batch.id).into()),
                deadline: None,
                trace: None,
                buffered: true,
                pin,
            })
            .await
            .map_err(|refusal| match refusal {
                JobRefusal::Request(e) => (Some("body"), e.to_string()),
                JobRefusal::Route(e) => (Some("body.model"), e.to_string()),
            })?;
        Ok((custom_id, model, job))
    }

    /// Counts the jobs from their states; cancels the queued ones of a
    /// cancelled or expired batch; once every job is final, writes the
    /// output and error files (in a file slot: when every slot is busy, a
    /// later read finishes the batch).
    async fn progress(&self, batch: &mut Batch) -> Result<(), OpenAiError> {
        let jobs = self.jobs()?;
        let now = now_secs();
        let expiring = batch.status == "in_progress" && now >= batch.expires_at;
        let why = if expiring {
            "batch expired"
        } else {
            "batch cancelled"
        };
        let lines = self.lines(batch).await?;
        let ids: Vec<String> = lines.iter().map(|l| l.job.clone()).collect();
        let mut states = jobs.states(ids.clone()).await?;
        if (expiring || batch.status == "cancelling") && withdraw(&jobs, &ids, &states, why).await?
        {
            states = jobs.states(ids).await?;
        }
        let (completed, failed) = counts(&states);
        (batch.completed, batch.failed) = (completed, failed);
        if completed + failed < states.len() as u64 {
            return Ok(());
        }
        let Ok(_slot) = self.file_slot(&batch.tenant) else {
            return Ok(());
        };
        if expiring {
            batch.status = "expiring".into();
        }
        batch.finalizing_at.get_or_insert(now);
        self.write_results(batch, &lines).await?;
        match batch.status.as_str() {
            "cancelling" => {
                batch.status = "cancelled".into();
                batch.cancelled_at = Some(now);
            }
            "expiring" => {
                batch.status = "expired".into();
                batch.expired_at = Some(now);
            }
            _ => {
                batch.status = "completed".into();
                batch.completed_at = Some(now);
            }
        }
        Ok(())
    }

    /// The output file (one answer per succeeded line) and the error file
    /// (one error per other line), in input order, as OpenAI writes them.
    async fn write_results(&self, batch: &mut Batch, lines: &[Line]) -> Result<(), OpenAiError> {
        let jobs = self.jobs()?;
        let (mut out, mut err) = (String::new(), String::new());
        for line in lines {
            let stored = jobs.get(&line.job).await?;
            let record = &stored;
            let id = format!("batch_req_{}", line.job);
            let answer = record.as_ref().and_then(|r| {
                let bytes = r.result.as_deref()?;
                let response = <proto::CompletionResponse as prost::Message>::decode(bytes).ok()?;
                Some((r, response))
            });
            let entry = match (record, answer) {
                (_, Some((r, response))) => {
                    let body = crate::api::openai::completion_json(
                        &format!("chatcmpl-{}", r.id),
                        r.updated_ms / 1000,
                        &line.model,
                        response,
                    );
                    out.push_str(
                        &json!({
                            "id": id, "custom_id": line.custom_id,
                            "response": {"status_code": 200, "request_id": r.id, "body": body},
                            "error": null,
                        })
                        .to_string(),
                    );
                    out.push('\n');
                    continue;
                }
                (Some(r), None) => {
                    let code = match (r.state, r.error_reason.as_deref()) {
                        (JobState::Expired, _) => "batch_expired".to_string(),
                        (_, Some("CANCELLED")) if batch.status == "expiring" => {
                            "batch_expired".into()
                        }
                        (_, Some("CANCELLED")) => "batch_cancelled".into(),
                        (_, reason) => reason.unwrap_or("FAILED").to_string(),
                    };
                    json!({"code": code, "message": r.error.clone().unwrap_or_default()})
                }
                (None, None) => json!({"code": "job_lost", "message": "the job's record expired"}),
            };
            err.push_str(
                &json!({"id": id, "custom_id": line.custom_id, "response": null, "error": entry})
                    .to_string(),
            );
            err.push('\n');
        }
        for (data, slot, suffix) in [
            (out, &mut batch.output_file_id, "output"),
            (err, &mut batch.error_file_id, "errors"),
        ] {
            if data.is_empty() {
                continue;
            }
            // Named after the batch: a second finaliser writes the same file.
            let meta = FileMeta {
                id: format!("file-{}-{suffix}", batch.id),
                tenant: batch.tenant.clone(),
                filename: format!("{}_{suffix}.jsonl", batch.id),
                purpose: "batch_output".into(),
                bytes: data.len() as u64,
                created_at: now_secs(),
            };
            self.put_file(&meta, data.into_bytes()).await?;
            *slot = Some(meta.id);
        }
        Ok(())
    }
}

/// Cancels the jobs still queued; whether any was.
async fn withdraw(
    jobs: &crate::state::jobs::Jobs,
    ids: &[String],
    states: &[Option<JobState>],
    why: &str,
) -> Result<bool, OpenAiError> {
    let mut withdrew = false;
    for (id, state) in ids.iter().zip(states) {
        if *state == Some(JobState::Queued) {
            withdrew |= jobs.cancel(id, why).await?;
        }
    }
    Ok(withdrew)
}

/// Lines succeeded, and lines final otherwise (a job whose record is gone
/// counts as failed).
fn counts(states: &[Option<JobState>]) -> (u64, u64) {
    let completed = states
        .iter()
        .filter(|s| **s == Some(JobState::Succeeded))
        .count();
    let failed = states
        .iter()
        .filter(|s| s.is_none_or(|s| s.is_final() && s != JobState::Succeeded))
        .count();
    (completed as u64, failed as u64)
}

fn window(text: Option<&str>, limit: Duration) -> Result<(String, Duration), OpenAiError> {
    let text = text.unwrap_or("24h");
    let d = humantime_serde::re::humantime::parse_duration(text).map_err(|e| {
        invalid(
            format!("completion_window: `{text}` is not a duration: {e}"),
            Some("completion_window"),
        )
    })?;
    if d.is_zero() || d > limit {
        return Err(invalid(
            format!(
                "completion_window: must be more than 0 and at most queue.job_ttl ({})",
                humantime_serde::re::humantime::format_duration(limit)
            ),
            Some("completion_window"),
        ));
    }
    Ok((text.to_string(), d))
}

fn metadata(m: Option<Value>) -> Result<Option<Value>, OpenAiError> {
    match &m {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(o))
            if o.len() <= MAX_METADATA_KEYS
                && o.values().all(|v| v.as_str().is_some_and(|s| s.len() <= MAX_METADATA_VALUE)) =>
        {
            Ok(m)
        }
        Some(_) => Err(invalid(
            format!("metadata: at most {MAX_METADATA_KEYS} string values of at most {MAX_METADATA_VALUE} characters"),
            Some("metadata"),
        )),
    }
}

/// `POST /v1/batches`.
pub(super) async fn create(State(api): State<Arc<BatchApi>>, request: Request) -> Response {
    api.answer(request, |api, tenant, request| async move {
        let (parts, body) = request.into_parts();
        let bytes = api
            .http
            .read_body(body, &parts.headers)
            .await
            .map_err(|e| OpenAiError::from_request(&e))?;
        let body: CreateBody = serde_json::from_slice(&bytes)
            .map_err(|e| invalid(format!("invalid JSON body: {e}"), None))?;
        if body.endpoint.as_deref() != Some(ENDPOINT) {
            return Err(invalid(
                format!("endpoint: only {ENDPOINT} is supported"),
                Some("endpoint"),
            ));
        }
        let (completion_window, span) =
            window(body.completion_window.as_deref(), api.config.job_ttl)?;
        let metadata = metadata(body.metadata)?;
        let input = body
            .input_file_id
            .ok_or_else(|| invalid("input_file_id: required", Some("input_file_id")))?;
        let file = api.file(&tenant, &input).await?;
        if file.purpose != "batch" {
            return Err(invalid(
                format!("input_file_id: `{input}` is not a batch input file"),
                Some("input_file_id"),
            ));
        }
        let now = now_secs();
        let mut batch = Batch {
            id: format!("batch_{}", api.new_id()),
            tenant,
            input_file_id: input,
            completion_window,
            status: "validating".into(),
            created_at: now,
            expires_at: now + span.as_secs(),
            in_progress_at: None,
            finalizing_at: None,
            completed_at: None,
            failed_at: None,
            expired_at: None,
            cancelling_at: None,
            cancelled_at: None,
            metadata,
            errors: Vec::new(),
            output_file_id: None,
            error_file_id: None,
            total: 0,
            completed: 0,
            failed: 0,
            lines: Vec::new(),
        };
        let usage = api.jobs()?.files().usage(&batch.tenant).await?;
        quota::admit_batch(&api.limits(), &batch.tenant, usage).map_err(|r| over_quota(&r))?;
        // Stored before any job: a crash from here on resumes on the next read.
        api.save(&batch).await?;
        api.advance(&mut batch).await?;
        Ok(axum::Json(batch.json()).into_response())
    })
    .await
}

/// `GET /v1/batches/{id}`.
pub(super) async fn retrieve(
    State(api): State<Arc<BatchApi>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, _| async move {
        let mut batch = api.load(&tenant, &id).await?;
        api.advance(&mut batch).await?;
        Ok(axum::Json(batch.json()).into_response())
    })
    .await
}

/// `POST /v1/batches/{id}/cancel`: queued lines are withdrawn, running ones
/// finish; the batch is `cancelled` once every job is final.
pub(super) async fn cancel(
    State(api): State<Arc<BatchApi>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, _| async move {
        let mut batch = api.load(&tenant, &id).await?;
        api.advance(&mut batch).await?;
        match batch.status.as_str() {
            "in_progress" => {
                batch.status = "cancelling".into();
                batch.cancelling_at = Some(now_secs());
                api.save(&batch).await?;
                api.advance(&mut batch).await?;
            }
            "cancelling" | "cancelled" => {}
            other => {
                return Err(OpenAiError::of(
                    Kind::BatchFinal,
                    format!("batch `{id}` is {other}: it cannot be cancelled"),
                ))
            }
        }
        Ok(axum::Json(batch.json()).into_response())
    })
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_bounded_by_the_job_ttl() {
        let day = Duration::from_secs(86_400);
        assert_eq!(window(None, day).unwrap().1, day);
        assert_eq!(
            window(Some("1h"), day).unwrap().1,
            Duration::from_secs(3600)
        );
        assert_eq!(
            window(Some("48h"), day).unwrap_err().param.as_deref(),
            Some("completion_window")
        );
        assert_eq!(
            window(Some("0s"), day).unwrap_err().param.as_deref(),
            Some("completion_window")
        );
        assert_eq!(
            window(Some("soon"), day).unwrap_err().param.as_deref(),
            Some("completion_window")
        );
    }

    #[test]
    fn metadata_is_bounded_like_openais() {
        assert!(metadata(None).unwrap().is_none());
        assert!(metadata(Some(json!({"a": "b"}))).unwrap().is_some());
        let many: serde_json::Map<String, Value> =
            (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
        assert!(metadata(Some(Value::Object(many))).is_err());
        assert!(metadata(Some(json!({"a": "x".repeat(513)}))).is_err());
        assert!(metadata(Some(json!({"a": 1}))).is_err());
    }
}
