//! Pure policy: outcome classes, breakers, health windows, budgets, backoff,
//! the next step of an attempt (`next`) and of a request (`ladder`).
//! Plain structs with time passed in; no I/O, no actors, no gRPC.

pub mod affinity;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod clock;
pub mod continuation;
pub mod cooldown;
pub mod health;
pub mod ladder;
pub mod next;
pub mod outcome;
pub mod rate_window;
pub mod share;
pub mod token_bucket;
pub(crate) mod window;
