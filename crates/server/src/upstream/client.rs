//! The HTTP client a provider's requests go out on: hyper's pooled client
//! (hyper-util's `legacy::Client`) over rustls, without reqwest's
//! per-request layers (its URL parsed three times, its retry and redirect
//! policies, its `Pending` future), and, for the provider's own origin when
//! it speaks HTTP/2, a connection of its own ([`H2Conn`]) on which the
//! attempt's task opens the stream and reads the answer itself; when it is
//! a plain `http://` origin reached without a proxy, HTTP/1.1 connections
//! of its own ([`H1Conns`]), each driven by the attempt holding it. A request
//! is a URI parsed once, its headers and its body's bytes; the answer is
//! its head and its body ([`Body`]) read as it arrives.
//!
//! Owns connecting: TCP with the provider's connect timeout, `TCP_NODELAY`
//! and keep-alive probes; TLS with the webpki roots, ALPN offering HTTP/2
//! and HTTP/1.1; h2c by prior knowledge; idle connections kept 60 s. And
//! the environment's proxies, read as curl reads them (`HTTPS_PROXY`,
//! `HTTP_PROXY`, `ALL_PROXY`, `NO_PROXY`, upper or lower case), as reqwest
//! read them before: an `https` upstream (or an h2c one) is reached through
//! a `CONNECT` tunnel, a plain `http` one by sending the request in absolute
//! form to the proxy, with `Proxy-Authorization` from the proxy URL's
//! credentials. Nothing is retried, redirected or decompressed here: the
//! attempt loop is the only retry layer, and bytes pass as the upstream
//! sent them.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{ACCEPT, CONTENT_TYPE, PROXY_AUTHORIZATION};
use http::{HeaderMap, HeaderValue, Method, Uri};
use http_body_util::{BodyExt, Full};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder, MaybeHttpsStream};
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::h1_conn::{H1Body, H1Conns};
use super::h2_conn::{ConnectFailed, H2Conn};

/// An upstream's answer: its status, headers, and body as it arrives.
pub type Response = http::Response<Body>;

/// Where a request goes: a URL's text, parsed as it is sent, or a URL
/// parsed once and kept (a clone shares its bytes).
#[derive(Debug, Clone, PartialEq)]
pub enum Url {
    Text(String),
    Parsed(Uri),
}

impl From<String> for Url {
    fn from(text: String) -> Self {
        Url::Text(text)
    }
}

impl Url {
    /// The parsed URL (the text's bytes become the URL's without a copy).
    pub fn into_uri(self) -> Result<Uri, http::uri::InvalidUri> {
        match self {
            Url::Text(text) => Uri::try_from(text),
            Url::Parsed(uri) => Ok(uri),
        }
    }
}

impl std::fmt::Display for Url {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Url::Text(text) => f.write_str(text),
            Url::Parsed(uri) => write!(f, "{uri}"),
        }
    }
}

pub(super) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How a request to an upstream failed below HTTP.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL is not one hyper can send to.
    #[error("invalid upstream URL: {0}")]
    Url(#[from] http::uri::InvalidUri),
    /// No answer: connecting, the TLS handshake, or sending failed.
    #[error("{}", chain(.0))]
    Send(#[from] hyper_util::client::legacy::Error),
    /// No connection of our own could be opened (refused, unresolvable,
    /// the TLS or HTTP/2 handshake failed).
    #[error("{}", chain(.0.as_ref()))]
    Connect(BoxError),
    /// An HTTP/2 stream of our own failed before its answer's head.
    #[error("{}", chain(.0))]
    Stream(h2::Error),
    /// An HTTP/1.1 exchange on a connection of our own failed before its
    /// answer's head.
    #[error("{}", chain(.0))]
    Exchange(hyper::Error),
    /// The answer's body broke off.
    #[error("{}", chain(.0))]
    Body(hyper::Error),
    /// The answer's body broke off, on a stream of our own.
    #[error("{}", chain(.0))]
    BodyStream(h2::Error),
}

impl From<BodyError> for Error {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::Hyper(e) => Error::Body(e),
            BodyError::H2(e) => Error::BodyStream(e),
        }
    }
}

