//! Telemetry: Prometheus metrics (and, next to them, tracing setup).

pub mod metrics;
pub mod tracing;
