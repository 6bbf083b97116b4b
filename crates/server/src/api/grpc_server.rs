//! The gRPC listener's server: hyper's HTTP/2 server on each accepted
//! connection, set up as tonic's transport server set it up, and one
//! dispatch for every call. A call's metadata is held to
//! `limits.max_metadata_bytes` first ([`grpc_limits`]); the Router service's
//! calls (every request a caller sends) then have the caller's token checked
//! here and go to the service straight; every other service (health,
//! reflection, Admin) goes through tonic's path router. On stop each
//! connection is sent GOAWAY and its calls in flight run to their end; the
//! task ends when the last connection has closed.
//!
//! tonic's transport server wrapped every call in its own layers (a boxed
//! service cloned per call, the connection's address inserted into the
//! request's extensions, the request and response bodies boxed again, a
//! deadline timer the request's own deadline already keeps) and woke a
//! three-way `select!` on every poll of a connection: nine allocations a
//! gRPC unary call that this dispatch does not make (dhat, 83 -> 74;
//! `bench --scenario overhead` reports allocations per request).
//!
//! [`grpc_limits`]: super::grpc_limits

use std::convert::Infallible;
use std::pin::pin;

use futures_util::{Stream, StreamExt};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::body::Body;
use tower_service::Service;

use super::auth::{Authenticator, Tenant};
use super::errors::to_status;
use super::grpc_limits::{metadata_size, rewrite, H2_MAX_HEADER_LIST};
use super::router_service::RouterService;
use crate::error::RequestError;
use crate::proto::router_server::RouterServer;

/// The path prefix of the Router service's methods.
const ROUTER_PREFIX: &str = "/switchyard.v1.Router/";

/// What answers the gRPC listener's calls.
#[derive(Clone)]
pub struct GrpcService {
    router: RouterServer<RouterService>,
    /// Who may call the Router service.
    auth: Authenticator,
    /// Health, reflection and Admin, by path (with tonic's UNIMPLEMENTED
    /// for any other path).
    others: tonic::service::Routes,
    /// `limits.max_request_bytes`, for the refusal of a larger message.
    max_request: usize,
    /// `limits.max_metadata_bytes`.
    max_metadata: usize,
}

/// Where one call goes.
enum Dispatch<R, O> {
    Refused(http::Response<Body>),
    Router(R),
    Other(O),
}

impl GrpcService {
    pub fn new(
        router: RouterServer<RouterService>,
        auth: Authenticator,
        others: tonic::service::Routes,
        max_request: usize,
        max_metadata: usize,
    ) -> Self {
        GrpcService {
            router,
            auth,
            others: others.prepare(),
            max_request,
            max_metadata,
        }
    }

    /// One call's answer.
    fn answer(
        &self,
        mut request: http::Request<Incoming>,
    ) -> impl std::future::Future<Output = Result<http::Response<Body>, Infallible>> + Send + 'static
    {
        let size = metadata_size(request.headers());
        let dispatch = if size > self.max_metadata {
            let refusal = RequestError::MetadataTooLarge {
                size,
                limit: self.max_metadata,
            };
            Dispatch::Refused(to_status(&refusal).into_http())
        } else if request.uri().path().starts_with(ROUTER_PREFIX) {
            let authorization = request
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            match self.auth.authenticate(authorization) {
                Ok(tenant) => {
                    if let Some(tenant) = tenant {
                        request.extensions_mut().insert(Tenant(tenant));
                    }
                    Dispatch::Router(self.router.clone().call(request))
                }
                Err(e) => Dispatch::Refused(to_status(&e).into_http()),
            }
        } else {
            Dispatch::Other(self.others.clone().call(request))
        };
        let max_request = self.max_request;
        async move {
            let mut response = match dispatch {
                Dispatch::Refused(refusal) => return Ok(refusal),
                Dispatch::Router(call) => call.await?,
                Dispatch::Other(call) => call.await?,
            };
            rewrite(response.headers_mut(), max_request);
            Ok(response)
        }
    }
}

/// Serves `service` on every connection `incoming` yields until `stop`,
/// then lets the connections' calls finish (each connection is sent GOAWAY)
/// and returns when the last has closed. Aborting the returned future's task
/// closes them all.
pub async fn serve<IO>(
    incoming: impl Stream<Item = std::io::Result<IO>>,
    service: GrpcService,
    stop: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // As tonic's transport set it: no cap on a connection's concurrent
    // calls (hyper's own default is 200), and header blocks up to
    // H2_MAX_HEADER_LIST (a larger one resets the stream; below it a call
    // over `limits.max_metadata_bytes` gets a status of its own).
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(None)
        .max_header_list_size(H2_MAX_HEADER_LIST);
    let mut connections = JoinSet::new();
    {
        let mut incoming = pin!(incoming);
        loop {
            let io = tokio::select! {
                _ = stop.cancelled() => break,
                io = incoming.next() => match io {
                    Some(Ok(io)) => io,
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "gRPC accept failed");
                        continue;
                    }
                    None => break,
                },
            };
            while connections.try_join_next().is_some() {}
            connections.spawn(connection(
                io,
                service.clone(),
                builder.clone(),
                stop.clone(),
            ));
        }
    }
    while connections.join_next().await.is_some() {}
}

async fn connection<IO>(
    io: IO,
    service: GrpcService,
    builder: hyper::server::conn::http2::Builder<TokioExecutor>,
    stop: CancellationToken,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| service.answer(request));
    let mut conn = pin!(builder.serve_connection(TokioIo::new(io), service));
    // The connection wakes on every frame; the stop token is polled only
    // when it fires.
    let stopped = {
        let served = pin!(async {
            if let Err(e) = conn.as_mut().await {
                tracing::debug!(error = %e, "gRPC connection ended");
            }
            false
        });
        let stopping = pin!(async {
            stop.cancelled().await;
            true
        });
        crate::rare::unless(served, stopping).await
    };
    if stopped {
        conn.as_mut().graceful_shutdown();
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "gRPC connection ended while draining");
        }
    }
}
