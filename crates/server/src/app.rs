//! Assembly: builds provider runtimes, starts the supervisor (and with it the
//! provider and router actors), and serves the gRPC, admin and (optional)
//! HTTP-door listeners until told to stop. Shutdown runs in
//! phases (see [`Running::shutdown`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use ractor::{Actor, ActorRef};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::actors::recovery::RecoveryArgs;
use crate::actors::registry::Registry;
use crate::actors::supervisor::{Supervisor, SupervisorArgs, SupervisorMsg};
use crate::api::admin::{AdminAccess, AdminService};
use crate::api::admin_http::{self, AdminState};
use crate::api::auth::Authenticator;
use crate::api::door::{self, HttpState};
use crate::api::intake::Intake;
use crate::api::listener;
use crate::api::router_service::RouterService;
use crate::config::AuthMode;
use crate::config::{Config, ConfigError};
use crate::proto;
use crate::reload::{runtimes, Reloader};
use crate::semantic::SemanticCache;
use crate::state::cache::ResponseCache;
use crate::state::jobs::Jobs;
use crate::state::validation::store::ValidationStore;
use crate::task::{Parts, Tasks};
use crate::telemetry::metrics::Metrics;
use crate::tls::{self, TlsState};

/// Starting the service failed.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the actors: {0}")]
    Actors(String),
    #[error("server.tls: {0}")]
    Tls(String),
    #[error("queue.path: {0}")]
    Queue(String),
    #[error("{0}")]
    State(String),
}

/// A running server.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    /// The OpenAI-compatible HTTP listener, when `server.http_listen` is set.
    pub http_addr: Option<SocketAddr>,
    pub registry: Arc<Registry>,
    pub reloader: Arc<Reloader>,
    tasks: Arc<Tasks>,
    drain_timeout: std::time::Duration,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_done: JoinHandle<()>,
    stop: CancellationToken,
    ready: Arc<AtomicBool>,
    health: tonic_health::server::HealthReporter,
    grpc: JoinHandle<()>,
    admin: JoinHandle<()>,
    http: Option<JoinHandle<()>>,
}

/// Whether some route has a target that can take traffic now.
fn any_route_can_serve(config: &Config, registry: &Registry) -> bool {
    let now = tokio::time::Instant::now();
    config.routes.iter().any(|r| {
        r.targets.iter().chain(r.downshift.iter()).any(|t| {
            let Some((provider, model)) = t.target.split_once('/') else {
                return false;
            };
            registry
                .provider(provider)
                .is_some_and(|p| p.runtime.snapshot().unavailable_for(model, now).is_none())
        })
    })
}

/// Every 10 s: drops semantic cache answers past their TTL and the routes
/// the config in force no longer caches, and updates the size gauges.
async fn sweep_semantic(
    reloader: Arc<Reloader>,
    semantic: Arc<SemanticCache>,
    metrics: Arc<crate::telemetry::metrics::Metrics>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(10)) => {}
        }
        let Some(config) = reloader.config() else {
            continue;
        };
        for (route, entries, bytes) in semantic.sweep(&config, tokio::time::Instant::now()) {
            metrics.semantic.set_size(route, entries, bytes);
        }
    }
}

/// Keeps readiness (gRPC health of the Router service and `/readyz`) in step
/// with whether any route can serve; draining overrides it.
async fn readiness(
    reloader: Arc<Reloader>,
    registry: Arc<Registry>,
    health: tonic_health::server::HealthReporter,
    routable: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_millis(500)) => {}
        }
        let Some(config) = reloader.current.lock().ok().map(|c| c.clone()) else {
            continue;
        };
        let can = any_route_can_serve(&config, &registry);
        if can != routable.swap(can, Ordering::Relaxed) {
            if stop.is_cancelled() {
                return;
            }
            if can {
                tracing::info!("a route can serve again: ready");
                health
                    .set_serving::<proto::router_server::RouterServer<RouterService>>()
                    .await;
            } else {
                tracing::warn!("no route has a target that can take traffic: not ready");
                health
                    .set_not_serving::<proto::router_server::RouterServer<RouterService>>()
                    .await;
            }
        }
    }
}

