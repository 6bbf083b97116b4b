//! Files of the Batch API: `POST /v1/files` (multipart, purpose `batch`),
//! `GET /v1/files/{id}` and `GET /v1/files/{id}/content`, in OpenAI's
//! shapes. A file is two blobs where the jobs live (SQLite or the fleet's
//! Redis): its metadata and its bytes, kept for `queue.file_ttl`, visible
//! only to the tenant that owns it. An upload counts against its tenant's
//! file quotas (a batch's output only against its bytes, never refused);
//! a refused or failed upload leaves nothing stored.

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{invalid, not_found, now_secs, BatchApi};
use crate::api::openai::error::OpenAiError;
use crate::state::files::quota::BlobKind;
use crate::state::files::BlobPut;

/// A stored file's metadata.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct FileMeta {
    pub(super) id: String,
    pub(super) tenant: String,
    pub(super) filename: String,
    pub(super) purpose: String,
    pub(super) bytes: u64,
    pub(super) created_at: u64,
}

impl FileMeta {
    pub(super) fn json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": null,
            "expires_at": null,
        })
    }
}

fn meta_key(id: &str) -> String {
    format!("file:{id}:meta")
}

fn data_key(id: &str) -> String {
    format!("file:{id}:data")
}

impl BatchApi {
    /// Stores a file for its tenant (an upload, or a batch's output): the
    /// metadata first, then the bytes (the upload checked against the
    /// quotas); when the bytes are refused or fail, the metadata goes too.
    pub(super) async fn put_file(&self, meta: &FileMeta, data: Vec<u8>) -> Result<(), OpenAiError> {
        let jobs = self.jobs()?;
        let files = jobs.files();
        let limits = self.limits();
        let blob = |name, kind| BlobPut {
            name,
            tenant: &meta.tenant,
            kind,
            ttl: self.config.file_ttl,
        };
        let kind = if meta.purpose == "batch" {
            BlobKind::Upload
        } else {
            BlobKind::Owed
        };
        let meta_bytes =
            serde_json::to_vec(meta).map_err(|e| OpenAiError::internal(e.to_string()))?;
        let (meta_name, data_name) = (meta_key(&meta.id), data_key(&meta.id));
        files
            .put(blob(&meta_name, BlobKind::Owed), meta_bytes, &limits)
            .await?;
        if let Err(e) = files.put(blob(&data_name, kind), data, &limits).await {
            if files.delete(&meta_name).await.is_err() {
                files.delete_soon(meta_name);
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// The tenant's file, or 404 (another tenant's file does not exist for it).
    pub(super) async fn file(&self, tenant: &str, id: &str) -> Result<FileMeta, OpenAiError> {
        let raw = self
            .jobs()?
            .files()
            .get(&meta_key(id), &self.limits())
            .await?;
        let meta: Option<FileMeta> = raw.and_then(|b| serde_json::from_slice(&b).ok());
        meta.filter(|m| m.tenant == tenant)
            .ok_or_else(|| not_found(format!("no file `{id}`"), "file_id"))
    }

    pub(super) async fn file_data(&self, tenant: &str, id: &str) -> Result<Vec<u8>, OpenAiError> {
        self.file(tenant, id).await?;
        self.jobs()?
            .files()
            .get(&data_key(id), &self.limits())
            .await?
            .ok_or_else(|| not_found(format!("no file `{id}`"), "file_id"))
    }
}

/// `POST /v1/files`: `purpose=batch` and `file` (JSONL), multipart.
pub(super) async fn upload(
    State(api): State<std::sync::Arc<BatchApi>>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, request| async move {
        let (parts, body) = request.into_parts();
        let boundary = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|ct| multer::parse_boundary(ct).ok())
            .ok_or_else(|| {
                invalid(
                    "expected multipart/form-data with `purpose` and `file`",
                    None,
                )
            })?;
        // What can be checked before the body is: its declared size. Only
        // then a slot; the listener's body pace bounds how long it is held.
        let limit = api.config.max_file_bytes;
        crate::api::door::check_declared_length(&parts.headers, limit)
            .map_err(|e| OpenAiError::from_request(&e))?;
        let _slot = api.file_slot(&tenant)?;
        let bytes = crate::api::door::read_body_up_to(body, &parts.headers, limit)
            .await
            .map_err(|e| OpenAiError::from_request(&e))?;
        let mut form = multer::Multipart::new(
            futures_util::stream::once(async move { Ok::<_, std::convert::Infallible>(bytes) }),
            boundary,
        );
        let (mut purpose, mut file) = (None, None);
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| invalid(format!("malformed multipart body: {e}"), None))?
        {
            match field.name() {
                Some("purpose") => {
                    purpose = Some(
                        field
                            .text()
                            .await
                            .map_err(|e| invalid(format!("purpose: {e}"), Some("purpose")))?,
                    )
                }
                Some("file") => {
                    let name = field.file_name().unwrap_or("upload.jsonl").to_string();
                    let data = field
                        .bytes()
                        .await
                        .map_err(|e| invalid(format!("file: {e}"), Some("file")))?;
                    file = Some((name, data));
                }
                _ => {}
            }
        }
        match purpose.as_deref() {
            Some("batch") => {}
            Some(other) => {
                return Err(invalid(
                    format!("purpose: `{other}` is not supported (only `batch`)"),
                    Some("purpose"),
                ))
            }
            None => return Err(invalid("purpose: required", Some("purpose"))),
        }
        let (filename, data) = file.ok_or_else(|| invalid("file: required", Some("file")))?;
        let mut filename = filename;
        crate::api::errors::truncate(&mut filename, 256);
        let meta = FileMeta {
            id: format!("file-{}", api.new_id()),
            tenant,
            filename,
            purpose: "batch".into(),
            bytes: data.len() as u64,
            created_at: now_secs(),
        };
        api.put_file(&meta, data.to_vec()).await?;
        Ok(axum::Json(meta.json()).into_response())
    })
    .await
}

/// `GET /v1/files/{id}`.
pub(super) async fn retrieve(
    State(api): State<std::sync::Arc<BatchApi>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, _| async move {
        Ok(axum::Json(api.file(&tenant, &id).await?.json()).into_response())
    })
    .await
}

/// `GET /v1/files/{id}/content`.
pub(super) async fn content(
    State(api): State<std::sync::Arc<BatchApi>>,
    Path(id): Path<String>,
    request: Request,
) -> Response {
    api.answer(request, |api, tenant, _| async move {
        let _slot = api.file_slot(&tenant)?;
        let data = api.file_data(&tenant, &id).await?;
        let mut r = Response::new(Body::from(data));
        crate::api::door::insert(r.headers_mut(), "content-type", "application/octet-stream");
        Ok(r)
    })
    .await
}
