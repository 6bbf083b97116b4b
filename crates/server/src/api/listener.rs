//! Accepting connections under bounds, for every listener: a connection cap
//! (fitted to the open-file limit, `fds`; at the cap an HTTP listener closes
//! its quietest connection for the new one, else refuses it: `gate`), and
//! for the HTTP listeners (doors, admin) a header-read timeout that also
//! closes a connection sending no request at all, request bodies paced
//! (`pace`: a stalled or trickled body is answered 408 and the connection
//! closed), an idle timeout measured in requests (a connection with no
//! request in flight for `connection_idle_timeout` is closed, however many
//! bytes it trickles), and a shutdown bounded by the drain timeout plus a
//! 2 s grace. The gRPC listener gets the cap and the first-bytes timeout
//! through [`capped`]. An HTTP listener serves [`Routes`]: its path router,
//! and the hot calls a [`Direct`] answers before it.

mod fds;
mod gate;
mod pace;

pub use fds::{fit_to_this_process, open_file_limit, Caps};
pub use pace::{BodyPace, BodyTimedOut};

use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use futures_util::Stream;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower_service::Service;

use crate::telemetry::metrics::Metrics;
use gate::{Gate, InFlight, Slot};
use pace::Paced;

/// Where a request goes: answered without the path router, or on to it.
// Moved once, straight into a match: boxing the request would cost every
// call the router takes an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Dispatch {
    Answer(Pin<Box<dyn std::future::Future<Output = axum::response::Response> + Send>>),
    Router(axum::extract::Request),
}

/// The calls a listener answers before its path router: a door's
/// completions, which are most of its traffic. The router would match the
/// path, clone and box the route's service and insert its parameters for
/// each (measured: six allocations a call); the direct call boxes one future.
pub trait Direct: Send + Sync {
    /// The handler's answer for `request`, or the request for the router.
    fn call(&self, request: axum::extract::Request) -> Dispatch;
}

/// What a listener serves: its path router, and the calls it answers first.
#[derive(Clone)]
pub struct Routes {
    pub router: axum::Router,
    pub direct: Option<Arc<dyn Direct>>,
}

impl From<axum::Router> for Routes {
    fn from(router: axum::Router) -> Self {
        Routes {
            router,
            direct: None,
        }
    }
}

/// A listener's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// `grpc`, `http` or `admin` (metric label, logs).
    pub name: &'static str,
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers (HTTP/1), and
    /// to begin its first request at all.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight this long is closed.
    pub idle_timeout: Duration,
    /// How fast request bodies must arrive.
    pub body: BodyPace,
    /// On shutdown, connections still open after this are cut.
    pub drain_timeout: Duration,
}

/// How long after the drain timeout open connections are cut.
const CUT_GRACE: Duration = Duration::from_secs(2);

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

