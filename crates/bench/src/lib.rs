//! `switchyard bench`: the benchmark harness. It spawns `mock-upstream`
//! processes and the real `switchyard serve` on 127.0.0.1, drives them from an
//! in-process load generator, and writes `bench.json` and `bench.md` (tables,
//! machine, git revision). `--quick` runs every scenario in seconds (CI); the
//! verdict of a run is correctness only (counts, no unexpected errors).

pub mod clients;
pub mod load;
pub mod procs;
pub mod report;
mod scenarios;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// The scenarios, in the order `all` runs them.
pub const SCENARIOS: &[&str] = &[
    "overhead",
    "blackout",
    "burst",
    "amplification",
    "streams",
    "state",
    "cost",
    "tail",
    "limits",
];
/// Scenarios run only when named (not part of `all`).
pub const EXTRA_SCENARIOS: &[&str] = &["peers", "soak", "h2load"];

/// Arguments of `switchyard bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// overhead | blackout | burst | amplification | streams | state | cost |
    /// tail | limits | all | peers | soak | h2load. `soak` (15 minutes of mixed load under seeded random
    /// faults, reloads and actor kills, with invariants checked at the end)
    /// is NOT part of `all`.
    /// `peers` (LiteLLM proxy and Portkey gateway side by side with Switchyard)
    /// is NOT part of `all`: it installs them with scripts/install-peers.sh into
    /// $SWITCHYARD_PEERS_DIR (default ~/.cache/switchyard-peers) when missing;
    /// with `--peer-bin` it also measures that Rust gateway (Busbar or
    /// agentgateway). SWITCHYARD_PEERS (comma-separated: litellm, portkey,
    /// agentgateway, busbar) narrows the peers run (Switchyard always runs).
    /// `h2load` (nghttp2's load generator instead of this crate's, gRPC
    /// frames encoded from the proto; needs `h2load` on PATH) is NOT part of `all`.
    #[arg(long, default_value = "all")]
    pub scenario: String,
    /// Run each scenario in a few seconds (CI: proves the harness works; the
    /// numbers are not meaningful).
    #[arg(long)]
    pub quick: bool,
    /// Directory for bench.json, bench.md, the generated configs and logs.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Also record a `perf` profile of Switchyard during the overhead runs at
    /// 3,000 requests per second (needs `perf`; files perf-*.data under --out).
    #[arg(long)]
    pub perf: bool,
    /// Another `switchyard` build (e.g. the previous main's) that `overhead`
    /// runs side by side with this one, interleaved in the same run, so the
    /// before/after figures share the machine's conditions.
    #[arg(long, value_name = "PATH")]
    pub baseline: Option<PathBuf>,
    /// A Rust peer gateway binary (Busbar, built by
    /// scripts/build-peer-busbar.sh, when its file name contains `busbar`;
    /// else agentgateway, built by scripts/build-peer-agentgateway.sh) that
    /// `peers` also starts and measures like Switchyard, in the same run:
    /// the same OpenAI requests at 1,000 and 3,000 per second and closed
    /// loop, CPU per request and added latency. `SWITCHYARD_PEERS=busbar`
    /// (or `agentgateway`) skips LiteLLM and Portkey.
    #[arg(long, value_name = "PATH")]
    pub peer_bin: Option<PathBuf>,
}

/// Why a benchmark could not run (a failed correctness check is `Ok(false)`).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot start {what}: {detail}")]
    Start { what: String, detail: String },
    #[error("{0}")]
    Io(String),
    #[error("mock control: {0}")]
    Mock(String),
}

impl BenchError {
    /// Exit code for `main` (0 pass, 1 failed check, 2 this).
    pub fn exit_code(&self) -> u8 {
        2
    }

    pub(crate) fn start(what: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        BenchError::Start {
            what: what.into(),
            detail: detail.to_string(),
        }
    }
}

/// One correctness check (never a timing target).
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub what: String,
    pub pass: bool,
    pub detail: String,
}

impl Check {
    pub fn new(what: impl Into<String>, pass: bool, detail: impl Into<String>) -> Self {
        Check {
            what: what.into(),
            pass,
            detail: detail.into(),
        }
    }
}

/// A target from the issue and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub target: String,
    /// `None` when the run cannot judge it (quick mode, no data).
    pub met: Option<bool>,
    pub detail: String,
}

/// What one scenario produced.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    pub name: String,
    pub seconds: f64,
    pub data: serde_json::Value,
    #[serde(skip)]
    pub markdown: String,
    pub checks: Vec<Check>,
    pub targets: Vec<Target>,
}

