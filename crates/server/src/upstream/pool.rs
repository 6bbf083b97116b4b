//! A provider's HTTP clients: one for HTTP/1.1 (its pool opens a
//! connection per concurrent request), several for HTTP/2, because one
//! HTTP/2 connection carries only as many streams at once as its server
//! allows (`SETTINGS_MAX_CONCURRENT_STREAMS`: hyper 200, nginx 128, Go
//! 250), and a request past that waits inside the client, unseen, against
//! its first-token timeout. A provider that may be spoken to over HTTP/2
//! (h2c with `http2_prior_knowledge`, or `https`, where ALPN picks HTTP/2
//! when the server offers it) gets one client, and so one connection, per
//! [`H2_STREAMS_PER_CONNECTION`] of its `max_concurrency` (at most
//! [`MAX_H2_CONNECTIONS`]). A request takes the first connection that
//! carries fewer than [`H2_STREAMS_PER_CONNECTION`] of this provider's
//! requests, and counts on it until its [`StreamSlot`] drops (the attempt
//! holds it to its last byte): concurrent requests share a connection, so
//! one write and one read carry several of them (spread one per connection,
//! 32 requests in flight took 2.9 `writev`s each where one connection
//! would batch them), and the next connection opens only when one is at its
//! share. Over HTTP/1.1 each client pools connections on its own, so one
//! client serves and nothing is counted.

use std::sync::atomic::{AtomicU32, Ordering};

use super::client::{check_proxy, proxies_from_env, Client, Options};
use crate::config::ProviderConfig;

/// Streams one HTTP/2 connection is given at most, on average: under every
/// common server's cap.
pub const H2_STREAMS_PER_CONNECTION: u32 = 100;
/// HTTP/2 connections per provider at most.
pub const MAX_H2_CONNECTIONS: usize = 64;

/// The clients a provider's requests go out on, with the requests each
/// carries now.
#[derive(Debug)]
pub struct HttpPool {
    clients: Box<[Client]>,
    streams: Box<[AtomicU32]>,
}

/// One request's place on one of the pool's connections: counted there
/// until dropped.
#[derive(Debug)]
pub struct StreamSlot<'a> {
    pool: &'a HttpPool,
    index: usize,
}

impl StreamSlot<'_> {
    /// The client (connection) the request goes out on.
    pub fn client(&self) -> &Client {
        &self.pool.clients[self.index]
    }
}

impl Drop for StreamSlot<'_> {
    fn drop(&mut self) {
        if self.pool.counted() {
            self.pool.streams[self.index].fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl HttpPool {
    /// One client.
    pub fn single(client: Client) -> Self {
        Self::of(Box::new([client]))
    }

    fn of(clients: Box<[Client]>) -> Self {
        let streams = clients.iter().map(|_| AtomicU32::new(0)).collect();
        HttpPool { clients, streams }
    }

    /// Whether requests are counted per connection (several clients).
    fn counted(&self) -> bool {
        self.clients.len() > 1
    }

    /// The clients for `cfg` ([`connections`] of them), reading the
    /// environment's proxies once; refused when they name a proxy the
    /// upstream cannot be reached through.
    pub fn for_provider(cfg: &ProviderConfig) -> Result<Self, String> {
        let options = Options {
            connect_timeout: cfg.connect_timeout,
            http2_prior_knowledge: cfg.http2_prior_knowledge,
        };
        let proxies = proxies_from_env();
        if let Some(m) = &proxies {
            check_proxy(m, &cfg.base_url, cfg.http2_prior_knowledge)?;
        }
        let clients = (0..connections(cfg))
            .map(|_| Client::with_proxies(options, proxies.clone()).with_origin(&cfg.base_url))
            .collect();
        Ok(Self::of(clients))
    }

    /// A place for the next request: the first connection carrying fewer
    /// than [`H2_STREAMS_PER_CONNECTION`] requests, or, with every one at
    /// its share, the one carrying fewest.
    pub fn take(&self) -> StreamSlot<'_> {
        if !self.counted() {
            return StreamSlot {
                pool: self,
                index: 0,
            };
        }
        let index = self
            .streams
            .iter()
            .position(|n| {
                // Counted first, so two requests racing for the last place
                // cannot both take it.
                let before = n.fetch_add(1, Ordering::Relaxed);
                if before < H2_STREAMS_PER_CONNECTION {
                    return true;
                }
                n.fetch_sub(1, Ordering::Relaxed);
                false
            })
            .unwrap_or_else(|| {
                let (least, n) = self
                    .streams
                    .iter()
                    .enumerate()
                    .min_by_key(|(_, n)| n.load(Ordering::Relaxed))
                    .unwrap_or((0, &self.streams[0]));
                n.fetch_add(1, Ordering::Relaxed);
                least
            });
        StreamSlot { pool: self, index }
    }

    /// Requests each connection carries now.
    #[cfg(test)]
    fn carried(&self) -> Vec<u32> {
        self.streams
            .iter()
            .map(|n| n.load(Ordering::Relaxed))
            .collect()
    }

    /// Clients (connections, over HTTP/2) in the pool.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.clients.len()
    }
}

