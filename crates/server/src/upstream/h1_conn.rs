//! HTTP/1.1 connections of our own to a provider's plain `http://` origin
//! (vLLM, llama.cpp, Ollama, a mock), each driven by the attempt's task
//! that holds it. hyper's pooled client runs every connection in a task of
//! its own and hands the answer's head over a oneshot and each body chunk
//! over a channel, so every chunk of a stream woke a second task. An
//! HTTP/1.1 connection carries one exchange at a time, so nothing else
//! needs it while an answer is read: the attempt takes an idle connection
//! (or opens one), writes its request, and polls the connection and the
//! answer's body together in its own task; at the body's last byte the
//! connection goes back to the idle list.
//!
//! Owns the idle list: at most [`MAX_IDLE`] connections, most recently used
//! first, each let go after [`IDLE_TIMEOUT`] without a request, as hyper's
//! pool did. A connection the upstream closed while it was idle is seen
//! when it is taken and dropped; a request the connection refused before
//! writing any of it (it closed as the request arrived) is sent again on a
//! new one, as hyper's pool did. A body not read to its end (the attempt
//! ended first) closes its connection. `https` origins (ALPN may pick
//! HTTP/2: [`super::h2_conn`]) and origins reached through a proxy stay
//! with hyper's client.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::HOST;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Uri};
use http_body::Frame;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper::client::conn::TrySendError;

use super::client::{request, Body, Conn, Connector, Error, Response};
use super::h2_conn::IDLE_TIMEOUT;

/// Idle connections kept per origin at most.
pub const MAX_IDLE: usize = 64;

type Request = http::Request<Full<Bytes>>;

/// The idle connections to one origin.
pub struct H1Conns {
    connector: Connector,
    scheme: Scheme,
    authority: Authority,
    /// `Host`, as hyper's pool writes it (the port only when not 80).
    host: HeaderValue,
    idle: Mutex<Vec<Idle>>,
}

impl std::fmt::Debug for H1Conns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Conns")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

/// A connection waiting for its next request.
struct Idle {
    held: Box<Held>,
    since: Instant,
}

/// A connection in use: the request side and the connection's driver.
struct Held {
    send: SendRequest<Full<Bytes>>,
    conn: Connection<Conn, Full<Bytes>>,
    /// The driver has finished (the connection closed or failed): never
    /// polled again, never kept.
    done: bool,
}

impl Held {
    /// Drives the connection; `true` once it has finished.
    fn drive(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.done {
            if let Poll::Ready(result) = Pin::new(&mut self.conn).poll(cx) {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "upstream HTTP/1.1 connection ended");
                }
                self.done = true;
            }
        }
        self.done
    }
}

