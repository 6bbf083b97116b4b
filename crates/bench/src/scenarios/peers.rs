//! Scenario `peers` (not part of `all`: it installs LiteLLM and Portkey): the
//! same OpenAI-HTTP load through Switchyard's front door, LiteLLM's proxy and
//! Portkey's gateway, all on the same two OpenAI-shaped mocks, each with its own
//! documented fallback + retry config. Overhead vs direct, closed-loop maximum,
//! CPU and peak RSS of each process tree, and the blackout.
//!
//! With `--peer-bin PATH` a Rust peer runs too: Busbar when the file name
//! contains `busbar` (built from source by `scripts/build-peer-busbar.sh`),
//! else agentgateway (`scripts/build-peer-agentgateway.sh`); the bench never
//! builds either. It runs right after Switchyard, with the same requests;
//! the two Rust gateways also get 1,000 and 3,000 requests/s (the Python and
//! Node peers cannot sustain them). `SWITCHYARD_PEERS` (comma-separated
//! `litellm`, `portkey`, `agentgateway`, `busbar`) narrows which peers run;
//! Switchyard always does.
//! `SWITCHYARD_PEERS_UPSTREAM=h2c` has Switchyard and Busbar reach the mocks
//! over HTTP/2 with prior knowledge (`http2_prior_knowledge`,
//! `advanced.upstream_h2_prior_knowledge`) instead of HTTP/1.1;
//! `SWITCHYARD_PEERS_STREAM_UNARY=false` gives Switchyard's providers
//! `stream_unary = false` (unary callers served by one non-streamed
//! upstream call, as Busbar serves them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use super::blackout::{blackout, by_phase, PHASES};
use super::{check_complete, check_errors, errors_json, result};
use crate::clients::{http_client, ms as dur_ms, Outcome};
use crate::load::{closed_loop, open_loop, Run};
use crate::procs::{config_text, proc_usage, MockProc, MockSpec, Provider, Usage};
use crate::report::{delta, ms, pct, Table};
use crate::{BenchError, Check, Ctx, ScenarioResult};

/// Where `scripts/install-peers.sh` installs the peers (outside the repository).
pub const PEERS_DIR_ENV: &str = "SWITCHYARD_PEERS_DIR";
const TIMEOUT: Duration = Duration::from_secs(10);
const MASTER_KEY: &str = "sk-bench-master";
/// Retries each peer makes on one target before falling back.
const RETRIES: u32 = 2;
const RETRY_STATUSES: [u16; 5] = [429, 500, 502, 503, 504];
/// Narrows the peers run (comma-separated tags; Switchyard always runs).
pub const PEERS_ENV: &str = "SWITCHYARD_PEERS";
/// `h2c`: Switchyard and Busbar reach the mocks over HTTP/2 with prior knowledge.
pub const UPSTREAM_ENV: &str = "SWITCHYARD_PEERS_UPSTREAM";
/// `false`: Switchyard's providers get `stream_unary = false`.
pub const STREAM_UNARY_ENV: &str = "SWITCHYARD_PEERS_STREAM_UNARY";
/// The fixed rates only the Rust gateways get (with `--peer-bin`).
const FAST_RATES: [f64; 2] = [1000.0, 3000.0];
/// How long a gateway may take to answer its first request.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// The scratch folder of the peers.
pub fn peers_dir() -> PathBuf {
    match std::env::var_os(PEERS_DIR_ENV) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
            PathBuf::from(home).join(".cache/switchyard-peers")
        }
    }
}

fn litellm_bin(dir: &Path) -> PathBuf {
    dir.join("litellm/venv/bin/litellm")
}

fn portkey_js(dir: &Path) -> PathBuf {
    dir.join("portkey/node_modules/@portkey-ai/gateway/build/start-server.js")
}

