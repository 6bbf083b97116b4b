//! The Batch API's file slots: at most [`FILES_IN_MEMORY`] files (uploads,
//! downloads, batch validation) in memory at once, each up to
//! `queue.max_file_bytes`, shared fairly: a tenant that holds `k` slots gets
//! another only while more than `k` are free, so one tenant never holds them
//! all (alone it gets half) and another always finds one. Past that: 429
//! FILES_BUSY. An upload takes its slot only once its headers are checked,
//! and the listener's body pace bounds how long it can keep it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Files in memory at once, all tenants.
pub const FILES_IN_MEMORY: usize = 4;

/// Whether a tenant holding `held` slots may take another while `in_use`
/// of `total` are taken: only while more than `held` are free.
pub fn may_take(held: usize, in_use: usize, total: usize) -> bool {
    total.saturating_sub(in_use) > held
}

/// Why no slot was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// Every slot is taken.
    Full,
    /// The rest are kept for other tenants.
    FairShare { held: usize },
}

/// The slots, and who holds them (at most [`FILES_IN_MEMORY`] tenants).
pub struct FileSlots {
    total: usize,
    held: Mutex<HashMap<String, usize>>,
}

/// One file's place in memory; given back on drop.
pub struct FileSlot {
    slots: Arc<FileSlots>,
    tenant: String,
}

impl FileSlots {
    pub fn new(total: usize) -> Arc<Self> {
        Arc::new(FileSlots {
            total,
            held: Mutex::new(HashMap::new()),
        })
    }

    pub fn total(&self) -> usize {
        self.total
    }

    /// A slot for `tenant`, or why not.
    pub fn take(self: &Arc<Self>, tenant: &str) -> Result<FileSlot, Busy> {
        let mut held = self.held.lock().map_err(|_| Busy::Full)?;
        let in_use: usize = held.values().sum();
        let mine = held.get(tenant).copied().unwrap_or(0);
        if in_use >= self.total {
            return Err(Busy::Full);
        }
        if !may_take(mine, in_use, self.total) {
            return Err(Busy::FairShare { held: mine });
        }
        *held.entry(tenant.to_string()).or_insert(0) += 1;
        Ok(FileSlot {
            slots: self.clone(),
            tenant: tenant.to_string(),
        })
    }
}

impl Drop for FileSlot {
    fn drop(&mut self) {
        let Ok(mut held) = self.slots.held.lock() else {
            return;
        };
        if let Some(n) = held.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn one_tenant_gets_half_and_the_others_always_find_one() {
        let slots = FileSlots::new(4);
        let a1 = slots.take("alpha").unwrap();
        let _a2 = slots.take("alpha").unwrap();
        assert_eq!(slots.take("alpha").err(), Some(Busy::FairShare { held: 2 }));
        // Beta gets one; then the last one is kept for a tenant holding none.
        let _b1 = slots.take("beta").unwrap();
        assert_eq!(slots.take("beta").err(), Some(Busy::FairShare { held: 1 }));
        let _c1 = slots.take("gamma").unwrap();
        assert_eq!(slots.take("delta").err(), Some(Busy::Full));
        // A slot given back is free again, and forgotten with its last holder.
        drop(a1);
        assert_eq!(slots.take("delta").map(|_| ()), Ok(()));
        assert_eq!(slots.held.lock().unwrap().len(), 3);
    }

    #[test]
    fn the_rule_is_more_free_than_held() {
        assert!(may_take(0, 3, 4));
        assert!(!may_take(1, 3, 4));
        assert!(may_take(1, 1, 4));
        assert!(!may_take(2, 2, 4));
        assert!(!may_take(0, 4, 4));
    }
}
