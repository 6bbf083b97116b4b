//! A provider's HTTP clients: one for HTTP/1.1 (its pool opens a
//! connection per concurrent request), several for HTTP/2, because one
//! HTTP/2 connection carries only as many streams at once as its server
//! allows (`SETTINGS_MAX_CONCURRENT_STREAMS`: hyper 200, nginx 128, Go
//! 250), and a request past that waits inside the client, unseen, against
//! its first-token timeout. A provider that may be spoken to over HTTP/2
//! (h2c with `http2_prior_knowledge`, or `https`, where ALPN picks HTTP/2
//! when the server offers it) gets one client, and so one connection, per
//! [`H2_STREAMS_PER_CONNECTION`] of its `max_concurrency` (at most
//! [`MAX_H2_CONNECTIONS`]), and each request takes the next client in turn.
//! Over HTTP/1.1 each client pools connections on its own, so several
//! clients only split one pool.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::client::{check_proxy, proxies_from_env, Client, Options};
use crate::config::ProviderConfig;

/// Streams one HTTP/2 connection is given at most, on average: under every
/// common server's cap.
pub const H2_STREAMS_PER_CONNECTION: u32 = 100;
/// HTTP/2 connections per provider at most.
pub const MAX_H2_CONNECTIONS: usize = 64;

/// The clients a provider's requests go out on, taken in turn.
#[derive(Debug)]
pub struct HttpPool {
    clients: Box<[Client]>,
    next: AtomicUsize,
}

impl HttpPool {
    /// One client.
    pub fn single(client: Client) -> Self {
        HttpPool {
            clients: Box::new([client]),
            next: AtomicUsize::new(0),
        }
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
            .map(|_| Client::with_proxies(options, proxies.clone()))
            .collect();
        Ok(HttpPool {
            clients,
            next: AtomicUsize::new(0),
        })
    }

    /// The client for the next request.
    pub fn pick(&self) -> &Client {
        let i = match self.clients.len() {
            1 => 0,
            n => self.next.fetch_add(1, Ordering::Relaxed) % n,
        };
        &self.clients[i]
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
        // Taken in turn.
        let picks: Vec<*const Client> = (0..6).map(|_| pool.pick() as *const _).collect();
        assert_eq!(picks[0], picks[3]);
        assert_eq!(picks[1], picks[4]);
        assert_ne!(picks[0], picks[1]);
        assert_ne!(picks[1], picks[2]);
    }
}