/// `key=value` lines of `versions.txt` written by the install script.
fn read_versions(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("versions.txt"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// `revision.txt` written next to the peer binary by
/// `scripts/build-peer-agentgateway.sh` (`key=value` lines).
fn read_peer_revision(bin: &Path) -> BTreeMap<String, String> {
    let Some(dir) = bin.parent() else {
        return BTreeMap::new();
    };
    std::fs::read_to_string(dir.join("revision.txt"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The gateways to run, in order: Switchyard, then the Rust peer (when
/// `--peer-bin` is given), then LiteLLM and Portkey; `only` (the value of
/// `SWITCHYARD_PEERS`, comma-separated tags) narrows the peers.
fn selected(peer: Option<Kind>, only: Option<&str>) -> Vec<Kind> {
    let wanted: Option<Vec<String>> = only
        .map(|v| {
            v.split(',')
                .map(|t| t.trim().to_ascii_lowercase())
                .filter(|t| !t.is_empty())
                .collect::<Vec<_>>()
        })
        .filter(|v| !v.is_empty());
    let mut kinds = vec![Kind::Switchyard];
    for k in peer.into_iter().chain([Kind::LiteLlm, Kind::Portkey]) {
        if wanted
            .as_ref()
            .is_none_or(|w| w.iter().any(|t| t == k.tag()))
        {
            kinds.push(k);
        }
    }
    kinds
}

/// Runs `scripts/install-peers.sh` when a peer is missing; returns its outcome.
async fn ensure_installed(ctx: &Ctx, dir: &Path) -> String {
    if litellm_bin(dir).exists() && portkey_js(dir).exists() && dir.join("versions.txt").exists() {
        return "already installed".into();
    }
    let script = [
        PathBuf::from("scripts/install-peers.sh"),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-peers.sh"),
    ]
    .into_iter()
    .find(|p| p.exists());
    let Some(script) = script else {
        return "scripts/install-peers.sh not found".into();
    };
    ctx.progress(format!(
        "   installing peers into {} ({})",
        dir.display(),
        script.display()
    ));
    let log = match std::fs::File::create(ctx.path("install-peers.log")) {
        Ok(f) => f,
        Err(e) => return format!("cannot create install-peers.log: {e}"),
    };
    let err = match log.try_clone() {
        Ok(f) => f,
        Err(e) => return format!("install-peers.log: {e}"),
    };
    let child = Command::new("bash")
        .arg(&script)
        .env(PEERS_DIR_ENV, dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .status();
    match tokio::time::timeout(Duration::from_secs(1200), child).await {
        Ok(Ok(s)) if s.success() => "installed by scripts/install-peers.sh".into(),
        Ok(Ok(s)) => format!("install script exited with {s} (see install-peers.log)"),
        Ok(Err(e)) => format!("cannot run the install script: {e}"),
        Err(_) => "install script took over 20 minutes".into(),
    }
}

/// The gateways compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Switchyard,
    LiteLlm,
    Portkey,
    /// The Rust peer of `--peer-bin` (agentgateway).
    AgentGateway,
    /// The Rust peer of `--peer-bin` when its file name contains `busbar`.
    Busbar,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Switchyard => "Switchyard",
            Kind::LiteLlm => "LiteLLM proxy",
            Kind::Portkey => "Portkey gateway",
            Kind::AgentGateway => "agentgateway",
            Kind::Busbar => "Busbar",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Kind::Switchyard => "switchyard",
            Kind::LiteLlm => "litellm",
            Kind::Portkey => "portkey",
            Kind::AgentGateway => "agentgateway",
            Kind::Busbar => "busbar",
        }
    }

    /// Switchyard and the Rust peer: these also get [`FAST_RATES`].
    fn fast(self) -> bool {
        matches!(self, Kind::Switchyard | Kind::AgentGateway | Kind::Busbar)
    }

    /// Which Rust peer a `--peer-bin` is: Busbar when its file name says so,
    /// else agentgateway.
    fn of_peer_bin(bin: &Path) -> Kind {
        let name = bin
            .file_name()
            .map(|n| n.to_string_lossy().to_ascii_lowercase())
            .unwrap_or_default();
        if name.contains("busbar") {
            Kind::Busbar
        } else {
            Kind::AgentGateway
        }
    }
}

/// Where and how an OpenAI chat request is sent.
#[derive(Clone)]
struct Front {
    url: Arc<str>,
    model: Arc<str>,
    headers: Arc<Vec<(String, String)>>,
}

impl Front {
    fn direct(mock: &MockProc) -> Front {
        Front {
            url: format!("{}/chat/completions", mock.base_url()).into(),
            model: "m".into(),
            headers: Arc::new(Vec::new()),
        }
    }
}

/// LiteLLM proxy config (JSON is YAML): two deployments, fallback from the
/// primary group to the secondary, retries, cooldown after `allowed_fails`.
pub fn litellm_config(primary: &str, secondary: &str, cooldown_s: f64) -> Value {
    let deployment = |name: &str, base: &str| {
        json!({"model_name": name, "litellm_params": {
            "model": "openai/m", "api_base": base, "api_key": "sk-mock",
            "timeout": TIMEOUT.as_secs(), "stream_timeout": TIMEOUT.as_secs()}})
    };
    json!({
        "model_list": [deployment("chat", primary), deployment("chat-fallback", secondary)],
        "litellm_settings": {
            "num_retries": RETRIES,
            "request_timeout": TIMEOUT.as_secs(),
            "fallbacks": [{"chat": ["chat-fallback"]}],
            "allowed_fails": 3,
            "cooldown_time": cooldown_s,
            "telemetry": false,
        },
        "general_settings": {"master_key": MASTER_KEY},
    })
}

/// Portkey gateway config (header `x-portkey-config`): fallback strategy over
/// two OpenAI targets on custom hosts, each retried on 429/5xx.
pub fn portkey_config(primary: &str, secondary: &str) -> Value {
    let target = |base: &str| {
        json!({"provider": "openai", "api_key": "sk-mock", "custom_host": base,
               "retry": {"attempts": RETRIES, "on_status_codes": RETRY_STATUSES}})
    };
    json!({
        "strategy": {"mode": "fallback", "on_status_codes": RETRY_STATUSES},
        "targets": [target(primary), target(secondary)],
    })
}

/// Failure statuses agentgateway's outlier detection counts against a model.
const AGW_UNHEALTHY: &str = "response.code >= 500 || response.code == 429";
/// Consecutive failures before agentgateway evicts a model (LiteLLM's
/// `allowed_fails` is the same 3).
const AGW_CONSECUTIVE_FAILURES: u32 = 3;

/// agentgateway config (its standalone `llm:` form; JSON is YAML): the two
/// mocks as OpenAI models (plain HTTP `baseUrl` on 127.0.0.1), client-facing
/// model `chat` a virtual model failing over from the primary (priority 0) to
/// the secondary (priority 1). Its failover moves new requests to the next
/// priority once a model is evicted by outlier detection (`health`: 5xx/429,
/// after 3 consecutive failures, for `evict_ms`); the `llm:` form has no retry
/// of a failed request, so none is configured. Admin, stats and readiness
/// listeners on free local ports; access logging off (`logging.filter:
/// "false"`), like Switchyard, which logs no line per request.
pub fn agentgateway_config(
    primary: &str,
    secondary: &str,
    port: u16,
    admin_ports: [u16; 3],
    evict_ms: u128,
) -> Value {
    let model = |name: &str, base: &str| {
        json!({
            "name": name,
            "visibility": "internal",
            "provider": "openAI",
            "params": {"model": "m", "apiKey": "sk-mock", "baseUrl": base},
            "health": {
                "unhealthyExpression": AGW_UNHEALTHY,
                "eviction": {
                    "duration": format!("{evict_ms}ms"),
                    "consecutiveFailures": AGW_CONSECUTIVE_FAILURES,
                },
            },
        })
    };
    let [admin, stats, ready] = admin_ports;
    json!({
        "config": {
            "adminAddr": format!("127.0.0.1:{admin}"),
            "statsAddr": format!("127.0.0.1:{stats}"),
            "readinessAddr": format!("127.0.0.1:{ready}"),
            "logging": {"filter": "false"},
        },
        "llm": {
            "port": port,
            "models": [model("primary", primary), model("secondary", secondary)],
            "virtualModels": [{
                "name": "chat",
                "routing": {"failover": {"targets": [
                    {"model": "primary", "priority": 0},
                    {"model": "secondary", "priority": 1},
                ]}},
            }],
        },
    })
}

/// Busbar deployment config (`config.yaml`; JSON is YAML) for `--peer-bin
/// .../busbar`: open data plane (`auth.chain: []`), the two mocks as lanes of
/// two catalog providers (plain-HTTP loopback `base_url`, allowed for
/// loopback hosts), pool `chat` = the primary lane with a consecutive-failure
/// breaker (3, cooldown `cooldown_s`) and `on_exhausted: {fallback_pool:
/// chat-fallback}` (the secondary lane). No lane concurrency cap. The
/// catalog (`providers.yaml`) is [`busbar_providers`].
pub fn busbar_config(
    port: u16,
    admin_port: u16,
    primary: &str,
    secondary: &str,
    cooldown_s: u64,
    h2c: bool,
) -> Value {
    let breaker = json!({
        "trip": {"mode": "consecutive", "consecutive_n": 3},
        "base_cooldown_secs": cooldown_s.max(1),
        "max_cooldown_secs": (cooldown_s * 4).max(1),
    });
    json!({
        "listen": format!("127.0.0.1:{port}"),
        "admin_listen": format!("127.0.0.1:{admin_port}"),
        "identity-providers": {
            "admin-tokens": {"module": "admin-tokens", "token": {"env": "BUSBAR_ADMIN_TOKEN"}},
        },
        "auth": {"chain": [], "admin_auth": ["admin-tokens"]},
        "advanced": {"upstream_h2_prior_knowledge": h2c},
        "providers": {
            "mock-primary": {"api_key": {"env": "BENCH_MOCK_KEY"}, "base_url": primary},
            "mock-secondary": {"api_key": {"env": "BENCH_MOCK_KEY"}, "base_url": secondary},
        },
        "models": {
            "m-primary": {"provider": "mock-primary", "max_requests": -1},
            "m-secondary": {"provider": "mock-secondary", "max_requests": -1},
        },
        "pools": {
            "chat": {
                "members": [{"model": "m-primary"}],
                "breaker": breaker.clone(),
                "on_exhausted": {"fallback_pool": "chat-fallback"},
            },
            "chat-fallback": {
                "members": [{"model": "m-secondary"}],
                "breaker": breaker,
            },
        },
    })
}

/// Busbar's provider catalog (`providers.yaml` next to its config): the two
/// mocks as `protocol: openai` providers.
pub fn busbar_providers(primary: &str, secondary: &str) -> Value {
    json!({
        "mock-primary": {"protocol": "openai", "base_url": primary},
        "mock-secondary": {"protocol": "openai", "base_url": secondary},
    })
}

/// Switchyard config: `http_listen`, one route over both mocks, breaker scaled
/// to the blackout like the `blackout` scenario.
fn switchyard_config(
    primary: &MockProc,
    secondary: &MockProc,
    port: u16,
    open_ms: u128,
    upstream_keys: &str,
) -> String {
    let breaker = format!(
        "synthetic_probes = true\nbreaker = {{ open_for = \"{open_ms}ms\", max_open_for = \"{}ms\" }}{upstream_keys}",
        open_ms * 4,
    );
    config_text(
        "",
        &[
            Provider::new("primary", "openai", primary)
                .caps(1000, 1000)
                .extra(breaker.clone()),
            Provider::new("secondary", "openai", secondary)
                .caps(1000, 1000)
                .extra(breaker),
        ],
        &[("chat", &["primary", "secondary"])],
    )
    .replacen(
        "[server]\n",
        // Connections up to the load generator's in-flight cap, as the
        // overhead scenario has them (the peer has no cap): an overload
        // shows as latency, not as the quietest connection closed.
        &format!("[server]\nhttp_listen = \"127.0.0.1:{port}\"\nhttp_max_connections = 6000\n"),
        1,
    )
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// A running gateway (its own process group, killed on stop).
struct Gateway {
    kind: Kind,
    child: Child,
    pid: u32,
    front: Front,
    log: PathBuf,
}

impl Gateway {
    fn usage(&self) -> Usage {
        tree_usage(self.pid)
    }

    async fn stop(mut self) {
        // The whole group we created (uvicorn / node children included).
        let _ = std::process::Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pid)])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// The `--peer-bin` binary, which must exist.
fn rust_peer(peer_bin: Option<&Path>) -> Result<&Path, String> {
    let bin = peer_bin.ok_or("no --peer-bin")?;
    if !bin.exists() {
        return Err(format!("{} missing", bin.display()));
    }
    Ok(bin)
}

impl Front {
    /// A gateway's OpenAI chat endpoint at `base`, route `chat`, no extra headers.
    fn chat(base: &str) -> Front {
        Front {
            url: format!("{base}/v1/chat/completions").into(),
            model: "chat".into(),
            headers: Arc::new(Vec::new()),
        }
    }
}

/// Starts `kind` on a free port and waits until one request goes through.
#[allow(clippy::too_many_arguments)]
async fn start_gateway(
    ctx: &Ctx,
    kind: Kind,
    dir: &Path,
    peer_bin: Option<&Path>,
    primary: &MockProc,
    secondary: &MockProc,
    phase: Duration,
    http: &reqwest::Client,
) -> Result<Gateway, String> {
    let port = free_port()?;
    let log = ctx.path(&format!("peer-{}.log", kind.tag()));
    let base = format!("http://127.0.0.1:{port}");
    let (mut cmd, front) = match kind {
        Kind::Switchyard => {
            let cfg = switchyard_config(
                primary,
                secondary,
                port,
                phase.as_millis() / 4,
                &super::upstream_keys(UPSTREAM_ENV, STREAM_UNARY_ENV),
            );
            switchyard::config::Config::from_toml_str(&cfg).map_err(|e| e.to_string())?;
            let path = ctx.path("peers-switchyard.toml");
            std::fs::write(&path, &cfg).map_err(|e| e.to_string())?;
            let mut c = Command::new(&ctx.exe);
            c.arg("serve")
                .arg("--config")
                .arg(&path)
                .env_remove("RUST_LOG")
                .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT");
            let front = Front::chat(&base);
            (c, front)
        }
        Kind::LiteLlm => {
            let bin = litellm_bin(dir);
            if !bin.exists() {
                return Err(format!("{} missing", bin.display()));
            }
            let cfg = litellm_config(
                &primary.base_url(),
                &secondary.base_url(),
                phase.as_secs_f64() / 4.0,
            );
            let path = ctx.path("peers-litellm.yaml");
            let text = serde_json::to_string_pretty(&cfg).map_err(|e| e.to_string())?;
            std::fs::write(&path, text).map_err(|e| e.to_string())?;
            let mut c = Command::new(bin);
            c.arg("--config")
                .arg(&path)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--num_workers", "1"])
                .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
                .env("LITELLM_MASTER_KEY", MASTER_KEY)
                .env("LITELLM_LOG", "ERROR")
                .env("DISABLE_ADMIN_UI", "True")
                .env("NO_PROXY", "127.0.0.1,localhost");
            let front = Front {
                url: format!("{base}/v1/chat/completions").into(),
                model: "chat".into(),
                headers: Arc::new(vec![(
                    "authorization".into(),
                    format!("Bearer {MASTER_KEY}"),
                )]),
            };
            (c, front)
        }
        Kind::AgentGateway => {
            let bin = rust_peer(peer_bin)?;
            let cfg = agentgateway_config(
                &primary.base_url(),
                &secondary.base_url(),
                port,
                [free_port()?, free_port()?, free_port()?],
                phase.as_millis() / 4,
            );
            let path = ctx.path("peers-agentgateway.yaml");
            let text = serde_json::to_string_pretty(&cfg).map_err(|e| e.to_string())?;
            std::fs::write(&path, text).map_err(|e| e.to_string())?;
            let mut c = Command::new(bin);
            c.arg("--file")
                .arg(&path)
                .env_remove("RUST_LOG")
                .env_remove("WORKER_THREADS")
                .env("NO_PROXY", "127.0.0.1,localhost");
            let front = Front::chat(&base);
            (c, front)
        }
        Kind::Busbar => {
            let bin = rust_peer(peer_bin)?;
            // The mocks' origin: Busbar appends the OpenAI path (/v1/...).
            let origin = |m: &MockProc| m.base_url().trim_end_matches("/v1").to_string();
            let bdir = ctx.path("peers-busbar");
            std::fs::create_dir_all(&bdir).map_err(|e| e.to_string())?;
            let cfg = busbar_config(
                port,
                free_port()?,
                &origin(primary),
                &origin(secondary),
                (phase.as_secs_f64() / 4.0).round() as u64,
                super::upstream_h2c(UPSTREAM_ENV),
            );
            let cat = busbar_providers(&origin(primary), &origin(secondary));
            let path = bdir.join("config.yaml");
            for (p, v) in [(&path, &cfg), (&bdir.join("providers.yaml"), &cat)] {
                let text = serde_json::to_string_pretty(v).map_err(|e| e.to_string())?;
                std::fs::write(p, text).map_err(|e| e.to_string())?;
            }
            let mut c = Command::new(bin);
            c.env("BUSBAR_CONFIG", &path)
                .env_remove("BUSBAR_PROVIDERS")
                .env_remove("RUST_LOG")
                .env("BUSBAR_ADMIN_TOKEN", "bench-admin-token-not-secret")
                .env("BENCH_MOCK_KEY", "sk-mock")
                .env("NO_PROXY", "127.0.0.1,localhost");
            let front = Front::chat(&base);
            (c, front)
        }
        Kind::Portkey => {
            let js = portkey_js(dir);
            if !js.exists() {
                return Err(format!("{} missing", js.display()));
            }
            let cfg = portkey_config(&primary.base_url(), &secondary.base_url());
            let text = cfg.to_string();
            std::fs::write(ctx.path("peers-portkey-config.json"), &text)
                .map_err(|e| e.to_string())?;
            let mut c = Command::new("node");
            c.arg(js)
                .arg(format!("--port={port}"))
                .arg("--headless")
                .env("NO_PROXY", "127.0.0.1,localhost");
            let front = Front {
                url: format!("{base}/v1/chat/completions").into(),
                model: "m".into(),
                headers: Arc::new(vec![("x-portkey-config".into(), text)]),
            };
            (c, front)
        }
    };
    let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut child = cmd
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot spawn: {e}"))?;
    let pid = child.id().ok_or("exited at once")?;
    let t0 = Instant::now();
    let mut last = String::from("no answer");
    // Bounded by START_TIMEOUT and the count.
    for _ in 0..1000 {
        if t0.elapsed() > START_TIMEOUT {
            break;
        }
        if let Ok(Some(s)) = child.try_wait() {
            return Err(format!(
                "exited with {s} before serving (see {})",
                log.display()
            ));
        }
        let o = chat_call(http, &front, false, "warmup".into(), Instant::now()).await;
        if o.ok {
            ctx.progress(format!(
                "   {} up after {:.1} s",
                kind.name(),
                t0.elapsed().as_secs_f64()
            ));
            return Ok(Gateway {
                kind,
                child,
                pid,
                front,
                log,
            });
        }
        last = o.error.unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = child.start_kill();
    Err(format!(
        "no successful answer within {START_TIMEOUT:?}: {last}"
    ))
}

/// Every pid of the tree under `root` (root included), from `/proc/*/stat`.
fn tree_pids(root: u32) -> Vec<u32> {
    let mut parent = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten().take(100_000) {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let ppid = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().nth(1).map(String::from))
                })
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(ppid) = ppid {
                parent.push((pid, ppid));
            }
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() && i < 10_000 {
        let p = tree[i];
        tree.extend(parent.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// CPU seconds and RSS of the whole tree (peak: sum of each process's VmHWM).
fn tree_usage(root: u32) -> Usage {
    let mut u = Usage::default();
    for p in tree_pids(root) {
        if let Some(x) = proc_usage(p) {
            u.cpu_s += x.cpu_s;
            u.rss_kb += x.rss_kb;
            u.hwm_kb += x.hwm_kb;
        }
    }
    u
}

/// One OpenAI chat request (`content` tags it in the mocks' logs); streaming
/// answers are parsed frame by frame and must end with `[DONE]`.
async fn chat_call(
    http: &reqwest::Client,
    front: &Front,
    stream: bool,
    content: String,
    t0: Instant,
) -> Outcome {
    let fail = |e: String| Outcome {
        latency_ms: dur_ms(t0.elapsed()),
        error: Some(e),
        ..Outcome::default()
    };
    let inner = async {
        let body = json!({
            "model": &*front.model,
            "messages": [{"role": "user", "content": content}],
            "stream": stream,
            "max_tokens": 1000,
        });
        let mut req = http.post(&*front.url).json(&body);
        for (k, v) in front.headers.iter() {
            req = req.header(k, v);
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| format!("transport: {}", e.without_url()))?;
        let status = resp.status();
        if !status.is_success() {
            let _ = resp.bytes().await;
            return Err(format!("HTTP {}", status.as_u16()));
        }
        let mut out = Outcome::default();
        if !stream {
            let b = resp
                .bytes()
                .await
                .map_err(|e| format!("transport: body: {}", e.without_url()))?;
            let v: Value = serde_json::from_slice(&b).map_err(|_| "INTERNAL not JSON")?;
            let text = v["choices"][0]["message"]["content"]
                .as_str()
                .ok_or("INTERNAL no message content")?;
            let latency = dur_ms(t0.elapsed());
            out.ok = true;
            out.latency_ms = latency;
            out.ttft_ms = Some(latency);
            out.tokens = text.split_whitespace().count() as u32;
            return Ok(out);
        }
        let mut buf: Vec<u8> = Vec::new();
        let mut done = false;
        // Bounded by the body and the count.
        for _ in 0..1_000_000 {
            let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| format!("transport: body: {}", e.without_url()))?
            else {
                break;
            };
            buf.extend_from_slice(&chunk);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let line = String::from_utf8_lossy(&line);
                let Some(data) = line.trim().strip_prefix("data:") else {
                    continue;
                };
                let data = data.trim();
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(data).map_err(|_| "INTERNAL bad frame")?;
                if v.get("error").is_some() {
                    return Err("STREAM error frame".into());
                }
                let content = v["choices"][0]["delta"]["content"].as_str().unwrap_or("");
                if !content.is_empty() {
                    if out.ttft_ms.is_none() {
                        out.ttft_ms = Some(dur_ms(t0.elapsed()));
                    }
                    out.tokens += 1;
                }
            }
        }
        if !done || out.tokens == 0 {
            return Err("STREAM ended without [DONE]".into());
        }
        out.ok = true;
        out.latency_ms = dur_ms(t0.elapsed());
        Ok(out)
    };
    match tokio::time::timeout(TIMEOUT, inner).await {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => fail(e),
        Err(_) => fail("timeout (client)".into()),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Load {
    Rate(f64),
    Closed(usize),
}

impl Load {
    fn label(self) -> String {
        match self {
            Load::Rate(r) => format!("{r:.0}/s"),
            Load::Closed(n) => format!("max: closed loop, {n} callers"),
        }
    }
}

async fn drive(
    ctx: &Ctx,
    http: &reqwest::Client,
    front: &Front,
    label: String,
    stream: bool,
    load: Load,
    d: Duration,
) -> Run {
    let (http, front) = (http.clone(), front.clone());
    let tag: Arc<str> = label.replace(' ', "-").into();
    let f = move |i: u64, t0: Instant| {
        let (http, front, tag) = (http.clone(), front.clone(), tag.clone());
        async move { chat_call(&http, &front, stream, format!("{tag} r{i}"), t0).await }
    };
    match load {
        Load::Rate(r) => open_loop(ctx, label, r, d, 2_000, f).await,
        Load::Closed(n) => closed_loop(ctx, label, n, d, Duration::ZERO, f).await,
    }
}

fn sustained(run: &Run, load: Load) -> String {
    match load {
        Load::Rate(rate) if run.throughput() < 0.95 * rate || run.skipped > 0 => {
            format!("{:.0} (not sustained)", run.throughput())
        }
        _ => format!("{:.0}", run.throughput()),
    }
}

/// CPU microseconds per request from CPU seconds per 1,000 requests.
fn cpu_us(cpu_s_per_1k: f64) -> String {
    if cpu_s_per_1k.is_finite() {
        format!("{:.0}", cpu_s_per_1k * 1000.0)
    } else {
        "-".into()
    }
}

fn short_errors(run: &Run) -> String {
    let e = run.errors();
    if e.is_empty() {
        return "0".into();
    }
    e.iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Upstream attempts per request and phase from the mocks' logs (requests are
/// tagged `TAG rI`; anything else, e.g. Switchyard's probes, is counted apart).
fn attempts_by_phase(
    logs: &[Vec<switchyard_mock::RequestRecord>],
    tag: &str,
    rate: f64,
    phase_s: f64,
) -> ([usize; 3], usize) {
    let mut per = [0usize; 3];
    let mut other = 0;
    let prefix = format!("{tag} r");
    for r in logs.iter().flatten() {
        let content = r.body["messages"][0]["content"].as_str().unwrap_or("");
        match content
            .strip_prefix(&prefix)
            .and_then(|i| i.parse::<u64>().ok())
        {
            Some(i) => {
                let p = ((i as f64 / rate) / phase_s).floor() as usize;
                per[p.min(2)] += 1;
            }
            None => other += 1,
        }
    }
    (per, other)
}

/// Waits (at most 120 s) until the gateway has finished work left over from
/// an overloaded run: no request in flight at the mocks, none arriving, and the
/// gateway's process tree under 20 % of a core for a second. Returns seconds waited.
async fn settle(gw: &Gateway, mocks: [&MockProc; 2]) -> Result<f64, BenchError> {
    let t0 = Instant::now();
    let mut last = (u64::MAX, gw.usage().cpu_s);
    for _ in 0..120 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (a, b) = (mocks[0].stats().await?, mocks[1].stats().await?);
        let now = (a.requests + b.requests, gw.usage().cpu_s);
        let quiet = a.in_flight == 0 && b.in_flight == 0 && now.0 == last.0 && now.1 - last.1 < 0.2;
        last = now;
        if quiet {
            break;
        }
    }
    Ok(t0.elapsed().as_secs_f64())
}

struct Plan {
    rates: Vec<f64>,
    d: Duration,
    closed: usize,
    closed_d: Duration,
    phase: Duration,
    bo_rate: f64,
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("peers");
    let plan = Plan {
        rates: ctx.pick(vec![100.0], vec![200.0, 500.0]),
        d: ctx.pick(Duration::from_secs(2), Duration::from_secs(6)),
        closed: ctx.pick(8, 32),
        closed_d: ctx.pick(Duration::from_secs(2), Duration::from_secs(5)),
        phase: ctx.pick(Duration::from_secs(2), Duration::from_secs(10)),
        // Low enough for every gateway to sustain (LiteLLM's streaming maximum
        // on 2 shared cores is a few dozen per second): the blackout measures
        // fallback, not overload.
        bo_rate: ctx.pick(10.0, 10.0),
    };
    let dir = peers_dir();
    let only = std::env::var(PEERS_ENV).ok();
    let peer_kind = ctx.peer_bin.as_deref().map(Kind::of_peer_bin);
    let kinds = selected(peer_kind, only.as_deref());
    let fast_rates: Vec<f64> = if ctx.peer_bin.is_some() {
        ctx.pick(vec![300.0], FAST_RATES.to_vec())
    } else {
        Vec::new()
    };
    let install = if kinds.contains(&Kind::LiteLlm) || kinds.contains(&Kind::Portkey) {
        ensure_installed(ctx, &dir).await
    } else {
        format!("not needed ({PEERS_ENV}={})", only.as_deref().unwrap_or(""))
    };
    let peer_rev = ctx
        .peer_bin
        .as_deref()
        .map(read_peer_revision)
        .unwrap_or_default();
    let versions = read_versions(&dir);
    ctx.progress(format!("   peers: {install}; {versions:?}"));

    let primary = MockProc::start(ctx, "peers-primary", &MockSpec::new("openai", 16, 0)).await?;
    let secondary =
        MockProc::start(ctx, "peers-secondary", &MockSpec::new("openai", 16, 0)).await?;
    let http = http_client()?;
    // Every gateway gets `plan.rates` and the closed loop; Switchyard and the
    // Rust peer also get `fast_rates`.
    let all_rates: Vec<f64> = plan.rates.iter().chain(&fast_rates).copied().collect();
    let loads_of = |kind: Kind| -> Vec<(Load, Duration)> {
        let mut l: Vec<(Load, Duration)> = plan
            .rates
            .iter()
            .chain(if kind.fast() { &fast_rates[..] } else { &[] })
            .map(|r| (Load::Rate(*r), plan.d))
            .collect();
        l.push((Load::Closed(plan.closed), plan.closed_d));
        l
    };

    // Direct to the mock: the baseline of every fixed-rate row.
    let direct_front = Front::direct(&primary);
    let mut direct: BTreeMap<(bool, u64), Run> = BTreeMap::new();
    for stream in [true, false] {
        drive(
            ctx,
            &http,
            &direct_front,
            "warmup direct".into(),
            stream,
            Load::Rate(100.0),
            Duration::from_millis(500),
        )
        .await;
        for r in &all_rates {
            primary.clear().await?;
            let label = format!("direct {} {r:.0}", if stream { "stream" } else { "unary" });
            let run = drive(
                ctx,
                &http,
                &direct_front,
                label,
                stream,
                Load::Rate(*r),
                plan.d,
            )
            .await;
            res.checks
                .push(check_complete(&format!("direct {stream} {r}"), &run));
            res.checks.push(check_errors(
                &format!("direct stream={stream} {r}/s"),
                &run.outcomes,
                &[],
            ));
            direct.insert((stream, *r as u64), run);
        }
    }

    let mut peers_tbl = Table::new(&["gateway", "version", "fallback + retry config", "status"]);
    let mut over = Table::new(&[
        "gateway",
        "mode",
        "load",
        "achieved rps",
        "latency p50 / p99 ms",
        "added p50 / p99 ms vs direct",
        "TTFT p50 / p99 ms",
        "errors",
        "CPU µs / req",
        "peak RSS MB (tree)",
    ]);
    // Side by side: CPU per request and added latency at each fixed rate, and
    // the closed-loop maximum, one row per gateway and mode.
    let mut side_cols: Vec<String> = vec!["gateway".into(), "mode".into()];
    for r in &all_rates {
        side_cols.push(format!("{r:.0}/s: achieved rps"));
        side_cols.push(format!("{r:.0}/s: CPU µs / req"));
        side_cols.push(format!("{r:.0}/s: added p50 / p99 ms"));
    }
    side_cols.push("closed loop max rps".into());
    side_cols.push("closed loop CPU µs / req".into());
    let side_refs: Vec<&str> = side_cols.iter().map(String::as_str).collect();
    let mut side = Table::new(&side_refs);
    let mut bo = Table::new(&[
        "gateway",
        "mode",
        "phase",
        "requests",
        "availability",
        "TTFT p50 / p95 ms",
        "upstream attempts / request (mock logs)",
    ]);
    let mut data = Vec::new();
    for kind in kinds.iter().copied() {
        let version = match kind {
            Kind::Switchyard => format!(
                "{} (git {})",
                env!("CARGO_PKG_VERSION"),
                crate::Machine::detect().git_revision
            ),
            Kind::LiteLlm => versions
                .get("litellm")
                .cloned()
                .unwrap_or_else(|| "none".into()),
            Kind::Portkey => format!(
                "{} (Node {})",
                versions
                    .get("portkey")
                    .cloned()
                    .unwrap_or_else(|| "none".into()),
                versions.get("node").cloned().unwrap_or_default()
            ),
            Kind::AgentGateway | Kind::Busbar => format!(
                "git {} ({}, {} profile)",
                peer_rev
                    .get(kind.tag())
                    .map(|r| r.chars().take(12).collect::<String>())
                    .unwrap_or_else(|| "unknown".into()),
                peer_rev.get("toolchain").cloned().unwrap_or_default(),
                peer_rev.get("profile").cloned().unwrap_or_default()
            ),
        };
        let config = match kind {
            Kind::Switchyard => format!("route `chat` = [primary, secondary], retries + failover + breaker (open_for {} ms), synthetic probes", plan.phase.as_millis() / 4),
            Kind::LiteLlm => format!("2 deployments, `fallbacks: [{{chat: [chat-fallback]}}]`, `num_retries: {RETRIES}`, `allowed_fails: 3`, `cooldown_time: {:.1}`", plan.phase.as_secs_f64() / 4.0),
            Kind::Portkey => format!("`strategy: {{mode: fallback}}` over 2 targets, each `retry: {{attempts: {RETRIES}, on_status_codes: [429,500,502,503,504]}}`"),
            Kind::AgentGateway => format!("`llm:` 2 openAI models (`baseUrl` http://127.0.0.1), virtual model `chat` = `failover` primary (priority 0) → secondary (priority 1); `health: {{unhealthyExpression: \"{AGW_UNHEALTHY}\", eviction: {{consecutiveFailures: {AGW_CONSECUTIVE_FAILURES}, duration: {}ms}}}}`; no retry (not in its `llm:` config); access log off", plan.phase.as_millis() / 4),
            Kind::Busbar => format!("pool `chat` = [primary lane], breaker `trip: {{mode: consecutive, consecutive_n: 3}}`, `base_cooldown_secs: {}`, `on_exhausted: {{fallback_pool: chat-fallback}}` (= [secondary lane]); open data plane (`auth.chain: []`), no lane cap", ((plan.phase.as_secs_f64() / 4.0).round() as u64).max(1)),
        };
        primary.set_config(&json!({"token_delay_ms": 0})).await?;
        secondary.set_config(&json!({"token_delay_ms": 0})).await?;
        ctx.progress(format!("== {} {version}", kind.name()));
        let gw = match start_gateway(
            ctx,
            kind,
            &dir,
            ctx.peer_bin.as_deref(),
            &primary,
            &secondary,
            plan.phase,
            &http,
        )
        .await
        {
            Ok(g) => g,
            Err(reason) => {
                ctx.progress(format!("   {} not available: {reason}", kind.name()));
                peers_tbl.row(vec![
                    kind.name().into(),
                    version.clone(),
                    config,
                    format!("**not available**: {reason}"),
                ]);
                data.push(json!({"gateway": kind.name(), "version": version, "available": false, "reason": reason}));
                if kind == Kind::Switchyard {
                    res.checks
                        .push(Check::new("Switchyard starts", false, reason));
                }
                continue;
            }
        };
        let mut rows = Vec::new();
        let mut peak_kb = 0u64;
        for stream in [true, false] {
            let mode = if stream { "stream" } else { "unary" };
            let mut side_rates: BTreeMap<u64, [String; 3]> = BTreeMap::new();
            let mut side_closed = [String::from("-"), String::from("-")];
            drive(
                ctx,
                &http,
                &gw.front,
                format!("warmup {}", kind.tag()),
                stream,
                Load::Rate(50.0),
                Duration::from_millis(500),
            )
            .await;
            for (load, d) in &loads_of(kind) {
                let waited = settle(&gw, [&primary, &secondary]).await?;
                if waited > 2.5 {
                    ctx.progress(format!("   waited {waited:.0} s for the gateway to settle"));
                }
                primary.clear().await?;
                secondary.clear().await?;
                let u0 = gw.usage();
                let label = format!("{} {mode} {}", kind.tag(), load.label());
                let run = drive(ctx, &http, &gw.front, label.clone(), stream, *load, *d).await;
                let u1 = gw.usage();
                peak_kb = peak_kb.max(u1.hwm_kb);
                let cpu = u1.cpu_s - u0.cpu_s;
                let cpu_1k = if run.ok() > 0 {
                    cpu / (run.ok() as f64 / 1000.0)
                } else {
                    f64::NAN
                };
                res.checks.push(check_complete(&label, &run));
                if kind == Kind::Switchyard {
                    res.checks.push(check_errors(&label, &run.outcomes, &[]));
                }
                let (l, t) = (run.latency(), run.ttft());
                let base = match load {
                    Load::Rate(r) => direct.get(&(stream, *r as u64)).map(|d| d.latency()),
                    Load::Closed(_) => None,
                };
                over.row(vec![
                    kind.name().into(),
                    mode.into(),
                    load.label(),
                    sustained(&run, *load),
                    if l.n > 0 {
                        format!("{} / {}", ms(l.p50), ms(l.p99))
                    } else {
                        "-".into()
                    },
                    match base {
                        Some(b) if l.n > 0 => {
                            format!("{} / {}", delta(l.p50 - b.p50), delta(l.p99 - b.p99))
                        }
                        _ => "-".into(),
                    },
                    if stream && t.n > 0 {
                        format!("{} / {}", ms(t.p50), ms(t.p99))
                    } else {
                        "-".into()
                    },
                    short_errors(&run),
                    cpu_us(cpu_1k),
                    format!("{:.0}", u1.hwm_kb as f64 / 1024.0),
                ]);
                match load {
                    Load::Rate(r) => {
                        let added = match base {
                            Some(b) if l.n > 0 => {
                                format!("{} / {}", delta(l.p50 - b.p50), delta(l.p99 - b.p99))
                            }
                            _ => "-".into(),
                        };
                        side_rates
                            .insert(*r as u64, [sustained(&run, *load), cpu_us(cpu_1k), added]);
                    }
                    Load::Closed(_) => {
                        side_closed = [format!("{:.0}", run.throughput()), cpu_us(cpu_1k)];
                    }
                }
                rows.push(json!({
                    "mode": mode, "load": load.label(), "scheduled": run.scheduled, "ok": run.ok(),
                    "failed": run.failed(), "skipped": run.skipped, "unfinished": run.unfinished,
                    "throughput_rps": run.throughput(), "latency_ms": l, "ttft_ms": t,
                    "direct_latency_ms": base, "errors": errors_json(&run.outcomes),
                    "cpu_s": cpu, "cpu_s_per_1k": if cpu_1k.is_finite() { json!(cpu_1k) } else { Value::Null },
                    "cpu_us_per_request": if cpu_1k.is_finite() { json!(cpu_1k * 1000.0) } else { Value::Null },
                    "tree_rss_mb": u1.rss_kb as f64 / 1024.0, "tree_peak_rss_mb": u1.hwm_kb as f64 / 1024.0,
                    "tree_pids": tree_pids(gw.pid).len(),
                }));
                ctx.progress(format!(
                    "   {label}: {:.0} rps, p50 {} p99 {} ms, {} failed, CPU {cpu:.2} s",
                    run.throughput(),
                    ms(l.p50),
                    ms(l.p99),
                    run.failed()
                ));
            }
            let mut side_row: Vec<String> = vec![kind.name().into(), mode.into()];
            for r in &all_rates {
                match side_rates.remove(&(*r as u64)) {
                    Some(cells) => side_row.extend(cells),
                    None => side_row.extend(["-".to_string(), "-".into(), "-".into()]),
                }
            }
            side_row.extend(side_closed);
            side.row(side_row);
        }

        // Blackout: primary fails (500/503/429) for the middle third, streamed
        // then not (Portkey's fallback is only measurable unary).
        primary.set_config(&json!({"token_delay_ms": 5})).await?;
        secondary.set_config(&json!({"token_delay_ms": 5})).await?;
        let mut blackouts = Vec::new();
        for stream in [true, false] {
            let mode = if stream { "stream" } else { "unary" };
            let waited = settle(&gw, [&primary, &secondary]).await?;
            if waited > 2.5 {
                ctx.progress(format!("   waited {waited:.0} s for the gateway to settle"));
            }
            primary.clear().await?;
            secondary.clear().await?;
            let tag = format!("bo-{}-{mode}", kind.tag());
            let load = {
                let (http, front, tag) = (http.clone(), gw.front.clone(), tag.clone());
                open_loop(
                    ctx,
                    format!("{} {mode} blackout", kind.tag()),
                    plan.bo_rate,
                    plan.phase * 3,
                    2_000,
                    move |i, t0| {
                        let (http, front, tag) = (http.clone(), front.clone(), tag.clone());
                        async move { chat_call(&http, &front, stream, format!("{tag} r{i}"), t0).await }
                    },
                )
            };
            let start = Instant::now();
            let (brun, flips) = tokio::join!(load, blackout(&primary, start, plan.phase));
            let flips = flips?;
            let logs = [primary.requests().await?, secondary.requests().await?];
            let phase_s = plan.phase.as_secs_f64();
            let (att, other) = attempts_by_phase(&logs, &tag, plan.bo_rate, phase_s);
            let stats = by_phase(&brun, phase_s);
            res.checks.push(check_complete(&tag, &brun));
            let mut phases = Vec::new();
            for (i, (p, s)) in PHASES.iter().zip(&stats).enumerate() {
                let apr = if s.n > 0 {
                    att[i] as f64 / s.n as f64
                } else {
                    0.0
                };
                bo.row(vec![
                    kind.name().into(),
                    mode.into(),
                    p.to_string(),
                    s.n.to_string(),
                    pct(s.availability),
                    if s.ttft.n > 0 {
                        format!("{} / {}", ms(s.ttft.p50), ms(s.ttft.p95))
                    } else {
                        "-".into()
                    },
                    format!("{apr:.2}"),
                ]);
                phases.push(
                    json!({"phase": p, "requests": s.n, "availability": s.availability,
                    "ttft_ms": s.ttft, "upstream_attempts": att[i], "attempts_per_request": apr}),
                );
            }
            let overall = brun.ok() as f64 / brun.outcomes.len().max(1) as f64;
            bo.row(vec![
                kind.name().into(),
                mode.into(),
                "**whole run**".into(),
                brun.outcomes.len().to_string(),
                pct(overall),
                short_errors(&brun),
                format!("({other} other upstream requests, e.g. probes)"),
            ]);
            blackouts.push(
                json!({"mode": mode, "phases": phases, "availability": overall,
                "errors": errors_json(&brun.outcomes), "other_upstream_requests": other,
                "fault_changes": flips}),
            );
        }
        let u = gw.usage();
        peak_kb = peak_kb.max(u.hwm_kb);
        let immutable = std::fs::read_to_string(&gw.log)
            .map(|t| t.matches("TypeError: immutable").count())
            .unwrap_or(0);
        let fix = versions
            .get("portkey_streaming_fix")
            .cloned()
            .unwrap_or_default();
        let status = match kind {
            Kind::Portkey if fix.starts_with("patched") => format!(
                "ran; scratch copy {fix} for the upstream streaming bug `TypeError: immutable` \
                 (Portkey-AI/gateway#1389); `TypeError: immutable` logged {immutable} times"
            ),
            Kind::Portkey if immutable > 0 => format!(
                "ran unpatched; streaming failed as measured (`TypeError: immutable` logged \
                 {immutable} times, upstream bug Portkey-AI/gateway#1389)"
            ),
            _ => "ran".into(),
        };
        peers_tbl.row(vec![
            kind.name().into(),
            version.clone(),
            config.clone(),
            status.clone(),
        ]);
        data.push(json!({
            "gateway": kind.name(), "version": version, "available": true, "config": config,
            "status": status, "overhead": rows, "peak_rss_mb": peak_kb as f64 / 1024.0,
            "blackout": blackouts,
            "typeerror_immutable_logged": immutable,
        }));
        ctx.progress(format!(
            "   {} done (peak RSS {:.0} MB)",
            kind.name(),
            peak_kb as f64 / 1024.0
        ));
        let _ = gw.kind;
        gw.stop().await;
    }
    primary.stop().await;
    secondary.stop().await;

    res.markdown = format!(
        "Not part of `--scenario all`. Peers installed by `scripts/install-peers.sh` into \
         `{}` ({install}). Every gateway gets the same OpenAI HTTP requests \
         (`POST /v1/chat/completions`, 16-token answers, streaming and not) and calls the same \
         two OpenAI-shaped mocks on 127.0.0.1. One gateway runs at a time. Open loop on a \
         schedule (latency from the scheduled send); \"added\" is against the same load sent \
         straight to the mock. Before each run the bench waits until the gateway has finished \
         work left from the previous one (abandoned requests of an overloaded run). CPU and peak RSS cover each gateway's process tree (`/proc`, \
         children included; peak = sum of VmHWM). Blackout: {:.0} s per phase, {:.0} requests/s \
         (streamed, then the same unary, whose TTFT is the whole answer; the whole-run row lists the \
         errors), mocks 16 tokens 5 ms apart, primary answering 500/503/429 in the middle \
         phase; attempts counted from the mocks' request logs. Switchyard and Busbar reach the \
         mocks over {}.{}\n\n{}\nSide by side \
         (CPU µs per request of the gateway's process tree; added latency vs direct):\n\n{}\n{}\nBlackout:\n\n{}",
        dir.display(),
        plan.phase.as_secs_f64(),
        plan.bo_rate,
        super::upstream_text(UPSTREAM_ENV, STREAM_UNARY_ENV),
        match &ctx.peer_bin {
            Some(p) => format!(
                " Rust peer: `--peer-bin {}` (built by `scripts/build-peer-{}.sh`: {}); \
                 it and Switchyard also run {} requests/s.",
                p.display(),
                peer_kind.map_or("agentgateway", Kind::tag),
                peer_rev
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                fast_rates
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            None => String::new(),
        },
        peers_tbl.render(),
        side.render(),
        over.render(),
        bo.render()
    );
    res.data = json!({
        "peers_dir": dir.display().to_string(), "install": install, "versions": versions,
        "gateways": data, "rates": plan.rates, "duration_s": plan.d.as_secs_f64(),
        "blackout_phase_s": plan.phase.as_secs_f64(), "blackout_rate": plan.bo_rate,
        "portkey_streaming_fix": versions.get("portkey_streaming_fix"),
        "fast_rates": fast_rates, "peer_bin": ctx.peer_bin.as_ref().map(|p| p.display().to_string()),
        "peer_revision": peer_rev, "selected": kinds.iter().map(|k| k.tag()).collect::<Vec<_>>(),
    });
    Ok(res)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bench_peer_configs_name_both_targets_with_fallback_and_retry() {
        let l = litellm_config("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1", 2.5);
        assert_eq!(
            l["model_list"][1]["litellm_params"]["api_base"],
            "http://127.0.0.1:2/v1"
        );
        assert_eq!(
            l["litellm_settings"]["fallbacks"][0]["chat"][0],
            "chat-fallback"
        );
        assert_eq!(l["litellm_settings"]["num_retries"], RETRIES);
        assert_eq!(l["general_settings"]["master_key"], MASTER_KEY);
        let p = portkey_config("http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1");
        assert_eq!(p["strategy"]["mode"], "fallback");
        assert_eq!(p["targets"][0]["custom_host"], "http://127.0.0.1:1/v1");
        assert_eq!(p["targets"][1]["retry"]["attempts"], RETRIES);
    }

    #[test]
    fn bench_peer_attempts_are_counted_per_phase_from_tags() {
        let rec = |c: &str| switchyard_mock::RequestRecord {
            seq: 0,
            path: "/v1/chat/completions".into(),
            dialect: switchyard_mock::MockKind::Openai,
            model: None,
            stream: true,
            max_tokens: None,
            has_tools: false,
            body: json!({"messages": [{"content": c}]}),
            authorization_present: false,
            headers: BTreeMap::new(),
            arrived_ms: 0.0,
            finished_ms: None,
            status: None,
            fault: None,
            tokens_sent: 0,
            completed: true,
            client_hung_up: false,
            over_capacity: false,
            key_label: None,
            ..Default::default()
        };
        // 10 rps, 1 s phases: r5 is phase 0, r12 phase 1, r25 and r99 phase 2.
        let logs = vec![vec![
            rec("bo-x r5"),
            rec("bo-x r12"),
            rec("bo-x r12"),
            rec("bo-x r25"),
            rec("bo-x r99"),
            rec("probe"),
        ]];
        let (per, other) = attempts_by_phase(&logs, "bo-x", 10.0, 1.0);
        assert_eq!(per, [1, 2, 2]);
        assert_eq!(other, 1);
    }

    #[test]
    fn bench_agentgateway_config_fails_over_from_primary_to_secondary() {
        let a = agentgateway_config(
            "http://127.0.0.1:1/v1",
            "http://127.0.0.1:2/v1",
            4000,
            [5, 6, 7],
            2500,
        );
        let llm = &a["llm"];
        assert_eq!(llm["port"], 4000);
        assert_eq!(llm["models"][0]["name"], "primary");
        assert_eq!(llm["models"][0]["provider"], "openAI");
        assert_eq!(
            llm["models"][0]["params"]["baseUrl"],
            "http://127.0.0.1:1/v1"
        );
        assert_eq!(
            llm["models"][1]["params"]["baseUrl"],
            "http://127.0.0.1:2/v1"
        );
        assert_eq!(llm["models"][1]["visibility"], "internal");
        assert_eq!(llm["models"][0]["health"]["eviction"]["duration"], "2500ms");
        let vm = &llm["virtualModels"][0];
        assert_eq!(vm["name"], "chat");
        let t = &vm["routing"]["failover"]["targets"];
        assert_eq!(
            (t[0]["model"].as_str(), t[0]["priority"].as_u64()),
            (Some("primary"), Some(0))
        );
        assert_eq!(
            (t[1]["model"].as_str(), t[1]["priority"].as_u64()),
            (Some("secondary"), Some(1))
        );
        assert_eq!(a["config"]["adminAddr"], "127.0.0.1:5");
        assert_eq!(a["config"]["readinessAddr"], "127.0.0.1:7");
    }

    #[test]
    fn bench_peers_selection_keeps_switchyard_first() {
        use Kind::*;
        let agw = Some(AgentGateway);
        assert_eq!(selected(None, None), vec![Switchyard, LiteLlm, Portkey]);
        assert_eq!(
            selected(agw, None),
            vec![Switchyard, AgentGateway, LiteLlm, Portkey]
        );
        assert_eq!(
            selected(agw, Some("agentgateway")),
            vec![Switchyard, AgentGateway]
        );
        assert_eq!(
            selected(Some(Busbar), Some("busbar")),
            vec![Switchyard, Busbar]
        );
        // The Rust peer needs --peer-bin; an empty list means all.
        assert_eq!(selected(None, Some("agentgateway")), vec![Switchyard]);
        assert_eq!(
            selected(None, Some(" , ")),
            vec![Switchyard, LiteLlm, Portkey]
        );
        assert_eq!(
            selected(agw, Some("Portkey, litellm")),
            vec![Switchyard, LiteLlm, Portkey]
        );
        assert_eq!(Kind::of_peer_bin(Path::new("/x/busbar")), Busbar);
        assert_eq!(
            Kind::of_peer_bin(Path::new("/x/agentgateway")),
            AgentGateway
        );
        let b = busbar_config(
            8080,
            8081,
            "http://127.0.0.1:1",
            "http://127.0.0.1:2",
            3,
            false,
        );
        assert_eq!(b["auth"]["chain"], json!([]));
        assert_eq!(
            b["pools"]["chat"]["on_exhausted"]["fallback_pool"],
            "chat-fallback"
        );
        assert_eq!(
            b["providers"]["mock-secondary"]["base_url"],
            "http://127.0.0.1:2"
        );
        assert_eq!(
            busbar_providers("a", "b")["mock-primary"]["protocol"],
            "openai"
        );
    }

    #[test]
    fn bench_peers_dir_honours_the_env_override() {
        assert!(peers_dir().is_absolute() || std::env::var_os(PEERS_DIR_ENV).is_some());
    }
}
