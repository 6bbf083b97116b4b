//! The supervisor: spawns one provider actor per provider and the router
//! actor, linked to itself, and restarts any that fails (ractor has no restart
//! strategy of its own). A restarted actor gets the same shared runtime, so no
//! permit is lost, and its new reference is swapped into the [`Registry`].
//! Restarts are capped per window; past the cap the supervisor fails, and the
//! process exits so the orchestrator can start a clean one.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, SupervisionEvent};
use tokio::time::{Duration, Instant};

use super::provider::{ProviderActor, ProviderArgs, ProviderRuntime};
use super::recovery::{RecoveryActor, RecoveryArgs};
use super::registry::{ProviderEntry, Registry};
use super::router::{RouterActor, RouterArgs};
use crate::config::Config;
use crate::telemetry::metrics::Metrics;

/// Restarts allowed per child within [`RESTART_WINDOW`].
pub const MAX_RESTARTS: usize = 10;
pub const RESTART_WINDOW: Duration = Duration::from_secs(60);

/// What the supervisor starts with.
pub struct SupervisorArgs {
    pub config: Arc<Config>,
    pub registry: Arc<Registry>,
    /// Runtimes by provider id, built before start so key errors surface early.
    pub runtimes: HashMap<String, Arc<ProviderRuntime>>,
    pub metrics: Arc<Metrics>,
    /// The queue drain, when a job queue is configured.
    pub recovery: Option<RecoveryArgs>,
}

/// Which child a linked actor is, and how to start it again.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ChildSpec {
    Provider(String),
    Router,
    Recovery,
}

pub enum SupervisorMsg {
    /// Apply a new, validated config: `runtimes` holds a freshly built runtime
    /// for every provider of it (only the new or changed ones are used).
    Reload {
        config: Arc<Config>,
        runtimes: HashMap<String, Arc<ProviderRuntime>>,
        reply: ractor::RpcReplyPort<ReloadReport>,
    },
}

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    /// `[server]`, `[auth]` or `[limits]` changed: those apply at the next restart.
    pub restart_needed: bool,
}

impl ReloadReport {
    /// One line for logs and the admin response.
    pub fn summary(&self) -> String {
        let mut s = if self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty() {
            "applied; providers unchanged (routes and policies updated)".to_string()
        } else {
            format!(
                "applied; providers added [{}], removed [{}], changed [{}]",
                self.added.join(", "),
                self.removed.join(", "),
                self.changed.join(", ")
            )
        };
        if self.restart_needed {
            s.push_str("; [server], [auth] and [limits] changes take effect at the next restart");
        }
        s
    }
}

/// How long a removed provider may finish its in-flight requests before its
/// actor is stopped anyway.
const RETIRE_GRACE: Duration = Duration::from_secs(120);

pub struct Supervisor;

/// Mutable state of the supervisor.
pub struct SupervisorState {
    /// Current config (the router is restarted with it).
    config: Arc<Config>,
    /// Where request tasks find the current references.
    registry: Arc<Registry>,
    /// Provider runtimes by id; they outlive actor incarnations.
    runtimes: HashMap<String, Arc<ProviderRuntime>>,
    metrics: Arc<Metrics>,
    recovery: Option<RecoveryArgs>,
    /// Live children by actor id.
    children: HashMap<ActorId, ChildSpec>,
    /// Recent restarts per child, for the restart cap.
    restarts: HashMap<ChildSpec, RestartLog>,
    /// Actors of removed providers, finishing their streams: not restarted.
    retiring: std::collections::HashSet<ActorId>,
}

/// Restart times of one child within the window: a pure policy struct.
#[derive(Debug, Default)]
struct RestartLog(VecDeque<Instant>);

impl RestartLog {
    /// Records a restart at `now`; `false` once the cap is exceeded.
    fn allow(&mut self, now: Instant) -> bool {
        while self
            .0
            .front()
            .is_some_and(|t| now.duration_since(*t) > RESTART_WINDOW)
        {
            self.0.pop_front();
        }
        self.0.push_back(now);
        self.0.len() <= MAX_RESTARTS
    }
}

