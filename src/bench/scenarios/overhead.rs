//! Scenario 1, overhead: one instantly answering mock; the same open-loop
//! load (fixed rates, streaming and unary) sent straight to the mock and
//! through Switchyard, plus a closed-loop run for the highest sustained rate.
//! Reports latency and TTFT percentiles of both paths, the difference,
//! throughput, Switchyard's CPU seconds per 1,000 requests and peak RSS.

use std::time::Duration;

use serde_json::json;

use super::{check_complete, check_errors, errors_json, result};
use crate::bench::clients::{grpc_call, http_client, openai_call, Call, Grpc};
use crate::bench::load::{closed_loop, open_loop, Run};
use crate::bench::procs::{config_text, self_usage, MockProc, MockSpec, Provider, RouterProc};
use crate::bench::report::{delta, ms, Table};
use crate::bench::{BenchError, Ctx, ScenarioResult, Target};

const TIMEOUT: Duration = Duration::from_secs(10);
/// The rate of the target.
const TARGET_RATE: f64 = 2000.0;

#[derive(Clone, Copy, PartialEq)]
enum Load {
    Rate(f64),
    Closed(usize),
}

struct Env {
    mock: MockProc,
    router: RouterProc,
    grpc: Grpc,
    http: reqwest::Client,
}

