//! Test harness: starts the real `switchyard` binary (`serve` and
//! `mock-upstream`) on 127.0.0.1 with ephemeral ports, reads the addresses they
//! print, and offers a gRPC client and the mock's control API.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use switchyard::proto;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

pub const BIN: &str = env!("CARGO_BIN_EXE_switchyard");

/// Reads lines from a child's pipe into a shared buffer; returns the first line.
async fn first_line_and_capture(
    pipe: impl AsyncRead + Unpin + Send + 'static,
    sink: Arc<Mutex<String>>,
) -> String {
    let mut lines = BufReader::new(pipe).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("process printed its address in time")
        .expect("read stdout")
        .expect("process exited before printing its address");
    sink.lock().unwrap().push_str(&format!("{first}\n"));
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            sink.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
    first
}

fn capture(pipe: impl AsyncRead + Unpin + Send + 'static, sink: Arc<Mutex<String>>) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(pipe).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            sink.lock().unwrap().push_str(&format!("{line}\n"));
        }
    });
}

/// A running `switchyard mock-upstream`.
pub struct Mock {
    pub child: Child,
    pub addr: String,
    http: reqwest::Client,
}

impl Mock {
    pub async fn start(kind: &str, extra: &[&str]) -> Mock {
        Self::start_with_env(kind, extra, &[]).await
    }

