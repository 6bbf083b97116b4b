//! Config reload: SIGHUP, a change of the file, or `Admin.ReloadConfig`
//! re-read the file, validate it, re-read TLS certificates, and hand the
//! new config and provider runtimes to the supervisor; an invalid file is
//! rejected with its dotted path and the old config stays. The front doors
//! read the config in force from here (`api` never imports `app`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use ractor::ActorRef;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use crate::actors::provider::ProviderRuntime;
use crate::actors::supervisor::{ReloadReport, SupervisorMsg};
use crate::config::{Config, ConfigError};
use crate::tls::{self, TlsState};

/// Re-reads the config file and applies it if valid (SIGHUP, file change,
/// `Admin.ReloadConfig`). Providers and routes, their policies, budgets and
/// timeouts are reloaded; listeners, TLS, auth and limits need a restart.
pub struct Reloader {
    pub(crate) path: Option<PathBuf>,
    pub(crate) supervisor: ActorRef<SupervisorMsg>,
    /// Digest of the last file applied (or rejected), for the file watcher.
    pub(crate) last_seen: Mutex<[u8; 32]>,
    /// The config in force.
    pub(crate) current: Mutex<Arc<Config>>,
    /// TLS of the gRPC listener, when on: certificates are re-read on reload.
    pub(crate) tls: Option<Arc<TlsState>>,
}

impl Reloader {
    /// Reloads now; `Err` carries why the new file was rejected (the old one
    /// stays). A file that keeps none of the routes in force is refused
    /// unless `force`.
    pub async fn reload(&self, force: bool) -> Result<ReloadReport, String> {
        let path = self
            .path
            .as_ref()
            .ok_or("no --config file: nothing to reload")?;
        let text =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if let Ok(mut last) = self.last_seen.lock() {
            *last = Sha256::digest(&text).into();
        }
        let result = self.apply(&text, force).await;
        match &result {
            Ok(report) => tracing::info!(file = %path.display(), "{}", report.summary()),
            Err(e) => {
                tracing::error!(file = %path.display(), error = %e, "config reload rejected; keeping the config in force")
            }
        }
        result
    }

    async fn apply(&self, text: &[u8], force: bool) -> Result<ReloadReport, String> {
        let text = std::str::from_utf8(text).map_err(|_| "the file is not UTF-8".to_string())?;
        let config = Config::from_toml_str(text).map_err(|e| e.to_string())?;
        if !force {
            if let Some(current) = self.config() {
                let kept = current
                    .routes
                    .iter()
                    .any(|old| config.routes.iter().any(|new| new.name == old.name));
                if !kept {
                    return Err(format!(
                        "routes: the new file removes every route in force ({}); refused (reload with force to apply it)",
                        current
                            .routes
                            .iter()
                            .map(|r| r.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                }
            }
        }
        if let Some((path, env)) = config.missing_env().into_iter().next() {
            return Err(format!("{path}: environment variable {env} is not set"));
        }
        let fresh = runtimes(&config).map_err(|e| e.to_string())?;
        // Certificates are re-read (rotation) and checked before anything is applied.
        let tls = match (&self.tls, &config.server.tls) {
            (Some(_), Some(t)) => Some(tls::load(t)?),
            _ => None,
        };
        let config = Arc::new(config);
        let answer = self
            .supervisor
            .call(
                |reply| SupervisorMsg::Reload {
                    config: config.clone(),
                    runtimes: fresh,
                    reply,
                },
                Some(std::time::Duration::from_secs(10)),
            )
            .await;
        let mut report = match answer {
            Ok(ractor::rpc::CallResult::Success(report)) => report,
            _ => return Err("the supervisor did not apply the config".into()),
        };
        if let (Some(state), Some(tls)) = (&self.tls, tls) {
            state.swap(tls);
        }
        if let Ok(mut current) = self.current.lock() {
            let mut old_server = current.server.clone();
            if self.tls.is_some() && config.server.tls.is_some() {
                // Certificate paths are reloaded live; turning TLS on or off is not.
                old_server.tls = config.server.tls.clone();
            }
            if old_server != config.server
                || current.auth != config.auth
                || current.limits != config.limits
                || current.state != config.state
            {
                report.restart_needed = true;
            }
            *current = config;
        }
        Ok(report)
    }

    /// The config in force.
    pub fn config(&self) -> Option<Arc<Config>> {
        self.current.lock().ok().map(|c| c.clone())
    }

    /// Polls the file and reloads when its content changes (ConfigMap updates
    /// swap symlinks, so content, not mtime, is compared) and has settled:
    /// the same content twice, `SETTLE` apart, so a non-atomic write is not
    /// read half-way.
    pub(crate) async fn watch(self: Arc<Self>, stop: CancellationToken) {
        let Some(path) = self.path.clone() else {
            return;
        };
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
            }
            let Ok(text) = std::fs::read(&path) else {
                continue;
            };
            let digest: [u8; 32] = Sha256::digest(&text).into();
            let changed = self
                .last_seen
                .lock()
                .map(|last| *last != digest)
                .unwrap_or(false);
            if !changed {
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SETTLE) => {}
            }
            let settled = std::fs::read(&path)
                .map(|again| <[u8; 32]>::from(Sha256::digest(&again)) == digest)
                .unwrap_or(false);
            if settled {
                tracing::info!(file = %path.display(), "config file changed; reloading");
                let _ = self.reload(false).await;
            }
        }
    }
}

/// How long a changed config file must stay the same before it is read.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// One provider runtime per configured provider (keys read from the environment).
pub(crate) fn runtimes(
    config: &Config,
) -> Result<HashMap<String, Arc<ProviderRuntime>>, ConfigError> {
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
