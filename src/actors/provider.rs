//! The provider actor: one per provider. It owns the provider's control state
//! (concurrency ceilings, per-model outcome tallies; breakers and health join
//! here) and answers admissions with permits that live as long as the stream.
//! It never awaits I/O in `handle`: the HTTP attempt runs in the request task.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::{ModelConfig, ProviderConfig, ProviderKind};
use crate::policy::outcome::OutcomeClass;

/// An API key: never printed, never logged.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(value)
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Whether a request is the provider's own traffic (it is the route's first
/// target) or traffic failing over to it, which has a lower ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrafficClass {
    Own,
    Failover,
}

impl TrafficClass {
    pub fn as_str(self) -> &'static str {
        match self {
            TrafficClass::Own => "own",
            TrafficClass::Failover => "failover",
        }
    }
}

/// What request tasks need to talk to a provider: immutable settings, the
/// pooled HTTP client and the concurrency semaphores. Shared by every
/// incarnation of the provider's actor, so a restart never loses or leaks permits.
#[derive(Debug)]
pub struct ProviderRuntime {
    pub id: String,
    pub kind: ProviderKind,
    pub base_url: String,
    pub api_key: Option<Secret>,
    pub models: Vec<ModelConfig>,
    pub connect_timeout: Duration,
    pub first_token_timeout: Duration,
    pub idle_timeout: Duration,
    pub http: reqwest::Client,
    /// All traffic.
    total: Arc<Semaphore>,
    /// Failover traffic (also holds a `total` permit).
    failover: Arc<Semaphore>,
    pub max_concurrency: u32,
    pub failover_max_concurrency: u32,
}

/// Building a provider runtime failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("environment variable {0} (api_key_env) is not set")]
    MissingKey(String),
    #[error("cannot build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

impl ProviderRuntime {
    /// Builds the runtime from config, reading the API key from its environment variable.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, RuntimeError> {
        let api_key = match &cfg.api_key_env {
            Some(env) => Some(Secret::new(
                std::env::var(env).map_err(|_| RuntimeError::MissingKey(env.clone()))?,
            )),
            None => None,
        };
        // One retry layer only: reqwest never retries on its own, and we neither
        // follow redirects nor decompress (bytes pass through as sent).
        let http = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        Ok(ProviderRuntime {
            id: cfg.id.clone(),
            kind: cfg.kind,
            base_url: cfg.base_url.clone(),
            api_key,
            models: cfg.models.clone(),
            connect_timeout: cfg.connect_timeout,
            first_token_timeout: cfg.first_token_timeout,
            idle_timeout: cfg.idle_timeout,
            http,
            total: Arc::new(Semaphore::new(cfg.max_concurrency as usize)),
            failover: Arc::new(Semaphore::new(cfg.failover_max_concurrency as usize)),
            max_concurrency: cfg.max_concurrency,
            failover_max_concurrency: cfg.failover_max_concurrency,
        })
    }

    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }

    /// Requests in flight now, all traffic.
    pub fn in_flight(&self) -> usize {
        self.max_concurrency as usize - self.total.available_permits()
    }

    /// Failover requests in flight now.
    pub fn failover_in_flight(&self) -> usize {
        self.failover_max_concurrency as usize - self.failover.available_permits()
    }

    fn try_acquire(&self, class: TrafficClass) -> Option<Permit> {
        let failover = match class {
            TrafficClass::Own => None,
            TrafficClass::Failover => Some(self.failover.clone().try_acquire_owned().ok()?),
        };
        let total = self.total.clone().try_acquire_owned().ok()?;
        Some(Permit {
            _total: total,
            _failover: failover,
            class,
        })
    }
}

/// Admission to send one attempt. Dropping it frees the slot, so it must live
/// as long as the upstream stream.
#[derive(Debug)]
pub struct Permit {
    _total: OwnedSemaphorePermit,
    _failover: Option<OwnedSemaphorePermit>,
    pub class: TrafficClass,
}

/// Why the provider would not take an attempt now. A local decision: it never
/// counts against the provider's health.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("provider is at its {} concurrency ceiling", .0.as_str())]
    Saturated(TrafficClass),
    #[error("provider does not serve model `{0}`")]
    UnknownModel(String),
}

/// One attempt's classified outcome, reported once by the request task.
#[derive(Debug, Clone)]
pub struct OutcomeReport {
    pub model: String,
    pub class: OutcomeClass,
    pub traffic: TrafficClass,
    pub elapsed: Duration,
    pub ttft: Option<Duration>,
}

pub enum ProviderMsg {
    /// Ask for a permit for one attempt.
    Admit {
        model: String,
        class: TrafficClass,
        reply: RpcReplyPort<Result<Permit, Refusal>>,
    },
    /// The outcome of an attempt this actor admitted.
    Report(OutcomeReport),
    /// Snapshot of per-model tallies, for status surfaces and tests.
    Tallies(RpcReplyPort<HashMap<String, Tally>>),
    /// Test hook: make `handle` fail as a panicking actor would.
    #[cfg(test)]
    Crash,
}

/// Per-model outcome counts since this incarnation started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub successes: u64,
    pub failures: u64,
    pub excluded: u64,
}

/// The actor. `self` holds nothing; the runtime arrives as the argument.
pub struct ProviderActor;

/// Mutable state of one incarnation.
pub struct ProviderState {
    /// Shared I/O runtime and semaphores (outlive this incarnation).
    runtime: Arc<ProviderRuntime>,
    /// Outcome counts per model.
    tallies: HashMap<String, Tally>,
}

impl Actor for ProviderActor {
    type Msg = ProviderMsg;
    type State = ProviderState;
    type Arguments = Arc<ProviderRuntime>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        runtime: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(ProviderState {
            runtime,
            tallies: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProviderMsg::Admit {
                model,
                class,
                reply,
            } => {
                let answer = if state.runtime.model(&model).is_none() {
                    Err(Refusal::UnknownModel(model))
                } else {
                    state
                        .runtime
                        .try_acquire(class)
                        .ok_or(Refusal::Saturated(class))
                };
                // The requester may have given up; a dropped reply drops the permit.
                let _ = reply.send(answer);
            }
            ProviderMsg::Report(report) => {
                let tally = state.tallies.entry(report.model).or_default();
                if report.class.is_success() {
                    tally.successes += 1;
                } else if report.class.is_excluded() {
                    tally.excluded += 1;
                } else {
                    tally.failures += 1;
                }
            }
            ProviderMsg::Tallies(reply) => {
                let _ = reply.send(state.tallies.clone());
            }
            #[cfg(test)]
            ProviderMsg::Crash => return Err("crash requested by test".into()),
        }
        Ok(())
    }
}
