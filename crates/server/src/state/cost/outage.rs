//! What a replica may spend while the fleet ledger cannot be asked, and the
//! charges it owes the ledger. Pure and bounded: no I/O, time passed in.
//!
//! - Every answer from Redis tells the room a tenant had (cap minus spend
//!   and holds); the last one is remembered.
//! - When Redis does not answer, a tenant's allowance on this replica is that
//!   room (the cap, for a tenant this replica never saw) divided by the live
//!   replicas (the last heartbeat's count), taken once per outage;
//!   reservations come out of it and settling below the hold gives the rest
//!   back. So the fleet spends at most one cap's worth during an outage.
//! - Charges Redis could not record are kept per tenant, with the
//!   reservations they end, and sent as one batch with an id (so a retry
//!   counts once) when Redis answers again.

use std::collections::HashMap;

use tokio::time::Instant;

/// Most tenants remembered, allowed or owed at once (tenant names come from
/// callers in open auth mode).
pub const MAX_TENANTS: usize = 10_000;
/// Most reservation ids kept per tenant to drop with its batch; past it the
/// holds lapse on their own.
pub const MAX_IDS: usize = 64;

/// Why the allowance refused a reservation.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// Too many tenants have an allowance already: this one gets none.
    Full,
    /// The amount does not fit what is left of the allowance.
    Over { left_usd: f64 },
}

/// Charges owed to the fleet ledger for one tenant, sent as one script.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Names the batch in the ledger, so sending it twice counts once.
    pub id: String,
    pub usd: f64,
    /// Reservations the charges end (their holds are dropped with them).
    pub reservations: Vec<String>,
}

/// One tenant's debt: a batch being sent (kept unchanged until it lands)
/// and what came after it.
#[derive(Debug, Default)]
struct Owed {
    sending: Option<Batch>,
    usd: f64,
    reservations: Vec<String>,
}

#[derive(Debug, Default)]
pub struct Outage {
    /// Room per tenant at its last answer from Redis, and when.
    known: HashMap<String, (f64, Instant)>,
    /// Live replicas at the last heartbeat (at least 1).
    replicas: u32,
    /// What each tenant may still hold on this replica, during an outage.
    allowances: HashMap<String, f64>,
    /// Charges the ledger has not recorded yet, per tenant.
    owed: HashMap<String, Owed>,
    /// Batches formed, for their ids.
    batches: u64,
}

impl Outage {
    pub fn new() -> Self {
        Outage {
            replicas: 1,
            ..Outage::default()
        }
    }

    /// The heartbeat's count of live replicas.
    pub fn set_replicas(&mut self, n: u32) {
        self.replicas = n.max(1);
    }

    /// Redis answered for `tenant` with this much room left: remembered,
    /// and the outage is over for the tenant.
    pub fn seen(&mut self, tenant: &str, room_usd: f64, now: Instant) {
        self.allowances.remove(tenant);
        if self.known.len() >= MAX_TENANTS && !self.known.contains_key(tenant) {
            let oldest = self.known.iter().min_by_key(|(_, (_, at))| *at);
            if let Some(k) = oldest.map(|(k, _)| k.clone()) {
                self.known.remove(&k);
            }
        }
        self.known
            .insert(tenant.to_string(), (room_usd.max(0.0), now));
    }

    /// A reservation Redis held settled at `actual`: the rest of its hold is
    /// room again.
    pub fn returned(&mut self, tenant: &str, held_usd: f64, actual_usd: f64) {
        if let Some((room, _)) = self.known.get_mut(tenant) {
            *room += (held_usd - actual_usd).max(0.0);
        }
    }