impl H1Conns {
    /// Connections to `scheme://authority`, through `connector`.
    pub fn new(connector: Connector, scheme: Scheme, authority: Authority) -> Self {
        let host = match authority.port_u16() {
            Some(port) if port != 80 => format!("{}:{port}", authority.host()),
            _ => authority.host().to_string(),
        };
        H1Conns {
            connector,
            scheme,
            host: HeaderValue::from_str(&host).unwrap_or_else(|_| HeaderValue::from_static("")),
            authority,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Whether `uri` is on this origin.
    pub fn serves(&self, uri: &Uri) -> bool {
        uri.scheme() == Some(&self.scheme) && uri.authority() == Some(&self.authority)
    }

    /// The idle connections kept now.
    #[cfg(test)]
    pub(super) fn idle(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// POSTs `body` to `uri` with `headers`; the answer once its head is in,
    /// its body read on the same connection by whoever polls it.
    pub async fn send(
        self: &Arc<Self>,
        uri: Uri,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<Response, Error> {
        if !headers.contains_key(HOST) {
            headers.insert(HOST, self.host.clone());
        }
        let mut request = request(origin_form(uri), headers).map(|()| Full::new(body));
        loop {
            let (mut held, reused) = match self.take_idle() {
                Some(held) => (held, true),
                // Boxed: connecting (the connector's future, hyper's
                // handshake and the connection it builds) is state that
                // every request's future would otherwise hold for its life.
                None => (Box::pin(self.connect()).await?, false),
            };
            if !ready(&mut held).await {
                if reused {
                    continue;
                }
                return Err(Error::Connect(
                    "the upstream closed the connection before the request was sent".into(),
                ));
            }
            let sent = held.send.try_send_request(request);
            match answer(&mut held, sent).await {
                Ok(response) => {
                    return Ok(response.map(|body| {
                        Body::H1(H1Body {
                            body,
                            held: Some(held),
                            home: self.clone(),
                        })
                    }))
                }
                Err(mut e) => match e.take_message() {
                    // Nothing of it was written: a reused connection that
                    // closed as it arrived; the request goes on a new one.
                    Some(unsent) if reused => request = unsent,
                    _ => return Err(Error::Exchange(e.into_error())),
                },
            }
        }
    }

    /// The most recently used idle connection not past its idle time.
    fn take_idle(&self) -> Option<Box<Held>> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(Idle { held, since }) = idle.pop() {
            if since.elapsed() < IDLE_TIMEOUT {
                return Some(held);
            }
        }
        None
    }

    /// A new connection (boxed: a body holds it, and a body is part of
    /// every streaming request's state).
    async fn connect(&self) -> Result<Box<Held>, Error> {
        let base = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query("/")
            .build()
            .map_err(|e| Error::Connect(e.into()))?;
        let conn = tower_service::Service::call(&mut self.connector.clone(), base)
            .await
            .map_err(Error::Connect)?;
        let (send, conn) = http1::Builder::new()
            .handshake(conn)
            .await
            .map_err(|e| Error::Connect(e.into()))?;
        Ok(Box::new(Held {
            send,
            conn,
            done: false,
        }))
    }

    /// Keeps a connection whose answer was read to its end for the next
    /// request, unless the list is full; lets go of those past their idle
    /// time (the oldest are first).
    fn give_back(&self, held: Box<Held>) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let expired = idle
            .iter()
            .take_while(|i| i.since.elapsed() >= IDLE_TIMEOUT)
            .count();
        idle.drain(..expired);
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                held,
                since: Instant::now(),
            });
        }
    }
}

/// Waits until the connection takes a request; `false` if it has closed.
async fn ready(held: &mut Held) -> bool {
    std::future::poll_fn(|cx| {
        if held.drive(cx) {
            return Poll::Ready(false);
        }
        held.send.poll_ready(cx).map(|r| r.is_ok())
    })
    .await
}

/// The answer's head, the connection driven meanwhile.
async fn answer(
    held: &mut Held,
    response: impl Future<Output = Result<http::Response<Incoming>, TrySendError<Request>>>,
) -> Result<http::Response<Incoming>, TrySendError<Request>> {
    let mut response = std::pin::pin!(response);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = response.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        if held.drive(cx) {
            // The connection has finished: hyper has failed (or answered)
            // the request it held, so this poll is ready.
            return response.as_mut().poll(cx);
        }
        Poll::Pending
    })
    .await
}

/// `uri` as an HTTP/1.1 request line names it to the origin: its path and
/// query.
fn origin_form(uri: Uri) -> Uri {
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Uri::from(path)
}

/// An answer's body, read on its connection: polling it drives the
/// connection, and its end returns the connection to the idle list.
pub struct H1Body {
    body: Incoming,
    /// The connection, until the body ends.
    held: Option<Box<Held>>,
    home: Arc<H1Conns>,
}

impl std::fmt::Debug for H1Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H1Body").field("body", &self.body).finish()
    }
}

