//! The table's tests: every row says the same on every surface, every
//! request and Admin API error finds its row, and the error table in the
//! docs lists exactly the table's reasons.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::Code;
use tonic_types::StatusExt;

use super::*;
use crate::api::anthropic::error::AnthropicError;
use crate::api::openai::error::OpenAiError;
use crate::error::RequestError;
use crate::policy::outcome::{Failure, OutcomeClass};

/// What each row must say: reason, gRPC code, HTTP status, OpenAI type,
/// Anthropic type, Anthropic status.
#[rustfmt::skip]
const EXPECTED: [(Kind, &str, Code, u16, &str, &str, u16); 60] = {
    use Code as C;
    use Kind as K;
    const INV: &str = "invalid_request_error";
    const RATE: &str = "rate_limit_error";
    const SRV: &str = "server_error";
    const OVER: &str = "overloaded_error";
    const TIME: &str = "timeout_error";
    const NF: &str = "not_found_error";
    [
        (K::InvalidRequest, "INVALID_REQUEST", C::InvalidArgument, 400, INV, INV, 400),
        (K::Unauthenticated, "UNAUTHENTICATED", C::Unauthenticated, 401, "authentication_error", "authentication_error", 401),
        (K::RequestTooLarge, "REQUEST_TOO_LARGE", C::ResourceExhausted, 413, INV, "request_too_large", 413),
        (K::MetadataTooLarge, "METADATA_TOO_LARGE", C::ResourceExhausted, 431, INV, "request_too_large", 431),
        (K::RequestBodyTimeout, "REQUEST_BODY_TIMEOUT", C::DeadlineExceeded, 408, TIME, TIME, 408),
        (K::UnknownRoute, "UNKNOWN_ROUTE", C::NotFound, 404, INV, NF, 404),
        (K::NoCapableTarget, "NO_CAPABLE_TARGET", C::FailedPrecondition, 400, INV, INV, 400),
        (K::DeadlineExceeded, "DEADLINE_EXCEEDED", C::DeadlineExceeded, 504, TIME, TIME, 504),
        (K::SlowConsumer, "SLOW_CONSUMER", C::DeadlineExceeded, 504, TIME, TIME, 504),
        (K::DeadlineBelowP95Ttft, "DEADLINE_BELOW_P95_TTFT", C::DeadlineExceeded, 504, TIME, TIME, 504),
        (K::ConcurrencyLimit, "CONCURRENCY_LIMIT", C::ResourceExhausted, 429, RATE, RATE, 429),
        (K::TenantLimit, "TENANT_LIMIT", C::ResourceExhausted, 429, RATE, RATE, 429),
        (K::CostCap, "COST_CAP", C::ResourceExhausted, 429, RATE, RATE, 429),
        (K::RateLimited, "RATE_LIMITED", C::ResourceExhausted, 429, RATE, RATE, 429),
        (K::NoHealthyTarget, "NO_HEALTHY_TARGET", C::Unavailable, 503, SRV, OVER, 529),
        (K::RetryBudgetExhausted, "RETRY_BUDGET_EXHAUSTED", C::Unavailable, 503, SRV, OVER, 529),
        (K::ServerDraining, "SERVER_DRAINING", C::Unavailable, 503, SRV, OVER, 529),
        (K::RouterUnavailable, "ROUTER_UNAVAILABLE", C::Unavailable, 503, SRV, OVER, 529),
        (K::StateUnavailable, "STATE_UNAVAILABLE", C::Unavailable, 503, SRV, OVER, 529),
        (K::UpstreamInvalidRequest, "UPSTREAM_INVALID_REQUEST", C::InvalidArgument, 400, INV, INV, 400),
        (K::UpstreamRequestTooLarge, "UPSTREAM_REQUEST_TOO_LARGE", C::ResourceExhausted, 429, RATE, RATE, 429),
        (K::UpstreamRateLimited, "UPSTREAM_RATE_LIMITED", C::ResourceExhausted, 429, RATE, RATE, 429),
        (K::ProviderQuotaExhausted, "PROVIDER_QUOTA_EXHAUSTED", C::Unavailable, 503, SRV, OVER, 529),
        (K::ProviderAuthFailed, "PROVIDER_AUTH_FAILED", C::Unavailable, 503, SRV, OVER, 529),
        (K::UpstreamModelNotFound, "UPSTREAM_MODEL_NOT_FOUND", C::NotFound, 404, INV, NF, 404),
        (K::UpstreamProtocolError, "UPSTREAM_PROTOCOL_ERROR", C::Unavailable, 503, SRV, OVER, 529),
        (K::UpstreamOverloaded, "UPSTREAM_OVERLOADED", C::Unavailable, 503, SRV, OVER, 529),
        (K::UpstreamTimeout, "UPSTREAM_TIMEOUT", C::Unavailable, 503, SRV, OVER, 529),
        (K::UpstreamUnreachable, "UPSTREAM_UNREACHABLE", C::Unavailable, 503, SRV, OVER, 529),
        (K::UpstreamServerError, "UPSTREAM_SERVER_ERROR", C::Unavailable, 503, SRV, OVER, 529),
        (K::UpstreamUnavailable, "UPSTREAM_UNAVAILABLE", C::Unavailable, 503, SRV, OVER, 529),
        (K::UpstreamStreamTruncated, "UPSTREAM_STREAM_TRUNCATED", C::Unavailable, 503, SRV, OVER, 529),
        (K::MidStreamProtocolError, "UPSTREAM_PROTOCOL_ERROR", C::Internal, 500, SRV, "api_error", 500),
        (K::QueueFull, "QUEUE_FULL", C::ResourceExhausted, 429, RATE, RATE, 429),
        (K::QueueUnavailable, "QUEUE_UNAVAILABLE", C::FailedPrecondition, 400, INV, INV, 400),
        (K::JobNotFound, "JOB_NOT_FOUND", C::NotFound, 404, INV, NF, 404),
        (K::JobCorrupt, "JOB_CORRUPT", C::DataLoss, 500, SRV, "api_error", 500),
        (K::IdempotencyKeyInUse, "IDEMPOTENCY_KEY_IN_USE", C::Aborted, 409, "conflict_error", INV, 409),
        (K::IdempotencyKeyReused, "IDEMPOTENCY_KEY_REUSED", C::FailedPrecondition, 400, INV, INV, 400),
        (K::ResponseNotFound, "RESPONSE_NOT_FOUND", C::NotFound, 404, INV, NF, 404),
        (K::PreviousResponseNotFound, "PREVIOUS_RESPONSE_NOT_FOUND", C::InvalidArgument, 400, INV, INV, 400),
        (K::ResponsesStoreFull, "RESPONSES_STORE_FULL", C::FailedPrecondition, 400, INV, INV, 400),
        (K::ResumeNotFound, "RESUME_NOT_FOUND", C::NotFound, 404, INV, NF, 404),
        (K::ResumeExpired, "RESUME_EXPIRED", C::NotFound, 404, INV, NF, 404),
        (K::StreamNotResumable, "STREAM_NOT_RESUMABLE", C::FailedPrecondition, 409, INV, INV, 409),
        (K::ResumeOwnerGone, "RESUME_OWNER_GONE", C::Unavailable, 503, SRV, OVER, 529),
        (K::StreamCancelled, "STREAM_CANCELLED", C::Cancelled, 410, INV, INV, 410),
        (K::AdminDisabled, "ADMIN_DISABLED", C::PermissionDenied, 403, "permission_error", "permission_error", 403),
        (K::AdminInvalidArgument, "INVALID_ARGUMENT", C::InvalidArgument, 400, INV, INV, 400),
        (K::UnknownProvider, "UNKNOWN_PROVIDER", C::NotFound, 404, INV, NF, 404),
        (K::UnknownModel, "UNKNOWN_MODEL", C::NotFound, 404, INV, NF, 404),
        (K::ProviderUnavailable, "PROVIDER_UNAVAILABLE", C::Unavailable, 503, SRV, OVER, 529),
        (K::ValidationStoreUnavailable, "VALIDATION_STORE_UNAVAILABLE", C::Unavailable, 503, SRV, OVER, 529),
        (K::Internal, "INTERNAL", C::Internal, 500, SRV, "api_error", 500),
        (K::UnknownEndpoint, "UNKNOWN_ENDPOINT", C::Unimplemented, 404, INV, NF, 404),
        (K::FilesBusy, "FILES_BUSY", C::ResourceExhausted, 429, RATE, RATE, 429),
        (K::NotFound, "NOT_FOUND", C::NotFound, 404, INV, NF, 404),
        (K::BatchFinal, "BATCH_FINAL", C::FailedPrecondition, 409, INV, INV, 409),
        (K::FileQuota, "FILE_QUOTA", C::ResourceExhausted, 429, "insufficient_quota", RATE, 429),
        (K::FileStoreFull, "FILE_STORE_FULL", C::ResourceExhausted, 429, "insufficient_quota", RATE, 429),
    ]
};