/// An error and its causes, `: `-separated.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

impl Error {
    /// A connect or read that ran out of time (a source error says so).
    pub fn is_timeout(&self) -> bool {
        let mut source: Option<&(dyn std::error::Error + 'static)> = match self {
            Error::Url(_) => None,
            Error::Send(e) => Some(e),
            Error::Connect(e) => Some(
                e.downcast_ref::<ConnectFailed>()
                    .map_or(e.as_ref() as _, ConnectFailed::error),
            ),
            Error::Stream(e) | Error::BodyStream(e) => Some(e),
            Error::Body(e) | Error::Exchange(e) => Some(e),
        };
        while let Some(err) = source {
            if let Some(h) = err.downcast_ref::<hyper::Error>() {
                if h.is_timeout() {
                    return true;
                }
            }
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if io.kind() == std::io::ErrorKind::TimedOut {
                    return true;
                }
            }
            source = err.source();
        }
        false
    }

    /// No connection could be made (refused, unresolvable, the handshake failed).
    pub fn is_connect(&self) -> bool {
        match self {
            Error::Send(e) => e.is_connect(),
            Error::Connect(_) => true,
            _ => false,
        }
    }

    /// The answer's body broke off after its headers.
    pub fn is_body(&self) -> bool {
        matches!(self, Error::Body(_) | Error::BodyStream(_))
    }
}

/// How an answer's body broke off.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error(transparent)]
    Hyper(hyper::Error),
    #[error(transparent)]
    H2(h2::Error),
}

/// An answer's body: from hyper's client, from an HTTP/2 stream of our
/// own ([`H2Conn`]), or from an HTTP/1.1 connection of our own
/// ([`H1Conns`]).
#[derive(Debug)]
pub enum Body {
    Hyper(hyper::body::Incoming),
    H2(h2::RecvStream),
    H1(H1Body),
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        match self.get_mut() {
            Body::Hyper(body) => Pin::new(body).poll_frame(cx).map_err(BodyError::Hyper),
            Body::H2(stream) => super::h2_conn::poll_frame(stream, cx).map_err(BodyError::H2),
            Body::H1(body) => body.poll_frame(cx).map_err(BodyError::Hyper),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Body::Hyper(body) => body.is_end_stream(),
            Body::H2(stream) => stream.is_end_stream(),
            Body::H1(body) => body.is_end_stream(),
        }
    }
}

/// How a client connects.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Time to open a TCP connection.
    pub connect_timeout: Duration,
    /// HTTP/2 without negotiation (h2c to an `http://` upstream).
    pub http2_prior_knowledge: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            connect_timeout: Duration::from_secs(10),
            http2_prior_knowledge: false,
        }
    }
}