impl H1Body {
    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        // Twice at most: asking the body for more is what lets hyper read
        // the next chunk off the socket, so a body found empty gets the
        // connection driven once more at once, rather than after the
        // wake-up that asking sent to this very task.
        for _ in 0..2 {
            if let Some(held) = self.held.as_mut() {
                held.drive(cx);
            }
            match http_body::Body::poll_frame(Pin::new(&mut self.body), cx) {
                Poll::Pending => continue,
                Poll::Ready(None) => {
                    if let Some(held) = self.held.take().filter(|held| !held.done) {
                        self.home.give_back(held);
                    }
                    return Poll::Ready(None);
                }
                ready => return ready,
            }
        }
        Poll::Pending
    }

    pub fn is_end_stream(&self) -> bool {
        http_body::Body::is_end_stream(&self.body)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;
    use crate::upstream::client::{Client, Options};

    /// How the test upstream answers each request.
    #[derive(Clone, Copy)]
    enum Answer {
        /// `content-length` body, connection kept.
        Whole,
        /// Three chunks, 20 ms apart, connection kept.
        Chunked,
        /// A whole answer, then the connection closed.
        ThenClose,
    }

    /// What the upstream saw.
    #[derive(Default)]
    struct Seen {
        connections: AtomicUsize,
        requests: AtomicUsize,
        heads: Mutex<Vec<String>>,
    }

    /// Reads one request (head and `content-length` body); `None` at EOF.
    async fn read_request(stream: &mut TcpStream) -> Option<(String, Vec<u8>)> {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).unwrap();
        let len = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length: ")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            })
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).await.ok()?;
        Some((head, body))
    }

    async fn upstream(answer: Answer) -> (String, Arc<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = Arc::new(Seen::default());
        let counted = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.connections.fetch_add(1, Ordering::SeqCst);
                let seen = counted.clone();
                tokio::spawn(async move {
                    while let Some((head, body)) = read_request(&mut stream).await {
                        let n = seen.requests.fetch_add(1, Ordering::SeqCst);
                        seen.heads.lock().unwrap().push(head);
                        let text = format!("answer {n} to {}", String::from_utf8_lossy(&body));
                        match answer {
                            Answer::Whole | Answer::ThenClose => {
                                let out = format!(
                                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{text}",
                                    text.len()
                                );
                                stream.write_all(out.as_bytes()).await.unwrap();
                                if let Answer::ThenClose = answer {
                                    return;
                                }
                            }
                            Answer::Chunked => {
                                stream
                                    .write_all(
                                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                                    )
                                    .await
                                    .unwrap();
                                for part in ["one ", "two ", &text] {
                                    let chunk = format!("{:x}\r\n{part}\r\n", part.len());
                                    if stream.write_all(chunk.as_bytes()).await.is_err() {
                                        return;
                                    }
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                                if stream.write_all(b"0\r\n\r\n").await.is_err() {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        (url, seen)
    }

    fn client(url: &str) -> Client {
        Client::with_proxies(Options::default(), None).with_origin(url)
    }

    async fn post(
        client: &Client,
        url: &str,
        body: &'static str,
    ) -> crate::upstream::client::Response {
        client
            .post(
                &format!("{url}/v1/chat/completions?x=1"),
                HeaderMap::new(),
                Bytes::from_static(body.as_bytes()),
            )
            .await
            .unwrap()
    }

    async fn text(response: crate::upstream::client::Response) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn requests_one_after_another_share_one_connection_written_in_origin_form() {
        let (url, seen) = upstream(Answer::Whole).await;
        let client = client(&url);
        let conns = client
            .h1_conns()
            .expect("a plain http origin gets its own connections");
        assert_eq!(text(post(&client, &url, "a").await).await, "answer 0 to a");
        assert_eq!(conns.idle(), 1, "read to its end: kept");
        assert_eq!(text(post(&client, &url, "b").await).await, "answer 1 to b");
        assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
        assert_eq!(seen.requests.load(Ordering::SeqCst), 2);
        let heads = seen.heads.lock().unwrap();
        let authority = url.trim_start_matches("http://");
        for head in heads.iter() {
            let head = head.to_ascii_lowercase();
            assert!(
                head.starts_with("post /v1/chat/completions?x=1 http/1.1\r\n"),
                "{head}"
            );
            assert!(
                head.contains(&format!("\r\nhost: {authority}\r\n")),
                "{head}"
            );
            assert!(head.contains("\r\ncontent-length: 1\r\n"), "{head}");
        }
    }

    #[tokio::test]
    async fn a_chunked_answer_arrives_whole_and_in_order_and_its_connection_is_kept() {
        let (url, seen) = upstream(Answer::Chunked).await;
        let client = client(&url);
        assert_eq!(
            text(post(&client, &url, "a").await).await,
            "one two answer 0 to a"
        );
        assert_eq!(
            text(post(&client, &url, "b").await).await,
            "one two answer 1 to b"
        );
        assert_eq!(seen.connections.load(Ordering::SeqCst), 1);
        assert_eq!(client.h1_conns().unwrap().idle(), 1);
    }

    #[tokio::test]
    async fn a_body_left_unread_closes_its_connection_and_the_next_request_opens_another() {
        let (url, seen) = upstream(Answer::Chunked).await;
        let client = client(&url);
        let mut first = post(&client, &url, "a").await.into_body();
        let frame = first.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), "one ");
        drop(first);
        assert_eq!(client.h1_conns().unwrap().idle(), 0, "cut short: not kept");
        assert_eq!(
            text(post(&client, &url, "b").await).await,
            "one two answer 1 to b"
        );
        assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_closed_while_idle_is_replaced_and_each_request_is_sent_once() {
        let (url, seen) = upstream(Answer::ThenClose).await;
        let client = client(&url);
        for (i, body) in ["a", "b", "c"].into_iter().enumerate() {
            assert_eq!(
                text(post(&client, &url, body).await).await,
                format!("answer {i} to {body}")
            );
            // Let the upstream's close reach the idle connection.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            seen.requests.load(Ordering::SeqCst),
            3,
            "no request sent twice"
        );
        assert_eq!(seen.connections.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn requests_at_once_each_take_a_connection_and_both_are_kept() {
        let (url, seen) = upstream(Answer::Chunked).await;
        let client = client(&url);
        let (a, b) = tokio::join!(post(&client, &url, "a"), post(&client, &url, "b"));
        let (a, b) = tokio::join!(text(a), text(b));
        assert!(
            a.starts_with("one two answer ") && a.ends_with(" to a"),
            "{a}"
        );
        assert!(
            b.starts_with("one two answer ") && b.ends_with(" to b"),
            "{b}"
        );
        assert_ne!(a[..16], b[..16], "two requests, two answers: {a} / {b}");
        assert_eq!(seen.connections.load(Ordering::SeqCst), 2);
        assert_eq!(client.h1_conns().unwrap().idle(), 2);
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let client = client(&url);
        let err = client
            .post(
                &format!("{url}/v1/chat/completions"),
                HeaderMap::new(),
                Bytes::new(),
            )
            .await
            .unwrap_err();
        assert!(err.is_connect() && !err.is_body(), "{err}");
    }

    #[tokio::test]
    async fn an_answer_cut_short_is_a_body_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_request(&mut stream).await.unwrap();
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
                .await
                .unwrap();
        });
        let client = client(&url);
        let response = post(&client, &url, "a").await;
        let err = response.into_body().collect().await.unwrap_err();
        assert!(crate::upstream::client::Error::from(err).is_body());
        assert_eq!(client.h1_conns().unwrap().idle(), 0);
    }

    #[test]
    fn proxied_and_h2c_origins_keep_to_hypers_client() {
        let h2c = Client::with_proxies(
            Options {
                http2_prior_knowledge: true,
                ..Options::default()
            },
            None,
        )
        .with_origin("http://127.0.0.1:9");
        assert!(h2c.h1_conns().is_none());
        let https =
            Client::with_proxies(Options::default(), None).with_origin("https://example.com");
        assert!(https.h1_conns().is_none());
        let proxies = hyper_util::client::proxy::matcher::Matcher::builder()
            .all("http://127.0.0.1:3128")
            .build();
        let proxied = Client::with_proxies(Options::default(), Some(Arc::new(proxies)))
            .with_origin("http://10.0.0.1:8000");
        assert!(proxied.h1_conns().is_none());
    }
}
