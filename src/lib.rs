//! Switchyard: a resilient gRPC router in front of LLM providers.

pub mod actors;
pub mod api;
pub mod app;
pub mod attempt;
pub mod bench;
pub mod cache;
pub mod config;
pub mod cost;
pub mod dispatch;
pub mod drill;
pub mod error;
pub mod idempotency;
pub mod mock;
pub mod policy;
pub mod queue;
pub mod request;
pub mod sink;
pub mod state;
pub mod telemetry;
pub mod tenants;
pub mod upstream;

/// Generated gRPC types and services for `switchyard.v1`.
pub mod proto {
    #![allow(clippy::all, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    tonic::include_proto!("switchyard.v1");
    /// Encoded descriptor set for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("switchyard_descriptor");
}