#[test]
fn every_row_says_the_same_on_every_surface() {
    assert_eq!(
        EXPECTED.map(|row| row.0),
        Kind::ALL,
        "one expectation per row, in order"
    );
    for (kind, reason, code, http, openai, anthropic, anthropic_status) in EXPECTED {
        let e = kind.entry();
        assert_eq!(
            (
                e.reason,
                e.grpc,
                e.http.as_u16(),
                e.openai_type,
                e.anthropic_type
            ),
            (reason, code, http, openai, anthropic),
            "{kind:?}"
        );
        let caught = CallerError::new(kind, "m");
        let status = caught.to_status();
        let info = status.get_details_error_info().unwrap();
        assert_eq!(
            (status.code(), info.reason.as_str(), info.domain.as_str()),
            (code, reason, DOMAIN),
            "{kind:?}"
        );
        let o = OpenAiError::new(caught.clone(), None);
        let body = o.body();
        assert_eq!(o.status.as_u16(), http, "{kind:?}");
        assert_eq!(body["error"]["type"], openai, "{kind:?}");
        assert_eq!(body["error"]["code"], e.openai_code(), "{kind:?}");
        let a = AnthropicError::new(caught);
        let body = a.body("r");
        assert_eq!(a.status.as_u16(), anthropic_status, "{kind:?}");
        assert_eq!(body["error"]["type"], anthropic, "{kind:?}");
        assert_eq!(body["error"]["details"]["error_code"], reason, "{kind:?}");
    }
}

