//! The processes a benchmark drives: `mock-upstream` instances (controlled
//! over `/_mock/*`) and `switchyard serve` with a generated config, both the
//! real binary on 127.0.0.1 ephemeral ports. Reads Switchyard's CPU time and
//! RSS from `/proc/PID/{stat,status}`; every child is killed on drop.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::{BenchError, Ctx};
use switchyard_mock::{LimitsView, RequestRecord, Stats};

/// Clock ticks per second of `/proc/PID/stat` (USER_HZ, 100 on Linux).
const CLK_TCK: f64 = 100.0;
/// How long a child may take to print its banner.
const BANNER_TIMEOUT: Duration = Duration::from_secs(30);

/// Spawns `exe args`, reads stdout until a line containing `marker`, keeps
/// draining stdout; stderr goes to `log`.
async fn spawn_with_banner(
    ctx: &Ctx,
    exe: &std::path::Path,
    args: &[&str],
    marker: &str,
    log: &str,
) -> Result<(Child, String), BenchError> {
    let what = format!("switchyard {}", args.first().copied().unwrap_or(""));
    let log_file = std::fs::File::create(ctx.path(log))
        .map_err(|e| BenchError::start(&what, format!("log file {log}: {e}")))?;
    let mut child = Command::new(exe)
        .args(args)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("RUST_LOG")
        // Allocations are counted in every bench run (one relaxed add each).
        .env(switchyard::telemetry::alloc::ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BenchError::start(&what, e))?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::start(&what, "no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let banner = tokio::time::timeout(BANNER_TIMEOUT, async {
        for _ in 0..1000 {
            match lines.next_line().await {
                Ok(Some(line)) if line.contains(marker) => return Ok(line),
                Ok(Some(_)) => continue,
                Ok(None) => return Err(format!("exited before printing `{marker}` (see {log})")),
                Err(e) => return Err(e.to_string()),
            }
        }
        Err(format!("no `{marker}` line"))
    })
    .await
    .map_err(|_| BenchError::start(&what, format!("no banner within {BANNER_TIMEOUT:?}")))?
    .map_err(|e| BenchError::start(&what, e))?;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, banner))
}

fn parse_addr(s: Option<&str>, what: &str, line: &str) -> Result<SocketAddr, BenchError> {
    s.and_then(|s| s.parse().ok())
        .ok_or_else(|| BenchError::start(what, format!("unexpected banner `{line}`")))
}

/// A running `switchyard mock-upstream`.
pub struct MockProc {
    pub name: String,
    pub addr: SocketAddr,
    child: Child,
    http: reqwest::Client,
}

/// Settings of a mock at start.
#[derive(Debug, Clone)]
pub struct MockSpec {
    pub kind: &'static str,
    pub tokens: u32,
    pub token_delay_ms: u64,
    pub max_concurrency: u32,
    /// Initial fault (JSON), if any.
    pub fault: Option<Value>,
}

impl MockSpec {
    pub fn new(kind: &'static str, tokens: u32, token_delay_ms: u64) -> Self {
        MockSpec {
            kind,
            tokens,
            token_delay_ms,
            max_concurrency: 0,
            fault: None,
        }
    }
}

impl MockProc {
    pub async fn start(ctx: &Ctx, name: &str, spec: &MockSpec) -> Result<MockProc, BenchError> {
        let tokens = spec.tokens.to_string();
        let delay = spec.token_delay_ms.to_string();
        let cap = spec.max_concurrency.to_string();
        let fault = spec.fault.as_ref().map(|f| f.to_string());
        let mut args = vec![
            "mock-upstream",
            "--listen",
            "127.0.0.1:0",
            "--kind",
            spec.kind,
            "--tokens",
            &tokens,
            "--token-delay-ms",
            &delay,
            "--max-concurrency",
            &cap,
        ];
        if let Some(f) = &fault {
            args.push("--fault");
            args.push(f);
        }
        let log = format!("mock-{name}.log");
        let (child, line) =
            spawn_with_banner(ctx, &ctx.exe, &args, "mock-upstream listening on", &log).await?;
        let addr = parse_addr(
            line.split("http://")
                .nth(1)
                .and_then(|s| s.split_whitespace().next()),
            "mock-upstream",
            &line,
        )?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .no_proxy()
            .build()
            .map_err(|e| BenchError::start("mock control client", e))?;
        Ok(MockProc {
            name: name.to_string(),
            addr,
            child,
            http,
        })
    }