    /// Holds `usd` against the tenant's allowance on this replica (made on
    /// first use from the last known room, else the `cap`, split by the replicas).
    pub fn take(&mut self, tenant: &str, usd: f64, cap: f64) -> Result<(), Refused> {
        let usd = usd.max(0.0);
        if !self.allowances.contains_key(tenant) {
            if self.allowances.len() >= MAX_TENANTS {
                return Err(Refused::Full);
            }
            let room = self.known.get(tenant).map_or(cap, |(room, _)| *room);
            let share = room.clamp(0.0, cap.max(0.0)) / f64::from(self.replicas);
            self.allowances.insert(tenant.to_string(), share);
        }
        let left = self.allowances.get_mut(tenant).ok_or(Refused::Full)?;
        if usd > *left + 1e-9 {
            return Err(Refused::Over { left_usd: *left });
        }
        *left = (*left - usd).max(0.0);
        Ok(())
    }

    /// A reservation held by the allowance settled at `actual`: the rest
    /// goes back to it (if the outage is still on for the tenant).
    pub fn give_back(&mut self, tenant: &str, held_usd: f64, actual_usd: f64) {
        if let Some(left) = self.allowances.get_mut(tenant) {
            *left += (held_usd - actual_usd).max(0.0);
        }
    }

    /// Keeps a charge the ledger did not record (and the reservation it
    /// ends); false when the debt table is full and the charge is lost.
    pub fn owe(&mut self, tenant: &str, usd: f64, reservation: Option<&str>) -> bool {
        if self.owed.len() >= MAX_TENANTS && !self.owed.contains_key(tenant) {
            return false;
        }
        let owed = self.owed.entry(tenant.to_string()).or_default();
        if usd.is_finite() && usd > 0.0 {
            owed.usd += usd;
        }
        if let Some(id) = reservation {
            if owed.reservations.len() < MAX_IDS {
                owed.reservations.push(id.to_string());
            }
        }
        true
    }

    /// The tenant owes the ledger something.
    pub fn owes(&self, tenant: &str) -> bool {
        self.owed.contains_key(tenant)
    }

    /// Tenants that owe the ledger something.
    pub fn debtors(&self) -> Vec<String> {
        self.owed.keys().cloned().collect()
    }

    /// The batch to send for `tenant` now: the one already being sent, else
    /// everything owed so far under a new id.
    pub fn batch(&mut self, tenant: &str, replica: &str) -> Option<Batch> {
        let owed = self.owed.get_mut(tenant)?;
        if owed.sending.is_none() {
            self.batches += 1;
            owed.sending = Some(Batch {
                id: format!("{replica}-{}", self.batches),
                usd: std::mem::take(&mut owed.usd),
                reservations: std::mem::take(&mut owed.reservations),
            });
        }
        owed.sending.clone()
    }

    /// The batch `id` is in the ledger: forget it (and the tenant, if
    /// nothing came after it).
    pub fn landed(&mut self, tenant: &str, id: &str) {
        let Some(owed) = self.owed.get_mut(tenant) else {
            return;
        };
        if owed.sending.as_ref().is_some_and(|b| b.id == id) {
            owed.sending = None;
        }
        if owed.sending.is_none() && owed.usd == 0.0 && owed.reservations.is_empty() {
            self.owed.remove(tenant);
        }
    }