/// One of every request error (each upstream class before and after
/// output), each with the metadata and retry times it can carry.
fn samples() -> Vec<RequestError> {
    let mut v = vec![
        RequestError::InvalidRequest("messages: must not be empty".into()),
        RequestError::UnknownRoute("gpt-x".into()),
        RequestError::Unauthenticated("missing bearer token".into()),
        RequestError::RequestTooLarge { limit: 10 },
        RequestError::MetadataTooLarge {
            size: 20,
            limit: 10,
        },
        RequestError::BodyTooSlow { received: 5 },
        RequestError::NoCapableTarget {
            route: "r".into(),
            missing: vec!["tools".into(), "vision".into()],
        },
        RequestError::DeadlineExceeded { attempts: 0 },
        RequestError::DeadlineExceeded { attempts: 2 },
        RequestError::SlowConsumer {
            waited: Duration::from_millis(1500),
        },
        RequestError::Saturated { route: "r".into() },
        RequestError::Draining,
        RequestError::TenantLimit {
            tenant: "t".into(),
            limit: "rate",
            retry_after: Some(Duration::from_secs(2)),
        },
        RequestError::TenantLimit {
            tenant: "t".into(),
            limit: "concurrency",
            retry_after: None,
        },
        RequestError::NoHealthyTarget {
            route: "r".into(),
            retry_in: None,
        },
        RequestError::RetryBudgetExhausted {
            route: "r".into(),
            last: None,
            attempts: 3,
        },
        RequestError::DeadlineTooShort {
            p95_ttft: Duration::from_millis(800),
        },
        RequestError::CostCap {
            tenant: "t".into(),
            spent_usd: 1.5,
            cap_usd: 1.0,
            retry_in: Duration::from_secs(60),
        },
        RequestError::QueueFull("queue is full".into()),
        RequestError::QueueUnavailable("no queue".into()),
        RequestError::JobNotFound("j1".into()),
        RequestError::JobCorrupt("bad".into()),
        RequestError::IdempotencyKeyInUse,
        RequestError::IdempotencyKeyReused,
        RequestError::StateUnavailable("redis down".into()),
        RequestError::Unavailable("actor".into()),
        RequestError::ResponseNotFound("resp_1".into()),
        RequestError::PreviousResponseNotFound("resp_0".into()),
        RequestError::ResponsesFull {
            tenant: "t".into(),
            limit: "responses.max_per_tenant",
            held: 5,
            max: 5,
        },
        RequestError::ResumeNotFound,
        RequestError::ResumeExpired,
        RequestError::NotResumable("resume.max_bytes_per_stream"),
        RequestError::ResumeOwnerGone,
        RequestError::CallerGone,
        RequestError::Journaled {
            reason: "UPSTREAM_STREAM_TRUNCATED".into(),
            message: "stream from p failed".into(),
            retry_after: Some(Duration::from_secs(2)),
        },
        RequestError::Journaled {
            reason: "NO_SUCH_REASON".into(),
            message: "m".into(),
            retry_after: None,
        },
    ];
    for class in OutcomeClass::ALL {
        for retry_after in [None, Some(Duration::from_secs(3))] {
            let mut failure = Failure::new(class, "boom");
            failure.upstream_request_id = Some("req_1".into());
            failure.retry_after = retry_after;
            v.push(RequestError::Exhausted {
                failure: Box::new(failure.clone()),
                provider: "p".into(),
                attempts: 2,
            });
            v.push(RequestError::MidStream {
                failure: Box::new(failure.clone()),
                provider: "p".into(),
                tokens_emitted: 4,
                attempts: 1,
            });
            v.push(RequestError::RetryBudgetExhausted {
                route: "r".into(),
                last: Some((Box::new(failure), "p".into())),
                attempts: 2,
            });
        }
    }
    v
}