/// A client with its own connection pool. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct Client {
    inner: hyper_util::client::legacy::Client<Connector, Full<Bytes>>,
    /// The proxy rules plain `http` requests are forwarded by (none for
    /// h2c, which is tunnelled).
    forwarding: Option<Arc<Matcher>>,
    /// How [`H2Conn`] connects: as the pool does.
    connector: Connector,
    /// The HTTP/2 connection to the provider's origin ([`Client::with_origin`]).
    h2: Option<Arc<H2Conn>>,
    /// The HTTP/1.1 connections to the provider's plain `http` origin.
    h1: Option<Arc<H1Conns>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            // Whether, not where: a proxy URL may carry credentials.
            .field("forwards_to_a_proxy", &self.forwarding.is_some())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client sending through `proxies` ([`proxies_from_env`], or `None`:
    /// straight to every upstream).
    pub fn with_proxies(options: Options, proxies: Option<Arc<Matcher>>) -> Self {
        Self::trusting(options, proxies, tls_config())
    }

    /// A client whose TLS trusts `tls`'s roots (the webpki roots, outside
    /// tests).
    pub(super) fn trusting(
        options: Options,
        proxies: Option<Arc<Matcher>>,
        tls: &'static rustls::ClientConfig,
    ) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_connect_timeout(Some(options.connect_timeout));
        tcp.set_nodelay(true);
        tcp.set_keepalive(Some(Duration::from_secs(15)));
        tcp.set_keepalive_interval(Some(Duration::from_secs(15)));
        tcp.set_keepalive_retries(Some(3));
        let connector = Connector {
            direct: HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
                .enable_http1()
                .enable_http2()
                .wrap_connector(tcp.clone()),
            tcp,
            proxies: proxies.clone(),
            h2c: options.http2_prior_knowledge,
            tls,
        };
        let mut builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new());
        let h2_connector = connector.clone();
        builder
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .http2_only(options.http2_prior_knowledge);
        Client {
            inner: builder.build(connector),
            forwarding: proxies.filter(|_| !options.http2_prior_knowledge),
            connector: h2_connector,
            h2: None,
            h1: None,
        }
    }

    /// This client, sending requests to `base_url`'s origin on an HTTP/2
    /// connection of its own ([`H2Conn`]) when that origin speaks HTTP/2:
    /// `https` (as ALPN decides) or h2c by prior knowledge; on HTTP/1.1
    /// connections of its own ([`H1Conns`]) when it is a plain `http`
    /// origin reached without a proxy. An `https` origin that chooses
    /// HTTP/1.1, one behind a proxy, and other origins go through hyper's
    /// pool.
    pub fn with_origin(mut self, base_url: &str) -> Self {
        let Ok(uri) = base_url.parse::<Uri>() else {
            return self;
        };
        let (Some(scheme), Some(authority)) = (uri.scheme(), uri.authority()) else {
            return self;
        };
        let h2 = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => self.connector.h2c(),
            _ => false,
        };
        if h2 {
            self.h2 = Some(Arc::new(H2Conn::new(
                self.connector.clone(),
                scheme.clone(),
                authority.clone(),
            )));
        } else if uri.scheme_str() == Some("http") && !self.connector.proxied(&uri) {
            self.h1 = Some(Arc::new(H1Conns::new(
                self.connector.clone(),
                scheme.clone(),
                authority.clone(),
            )));
        }
        self
    }

    /// Its HTTP/2 connection, if it has one.
    #[cfg(test)]
    pub(super) fn h2_conn(&self) -> Option<&H2Conn> {
        self.h2.as_deref()
    }

    /// Its HTTP/1.1 connections, if it has them.
    #[cfg(test)]
    pub(super) fn h1_conns(&self) -> Option<&H1Conns> {
        self.h1.as_deref()
    }

    /// POSTs `body` to `url` with `headers` (see [`Client::send`]).
    pub async fn post(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response, Error> {
        self.send(Url::Parsed(Uri::try_from(url)?), headers, body)
            .await
    }

    /// POSTs `body` to `url` with `headers` (`accept: */*` when none is
    /// given, as before); the answer once its headers are in.
    pub async fn send(
        &self,
        url: Url,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response, Error> {
        let uri = url.into_uri()?;
        if !headers.contains_key(ACCEPT) {
            headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        }
        if let Some(auth) = self.absolute_form_auth(&uri) {
            headers.entry(PROXY_AUTHORIZATION).or_insert(auth);
        }
        if let Some(h2) = self.h2.as_ref().filter(|h2| h2.serves(&uri)) {
            let sender = match h2.ready() {
                Some(sender) => Some(sender),
                // Boxed: connecting (the connector's future, h2's
                // handshake) is some 5 KB of state that every stream's
                // future would otherwise hold for its whole life.
                None => Box::pin(h2.open()).await?,
            };
            if let Some(sender) = sender {
                let answer = H2Conn::start(sender, request(uri, headers), body)?;
                return Ok(answer.await.map_err(Error::Stream)?.map(Body::H2));
            }
        }
        if let Some(h1) = self.h1.as_ref().filter(|h1| h1.serves(&uri)) {
            // Boxed until the answer's head is in (the request and hyper's
            // sending future are some 900 bytes): an open stream's future
            // then holds only its body.
            return Box::pin(h1.send(uri, headers, body)).await;
        }
        let request = request(uri, headers).map(|()| Full::new(body));
        Ok(self.inner.request(request).await?.map(Body::Hyper))
    }

    /// POSTs `body` as JSON (see [`json_body`]).
    pub async fn post_json(
        &self,
        url: &str,
        mut headers: HeaderMap,
        body: &serde_json::Value,
    ) -> Result<Response, Error> {
        let body = json_body(&mut headers, body);
        self.post(url, headers, body).await
    }

    /// The `Proxy-Authorization` a plain `http` request sent in absolute
    /// form to its proxy carries.
    fn absolute_form_auth(&self, uri: &Uri) -> Option<HeaderValue> {
        if uri.scheme_str() != Some("http") {
            return None;
        }
        self.forwarding
            .as_ref()?
            .intercept(uri)?
            .basic_auth()
            .cloned()
    }
}

/// A `POST` to `uri` with `headers`, its body to come.
pub(super) fn request(uri: Uri, headers: HeaderMap) -> http::Request<()> {
    let mut request = http::Request::new(());
    *request.method_mut() = Method::POST;
    *request.uri_mut() = uri;
    *request.headers_mut() = headers;
    request
}

/// Room for a typical request's JSON body.
const JSON_BODY_BYTES: usize = 1024;

/// `body` serialised, and `content-type: application/json` unless the
/// headers name another.
pub fn json_body(headers: &mut HeaderMap, body: &serde_json::Value) -> Bytes {
    headers
        .entry(CONTENT_TYPE)
        .or_insert(HeaderValue::from_static("application/json"));
    // A `Value` always serialises.
    crate::arena::json(JSON_BODY_BYTES, body).unwrap_or_default()
}

/// The environment's proxy rules, if it names any proxy.
pub fn proxies_from_env() -> Option<Arc<Matcher>> {
    let named = [
        "ALL_PROXY",
        "all_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "HTTP_PROXY",
        "http_proxy",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()));
    named.then(|| Arc::new(Matcher::from_env()))
}