/// Starts the service, in phases: the stores and the request path, the
/// actors, the listeners (bound before anything is served), then the gRPC,
/// admin and HTTP servers and the watchers. Returns once every listener is
/// bound. `config_path` is the file to reload from (SIGHUP, changes, the
/// Admin API).
pub async fn start(config: Config, config_path: Option<PathBuf>) -> Result<Running, StartError> {
    config.validate()?;
    let initial_digest: [u8; 32] = config_path
        .as_ref()
        .and_then(|p| std::fs::read(p).ok())
        .map(|t| Sha256::digest(&t).into())
        .unwrap_or_default();
    let config = Arc::new(config);
    let core = Core::start(&config).await?;
    let listeners = Listeners::bind(&config).await?;
    let stop = CancellationToken::new();
    let tls = match &config.server.tls {
        Some(t) => Some(TlsState::new(tls::load(t).map_err(StartError::Tls)?)),
        None => None,
    };
    let reloader = Arc::new(Reloader {
        path: config_path,
        supervisor: core.supervisor.clone(),
        last_seen: Mutex::new(initial_digest),
        current: Mutex::new(config.clone()),
        tls: tls.clone(),
    });
    tokio::spawn(core.validations.clone().watch(stop.clone()));
    tokio::spawn(sweep_semantic(
        reloader.clone(),
        core.semantic.clone(),
        core.metrics.clone(),
        stop.clone(),
    ));
    let auth = Authenticator::from_config(&config.auth)?;
    if auth.is_open() {
        tracing::warn!("auth.mode = \"open\": callers are not authenticated and their `tenant` field is trusted (local use only)");
    }
    let caps = connection_caps(&config);
    let (grpc, health) = serve_grpc(
        &config,
        &core,
        &reloader,
        auth.clone(),
        tls,
        (listeners.grpc, caps.grpc),
        stop.clone(),
    )
    .await?;
    let ready = Arc::new(AtomicBool::new(true));
    let routable = Arc::new(AtomicBool::new(true));
    let admin_router = admin_http::router(AdminState {
        registry: core.registry.clone(),
        ready: ready.clone(),
        routable: routable.clone(),
        jobs: core.jobs.clone(),
        metrics: core.metrics.clone(),
        limits: core.limits.clone(),
    });
    let bounds = |name, max_connections| listener::Bounds {
        name,
        max_connections,
        header_read_timeout: config.server.header_read_timeout,
        idle_timeout: config.server.connection_idle_timeout,
        body: listener::BodyPace {
            read_timeout: config.server.body_read_timeout,
            min_rate: config.server.body_min_rate,
        },
        drain_timeout: config.server.drain_timeout,
    };
    let admin = tokio::spawn({
        let (metrics, stop) = (core.metrics.clone(), stop.clone());
        let bounds = bounds("admin", caps.admin);
        async move {
            listener::serve_http(listeners.admin, admin_router.into(), bounds, &metrics, stop).await
        }
    });
    let http = listeners.http.map(|http| {
        let state = HttpState::new(core.intake.clone(), auth, reloader.clone())
            .with_responses(core.responses.clone());
        let router = door::router(Arc::new(state));
        let (metrics, stop) = (core.metrics.clone(), stop.clone());
        let bounds = bounds("http", caps.http);
        tokio::spawn(
            async move { listener::serve_http(http, router, bounds, &metrics, stop).await },
        )
    });
    if config.server.watch_config {
        tokio::spawn(reloader.clone().watch(stop.clone()));
    }
    tokio::spawn(readiness(
        reloader.clone(),
        core.registry.clone(),
        health.clone(),
        routable,
        stop.clone(),
    ));
    Ok(Running {
        grpc_addr: listeners.grpc_addr,
        admin_addr: listeners.admin_addr,
        http_addr: listeners.http_addr,
        registry: core.registry,
        reloader,
        tasks: core.tasks,
        drain_timeout: config.server.drain_timeout,
        supervisor: core.supervisor,
        supervisor_done: core.supervisor_done,
        stop,
        ready,
        health,
        grpc,
        admin,
        http,
    })
}

/// The configured connection caps, fitted to the open-file limit with room
/// kept for the process and one descriptor per upstream permit.
fn connection_caps(config: &Config) -> listener::Caps {
    let s = &config.server;
    let configured = listener::Caps {
        grpc: s.max_connections,
        http: if s.http_listen.is_some() {
            s.http_max_connections
        } else {
            0
        },
        admin: s.admin_max_connections,
    };
    let upstream: u64 = config
        .providers
        .iter()
        .map(|p| u64::from(p.max_concurrency))
        .sum();
    listener::fit_to_this_process(configured, upstream)
}

/// The request path and the actors behind it.
struct Core {
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
    tasks: Arc<Tasks>,
    /// The semantic cache the request tasks fill (swept in the background).
    semantic: Arc<SemanticCache>,
    intake: Arc<Intake>,
    jobs: Option<Arc<Jobs>>,
    /// Stored Responses API responses.
    responses: Arc<crate::state::responses::ResponseStore>,
    /// The golden-set validations (`Admin.RecordValidation`, `[golden] record`).
    validations: Arc<ValidationStore>,
    /// Every key's rate windows (shown by the status surfaces).
    limits: Arc<crate::state::limits::KeyLimits>,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_done: JoinHandle<()>,
}