#[test]
fn every_request_error_finds_its_row_with_its_metadata_and_retry() {
    for err in samples() {
        let caught = CallerError::from(&err);
        let entry = caught.entry();
        assert!(Kind::ALL.contains(&caught.kind), "{err:?}");
        for (key, _) in &caught.meta {
            assert!(entry.meta.contains(key), "{err:?}: `{key}` not in its row");
        }
        match entry.retry {
            Retry::Never => assert_eq!(err.retry_after(), None, "{err:?}"),
            Retry::Always => assert!(err.retry_after().is_some(), "{err:?}"),
            Retry::IfKnown => {}
        }
        assert_eq!(caught.retry_after, err.retry_after(), "{err:?}");
        let status = to_status(&err);
        let d = status.get_error_details();
        assert_eq!(status.code(), entry.grpc, "{err:?}");
        assert_eq!(d.error_info().unwrap().reason, entry.reason, "{err:?}");
        assert_eq!(
            d.retry_info().and_then(|r| r.retry_delay),
            err.retry_after(),
            "{err:?}"
        );
        assert_eq!(status.message(), err.to_string(), "{err:?}");
        let o = OpenAiError::from_request(&err);
        assert_eq!(
            (o.status, o.kind),
            (entry.http, entry.openai_type),
            "{err:?}"
        );
        let a = AnthropicError::from_request(&err);
        assert_eq!(
            (a.status, a.kind, a.code),
            (entry.anthropic_status(), entry.anthropic_type, entry.reason),
            "{err:?}"
        );
    }
}