/// Serves `routes` on `listener` under `bounds` until `stop`, then gives
/// open connections until `bounds.drain_timeout` to finish and cuts the rest.
pub async fn serve_http(
    listener: TcpListener,
    routes: Routes,
    bounds: Bounds,
    metrics: &Metrics,
    stop: CancellationToken,
) {
    let gate = Gate::new(bounds.name, bounds.max_connections, true, metrics);
    let mut connections = JoinSet::new();
    loop {
        let tcp = tokio::select! {
            _ = stop.cancelled() => break,
            tcp = accept(&listener, bounds.name) => tcp,
        };
        while connections.try_join_next().is_some() {}
        let Some(slot) = gate.admit().await else {
            continue;
        };
        connections.spawn(connection(tcp, routes.clone(), bounds, stop.clone(), slot));
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

/// Whether a connection has been quiet too long: before its first request
/// the header-read timeout counts (a byte-less socket goes quickly), after
/// it the idle timeout.
fn too_quiet(slot: &Slot, bounds: &Bounds, now: Instant) -> bool {
    let Some(quiet) = slot.activity.quiet_since() else {
        return false;
    };
    let limit = if slot.activity.untouched() {
        bounds.header_read_timeout
    } else {
        bounds.idle_timeout
    };
    now.saturating_duration_since(quiet) >= limit
}

/// One HTTP request through `routes`: its body paced, its response body
/// tracked for the idle timer, and `connection: close` on an HTTP/1 answer
/// to a body that timed out (the rest of it is never read).
async fn handle(
    routes: Routes,
    request: http::Request<hyper::body::Incoming>,
    in_flight: InFlight,
    pace: BodyPace,
) -> Result<http::Response<Body>, std::convert::Infallible> {
    let http1 = request.version() < http::Version::HTTP_2;
    let timed_out = Arc::new(AtomicBool::new(false));
    let request = request.map(|b| Body::new(Paced::new(b, pace, timed_out.clone())));
    let direct = match &routes.direct {
        Some(d) => d.call(request),
        None => Dispatch::Router(request),
    };
    let mut response = match direct {
        Dispatch::Answer(answer) => answer.await,
        Dispatch::Router(request) => {
            let mut router = routes.router;
            router.call(request).await?
        }
    };
    if http1 && timed_out.load(Ordering::Relaxed) {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    Ok(response.map(|body| {
        Body::new(Tracked {
            body,
            _in_flight: in_flight,
        })
    }))
}

/// What ended a connection's serving, or asked it to end.
enum Turn {
    Served,
    Stop,
    Close,
    Idle,
}

async fn connection(
    tcp: TcpStream,
    routes: Routes,
    bounds: Bounds,
    stop: CancellationToken,
    slot: Slot,
) {
    let tracked = slot.activity.clone();
    let service =
        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let in_flight = InFlight::begin(&tracked);
            handle(routes.clone(), request, in_flight, bounds.body)
        });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
    tokio::pin!(conn);
    let shortest = bounds.idle_timeout.min(bounds.header_read_timeout);
    let tick = (shortest / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    // The connection wakes on every read and write of its requests (an
    // HTTP/1 request's whole future runs inside it); the shutdown token,
    // the close token and the idle timer are polled only when they fire.
    let turn = {
        let served = pin!(async {
            let _ = conn.as_mut().await;
            Turn::Served
        });
        let rare = pin!(async {
            let mut timer = tokio::time::interval(tick);
            let idle = async {
                loop {
                    timer.tick().await;
                    if too_quiet(&slot, &bounds, Instant::now()) {
                        return;
                    }
                }
            };
            tokio::select! {
                _ = stop.cancelled() => Turn::Stop,
                _ = slot.close.cancelled() => Turn::Close,
                _ = idle => Turn::Idle,
            }
        });
        crate::rare::unless(served, rare).await
    };
    match turn {
        Turn::Served => {}
        // Nothing in flight: nothing to finish.
        Turn::Idle => tracing::debug!(listener = bounds.name, "closing an idle connection"),
        Turn::Close if slot.activity.quiet_since().is_some() => {
            tracing::debug!(
                listener = bounds.name,
                "closing a quiet connection to make room"
            );
        }
        // Shutting down, or asked to make room while a request arrived:
        // what is in flight finishes first.
        Turn::Stop | Turn::Close => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.as_mut().await;
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

/// The gRPC listener's connections under the cap, as its server takes them
/// (plain TCP; TLS wraps each after its handshake in `tls::incoming`). A
/// connection that sends nothing within `first_bytes` (the header-read
/// timeout) is closed before the server ever sees it.
pub fn capped(
    listener: TcpListener,
    max_connections: usize,
    first_bytes: Duration,
    metrics: &Metrics,
    stop: CancellationToken,
) -> impl Stream<Item = std::io::Result<Capped<TcpStream>>> {
    let gate = Gate::new("grpc", max_connections, false, metrics);
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let tcp = tokio::select! {
                _ = stop.cancelled() => return,
                _ = tx.closed() => return,
                tcp = accept(&listener, "grpc") => tcp,
            };
            let Some(slot) = gate.admit().await else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut first = [0u8; 1];
                let peeked = tokio::time::timeout(first_bytes, tcp.peek(&mut first)).await;
                if let Ok(Ok(1..)) = peeked {
                    let _ = tx
                        .send(Ok(Capped {
                            io: tcp,
                            _slot: slot,
                        }))
                        .await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