impl Core {
    /// The stores `[state]` names, the request tasks and the intake, then the
    /// supervisor with its provider, router and recovery actors.
    async fn start(config: &Arc<Config>) -> Result<Core, StartError> {
        let registry = Arc::new(Registry::default());
        let metrics = Arc::new(Metrics::new());
        let stores = crate::state::assemble::build(config, &metrics).map_err(StartError::State)?;
        if let Some(redis) = stores.redis.clone() {
            tokio::spawn(async move { crate::state::assemble::check_persistence(&redis).await });
        }
        let jobs = match &config.queue {
            Some(q) => Some(
                crate::state::assemble::open_jobs(q, stores.redis.as_ref(), &metrics)
                    .await
                    .map_err(StartError::Queue)?,
            ),
            None => None,
        };
        let responses = stores.responses.clone();
        let limits = stores.limits.clone();
        let semantic = SemanticCache::new();
        let tasks = Arc::new(Tasks::new(Parts {
            registry: registry.clone(),
            metrics: metrics.clone(),
            idempotency: stores.idempotency.clone(),
            cache: ResponseCache::new(config.cache.max_bytes),
            semantic: semantic.clone(),
            cost: stores.cost.clone(),
            affinity: stores.affinity.clone(),
            limits: stores.limits.clone(),
            backoff: config.backoff.clone(),
            default_deadline: config.server.default_deadline,
            jobs: jobs.clone(),
            journal: stores.journal.clone(),
            journaling: config.resume.enabled,
            journal_streams: config.resume.max_streams,
            journal_lease: config.state.lease,
            reason: crate::api::errors::reason,
            decode: crate::api::convert::stored_request(config.limits.clone()),
        }));
        let intake = Intake::new(
            tasks.clone(),
            stores.tenants,
            config.limits.clone(),
            crate::sink::SendLimits {
                buffer: config.server.stream_buffer,
                send_timeout: config.server.send_timeout,
                max_recorded_bytes: config.limits.max_recorded_bytes,
            },
        );
        let recovery = match (&jobs, &config.queue) {
            (Some(jobs), Some(q)) => Some(RecoveryArgs {
                runner: crate::api::jobs::runner(jobs.clone(), intake.clone(), q.drain.clone()),
                drain: q.drain.clone(),
                max_running: (q.drain.burst as usize).max(1),
            }),
            _ => None,
        };
        let (supervisor, supervisor_handle) = Actor::spawn(
            None,
            Supervisor,
            SupervisorArgs {
                config: config.clone(),
                registry: registry.clone(),
                runtimes: runtimes(config)?,
                metrics: metrics.clone(),
                recovery,
            },
        )
        .await
        .map_err(|e| StartError::Actors(e.to_string()))?;
        let supervisor_done = tokio::spawn(async move {
            let _ = supervisor_handle.await;
        });
        let published = registry.clone();
        let validations = ValidationStore::open(
            Box::new(move |records| published.set_validations(records)),
            config.golden.as_ref().map(|g| g.record.clone()),
        )
        .await;
        Ok(Core {
            registry,
            metrics,
            tasks,
            semantic,
            intake,
            jobs,
            responses,
            validations,
            limits,
            supervisor,
            supervisor_done,
        })
    }
}

/// Every listener, bound (ephemeral ports resolved) before anything serves.
struct Listeners {
    grpc: TcpListener,
    grpc_addr: SocketAddr,
    admin: TcpListener,
    admin_addr: SocketAddr,
    http: Option<TcpListener>,
    http_addr: Option<SocketAddr>,
}

impl Listeners {
    async fn bind(config: &Config) -> Result<Listeners, StartError> {
        let (grpc, grpc_addr) = bind(config.server.grpc_listen).await?;
        let (admin, admin_addr) = bind(config.server.admin_listen).await?;
        let (http, http_addr) = match config.server.http_listen {
            Some(addr) => {
                let (l, a) = bind(addr).await?;
                (Some(l), Some(a))
            }
            None => (None, None),
        };
        Ok(Listeners {
            grpc,
            grpc_addr,
            admin,
            admin_addr,
            http,
            http_addr,
        })
    }
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })?;
    Ok((listener, local))
}

/// Who may call the Admin API.
fn admin_access(config: &Config) -> Result<AdminAccess, StartError> {
    Ok(match &config.admin.token_env {
        Some(env) => {
            let token = std::env::var(env).map_err(|_| ConfigError {
                path: "admin.token_env".into(),
                message: format!("environment variable {env} is not set"),
            })?;
            AdminAccess::Token(Authenticator::single("admin", &token))
        }
        None if config.auth.mode == AuthMode::Open => AdminAccess::Open,
        None => AdminAccess::Disabled,
    })
}

