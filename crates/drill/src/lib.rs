//! `switchyard drill`: runs a failover drill (a built-in scenario or a TOML
//! file), prints what happened request by request, a summary table and the
//! assertions it checked. By default it starts its own router and mock
//! upstreams in process; `--target` drives a running Switchyard whose
//! providers are `mock-upstream` instances reachable at `--mock NAME=URL`.

pub mod check;
pub mod control;
pub mod report;
pub mod run;
pub mod scenario;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;

use switchyard::app::{self, Running};
use switchyard::config::Config;
use switchyard::proto;
use switchyard_mock::{self as mock, MockArgs};

use control::{Mock, StatusSource};
pub use scenario::{Scenario, ScenarioError};

/// The built-in scenarios, by name (files under `drills/`).
pub const BUILTINS: &[(&str, &str)] = &[
    (
        "primary-down",
        include_str!("../../../drills/primary-down.toml"),
    ),
    (
        "primary-abort-100",
        include_str!("../../../drills/primary-abort-100.toml"),
    ),
    (
        "anthropic-overloaded-midstream",
        include_str!("../../../drills/anthropic-overloaded-midstream.toml"),
    ),
    (
        "rate-limit-storm",
        include_str!("../../../drills/rate-limit-storm.toml"),
    ),
    (
        "secondary-saturation",
        include_str!("../../../drills/secondary-saturation.toml"),
    ),
    (
        "all-down-recovery",
        include_str!("../../../drills/all-down-recovery.toml"),
    ),
];

/// Arguments of `switchyard drill`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DrillArgs {
    /// A built-in scenario name (see --list) or a scenario TOML file.
    #[arg(long, required_unless_present = "list")]
    pub scenario: Option<String>,
    /// Print the built-in scenarios and exit.
    #[arg(long)]
    pub list: bool,
    /// Drive a running Switchyard at HOST:PORT (its gRPC listener) instead of
    /// starting one in process. Needs --mock for every mock of the scenario.
    #[arg(long, value_name = "HOST:PORT")]
    pub target: Option<String>,
    /// Control URL of a mock-upstream behind the target, e.g.
    /// `primary=http://10.0.0.5:8001` (repeatable).
    #[arg(long = "mock", value_name = "NAME=URL", value_parser = parse_mock)]
    pub mocks: Vec<(String, String)>,
    /// Environment variable holding the target's admin token (breaker and
    /// budget states come from Admin.ListProviders).
    #[arg(long, value_name = "VAR")]
    pub admin_token_env: Option<String>,
    /// Environment variable holding a caller token, if the target authenticates callers.
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// Print the Switchyard config the scenario runs in process (with the
    /// --mock URLs as base URLs, 127.0.0.1:8001... for the others) and exit:
    /// a starting point for a staging setup.
    #[arg(long)]
    pub print_config: bool,
    /// Only the summary and the assertions, no per-request lines.
    #[arg(long, short)]
    pub quiet: bool,
}

fn parse_mock(s: &str) -> Result<(String, String), String> {
    let (name, url) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not NAME=URL"))?;
    if name.is_empty() || url.is_empty() {
        return Err(format!("`{s}` is not NAME=URL"));
    }
    Ok((name.to_string(), url.to_string()))
}

/// Why a drill could not run (assertion failures are `Ok(false)`, not errors).
#[derive(Debug, thiserror::Error)]
pub enum DrillError {
    /// The scenario file is malformed (the path names the bad value).
    #[error("scenario {source_name}: {error}")]
    Scenario {
        source_name: String,
        error: ScenarioError,
    },
    /// Bad command-line arguments.
    #[error("{0}")]
    Usage(String),
    /// The in-process router or mocks could not start.
    #[error("cannot start the drill environment: {0}")]
    Start(String),
    /// The remote target or one of its mocks misbehaved.
    #[error("remote: {0}")]
    Remote(String),
}

impl DrillError {
    /// The process exit code for this error (`main` exits 0 on pass, 1 on a
    /// failed assertion, and this otherwise).
    pub fn exit_code(&self) -> u8 {
        2
    }
}

/// Loads a built-in by name, or a file.
pub fn load_scenario(name_or_file: &str) -> Result<Scenario, DrillError> {
    let (source_name, text) = match BUILTINS.iter().find(|(n, _)| *n == name_or_file) {
        Some((n, text)) => (format!("built-in {n}"), (*text).to_string()),
        None => {
            let path = Path::new(name_or_file);
            let text = std::fs::read_to_string(path).map_err(|e| {
                let names: Vec<&str> = BUILTINS.iter().map(|(n, _)| *n).collect();
                DrillError::Usage(format!(
                    "`{name_or_file}` is neither a built-in scenario ({}) nor a readable file: {e}",
                    names.join(", ")
                ))
            })?;
            (path.display().to_string(), text)
        }
    };
    Scenario::from_toml_str(&text).map_err(|error| DrillError::Scenario { source_name, error })
}

