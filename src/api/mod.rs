//! The caller-facing surfaces: the gRPC `Router` service, the one mapping from
//! request errors to gRPC statuses, the OpenAI-compatible HTTP front door and
//! the admin HTTP listener. Nothing here knows upstream wire details.

pub mod admin;
pub mod admin_http;
pub mod auth;
pub mod convert;
pub mod grpc_limits;
pub mod intake;
pub mod jobs;
pub mod listener;
pub mod openai;
pub mod router_service;
pub mod status;
pub mod tls;