    /// CPU and memory of the mock process now.
    pub fn usage(&self) -> Usage {
        self.child.id().and_then(proc_usage).unwrap_or_default()
    }

    /// `http://ADDR/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn send(&self, req: reqwest::RequestBuilder, what: &str) -> Result<String, BenchError> {
        let err = |e: String| BenchError::Mock(format!("{} {what}: {e}", self.name));
        let r = req.send().await.map_err(|e| err(e.to_string()))?;
        let status = r.status();
        let text = r.text().await.map_err(|e| err(e.to_string()))?;
        if !status.is_success() {
            return Err(err(format!("{status}: {text}")));
        }
        Ok(text)
    }

    /// `PUT /_mock/faults`.
    pub async fn set_fault(&self, spec: &Value) -> Result<(), BenchError> {
        let req = self.http.put(self.url("/_mock/faults")).json(spec);
        self.send(req, "PUT /_mock/faults").await.map(|_| ())
    }

    /// `PUT /_mock/config`.
    pub async fn set_config(&self, cfg: &Value) -> Result<(), BenchError> {
        let req = self.http.put(self.url("/_mock/config")).json(cfg);
        self.send(req, "PUT /_mock/config").await.map(|_| ())
    }

    /// `GET /_mock/stats`.
    pub async fn stats(&self) -> Result<Stats, BenchError> {
        let text = self
            .send(self.http.get(self.url("/_mock/stats")), "GET /_mock/stats")
            .await?;
        serde_json::from_str(&text).map_err(|e| BenchError::Mock(format!("{}: {e}", self.name)))
    }

    /// `GET /_mock/requests`.
    pub async fn requests(&self) -> Result<Vec<RequestRecord>, BenchError> {
        let text = self
            .send(
                self.http.get(self.url("/_mock/requests")),
                "GET /_mock/requests",
            )
            .await?;
        serde_json::from_str(&text).map_err(|e| BenchError::Mock(format!("{}: {e}", self.name)))
    }

    /// `PUT /_mock/limits` (resets every key's window and counters).
    pub async fn set_limits(&self, spec: &Value) -> Result<(), BenchError> {
        let req = self.http.put(self.url("/_mock/limits")).json(spec);
        self.send(req, "PUT /_mock/limits").await.map(|_| ())
    }

    /// `GET /_mock/limits`: each key's window, peak and 429 count, by label.
    pub async fn limits(&self) -> Result<LimitsView, BenchError> {
        let text = self
            .send(
                self.http.get(self.url("/_mock/limits")),
                "GET /_mock/limits",
            )
            .await?;
        serde_json::from_str(&text).map_err(|e| BenchError::Mock(format!("{}: {e}", self.name)))
    }

    /// `PUT /_mock/keys` (e.g. `{"labels": {"<key>": "a"}}`).
    pub async fn set_keys(&self, rules: &Value) -> Result<(), BenchError> {
        let req = self.http.put(self.url("/_mock/keys")).json(rules);
        self.send(req, "PUT /_mock/keys").await.map(|_| ())
    }

    /// `DELETE /_mock/requests` (also restarts `max_in_flight`).
    pub async fn clear(&self) -> Result<(), BenchError> {
        let req = self.http.delete(self.url("/_mock/requests"));
        self.send(req, "DELETE /_mock/requests").await.map(|_| ())
    }

    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// A provider block of a generated config.
#[derive(Debug, Clone)]
pub struct Provider {
    pub id: &'static str,
    pub kind: &'static str,
    pub url: String,
    pub max_concurrency: u32,
    pub failover_max_concurrency: u32,
    /// Extra `key = value` lines (breaker, probes, ...).
    pub extra: String,
    /// Extra `key = value` lines of its model `m` (price, capabilities).
    pub model_extra: String,
    /// `first_token_timeout` and `idle_timeout`.
    pub timeout: &'static str,
    /// The name of its one model (`m` unless set).
    pub model: &'static str,
}

