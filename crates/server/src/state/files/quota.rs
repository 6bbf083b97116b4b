//! What a tenant may keep in the store (Batch files, batch records and
//! outputs), as pure policy: the per-tenant file count and bytes, and the
//! budget of every tenant's stored bytes together. Both backends (SQLite and
//! the fleet's Redis, whose Lua mirrors `admit`) ask it before they store an
//! upload; what the service owes a tenant (a batch's output, its record) is
//! counted but never refused.

use std::time::Duration;

use crate::config::QueueConfig;

/// The bounds on stored blobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    /// `queue.max_files_per_tenant`: uploads a tenant keeps at once.
    pub max_files_per_tenant: u64,
    /// `queue.max_file_bytes_per_tenant`: bytes of everything a tenant keeps.
    pub max_bytes_per_tenant: u64,
    /// `queue.max_stored_bytes`: bytes of everything every tenant keeps.
    pub max_stored_bytes: u64,
    /// `queue.blob_timeout`: the longest wait for one chunk of a big blob
    /// (Redis), outside the request path's call timeout and breaker.
    pub chunk_timeout: Duration,
}

impl From<&QueueConfig> for FileLimits {
    fn from(q: &QueueConfig) -> Self {
        FileLimits {
            max_files_per_tenant: q.max_files_per_tenant as u64,
            max_bytes_per_tenant: q.max_file_bytes_per_tenant as u64,
            max_stored_bytes: q.max_stored_bytes as u64,
            chunk_timeout: q.blob_timeout,
        }
    }
}

/// How a blob counts against its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobKind {
    /// A tenant's upload: one file and its bytes; refused past a quota.
    Upload,
    /// Stored for the tenant by the service (a batch record, its line list,
    /// its output): its bytes count, it is never refused (a finished batch
    /// always gets its output).
    Owed,
}

impl BlobKind {
    /// Files it adds to its tenant's count.
    pub fn files(self) -> u64 {
        match self {
            BlobKind::Upload => 1,
            BlobKind::Owed => 0,
        }
    }
}

/// What is stored now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// The tenant's uploads.
    pub files: u64,
    /// The tenant's bytes.
    pub bytes: u64,
    /// Every tenant's bytes.
    pub total_bytes: u64,
}

/// Which bound an upload would cross.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("tenant `{tenant}` keeps {files} files, its quota (queue.max_files_per_tenant = {limit}); files are kept for queue.file_ttl")]
    Files {
        tenant: String,
        files: u64,
        limit: u64,
    },
    #[error("tenant `{tenant}` keeps {bytes} bytes of files and batches; {adding} more would pass its quota (queue.max_file_bytes_per_tenant = {limit}); files are kept for queue.file_ttl")]
    Bytes {
        tenant: String,
        bytes: u64,
        adding: u64,
        limit: u64,
    },
    #[error("the file store is full: {adding} more bytes would pass its budget for every tenant (queue.max_stored_bytes = {limit}); retry once older files expire")]
    Budget { adding: u64, limit: u64 },
}

impl Refusal {
    /// The `code` a caller sees.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::Files { .. } | Refusal::Bytes { .. } => "FILE_QUOTA",
            Refusal::Budget { .. } => "FILE_STORE_FULL",
        }
    }
}

/// Whether `tenant` may add `bytes` more of `kind` on top of `usage`.
pub fn admit(
    limits: &FileLimits,
    tenant: &str,
    usage: Usage,
    bytes: u64,
    kind: BlobKind,
) -> Result<(), Refusal> {
    if kind == BlobKind::Owed {
        return Ok(());
    }
    if usage.files + kind.files() > limits.max_files_per_tenant {
        return Err(Refusal::Files {
            tenant: tenant.to_string(),
            files: usage.files,
            limit: limits.max_files_per_tenant,
        });
    }
    if usage.bytes.saturating_add(bytes) > limits.max_bytes_per_tenant {
        return Err(Refusal::Bytes {
            tenant: tenant.to_string(),
            bytes: usage.bytes,
            adding: bytes,
            limit: limits.max_bytes_per_tenant,
        });
    }
    if usage.total_bytes.saturating_add(bytes) > limits.max_stored_bytes {
        return Err(Refusal::Budget {
            adding: bytes,
            limit: limits.max_stored_bytes,
        });
    }
    Ok(())
}

/// Whether `tenant` may start a batch (whose record and output it will
/// owe): only while it is below its byte quota and the store below its
/// budget.
pub fn admit_batch(limits: &FileLimits, tenant: &str, usage: Usage) -> Result<(), Refusal> {
    if usage.bytes >= limits.max_bytes_per_tenant {
        return Err(Refusal::Bytes {
            tenant: tenant.to_string(),
            bytes: usage.bytes,
            adding: 0,
            limit: limits.max_bytes_per_tenant,
        });
    }
    if usage.total_bytes >= limits.max_stored_bytes {
        return Err(Refusal::Budget {
            adding: 0,
            limit: limits.max_stored_bytes,
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn limits() -> FileLimits {
        FileLimits {
            max_files_per_tenant: 2,
            max_bytes_per_tenant: 100,
            max_stored_bytes: 150,
            chunk_timeout: Duration::from_secs(1),
        }
    }

    fn usage(files: u64, bytes: u64, total_bytes: u64) -> Usage {
        Usage {
            files,
            bytes,
            total_bytes,
        }
    }

    #[test]
    fn an_upload_fits_up_to_each_bound_and_not_one_byte_more() {
        let l = limits();
        let up = BlobKind::Upload;
        assert_eq!(admit(&l, "a", usage(1, 60, 60), 40, up), Ok(()));
        assert!(matches!(
            admit(&l, "a", usage(1, 60, 60), 41, up),
            Err(Refusal::Bytes { limit: 100, .. })
        ));
        assert!(matches!(
            admit(&l, "a", usage(2, 0, 0), 1, up),
            Err(Refusal::Files {
                files: 2,
                limit: 2,
                ..
            })
        ));
        assert_eq!(admit(&l, "a", usage(0, 0, 100), 50, up), Ok(()));
        assert!(matches!(
            admit(&l, "a", usage(0, 0, 100), 51, up),
            Err(Refusal::Budget { limit: 150, .. })
        ));
    }

    #[test]
    fn what_the_service_owes_is_never_refused_but_stops_new_batches() {
        let l = limits();
        assert_eq!(
            admit(&l, "a", usage(9, 999, 999), 50, BlobKind::Owed),
            Ok(())
        );
        assert_eq!(
            admit_batch(&l, "a", usage(2, 99, 99)),
            Ok(()),
            "the file count does not stop a batch"
        );
        assert!(matches!(
            admit_batch(&l, "a", usage(0, 100, 100)),
            Err(Refusal::Bytes { .. })
        ));
        assert!(matches!(
            admit_batch(&l, "a", usage(0, 0, 150)),
            Err(Refusal::Budget { .. })
        ));
    }

    #[test]
    fn the_refusal_names_the_quota() {
        let r = admit(&limits(), "team-a", usage(2, 0, 0), 1, BlobKind::Upload).unwrap_err();
        assert!(
            r.to_string().contains("queue.max_files_per_tenant = 2"),
            "{r}"
        );
        assert_eq!(r.code(), "FILE_QUOTA");
    }
}
