//! The `switchyard` command: `serve`, `check-config`, `mock-upstream`, `drill`,
//! `bench` and `plan`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use switchyard::config::{Config, LogFormat};
use switchyard_mock::{self as mock, MockArgs, MockKind};

#[derive(Parser)]
#[command(
    name = "switchyard",
    version,
    about = "Resilient gRPC router in front of LLM providers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the gRPC router and the HTTP doors. Without --config: real providers
    /// for whichever of OPENAI_API_KEY / ANTHROPIC_API_KEY is set, built-in mock
    /// upstreams otherwise, and the HTTP doors on 127.0.0.1:8080.
    Serve(ServeArgs),
    /// Validate a config file; prints the first error (with its dotted path) and exits non-zero.
    CheckConfig {
        /// The TOML file.
        file: PathBuf,
    },
    /// Run a fault-injecting OpenAI/Anthropic-compatible upstream for tests and drills.
    MockUpstream(MockArgs),
    /// Run a failover drill (a built-in scenario or a TOML file) and print what happened.
    Drill(switchyard_drill::DrillArgs),
    /// Run a benchmark scenario (or all) and write bench.json and bench.md.
    Bench(switchyard_bench::BenchArgs),
    /// Failover capacity per route from a running Switchyard (or Prometheus) and
    /// the config: exit 0 all fits, 1 a ceiling would be exceeded, 2 could not run.
    Plan(switchyard_plan::PlanArgs),
    /// Run a golden set through every target of a route and record which
    /// targets behave like the first: exit 0 all validated, 1 some not, 2 could not run.
    Golden(switchyard_golden::GoldenArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML config file.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override `server.grpc_listen`.
    #[arg(long)]
    grpc_listen: Option<SocketAddr>,
    /// Override `server.admin_listen`.
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// Where the HTTP doors (OpenAI and Anthropic shapes) listen; default
    /// `server.http_listen`, or 127.0.0.1:8080 without --config.
    #[arg(long)]
    http_listen: Option<SocketAddr>,
    /// Override `server.log_format`.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// Set `queue.accept_empty_file`: begin an empty queue in a queue file
    /// that exists but holds none (after a truncation the file is refused).
    #[arg(long)]
    accept_empty_queue: bool,
}

/// Counts allocations only when `SWITCHYARD_COUNT_ALLOCATIONS=1` (the bench).
#[cfg(not(feature = "dhat-heap"))]
#[global_allocator]
static ALLOCATOR: switchyard::telemetry::alloc::Counting = switchyard::telemetry::alloc::Counting;

