//! One HTTP/2 connection to an upstream, spoken with the `h2` crate from
//! the attempt's own task. hyper's client sends an HTTP/2 request through
//! its connection task, which spawns a task to wait for the answer and,
//! when the window is not open on the first poll, another to pipe the
//! body; every answer then crosses a oneshot. Here the attempt opens the
//! stream itself, hands the whole body to h2 (which holds it until the
//! window opens), and polls the answer in place: the only task is the
//! connection's own, one per connection, not per request.
//!
//! Owns the connection's life: opened on first use through the client's
//! connector (TCP, TLS with ALPN, proxies' tunnels), reopened when h2 says
//! it is gone before a request is sent on it (the request is then sent on
//! the new one: nothing of it went out), opened by one request at a time
//! (those waiting on a connect that fails fail with its error, rather
//! than each connect again after it), and let go after
//! [`IDLE_TIMEOUT`] without a request, as hyper's pool did. An `https`
//! upstream whose ALPN picks HTTP/1.1 is remembered as such, and its
//! requests go back to hyper's pooled client.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::client::SendRequest;
use http::header::{CONNECTION, CONTENT_LENGTH, TE, TRANSFER_ENCODING, UPGRADE};
use http::uri::{Authority, Scheme};
use http::{HeaderMap, HeaderName, HeaderValue, Uri};
use http_body::Frame;
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::TokioIo;

use super::client::{BoxError, Connector, Error};

/// How long a connection is kept without a request (hyper's pool: 60 s).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// hyper's HTTP/2 client settings, kept so upstreams see what they saw.
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
const MAX_FRAME_SIZE: u32 = 16 * 1024;
const MAX_HEADER_LIST_SIZE: u32 = 16 * 1024;
const MAX_SEND_BUFFER: usize = 1024 * 1024;
const INITIAL_MAX_SEND_STREAMS: usize = 100;

/// The connection, opened when first needed.
pub struct H2Conn {
    connector: Connector,
    /// The origin it connects to.
    scheme: Scheme,
    authority: Authority,
    /// The connection's handle while open, when it last took a request,
    /// and its number (the connections opened before it).
    open: Mutex<Option<Open>>,
    opened: AtomicU64,
    /// Held while connecting, so concurrent requests wait for one connection.
    connecting: tokio::sync::Mutex<()>,
    /// Connects that failed, and the last one's error.
    failures: AtomicU64,
    failed: Mutex<Option<ConnectFailed>>,
    /// ALPN chose HTTP/1.1: requests go to hyper's pool.
    http1: AtomicBool,
}

impl std::fmt::Debug for H2Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Conn").finish_non_exhaustive()
    }
}

impl H2Conn {
    pub fn new(connector: Connector, scheme: Scheme, authority: Authority) -> Self {
        H2Conn {
            connector,
            scheme,
            authority,
            open: Mutex::new(None),
            opened: AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
            failures: AtomicU64::new(0),
            failed: Mutex::new(None),
            http1: AtomicBool::new(false),
        }
    }

    /// Whether a request to `uri` goes out here: its origin is this
    /// connection's, and that origin is not known to speak HTTP/1.1.
    pub fn serves(&self, uri: &Uri) -> bool {
        !self.http1.load(Ordering::Relaxed)
            && uri.scheme() == Some(&self.scheme)
            && uri.authority() == Some(&self.authority)
    }