#[test]
fn a_row_that_sends_no_retry_info_drops_a_retry_time() {
    let caught =
        CallerError::new(Kind::QueueFull, "full").retry_after(Some(Duration::from_secs(1)));
    assert_eq!(caught.retry_after, None);
    assert!(caught.to_status().get_details_retry_info().is_none());
    let caught =
        CallerError::new(Kind::ServerDraining, "bye").retry_after(Some(Duration::from_secs(1)));
    assert!(caught.to_status().get_details_retry_info().is_some());
}

#[test]
fn messages_and_metadata_are_cut_to_their_bounds() {
    let caught = CallerError::from(&RequestError::UnknownRoute("é".repeat(2000)));
    assert!(caught.message.len() <= MAX_MESSAGE && caught.message.ends_with("..."));
    assert!(caught.meta[0].1.len() <= MAX_META_VALUE && caught.meta[0].1.ends_with("..."));
    let status = caught.to_status();
    assert!(status.message().len() <= MAX_MESSAGE);
}

fn exhausted(class: OutcomeClass) -> RequestError {
    let mut failure = Failure::new(class, "boom");
    failure.retry_after = Some(Duration::from_secs(3));
    failure.upstream_request_id = Some("req_1".into());
    RequestError::Exhausted {
        failure: Box::new(failure),
        provider: "p".into(),
        attempts: 2,
    }
}

#[test]
fn every_admin_refusal_carries_error_info_in_the_domain() {
    let cases = [
        (
            AdminError::Disabled,
            Code::PermissionDenied,
            "ADMIN_DISABLED",
        ),
        (
            AdminError::InvalidArgument {
                field: "reason",
                message: "required when forcing a breaker".into(),
            },
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
        ),
        (
            AdminError::UnknownProvider("nope".into()),
            Code::NotFound,
            "UNKNOWN_PROVIDER",
        ),
        (
            AdminError::UnknownModel("no model `x`".into()),
            Code::NotFound,
            "UNKNOWN_MODEL",
        ),
        (
            AdminError::UnknownRoute("r".into()),
            Code::NotFound,
            "UNKNOWN_ROUTE",
        ),
        (
            AdminError::ProviderUnavailable("p".into()),
            Code::Unavailable,
            "PROVIDER_UNAVAILABLE",
        ),
        (
            AdminError::RecordFile("disk full".into()),
            Code::Unavailable,
            "VALIDATION_STORE_UNAVAILABLE",
        ),
    ];
    for (err, code, reason) in cases {
        let s = admin_status(&err);
        assert_eq!((s.code(), s.message()), (code, err.to_string().as_str()));
        let info = s.get_details_error_info().unwrap();
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            (reason, DOMAIN)
        );
    }
    let s = admin_status(&AdminError::InvalidArgument {
        field: "reason",
        message: "x".into(),
    });
    assert_eq!(
        s.get_details_error_info().unwrap().metadata["field"],
        "reason"
    );
}

#[test]
fn deadline_is_deadline_exceeded_not_cancelled() {
    let s = to_status(&RequestError::DeadlineExceeded { attempts: 1 });
    assert_eq!(s.code(), Code::DeadlineExceeded);
}

#[test]
fn exhausted_carries_error_info_and_retry_info() {
    let s = to_status(&exhausted(OutcomeClass::Overloaded));
    assert_eq!(s.code(), Code::Unavailable);
    let d = s.get_error_details();
    let info = d.error_info().unwrap();
    assert_eq!(info.reason, "UPSTREAM_OVERLOADED");
    assert_eq!(info.metadata["provider"], "p");
    assert_eq!(info.metadata["upstream_request_id"], "req_1");
    assert_eq!(
        d.retry_info().unwrap().retry_delay,
        Some(Duration::from_secs(3))
    );
}

#[test]
fn caller_errors_and_provider_errors_differ() {
    assert_eq!(
        to_status(&exhausted(OutcomeClass::Invalid)).code(),
        Code::InvalidArgument
    );
    assert_eq!(
        to_status(&exhausted(OutcomeClass::Auth)).code(),
        Code::Unavailable
    );
    assert_eq!(
        to_status(&exhausted(OutcomeClass::RateLimited)).code(),
        Code::ResourceExhausted
    );
    let s = to_status(&RequestError::NoCapableTarget {
        route: "r".into(),
        missing: vec!["tools".into()],
    });
    assert_eq!(s.code(), Code::FailedPrecondition);
    assert!(s.message().contains("tools"));
}