impl Provider {
    pub fn new(id: &'static str, kind: &'static str, mock: &MockProc) -> Self {
        Provider {
            id,
            kind,
            url: mock.base_url(),
            max_concurrency: 64,
            failover_max_concurrency: 16,
            extra: String::new(),
            model_extra: String::new(),
            timeout: "5s",
            model: "m",
        }
    }

    pub fn caps(mut self, max: u32, failover: u32) -> Self {
        self.max_concurrency = max;
        self.failover_max_concurrency = failover;
        self
    }

    pub fn extra(mut self, extra: impl Into<String>) -> Self {
        self.extra = extra.into();
        self
    }

    pub fn model_extra(mut self, extra: impl Into<String>) -> Self {
        self.model_extra = extra.into();
        self
    }

    /// Names its model `model` instead of `m`.
    pub fn model(mut self, model: &'static str) -> Self {
        self.model = model;
        self
    }
}

/// A Switchyard config: `top` holds top-level `key = value` lines
/// (e.g. `retry_budget = {...}`), routes are `(name, ["provider", ...])`.
pub fn config_text(top: &str, providers: &[Provider], routes: &[(&str, &[&str])]) -> String {
    let mut s = String::new();
    s.push_str(top);
    s.push_str(
        "\n[server]\ngrpc_listen = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         watch_config = false\ndrain_timeout = \"1s\"\n",
    );
    for p in providers {
        s.push_str(&format!(
            "\n[[providers]]\nid = \"{}\"\nkind = \"{}\"\nbase_url = \"{}\"\n\
             max_concurrency = {}\nfailover_max_concurrency = {}\n\
             connect_timeout = \"1s\"\nfirst_token_timeout = \"{t}\"\nidle_timeout = \"{t}\"\n{}\n\
             [[providers.models]]\nname = \"{}\"\n{}\n",
            p.id,
            p.kind,
            p.url,
            p.max_concurrency,
            p.failover_max_concurrency,
            p.extra,
            p.model,
            p.model_extra,
            t = p.timeout
        ));
    }
    for (name, targets) in routes {
        s.push_str(&route_text(name, targets, ""));
    }
    s
}

/// One `[[routes]]` block over model `m` of `targets`, with `extra` lines
/// (caches, ladder) after them.
pub fn route_text(name: &str, targets: &[&str], extra: &str) -> String {
    let t: Vec<String> = targets.iter().map(|t| format!("{t}/m")).collect();
    route_over(name, &t, extra)
}

/// One `[[routes]]` block over `provider/model` targets, with `extra` lines.
pub fn route_over(name: &str, targets: &[String], extra: &str) -> String {
    let t: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    format!(
        "\n[[routes]]\nname = \"{name}\"\ntargets = [{}]\n{extra}\n",
        t.join(", ")
    )
}

/// `config` with the OpenAI/Anthropic HTTP door on an ephemeral port.
pub fn with_http_door(config: String) -> String {
    config.replacen(
        "admin_listen = \"127.0.0.1:0\"\n",
        // Connections up to the load generator's in-flight cap: an overload
        // shows as latency, not as connections refused at accept.
        "admin_listen = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\nhttp_max_connections = 6000\n",
        1,
    )
}

/// A running `switchyard serve`.
pub struct RouterProc {
    pub pid: u32,
    pub grpc: SocketAddr,
    pub admin: SocketAddr,
    /// The HTTP front door, when the config opens one.
    pub http: Option<SocketAddr>,
    child: Child,
}

/// CPU time and memory of a process at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// User plus system CPU seconds since start.
    pub cpu_s: f64,
    pub rss_kb: u64,
    /// Peak RSS (VmHWM) since start or the last [`RouterProc::reset_peak`].
    pub hwm_kb: u64,
    /// Times its threads were switched out (voluntary and not), summed over
    /// the threads alive now.
    pub switches: u64,
}

impl RouterProc {
    /// Writes `switchyard-TAG.toml` under `--out` and serves it.
    pub async fn start(ctx: &Ctx, tag: &str, config: &str) -> Result<RouterProc, BenchError> {
        Self::start_exe(ctx, &ctx.exe, tag, config).await
    }