    /// [`Mock::start`] with environment variables for the mock process.
    pub async fn start_with_env(kind: &str, extra: &[&str], env: &[(&str, &str)]) -> Mock {
        let mut child = Command::new(BIN)
            .args(["mock-upstream", "--listen", "127.0.0.1:0", "--kind", kind])
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn mock-upstream");
        let line = first_line_and_capture(child.stdout.take().unwrap(), Default::default()).await;
        // "mock-upstream listening on http://ADDR kind=KIND"
        let addr = line
            .split("http://")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected mock banner: {line}"))
            .to_string();
        Mock {
            child,
            addr,
            http: reqwest::Client::new(),
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub async fn set_fault(&self, fault: Value) {
        let r = self
            .http
            .put(format!("http://{}/_mock/faults", self.addr))
            .json(&fault)
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "fault rejected: {}",
            r.text().await.unwrap()
        );
    }

    pub async fn set_config(&self, config: Value) {
        let r = self
            .http
            .put(format!("http://{}/_mock/config", self.addr))
            .json(&config)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }

    pub async fn requests(&self) -> Vec<Value> {
        self.http
            .get(format!("http://{}/_mock/requests", self.addr))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn stats(&self) -> Value {
        self.http
            .get(format!("http://{}/_mock/stats", self.addr))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn clear(&self) {
        self.http
            .delete(format!("http://{}/_mock/requests", self.addr))
            .send()
            .await
            .unwrap();
    }

    /// Polls the log until `pred` holds for it (the mock records asynchronously).
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        self.wait_for_secs(what, 5, pred).await
    }

    pub async fn wait_for_secs(
        &self,
        what: &str,
        secs: u64,
        pred: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        for _ in 0..secs * 100 {
            let log = self.requests().await;
            if pred(&log) {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!(
            "mock log never showed: {what}: {:#?}",
            self.requests().await
        );
    }
}

/// A running `switchyard serve`.
pub struct Switchyard {
    pub child: Child,
    pub grpc: String,
    pub admin: String,
    pub stdout: Arc<Mutex<String>>,
    pub stderr: Arc<Mutex<String>>,
    pub config_file: Option<tempfile::NamedTempFile>,
}

impl Switchyard {
    /// Base URL of the HTTP doors (`http://ADDR`), from the banner.
    #[allow(dead_code)]
    pub fn http_url(&self) -> String {
        let out = self.stdout.lock().unwrap().clone();
        let line = out.lines().next().unwrap_or_default().to_string();
        let addr = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("http="))
            .unwrap_or_else(|| panic!("no http= in banner: {line}"))
            .to_string();
        format!("http://{addr}")
    }

    /// Starts `serve --config` with the given TOML (listeners forced to ephemeral ports).
    pub async fn start(config: &str) -> Switchyard {
        Self::start_with(config, &[]).await
    }

    pub async fn start_with(config: &str, env: &[(&str, &str)]) -> Switchyard {
        Self::start_limited(config, env, None).await
    }

    /// [`Switchyard::start_with`], the process under an open-file limit of
    /// `nofile` (soft and hard) when given.
    pub async fn start_limited(
        config: &str,
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> Switchyard {
        let file = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        std::fs::write(file.path(), config).unwrap();
        let mut cmd = Command::new(BIN);
        cmd.args(["serve", "--config"]).arg(file.path()).args([
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        if let Some(n) = nofile {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in
            // the child between fork and exec.
            unsafe {
                cmd.pre_exec(move || rlimit::setrlimit(rlimit::Resource::NOFILE, n, n));
            }
        }
        Self::spawn(cmd, Some(file)).await
    }

    /// Starts `serve` with no config and the given environment (the HTTP
    /// doors, on 127.0.0.1:8080 out of the box, on an ephemeral port).
    pub async fn start_default(env: &[(&str, &str)]) -> Switchyard {
        let mut cmd = Command::new(BIN);
        cmd.args([
            "serve",
            "--grpc-listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Self::spawn(cmd, None).await
    }

    async fn spawn(mut cmd: Command, config_file: Option<tempfile::NamedTempFile>) -> Switchyard {
        // A test's own RUST_LOG wins over the default.
        if !cmd.as_std().get_envs().any(|(k, _)| k == "RUST_LOG") {
            cmd.env(
                "RUST_LOG",
                std::env::var("SWITCHYARD_TEST_LOG").unwrap_or_else(|_| "info".into()),
            );
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn switchyard");
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        capture(child.stderr.take().unwrap(), stderr.clone());
        let line = first_line_and_capture(child.stdout.take().unwrap(), stdout.clone()).await;
        // "switchyard serving grpc=ADDR admin=ADDR"
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .unwrap_or_else(|| {
                    panic!(
                        "unexpected banner: {line}; stderr: {}",
                        stderr.lock().unwrap()
                    )
                })
                .to_string()
        };
        Switchyard {
            grpc: field("grpc"),
            admin: field("admin"),
            child,
            stdout,
            stderr,
            config_file,
        }
    }

    pub async fn client(&self) -> proto::router_client::RouterClient<tonic::transport::Channel> {
        proto::router_client::RouterClient::connect(format!("http://{}", self.grpc))
            .await
            .expect("connect to switchyard")
    }

    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub fn logs(&self) -> String {
        format!(
            "{}{}",
            self.stdout.lock().unwrap(),
            self.stderr.lock().unwrap()
        )
    }

    pub async fn admin_get(&self, path: &str) -> (u16, String) {
        let r = reqwest::get(format!("http://{}{}", self.admin, path))
            .await
            .unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    }
}

/// One provider block of a test config.
pub fn provider(id: &str, kind: &str, base_url: &str, model: &str) -> String {
    format!(
        r#"
[[providers]]
id = "{id}"
kind = "{kind}"
base_url = "{base_url}"
first_token_timeout = "5s"
idle_timeout = "5s"
  [[providers.models]]
  name = "{model}"
  capabilities = ["chat", "stream", "tools", "json"]
  context_tokens = 128000
"#
    )
}

pub fn route(name: &str, targets: &[&str]) -> String {
    let t: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    format!(
        "\n[[routes]]\nname = \"{name}\"\ntargets = [{}]\n",
        t.join(", ")
    )
}

pub fn user(text: &str) -> proto::Message {
    proto::Message {
        role: "user".into(),
        content: text.into(),
        ..Default::default()
    }
}

pub fn request(route: &str) -> proto::CompletionRequest {
    proto::CompletionRequest {
        route: route.into(),
        messages: vec![user("Say hello.")],
        max_tokens: 64,
        ..Default::default()
    }
}

/// Everything a streaming call delivered.
#[derive(Debug, Default)]
pub struct Collected {
    pub started: Vec<proto::Started>,
    pub text: String,
    pub deltas: usize,
    pub tool_calls: Vec<proto::ToolCallDelta>,
    pub resets: Vec<proto::Reset>,
    /// `Continued` events: the text after one continues what came before.
    pub continued: Vec<proto::Continued>,
    /// The replica was leaving: resume the stream elsewhere.
    pub moved: Option<proto::Moved>,
    pub finished: Option<proto::Finished>,
    /// The `queue` rung's answer.
    pub job: Option<proto::Job>,
    pub status: Option<tonic::Status>,
}

/// Runs one streaming call to its end and collects what arrived.
pub async fn stream(
    client: &mut proto::router_client::RouterClient<tonic::transport::Channel>,
    req: impl tonic::IntoRequest<proto::CompletionRequest>,
) -> Collected {
    use proto::completion_event::Event;
    let mut out = Collected::default();
    let mut s = match client.stream_completion(req).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            out.status = Some(status);
            return out;
        }
    };
    loop {
        match s.message().await {
            Ok(Some(ev)) => match ev.event {
                Some(Event::Started(x)) => out.started.push(x),
                Some(Event::Delta(d)) => {
                    out.deltas += 1;
                    out.text.push_str(&d.text);
                    out.tool_calls.extend(d.tool_calls);
                }
                Some(Event::Reset(r)) => {
                    out.text.clear();
                    out.resets.push(r);
                }
                Some(Event::Finished(f)) => out.finished = Some(f),
                Some(Event::Job(j)) => out.job = Some(j),
                Some(Event::Continued(c)) => out.continued.push(c),
                Some(Event::Moved(m)) => out.moved = Some(m),
                None => {}
            },
            Ok(None) => return out,
            Err(status) => {
                out.status = Some(status);
                return out;
            }
        }
    }
}

/// The `ErrorInfo.reason` of a status.
pub fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone())
        .unwrap_or_default()
}

pub fn error_meta(status: &tonic::Status, key: &str) -> Option<String> {
    use tonic_types::StatusExt;
    status
        .get_error_details()
        .error_info()
        .and_then(|i| i.metadata.get(key).cloned())
}

/// Requests in a mock log that hit the chat endpoints (not control).
pub fn attempts(log: &[Value]) -> usize {
    log.len()
}

/// True when `python3 -c import_line` works; otherwise fails under CI (which
/// must install `requirements`) or prints a loud SKIPPED notice and returns false.
pub fn python_ready(test: &str, import_line: &str, requirements: &str) -> bool {
    let probe = std::process::Command::new("python3")
        .args(["-c", import_line])
        .output();
    let why = match probe {
        Ok(o) if o.status.success() => return true,
        Ok(o) => String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string(),
        Err(e) => format!("cannot run python3: {e}"),
    };
    if std::env::var_os("CI").is_some() {
        panic!("CI is set but {test} lacks Python packages ({why}); CI must run `pip install -r {requirements}`");
    }
    eprintln!("\n*** SKIPPED {test}: pip install -r {requirements} ({why}) ***\n");
    false
}

/// The shared two-provider rig: route `chat` = an OpenAI-shaped `primary`
/// (model `gpt-4o-mini`), then an Anthropic-shaped `secondary` (model
/// `claude-sonnet-4-5`), with the HTTP door on. `head` is TOML placed under
/// `[server]` after `http_listen` (more keys, or tables of its own: `[limits]`,
/// `[auth]`, ...); `route_extra` lines go into the route.
pub struct Rig {
    pub primary: Mock,
    pub secondary: Mock,
    pub sy: Switchyard,
}

impl Rig {
    pub async fn start(head: &str, route_extra: &str, env: &[(&str, &str)]) -> Rig {
        Self::start_with(head, route_extra, &[], env).await
    }

    /// [`Rig::start`] with arguments for both mocks.
    pub async fn start_with(
        head: &str,
        route_extra: &str,
        mock_args: &[&str],
        env: &[(&str, &str)],
    ) -> Rig {
        Self::start_full(head, "", route_extra, mock_args, env).await
    }

    /// [`Rig::start_with`] plus `provider_extra` lines in both providers.
    pub async fn start_full(
        head: &str,
        provider_extra: &str,
        route_extra: &str,
        mock_args: &[&str],
        env: &[(&str, &str)],
    ) -> Rig {
        Self::start_limited(head, provider_extra, route_extra, mock_args, env, None).await
    }

    /// [`Rig::start_full`], Switchyard under an open-file limit of `nofile`.
    pub async fn start_limited(
        head: &str,
        provider_extra: &str,
        route_extra: &str,
        mock_args: &[&str],
        env: &[(&str, &str)],
        nofile: Option<u64>,
    ) -> Rig {
        let primary = Mock::start("openai", mock_args).await;
        let secondary = Mock::start("anthropic", mock_args).await;
        let with_extra = |p: String| {
            p.replace(
                "  [[providers.models]]",
                &format!("{provider_extra}\n  [[providers.models]]"),
            )
        };
        let config = format!(
            "[server]\nhttp_listen = \"127.0.0.1:0\"\n{head}\n{}{}{}{route_extra}\n",
            with_extra(provider(
                "primary",
                "openai",
                &primary.base_url(),
                "gpt-4o-mini"
            )),
            with_extra(provider(
                "secondary",
                "anthropic",
                &secondary.base_url(),
                "claude-sonnet-4-5"
            )),
            route(
                "chat",
                &["primary/gpt-4o-mini", "secondary/claude-sonnet-4-5"]
            )
        );
        let sy = Switchyard::start_limited(&config, env, nofile).await;
        Rig {
            primary,
            secondary,
            sy,
        }
    }

    /// Base URL of the HTTP doors (`http://ADDR`).
    pub fn http_url(&self) -> String {
        self.sy.http_url()
    }

    /// Who served each streamed request, as `provider` names.
    pub async fn served_by(&self, n: usize) -> Vec<String> {
        let mut client = self.sy.client().await;
        let mut out = Vec::new();
        for _ in 0..n {
            let got = stream(&mut client, request("chat")).await;
            let f = got
                .finished
                .unwrap_or_else(|| panic!("not served: {:?}", got.status));
            out.push(f.served_by.map(|s| s.provider.into()).unwrap_or_default());
        }
        out
    }
}

/// The value of one Prometheus sample line starting with `prefix`, summed
/// over every matching line (0 when absent).
pub fn metric_sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A real `redis-server` on a free loopback port, with AOF (`appendfsync
/// always`) in its own temp dir. Killed on drop.
pub struct RedisServer {
    server: switchyard::state::redis::server::RedisServer,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts one, or returns `None` after a loud SKIPPED line when
    /// `redis-server` is not installed (under CI that is a failure).
    pub async fn start(test: &str) -> Option<RedisServer> {
        if switchyard::state::redis::server::find_binary().is_none() {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set but redis-server is not installed ({test}); .ci/run installs it");
            }
            eprintln!("\n*** SKIPPED {test}: redis-server not installed (apt-get install redis-server) ***\n");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let server = tokio::task::spawn_blocking(move || {
            switchyard::state::redis::server::RedisServer::start(
                &path,
                &["--appendfsync", "always"],
            )
        })
        .await
        .unwrap()
        .unwrap();
        Some(RedisServer { server, _dir: dir })
    }

    /// Restarts the server on the same port and data dir.
    pub async fn run(&mut self) {
        self.server.restart().unwrap();
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// SIGSTOP / SIGCONT: a stalled server that answers nothing.
    #[allow(dead_code)]
    pub fn freeze(&self, frozen: bool) {
        self.server.freeze(frozen).unwrap();
    }

    pub fn url(&self) -> String {
        self.server.url()
    }
}

/// Runs an example client (`program` and the repo-relative `script`, then
/// `args`) to completion within 60 s; its status, stdout and stderr.
#[allow(dead_code)]
pub async fn run_example(
    program: &str,
    script: &str,
    args: &[&str],
) -> (std::process::Output, String, String) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(script);
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new(program)
            .arg(path)
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{script} finished in time"))
    .unwrap_or_else(|e| panic!("run {program} {script}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// Runs an SDK test script (examples/*_sdk/test_sdk.py) against the HTTP
/// door at `base_url` and the two mocks; asserts that all `checks` passed.
#[allow(dead_code)]
pub async fn run_sdk_script(script: &str, base_url: &str, rig: &Rig, checks: usize) {
    let (out, stdout, stderr) = run_example(
        "python3",
        script,
        &[
            "--base-url",
            base_url,
            "--primary",
            &format!("http://{}", rig.primary.addr),
            "--secondary",
            &format!("http://{}", rig.secondary.addr),
        ],
    )
    .await;
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{script} failed:\n{stdout}\n{stderr}\nswitchyard logs:\n{}",
        rig.sy.logs()
    );
    assert_eq!(stdout.matches("PASS ").count(), checks, "{stdout}");
}

/// Runs one phase of examples/openai_sdk/test_batch.py against `sy`'s HTTP
/// door and asserts that it passed.
#[allow(dead_code)]
pub async fn batch_phase(sy: &Switchyard, name: &str, extra: &[&str]) {
    let base = format!("{}/v1", sy.http_url());
    let mut args = vec![name, "--base-url", &base];
    args.extend_from_slice(extra);
    let (out, stdout, stderr) =
        run_example("python3", "examples/openai_sdk/test_batch.py", &args).await;
    assert!(
        out.status.success() && stdout.contains(&format!("PASS {name}")),
        "phase {name}:\n{stdout}\n{stderr}\nswitchyard logs:\n{}",
        sy.logs()
    );
}

/// Runs `switchyard check-config` on `config`; asserts that it is refused
/// and returns what it printed.
#[allow(dead_code)]
pub fn check_config_refuses(config: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, config).unwrap();
    let out = std::process::Command::new(BIN)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "accepted: {text}");
    text
}

/// Checks (time to first token, whole stream) samples of a feature's route
/// against a plain route's: every first token was forwarded as it arrived
/// (well before the stream's end) and the median TTFTs differ by < 60 ms.
pub fn assert_ttft_unchanged(
    mut with: Vec<(Duration, Duration)>,
    mut without: Vec<(Duration, Duration)>,
    feature: &str,
) {
    for (first, total) in &with {
        assert!(
            *first * 3 < *total,
            "the first token is forwarded as it arrives: {first:?} of {total:?}"
        );
    }
    let median = |v: &mut Vec<(Duration, Duration)>| {
        v.sort();
        v[v.len() / 2].0
    };
    let (w, wo) = (median(&mut with), median(&mut without));
    assert!(
        w.abs_diff(wo) < Duration::from_millis(60),
        "TTFT with {feature} {w:?} vs without {wo:?}"
    );
}

/// The cosine similarity a real embeddings server (OpenAI's
/// `POST {base}/embeddings`) gives two texts, read as Switchyard reads it.
pub async fn embedding_similarity(base: &str, model: &str, a: &str, b: &str) -> f32 {
    let http = reqwest::Client::new();
    let mut v = Vec::new();
    for text in [a, b] {
        let body = http
            .post(format!("{base}/embeddings"))
            .json(&serde_json::json!({"model": model, "input": text}))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let raw = switchyard::semantic::embed::parse(&body).unwrap();
        v.push(switchyard::semantic::index::normalized(raw).unwrap());
    }
    switchyard::semantic::index::cosine(&v[0], &v[1])
}