impl SupervisorState {
    async fn start_child(
        &mut self,
        spec: ChildSpec,
        supervisor: ActorCell,
    ) -> Result<(), ActorProcessingErr> {
        let id = match &spec {
            ChildSpec::Provider(pid) => {
                let runtime = self
                    .runtimes
                    .get(pid)
                    .cloned()
                    .ok_or_else(|| format!("no runtime for provider {pid}"))?;
                let args = ProviderArgs {
                    runtime: runtime.clone(),
                    metrics: self.metrics.clone(),
                    registry: self.registry.clone(),
                };
                let (actor, _) = Actor::spawn_linked(None, ProviderActor, args, supervisor).await?;
                self.registry.set_provider(
                    pid,
                    ProviderEntry {
                        actor: actor.clone(),
                        runtime,
                    },
                );
                actor.get_id()
            }
            ChildSpec::Recovery => {
                let args = self.recovery.clone().ok_or("no recovery settings")?;
                let (actor, _) = Actor::spawn_linked(None, RecoveryActor, args, supervisor).await?;
                self.registry.set_recovery(actor.clone());
                actor.get_id()
            }
            ChildSpec::Router => {
                let args = RouterArgs {
                    config: self.config.clone(),
                    registry: self.registry.clone(),
                    metrics: self.metrics.clone(),
                };
                let (actor, _) = Actor::spawn_linked(None, RouterActor, args, supervisor).await?;
                self.registry.set_router(actor.clone());
                actor.get_id()
            }
        };
        self.children.insert(id, spec);
        Ok(())
    }