/// Runs the drill, printing to stdout. `Ok(true)` when every assertion passed.
pub async fn run(args: DrillArgs) -> Result<bool, DrillError> {
    let mut stdout = std::io::stdout();
    run_to(args, &mut stdout).await
}

/// Like [`run`], writing the report to `out`.
pub async fn run_to(args: DrillArgs, out: &mut (dyn Write + Send)) -> Result<bool, DrillError> {
    if args.list {
        list(out);
        return Ok(true);
    }
    let name = args
        .scenario
        .clone()
        .ok_or_else(|| DrillError::Usage("--scenario NAME|FILE is required".into()))?;
    let scenario = load_scenario(&name)?;
    if args.print_config {
        let given: BTreeMap<&String, &String> = args.mocks.iter().map(|(n, u)| (n, u)).collect();
        let urls: BTreeMap<String, String> = scenario
            .mocks
            .keys()
            .enumerate()
            .map(|(i, n)| {
                let url = given.get(n).map_or_else(
                    || format!("http://127.0.0.1:{}", 8001 + i),
                    |u| control::control_url(u),
                );
                (n.clone(), format!("{url}/v1"))
            })
            .collect();
        let text = scenario
            .router_config(&urls)
            .map_err(|error| DrillError::Scenario {
                source_name: name.clone(),
                error,
            })?;
        let _ = write!(out, "{text}");
        return Ok(true);
    }
    let _ = writeln!(
        out,
        "drill {}: {}",
        scenario.name,
        scenario.description.trim()
    );
    let phases = match &args.target {
        None => run_in_process(&scenario, &args, out).await?,
        Some(target) => run_remote(&scenario, &args, target, out).await?,
    };
    let verdicts = check::evaluate(&scenario.asserts, &phases);
    let passed = verdicts.iter().all(|v| v.pass);
    let _ = writeln!(out, "\nsummary\n{}", report::summary(&phases));
    let _ = writeln!(out, "assertions\n{}", report::verdicts(&verdicts));
    let failed = verdicts.iter().filter(|v| !v.pass).count();
    let _ = writeln!(
        out,
        "drill {}: {} ({} of {} assertions passed)",
        scenario.name,
        if passed { "PASS" } else { "FAIL" },
        verdicts.len() - failed,
        verdicts.len()
    );
    Ok(passed)
}

fn list(out: &mut (dyn Write + Send)) {
    for (name, text) in BUILTINS {
        let description = Scenario::from_toml_str(text)
            .map(|s| s.description.trim().replace('\n', " "))
            .unwrap_or_else(|e| format!("(invalid: {e})"));
        let _ = writeln!(out, "{name:<32} {description}");
    }
}

async fn run_in_process(
    scenario: &Scenario,
    args: &DrillArgs,
    out: &mut (dyn Write + Send),
) -> Result<Vec<run::PhaseResult>, DrillError> {
    let mut mocks = BTreeMap::new();
    let mut urls = BTreeMap::new();
    for (name, spec) in &scenario.mocks {
        let handle = mock::start(MockArgs {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            kind: spec.kind,
            tokens: spec.tokens,
            token_delay_ms: spec.token_delay_ms,
            fault: None,
            max_concurrency: spec.max_concurrency,
            seed: 0,
        })
        .await
        .map_err(|e| DrillError::Start(format!("mock {name}: {e}")))?;
        urls.insert(name.clone(), handle.base_url());
        mocks.insert(name.clone(), Mock::Local(handle));
    }
    let text = scenario
        .router_config(&urls)
        .map_err(|error| DrillError::Scenario {
            source_name: scenario.name.clone(),
            error,
        })?;
    let config = Config::from_toml_str(&text).map_err(|e| DrillError::Start(e.to_string()))?;
    let running = app::start(config, None)
        .await
        .map_err(|e| DrillError::Start(e.to_string()))?;
    let _ = writeln!(
        out,
        "in process: router grpc={} with mocks {}",
        running.grpc_addr,
        describe_urls(&urls)
    );
    let result = drive_local(scenario, args, &running, mocks, out).await;
    running.shutdown().await;
    result
}

async fn drive_local(
    scenario: &Scenario,
    args: &DrillArgs,
    running: &Running,
    mocks: BTreeMap<String, Mock>,
    out: &mut (dyn Write + Send),
) -> Result<Vec<run::PhaseResult>, DrillError> {
    let client = connect(&running.grpc_addr.to_string()).await?;
    let mut env = run::Env {
        client: proto::router_client::RouterClient::new(client),
        mocks,
        status: StatusSource::Local(running.registry.clone()),
        route: scenario.route.clone(),
        caller_token: None,
    };
    let result = run::run_phases(scenario, &mut env, out, args.quiet).await;
    for (_, m) in std::mem::take(&mut env.mocks) {
        m.shutdown().await;
    }
    result
}