type GrpcTask = JoinHandle<()>;

/// What server reflection describes: Switchyard's services, gRPC health,
/// both reflection services, and the `google.rpc` error details
/// (`ErrorInfo`, `RetryInfo`, ...) every error carries, so a reflection
/// client (grpcurl) can decode them. Served as `grpc.reflection.v1` and as
/// `v1alpha` (grpcurl 1.8 and other older clients).
fn reflection_set() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

/// The gRPC server (`api::grpc_server`): Router (the caller's token checked
/// there), and by path health, reflection and Admin (behind the admin
/// interceptor), all under the size limits; TLS terminated here so
/// certificates can be reloaded.
async fn serve_grpc(
    config: &Config,
    core: &Core,
    reloader: &Arc<Reloader>,
    auth: Authenticator,
    tls: Option<Arc<TlsState>>,
    (listener, max_connections): (TcpListener, usize),
    stop: CancellationToken,
) -> Result<(GrpcTask, tonic_health::server::HealthReporter), StartError> {
    let router = proto::router_server::RouterServer::new(RouterService::new(core.intake.clone()))
        .max_decoding_message_size(config.limits.max_request_bytes);
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<proto::router_server::RouterServer<RouterService>>()
        .await;
    let reflection_error = |e| StartError::Actors(format!("reflection: {e}"));
    let reflection = reflection_set().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection_set().build_v1alpha().map_err(reflection_error)?;
    let admin_access = admin_access(config)?;
    let admin_service = tonic::service::interceptor::InterceptedService::new(
        proto::admin_server::AdminServer::new(AdminService::new(
            core.registry.clone(),
            reloader.clone(),
            core.validations.clone(),
            core.limits.clone(),
        )),
        move |req| admin_access.check(req),
    );
    let others = tonic::service::Routes::new(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(admin_service);
    let service = crate::api::grpc_server::GrpcService::new(
        router,
        auth,
        others,
        config.limits.max_request_bytes,
        config.limits.max_metadata_bytes,
    );
    let accepted = listener::capped(
        listener,
        max_connections,
        config.server.header_read_timeout,
        &core.metrics,
        stop.clone(),
    );
    let task = match tls {
        Some(tls) => {
            let incoming = tls::incoming(accepted, tls, stop.clone());
            tokio::spawn(crate::api::grpc_server::serve(incoming, service, stop))
        }
        None => tokio::spawn(crate::api::grpc_server::serve(accepted, service, stop)),
    };
    Ok((task, health))
}

impl Running {
    /// Resolves if the supervisor gave up (restart cap reached).
    pub async fn supervisor_exited(&mut self) {
        let _ = (&mut self.supervisor_done).await;
    }

    /// Stops the server, in phases:
    /// 1. readiness and gRPC health go NOT_SERVING;
    /// 2. the gRPC and HTTP listeners stop accepting (gRPC connections get
    ///    GOAWAY); in-flight calls run on for up to `drain_timeout`;
    /// 3. calls still running then end with UNAVAILABLE (SERVER_DRAINING);
    /// 4. the admin listener and the actors stop; queued work stays queued.
    pub async fn shutdown(mut self) {
        self.ready.store(false, Ordering::Relaxed);
        self.health
            .set_not_serving::<proto::router_server::RouterServer<RouterService>>()
            .await;
        self.health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        self.stop.cancel();
        let drain_started = tokio::time::Instant::now();
        let active = self.tasks.running();
        tracing::info!(active, drain_timeout = ?self.drain_timeout, "draining");
        if tokio::time::timeout(self.drain_timeout, &mut self.grpc)
            .await
            .is_err()
        {
            let left = self.tasks.running();
            tracing::warn!(
                left,
                "drain timeout passed; ending the remaining calls with UNAVAILABLE"
            );
            self.tasks.abort_all();
            if tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.grpc)
                .await
                .is_err()
            {
                self.grpc.abort();
            }
        }
        if let Some(mut http) = self.http.take() {
            let left = self.drain_timeout.saturating_sub(drain_started.elapsed());
            if tokio::time::timeout(left, &mut http).await.is_err() {
                self.tasks.abort_all();
                if tokio::time::timeout(std::time::Duration::from_secs(5), &mut http)
                    .await
                    .is_err()
                {
                    http.abort();
                }
            }
        }
        let _ = self.admin.await;
        self.supervisor.stop(None);
        let _ = self.supervisor_done.await;
        tracing::info!("stopped");
    }
}
