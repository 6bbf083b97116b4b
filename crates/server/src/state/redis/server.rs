//! A private `redis-server` process on a free loopback port with AOF in a
//! given directory: what the fleet tests and the `state` bench start. Not
//! used by `serve` (operators run their own Redis).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or killed, restartable) `redis-server`.
pub struct RedisServer {
    binary: PathBuf,
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
}

/// `redis-server` on this machine, if installed.
pub fn find_binary() -> Option<PathBuf> {
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

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
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
    /// Starts one with AOF (`appendonly yes`, plus `extra` flags) in `dir`
    /// and waits until it answers PING (10 s at most).
    pub fn start(dir: &Path, extra: &[&str]) -> Result<RedisServer, String> {
        let binary = find_binary().ok_or("redis-server is not installed")?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut server = RedisServer {
            binary,
            child: None,
            port: free_port()?,
            dir: dir.to_path_buf(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.launch()?;
        Ok(server)
    }

    fn launch(&mut self) -> Result<(), String> {
        let child = Command::new(&self.binary)
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ping(self.port) {
            if Instant::now() >= deadline {
                return Err("redis-server did not answer PING".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again on the same port with the same AOF directory.
    pub fn restart(&mut self) -> Result<(), String> {
        self.kill();
        self.launch()
    }

    /// SIGSTOP / SIGCONT: a server that accepts nothing and answers nothing.
    pub fn freeze(&self, frozen: bool) -> Result<(), String> {
        let pid = self.pid().ok_or("not running")?.to_string();
        let sig = if frozen { "-STOP" } else { "-CONT" };
        let status = Command::new("kill")
            .args([sig, &pid])
            .status()
            .map_err(|e| e.to_string())?;
        status
            .success()
            .then_some(())
            .ok_or_else(|| format!("kill {sig} failed"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a stopped process too.
        self.kill();
    }
}
