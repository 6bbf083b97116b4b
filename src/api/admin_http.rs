//! The admin HTTP listener: `/healthz` (process alive), `/readyz` (serving:
//! actors up and not draining) and `/metrics` (Prometheus text).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::actors::registry::Registry;

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub registry: Arc<Registry>,
    /// False while starting or draining.
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: AdminState) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Relaxed) && s.registry.router().is_some() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    let mut out = String::new();
    out.push_str("# HELP switchyard_provider_in_flight Upstream requests in flight per provider and traffic class.\n");
    out.push_str("# TYPE switchyard_provider_in_flight gauge\n");
    let mut providers = s.registry.providers();
    providers.sort_by(|a, b| a.runtime.id.cmp(&b.runtime.id));
    for p in &providers {
        let total = p.runtime.in_flight();
        let failover = p.runtime.failover_in_flight();
        out.push_str(&format!(
            "switchyard_provider_in_flight{{provider=\"{}\",traffic=\"own\"}} {}\n",
            p.runtime.id,
            total.saturating_sub(failover)
        ));
        out.push_str(&format!(
            "switchyard_provider_in_flight{{provider=\"{}\",traffic=\"failover\"}} {}\n",
            p.runtime.id, failover
        ));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
