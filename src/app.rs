//! Assembly: builds provider runtimes, starts the supervisor (and with it the
//! provider and router actors), and serves the gRPC and admin listeners until
//! told to stop. Shutdown runs in phases (see [`Running::shutdown`]).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use ractor::{Actor, ActorRef};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;

use crate::actors::provider::ProviderRuntime;
use crate::actors::registry::Registry;
use crate::actors::supervisor::{Supervisor, SupervisorArgs, SupervisorMsg};
use crate::api::admin_http::{self, AdminState};
use crate::api::auth::Authenticator;
use crate::api::router_service::RouterService;
use crate::config::{Config, ConfigError};
use crate::dispatch::Dispatcher;
use crate::idempotency::IdempotencyStore;
use crate::proto;
use crate::telemetry::metrics::Metrics;

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
}

/// Reads the PEM files named by `[server.tls]`.
fn tls_config(
    tls: &crate::config::TlsConfig,
) -> Result<tonic::transport::ServerTlsConfig, StartError> {
    let read = |field: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| StartError::Tls(format!("{field}: cannot read {}: {e}", path.display())))
    };
    let identity =
        tonic::transport::Identity::from_pem(read("cert", &tls.cert)?, read("key", &tls.key)?);
    let mut cfg = tonic::transport::ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &tls.client_ca {
        cfg = cfg.client_ca_root(tonic::transport::Certificate::from_pem(read(
            "client_ca",
            ca,
        )?));
    }
    Ok(cfg)
}

/// A running server.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub registry: Arc<Registry>,
    dispatcher: Arc<Dispatcher>,
    drain_timeout: std::time::Duration,
    supervisor: ActorRef<SupervisorMsg>,
    supervisor_done: JoinHandle<()>,
    stop: CancellationToken,
    ready: Arc<AtomicBool>,
    health: tonic_health::server::HealthReporter,
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    admin: JoinHandle<std::io::Result<()>>,
}

fn runtimes(config: &Config) -> Result<HashMap<String, Arc<ProviderRuntime>>, ConfigError> {
    config
        .providers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            ProviderRuntime::new(p)
                .map(|rt| (p.id.clone(), Arc::new(rt)))
                .map_err(|e| ConfigError {
                    path: format!("providers[{i}].api_key_env"),
                    message: e.to_string(),
                })
        })
        .collect()
}

/// Starts actors and listeners; returns once both listeners are bound.
pub async fn start(config: Config) -> Result<Running, StartError> {
    config.validate()?;
    let config = Arc::new(config);
    let registry = Arc::new(Registry::default());
    let metrics = Arc::new(Metrics::new());
    let (supervisor, supervisor_handle) = Actor::spawn(
        None,
        Supervisor,
        SupervisorArgs {
            config: config.clone(),
            registry: registry.clone(),
            runtimes: runtimes(&config)?,
            metrics: metrics.clone(),
        },
    )
    .await
    .map_err(|e| StartError::Actors(e.to_string()))?;
    let supervisor_done = tokio::spawn(async move {
        let _ = supervisor_handle.await;
    });

    let dispatcher = Arc::new(Dispatcher::new(
        registry.clone(),
        metrics.clone(),
        IdempotencyStore::new(config.idempotency.ttl, config.idempotency.max_entries),
        config.backoff.clone(),
        config.server.default_deadline,
    ));
    let auth = Authenticator::from_config(&config.auth)?;
    if auth.is_open() {
        tracing::warn!("auth.mode = \"open\": callers are not authenticated and their `tenant` field is trusted (local use only)");
    }
    let router = RouterService::new(
        dispatcher.clone(),
        config.server.stream_buffer,
        config.limits.clone(),
    );
    let router = tonic::service::interceptor::InterceptedService::new(
        proto::router_server::RouterServer::new(router)
            .max_decoding_message_size(config.limits.max_request_bytes),
        move |req| auth.check(req),
    );
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<proto::router_server::RouterServer<RouterService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| StartError::Actors(format!("reflection: {e}")))?;

    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })
    };
    let grpc_listener = bind(config.server.grpc_listen).await?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            addr: config.server.grpc_listen,
            source,
        })?;
    let admin_listener = bind(config.server.admin_listen).await?;
    let admin_addr = admin_listener
        .local_addr()
        .map_err(|source| StartError::Bind {
            addr: config.server.admin_listen,
            source,
        })?;

    let stop = CancellationToken::new();
    let incoming = TcpIncoming::from(grpc_listener).with_nodelay(Some(true));
    let grpc_stop = stop.clone();
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = &config.server.tls {
        server = server
            .tls_config(tls_config(tls)?)
            .map_err(|e| StartError::Tls(e.to_string()))?;
    }
    let grpc = tokio::spawn(
        server
            .add_service(health_service)
            .add_service(reflection)
            .add_service(router)
            .serve_with_incoming_shutdown(incoming, async move { grpc_stop.cancelled().await }),
    );

    let ready = Arc::new(AtomicBool::new(true));
    let admin_router = admin_http::router(AdminState {
        registry: registry.clone(),
        ready: ready.clone(),
        metrics: metrics.clone(),
    });
    let admin_stop = stop.clone();
    let admin = tokio::spawn(async move {
        use axum::serve::ListenerExt;
        let listener = admin_listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        axum::serve(listener, admin_router)
            .with_graceful_shutdown(async move { admin_stop.cancelled().await })
            .await
    });

    Ok(Running {
        grpc_addr,
        admin_addr,
        registry,
        dispatcher,
        drain_timeout: config.server.drain_timeout,
        supervisor,
        supervisor_done,
        stop,
        ready,
        health,
        grpc,
        admin,
    })
}

impl Running {
    /// Resolves if the supervisor gave up (restart cap reached).
    pub async fn supervisor_exited(&mut self) {
        let _ = (&mut self.supervisor_done).await;
    }

    /// Stops the server, in phases:
    /// 1. readiness and gRPC health go NOT_SERVING;
    /// 2. the gRPC listener stops accepting (connections get GOAWAY); in-flight
    ///    calls run on for up to `drain_timeout`;
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
        let active = self.dispatcher.active.load(Ordering::Relaxed);
        tracing::info!(active, drain_timeout = ?self.drain_timeout, "draining");
        if tokio::time::timeout(self.drain_timeout, &mut self.grpc)
            .await
            .is_err()
        {
            let left = self.dispatcher.active.load(Ordering::Relaxed);
            tracing::warn!(
                left,
                "drain timeout passed; ending the remaining calls with UNAVAILABLE"
            );
            self.dispatcher.abort.cancel();
            if tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.grpc)
                .await
                .is_err()
            {
                self.grpc.abort();
            }
        }
        let _ = self.admin.await;
        self.supervisor.stop(None);
        let _ = self.supervisor_done.await;
        tracing::info!("stopped");
    }
}
