//! The server's copy of the validation records: what `Admin.RecordValidation`
//! stores (and writes to the `[golden] record` file) and what that file
//! holds (re-read when it changes, so replicas sharing it agree). Hands
//! the records to its `publish` function (the app's: a cast to the router
//! actor) on every change and every few seconds, so a restarted router has
//! them again at once. File I/O runs on the
//! blocking pool, never in an actor.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::state::validation::record::{Records, RouteValidation};

/// Where the records go on every change and every tick (the router actor).
pub type Publish = Box<dyn Fn(Arc<Records>) + Send + Sync>;

/// How often the record file is looked at and the router reminded.
const TICK: Duration = Duration::from_secs(2);

pub struct ValidationStore {
    publish: Publish,
    path: Option<PathBuf>,
    records: Mutex<Arc<Records>>,
    /// The file's modification time when last read.
    seen: Mutex<Option<SystemTime>>,
}

impl ValidationStore {
    /// Reads the record file, if one is configured (a broken file is
    /// logged and treated as empty: no target counts as validated).
    pub async fn open(publish: Publish, path: Option<PathBuf>) -> Arc<Self> {
        let store = Arc::new(ValidationStore {
            publish,
            path,
            records: Mutex::default(),
            seen: Mutex::default(),
        });
        store.reread().await;
        store
    }

    /// Stores one route's validation; `Ok(true)` when it reached the file.
    pub async fn record(&self, record: RouteValidation) -> Result<bool, String> {
        tracing::info!(route = %record.route, validated = ?record.targets.iter().filter(|t| t.validated).map(|t| t.target.as_str()).collect::<Vec<_>>(), "golden-set validation recorded");
        let persisted = match self.path.clone() {
            Some(path) => {
                let r = record.clone();
                let all = tokio::task::spawn_blocking(move || {
                    let all = Records::store(&path, r)?;
                    let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
                    Ok::<_, String>((all, mtime))
                })
                .await
                .map_err(|e| e.to_string())??;
                if let Ok(mut seen) = self.seen.lock() {
                    *seen = all.1;
                }
                self.replace(all.0);
                true
            }
            None => {
                let mut all = self.current().as_ref().clone();
                all.routes.insert(record.route.clone(), record);
                self.replace(all);
                false
            }
        };
        Ok(persisted)
    }

    pub fn current(&self) -> Arc<Records> {
        self.records.lock().map(|r| r.clone()).unwrap_or_default()
    }

    fn replace(&self, records: Records) {
        if let Ok(mut r) = self.records.lock() {
            *r = Arc::new(records);
        }
        self.publish();
    }

    fn publish(&self) {
        (self.publish)(self.current());
    }

    /// Re-reads the file if it changed since the last read (one trip to
    /// the blocking pool: the modification time, then the file if needed).
    async fn reread(&self) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let seen = self.seen.lock().map(|s| *s).unwrap_or_default();
        let read = tokio::task::spawn_blocking(move || {
            let mtime = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
            let unchanged = seen.is_some() && seen == mtime;
            (mtime, (!unchanged).then(|| Records::load(&path)))
        })
        .await;
        let Ok((mtime, Some(loaded))) = read else {
            return;
        };
        // Seen either way: a broken file is reported once per change.
        if let Ok(mut seen) = self.seen.lock() {
            *seen = mtime;
        }
        match loaded {
            Ok(records) => self.replace(records),
            Err(e) => {
                tracing::warn!(error = %e, "golden record file unreadable: keeping the records in memory");
            }
        }
    }

    /// Watches the file and reminds the router until `stop`.
    pub async fn watch(self: Arc<Self>, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
            self.reread().await;
            self.publish();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::state::validation::record::TargetValidation;

    fn route(name: &str, target: &str) -> RouteValidation {
        RouteValidation {
            route: name.into(),
            validated_unix_ms: 1,
            set: "s".into(),
            set_sha256: "0".into(),
            targets: vec![TargetValidation::sample(target, true)],
        }
    }

    #[tokio::test]
    async fn records_reach_the_file_and_the_file_wins_unless_broken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("golden.json");
        let store = ValidationStore::open(Box::new(|_| {}), Some(path.clone())).await;
        assert!(store.current().routes.is_empty());
        assert!(store.record(route("a", "p/m")).await.unwrap(), "persisted");
        assert!(Records::load(&path).unwrap().routes["a"].validated("p/m"));
        // Another replica wrote the file: read on the next look.
        let mut other = Records::default();
        other.routes.insert("b".into(), route("b", "q/n"));
        std::thread::sleep(std::time::Duration::from_millis(10));
        other.save(&path).unwrap();
        store.reread().await;
        assert!(store.current().routes.contains_key("b"));
        assert!(!store.current().routes.contains_key("a"));
        // A broken file keeps what is in memory.
        std::thread::sleep(std::time::Duration::from_millis(10));
        std::fs::write(&path, "{broken").unwrap();
        store.reread().await;
        assert!(store.current().routes.contains_key("b"));
        // Without a file, records live in memory only.
        let memory = ValidationStore::open(Box::new(|_| {}), None).await;
        assert!(!memory.record(route("a", "p/m")).await.unwrap());
        assert!(memory.current().routes["a"].validated("p/m"));
    }
}
