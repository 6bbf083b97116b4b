//! Scenario `state`: what the fleet backend costs. The same open-loop load,
//! every request with its own idempotency key and tenant limits on (so each
//! request claims a key, takes a tenant slot and a rate token, and stores its
//! answer), through Switchyard with `[state] backend = "embedded"` and with
//! `backend = "redis"` (a real `redis-server` on loopback, AOF with
//! `appendfsync always` as deploy/ ships it), side by side with the same
//! load sent straight to the mock. Reports added latency, Switchyard's CPU
//! per 1,000 requests, and Redis's own CPU. Streams are journaled for
//! resume (issue 28); each backend also runs with `[resume] enabled = false`
//! beside it, so the journal's own cost is the difference in one run.
//!
//! The quick run (CI) checks correctness, not speed: it gives each Redis call
//! `QUICK_STATE_TIMEOUT` instead of the production 250 ms, so a machine busy
//! with builds (an fsync or a scheduling stall) cannot turn into refused
//! requests; the full run measures with the production default.

use std::time::Duration;

use serde_json::json;

use super::{check_complete, check_errors, errors_json, result};
use crate::clients::{grpc_call, http_client, openai_call, Call, Grpc};
use crate::load::{open_loop, Run};
use crate::procs::{config_text, MockProc, MockSpec, Provider, RouterProc};
use crate::report::{delta, ms, Table};
use crate::{BenchError, Ctx, ScenarioResult, Target};
use switchyard::state::redis::server::RedisServer;

const TIMEOUT: Duration = Duration::from_secs(10);

/// `state.timeout` of the quick run: what a loaded 2-core CI machine meets
/// (one call past 250 ms there once refused keyed requests; three opened the
/// Redis breaker for a second).
const QUICK_STATE_TIMEOUT: &str = "2s";

/// The tenant limits, state and resume lines of one backend's config;
/// `timeout` overrides `state.timeout` when given.
fn top(backend: &str, timeout: Option<&str>, journal: bool) -> String {
    let timeout = timeout.map_or(String::new(), |t| format!("timeout = \"{t}\"\n"));
    format!(
        "[resume]\nenabled = {journal}\n\
         [state]\nbackend = \"{backend}\"\nredis_url_env = \"SWITCHYARD_BENCH_REDIS_URL\"\n{timeout}\
         [limits]\ntenant_max_concurrent = 100000\ntenant_rate_per_sec = 1000000.0\ntenant_burst = 1000000\n"
    )
}

/// Redis's CPU seconds so far.
fn redis_cpu_s(redis: &RedisServer) -> f64 {
    redis
        .pid()
        .and_then(crate::procs::proc_usage)
        .map_or(0.0, |u| u.cpu_s)
}