/// `--features dhat-heap`: every allocation site, written to dhat-heap.json at exit.
#[cfg(feature = "dhat-heap")]
#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// mimalloc's options, set before the first allocation (an ELF constructor
/// runs before `main` and before the runtime allocates anything): see
/// `telemetry::alloc::commit_memory_as_used`.
#[cfg(all(target_os = "linux", not(feature = "dhat-heap")))]
#[used]
#[link_section = ".init_array"]
static ALLOCATOR_OPTIONS: extern "C" fn() = {
    extern "C" fn set() {
        switchyard::telemetry::alloc::commit_memory_as_used();
    }
    set
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` reads its config first: `server.worker_threads` sizes the runtime.
    let loaded = match &cli.command {
        Command::Serve(ServeArgs {
            config: Some(path), ..
        }) => match Config::load(path) {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("error: {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        _ => None,
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = loaded.as_ref().and_then(|c| c.server.worker_threads) {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::CheckConfig { file } => check_config(&file),
        Command::MockUpstream(args) => {
            let telemetry = switchyard::telemetry::tracing::init(LogFormat::Pretty);
            let result = runtime.block_on(mock::run(args));
            telemetry.shutdown();
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: mock-upstream: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve(args) => runtime.block_on(serve(args, loaded)),
        // No log subscriber: the in-process router's logs would interleave with the report.
        Command::Drill(args) => verdict(
            runtime.block_on(switchyard_drill::run(args)),
            switchyard_drill::DrillError::exit_code,
        ),
        Command::Golden(args) => verdict(
            runtime.block_on(switchyard_golden::run(args)),
            switchyard_golden::GoldenError::exit_code,
        ),
        Command::Plan(args) => verdict(
            runtime.block_on(switchyard_plan::run(args)),
            switchyard_plan::PlanError::exit_code,
        ),
        Command::Bench(args) => {
            // The in-process router's logs only when asked for (RUST_LOG set):
            // they interleave with the progress lines.
            let telemetry = std::env::var_os("RUST_LOG")
                .map(|_| switchyard::telemetry::tracing::init(LogFormat::Pretty));
            let result = runtime.block_on(switchyard_bench::run(args));
            if let Some(t) = telemetry {
                t.shutdown();
            }
            verdict(result, switchyard_bench::BenchError::exit_code)
        }
    }
}

/// Exit 0 when a drill, bench or plan passed, 1 when it ran and failed, and
/// the error's own code when it could not run.
fn verdict<E: std::fmt::Display>(result: Result<bool, E>, code: fn(&E) -> u8) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(code(&e))
        }
    }
}

fn check_config(file: &std::path::Path) -> ExitCode {
    match Config::load(file) {
        Ok(config) => {
            for (path, env) in config.missing_env() {
                println!("warning: {path}: environment variable {env} is not set here");
            }
            println!(
                "{}: ok ({} providers, {} routes)",
                file.display(),
                config.providers.len(),
                config.routes.len()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {}: {e}", file.display());
            ExitCode::from(2)
        }
    }
}

/// Serves with `loaded`, the config `--config` named, or the built-in one.
async fn serve(args: ServeArgs, loaded: Option<Config>) -> ExitCode {
    #[cfg(feature = "dhat-heap")]
    let _profiler = dhat::Profiler::new_heap();
    if std::env::var(switchyard::telemetry::alloc::ENV).as_deref() == Ok("1") {
        switchyard::telemetry::alloc::enable();
    }
    let mut mocks = Vec::new();
    let mut config = match loaded {
        Some(c) => c,
        None => {
            let mut urls = [None, None];
            for (i, (env, kind)) in [
                ("OPENAI_API_KEY", MockKind::Openai),
                ("ANTHROPIC_API_KEY", MockKind::Anthropic),
            ]
            .into_iter()
            .enumerate()
            {
                if std::env::var_os(env).is_some() {
                    continue;
                }
                match mock::start(builtin_mock_args(kind)).await {
                    Ok(handle) => {
                        urls[i] = Some(handle.base_url());
                        mocks.push(handle);
                    }
                    Err(e) => {
                        eprintln!("error: cannot start the built-in mock upstream: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            let mut builtin = Config::builtin(urls[0].as_deref(), urls[1].as_deref());
            // Out of the box, the OpenAI and Anthropic SDKs (and the agents
            // built on them) need only a base URL.
            builtin.server.http_listen = Some(SocketAddr::from(([127, 0, 0, 1], 8080)));
            builtin
        }
    };
    if let Some(a) = args.grpc_listen {
        config.server.grpc_listen = a;
    }
    if let Some(a) = args.admin_listen {
        config.server.admin_listen = a;
    }
    if let Some(a) = args.http_listen {
        config.server.http_listen = Some(a);
    }
    if let Some(f) = args.log_format {
        config.server.log_format = f;
    }
    if args.accept_empty_queue {
        if let Some(q) = config.queue.as_mut() {
            q.accept_empty_file = true;
        }
    }
    let telemetry = switchyard::telemetry::tracing::init(config.server.log_format);
    if args.config.is_none() {
        if mocks.is_empty() {
            tracing::info!("no --config: routing `chat` to OpenAI and Anthropic and `embed` to OpenAI, with the keys from the environment");
        } else {
            for (m, p) in mocks
                .iter()
                .zip(config.providers.iter().filter(|p| p.api_key_env.is_none()))
            {
                tracing::warn!(
                    provider = %p.id,
                    url = %m.base_url(),
                    "no API key in the environment: provider `{}` is a BUILT-IN MOCK upstream serving canned text",
                    p.id
                );
            }
        }
    }
    raise_descriptor_limit();
    if let Some((path, env)) = config.missing_env().into_iter().next() {
        eprintln!("error: {path}: environment variable {env} is not set");
        telemetry.shutdown();
        return ExitCode::from(2);
    }

    let mut running = match switchyard::app::start(config, args.config.clone()).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            telemetry.shutdown();
            return ExitCode::FAILURE;
        }
    };
    let mut hangups = Hangups::install();
    let http = running
        .http_addr
        .map(|a| format!(" http={a}"))
        .unwrap_or_default();
    println!(
        "switchyard serving grpc={} admin={}{http}",
        running.grpc_addr, running.admin_addr
    );
    let _ = std::io::stdout().flush();
    tracing::info!(grpc = %running.grpc_addr, admin = %running.admin_addr, http = ?running.http_addr, "serving");

    let code = loop {
        tokio::select! {
            _ = shutdown_signal() => break ExitCode::SUCCESS,
            _ = hangups.next() => {
                tracing::info!("SIGHUP: reloading the config");
                let _ = running.reloader.reload(false).await;
            }
            _ = running.supervisor_exited() => {
                tracing::error!("the actor supervisor stopped; exiting");
                break ExitCode::FAILURE;
            }
        }
    };
    tracing::info!("shutting down");
    running.shutdown().await;
    for m in mocks {
        m.shutdown().await;
    }
    telemetry.shutdown();
    code
}

fn builtin_mock_args(kind: MockKind) -> MockArgs {
    MockArgs {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        kind,
        tokens: 24,
        token_delay_ms: 20,
        fault: None,
        max_concurrency: 0,
        seed: 0,
    }
}

/// SIGHUP, installed before the banner so a reload signal never kills the process.
struct Hangups {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangups {
    fn install() -> Self {
        Hangups {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok(),
        }
    }

    /// Resolves on the next SIGHUP (never on other platforms).
    async fn next(&mut self) {
        #[cfg(unix)]
        if let Some(s) = &mut self.signal {
            s.recv().await;
            return;
        }
        std::future::pending::<()>().await
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Raises the open-file limit to the hard limit, so the listeners' connection
/// caps (not the kernel's default of 1024) decide when to refuse; under a
/// lower limit the caps are fitted to it at start (`api::listener::Caps`).
fn raise_descriptor_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
}