/// Whether `base_url` can be reached through the proxy `proxies` pick for
/// it: a `CONNECT` tunnel (TLS, or h2c) is opened only through an
/// `http://` proxy.
pub fn check_proxy(proxies: &Matcher, base_url: &str, h2c: bool) -> Result<(), String> {
    let Ok(uri) = base_url.parse::<Uri>() else {
        return Ok(());
    };
    let Some(intercept) = proxies.intercept(&uri) else {
        return Ok(());
    };
    let tunnelled = uri.scheme_str() == Some("https") || h2c;
    match intercept.uri().scheme_str() {
        Some("https") if tunnelled => Err(format!(
            "the environment's proxy for {base_url} is an https:// proxy; \
             a tunnel to it is opened only through an http:// proxy (or name the host in NO_PROXY)"
        )),
        _ => Ok(()),
    }
}

/// One TLS configuration for the process: the webpki roots, TLS 1.2 and
/// 1.3, ring; its session cache shared by every client.
fn tls_config() -> &'static rustls::ClientConfig {
    static CONFIG: OnceLock<rustls::ClientConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap_or_else(|_| unreachable!("ring supports the default TLS versions"))
        .with_root_certificates(roots)
        .with_no_client_auth()
    })
}

/// Connects straight, through a `CONNECT` tunnel, or to an HTTP proxy that
/// takes the request in absolute form, as the proxy rules say for the
/// destination.
#[derive(Clone)]
pub(super) struct Connector {
    direct: HttpsConnector<HttpConnector>,
    tcp: HttpConnector,
    proxies: Option<Arc<Matcher>>,
    /// Speaks HTTP/2 by prior knowledge.
    h2c: bool,
    tls: &'static rustls::ClientConfig,
}

