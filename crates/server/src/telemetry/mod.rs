//! Telemetry: Prometheus metrics (and, next to them, tracing setup).

pub mod alloc;
pub mod metrics;
pub mod tracing;
