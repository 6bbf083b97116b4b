//! `switchyard plan`: capacity for failover bursts. Reads live figures from a
//! running Switchyard (`--admin`) or a Prometheus server (`--prometheus`) and
//! the config, then shows per route what each target would carry if the
//! targets before it failed, against its ceilings. Owns the command only:
//! the arithmetic is `model` (pure), fetching is `source`, printing `report`.

pub mod model;
pub mod report;
pub mod scrape;
pub mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use switchyard::config::Config;

/// Arguments of `switchyard plan`.
#[derive(clap::Args, Debug, Clone)]
pub struct PlanArgs {
    /// The Switchyard config file (routes, ceilings, retry budget).
    #[arg(long, short)]
    pub config: PathBuf,
    /// A running Switchyard's admin listener (HOST:PORT): two /metrics scrapes
    /// a window apart, and /v1/status.
    #[arg(long, value_name = "ADDR", required_unless_present = "prometheus")]
    pub admin: Option<String>,
    /// A Prometheus server (URL) scraping Switchyard: rates over the window.
    #[arg(long, value_name = "URL", conflicts_with = "admin")]
    pub prometheus: Option<String>,
    /// The measurement window (default 30s with --admin, 5m with --prometheus).
    #[arg(long, value_parser = humantime_serde::re::humantime::parse_duration)]
    pub window: Option<Duration>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// A named failure, e.g. `primary=down` (repeatable): every route's
    /// table with exactly those providers down.
    #[arg(long = "what-if", value_name = "PROVIDER=down", value_parser = parse_what_if)]
    pub what_if: Vec<String>,
}

fn parse_what_if(s: &str) -> Result<String, String> {
    match s.split_once('=') {
        Some((p, "down")) if !p.is_empty() => Ok(p.to_string()),
        _ => Err(format!("`{s}` is not PROVIDER=down")),
    }
}

/// Why the plan could not run (a ceiling that would be exceeded is `Ok(false)`).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The config file is unreadable or invalid.
    #[error("{0}")]
    Config(String),
    /// Bad arguments.
    #[error("{0}")]
    Usage(String),
    /// The admin listener or Prometheus could not be read.
    #[error("cannot read the figures: {0}")]
    Fetch(String),
}

impl PlanError {
    /// The process exit code (0 fits, 1 exceeded, this otherwise).
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// Runs the plan, printing to stdout. `Ok(true)` when every ceiling fits.
pub async fn run(args: PlanArgs) -> Result<bool, PlanError> {
    let mut stdout = std::io::stdout();
    run_to(args, &mut stdout).await
}

/// Like [`run`], writing to `out`.
pub async fn run_to(args: PlanArgs, out: &mut (dyn Write + Send)) -> Result<bool, PlanError> {
    let config = Config::load(&args.config)
        .map_err(|e| PlanError::Config(format!("{}: {e}", args.config.display())))?;
    let what_if: BTreeSet<String> = args.what_if.iter().cloned().collect();
    for p in &what_if {
        if !config.providers.iter().any(|c| c.id == *p) {
            return Err(PlanError::Usage(format!(
                "--what-if {p}=down: no provider `{p}` in {}",
                args.config.display()
            )));
        }
    }
    let topology = model::Topology::from_config(&config);
    let (observed, source, warnings) = match (&args.admin, &args.prometheus) {
        (Some(addr), _) => {
            let window = args.window.unwrap_or(Duration::from_secs(30));
            let routes: BTreeMap<String, Vec<String>> = config
                .routes
                .iter()
                .map(|r| {
                    (
                        r.name.clone(),
                        r.targets.iter().map(|t| t.target.clone()).collect(),
                    )
                })
                .collect();
            let reading = source::admin(addr, window, &routes).await?;
            (
                reading.observed,
                format!("admin {}", source::Remote::parse(addr)?.base),
                reading.mismatches,
            )
        }
        (None, Some(url)) => {
            let window = args.window.unwrap_or(Duration::from_secs(300));
            let observed = source::prometheus(url, window).await?;
            // Printed without its userinfo: never a password.
            let shown = source::Remote::parse(url)?.base;
            (observed, format!("prometheus {shown}"), Vec::new())
        }
        (None, None) => {
            return Err(PlanError::Usage(
                "one of --admin ADDR or --prometheus URL is required".into(),
            ))
        }
    };
    let plan = model::plan(&topology, &observed, &what_if);
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    if args.json {
        let text = serde_json::to_string_pretty(&plan)
            .map_err(|e| PlanError::Usage(format!("cannot encode the plan: {e}")))?;
        let _ = writeln!(out, "{text}");
    } else {
        let _ = write!(out, "{}", report::text(&plan, &source));
    }
    Ok(!plan.exceeded)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use base64::Engine;

    const CONFIG: &str = r#"
[[providers]]
id = "p"
kind = "openai"
base_url = "http://127.0.0.1:9/v1"
  [[providers.models]]
  name = "m"
  capabilities = ["chat", "stream"]
  context_tokens = 128000

[[routes]]
name = "chat"
targets = ["p/m"]
"#;

    /// A Prometheus on loopback that answers only `user:s3cret` (one
    /// replica, no other series), and every Authorization it saw.
    async fn prometheus() -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let want = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode("user:s3cret")
        );
        let app = axum::Router::new().route(
            "/api/v1/query",
            axum::routing::get(
                move |uri: axum::http::Uri, headers: axum::http::HeaderMap| {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    log.lock().unwrap().push(auth.clone());
                    let ok = auth == want;
                    let replicas = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
                        .any(|(k, v)| k == "query" && v == source::REPLICAS);
                    async move {
                        if !ok {
                            return (axum::http::StatusCode::UNAUTHORIZED, "no").into_response();
                        }
                        let result = if replicas {
                            serde_json::json!([{"metric": {}, "value": [0, "1"]}])
                        } else {
                            serde_json::json!([])
                        };
                        axum::Json(serde_json::json!({"status": "success",
                            "data": {"resultType": "vector", "result": result}}))
                        .into_response()
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (addr.to_string(), seen)
    }

    fn args(dir: &std::path::Path, prometheus: String) -> PlanArgs {
        let config = dir.join("c.toml");
        std::fs::write(&config, CONFIG).unwrap();
        PlanArgs {
            config,
            admin: None,
            prometheus: Some(prometheus),
            window: None,
            json: false,
            what_if: Vec::new(),
        }
    }

    use axum::response::IntoResponse;

    #[tokio::test]
    async fn a_prometheus_password_is_sent_as_basic_auth_and_never_printed() {
        let (addr, seen) = prometheus().await;
        let dir = tempfile::tempdir().unwrap();
        let mut out = Vec::new();
        run_to(
            args(dir.path(), format!("http://user:s3cret@{addr}/")),
            &mut out,
        )
        .await
        .unwrap();
        let printed = String::from_utf8(out).unwrap();
        assert!(
            printed.contains(&format!("prometheus http://{addr}")),
            "{printed}"
        );
        assert!(
            !printed.contains("s3cret") && !printed.contains("user@"),
            "{printed}"
        );
        let seen = seen.lock().unwrap().clone();
        assert!(!seen.is_empty() && seen.iter().all(|a| a.starts_with("Basic ")));

        // Refused, or nobody listening: the error names the host, not the password.
        for url in [
            format!("http://user:wrong-s3cret@{addr}"),
            "http://user:s3cret@127.0.0.1:9".to_string(),
        ] {
            let e = run_to(args(dir.path(), url), &mut Vec::new())
                .await
                .unwrap_err()
                .to_string();
            assert!(!e.contains("s3cret"), "{e}");
        }
    }
}
