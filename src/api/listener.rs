//! Accepting connections under bounds, for every listener: a connection cap
//! (refused on accept, counted, and a throttled WARN), and for the HTTP
//! listeners (OpenAI door, admin) a header-read timeout, an idle timeout
//! measured in requests (a connection with no request in flight for
//! `connection_idle_timeout` is closed, however many bytes it trickles), and
//! a shutdown bounded by the drain timeout plus a 2 s grace (a half-sent
//! request does not hold SIGTERM). The gRPC listener gets the cap through [`capped`].

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use futures_util::Stream;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::telemetry::metrics::{ListenerLabels, Metrics};

/// A listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// `grpc`, `http` or `admin` (metric label, logs).
    pub name: &'static str,
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers (HTTP/1).
    pub header_read_timeout: Duration,
    /// A connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
    /// On shutdown, connections still open after this are cut.
    pub drain_timeout: Duration,
}

/// The connection cap of one listener, with its metrics.
#[derive(Clone)]
struct Gate {
    name: &'static str,
    permits: Arc<Semaphore>,
    open: Gauge,
    refused: Counter,
    /// When the last WARN went out, and how many were refused since.
    warned: Arc<Mutex<(Option<Instant>, u64)>>,
}

/// How long after the drain timeout open connections are cut.
const CUT_GRACE: Duration = Duration::from_secs(2);

/// How often a refused connection is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

impl Gate {
    fn new(name: &'static str, max: usize, metrics: &Metrics) -> Self {
        let labels = ListenerLabels { listener: name };
        Gate {
            name,
            permits: Arc::new(Semaphore::new(max)),
            open: metrics.connections.get_or_create(&labels).clone(),
            refused: metrics.connections_refused.get_or_create(&labels).clone(),
            warned: Arc::default(),
        }
    }

    /// A slot for a new connection, or `None` (counted and logged) at the cap.
    fn admit(&self, limit: usize) -> Option<Slot> {
        match self.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.open.inc();
                Some(Slot {
                    _permit: permit,
                    open: self.open.clone(),
                })
            }
            Err(_) => {
                self.refused.inc();
                self.warn(limit);
                None
            }
        }
    }

    fn warn(&self, limit: usize) {
        let Ok(mut w) = self.warned.lock() else {
            return;
        };
        w.1 += 1;
        let due = w.0.is_none_or(|at| at.elapsed() >= WARN_EVERY);
        if due {
            tracing::warn!(
                listener = self.name,
                limit,
                refused = w.1,
                "connection limit reached; new connections are closed on accept"
            );
            *w = (Some(Instant::now()), 0);
        }
    }
}

/// A connection's place under the cap; released when the connection closes.
struct Slot {
    _permit: OwnedSemaphorePermit,
    open: Gauge,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.open.dec();
    }
}

/// Accepts one connection, riding out descriptor exhaustion (EMFILE) with a
/// short pause instead of a hot loop.
async fn accept(listener: &TcpListener, name: &'static str) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                let _ = tcp.set_nodelay(true);
                return tcp;
            }
            Err(e) => {
                tracing::warn!(listener = name, error = %e, "accept failed; pausing");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves `router` on `listener` under `bounds` until `stop`, then gives
/// open connections until `bounds.drain_timeout` to finish and cuts the rest.
pub async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    bounds: Bounds,
    metrics: &Metrics,
    stop: CancellationToken,
) {
    let gate = Gate::new(bounds.name, bounds.max_connections, metrics);
    let mut connections = JoinSet::new();
    loop {
        let tcp = tokio::select! {
            _ = stop.cancelled() => break,
            tcp = accept(&listener, bounds.name) => tcp,
        };
        while connections.try_join_next().is_some() {}
        let Some(slot) = gate.admit(bounds.max_connections) else {
            continue;
        };
        connections.spawn(connection(tcp, router.clone(), bounds, stop.clone(), slot));
    }
    drop(listener);
    // The calls still running when the drain timeout passes are ended with
    // their error first (`Running::shutdown`); this grace lets that reach them.
    let drained = tokio::time::timeout(bounds.drain_timeout + CUT_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            listener = bounds.name,
            left = connections.len(),
            "drain timeout passed; closing the remaining connections"
        );
        connections.abort_all();
    }
}

/// What a connection is doing, for its idle timer.
#[derive(Default)]
struct Activity {
    /// Requests whose response has not ended.
    in_flight: AtomicUsize,
    /// Milliseconds from `since` to the last request's end.
    last_end_ms: AtomicU64,
}

/// Held by a request until its response body ends or is dropped.
struct InFlight {
    activity: Arc<Activity>,
    since: Instant,
}

impl InFlight {
    fn begin(activity: &Arc<Activity>, since: Instant) -> Self {
        activity.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            activity: activity.clone(),
            since,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let ms = self.since.elapsed().as_millis() as u64;
        self.activity.last_end_ms.store(ms, Ordering::Relaxed);
        self.activity.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Activity {
    /// No request in flight, and none ended within `idle`.
    fn idle(&self, since: Instant, idle: Duration) -> bool {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return false;
        }
        let last = Duration::from_millis(self.last_end_ms.load(Ordering::Relaxed));
        since.elapsed().saturating_sub(last) >= idle
    }
}

/// A response body that holds its request's [`InFlight`] until it ends.
struct Tracked {
    body: Body,
    _in_flight: InFlight,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

async fn connection(
    tcp: TcpStream,
    router: axum::Router,
    bounds: Bounds,
    stop: CancellationToken,
    slot: Slot,
) {
    let since = Instant::now();
    let activity = Arc::new(Activity::default());
    let tracked = activity.clone();
    let service =
        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let in_flight = InFlight::begin(&tracked, since);
            let mut router = router.clone();
            async move {
                let response = router.call(request.map(Body::new)).await?;
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    Body::new(Tracked {
                        body,
                        _in_flight: in_flight,
                    })
                }))
            }
        });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
    tokio::pin!(conn);
    let tick = (bounds.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut timer = tokio::time::interval(tick);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = stop.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            _ = timer.tick(), if !closing => {
                if activity.idle(since, bounds.idle_timeout) {
                    tracing::debug!(listener = bounds.name, "closing an idle connection");
                    // Nothing in flight: nothing to finish.
                    break;
                }
            }
        }
    }
    drop(slot);
}

/// A gRPC connection under the cap: the slot goes with the stream.
pub struct Capped<IO> {
    io: IO,
    _slot: Slot,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Capped<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Capped<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Capped<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The gRPC listener's connections under the cap, as tonic takes them
/// (plain TCP; TLS wraps each after its handshake in `tls::incoming`).
pub fn capped(
    listener: TcpListener,
    max_connections: usize,
    metrics: &Metrics,
    stop: CancellationToken,
) -> impl Stream<Item = std::io::Result<Capped<TcpStream>>> {
    let gate = Gate::new("grpc", max_connections, metrics);
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                _ = stop.cancelled() => return,
                tcp = accept(&listener, "grpc") => tcp,
            };
            let Some(slot) = gate.admit(max_connections) else {
                continue;
            };
            if tx
                .send(Ok(Capped {
                    io: tcp,
                    _slot: slot,
                }))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