type Io = MaybeHttpsStream<TokioIo<TcpStream>>;

impl Connector {
    /// Whether it speaks HTTP/2 by prior knowledge.
    pub(super) fn h2c(&self) -> bool {
        self.h2c
    }

    /// Whether a connection to `uri` goes through a proxy.
    fn proxied(&self, uri: &Uri) -> bool {
        self.proxies
            .as_ref()
            .is_some_and(|m| m.intercept(uri).is_some())
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = Conn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Conn, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.direct.poll_ready(cx)
    }

    fn call(&mut self, dst: Uri) -> Self::Future {
        let intercept = self.proxies.as_ref().and_then(|m| m.intercept(&dst));
        let Some(intercept) = intercept else {
            let connecting = self.direct.call(dst);
            return Box::pin(async move { Ok(Conn::new(connecting.await?, false)) });
        };
        let proxy = intercept.uri().clone();
        // HTTP/2 by prior knowledge cannot be forwarded by an HTTP proxy: it is
        // tunnelled, as TLS is.
        let tunnelled = dst.scheme_str() == Some("https") || self.h2c;
        if !tunnelled {
            // Plain HTTP/1.1: the proxy takes the request itself.
            let connecting = self.direct.call(proxy);
            return Box::pin(async move { Ok(Conn::new(connecting.await?, true)) });
        }
        // (An https:// proxy here is refused at startup: `check_proxy`.)
        let mut tunnel = Tunnel::new(proxy, self.tcp.clone());
        if let Some(auth) = intercept.basic_auth() {
            tunnel = tunnel.with_auth(auth.clone());
        }
        let mut tls = HttpsConnectorBuilder::new()
            .with_tls_config(self.tls.clone())
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(tunnel);
        let connecting = tls.call(with_port(dst));
        Box::pin(async move { Ok(Conn::new(connecting.await?, false)) })
    }
}

/// `dst` with its scheme's port written out: the tunnel's `CONNECT` names
/// a port, and takes 443 for one left out, which is wrong for `http`.
fn with_port(dst: Uri) -> Uri {
    if dst.port().is_some() {
        return dst;
    }
    let (Some(scheme), Some(host)) = (dst.scheme_str(), dst.host()) else {
        return dst;
    };
    let port = if scheme == "http" { 80 } else { 443 };
    let path = dst.path_and_query().map_or("/", |p| p.as_str());
    format!("{scheme}://{host}:{port}{path}")
        .parse()
        .unwrap_or(dst)
}

/// A connection, marked when it goes to an HTTP proxy (hyper then writes
/// requests in absolute form).
pub struct Conn {
    io: Io,
    proxied: bool,
}

impl Conn {
    fn new(io: Io, proxied: bool) -> Self {
        Conn { io, proxied }
    }
}

impl Connection for Conn {
    /// Whether the connection is proxied and speaks h2, and nothing else:
    /// the TCP stream's own answer carries its socket addresses, which
    /// hyper-util then copies into every response's extensions (measured:
    /// three allocations a request that nothing here reads).
    fn connected(&self) -> Connected {
        let connected = Connected::new().proxy(self.proxied);
        if self.io.connected().is_negotiated_h2() {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

impl Read for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl Write for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
}

/// An answer's body, its first `cap` bytes at most: reading stops once
/// `cap` bytes are in (the rest is never read), and a body that breaks off
/// keeps what came before the break.
pub async fn read_capped(response: Response, cap: usize) -> Vec<u8> {
    let mut body = response.into_body();
    let mut kept = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        let Ok(bytes) = frame.into_data() else {
            continue;
        };
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        if kept.len() >= cap {
            break;
        }
    }
    kept
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// Reads one request head (up to the blank line).
    async fn head(stream: &mut TcpStream) -> String {
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(b"\r\n\r\n") {
            assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "head cut short");
            seen.push(byte[0]);
        }
        String::from_utf8(seen).unwrap()
    }

