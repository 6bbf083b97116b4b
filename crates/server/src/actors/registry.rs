//! The registry of live actor references. The supervisor swaps a reference
//! here when it restarts an actor, so request tasks always reach the current
//! incarnation; nothing else caches an `ActorRef`.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use ractor::ActorRef;

use super::provider::{ProviderMsg, ProviderRuntime};
use super::recovery::RecoveryMsg;
use super::router::RouterMsg;

/// A provider as request tasks see it: its actor and its I/O runtime.
#[derive(Clone)]
pub struct ProviderEntry {
    pub actor: ActorRef<ProviderMsg>,
    pub runtime: Arc<ProviderRuntime>,
}

/// Current actor references, shared by the supervisor and request tasks.
#[derive(Default)]
pub struct Registry {
    providers: RwLock<HashMap<String, ProviderEntry>>,
    router: RwLock<Option<ActorRef<RouterMsg>>>,
    recovery: RwLock<Option<ActorRef<RecoveryMsg>>>,
}

impl Registry {
    pub fn provider(&self, id: &str) -> Option<ProviderEntry> {
        self.providers.read().ok()?.get(id).cloned()
    }

    pub fn providers(&self) -> Vec<ProviderEntry> {
        self.providers
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn router(&self) -> Option<ActorRef<RouterMsg>> {
        self.router.read().ok()?.clone()
    }

    pub(crate) fn set_provider(&self, id: &str, entry: ProviderEntry) {
        if let Ok(mut m) = self.providers.write() {
            m.insert(id.to_string(), entry);
        }
    }

    pub(crate) fn remove_provider(&self, id: &str) -> Option<ProviderEntry> {
        self.providers.write().ok()?.remove(id)
    }

    pub fn recovery(&self) -> Option<ActorRef<RecoveryMsg>> {
        self.recovery.read().ok()?.clone()
    }

    pub(crate) fn set_recovery(&self, recovery: ActorRef<RecoveryMsg>) {
        if let Ok(mut r) = self.recovery.write() {
            *r = Some(recovery);
        }
    }

    pub(crate) fn set_router(&self, router: ActorRef<RouterMsg>) {
        if let Ok(mut r) = self.router.write() {
            *r = Some(router);
        }
    }
}