#[test]
fn mid_stream_reasons() {
    let mk = |class| RequestError::MidStream {
        failure: Box::new(Failure::new(class, "x")),
        provider: "p".into(),
        tokens_emitted: 7,
        attempts: 1,
    };
    let s = to_status(&mk(OutcomeClass::Truncated));
    assert_eq!(s.code(), Code::Unavailable);
    let info = s.get_error_details().error_info().cloned().unwrap();
    assert_eq!(info.reason, "UPSTREAM_STREAM_TRUNCATED");
    assert_eq!(info.metadata["tokens_emitted"], "7");
    assert_eq!(
        to_status(&mk(OutcomeClass::Protocol)).code(),
        Code::Internal
    );
}

/// The gRPC code as the docs spell it (`INVALID_ARGUMENT`).
fn code_name(code: Code) -> String {
    let mut out = String::new();
    for (i, c) in format!("{code:?}").chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// README.md and every page under docs/, from the nearest directory up from
/// the crate that has them (the docs may move; the table goes with them).
fn doc_pages() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    for dir in here.ancestors() {
        let mut pages = Vec::new();
        if dir.join("README.md").is_file() {
            pages.push(dir.join("README.md"));
        }
        walk(&dir.join("docs"), &mut pages);
        let found = pages
            .iter()
            .any(|p| std::fs::read_to_string(p).is_ok_and(|t| t.contains(DOC_TABLE_HEADER)));
        if found {
            return pages;
        }
    }
    panic!(
        "no page under {} has the error table ({DOC_TABLE_HEADER})",
        here.display()
    );
}

/// The header row of the error table in the docs.
const DOC_TABLE_HEADER: &str =
    "| reason | gRPC | HTTP | OpenAI type | Anthropic type | RetryInfo |";

/// The rows of the docs' error table: reason, gRPC, HTTP, OpenAI type,
/// Anthropic type, RetryInfo, as written.
fn doc_rows() -> Vec<[String; 6]> {
    let mut rows = Vec::new();
    for page in doc_pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let Some(start) = text.find(DOC_TABLE_HEADER) else {
            continue;
        };
        for line in text[start..].lines().skip(2) {
            if !line.starts_with('|') {
                break;
            }
            let cells: Vec<String> = line
                .split('|')
                .map(|c| c.trim().trim_matches('`').to_string())
                .collect();
            rows.push([1, 2, 3, 4, 5, 6].map(|i| cells.get(i).cloned().unwrap_or_default()));
        }
    }
    rows
}

#[test]
fn the_docs_error_table_lists_exactly_the_tables_rows() {
    let documented = doc_rows();
    let rows: BTreeSet<[String; 6]> = Kind::ALL
        .iter()
        .map(|k| {
            let e = k.entry();
            let http = if e.anthropic_status() == e.http {
                e.http.as_u16().to_string()
            } else {
                format!(
                    "{} ({} on the Anthropic door)",
                    e.http.as_u16(),
                    e.anthropic_status().as_u16()
                )
            };
            [
                e.reason.to_string(),
                code_name(e.grpc),
                http,
                e.openai_type.to_string(),
                e.anthropic_type.to_string(),
                match e.retry {
                    Retry::Never => "no",
                    Retry::IfKnown => "if known",
                    Retry::Always => "always",
                }
                .to_string(),
            ]
        })
        .collect();
    let listed: BTreeSet<[String; 6]> = documented.iter().cloned().collect();
    assert_eq!(listed.len(), documented.len(), "a row is listed twice");
    let missing: Vec<_> = rows.difference(&listed).collect();
    let unknown: Vec<_> = listed.difference(&rows).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "the docs' error table differs from api::errors: missing {missing:#?}, not in the table {unknown:#?}"
    );
}