    /// The open connection, ready for a request now: `None` when there
    /// is none, or h2 says it is gone (a connection closed while idle:
    /// nothing of the next request has gone out on it, which then goes
    /// out on a new one).
    pub fn ready(&self) -> Option<SendRequest<Bytes>> {
        let (mut sender, number) = self.current()?;
        // A clone with no stream pending open is never told to wait: this
        // only reads whether the connection has failed.
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match sender.poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => Some(sender),
            Poll::Ready(Err(_)) | Poll::Pending => {
                self.forget(number);
                None
            }
        }
    }

    /// Opens `request`'s stream on `sender` (its URI absolute) and hands
    /// h2 the whole `body`; the answer's head is the future's. Nothing is
    /// awaited here, so a stream's future holds only what this returns.
    pub fn start(
        mut sender: SendRequest<Bytes>,
        mut request: http::Request<()>,
        body: Bytes,
    ) -> Result<h2::client::ResponseFuture, Error> {
        strip_connection_headers(request.headers_mut());
        if !request.headers().contains_key(CONTENT_LENGTH) {
            request
                .headers_mut()
                .insert(CONTENT_LENGTH, content_length(body.len()));
        }
        let end = body.is_empty();
        let (answer, mut stream) = sender.send_request(request, end).map_err(Error::Stream)?;
        if !end {
            stream.send_data(body, true).map_err(Error::Stream)?;
        }
        Ok(answer)
    }

    /// The open connection's handle, unless it is idle past
    /// [`IDLE_TIMEOUT`] (then let go: requests in flight on it keep it
    /// until they end).
    fn current(&self) -> Option<(SendRequest<Bytes>, u64)> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match open.as_mut() {
            Some(o) if now.duration_since(o.used) < IDLE_TIMEOUT => {
                o.used = now;
                Some((o.sender.clone(), o.number))
            }
            _ => {
                *open = None;
                None
            }
        }
    }

    /// Once h2 says the open connection is gone (polled every few ms).
    #[cfg(test)]
    async fn closed(&self) {
        while self.ready().is_some() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Lets connection `number` go, unless another has replaced it.
    fn forget(&self, number: u64) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.as_ref().is_some_and(|o| o.number == number) {
            *open = None;
        }
    }

    /// A new connection (or the one a concurrent request has just
    /// opened); `None` when ALPN chose HTTP/1.1, and the request goes to
    /// hyper's pool.
    pub async fn open(&self) -> Result<Option<SendRequest<Bytes>>, Error> {
        let failures = self.failures.load(Ordering::Acquire);
        let _gate = self.connecting.lock().await;
        if let Some(sender) = self.ready() {
            return Ok(Some(sender));
        }
        if self.http1.load(Ordering::Relaxed) {
            return Ok(None);
        }
        // Connecting failed while this request waited for it: it fails
        // with that error now rather than connect again, after it, in turn
        // (to a host that drops SYNs, each would wait out the timeout).
        if self.failures.load(Ordering::Acquire) != failures {
            let failed = self.failed.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(failed) = failed.as_ref() {
                return Err(Error::Connect(Box::new(failed.clone())));
            }
        }
        match self.connect().await {
            Ok(sender) => Ok(sender),
            Err(e) => {
                let failed = ConnectFailed(Arc::new(e));
                *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(failed.clone());
                self.failures.fetch_add(1, Ordering::Release);
                Err(Error::Connect(Box::new(failed)))
            }
        }
    }

    /// A new connection, its handle kept for the requests after; `None`
    /// when ALPN chose HTTP/1.1.
    async fn connect(&self) -> Result<Option<SendRequest<Bytes>>, BoxError> {
        let base = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query("/")
            .build()?;
        let conn = tower_service::Service::call(&mut self.connector.clone(), base).await?;
        if !conn.connected().is_negotiated_h2() && !self.connector.h2c() {
            self.http1.store(true, Ordering::Relaxed);
            return Ok(None);
        }
        let (sender, connection) = h2::client::Builder::new()
            .enable_push(false)
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .max_frame_size(MAX_FRAME_SIZE)
            .max_header_list_size(MAX_HEADER_LIST_SIZE)
            .max_send_buffer_size(MAX_SEND_BUFFER)
            .initial_max_send_streams(INITIAL_MAX_SEND_STREAMS)
            .handshake::<_, Bytes>(TokioIo::new(conn))
            .await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
            }
        });
        let number = self.opened.fetch_add(1, Ordering::Relaxed);
        *self.open.lock().unwrap_or_else(|p| p.into_inner()) = Some(Open {
            sender: sender.clone(),
            used: Instant::now(),
            number,
        });
        Ok(Some(sender))
    }
}

/// The open connection.
struct Open {
    sender: SendRequest<Bytes>,
    used: Instant,
    number: u64,
}

/// A connect failure, shared by the requests that waited on it: it reads
/// as the error itself, and its causes are the error's.
#[derive(Debug, Clone)]
pub struct ConnectFailed(Arc<BoxError>);

impl ConnectFailed {
    /// The error connecting failed with.
    pub fn error(&self) -> &(dyn std::error::Error + 'static) {
        self.0.as_ref().as_ref()
    }
}

impl std::fmt::Display for ConnectFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for ConnectFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// `len` as a `content-length` value, its digits cut from [`crate::arena`].
fn content_length(len: usize) -> HeaderValue {
    // Decimal digits are always a valid header value.
    HeaderValue::from_maybe_shared(crate::arena::decimal(len as u64))
        .unwrap_or_else(|_| HeaderValue::from(len))
}