fn describe_urls(urls: &BTreeMap<String, String>) -> String {
    urls.iter()
        .map(|(n, u)| format!("{n}={u}"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn connect(addr: &str) -> Result<tonic::transport::Channel, DrillError> {
    let url = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|e| DrillError::Usage(format!("--target {addr}: {e}")))?
        .connect_timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| DrillError::Remote(format!("cannot connect to {url}: {e}")))
}

fn env_var(var: &Option<String>, flag: &str) -> Result<Option<String>, DrillError> {
    match var {
        None => Ok(None),
        Some(v) => std::env::var(v)
            .map(Some)
            .map_err(|_| DrillError::Usage(format!("{flag}: environment variable {v} is not set"))),
    }
}

async fn run_remote(
    scenario: &Scenario,
    args: &DrillArgs,
    target: &str,
    out: &mut (dyn Write + Send),
) -> Result<Vec<run::PhaseResult>, DrillError> {
    let given: BTreeMap<String, String> = args.mocks.iter().cloned().collect();
    let missing: Vec<&String> = scenario
        .mocks
        .keys()
        .filter(|m| !given.contains_key(*m))
        .collect();
    if !missing.is_empty() {
        return Err(DrillError::Usage(format!(
            "--target needs --mock NAME=URL for every mock of the scenario; missing: {}",
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let admin_token = env_var(&args.admin_token_env, "--admin-token-env")?;
    let caller_token = env_var(&args.token_env, "--token-env")?;
    let mut mocks = BTreeMap::new();
    for (name, spec) in &scenario.mocks {
        let url = given
            .get(name)
            .ok_or_else(|| DrillError::Usage(format!("--mock {name}=URL is missing")))?;
        let m = Mock::remote(url)?;
        m.configure(spec).await?;
        m.set_fault(&Default::default()).await?;
        mocks.insert(name.clone(), m);
    }
    let channel = connect(target).await?;
    let mut admin = proto::admin_client::AdminClient::new(channel.clone());
    check_target(scenario, &mut admin, admin_token.as_deref(), out).await?;
    let _ = writeln!(
        out,
        "remote: target {target} with mocks {}",
        describe_urls(&given)
    );
    let mut env = run::Env {
        client: proto::router_client::RouterClient::new(channel),
        mocks,
        status: StatusSource::Remote {
            client: admin,
            token: admin_token,
        },
        route: scenario.route.clone(),
        caller_token,
    };
    let result = run::run_phases(scenario, &mut env, out, args.quiet).await;
    for m in env.mocks.values() {
        let _ = m.set_fault(&Default::default()).await;
    }
    result
}

/// Checks the target serves the scenario's route; warns when it cannot be inspected.
async fn check_target(
    scenario: &Scenario,
    admin: &mut proto::admin_client::AdminClient<tonic::transport::Channel>,
    token: Option<&str>,
    out: &mut (dyn Write + Send),
) -> Result<(), DrillError> {
    match control::list_providers(admin, token).await {
        Ok(list) => {
            let Some(route) = list.routes.iter().find(|r| r.name == scenario.route) else {
                let names: Vec<&str> = list.routes.iter().map(|r| r.name.as_str()).collect();
                return Err(DrillError::Remote(format!(
                    "the target has no route `{}` (it has: {})",
                    scenario.route,
                    names.join(", ")
                )));
            };
            let providers: Vec<String> = route
                .targets
                .iter()
                .map(|t| t.split('/').next().unwrap_or_default().to_string())
                .collect();
            if providers != scenario.targets() {
                let _ = writeln!(
                    out,
                    "warning: route `{}` targets {:?}, the scenario expects providers {:?} in that order",
                    route.name,
                    route.targets,
                    scenario.targets()
                );
            }
            Ok(())
        }
        Err(status) => {
            let _ = writeln!(
                out,
                "warning: Admin.ListProviders failed ({}): breaker and budget states are unknown; breaker assertions will fail",
                status.message()
            );
            Ok(())
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    fn parse(argv: &[&str]) -> Result<DrillArgs, clap::Error> {
        let cmd = DrillArgs::augment_args(clap::Command::new("drill"));
        cmd.clone().debug_assert();
        let m = cmd.try_get_matches_from(argv)?;
        DrillArgs::from_arg_matches(&m)
    }

    #[test]
    fn drill_arguments_parse() {
        let a = parse(&[
            "drill",
            "--scenario",
            "primary-down",
            "--target",
            "127.0.0.1:50051",
            "--mock",
            "primary=http://127.0.0.1:8001",
            "--mock",
            "secondary=http://127.0.0.1:8002",
            "--admin-token-env",
            "ADMIN",
            "-q",
        ])
        .unwrap();
        assert_eq!(a.mocks.len(), 2);
        assert_eq!(a.mocks[1].0, "secondary");
        assert!(a.quiet);
        assert!(parse(&["drill", "--list"]).unwrap().list);
        assert!(parse(&["drill"]).is_err());
        assert!(parse(&["drill", "--scenario", "x", "--mock", "nourl"]).is_err());
    }
}
