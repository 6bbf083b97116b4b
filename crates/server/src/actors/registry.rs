//! The registry of live actor references and of what the actors publish for
//! requests to read without a message. The supervisor swaps a reference
//! here when it restarts an actor, so request tasks always reach the current
//! incarnation; nothing else caches an `ActorRef`. The router publishes its
//! route table here; the validation store its records.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arc_swap::{ArcSwap, ArcSwapOption};
use ractor::ActorRef;

use super::provider::{ProviderMsg, ProviderRuntime};
use super::recovery::RecoveryMsg;
use super::router::{RouteTable, RouterMsg};
use crate::state::validation::record::Records;

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
    /// The router's route table, as last published.
    routes: ArcSwapOption<RouteTable>,
    /// The golden-set validations on record.
    validations: ArcSwap<Records>,
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

    /// A router actor runs (without cloning its handle).
    pub fn has_router(&self) -> bool {
        self.router.read().is_ok_and(|r| r.is_some())
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

    /// The route table requests plan from (`None` before the router started).
    pub fn route_table(&self) -> Option<Arc<RouteTable>> {
        self.routes.load_full()
    }

    pub(crate) fn set_route_table(&self, table: Arc<RouteTable>) {
        self.routes.store(Some(table));
    }

    /// The golden-set validations on record.
    pub fn validations(&self) -> Arc<Records> {
        self.validations.load_full()
    }

    /// Replaces the validations on record (the validation store's hook).
    pub fn set_validations(&self, records: Arc<Records>) {
        self.validations.store(records);
    }

    pub(crate) fn set_router(&self, router: ActorRef<RouterMsg>) {
        if let Ok(mut r) = self.router.write() {
            *r = Some(router);
        }
    }
}