    /// Takes a provider out of service: new requests no longer find it, and
    /// its actor stops once its in-flight streams ended (or after a grace).
    fn retire(&mut self, id: &str) {
        self.runtimes.remove(id);
        let Some(entry) = self.registry.remove_provider(id) else {
            return;
        };
        let actor_id = entry.actor.get_id();
        self.children.remove(&actor_id);
        self.retiring.insert(actor_id);
        tokio::spawn(async move {
            let give_up = Instant::now() + RETIRE_GRACE;
            while entry.runtime.in_flight() > 0 && Instant::now() < give_up {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            entry.actor.stop(Some("removed by config reload".into()));
        });
    }

    async fn reload(
        &mut self,
        config: Arc<Config>,
        mut fresh: HashMap<String, Arc<ProviderRuntime>>,
        supervisor: ActorCell,
    ) -> Result<ReloadReport, ActorProcessingErr> {
        let mut report = ReloadReport::default();
        let mut old: Vec<String> = self.runtimes.keys().cloned().collect();
        old.sort();
        for id in old {
            match fresh.get(&id) {
                None => {
                    self.retire(&id);
                    report.removed.push(id);
                }
                Some(new) if !same_runtime(&self.runtimes[&id], new) => {
                    self.retire(&id);
                    report.changed.push(id);
                }
                Some(_) => {
                    // Unchanged: keeps its actor, breakers and health windows.
                    fresh.remove(&id);
                }
            }
        }
        let mut added: Vec<(String, Arc<ProviderRuntime>)> = fresh.into_iter().collect();
        added.sort_by(|a, b| a.0.cmp(&b.0));
        for (id, runtime) in added {
            if !report.changed.contains(&id) {
                report.added.push(id.clone());
            }
            self.runtimes.insert(id.clone(), runtime);
            self.start_child(ChildSpec::Provider(id), supervisor.clone())
                .await?;
        }
        self.config = config.clone();
        if let Some(router) = self.registry.router() {
            // Awaited: once the reload is answered, every request plans
            // from the new table.
            let published = router
                .call(
                    |reply| super::router::RouterMsg::Reload(config, reply),
                    Some(super::client::CALL_TIMEOUT),
                )
                .await;
            if !matches!(published, Ok(ractor::rpc::CallResult::Success(()))) {
                tracing::warn!("the router did not confirm the reload: it publishes the new table when it restarts");
            }
        }
        Ok(report)
    }

    /// Records a restart; `false` once the child exceeded its cap.
    fn allow_restart(&mut self, spec: &ChildSpec, now: Instant) -> bool {
        self.restarts.entry(spec.clone()).or_default().allow(now)
    }
}

/// The same provider config and the same keys: nothing to restart.
fn same_runtime(a: &ProviderRuntime, b: &ProviderRuntime) -> bool {
    let secrets = |r: &ProviderRuntime| -> Vec<String> {
        let pool = r.endpoint.keys.iter().flat_map(|p| p.secrets());
        r.endpoint
            .api_key
            .iter()
            .chain(pool)
            .map(|k| k.expose().to_string())
            .collect()
    };
    a.config == b.config && secrets(a) == secrets(b)
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = SupervisorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut state = SupervisorState {
            config: args.config,
            registry: args.registry,
            runtimes: args.runtimes,
            metrics: args.metrics,
            recovery: args.recovery,
            children: HashMap::new(),
            restarts: HashMap::new(),
            retiring: Default::default(),
        };
        let mut ids: Vec<String> = state.runtimes.keys().cloned().collect();
        ids.sort();
        for id in ids {
            state
                .start_child(ChildSpec::Provider(id), myself.get_cell())
                .await?;
        }
        state
            .start_child(ChildSpec::Router, myself.get_cell())
            .await?;
        if state.recovery.is_some() {
            state
                .start_child(ChildSpec::Recovery, myself.get_cell())
                .await?;
        }
        Ok(state)
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Reload {
                config,
                runtimes,
                reply,
            } => {
                let report = state.reload(config, runtimes, myself.get_cell()).await?;
                tracing::info!(?report, "config reloaded");
                let _ = reply.send(report);
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for entry in state.registry.providers() {
            entry.actor.stop(None);
        }
        if let Some(router) = state.registry.router() {
            router.stop(None);
        }
        if let Some(recovery) = state.registry.recovery() {
            recovery.stop(None);
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, format!("failed: {err}")),
            SupervisionEvent::ActorTerminated(cell, _, reason) => (
                cell,
                format!("terminated: {}", reason.unwrap_or_else(|| "stopped".into())),
            ),
            _ => return Ok(()),
        };
        if state.retiring.remove(&cell.get_id()) {
            return Ok(());
        }
        let Some(spec) = state.children.remove(&cell.get_id()) else {
            return Ok(());
        };
        if !state.allow_restart(&spec, Instant::now()) {
            tracing::error!(child = ?spec, "restart cap reached ({MAX_RESTARTS} in {RESTART_WINDOW:?}); giving up");
            return Err(format!("child {spec:?} restarted too often").into());
        }
        tracing::warn!(child = ?spec, %why, "actor exited; restarting it");
        state.start_child(spec, myself.get_cell()).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::actors::provider::{OutcomeReport, ProviderMsg, TrafficClass};
    use ractor::rpc::CallResult;

    fn config() -> Arc<Config> {
        Arc::new(
            Config::from_toml_str(
                r#"
[[providers]]
id = "a"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
max_concurrency = 2
failover_max_concurrency = 1
  [[providers.models]]
  name = "m"
[[routes]]
name = "r"
targets = ["a/m"]
"#,
            )
            .unwrap(),
        )
    }

    async fn start() -> (ActorRef<SupervisorMsg>, Arc<Registry>) {
        start_with(Arc::new(Metrics::new())).await
    }

    async fn start_with(metrics: Arc<Metrics>) -> (ActorRef<SupervisorMsg>, Arc<Registry>) {
        let config = config();
        let registry = Arc::new(Registry::default());
        let runtimes = config
            .providers
            .iter()
            .map(|p| (p.id.clone(), Arc::new(ProviderRuntime::new(p).unwrap())))
            .collect();
        let (sup, _) = Actor::spawn(
            None,
            Supervisor,
            SupervisorArgs {
                config,
                registry: registry.clone(),
                runtimes,
                metrics,
                recovery: None,
            },
        )
        .await
        .unwrap();
        (sup, registry)
    }

    async fn admit(
        registry: &Registry,
        class: TrafficClass,
    ) -> Option<crate::actors::provider::Permit> {
        let entry = registry.provider("a").unwrap();
        match entry
            .actor
            .call(
                |reply| ProviderMsg::Admit {
                    model: "m".into(),
                    class,
                    reply,
                },
                Some(CALL),
            )
            .await
            .unwrap()
        {
            CallResult::Success(r) => r.ok(),
            other => panic!("{other:?}"),
        }
    }

    const CALL: Duration = Duration::from_secs(2);

    async fn wait_for_new_incarnation(registry: &Registry, old: ActorId) {
        for _ in 0..1000 {
            if registry.provider("a").unwrap().actor.get_id() != old {
                return;
            }
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("provider actor was not restarted");
    }

    #[tokio::test]
    async fn a_permit_dropped_without_a_report_returns_its_probe_slot() {
        let (sup, registry) = start().await;
        let old = registry.provider("a").unwrap();
        old.actor.cast(ProviderMsg::Crash).unwrap();
        wait_for_new_incarnation(&registry, old.actor.get_id()).await;
        // Half-open after the restart: one probe at a time.
        let probe = admit(&registry, TrafficClass::Own)
            .await
            .expect("the probe");
        assert!(
            admit(&registry, TrafficClass::Own).await.is_none(),
            "one probe is out"
        );
        // Its task is cancelled: no report is sent, only the permit dropped.
        drop(probe);
        let again = admit(&registry, TrafficClass::Own).await;
        assert!(
            again.is_some(),
            "the dropped permit returned its probe slot (not held until probe_timeout)"
        );
        sup.stop(None);
    }

    #[tokio::test]
    async fn crashed_provider_is_restarted_and_keeps_its_permits() {
        let (sup, registry) = start().await;
        let held = admit(&registry, TrafficClass::Failover)
            .await
            .expect("first permit");
        let old = registry.provider("a").unwrap();
        assert_eq!(old.runtime.in_flight(), 1);

        old.actor.cast(ProviderMsg::Crash).unwrap();
        wait_for_new_incarnation(&registry, old.actor.get_id()).await;

        // The permit taken before the crash still counts against both ceilings.
        assert_eq!(old.runtime.in_flight(), 1);
        assert!(
            admit(&registry, TrafficClass::Failover).await.is_none(),
            "failover ceiling is 1"
        );
        let snapshot = registry.provider("a").unwrap().runtime.snapshot();
        assert_eq!(
            snapshot.models["m"].breaker,
            crate::policy::breaker::BreakerState::HalfOpen,
            "a restarted provider comes back half-open"
        );
        let own = admit(&registry, TrafficClass::Own)
            .await
            .expect("own traffic still has room: it is the half-open probe");
        assert!(
            admit(&registry, TrafficClass::Own).await.is_none(),
            "total ceiling is 2"
        );
        drop(held);
        // The probe succeeds: the breaker closes.
        own.report(crate::actors::provider::Outcome {
            class: crate::policy::outcome::OutcomeClass::Ok,
            retry_after: None,
            elapsed: Duration::from_millis(5),
            ttft: Some(Duration::from_millis(1)),
            failed_output_tokens: 0,
        });
        assert_eq!(
            old.runtime.in_flight(),
            0,
            "no permit leaked across the restart"
        );
        assert!(admit(&registry, TrafficClass::Failover).await.is_some());
        sup.stop(None);
    }

    /// A permit from the gate, if it is open (no message).
    fn through_gate(
        registry: &Registry,
        class: TrafficClass,
    ) -> Option<crate::actors::provider::Permit> {
        let entry = registry.provider("a").unwrap();
        entry.runtime.admit_through_gate(&"m".into(), class)
    }

    fn outcome(class: crate::policy::outcome::OutcomeClass) -> crate::actors::provider::Outcome {
        crate::actors::provider::Outcome {
            class,
            retry_after: None,
            elapsed: Duration::from_millis(5),
            ttft: None,
            failed_output_tokens: 0,
        }
    }

    /// Waits until the actor has folded in what was sent to it.
    async fn settled(registry: &Registry) {
        let entry = registry.provider("a").unwrap();
        let _ = entry
            .actor
            .call(
                |reply| ProviderMsg::SetBreaker {
                    model: "nope".into(),
                    change: crate::actors::provider::BreakerOverride::Clear,
                    reason: "sync".into(),
                    reply,
                },
                Some(CALL),
            )
            .await;
    }

    #[tokio::test]
    async fn the_gate_admits_within_the_ceilings_while_closed_and_shuts_when_the_breaker_trips() {
        use crate::policy::outcome::OutcomeClass;
        let (sup, registry) = start().await;
        settled(&registry).await;
        // Closed: permits straight from the semaphores, within both ceilings.
        let a = through_gate(&registry, TrafficClass::Failover).expect("gate open");
        assert!(
            through_gate(&registry, TrafficClass::Failover).is_none(),
            "failover ceiling is 1"
        );
        let b = through_gate(&registry, TrafficClass::Own).expect("own has room");
        assert!(
            through_gate(&registry, TrafficClass::Own).is_none(),
            "total ceiling is 2"
        );
        assert_eq!(registry.provider("a").unwrap().runtime.in_flight(), 2);
        drop(a);
        b.report(outcome(OutcomeClass::Ok));
        settled(&registry).await;
        assert_eq!(registry.provider("a").unwrap().runtime.in_flight(), 0);
        // Five server errors reported through gate permits trip the breaker,
        // and the actor shuts the gate: the next ask is refused by the actor.
        for _ in 0..5 {
            let p = through_gate(&registry, TrafficClass::Own).expect("still closed");
            p.report(outcome(OutcomeClass::ServerError));
        }
        settled(&registry).await;
        assert!(
            through_gate(&registry, TrafficClass::Own).is_none(),
            "open: the gate is shut"
        );
        assert!(
            admit(&registry, TrafficClass::Own).await.is_none(),
            "and the actor refuses"
        );
        assert_eq!(registry.provider("a").unwrap().runtime.in_flight(), 0);
        sup.stop(None);
    }

    #[tokio::test]
    async fn a_restarted_provider_keeps_its_gate_shut_until_its_probe_closes_the_breaker() {
        use crate::policy::outcome::OutcomeClass;
        let (sup, registry) = start().await;
        settled(&registry).await;
        assert!(through_gate(&registry, TrafficClass::Own).is_some());
        let old = registry.provider("a").unwrap();
        old.actor.cast(ProviderMsg::Crash).unwrap();
        wait_for_new_incarnation(&registry, old.actor.get_id()).await;
        settled(&registry).await;
        assert!(
            through_gate(&registry, TrafficClass::Own).is_none(),
            "half-open: probes come from the actor one at a time"
        );
        let probe = admit(&registry, TrafficClass::Own)
            .await
            .expect("the probe");
        probe.report(outcome(OutcomeClass::Ok));
        settled(&registry).await;
        assert!(
            through_gate(&registry, TrafficClass::Own).is_some(),
            "closed again: the gate is open"
        );
        sup.stop(None);
    }

    /// A report through the inbox, as a permit through the gate sends it.
    fn gate_report(class: crate::policy::outcome::OutcomeClass) -> OutcomeReport {
        OutcomeReport {
            model: "m".into(),
            ticket: Some(crate::policy::breaker::Ticket::through_gate(0)),
            outcome: outcome(class),
            traffic: TrafficClass::Own,
            dropped_in_flight: false,
        }
    }

    /// A started provider, settled, with its metrics, runtime and the
    /// running incarnation's inbox.
    async fn started_with_inbox() -> (
        ActorRef<SupervisorMsg>,
        Arc<Registry>,
        Arc<Metrics>,
        Arc<ProviderRuntime>,
        Arc<crate::actors::provider::Inbox>,
    ) {
        let metrics = Arc::new(Metrics::new());
        let (sup, registry) = start_with(metrics.clone()).await;
        settled(&registry).await;
        let runtime = registry.provider("a").unwrap().runtime.clone();
        let inbox = runtime.inbox().expect("the running incarnation's inbox");
        (sup, registry, metrics, runtime, inbox)
    }

    #[tokio::test]
    async fn reports_sent_before_the_actor_runs_ride_on_one_message_in_order() {
        use crate::policy::outcome::OutcomeClass;
        let (sup, registry, metrics, runtime, inbox) = started_with_inbox().await;
        let messages = || metrics.actor_calls().report.get();
        // This test's runtime has one thread: the actor runs only once the
        // test awaits, so all five wait in the inbox.
        inbox.push(gate_report(OutcomeClass::Ok));
        for _ in 0..4 {
            inbox.push(gate_report(OutcomeClass::ServerError));
        }
        settled(&registry).await;
        assert_eq!(messages(), 1, "five reports, one message");
        assert_eq!(runtime.snapshot().models["m"].calls, 5);
        assert!(
            through_gate(&registry, TrafficClass::Own).is_some(),
            "four failures in a row: still closed"
        );
        // A fifth failure in a row trips it only if the success was folded
        // first, as it was sent.
        inbox.push(gate_report(OutcomeClass::ServerError));
        settled(&registry).await;
        assert_eq!(messages(), 2);
        assert!(
            through_gate(&registry, TrafficClass::Own).is_none(),
            "five failures in a row after the success: open"
        );
        sup.stop(None);
    }

    #[tokio::test]
    async fn past_a_full_inbox_a_report_is_cast_on_its_own_and_none_is_lost() {
        use crate::actors::provider::INBOX_MAX;
        use crate::policy::outcome::OutcomeClass;
        let (sup, registry, metrics, runtime, inbox) = started_with_inbox().await;
        for _ in 0..INBOX_MAX + 3 {
            inbox.push(gate_report(OutcomeClass::Ok));
        }
        settled(&registry).await;
        assert_eq!(
            metrics.actor_calls().report.get(),
            4,
            "one message for the full inbox, one for each report past it"
        );
        assert_eq!(runtime.snapshot().models["m"].calls, (INBOX_MAX + 3) as u64);
        sup.stop(None);
    }

    #[tokio::test]
    async fn killed_router_is_restarted() {
        let (sup, registry) = start().await;
        let old = registry.router().unwrap();
        old.kill();
        for _ in 0..1000 {
            if registry.router().unwrap().get_id() != old.get_id() {
                sup.stop(None);
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("router actor was not restarted");
    }

    #[test]
    fn restart_cap_counts_within_the_window() {
        let mut log = RestartLog::default();
        let now = Instant::now();
        for _ in 0..MAX_RESTARTS {
            assert!(log.allow(now));
        }
        assert!(
            !log.allow(now),
            "one restart past the cap within a window is refused"
        );
        assert!(
            log.allow(now + RESTART_WINDOW + Duration::from_secs(1)),
            "the window moves on"
        );
    }
}