    /// Like [`RouterProc::start`], with another `switchyard` build.
    pub async fn start_exe(
        ctx: &Ctx,
        exe: &std::path::Path,
        tag: &str,
        config: &str,
    ) -> Result<RouterProc, BenchError> {
        switchyard::config::Config::from_toml_str(config)
            .map_err(|e| BenchError::start(format!("switchyard ({tag})"), e))?;
        let path = ctx.path(&format!("switchyard-{tag}.toml"));
        std::fs::write(&path, config)
            .map_err(|e| BenchError::Io(format!("cannot write {}: {e}", path.display())))?;
        let path_s = path.display().to_string();
        let (child, line) = spawn_with_banner(
            ctx,
            exe,
            &["serve", "--config", &path_s],
            "switchyard serving grpc=",
            &format!("switchyard-{tag}.log"),
        )
        .await?;
        let grpc = parse_addr(
            line.split("grpc=")
                .nth(1)
                .and_then(|s| s.split_whitespace().next()),
            "switchyard",
            &line,
        )?;
        let field = |name: &str| {
            line.split(&format!(" {name}="))
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
        };
        let admin = parse_addr(field("admin"), "switchyard", &line)?;
        let http = field("http").and_then(|s| s.parse().ok());
        let pid = child
            .id()
            .ok_or_else(|| BenchError::start("switchyard", "exited at once"))?;
        Ok(RouterProc {
            pid,
            grpc,
            admin,
            http,
            child,
        })
    }

    /// `GET` of an admin path (`/metrics`, `/v1/status`), as text.
    pub async fn admin_get(&self, path: &str) -> Result<String, BenchError> {
        let err = |e: reqwest::Error| BenchError::Io(format!("switchyard admin {path}: {e}"));
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(err)?
            .get(format!("http://{}{path}", self.admin))
            .send()
            .await
            .map_err(err)?
            .text()
            .await
            .map_err(err)
    }

    /// Heap allocations and bytes counted so far (`/metrics`), if exported.
    /// The counters the overhead scenario reads from `/metrics`: allocations
    /// (count, bytes; with `SWITCHYARD_COUNT_ALLOCATIONS=1`) and the request
    /// path's actor messages (`switchyard_actor_calls_total`, absent from
    /// builds before it existed).
    pub async fn counters(&self, http: &reqwest::Client) -> Option<Counters> {
        let text = http
            .get(format!("http://{}/metrics", self.admin))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        Some(Counters::read(&text))
    }
    /// CPU and memory now (zeros when `/proc` cannot be read).
    pub fn usage(&self) -> Usage {
        proc_usage(self.pid).unwrap_or_default()
    }

    /// Restarts VmHWM from the current RSS (`/proc/PID/clear_refs` 5).
    /// Returns false when the kernel refused; the peak is then since start.
    pub fn reset_peak(&self) -> bool {
        std::fs::write(format!("/proc/{}/clear_refs", self.pid), "5").is_ok()
    }

    pub async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }

    /// Records a flat `perf` profile of this process for `d` into
    /// `file`; returns when done. Errors are reported, never fatal.
    pub async fn perf_record(&self, file: &std::path::Path, d: Duration) -> Result<(), String> {
        let status = Command::new("perf")
            .args(["record", "-F", "999", "-p", &self.pid.to_string(), "-o"])
            .arg(file)
            .args(["--", "sleep", &format!("{:.1}", d.as_secs_f64())])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .status()
            .await
            .map_err(|e| format!("perf: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("perf record exited with {status}"))
        }
    }
}

/// CPU seconds this process (the load generator) has used.
pub fn self_usage() -> Usage {
    proc_usage(std::process::id()).unwrap_or_default()
}