    /// A proxy that records each connection's request head, and then either
    /// answers itself (`forward == None`) or opens the `CONNECT` tunnel to
    /// `forward`.
    async fn proxy(forward: Option<std::net::SocketAddr>) -> (String, Arc<Mutex<Vec<String>>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let h = head(&mut stream).await;
                    seen.lock().unwrap().push(h);
                    match forward {
                        None => {
                            let answer = "HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\nproxied";
                            stream.write_all(answer.as_bytes()).await.unwrap();
                        }
                        Some(to) => {
                            stream
                                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                                .await
                                .unwrap();
                            let mut upstream = TcpStream::connect(to).await.unwrap();
                            let _ = tokio::io::copy_bidirectional(&mut stream, &mut upstream).await;
                        }
                    }
                });
            }
        });
        (format!("http://user:secret@{addr}"), heads)
    }

    /// An h2c server answering `h2:` and the request's path.
    async fn h2c_upstream() -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|r: http::Request<_>| async move {
                        let text = format!("{:?}:{}", r.version(), r.uri().path());
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(text),
                        )))
                    });
                    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    fn through(proxy: &str) -> Option<Arc<Matcher>> {
        Some(Arc::new(Matcher::builder().all(proxy).build()))
    }

    async fn text(response: Response) -> String {
        String::from_utf8(read_capped(response, 1 << 16).await).unwrap()
    }

    #[tokio::test]
    async fn plain_http_goes_to_its_proxy_in_absolute_form_with_the_proxy_credentials() {
        let (url, heads) = proxy(None).await;
        let client = Client::with_proxies(Options::default(), through(&url));
        let answer = client
            .post(
                "http://upstream.invalid:8080/v1/chat/completions",
                HeaderMap::new(),
                Bytes::from_static(b"{}"),
            )
            .await
            .unwrap();
        assert_eq!(text(answer).await, "proxied");
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 1);
        let lines: Vec<&str> = heads[0].split("\r\n").collect();
        assert_eq!(
            lines[0],
            "POST http://upstream.invalid:8080/v1/chat/completions HTTP/1.1"
        );
        // base64("user:secret")
        assert!(
            lines.contains(&"proxy-authorization: Basic dXNlcjpzZWNyZXQ="),
            "{lines:?}"
        );
        assert!(lines.contains(&"accept: */*"), "{lines:?}");
    }

    #[tokio::test]
    async fn h2c_goes_through_a_connect_tunnel_and_speaks_http2_inside_it() {
        let upstream = h2c_upstream().await;
        let (url, heads) = proxy(Some(upstream)).await;
        let options = Options {
            http2_prior_knowledge: true,
            ..Options::default()
        };
        let client = Client::with_proxies(options, through(&url));
        let dst = format!("http://{upstream}/v1/chat/completions");
        for _ in 0..2 {
            let answer = client
                .post(&dst, HeaderMap::new(), Bytes::new())
                .await
                .unwrap();
            assert_eq!(text(answer).await, "HTTP/2.0:/v1/chat/completions");
        }
        let heads = heads.lock().unwrap();
        assert_eq!(heads.len(), 1, "one tunnel carries both requests");
        let lines: Vec<&str> = heads[0].split("\r\n").collect();
        assert_eq!(lines[0], format!("CONNECT {upstream} HTTP/1.1"));
        assert!(
            lines.contains(&"Proxy-Authorization: Basic dXNlcjpzZWNyZXQ="),
            "{lines:?}"
        );
    }

    #[tokio::test]
    async fn without_proxies_h2c_is_spoken_straight_and_keeps_its_connection() {
        let upstream = h2c_upstream().await;
        let options = Options {
            http2_prior_knowledge: true,
            ..Options::default()
        };
        let client = Client::with_proxies(options, None);
        let answer = client
            .post(
                &format!("http://{upstream}/x"),
                HeaderMap::new(),
                Bytes::new(),
            )
            .await
            .unwrap();
        assert_eq!(answer.version(), http::Version::HTTP_2);
        assert_eq!(text(answer).await, "HTTP/2.0:/x");
    }

    #[test]
    fn a_tunnel_names_the_schemes_port_when_the_url_leaves_it_out() {
        let port = |u: &str| with_port(u.parse().unwrap()).to_string();
        assert_eq!(
            port("http://vllm.invalid/v1/x"),
            "http://vllm.invalid:80/v1/x"
        );
        assert_eq!(port("https://api.invalid/v1"), "https://api.invalid:443/v1");
        assert_eq!(
            port("http://vllm.invalid:8000/v1"),
            "http://vllm.invalid:8000/v1"
        );
        assert_eq!(port("http://[::1]/v1"), "http://[::1]:80/v1");
    }

    #[test]
    fn an_https_upstream_cannot_be_tunnelled_through_an_https_proxy() {
        let https_proxy = Matcher::builder().all("https://proxy.invalid:3128").build();
        let refused = check_proxy(&https_proxy, "https://api.openai.com/v1", false).unwrap_err();
        assert!(refused.contains("https:// proxy"), "{refused}");
        assert!(check_proxy(&https_proxy, "http://127.0.0.1:9/v1", true).is_err());
        // Plain HTTP/1.1 is forwarded, not tunnelled: any proxy will do.
        assert!(check_proxy(&https_proxy, "http://vllm.invalid/v1", false).is_ok());
        let http_proxy = Matcher::builder()
            .all("http://proxy.invalid:3128")
            .no("api.openai.com")
            .build();
        assert!(check_proxy(&http_proxy, "https://example.invalid/v1", false).is_ok());
        let excluded = Matcher::builder()
            .all("https://proxy.invalid:3128")
            .no("api.openai.com")
            .build();
        assert!(check_proxy(&excluded, "https://api.openai.com/v1", false).is_ok());
    }

    #[tokio::test]
    async fn a_body_cut_short_is_a_body_error_and_a_refused_connect_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            head(&mut stream).await;
            let cut = "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b";
            stream.write_all(cut.as_bytes()).await.unwrap();
        });
        let client = Client::with_proxies(Options::default(), None);
        let answer = client
            .post(&format!("http://{addr}/"), HeaderMap::new(), Bytes::new())
            .await
            .unwrap();
        let mut body = answer.into_body().into_data_stream();
        let mut got = Vec::new();
        let err = loop {
            match futures_util::StreamExt::next(&mut body).await {
                Some(Ok(b)) => got.extend_from_slice(&b),
                Some(Err(e)) => break Some(Error::from(e)),
                None => break None,
            }
        };
        assert_eq!(got, b"only ten b");
        assert!(
            matches!(&err, Some(e) if e.is_body() && !e.is_connect() && !e.is_timeout()),
            "a cut body ends in a body error, not cleanly: {err:?}"
        );

        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone = closed.local_addr().unwrap();
        drop(closed);
        let err = client
            .post(&format!("http://{gone}/"), HeaderMap::new(), Bytes::new())
            .await
            .unwrap_err();
        assert!(err.is_connect() && !err.is_body(), "{err}");
        assert!(err.to_string().contains("onnect"), "{err}");
        let bad = client
            .post("http://exa mple/", HeaderMap::new(), Bytes::new())
            .await
            .unwrap_err();
        assert!(matches!(bad, Error::Url(_)), "{bad}");
    }
}