async fn drive(ctx: &Ctx, env: &Env, via: bool, stream: bool, load: Load, d: Duration) -> Run {
    let label = format!(
        "{} {} {}",
        if stream { "stream" } else { "unary" },
        match load {
            Load::Rate(r) => format!("{r:.0}/s"),
            Load::Closed(n) => format!("closed loop x{n}"),
        },
        if via { "via switchyard" } else { "direct" }
    );
    let base = env.mock.base_url();
    let http = env.http.clone();
    let grpc = env.grpc.clone();
    let call = Call::new("chat", stream, TIMEOUT);
    let f = move |i: u64, t0: tokio::time::Instant| {
        let (http, base, grpc, call) = (http.clone(), base.clone(), grpc.clone(), call.clone());
        async move {
            if via {
                grpc_call(grpc.client(i), &call, t0).await
            } else {
                openai_call(&http, &base, stream, 1000, t0, TIMEOUT).await
            }
        }
    };
    match load {
        Load::Rate(r) => open_loop(ctx, label, r, d, 5_000, f).await,
        Load::Closed(n) => closed_loop(ctx, label, n, d, Duration::ZERO, f).await,
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

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("overhead");
    let mock = MockProc::start(ctx, "overhead", &MockSpec::new("openai", 16, 0)).await?;
    let cfg = config_text(
        "",
        &[Provider::new("primary", "openai", &mock).caps(100_000, 100_000)],
        &[("chat", &["primary"])],
    );
    let router = RouterProc::start(ctx, "overhead", &cfg).await?;
    let grpc = Grpc::connect(router.grpc, 4).await?;
    let env = Env {
        mock,
        router,
        grpc,
        http: http_client()?,
    };
    let rates: Vec<f64> = ctx.pick(vec![200.0], vec![500.0, 2000.0, 5000.0]);
    let d = ctx.pick(Duration::from_secs(2), Duration::from_secs(6));
    let closed = ctx.pick(16, 64);
    let closed_d = ctx.pick(Duration::from_secs(1), Duration::from_secs(5));
    let mut loads: Vec<(Load, Duration)> = rates.iter().map(|r| (Load::Rate(*r), d)).collect();
    loads.push((Load::Closed(closed), closed_d));

    // Warm up connections and allocators on both paths (not recorded).
    for stream in [true, false] {
        for via in [false, true] {
            drive(
                ctx,
                &env,
                via,
                stream,
                Load::Rate(200.0),
                Duration::from_millis(500),
            )
            .await;
        }
    }

    let mut rows = Vec::new();
    let mut lat = Table::new(&[
        "mode",
        "load",
        "achieved rps (direct / via)",
        "direct p50 / p99 / max ms",
        "via Switchyard p50 / p99 / max ms",
        "added p50 / p99 ms",
        "errors",
        "Switchyard CPU s / 1k req",
        "Switchyard peak RSS MB",
        "cores busy via: load gen / mock / Switchyard",
    ]);
    let mut ttft = Table::new(&[
        "load",
        "direct TTFT p50 / p99 / max ms",
        "via Switchyard TTFT p50 / p99 / max ms",
        "added TTFT p50 / p99 ms",
    ]);
    for stream in [true, false] {
        let mode = if stream { "stream" } else { "unary" };
        for (load, d) in &loads {
            env.mock.clear().await?;
            let direct = drive(ctx, &env, false, stream, *load, *d).await;
            env.mock.clear().await?;
            let peak_reset = env.router.reset_peak();
            let u0 = env.router.usage();
            let (g0, m0) = (self_usage(), env.mock.usage());
            let via = drive(ctx, &env, true, stream, *load, *d).await;
            let u1 = env.router.usage();
            let (g1, m1) = (self_usage(), env.mock.usage());
            // The profile gets a run of its own, so perf never skews the numbers.
            let perf_file = ctx.path(&format!("perf-overhead-{mode}.data"));
            let perf = if ctx.perf && *load == Load::Rate(TARGET_RATE) {
                ctx.progress("   extra run under perf record");
                let (_, r) = tokio::join!(
                    drive(ctx, &env, true, stream, *load, *d),
                    env.router.perf_record(&perf_file, *d)
                );
                Some(r)
            } else {
                None
            };
            let secs = via.elapsed_s.max(0.001);
            let busy = [
                (g1.cpu_s - g0.cpu_s) / secs,
                (m1.cpu_s - m0.cpu_s) / secs,
                (u1.cpu_s - u0.cpu_s) / secs,
            ];
            match &perf {
                Some(Ok(())) => ctx.progress(format!("   perf profile: {}", perf_file.display())),
                Some(Err(e)) => ctx.progress(format!("   perf profile failed: {e}")),
                None => {}
            }
            let cpu_per_1k = if via.ok() > 0 {
                (u1.cpu_s - u0.cpu_s) / (via.ok() as f64 / 1000.0)
            } else {
                0.0
            };
            let peak_mb = u1.hwm_kb as f64 / 1024.0;
            let (dl, vl) = (direct.latency(), via.latency());
            let (dt, vt) = (direct.ttft(), via.ttft());
            let load_s = match load {
                Load::Rate(r) => format!("{r:.0}/s"),
                Load::Closed(n) => format!("max: closed loop, {n} callers"),
            };
            let sustained = |r: &Run| match load {
                Load::Rate(rate) if r.throughput() < 0.95 * rate || r.skipped > 0 => format!(
                    " (not sustained: {} of {} not sent, in-flight cap)",
                    r.skipped, r.scheduled
                ),
                _ => String::new(),
            };
            for (label, run) in [("direct", &direct), ("via", &via)] {
                let l = format!("{mode} {load_s} {label}");
                res.checks.push(check_complete(&l, run));
                res.checks.push(check_errors(&l, &run.outcomes, &[]));
            }
            lat.row(vec![
                mode.into(),
                load_s.clone(),
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
                format!("{cpu_per_1k:.3}"),
                format!("{peak_mb:.1}"),
                format!("{:.2} / {:.2} / {:.2}", busy[0], busy[1], busy[2]),
            ]);
            if stream {
                ttft.row(vec![
                    load_s.clone(),
                    format!("{} / {} / {}", ms(dt.p50), ms(dt.p99), ms(dt.max)),
                    format!("{} / {} / {}", ms(vt.p50), ms(vt.p99), ms(vt.max)),
                    format!("{} / {}", delta(vt.p50 - dt.p50), delta(vt.p99 - dt.p99)),
                ]);
            }
            if *load == Load::Rate(TARGET_RATE) {
                let added = vl.p99 - dl.p99;
                let achieved = via.throughput() >= 0.95 * TARGET_RATE;
                res.targets.push(Target {
                    target: format!(
                        "{mode}: p99 added latency under 1 ms at 2,000 requests per second"
                    ),
                    met: Some(added < 1.0 && achieved),
                    detail: format!(
                        "added p99 {} ms (direct p99 {} ms, via {} ms), achieved {:.0} rps",
                        delta(added),
                        ms(dl.p99),
                        ms(vl.p99),
                        via.throughput()
                    ),
                });
            }
            rows.push(json!({
                "mode": mode,
                "load": load_s,
                "direct": side(&direct),
                "switchyard": side(&via),
                "added_ms": {
                    "latency_p50": vl.p50 - dl.p50, "latency_p99": vl.p99 - dl.p99,
                    "latency_max": vl.max - dl.max,
                    "ttft_p50": vt.p50 - dt.p50, "ttft_p99": vt.p99 - dt.p99,
                },
                "switchyard_cpu_s_per_1k": cpu_per_1k,
                "switchyard_cpu_s": u1.cpu_s - u0.cpu_s,
                "switchyard_peak_rss_mb": peak_mb,
                "peak_rss_since": if peak_reset { "run" } else { "process start" },
                "cores_busy_via": {"load_generator": busy[0], "mock": busy[1], "switchyard": busy[2]},
                "perf_profile": perf.map(|r| match r {
                    Ok(()) => perf_file.display().to_string(),
                    Err(e) => e,
                }),
            }));
            ctx.progress(format!(
                "   {mode} {load_s}: added p50 {} p99 {} ms, {:.0} rps via, CPU {cpu_per_1k:.3} s/1k",
                delta(vl.p50 - dl.p50),
                delta(vl.p99 - dl.p99),
                via.throughput()
            ));
        }
    }
    if ctx.quick {
        res.targets.push(Target {
            target: "p99 added latency under 1 ms at 2,000 requests per second".into(),
            met: None,
            detail: "quick run: 200 rps only".into(),
        });
    }
    res.markdown = format!(
        "Mock answers at once (16 tokens, no delay). Open loop on a schedule: latency counts from \
         the scheduled send, so queueing shows. Direct = reqwest to the mock's OpenAI endpoint; \
         via = gRPC to Switchyard (4 HTTP/2 connections), which calls the same mock. Load \
         generator, mock and Switchyard share the machine's cores.\n\n{}\nTime to first token \
         (streaming):\n\n{}",
        lat.render(),
        ttft.render()
    );
    res.data = json!({ "rows": rows, "duration_s": d.as_secs_f64() });
    env.router.stop().await;
    env.mock.stop().await;
    Ok(res)
}
