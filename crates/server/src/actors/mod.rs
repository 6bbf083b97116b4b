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

/// Casts `tick()` to `actor` every `period` until the actor is gone: the
/// timer of an actor that folds in counts requests leave it without a
/// message. A late tick is delayed, never repeated to catch up (a test
/// clock advanced by an hour sends one, not 36,000).
pub(crate) fn fold_every<M: ractor::Message>(
    actor: ractor::ActorRef<M>,
    period: std::time::Duration,
    tick: impl Fn() -> M + Send + 'static,
) {
    tokio::spawn(async move {
        let start = tokio::time::Instant::now() + period;
        let mut timer = tokio::time::interval_at(start, period);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            timer.tick().await;
            if actor.cast(tick()).is_err() {
                break;
            }
        }
    });
}
