//! Scenario 1, overhead: one instantly answering mock; the same open-loop
//! load (fixed rates) sent straight to the mock and through Switchyard, for
//! four modes (gRPC and the OpenAI HTTP door, streamed and unary), plus a
//! closed-loop run for the highest sustained rate. Reports latency and TTFT
//! percentiles of both paths and the difference, throughput, Switchyard's
//! CPU microseconds and heap allocations per request, peak RSS and, with
//! `--perf`, the functions that take the most of Switchyard's CPU.
//!
//! For profiling work, `SWITCHYARD_OVERHEAD_MODES` (e.g. `grpc-unary,http-stream`)
//! and `SWITCHYARD_OVERHEAD_RATES` (e.g. `3000`) narrow a run;
//! `SWITCHYARD_OVERHEAD_UPSTREAM=h2c` (this build) and
//! `SWITCHYARD_OVERHEAD_BASELINE_UPSTREAM=h2c` (the baseline) reach the mock
//! over HTTP/2 with prior knowledge instead of HTTP/1.1;
//! `SWITCHYARD_OVERHEAD_WORKER_THREADS=N` sets this build's
//! `server.worker_threads` (the baseline keeps its default);
//! `SWITCHYARD_OVERHEAD_STREAM_UNARY=false` (this build) and
//! `SWITCHYARD_OVERHEAD_BASELINE_STREAM_UNARY=false` (the baseline) give
//! the provider `stream_unary = false`; `SWITCHYARD_OVERHEAD_PROMPT_BYTES=N`
//! sends every request (direct and through Switchyard) with a system prompt
//! of about N bytes, the size of an agent's context, instead of one word.

use std::time::Duration;

use serde_json::json;

use super::{check_complete, check_errors, errors_json, result, upstream_text, with_upstream_keys};
use crate::clients::{grpc_call, http_client, openai_ask, Ask, Call, Grpc, Prompt};
use crate::load::{closed_loop, open_loop, Dist, Run};
use crate::procs::{
    config_text, self_usage, with_http_door, Counters, MockProc, MockSpec, Provider, RouterProc,
};
use crate::report::{delta, ms, Table};
use crate::{BenchError, Ctx, ScenarioResult, Target};

const TIMEOUT: Duration = Duration::from_secs(10);
/// How each build reaches the mock ([`with_upstream_keys`]).
const UPSTREAM: &str = "SWITCHYARD_OVERHEAD_UPSTREAM";
const STREAM_UNARY: &str = "SWITCHYARD_OVERHEAD_STREAM_UNARY";
const BASELINE_UPSTREAM: &str = "SWITCHYARD_OVERHEAD_BASELINE_UPSTREAM";
const BASELINE_STREAM_UNARY: &str = "SWITCHYARD_OVERHEAD_BASELINE_STREAM_UNARY";
/// The rate of the targets.
const TARGET_RATE: f64 = 3000.0;
/// Switchyard CPU per request at that rate, at most.
const TARGET_CPU_US: f64 = 65.0;
/// Added p99 latency at that rate, at most.
const TARGET_ADDED_P99_MS: f64 = 1.0;
/// The lower rate of the targets, and its added p99 at most.
const LOW_RATE: f64 = 1000.0;
const LOW_RATE_ADDED_P99_MS: f64 = 0.15;
/// Closed-loop throughput through Switchyard against direct, at least.
const TARGET_CLOSED_RATIO: f64 = 0.5;

#[derive(Clone, Copy, PartialEq)]
enum Load {
    Rate(f64),
    Closed(usize),
}

/// How the load generator reaches Switchyard.
#[derive(Clone, Copy, PartialEq)]
enum Door {
    Grpc,
    Http,
}

#[derive(Clone, Copy, PartialEq)]
struct Mode {
    door: Door,
    stream: bool,
}

impl Mode {
    const ALL: [Mode; 4] = [
        Mode {
            door: Door::Grpc,
            stream: true,
        },
        Mode {
            door: Door::Grpc,
            stream: false,
        },
        Mode {
            door: Door::Http,
            stream: true,
        },
        Mode {
            door: Door::Http,
            stream: false,
        },
    ];

    fn name(self) -> &'static str {
        match (self.door, self.stream) {
            (Door::Grpc, true) => "grpc-stream",
            (Door::Grpc, false) => "grpc-unary",
            (Door::Http, true) => "http-stream",
            (Door::Http, false) => "http-unary",
        }
    }
}

