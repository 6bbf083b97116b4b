//! Pure policy: outcome classes, breakers, health windows, budgets, backoff.
//! Plain structs with time passed in; no I/O, no actors, no gRPC.

pub mod outcome;
