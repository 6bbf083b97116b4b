//! Shared state behind the request path, one folder per store (`affinity`,
//! `cost`, `idempotency`, `responses`, `tenants`: the face with its outage policy, the embedded
//! and the Redis implementation), the Redis client (`redis`), what the stores
//! share (`shared`) and their assembly from `[state]`. The types here are the
//! vocabulary every backend speaks. Nothing above this layer knows which
//! backend answers. (The job queue's SQLite store lives in `queue`.)

use std::time::Duration;

pub mod affinity;
pub mod assemble;
pub mod cost;
pub mod idempotency;
pub mod redis;
pub mod responses;
pub mod shared;
pub mod tenants;

/// The shared state could not be reached or answered in time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("shared state unavailable: {0}")]
    Unavailable(String),
}

/// What a cost reservation found.
#[derive(Debug, Clone, PartialEq)]
pub enum CostDecision {
    /// The amount is held against the tenant's cap until settled.
    Reserved,
    /// Spent plus held plus this amount would pass the cap.
    OverCap {
        spent_usd: f64,
        reserved_usd: f64,
        /// When the oldest charge leaves the window (at most the window).
        retry_in: Duration,
    },
}

/// What an idempotency claim found.
#[derive(Debug, Clone, PartialEq)]
pub enum IdemClaim {
    /// First use: run the request, then complete or release the claim.
    Fresh,
    /// A finished request with the same fingerprint: these are its stored answer bytes.
    Replay(Vec<u8>),
    /// The same key and fingerprint is being served now.
    InUse,
    /// The key was used with a different fingerprint.
    Mismatch,
}

/// What tenant admission decided.
#[derive(Debug, Clone, PartialEq)]
pub enum TenantDecision {
    Admitted,
    /// At `max_concurrent` requests in flight.
    Concurrency,
    /// Over the rate; a token is available after this long.
    Rate {
        retry_after: Duration,
    },
}

/// How Redis keeps what it acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persistence {
    pub appendonly: bool,
    /// `always`, `everysec` or `no`.
    pub appendfsync: String,
}