/// One Switchyard build under test.
struct Via {
    /// `this build` or `baseline`.
    build: &'static str,
    router: RouterProc,
    grpc: Grpc,
    /// Its OpenAI door.
    door: String,
}

impl Via {
    async fn start(
        ctx: &Ctx,
        build: &'static str,
        exe: &std::path::Path,
        cfg: &str,
    ) -> Result<Via, BenchError> {
        let tag = if build == "baseline" {
            "overhead-baseline"
        } else {
            "overhead"
        };
        let router = RouterProc::start_exe(ctx, exe, tag, cfg).await?;
        let grpc = Grpc::connect(router.grpc, 4).await?;
        let door = router
            .http
            .map(|a| format!("http://{a}/v1"))
            .ok_or_else(|| BenchError::start("switchyard", "no http= in its banner"))?;
        Ok(Via {
            build,
            router,
            grpc,
            door,
        })
    }
}

struct Env {
    mock: MockProc,
    http: reqwest::Client,
    /// The baseline (with `--baseline`) first, then this build.
    builds: Vec<Via>,
}

/// Drives `load` straight to the mock (`via` None) or through a build.
async fn drive(
    ctx: &Ctx,
    env: &Env,
    via: Option<&Via>,
    mode: Mode,
    load: Load,
    d: Duration,
) -> Run {
    let label = format!(
        "{} {} {}",
        mode.name(),
        match load {
            Load::Rate(r) => format!("{r:.0}/s"),
            Load::Closed(n) => format!("closed loop x{n}"),
        },
        via.map_or("direct".to_string(), |v| format!(
            "via switchyard ({})",
            v.build
        ))
    );
    let base = env.mock.base_url();
    let target = via.map(|v| (v.grpc.clone(), v.door.clone()));
    let http = env.http.clone();
    let stream = mode.stream;
    let prompt = prompt();
    let call = Call::new("chat", stream, TIMEOUT).prompt(prompt.clone());
    let f = move |i: u64, t0: tokio::time::Instant| {
        let (http, base, target, call, prompt) = (
            http.clone(),
            base.clone(),
            target.clone(),
            call.clone(),
            prompt.clone(),
        );
        async move {
            let ask = |model| Ask {
                model,
                prompt: &prompt,
                stream,
                max_tokens: 1000,
                include_usage: false,
            };
            match (target, mode.door) {
                (Some((grpc, _)), Door::Grpc) => grpc_call(grpc.client(i), &call, t0).await,
                (Some((_, door)), Door::Http) => {
                    openai_ask(&http, &door, &ask("chat"), t0, TIMEOUT).await
                }
                (None, _) => openai_ask(&http, &base, &ask("m"), t0, TIMEOUT).await,
            }
        }
    };
    match load {
        Load::Rate(r) => open_loop(ctx, label, r, d, 5_000, f).await,
        Load::Closed(n) => closed_loop(ctx, label, n, d, Duration::ZERO, f).await,
    }
}

fn load_text(load: &Load) -> String {
    match load {
        Load::Rate(r) => format!("{r:.0}/s"),
        Load::Closed(n) => format!("max: closed loop, {n} callers"),
    }
}