/// How many clients `cfg` gets (see the module's doc).
pub fn connections(cfg: &ProviderConfig) -> usize {
    let tls = cfg
        .base_url
        .parse::<http::Uri>()
        .is_ok_and(|u| u.scheme_str() == Some("https"));
    if !cfg.http2_prior_knowledge && !tls {
        return 1;
    }
    (cfg.max_concurrency.div_ceil(H2_STREAMS_PER_CONNECTION) as usize).clamp(1, MAX_H2_CONNECTIONS)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn provider(extra: &str) -> ProviderConfig {
        let c = Config::from_toml_str(&format!(
            "[[providers]]\nid = \"p\"\nkind = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\n{extra}\n\
             [[providers.models]]\nname = \"m\"\n[[routes]]\nname = \"r\"\ntargets = [\"p/m\"]\n"
        ))
        .unwrap();
        c.providers[0].clone()
    }

    #[test]
    fn h2c_gets_a_connection_per_hundred_of_max_concurrency_capped() {
        let h2 = "http2_prior_knowledge = true";
        for (max, want) in [
            (1, 1),
            (64, 1),
            (100, 1),
            (101, 2),
            (1000, 10),
            (100_000, 64),
        ] {
            let cfg = provider(&format!(
                "{h2}\nmax_concurrency = {max}\nfailover_max_concurrency = 1"
            ));
            assert_eq!(connections(&cfg), want, "max_concurrency {max}");
        }
        assert_eq!(
            connections(&provider("max_concurrency = 1000")),
            1,
            "HTTP/1.1 pools on its own"
        );
        let mut https = provider("max_concurrency = 1000");
        https.base_url = https.base_url.replace("http://", "https://");
        assert_eq!(connections(&https), 10, "ALPN may pick HTTP/2");
        let pool =
            HttpPool::for_provider(&provider(&format!("{h2}\nmax_concurrency = 300"))).unwrap();
        assert_eq!(pool.len(), 3);
    }

    #[test]
    fn requests_fill_one_connection_to_its_share_before_the_next_opens() {
        let pool = HttpPool::for_provider(&provider(
            "http2_prior_knowledge = true\nmax_concurrency = 300",
        ))
        .unwrap();
        let share = H2_STREAMS_PER_CONNECTION as usize;
        let mut slots: Vec<StreamSlot<'_>> = (0..share).map(|_| pool.take()).collect();
        assert!(slots.iter().all(|s| s.index == 0));
        assert_eq!(pool.carried(), [100, 0, 0]);
        slots.extend((0..2 * share + 5).map(|_| pool.take()));
        assert_eq!(
            pool.carried(),
            [102, 102, 101],
            "past every share: the least carried"
        );
        // Requests on the first connection end: it takes the next ones again.
        let ended: Vec<_> = slots.drain(..10).collect();
        drop(ended);
        assert_eq!(pool.carried(), [92, 102, 101]);
        let again = pool.take();
        assert_eq!(again.index, 0);
        assert!(std::ptr::eq(again.client(), &pool.clients[0]));
        drop(again);
        drop(slots);
        assert_eq!(pool.carried(), [0, 0, 0], "every slot gives its place back");
    }

    #[test]
    fn one_client_counts_nothing() {
        let pool = HttpPool::for_provider(&provider("max_concurrency = 1000")).unwrap();
        let slots: Vec<_> = (0..150).map(|_| pool.take()).collect();
        assert!(slots.iter().all(|s| s.index == 0));
        assert_eq!(pool.carried(), [0]);
    }
}
