//! Test harness: a private `redis-server` per test on a free loopback port,
//! AOF in a temp dir, killed on drop. Without `redis-server` installed the
//! tests skip loudly (and fail under `CI`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::Redis;

pub(crate) const CALL_TIMEOUT: Duration = Duration::from_millis(200);

pub(crate) struct RedisServer {
    binary: PathBuf,
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

fn find_binary() -> Option<PathBuf> {
    let fixed = PathBuf::from("/usr/bin/redis-server");
    if fixed.exists() {
        return Some(fixed);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("redis-server"))
            .find(|p| p.exists())
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if buf[..n].starts_with(b"+PONG"))
}

impl RedisServer {
    /// A fresh server, or `None` (after a loud line) when none is installed.
    pub(crate) fn start() -> Option<RedisServer> {
        Self::start_with(&[])
    }

    pub(crate) fn start_with(extra: &[&str]) -> Option<RedisServer> {
        let Some(binary) = find_binary() else {
            if std::env::var_os("CI").is_some() {
                panic!("redis-server not installed (required under CI)");
            }
            eprintln!("SKIPPED: redis-server not installed");
            return None;
        };
        let mut server = RedisServer {
            binary,
            child: None,
            port: free_port(),
            dir: tempfile::tempdir().unwrap(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.launch();
        Some(server)
    }

    fn launch(&mut self) {
        let child = Command::new(&self.binary)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(self.port) {
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer PING"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
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
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port with the same AOF directory.
    pub(crate) fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// SIGSTOP / SIGCONT: a server that accepts nothing and answers nothing.
    pub(crate) fn freeze(&self, frozen: bool) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        let sig = if frozen { "-STOP" } else { "-CONT" };
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success());
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        self.kill();
    }
}