/// The prompt every request sends: one word, or with
/// `SWITCHYARD_OVERHEAD_PROMPT_BYTES` a system prompt of about that many
/// bytes (a sentence repeated) before it.
fn prompt() -> Prompt {
    let bytes = std::env::var("SWITCHYARD_OVERHEAD_PROMPT_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|n| *n > 0);
    let Some(bytes) = bytes else {
        return Prompt::default();
    };
    const SENTENCE: &str =
        "The quick brown fox jumps over the lazy dog while the router keeps every promise. ";
    let system = SENTENCE.repeat(bytes.div_ceil(SENTENCE.len()));
    Prompt {
        system: Some(system.into()),
        ..Prompt::default()
    }
}

/// This build's `server.worker_threads`, when set for the run.
fn worker_threads() -> Option<usize> {
    std::env::var("SWITCHYARD_OVERHEAD_WORKER_THREADS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

/// A comma-separated override from the environment, for profiling work.
fn narrowed<T: Copy>(var: &str, all: Vec<T>, parse: impl Fn(&str) -> Option<T>) -> Vec<T> {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v.split(',').filter_map(|s| parse(s.trim())).collect(),
        _ => all,
    }
}

/// One side (direct or through Switchyard) of a row, as JSON.
fn side(run: &Run) -> serde_json::Value {
    json!({
        "scheduled": run.scheduled,
        "ok": run.ok(),
        "failed": run.failed(),
        "skipped": run.skipped,
        "unfinished": run.unfinished,
        "throughput_rps": run.throughput(),
        "latency_ms": run.latency(),
        "ttft_ms": run.ttft(),
        "errors": errors_json(&run.outcomes),
    })
}

/// The target on the added p99 at one rate.
fn added_p99(
    name: &str,
    rate: &str,
    most_ms: f64,
    direct: &Dist,
    via: &Dist,
    achieved: bool,
    rps: f64,
) -> Target {
    let added = via.p99 - direct.p99;
    Target {
        target: format!("{name}: p99 added latency at most +{most_ms} ms at {rate}"),
        met: Some(added <= most_ms && achieved),
        detail: format!(
            "added p99 {} ms (direct p99 {} ms, via {} ms), achieved {rps:.0} rps",
            delta(added),
            ms(direct.p99),
            ms(via.p99),
        ),
    }
}

/// What one via-Switchyard run cost Switchyard, per request.
#[derive(Clone, Copy, Default)]
struct Cost {
    cpu_us: f64,
    /// Actor messages per request: calls (a reply awaited), casts, and
    /// provider permits taken through the gate (no message).
    actor: Option<(f64, f64, f64)>,
    allocations: Option<f64>,
    alloc_bytes: Option<f64>,
    /// Times Switchyard's threads were switched out, per request: each is
    /// a thread that slept for want of work and was woken for the next.
    switches: f64,
}

impl Cost {
    fn of(cpu_s: f64, allocs: Option<((u64, u64), (u64, u64))>, ok: usize) -> Cost {
        if ok == 0 {
            return Cost::default();
        }
        let n = ok as f64;
        let per = |f: fn(&(u64, u64)) -> u64| {
            allocs.map(|(a, b)| (f(&b).saturating_sub(f(&a))) as f64 / n)
        };
        Cost {
            cpu_us: cpu_s * 1e6 / n,
            actor: None,
            allocations: per(|c| c.0),
            alloc_bytes: per(|c| c.1),
            switches: 0.0,
        }
    }

    /// Actor messages per request between two readings (builds that do
    /// not count them show none).
    fn actor_messages(&mut self, before: &Counters, after: &Counters, ok: usize) {
        let per = |f: fn(&Counters) -> Option<u64>| {
            let (a, b) = (f(before)?, f(after)?);
            Some(b.saturating_sub(a) as f64 / ok.max(1) as f64)
        };
        let calls = per(|c| c.actor_calls);
        let casts = per(|c| c.actor_casts);
        let gate = per(|c| c.gate_permits);
        self.actor = match (calls, casts, gate) {
            (None, None, None) => None,
            (a, b, c) => Some((a.unwrap_or(0.0), b.unwrap_or(0.0), c.unwrap_or(0.0))),
        };
    }

    fn actor_text(&self) -> String {
        match self.actor {
            Some((calls, casts, gate)) => format!("{calls:.2} / {casts:.2} / {gate:.2}"),
            None => "-".into(),
        }
    }

    fn allocations_text(&self) -> String {
        match (self.allocations, self.alloc_bytes) {
            (Some(n), Some(b)) => format!("{n:.0} / {:.1} KB", b / 1024.0),
            _ => "-".into(),
        }
    }
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("overhead");
    let mock = MockProc::start(ctx, "overhead", &MockSpec::new("openai", 16, 0)).await?;
    let cfg = |proto_var: &str, unary_var: &str| {
        let primary = Provider::new("primary", "openai", &mock).caps(100_000, 100_000);
        let primary = with_upstream_keys(primary, proto_var, unary_var);
        with_http_door(config_text("", &[primary], &[("chat", &["primary"])]))
    };
    let mut builds = Vec::new();
    if let Some(exe) = &ctx.baseline {
        let baseline = cfg(BASELINE_UPSTREAM, BASELINE_STREAM_UNARY);
        builds.push(Via::start(ctx, "baseline", exe, &baseline).await?);
    }
    let mut this = cfg(UPSTREAM, STREAM_UNARY);
    if let Some(n) = worker_threads() {
        this = this.replacen(
            "[server]\n",
            &format!("[server]\nworker_threads = {n}\n"),
            1,
        );
    }
    builds.push(Via::start(ctx, "this build", &ctx.exe, &this).await?);
    let env = Env {
        mock,
        http: http_client()?,
        builds,
    };
    let rates = narrowed(
        "SWITCHYARD_OVERHEAD_RATES",
        ctx.pick(vec![200.0], vec![LOW_RATE, TARGET_RATE]),
        |s| s.parse().ok(),
    );
    let modes = narrowed("SWITCHYARD_OVERHEAD_MODES", Mode::ALL.to_vec(), |s| {
        Mode::ALL.into_iter().find(|m| m.name() == s)
    });
    let d = ctx.pick(Duration::from_secs(2), Duration::from_secs(6));
    let closed = ctx.pick(16, 64);
    let closed_d = ctx.pick(Duration::from_secs(1), Duration::from_secs(5));
    let mut loads: Vec<(Load, Duration)> = rates.iter().map(|r| (Load::Rate(*r), d)).collect();
    loads.push((Load::Closed(closed), closed_d));

    // Warm up connections and allocators on every path (not recorded).
    for mode in &modes {
        let warm = Load::Rate(200.0);
        drive(ctx, &env, None, *mode, warm, Duration::from_millis(500)).await;
        for via in &env.builds {
            drive(
                ctx,
                &env,
                Some(via),
                *mode,
                warm,
                Duration::from_millis(500),
            )
            .await;
        }
    }

    let mut rows = Vec::new();
    let mut profiles = Vec::new();
    let mut lat = Table::new(&[
        "mode",
        "load",
        "build",
        "achieved rps (direct / via)",
        "direct p50 / p99 / max ms",
        "via Switchyard p50 / p99 / max ms",
        "added p50 / p99 ms",
        "errors",
        "Switchyard CPU µs / req",
        "allocations / req (count / bytes)",
        "actor calls / casts / gate permits per req",
        "thread switches / req",
        "Switchyard peak RSS MB",
        "cores busy via: load gen / mock / Switchyard",
    ]);
    let mut ttft = Table::new(&[
        "mode",
        "load",
        "build",
        "direct TTFT p50 / p99 / max ms",
        "via Switchyard TTFT p50 / p99 / max ms",
        "added TTFT p50 / p99 ms",
    ]);
    for mode in &modes {
        let mode = *mode;
        let name = mode.name();
        for (load, d) in &loads {
            env.mock.clear().await?;
            let direct = drive(ctx, &env, None, mode, *load, *d).await;
            let label = format!("{name} {} direct", load_text(load));
            res.checks.push(check_complete(&label, &direct));
            res.checks.push(check_errors(&label, &direct.outcomes, &[]));
            for b in &env.builds {
                let this = b.build == "this build";
                let router = &b.router;
                env.mock.clear().await?;
                let peak_reset = router.reset_peak();
                let a0 = router.counters(&env.http).await.unwrap_or_default();
                let u0 = router.usage();
                let (g0, m0) = (self_usage(), env.mock.usage());
                let via = drive(ctx, &env, Some(b), mode, *load, *d).await;
                let u1 = router.usage();
                let (g1, m1) = (self_usage(), env.mock.usage());
                let a1 = router.counters(&env.http).await.unwrap_or_default();
                let mut cost = Cost::of(
                    u1.cpu_s - u0.cpu_s,
                    a0.allocations.zip(a1.allocations),
                    via.ok(),
                );
                cost.actor_messages(&a0, &a1, via.ok());
                cost.switches =
                    u1.switches.saturating_sub(u0.switches) as f64 / via.ok().max(1) as f64;
                // The profile gets a run of its own, so perf never skews the numbers.
                if this && ctx.perf && *load == Load::Rate(TARGET_RATE) {
                    let file = ctx.path(&format!("perf-overhead-{name}.data"));
                    ctx.progress("   extra run under perf record");
                    let (_, r) = tokio::join!(
                        drive(ctx, &env, Some(b), mode, *load, *d),
                        router.perf_record(&file, *d)
                    );
                    let summary = match r {
                        Ok(()) => perf_summary(&file).await,
                        Err(e) => Err(e),
                    };
                    match &summary {
                        Ok(_) => ctx.progress(format!("   perf profile: {}", file.display())),
                        Err(e) => ctx.progress(format!("   perf profile failed: {e}")),
                    }
                    profiles.push((name, file, summary));
                }
                let secs = via.elapsed_s.max(0.001);
                let busy = [
                    (g1.cpu_s - g0.cpu_s) / secs,
                    (m1.cpu_s - m0.cpu_s) / secs,
                    (u1.cpu_s - u0.cpu_s) / secs,
                ];
                let peak_mb = u1.hwm_kb as f64 / 1024.0;
                let (dl, vl) = (direct.latency(), via.latency());
                let (dt, vt) = (direct.ttft(), via.ttft());
                let load_s = load_text(load);
                let sustained = |r: &Run| match load {
                    Load::Rate(_) if r.skipped > 0 => format!(
                        " (not sustained: {} of {} not sent, in-flight cap)",
                        r.skipped, r.scheduled
                    ),
                    Load::Rate(rate) if r.throughput() < 0.95 * rate => " (not sustained)".into(),
                    _ => String::new(),
                };
                let l = format!("{name} {load_s} via ({})", b.build);
                res.checks.push(check_complete(&l, &via));
                res.checks.push(check_errors(&l, &via.outcomes, &[]));
                lat.row(vec![
                    name.into(),
                    load_s.clone(),
                    b.build.into(),
                    format!(
                        "{:.0}{} / {:.0}{}",
                        direct.throughput(),
                        sustained(&direct),
                        via.throughput(),
                        sustained(&via)
                    ),
                    format!("{} / {} / {}", ms(dl.p50), ms(dl.p99), ms(dl.max)),
                    format!("{} / {} / {}", ms(vl.p50), ms(vl.p99), ms(vl.max)),
                    format!("{} / {}", delta(vl.p50 - dl.p50), delta(vl.p99 - dl.p99)),
                    format!("{} / {}", direct.failed(), via.failed()),
                    format!("{:.0}", cost.cpu_us),
                    cost.allocations_text(),
                    cost.actor_text(),
                    format!("{:.2}", cost.switches),
                    format!("{peak_mb:.1}"),
                    format!("{:.2} / {:.2} / {:.2}", busy[0], busy[1], busy[2]),
                ]);
                if mode.stream {
                    ttft.row(vec![
                        name.into(),
                        load_s.clone(),
                        b.build.into(),
                        format!("{} / {} / {}", ms(dt.p50), ms(dt.p99), ms(dt.max)),
                        format!("{} / {} / {}", ms(vt.p50), ms(vt.p99), ms(vt.max)),
                        format!("{} / {}", delta(vt.p50 - dt.p50), delta(vt.p99 - dt.p99)),
                    ]);
                }
                let closed_ratio = via.throughput() / direct.throughput().max(1.0);
                match load {
                    _ if !this => {}
                    Load::Rate(r) if *r == TARGET_RATE => {
                        let achieved = via.throughput() >= 0.95 * TARGET_RATE;
                        res.targets.push(Target {
                        target: format!(
                            "{name}: Switchyard CPU at most {TARGET_CPU_US:.0} µs per request at 3,000/s"
                        ),
                        met: Some(cost.cpu_us <= TARGET_CPU_US && achieved),
                        detail: format!(
                            "{:.0} µs per request, {} allocations per request, achieved {:.0} rps",
                            cost.cpu_us,
                            cost.allocations_text(),
                            via.throughput()
                        ),
                    });
                        res.targets.push(added_p99(
                            name,
                            "3,000/s",
                            TARGET_ADDED_P99_MS,
                            &dl,
                            &vl,
                            achieved,
                            via.throughput(),
                        ));
                    }
                    Load::Rate(r) if *r == LOW_RATE => {
                        let achieved = via.throughput() >= 0.95 * LOW_RATE;
                        res.targets.push(added_p99(
                            name,
                            "1,000/s",
                            LOW_RATE_ADDED_P99_MS,
                            &dl,
                            &vl,
                            achieved,
                            via.throughput(),
                        ));
                    }
                    Load::Closed(_) => {
                        let ratio = closed_ratio;
                        res.targets.push(Target {
                            target: format!(
                            "{name}: closed-loop maximum at least {TARGET_CLOSED_RATIO}x direct"
                        ),
                            met: Some(ratio >= TARGET_CLOSED_RATIO),
                            detail: format!(
                                "{ratio:.2}x ({:.0} via / {:.0} direct requests/s)",
                                via.throughput(),
                                direct.throughput()
                            ),
                        });
                    }
                    _ => {}
                }
                rows.push(json!({
                "mode": name,
                "load": load_s,
                "build": b.build,
                "direct": side(&direct),
                "switchyard": side(&via),
                "added_ms": {
                    "latency_p50": vl.p50 - dl.p50, "latency_p99": vl.p99 - dl.p99,
                    "latency_max": vl.max - dl.max,
                    "ttft_p50": vt.p50 - dt.p50, "ttft_p99": vt.p99 - dt.p99,
                },
                "switchyard_cpu_us_per_request": cost.cpu_us,
                "switchyard_allocations_per_request": cost.allocations,
                "switchyard_allocated_bytes_per_request": cost.alloc_bytes,
                "actor_messages_per_request": cost.actor.map(|(calls, casts, gate)| json!({
                    "calls": calls, "casts": casts, "gate_permits": gate,
                })),
                "switchyard_thread_switches_per_request": cost.switches,
                "switchyard_cpu_s": u1.cpu_s - u0.cpu_s,
                "switchyard_peak_rss_mb": peak_mb,
                "peak_rss_since": if peak_reset { "run" } else { "process start" },
                "cores_busy_via": {"load_generator": busy[0], "mock": busy[1], "switchyard": busy[2]},
                "closed_loop_ratio": matches!(load, Load::Closed(_)).then_some(closed_ratio),
            }));
                ctx.progress(format!(
                "   {name} {load_s} ({}): added p50 {} p99 {} ms, {:.0} rps via, {:.0} µs CPU and {} allocations per request",
                b.build,
                delta(vl.p50 - dl.p50),
                delta(vl.p99 - dl.p99),
                via.throughput(),
                cost.cpu_us,
                cost.allocations_text()
            ));
            }
        }
    }
    if !rates.contains(&TARGET_RATE) {
        res.targets.push(Target {
            target: "CPU and p99 added latency at 3,000 requests per second".into(),
            met: None,
            detail: "this run did not include 3,000/s".into(),
        });
    }
    let mut profile_md = String::new();
    let mut profile_json = Vec::new();
    for (name, file, summary) in &profiles {
        match summary {
            Ok(p) => {
                let mut t = Table::new(&["share of Switchyard's CPU samples", "function"]);
                for (share, sym) in &p.top {
                    t.row(vec![format!("{share:.1} %"), format!("`{sym}`")]);
                }
                let split: Vec<String> = p
                    .dsos
                    .iter()
                    .map(|(s, d)| format!("{d} {s:.0} %"))
                    .collect();
                profile_md.push_str(&format!(
                    "\nProfile, {name} at 3,000/s (perf, {}): {}.\n\n{}",
                    file.display(),
                    split.join(", "),
                    t.render()
                ));
                let shares = |v: &[(f64, String)], key: &str| {
                    v.iter()
                        .map(|(s, f)| json!({"share_pct": s, key: f}))
                        .collect::<Vec<_>>()
                };
                profile_json.push(json!({"mode": name, "file": file.display().to_string(),
                    "binaries": shares(&p.dsos, "binary"), "top": shares(&p.top, "function")}));
            }
            Err(e) => profile_json.push(json!({"mode": name, "error": e})),
        }
    }
    res.markdown = format!(
        "Mock answers at once (16 tokens, no delay); every request's prompt: {}. Open loop on a schedule: latency counts from \
         the scheduled send, so queueing shows. Direct = reqwest to the mock's OpenAI endpoint; \
         via = gRPC to Switchyard (4 HTTP/2 connections) or reqwest to its OpenAI door, which \
         calls the same mock over {} (the baseline over {}); this build's runtime threads: {}; with `--baseline`, a second build runs each row right after this one. CPU and allocations per request are Switchyard's own (from /proc \
         and its counting allocator); actor messages per request are its \
         `switchyard_actor_calls_total` (calls await a reply, casts do not, gate permits are \
         provider permits taken with no message; `-` for a build that does not count them); \
         thread switches per request are the context switches of Switchyard's threads (`/proc/PID/task/*/status`, \
         voluntary and not), mostly a worker that slept for want of work and was woken. Load generator, mock and Switchyard share the machine's \
         cores.\n\n{}\nTime to first token (streaming):\n\n{}{profile_md}",
        prompt()
            .system
            .map_or("one word".to_string(), |s| format!("a {}-byte system prompt and one word", s.len())),
        upstream_text(UPSTREAM, STREAM_UNARY),
        upstream_text(BASELINE_UPSTREAM, BASELINE_STREAM_UNARY),
        worker_threads().map_or("one per core (default)".to_string(), |n| n.to_string()),
        lat.render(),
        ttft.render()
    );
    let prompt_bytes = prompt().system.map_or(0, |s| s.len());
    res.data = json!({ "rows": rows, "duration_s": d.as_secs_f64(), "profiles": profile_json, "system_prompt_bytes": prompt_bytes });
    for b in env.builds {
        b.router.stop().await;
    }
    env.mock.stop().await;
    Ok(res)
}

/// A flat `perf` profile summed up: the share of each binary (Switchyard's
/// own code, the kernel, libc) and the functions with the largest shares.
struct Profile {
    dsos: Vec<(f64, String)>,
    top: Vec<(f64, String)>,
}

async fn perf_report(file: &std::path::Path, sort: &str) -> Result<String, String> {
    let out = tokio::process::Command::new("perf")
        .args([
            "report",
            "--stdio",
            "--no-children",
            "--sort",
            sort,
            "-g",
            "none",
            "-i",
        ])
        .arg(file)
        .output()
        .await
        .map_err(|e| format!("perf report: {e}"))?;
    if !out.status.success() {
        return Err(format!("perf report exited with {}", out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn perf_summary(file: &std::path::Path) -> Result<Profile, String> {
    let dsos = perf_report(file, "dso").await?;
    let syms = perf_report(file, "dso,sym").await?;
    Ok(Profile {
        dsos: dso_shares(&dsos, 4),
        top: top_functions(&syms, 15),
    })
}

/// `(share %, dso)` of the first `n` lines of a `perf report --sort dso` text.
fn dso_shares(text: &str, n: usize) -> Vec<(f64, String)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let share: f64 = it.next()?.strip_suffix('%')?.parse().ok()?;
            Some((share, it.next()?.to_string()))
        })
        .take(n)
        .collect()
}

/// `(share %, "dso: function")` of the first `n` sample lines of a
/// `perf report --sort dso,sym` text.
fn top_functions(text: &str, n: usize) -> Vec<(f64, String)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let share: f64 = it.next()?.strip_suffix('%')?.parse().ok()?;
            let dso = it.next()?;
            let rest: Vec<&str> = it.skip(1).collect();
            let sym = rest.join(" ");
            let sym: String = sym.chars().take(110).collect();
            Some((share, format!("{dso}: {sym}")))
        })
        .take(n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_functions_reads_perf_report_lines() {
        let text = "# Samples: 2K\n#\n    11.41%  libc.so.6   [.] _int_malloc\n     6.75%  [kernel.kallsyms]  [k] finish_task_switch.isra.0\n\n";
        assert_eq!(
            top_functions(text, 5),
            vec![
                (11.41, "libc.so.6: _int_malloc".to_string()),
                (
                    6.75,
                    "[kernel.kallsyms]: finish_task_switch.isra.0".to_string()
                )
            ]
        );
        assert_eq!(top_functions(text, 1).len(), 1);
        let dsos = "# Overhead\n    58.94%  switchyard       \n    23.81%  [kernel.kallsyms]\n";
        assert_eq!(
            dso_shares(dsos, 5),
            vec![
                (58.94, "switchyard".to_string()),
                (23.81, "[kernel.kallsyms]".to_string())
            ]
        );
    }

    #[test]
    fn costs_are_per_ok_request() {
        let c = Cost::of(0.5, Some(((10, 1000), (1010, 3000))), 1000);
        assert_eq!(c.cpu_us, 500.0);
        assert_eq!(c.allocations, Some(1.0));
        assert_eq!(c.alloc_bytes, Some(2.0));
        assert_eq!(Cost::of(0.5, None, 0).cpu_us, 0.0);
        assert_eq!(Cost::of(0.5, None, 10).allocations_text(), "-");
    }
}
