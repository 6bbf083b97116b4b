//! Actors own control state and wire the pure policies to messages:
//! the supervisor (spawns and restarts), one provider actor per provider
//! (permits, outcome reports) and the router actor (plans). They never touch
//! response bytes and never do HTTP inside `handle`. Everything outside
//! calls them through [`client`].

pub mod client;
pub mod provider;
pub mod recovery;
pub mod registry;
pub mod router;
pub mod supervisor;

pub use client::CALL_TIMEOUT;
