//! TLS for the gRPC listener, reloadable: the certificate, key and optional
//! client CA are read from their PEM files at start and again at every config
//! reload, and new connections use whatever is current (open ones keep theirs).
//! With `client_ca`, callers must present a certificate signed by it.
//! Beside `config`, below the doors and the reloader that both use it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::config::TlsConfig;

/// Reads the PEM files into a server config (h2 only).
pub fn load(cfg: &TlsConfig) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cfg.cert)
        .and_then(|i| i.collect())
        .map_err(|e| format!("server.tls.cert: {}: {e}", cfg.cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "server.tls.cert: {}: no certificate",
            cfg.cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(&cfg.key)
        .map_err(|e| format!("server.tls.key: {}: {e}", cfg.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("server.tls: {e}"))?;
    let builder = match &cfg.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|e| format!("server.tls.client_ca: {}: {e}", ca.display()))?
            {
                let cert =
                    cert.map_err(|e| format!("server.tls.client_ca: {}: {e}", ca.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("server.tls.client_ca: {}: {e}", ca.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("server.tls.client_ca: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("server.tls: the key does not fit the certificate: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The TLS settings in force; swapped on reload.
pub struct TlsState {
    current: RwLock<Arc<ServerConfig>>,
}

impl TlsState {
    pub fn new(config: Arc<ServerConfig>) -> Arc<Self> {
        Arc::new(TlsState {
            current: RwLock::new(config),
        })
    }

    /// Uses `config` for connections accepted from now on.
    pub fn swap(&self, config: Arc<ServerConfig>) {
        if let Ok(mut c) = self.current.write() {
            *c = config;
        }
    }

    fn acceptor(&self) -> Option<TlsAcceptor> {
        self.current
            .read()
            .ok()
            .map(|c| TlsAcceptor::from(c.clone()))
    }
}

/// Completes each accepted connection's handshake in its own task (a slow or
/// failed handshake holds up no one) and yields TLS streams.
pub fn incoming<S>(
    accepted: impl Stream<Item = std::io::Result<S>> + Send + 'static,
    tls: Arc<TlsState>,
    stop: CancellationToken,
) -> ReceiverStream<Result<TlsStream<S>, std::io::Error>>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut accepted = std::pin::pin!(accepted);
        loop {
            let next = tokio::select! {
                _ = stop.cancelled() => return,
                a = accepted.next() => a,
            };
            let tcp = match next {
                None => return,
                Some(Err(_)) => continue,
                Some(Ok(tcp)) => tcp,
            };
            let Some(acceptor) = tls.acceptor() else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
