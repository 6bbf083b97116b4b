//! Actors own control state and wire the pure policies to messages:
//! the supervisor (spawns and restarts), one provider actor per provider
//! (permits, outcome reports) and the router actor (plans). They never touch
//! response bytes and never do HTTP inside `handle`.

pub mod provider;
pub mod recovery;
pub mod registry;
pub mod router;
pub mod supervisor;

/// How long a request task waits for an actor's reply before treating the
/// actor as unavailable (it is being restarted).
pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
