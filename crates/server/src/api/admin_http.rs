//! The admin HTTP listener: `/healthz` (process alive), `/readyz` (serving:
//! actors up and not draining) and `/metrics` (Prometheus text).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::actors::registry::Registry;
use crate::telemetry::metrics::{Metrics, TrafficLabels, CONTENT_TYPE};

/// What the admin endpoints read.
#[derive(Clone)]
pub struct AdminState {
    pub registry: Arc<Registry>,
    /// False while starting or draining.
    pub ready: Arc<AtomicBool>,
    /// False while no route has a target that can take traffic.
    pub routable: Arc<AtomicBool>,
    /// The job queue, when configured (depth and oldest age at scrape time).
    pub jobs: Option<Arc<crate::state::jobs::Jobs>>,
    pub metrics: Arc<Metrics>,
    /// Every key's rate windows (`/v1/status`).
    pub limits: Arc<crate::state::limits::KeyLimits>,
}

pub fn router(state: AdminState) -> axum::Router {
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/status", get(status))
        .with_state(state)
}

/// What `/readyz` answers and `switchyard_ready` shows.
fn is_ready(s: &AdminState) -> bool {
    s.ready.load(Ordering::Relaxed)
        && s.routable.load(Ordering::Relaxed)
        && s.registry.router().is_some()
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if is_ready(&s) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn status(State(s): State<AdminState>) -> impl IntoResponse {
    axum::Json(crate::api::admin::collect(&s.registry, &s.limits).await)
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    // In-flight gauges are read from the semaphores at scrape time, with
    // the ceilings they count against.
    // The routes' tallies first: the failover rate and retry budget count
    // every request answered before the scrape.
    crate::actors::client::fold_tallies(&s.registry).await;
    s.metrics.ready.set(i64::from(is_ready(&s)));
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    s.metrics
        .runtime_workers
        .set(i64::try_from(workers).unwrap_or(i64::MAX));
    for p in s.registry.providers() {
        for (traffic, n) in [
            ("all", p.runtime.max_concurrency),
            ("failover", p.runtime.failover_max_concurrency),
        ] {
            s.metrics
                .concurrency_limit
                .get_or_create(&TrafficLabels {
                    provider: p.runtime.id.clone(),
                    traffic,
                })
                .set(i64::from(n));
        }
        let failover = p.runtime.failover_in_flight();
        let own = p.runtime.in_flight().saturating_sub(failover);
        for (traffic, n) in [("own", own), ("failover", failover)] {
            s.metrics
                .in_flight
                .get_or_create(&TrafficLabels {
                    provider: p.runtime.id.clone(),
                    traffic,
                })
                .set(n as i64);
        }
    }
    if let Some(jobs) = &s.jobs {
        if let Ok((depth, oldest)) = jobs.depth().await {
            s.metrics.queue_depth.set(depth as i64);
            s.metrics
                .queue_oldest_age
                .set(oldest.map_or(0.0, |a| a.as_secs_f64()));
        }
    }
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], s.metrics.render())
}