async fn drive(
    ctx: &Ctx,
    grpc: Option<&Grpc>,
    mock: &MockProc,
    stream: bool,
    rate: f64,
    d: Duration,
) -> Run {
    let label = format!(
        "{} {rate:.0}/s {}",
        if stream { "stream" } else { "unary" },
        if grpc.is_some() { "via" } else { "direct" }
    );
    let base = mock.base_url();
    let http = http_client().unwrap_or_default();
    let grpc = grpc.cloned();
    let call = Call::new("chat", stream, TIMEOUT).keyed();
    let f = move |i: u64, t0: tokio::time::Instant| {
        let (http, base, grpc, call) = (http.clone(), base.clone(), grpc.clone(), call.clone());
        async move {
            match grpc {
                Some(g) => grpc_call(g.client(i), &call, t0).await,
                None => openai_call(&http, &base, "m", stream, 1000, t0, TIMEOUT).await,
            }
        }
    };
    open_loop(ctx, label, rate, d, 5_000, f).await
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("state");
    let dir = ctx.path("redis-aof");
    let _ = std::fs::remove_dir_all(&dir);
    let started =
        tokio::task::spawn_blocking(move || RedisServer::start(&dir, &["--appendfsync", "always"]))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r);
    let redis = match started {
        Ok(r) => r,
        Err(e) => {
            res.targets.push(Target {
                target: "Redis backend overhead measured".into(),
                met: None,
                detail: format!("not available: {e} (apt-get install redis-server)"),
            });
            res.markdown = format!("Not run: {e}.\n");
            return Ok(res);
        }
    };
    // The routers read the URL from this variable (set before they start).
    std::env::set_var("SWITCHYARD_BENCH_REDIS_URL", redis.url());
    let mock = MockProc::start(ctx, "state", &MockSpec::new("openai", 16, 0)).await?;
    let provider = Provider::new("primary", "openai", &mock).caps(100_000, 100_000);
    let mut routers = Vec::new();
    for (backend, journal) in [
        ("embedded", true),
        ("embedded", false),
        ("redis", true),
        ("redis", false),
    ] {
        let cfg = config_text(
            &top(backend, ctx.pick(Some(QUICK_STATE_TIMEOUT), None), journal),
            std::slice::from_ref(&provider),
            &[("chat", &["primary"])],
        );
        let name = if journal {
            backend.to_string()
        } else {
            format!("{backend}, resume off")
        };
        let router = RouterProc::start(ctx, &format!("state-{backend}-{journal}"), &cfg).await?;
        let grpc = Grpc::connect(router.grpc, 4).await?;
        routers.push((name, journal, router, grpc));
    }
    let rates: Vec<f64> = ctx.pick(vec![200.0], vec![500.0, 2000.0]);
    let d = ctx.pick(Duration::from_secs(2), Duration::from_secs(6));
    for stream in [true, false] {
        for (_, _, _, grpc) in &routers {
            drive(
                ctx,
                Some(grpc),
                &mock,
                stream,
                200.0,
                Duration::from_millis(500),
            )
            .await;
        }
    }
    let mut table = Table::new(&[
        "mode",
        "load",
        "backend",
        "achieved rps",
        "added p50 / p99 ms",
        "errors",
        "Switchyard CPU s / 1k req",
        "Redis CPU s / 1k req",
    ]);
    let mut rows = Vec::new();
    for stream in [true, false] {
        let mode = if stream { "stream" } else { "unary" };
        for rate in &rates {
            mock.clear().await?;
            let direct = drive(ctx, None, &mock, stream, *rate, d).await;
            let dl = direct.latency();
            res.checks
                .push(check_complete(&format!("{mode} {rate} direct"), &direct));
            // A unary call is never journaled: resume off changes nothing there.
            for (backend, _, router, grpc) in routers.iter().filter(|r| stream || r.1) {
                let (u0, r0) = (router.usage(), redis_cpu_s(&redis));
                let via = drive(ctx, Some(grpc), &mock, stream, *rate, d).await;
                let (u1, r1) = (router.usage(), redis_cpu_s(&redis));
                let per_1k = |s: f64| {
                    if via.ok() > 0 {
                        s / (via.ok() as f64 / 1000.0)
                    } else {
                        0.0
                    }
                };
                let cpu = per_1k(u1.cpu_s - u0.cpu_s);
                let redis_cpu = per_1k(r1 - r0);
                let vl = via.latency();
                let label = format!("{mode} {rate:.0}/s {backend}");
                res.checks.push(check_complete(&label, &via));
                res.checks.push(check_errors(&label, &via.outcomes, &[]));
                table.row(vec![
                    mode.into(),
                    format!("{rate:.0}/s"),
                    backend.clone(),
                    format!("{:.0}", via.throughput()),
                    format!("{} / {}", delta(vl.p50 - dl.p50), delta(vl.p99 - dl.p99)),
                    format!("{}", via.failed()),
                    format!("{cpu:.3}"),
                    if backend.starts_with("redis") {
                        format!("{redis_cpu:.3}")
                    } else {
                        "-".into()
                    },
                ]);
                rows.push(json!({
                    "mode": mode, "rate": rate, "backend": backend,
                    "throughput_rps": via.throughput(),
                    "direct_latency_ms": direct.latency(), "latency_ms": vl,
                    "added_p50_ms": vl.p50 - dl.p50, "added_p99_ms": vl.p99 - dl.p99,
                    "errors": errors_json(&via.outcomes),
                    "switchyard_cpu_s_per_1k": cpu, "redis_cpu_s_per_1k": redis_cpu,
                }));
                ctx.progress(format!(
                    "   {label}: added p50 {} p99 {} ms (direct p99 {} ms), CPU {cpu:.3} s/1k",
                    delta(vl.p50 - dl.p50),
                    delta(vl.p99 - dl.p99),
                    ms(dl.p99)
                ));
            }
        }
    }
    res.markdown = format!(
        "Every request carries its own idempotency key and tenant limits are on, so each one \
         claims a key, takes a tenant slot and a rate token, and stores its answer: in process \
         (embedded) or in one `redis-server` on loopback (AOF, `appendfsync always`). Same \
         mock (16 tokens at once), same open-loop load; added latency is against the same load \
         sent straight to the mock. Streams are journaled for resume; the `resume off` rows \
         run the same load with `[resume] enabled = false`, so the journal's cost is the \
         difference.\n\n{}",
        table.render()
    );
    res.data = json!({ "rows": rows, "duration_s": d.as_secs_f64() });
    for (_, _, router, _) in routers {
        router.stop().await;
    }
    mock.stop().await;
    drop(redis);
    Ok(res)
}
