//! Switchyard: a resilient gRPC router in front of LLM providers. This is
//! the server library; the `switchyard` command (the workspace root) and
//! the tools it runs (`mock-upstream`, `bench`, `drill`, `plan`, `golden`:
//! crates/mock, bench, drill, plan, golden) are their own crates, which
//! this one does not link.
//!
//! The crate map, bottom layer first; each layer depends only on those below
//! it (DESIGN.md §1). `config`, `error`, `chat`, `job`, `tls`, `rare`, `arena` and
//! `telemetry` sit beside the layers.
//!
//! | layer | modules | owns |
//! |---|---|---|
//! | policy | [`policy`] | pure structs, time passed in: outcome classes, breaker, health window, retry budget, backoff, token bucket, cooldown, [`policy::next`] (the next step of an attempt) and [`policy::ladder`] (the next rung of a request) |
//! | upstream | [`upstream`] | wire adapters (OpenAI and compatible servers, Azure, Anthropic, Bedrock, Vertex, Gemini), the content each wire carries or reports dropped, SSE parsing, end-of-stream checks, the neutral [`upstream::endpoint::Endpoint`] |
//! | attempt | [`attempt`], [`sink`] | one upstream attempt with a permit it is given; the event sink to the caller |
//! | state | [`state`] | stores: one home per store ([`state::cache`], [`state::cost`], [`state::idempotency`], [`state::tenants`], [`state::responses`], [`state::affinity`], [`state::jobs`], [`state::files`], [`state::journal`], [`state::validation`]) with its embedded and Redis implementation and what a Redis outage does to it; the Redis client ([`state::redis`]) |
//! | actors | [`actors`] | supervisor, provider, router and recovery actors: policy wired to messages; [`actors::client`], the one door the rest of the crate calls them through |
//! | config in force | [`reload`] | the config in force and its reload (SIGHUP, a change of the file, `Admin.ReloadConfig`), read by the doors |
//! | request task | [`task`], [`request`], [`semantic`], [`embeddings`] | one per request, a file per step: [`task`] runs it (claim, plan, reserve, the rungs [`policy::ladder`] names, settle), its live walk as [`policy::next`] says, the exact and semantic cache rungs, the queue rung, the bill (an embeddings call: the same walk, no ladder) |
//! | api | [`api`] | the one intake ([`api::intake`]), gRPC services, the HTTP doors (OpenAI Chat Completions, Responses, embeddings and models; Anthropic Messages; Batch), jobs, the one error table ([`api::errors`]: gRPC, OpenAI and Anthropic envelopes, Admin API) |
//! | app | [`app`] | assembly: stores, actors, doors and listeners, started and stopped in order |

pub mod actors;
pub mod api;
pub mod app;
pub mod arena;
pub mod attempt;
pub mod chat;
pub mod config;
#[cfg(test)]
mod config_fuzz;
pub mod embeddings;
pub mod error;
pub mod job;
pub mod policy;
pub mod proto_delta;
pub mod proto_names;
pub mod rare;
pub mod reload;
pub mod request;
pub mod semantic;
pub mod sink;
pub mod spares;
pub mod state;
pub mod task;
pub mod telemetry;
pub mod tls;
pub mod upstream;

/// Generated gRPC types and services for `switchyard.v1`.
pub mod proto {
    #![allow(clippy::all, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    tonic::include_proto!("switchyard.v1");
    pub use crate::proto_delta::Delta;
    pub use crate::proto_names::{ServedBy, Started};
    /// Encoded descriptor set for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("switchyard_descriptor");
}
