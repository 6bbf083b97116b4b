//! `switchyard golden`: evidence that a route's fallbacks behave like its
//! primary before the ladder relies on them. A golden set of prompts runs
//! through every target of the route (each request pinned to one target);
//! each answer is judged for structured-output validity, refusal agreement,
//! tool-call shape and similarity to the first target's answer; the verdict
//! per target becomes the route's validation record, which the server
//! shows and the `require_validated` downshift obeys.

pub mod judge;
pub mod run;
pub mod set;

pub use run::{run, GoldenArgs, GoldenError};