/// Headers HTTP/2 forbids (RFC 9113 §8.2.2), removed as hyper removes them:
/// the hop-by-hop ones, those `Connection` names, and `TE` unless it is
/// `trailers`.
fn strip_connection_headers(headers: &mut HeaderMap) {
    const HOP: [HeaderName; 2] = [
        HeaderName::from_static("keep-alive"),
        HeaderName::from_static("proxy-connection"),
    ];
    for name in HOP.iter().chain([&TRANSFER_ENCODING, &UPGRADE]) {
        headers.remove(name);
    }
    if headers.get(TE).is_some_and(|te| te != "trailers") {
        headers.remove(TE);
    }
    if let Some(named) = headers.remove(CONNECTION) {
        for name in named.to_str().unwrap_or("").split(',') {
            if let Ok(name) = HeaderName::from_bytes(name.trim().as_bytes()) {
                headers.remove(name);
            }
        }
    }
}

/// An answer's body read from an h2 stream: each chunk's window handed
/// back as it is taken, then the trailers.
pub fn poll_frame(
    stream: &mut h2::RecvStream,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
    match stream.poll_data(cx) {
        Poll::Ready(Some(Ok(data))) => {
            // Only fails when the stream is gone, which the next read says.
            let _ = stream.flow_control().release_capacity(data.len());
            Poll::Ready(Some(Ok(Frame::data(data))))
        }
        Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
        Poll::Pending => Poll::Pending,
        Poll::Ready(None) => match stream.poll_trailers(cx) {
            Poll::Ready(Ok(Some(trailers))) => Poll::Ready(Some(Ok(Frame::trailers(trailers)))),
            Poll::Ready(Ok(None)) => Poll::Ready(None),
            Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
            Poll::Pending => Poll::Pending,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::policy::outcome::OutcomeClass;
    use crate::upstream::classify::classify_transport;
    use crate::upstream::client::{read_capped, Body, Client, Options, Response};
    use h2::Reason;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use tokio::net::TcpListener;
    use tokio::sync::Notify;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut headers = HeaderMap::new();
        for (k, v) in [
            ("connection", "x-hop, keep-alive"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "gzip"),
            ("authorization", "Bearer k"),
        ] {
            headers.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        strip_connection_headers(&mut headers);
        let left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["authorization"]);
        let mut te = HeaderMap::new();
        te.insert(TE, HeaderValue::from_static("trailers"));
        strip_connection_headers(&mut te);
        assert_eq!(te.len(), 1, "TE: trailers is allowed");
    }

    /// What the test upstream does with each request, once its body is in.
    #[derive(Clone, Copy)]
    enum Answer {
        /// 200, and the body's length in bytes.
        Length,
        /// As `Length`, then a graceful GOAWAY: one request per connection.
        LengthThenGoAway,
        /// RST_STREAM(REFUSED_STREAM) before any head.
        Refuse,
        /// A head and `partial`, then RST_STREAM(INTERNAL_ERROR) once the
        /// test says it has read `partial`.
        CutAfterPartial,
    }

    /// An HTTP/2 upstream (the h2 crate's server) on loopback.
    struct Upstream {
        url: String,
        connections: Arc<AtomicUsize>,
        /// Each request's headers and body length.
        seen: Arc<std::sync::Mutex<Vec<(HeaderMap, usize)>>>,
        cut: Arc<Notify>,
    }

    async fn upstream(answer: Answer) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let up = Upstream {
            url,
            connections: Arc::default(),
            seen: Arc::default(),
            cut: Arc::default(),
        };
        let (connections, seen, cut) = (up.connections.clone(), up.seen.clone(), up.cut.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                let (seen, cut) = (seen.clone(), cut.clone());
                tokio::spawn(async move {
                    let mut conn = h2::server::handshake(tcp).await.unwrap();
                    while let Some(Ok((request, respond))) = conn.accept().await {
                        tokio::spawn(serve(request, respond, answer, seen.clone(), cut.clone()));
                        if let Answer::LengthThenGoAway = answer {
                            conn.graceful_shutdown();
                        }
                    }
                });
            }
        });
        up
    }

    async fn serve(
        request: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<Bytes>,
        answer: Answer,
        seen: Arc<std::sync::Mutex<Vec<(HeaderMap, usize)>>>,
        cut: Arc<Notify>,
    ) {
        let (parts, mut body) = request.into_parts();
        let mut length = 0;
        while let Some(chunk) = body.data().await {
            let chunk = chunk.unwrap();
            length += chunk.len();
            body.flow_control().release_capacity(chunk.len()).unwrap();
        }
        seen.lock().unwrap().push((parts.headers, length));
        match answer {
            Answer::Refuse => respond.send_reset(Reason::REFUSED_STREAM),
            Answer::Length | Answer::LengthThenGoAway => {
                let mut out = respond
                    .send_response(http::Response::new(()), false)
                    .unwrap();
                // `/big` answers past the 2 MiB stream window the client
                // opens with: it arrives only if the client hands the
                // window back as it reads.
                let data = if parts.uri.path() == "/big" {
                    Bytes::from(vec![b'y'; 3 << 20])
                } else {
                    Bytes::from(length.to_string())
                };
                out.send_data(data, true).unwrap();
            }
            Answer::CutAfterPartial => {
                let mut out = respond
                    .send_response(http::Response::new(()), false)
                    .unwrap();
                out.send_data(Bytes::from_static(b"partial"), false)
                    .unwrap();
                cut.notified().await;
                out.send_reset(Reason::INTERNAL_ERROR);
            }
        }
    }

    fn h2c_client(origin: &str) -> Client {
        let options = Options {
            http2_prior_knowledge: true,
            ..Options::default()
        };
        Client::with_proxies(options, None).with_origin(origin)
    }

    async fn post(client: &Client, url: &str, body: &'static [u8]) -> Response {
        client
            .post(url, HeaderMap::new(), Bytes::from_static(body))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn concurrent_requests_share_one_connection_and_a_body_past_the_window_arrives_whole() {
        let up = upstream(Answer::Length).await;
        let client = h2c_client(&up.url);
        let url = format!("{}/v1/chat/completions", up.url);
        // Past the 65,535-byte window a stream opens with: h2 holds the rest
        // until the upstream's WINDOW_UPDATEs.
        static BIG: [u8; 200_000] = [b'x'; 200_000];
        let answers = futures_util::future::join_all((0..20).map(|i| {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let body: &'static [u8] = if i == 0 { &BIG } else { b"{}" };
                let answer = post(&client, &url, body).await;
                assert!(
                    matches!(answer.body(), Body::H2(_)),
                    "sent on our own stream"
                );
                String::from_utf8(read_capped(answer, 64).await).unwrap()
            }
        }))
        .await;
        assert_eq!(answers[0], "200000");
        assert!(answers[1..].iter().all(|a| a == "2"), "{answers:?}");
        let big = post(&client, &format!("{}/big", up.url), b"").await;
        let read = tokio::time::timeout(Duration::from_secs(30), read_capped(big, 4 << 20));
        assert_eq!(
            read.await.expect("the window is handed back").len(),
            3 << 20
        );
        assert_eq!(up.connections.load(Ordering::SeqCst), 1);
        let seen = up.seen.lock().unwrap();
        assert_eq!(seen.len(), 21);
        let big = seen.iter().find(|(_, n)| *n == 200_000).unwrap();
        assert_eq!(big.0.get(CONTENT_LENGTH).unwrap(), "200000");
        assert_eq!(big.0.get("accept").unwrap(), "*/*");
    }

    #[tokio::test]
    async fn a_connection_the_upstream_closed_is_reopened_for_the_next_request() {
        let up = upstream(Answer::LengthThenGoAway).await;
        let client = h2c_client(&up.url);
        for _ in 0..3 {
            let answer = post(&client, &format!("{}/x", up.url), b"abc").await;
            assert_eq!(read_capped(answer, 64).await, b"3");
            // The next request is sent once this client has seen the
            // GOAWAY (one sent before it would race it, and be refused).
            let h2 = client.h2_conn().unwrap();
            tokio::time::timeout(Duration::from_secs(30), h2.closed())
                .await
                .expect("the upstream's GOAWAY arrives");
        }
        assert_eq!(up.connections.load(Ordering::SeqCst), 3);
        assert_eq!(up.seen.lock().unwrap().len(), 3);
    }

    #[tokio::test]
    async fn a_refused_stream_fails_before_its_head_and_a_reset_one_as_a_cut_body() {
        let up = upstream(Answer::Refuse).await;
        let err = h2c_client(&up.url)
            .post(&format!("{}/x", up.url), HeaderMap::new(), Bytes::new())
            .await
            .unwrap_err();
        assert!(
            !err.is_body() && !err.is_connect() && !err.is_timeout(),
            "{err}"
        );
        assert_eq!(classify_transport(&err).class, OutcomeClass::Connect);

        let up = upstream(Answer::CutAfterPartial).await;
        let answer = post(&h2c_client(&up.url), &format!("{}/x", up.url), b"").await;
        let mut body = answer.into_body();
        let first = futures_util::future::poll_fn(|cx| {
            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await;
        let first = first.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "partial");
        up.cut.notify_one();
        let end = futures_util::future::poll_fn(|cx| {
            http_body::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await;
        let err = Error::from(end.unwrap().unwrap_err());
        assert!(err.is_body() && !err.is_connect(), "{err}");
        assert_eq!(classify_transport(&err).class, OutcomeClass::Truncated);
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error_and_other_origins_go_through_hyper() {
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let client = h2c_client(&gone);
        let err = client
            .post(&format!("{gone}/x"), HeaderMap::new(), Bytes::new())
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Connect(_)), "{err:?}");
        assert!(err.is_connect() && !err.is_body(), "{err}");

        let up = upstream(Answer::Length).await;
        let answer = post(&client, &format!("{}/x", up.url), b"four").await;
        assert!(
            matches!(answer.body(), Body::Hyper(_)),
            "another origin: hyper's pool"
        );
        assert_eq!(read_capped(answer, 64).await, b"4");
    }

    /// A TLS upstream on loopback offering `alpn`, and a client trusting
    /// its certificate: HTTP/2 is served with h2's server, HTTP/1.1 with hyper's.
    async fn tls_upstream(alpn: &'static [u8]) -> (String, Client, Arc<AtomicUsize>) {
        // Self-signed, and the client's only root.
        let rcgen::CertifiedKey { cert, signing_key } =
            rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(signing_key.serialize_der().into()),
            )
            .unwrap();
        server.alpn_protocols = vec![alpn.to_vec()];
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let trusting: &'static rustls::ClientConfig = Box::leak(Box::new(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth(),
        ));
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://localhost:{}",
            listener.local_addr().unwrap().port()
        );
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    if alpn == b"h2" {
                        let mut conn = h2::server::handshake(tls).await.unwrap();
                        let (seen, cut) = (Arc::default(), Arc::default());
                        while let Some(Ok((request, respond))) = conn.accept().await {
                            tokio::spawn(serve(
                                request,
                                respond,
                                Answer::Length,
                                Arc::clone(&seen),
                                Arc::clone(&cut),
                            ));
                        }
                    } else {
                        let service =
                            hyper::service::service_fn(|r: http::Request<_>| async move {
                                let text = format!("{:?}", r.version());
                                Ok::<_, std::convert::Infallible>(http::Response::new(
                                    http_body_util::Full::new(Bytes::from(text)),
                                ))
                            });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), service)
                            .await;
                    }
                });
            }
        });
        let client = Client::trusting(Options::default(), None, trusting).with_origin(&url);
        (url, client, connections)
    }

    #[tokio::test]
    async fn an_https_origin_is_spoken_over_http2_when_alpn_picks_it_and_through_hyper_when_not() {
        let (url, client, connections) = tls_upstream(b"h2").await;
        for _ in 0..2 {
            let answer = post(&client, &format!("{url}/v1/messages"), b"hello").await;
            assert_eq!(answer.version(), http::Version::HTTP_2);
            assert!(
                matches!(answer.body(), Body::H2(_)),
                "our own HTTP/2 stream"
            );
            assert_eq!(read_capped(answer, 64).await, b"5");
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1);

        let (url, client, connections) = tls_upstream(b"http/1.1").await;
        for _ in 0..2 {
            let answer = post(&client, &format!("{url}/v1/messages"), b"hello").await;
            assert!(
                matches!(answer.body(), Body::Hyper(_)),
                "HTTP/1.1: hyper's pool"
            );
            assert_eq!(read_capped(answer, 64).await, b"HTTP/1.1");
        }
        // The connection that learnt the upstream's ALPN, then hyper's one,
        // kept for the second request.
        assert_eq!(connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn requests_that_waited_on_a_failed_connect_share_its_error_rather_than_retry_it() {
        // Takes TCP connections and closes them: every TLS handshake fails.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://localhost:{}",
            listener.local_addr().unwrap().port()
        );
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                drop(tcp);
            }
        });
        let client = Client::with_proxies(Options::default(), None).with_origin(&url);
        let to = format!("{url}/v1/messages");
        let errors = futures_util::future::join_all(
            (0..10).map(|_| client.post(&to, HeaderMap::new(), Bytes::new())),
        )
        .await;
        for err in errors {
            let err = err.unwrap_err();
            assert!(err.is_connect() && !err.is_body(), "{err}");
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connect for ten requests"
        );
        // A request after the failure connects again.
        let err = client
            .post(
                &format!("{url}/v1/messages"),
                HeaderMap::new(),
                Bytes::new(),
            )
            .await
            .unwrap_err();
        assert!(err.is_connect(), "{err}");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }
}
