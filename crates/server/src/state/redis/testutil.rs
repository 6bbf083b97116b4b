//! Test harness: a private `redis-server` per test on a free loopback port,
//! AOF in a temp dir, killed on drop. Without `redis-server` installed the
//! tests skip loudly (and fail under `CI`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use super::Redis;

pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(200);

/// A private server for one test, with its temp dir.
pub(crate) struct RedisServer {
    server: super::server::RedisServer,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for RedisServer {
    type Target = super::server::RedisServer;
    fn deref(&self) -> &Self::Target {
        &self.server
    }
}

impl RedisServer {
    /// A fresh server, or `None` (after a loud line) when none is installed.
    pub(crate) fn start() -> Option<RedisServer> {
        Self::start_with(&[])
    }

    pub(crate) fn start_with(extra: &[&str]) -> Option<RedisServer> {
        if super::server::find_binary().is_none() {
            if std::env::var_os("CI").is_some() {
                panic!("redis-server not installed (required under CI)");
            }
            eprintln!("SKIPPED: redis-server not installed");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let server = super::server::RedisServer::start(dir.path(), extra).unwrap();
        Some(RedisServer { server, _dir: dir })
    }

    /// A new client (its own connection and breaker) with the test timeout.
    pub(crate) fn client(&self) -> Redis {
        Redis::new(&self.url(), super::DEFAULT_PREFIX, CALL_TIMEOUT).unwrap()
    }

    /// One raw command on a fresh connection, for assertions on the layout.
    pub(crate) async fn raw<T: redis::FromRedisValue>(
        &self,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let client = redis::Client::open(self.url())?;
        let mut c = client.get_multiplexed_async_connection().await?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut c).await
    }

    /// SIGKILL, as a crash.
    pub(crate) fn kill(&mut self) {
        self.server.kill();
    }

    /// Starts again on the same port with the same AOF directory.
    pub(crate) fn restart(&mut self) {
        self.server.restart().unwrap();
    }

    /// SIGSTOP / SIGCONT.
    pub(crate) fn freeze(&self, frozen: bool) {
        self.server.freeze(frozen).unwrap();
    }
}