/// Reads `/proc/PID/stat` (utime, stime) and `/proc/PID/status` (VmRSS, VmHWM).
pub fn proc_usage(pid: u32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`, which may contain spaces: state is field 3.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based), i.e. 11 and 12 after state's 0.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> u64 {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Some(Usage {
        cpu_s: (utime + stime) / CLK_TCK,
        rss_kb: kb("VmRSS:"),
        hwm_kb: kb("VmHWM:"),
        switches: thread_switches(pid),
    })
}

/// Context switches of every thread of `pid` (`/proc/PID/task/*/status`):
/// a thread that sleeps for want of work and is woken for the next piece
/// counts one. A thread that exited takes its count with it.
fn thread_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    let count = |status: &str, key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .map(|s| count(&s, "voluntary_ctxt_switches:") + count(&s, "nonvoluntary_ctxt_switches:"))
        .sum()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bench_reads_its_own_proc_usage() {
        let u = proc_usage(std::process::id()).unwrap();
        assert!(u.rss_kb > 0);
        assert!(u.hwm_kb >= u.rss_kb);
        // A thread that sleeps and wakes is counted.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let after = proc_usage(std::process::id()).unwrap();
        assert!(
            after.switches > u.switches,
            "{} then {}",
            u.switches,
            after.switches
        );
    }

    #[test]
    fn bench_generated_config_is_valid() {
        let p = Provider {
            id: "primary",
            kind: "openai",
            url: "http://127.0.0.1:1/v1".into(),
            max_concurrency: 10,
            failover_max_concurrency: 5,
            extra: "synthetic_probes = true\nbreaker = { consecutive_failures = 3 }".into(),
            model_extra: "price = { input_per_mtok = 2.5, output_per_mtok = 10.0 }".into(),
            timeout: "30s",
            model: "m",
        };
        let text = config_text(
            "retry_budget = { ratio = 0.2 }",
            &[p],
            &[("chat", &["primary"])],
        );
        let c = switchyard::config::Config::from_toml_str(&text).unwrap();
        assert_eq!(c.providers[0].failover_max_concurrency, 5);
        assert_eq!(c.routes[0].targets.len(), 1);
        assert_eq!(c.providers[0].models[0].price.output_per_mtok, 10.0);
    }
}

/// Counters read from one `/metrics` page.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Heap allocations and bytes so far.
    pub allocations: Option<(u64, u64)>,
    /// Actor messages the request path sent so far: calls (a reply awaited)
    /// and casts (none), and provider permits taken through the gate.
    pub actor_calls: Option<u64>,
    pub actor_casts: Option<u64>,
    pub gate_permits: Option<u64>,
}

impl Counters {
    pub fn read(text: &str) -> Counters {
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
        };
        let actor = |message: &str| {
            let label = format!("message=\"{message}\"");
            text.lines()
                .filter(|l| l.starts_with("switchyard_actor_calls_total{") && l.contains(&label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .map(|v| v as u64)
                .reduce(|a, b| a + b)
        };
        let calls = match (actor("withdraw_retry"), actor("admit")) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        Counters {
            allocations: value("switchyard_process_allocations_total ")
                .zip(value("switchyard_process_allocated_bytes_total ")),
            actor_calls: calls,
            // An older build counted its plans' casts to the router (and not
            // its outcome reports); this one counts the reports.
            actor_casts: match (actor("planned"), actor("report")) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
            },
            gate_permits: actor("gate"),
        }
    }
}

#[cfg(test)]
mod counters_tests {
    use super::Counters;

    #[test]
    fn counters_are_read_from_the_metrics_page() {
        let text = "switchyard_process_allocations_total 10\n\
                    switchyard_process_allocated_bytes_total 20\n\
                    switchyard_actor_calls_total{actor=\"router\",message=\"planned\"} 5\n\
                    switchyard_actor_calls_total{actor=\"router\",message=\"withdraw_retry\"} 1\n\
                    switchyard_actor_calls_total{actor=\"provider\",message=\"admit\"} 2\n\
                    switchyard_actor_calls_total{actor=\"provider\",message=\"gate\"} 3\n";
        let now = "switchyard_actor_calls_total{actor=\"provider\",message=\"report\"} 4\n";
        assert_eq!(Counters::read(now).actor_casts, Some(4));
        let c = Counters::read(text);
        assert_eq!(c.allocations, Some((10, 20)));
        assert_eq!(c.actor_calls, Some(3));
        assert_eq!(c.actor_casts, Some(5));
        assert_eq!(c.gate_permits, Some(3));
        assert_eq!(
            Counters::read("").actor_calls,
            None,
            "an older build has none"
        );
    }
}
