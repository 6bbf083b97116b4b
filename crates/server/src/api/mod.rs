//! The caller-facing surfaces: the gRPC `Router` service, the one mapping from
//! request errors to gRPC and HTTP statuses, the OpenAI- (Chat Completions,
//! Responses) and Anthropic-shaped HTTP front doors and the admin HTTP listener. Nothing here knows upstream wire details.

pub mod admin;
pub mod admin_http;
pub mod anthropic;
pub mod auth;
pub mod batch;
pub mod codec;
pub mod content;
pub mod convert;
pub mod door;
pub mod embeddings;
pub mod errors;
pub mod grpc_limits;
pub mod grpc_server;
pub mod intake;
pub mod jobs;
pub mod listener;
pub mod openai;
pub mod responses;
pub mod router_service;