/// The machine and build a run happened on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub kernel: String,
    pub git_revision: String,
    pub profile: &'static str,
    pub pinning: &'static str,
    /// `/proc/loadavg` 1-minute load when the run started (other work on the machine).
    pub load_at_start: String,
    /// The share of CPU time the hypervisor gave to other guests during the
    /// run (`steal` in `/proc/stat`): on a shared VM, the numbers of a run
    /// with much of it are slow for reasons outside it.
    pub cpu_steal_pct: Option<f64>,
    /// `/proc/stat`'s (steal, total) at the start.
    #[serde(skip)]
    steal_at_start: Option<(u64, u64)>,
}

/// `/proc/stat`'s `cpu` line as (steal, total) jiffies.
fn cpu_steal() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    steal_of(stat.lines().find(|l| l.starts_with("cpu "))?)
}

/// (steal, total) of a `cpu` line: user nice system idle iowait irq softirq
/// steal (guest time is already inside user).
fn steal_of(line: &str) -> Option<(u64, u64)> {
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map_while(|x| x.parse().ok())
        .collect();
    Some((*v.get(7)?, v.iter().take(8).sum()))
}

impl Machine {
    pub fn detect() -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        let git_revision = std::process::Command::new("git")
            .args(["rev-parse", "--short", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "unknown".into());
        Machine {
            cpu_model,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel,
            git_revision,
            profile: if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            },
            pinning: "none: load generator, mocks and Switchyard share every core",
            load_at_start: std::fs::read_to_string("/proc/loadavg")
                .ok()
                .and_then(|s| s.split_whitespace().next().map(String::from))
                .unwrap_or_else(|| "unknown".into()),
            cpu_steal_pct: None,
            steal_at_start: cpu_steal(),
        }
    }

    /// Notes the CPU steal since [`Machine::detect`].
    pub fn finish(&mut self) {
        if let (Some((s0, t0)), Some((s1, t1))) = (self.steal_at_start, cpu_steal()) {
            if t1 > t0 {
                self.cpu_steal_pct = Some((s1 - s0) as f64 * 100.0 / (t1 - t0) as f64);
            }
        }
    }

    /// One line for the report.
    pub fn line(&self) -> String {
        format!(
            "{} cores, {}, Linux {}, git {}, {} build, CPU pinning {}; load average {} at start",
            self.cores,
            self.cpu_model,
            self.kernel,
            self.git_revision,
            self.profile,
            self.pinning,
            self.load_at_start
        ) + &self
            .cpu_steal_pct
            .map(|p| format!("; CPU steal {p:.0} % of the run (time the hypervisor gave these cores to other guests)"))
            .unwrap_or_default()
    }
}

/// Shared by every scenario of a run.
pub struct Ctx {
    /// The `switchyard` binary (this process).
    pub exe: PathBuf,
    pub quick: bool,
    pub out: PathBuf,
    /// Record perf profiles where a scenario offers them.
    pub perf: bool,
    /// A second build to compare with (`--baseline`).
    pub baseline: Option<PathBuf>,
    /// A Rust peer gateway for `peers` (`--peer-bin`).
    pub peer_bin: Option<PathBuf>,
    started: Instant,
}

impl Ctx {
    /// A progress line on stderr, stamped with the run's elapsed time.
    pub fn progress(&self, msg: impl AsRef<str>) {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(
            err,
            "[{:7.1}s] {}",
            self.started.elapsed().as_secs_f64(),
            msg.as_ref()
        );
    }

    /// A progress printer tasks can own.
    pub fn progress_printer(&self) -> impl Fn(String) + Send + Sync + 'static {
        let started = self.started;
        move |msg: String| {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "[{:7.1}s] {msg}", started.elapsed().as_secs_f64());
        }
    }

    /// Picks the quick or the full value.
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick {
            quick
        } else {
            full
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.out.join(name)
    }
}