    /// USD owed to the ledger, all tenants.
    pub fn owed_usd(&self) -> f64 {
        self.owed
            .values()
            .map(|o| o.usd + o.sending.as_ref().map_or(0.0, |b| b.usd))
            .sum()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const CAP: f64 = 10.0;

    #[tokio::test(start_paused = true)]
    async fn the_allowance_is_the_last_known_room_or_the_cap_split_by_the_replicas() {
        let now = Instant::now();
        let mut o = Outage::new();
        o.set_replicas(2);
        o.seen("t", 5.0, now);
        // 2.5 USD on this replica: two 1 USD holds fit, a third does not.
        assert_eq!(o.take("t", 1.0, CAP), Ok(()));
        assert_eq!(o.take("t", 1.0, CAP), Ok(()));
        assert_eq!(o.take("t", 1.0, CAP), Err(Refused::Over { left_usd: 0.5 }));
        assert_eq!(o.take("t", 0.5, CAP), Ok(()));
        // Settling below the hold gives the rest back.
        o.give_back("t", 1.0, 0.25);
        assert_eq!(o.take("t", 0.75, CAP), Ok(()));
        assert_eq!(o.take("t", 0.01, CAP), Err(Refused::Over { left_usd: 0.0 }));
        // A tenant never seen gets its cap split: 10 / 2.
        assert_eq!(o.take("new", 5.0, CAP), Ok(()));
        assert_eq!(
            o.take("new", 0.01, CAP),
            Err(Refused::Over { left_usd: 0.0 })
        );
        // Redis answering ends the outage; the next one splits the new room.
        o.seen("t", 4.0, now);
        o.set_replicas(4);
        assert_eq!(o.take("t", 1.0, CAP), Ok(()));
        assert_eq!(o.take("t", 0.01, CAP), Err(Refused::Over { left_usd: 0.0 }));
        // Never more than the cap, whatever was remembered.
        o.seen("t", 80.0, now);
        assert_eq!(o.take("t", 2.5, CAP), Ok(()));
        assert_eq!(o.take("t", 0.01, CAP), Err(Refused::Over { left_usd: 0.0 }));
    }

    #[tokio::test(start_paused = true)]
    async fn the_room_follows_settlements_and_is_never_negative() {
        let now = Instant::now();
        let mut o = Outage::new();
        o.seen("t", -3.0, now);
        assert_eq!(o.take("t", 0.01, CAP), Err(Refused::Over { left_usd: 0.0 }));
        o.seen("t", 1.0, now);
        // A request Redis held for 1 USD cost 0.5: its room is 1.5 again.
        o.returned("t", 1.0, 0.5);
        assert_eq!(o.take("t", 1.5, CAP), Ok(()));
        assert_eq!(o.take("t", 0.01, CAP), Err(Refused::Over { left_usd: 0.0 }));
    }

    #[tokio::test(start_paused = true)]
    async fn charges_owed_go_out_as_one_batch_that_is_resent_unchanged_until_it_lands() {
        let mut o = Outage::new();
        assert!(o.owe("t", 0.5, Some("r1")));
        assert!(o.owe("t", 0.25, Some("r2")));
        assert!(
            o.owe("t", 0.0, Some("r3")),
            "a free request still ends its hold"
        );
        assert!(o.owes("t"));
        let b = o.batch("t", "rep").unwrap();
        assert_eq!(b.usd, 0.75);
        assert_eq!(b.reservations, ["r1", "r2", "r3"]);
        // More charges while it is being sent wait for the next batch.
        assert!(o.owe("t", 1.0, None));
        assert_eq!(o.batch("t", "rep").unwrap(), b, "resent unchanged");
        assert_eq!(o.owed_usd(), 1.75);
        o.landed("t", &b.id);
        let next = o.batch("t", "rep").unwrap();
        assert_ne!(next.id, b.id);
        assert_eq!(next.usd, 1.0);
        o.landed("t", "an-old-id");
        assert!(o.owes("t"), "only its own id lands a batch");
        o.landed("t", &next.id);
        assert!(!o.owes("t"));
        assert_eq!(o.owed_usd(), 0.0);
        assert!(o.debtors().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn every_table_is_bounded() {
        let now = Instant::now();
        let mut o = Outage::new();
        for i in 0..MAX_TENANTS {
            o.seen(
                &format!("t{i}"),
                1.0,
                now + std::time::Duration::from_millis(i as u64),
            );
            assert!(o.owe(&format!("t{i}"), 0.1, None));
        }
        o.seen("late", 1.0, now + std::time::Duration::from_secs(3600));
        assert_eq!(o.known.len(), MAX_TENANTS);
        assert!(!o.known.contains_key("t0"), "the oldest is forgotten");
        assert!(!o.owe("one-more", 0.1, None), "the debt table is full");
        for i in 0..MAX_TENANTS {
            assert_eq!(o.take(&format!("t{i}"), 0.0, CAP), Ok(()));
        }
        assert_eq!(o.take("one-more", 0.0, CAP), Err(Refused::Full));
        for i in 0..(MAX_IDS + 10) {
            o.owe("t1", 0.0, Some(&format!("r{i}")));
        }
        assert_eq!(o.batch("t1", "rep").unwrap().reservations.len(), MAX_IDS);
    }
}