/// Runs the scenarios, writes `bench.json` and `bench.md` under `--out`.
/// `Ok(false)` when a correctness check failed.
pub async fn run(args: BenchArgs) -> Result<bool, BenchError> {
    let names: Vec<&str> = if args.scenario == "all" {
        SCENARIOS.to_vec()
    } else {
        let n = SCENARIOS
            .iter()
            .chain(EXTRA_SCENARIOS)
            .find(|s| **s == args.scenario)
            .ok_or_else(|| {
                BenchError::Usage(format!(
                    "unknown scenario `{}` (one of: {}, all, {})",
                    args.scenario,
                    SCENARIOS.join(", "),
                    EXTRA_SCENARIOS.join(", ")
                ))
            })?;
        vec![*n]
    };
    std::fs::create_dir_all(&args.out)
        .map_err(|e| BenchError::Io(format!("cannot create {}: {e}", args.out.display())))?;
    let exe = std::env::current_exe()
        .map_err(|e| BenchError::Io(format!("cannot find the switchyard binary: {e}")))?;
    let ctx = Ctx {
        exe,
        quick: args.quick,
        out: args.out.clone(),
        perf: args.perf,
        baseline: args.baseline.clone(),
        peer_bin: args.peer_bin.clone(),
        started: Instant::now(),
    };
    let mut machine = Machine::detect();
    ctx.progress(format!(
        "switchyard bench --scenario {}{}: {}",
        args.scenario,
        if args.quick { " --quick" } else { "" },
        machine.line()
    ));
    let mut results = Vec::new();
    for name in names {
        ctx.progress(format!("== scenario {name}"));
        let t0 = Instant::now();
        let mut r = scenarios::run(name, &ctx).await?;
        r.seconds = t0.elapsed().as_secs_f64();
        for c in r.checks.iter().filter(|c| !c.pass) {
            ctx.progress(format!("   CHECK FAILED {}: {}", c.what, c.detail));
        }
        ctx.progress(format!("== scenario {name} done in {:.1} s", r.seconds));
        results.push(r);
        // Let sockets of the last scenario close before the next one starts.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    machine.finish();
    let passed = results.iter().all(|r| r.checks.iter().all(|c| c.pass));
    let command = format!(
        "switchyard bench --scenario {}{}{} --out {}",
        args.scenario,
        if args.quick { " --quick" } else { "" },
        args.peer_bin
            .as_ref()
            .map(|p| format!(" --peer-bin {}", p.display()))
            .unwrap_or_default(),
        args.out.display()
    );
    write_outputs(&args.out, &command, &machine, &results, passed)?;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{}", report::markdown(&command, &machine, &results));
    let _ = writeln!(
        stdout,
        "wrote {} and {}; correctness checks {}",
        args.out.join("bench.json").display(),
        args.out.join("bench.md").display(),
        if passed { "PASSED" } else { "FAILED" }
    );
    Ok(passed)
}

fn write_outputs(
    out: &Path,
    command: &str,
    machine: &Machine,
    results: &[ScenarioResult],
    passed: bool,
) -> Result<(), BenchError> {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let json = serde_json::json!({
        "command": command,
        "machine": machine,
        "finished_unix": unix,
        "correctness_passed": passed,
        "scenarios": results,
    });
    let text = serde_json::to_string_pretty(&json).map_err(|e| BenchError::Io(e.to_string()))?;
    let write = |name: &str, body: &str| {
        let p = out.join(name);
        std::fs::write(&p, body)
            .map_err(|e| BenchError::Io(format!("cannot write {}: {e}", p.display())))
    };
    write("bench.json", &text)?;
    write("bench.md", &report::markdown(command, machine, results))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use clap::{Args, FromArgMatches};

    #[test]
    fn steal_is_the_eighth_counter_of_the_cpu_line() {
        let line = "cpu  1691713 337053 148064 743381 5199 0 14711 42360 0 0";
        let total = 1691713 + 337053 + 148064 + 743381 + 5199 + 14711 + 42360;
        assert_eq!(steal_of(line), Some((42360, total)));
        assert_eq!(steal_of("cpu  1 2 3"), None);
    }

    #[test]
    fn bench_arguments_parse() {
        let cmd = BenchArgs::augment_args(clap::Command::new("bench"));
        cmd.clone().debug_assert();
        let m = cmd
            .try_get_matches_from(["bench", "--scenario", "overhead", "--quick"])
            .unwrap();
        let a = BenchArgs::from_arg_matches(&m).unwrap();
        assert!(a.quick);
        assert_eq!(a.scenario, "overhead");
        assert_eq!(a.out, PathBuf::from("bench-results"));
        assert!(a.peer_bin.is_none());
        let m = BenchArgs::augment_args(clap::Command::new("bench"))
            .try_get_matches_from(["bench", "--scenario", "peers", "--peer-bin", "/x/agw"])
            .unwrap();
        let a = BenchArgs::from_arg_matches(&m).unwrap();
        assert_eq!(a.peer_bin, Some(PathBuf::from("/x/agw")));
    }

    #[test]
    fn bench_machine_is_described() {
        let m = Machine::detect();
        assert!(m.cores >= 1);
        assert!(m.line().contains("cores"));
    }
}
