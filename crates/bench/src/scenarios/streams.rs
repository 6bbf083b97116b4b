//! Scenario 5, streams: 1,000, 5,000 and 10,000 concurrent slow streams (one
//! token every 100 ms) through Switchyard, each level on a fresh process.
//! Reports Switchyard's RSS per open stream and its CPU per 1,000 tokens per
//! second, measured over a window in which every stream is open.
//! `SWITCHYARD_STREAMS_UPSTREAM=h2c` has Switchyard reach the mock over
//! HTTP/2 with prior knowledge (`http2_prior_knowledge`) instead of
//! HTTP/1.1, as a provider over TLS does by ALPN;
//! `SWITCHYARD_STREAMS_RESUME=false` turns the resume journal off
//! (`resume.enabled`), to tell its memory from the data plane's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{check_complete, check_errors, result, upstream_text, with_upstream_keys};
use crate::clients::{grpc_call, grpc_call_counting, Call, Grpc};
use crate::load::open_loop_grace;
use crate::procs::{config_text, self_usage, MockProc, MockSpec, Provider, RouterProc, Usage};
use crate::report::Table;
use crate::{BenchError, Ctx, ScenarioResult};

/// Streams per HTTP/2 connection from the load generator.
const PER_CONNECTION: usize = 50;
const TOKEN_DELAY_MS: u64 = 100;
/// The bound on memory per open stream.
const MAX_KB_PER_STREAM: f64 = 20.0;
/// Streams are journaled (`resume.enabled`, on by default) unless
/// `SWITCHYARD_STREAMS_RESUME=false`.
fn journaled() -> bool {
    std::env::var("SWITCHYARD_STREAMS_RESUME").map_or(true, |v| v.trim() != "false")
}

/// `h2c`: the mock is reached over HTTP/2 with prior knowledge.
const UPSTREAM: &str = "SWITCHYARD_STREAMS_UPSTREAM";

struct Window {
    /// Cores used in the window by the load generator and the mock.
    others: [f64; 2],
    start: Usage,
    end: Usage,
    peak_rss_kb: u64,
    tokens: u64,
    seconds: f64,
    open_min: u64,
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("streams");
    let levels: Vec<usize> = ctx.pick(vec![200], vec![1_000, 5_000, 10_000]);
    let ramp = ctx.pick(Duration::from_millis(500), Duration::from_secs(3));
    let settle = ctx.pick(Duration::from_millis(500), Duration::from_secs(1));
    let window = ctx.pick(Duration::from_secs(1), Duration::from_secs(4));
    let tail = ctx.pick(Duration::from_millis(500), Duration::from_secs(1));
    let life = ramp + settle + window + tail;
    let tokens = (life.as_millis() as u64 / TOKEN_DELAY_MS) as u32;
    let mock = MockProc::start(
        ctx,
        "streams",
        &MockSpec::new("openai", tokens, TOKEN_DELAY_MS),
    )
    .await?;
    let mut table = Table::new(&[
        "concurrent streams",
        "tokens/s (expected / achieved)",
        "Switchyard RSS idle / with streams MB",
        "RSS per stream KB",
        "cores busy: load gen / mock / Switchyard",
        "CPU % of a core per 1,000 tokens/s",
        "streams ok",
    ]);
    let mut data = Vec::new();
    for n in levels {
        let primary = Provider {
            timeout: "60s",
            ..Provider::new("primary", "openai", &mock).caps(100_000, 100_000)
        };
        let primary = with_upstream_keys(primary, UPSTREAM, "");
        let mut cfg = config_text("", &[primary], &[("chat", &["primary"])]);
        if !journaled() {
            cfg.push_str("\n[resume]\nenabled = false\n");
        }
        let router = RouterProc::start(ctx, &format!("streams-{n}"), &cfg).await?;
        let grpc = Grpc::connect(router.grpc, n.div_ceil(PER_CONNECTION)).await?;
        // Warm up with short answers, then measure the idle footprint.
        mock.set_config(&json!({"tokens": 1, "token_delay_ms": 0}))
            .await?;
        let warm = Call::new("chat", true, Duration::from_secs(10));
        for i in 0..50 {
            let _ = grpc_call(grpc.client(i), &warm, Instant::now()).await;
        }
        mock.set_config(&json!({"tokens": tokens, "token_delay_ms": TOKEN_DELAY_MS}))
            .await?;
        mock.clear().await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let idle = router.usage();

        let counter = Arc::new(AtomicU64::new(0));
        let open = Arc::new(AtomicU64::new(0));
        // A saturated machine delivers tokens late: allow for it, and report it.
        let slack = life * 8 + Duration::from_secs(30);
        let call = Call::new("chat", true, slack);
        let load = {
            let (grpc, counter, open) = (grpc.clone(), counter.clone(), open.clone());
            let rate = n as f64 / ramp.as_secs_f64();
            open_loop_grace(
                ctx,
                format!("{n} streams"),
                rate,
                ramp,
                n as u64 + 1,
                slack + Duration::from_secs(5),
                move |i, t0| {
                    let (grpc, call, counter, open) =
                        (grpc.clone(), call.clone(), counter.clone(), open.clone());
                    async move {
                        open.fetch_add(1, Ordering::Relaxed);
                        let o = grpc_call_counting(grpc.client(i), &call, t0, Some(&counter)).await;
                        open.fetch_sub(1, Ordering::Relaxed);
                        o
                    }
                },
            )
        };
        let measure = async {
            tokio::time::sleep(ramp + settle).await;
            let t0 = Instant::now();
            let start = router.usage();
            let (g0, m0) = (self_usage(), mock.usage());
            let tok0 = counter.load(Ordering::Relaxed);
            let mut peak = start.rss_kb;
            let mut open_min = open.load(Ordering::Relaxed);
            let end = t0 + window;
            // Bounded by `end`.
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(200)).await;
                peak = peak.max(router.usage().rss_kb);
                open_min = open_min.min(open.load(Ordering::Relaxed));
            }
            let stop = router.usage();
            let (g1, m1) = (self_usage(), mock.usage());
            let secs = t0.elapsed().as_secs_f64().max(0.001);
            Window {
                others: [(g1.cpu_s - g0.cpu_s) / secs, (m1.cpu_s - m0.cpu_s) / secs],
                start,
                peak_rss_kb: peak.max(stop.rss_kb),
                end: stop,
                tokens: counter.load(Ordering::Relaxed) - tok0,
                seconds: t0.elapsed().as_secs_f64(),
                open_min,
            }
        };
        let (run, w) = tokio::join!(load, measure);
        router.stop().await;

        let expected = n as f64 * 1000.0 / TOKEN_DELAY_MS as f64;
        let achieved = w.tokens as f64 / w.seconds;
        let cores = (w.end.cpu_s - w.start.cpu_s) / w.seconds;
        let cpu_per_1k = if achieved > 0.0 {
            cores * 100.0 / (achieved / 1000.0)
        } else {
            0.0
        };
        let per_stream_kb = w.peak_rss_kb.saturating_sub(idle.rss_kb) as f64 / n as f64;
        let full = run
            .outcomes
            .iter()
            .filter(|o| o.ok && o.tokens == tokens)
            .count();
        table.row(vec![
            n.to_string(),
            format!(
                "{expected:.0} / {achieved:.0}{}",
                if achieved < 0.95 * expected {
                    " (not sustained)"
                } else {
                    ""
                }
            ),
            format!(
                "{:.1} / {:.1}",
                idle.rss_kb as f64 / 1024.0,
                w.peak_rss_kb as f64 / 1024.0
            ),
            format!("{per_stream_kb:.1}"),
            format!("{:.2} / {:.2} / {cores:.2}", w.others[0], w.others[1]),
            format!("{cpu_per_1k:.2}"),
            format!("{full} / {n}"),
        ]);
        let label = format!("{n} streams");
        res.checks.push(check_complete(&label, &run));
        res.checks.push(check_errors(&label, &run.outcomes, &[]));
        res.checks.push(super::super::Check::new(
            format!("{label}: every stream delivered all {tokens} tokens"),
            full == n,
            format!("{full} of {n}"),
        ));
        if n == 10_000 {
            res.targets.push(super::super::Target {
                target: format!(
                    "10,000 concurrent slow streams: every one completes, at most {MAX_KB_PER_STREAM:.0} KB of RSS per stream"
                ),
                met: Some(full == n && per_stream_kb <= MAX_KB_PER_STREAM),
                detail: format!("{full} of {n} complete, {per_stream_kb:.1} KB per stream"),
            });
        }
        data.push(json!({
            "streams": n, "tokens_per_stream": tokens,
            "expected_tokens_per_s": expected, "achieved_tokens_per_s": achieved,
            "open_streams_min_during_window": w.open_min,
            "idle_rss_mb": idle.rss_kb as f64 / 1024.0,
            "peak_rss_mb": w.peak_rss_kb as f64 / 1024.0,
            "rss_per_stream_kb": per_stream_kb,
            "cpu_cores": cores,
            "cores_load_generator": w.others[0], "cores_mock": w.others[1], "cpu_pct_core_per_1k_tokens_per_s": cpu_per_1k,
            "window_s": w.seconds, "streams_ok": full,
        }));
        ctx.progress(format!(
            "   {n} streams: {per_stream_kb:.1} KB/stream, {cores:.2} cores, {achieved:.0} tokens/s"
        ));
    }
    res.markdown = format!(
        "Each stream: {tokens} tokens, one every {TOKEN_DELAY_MS} ms. Streams open evenly over \
         {:.1} s ({PER_CONNECTION} per HTTP/2 connection to Switchyard; Switchyard reaches the \
         mock over {}: over HTTP/1.1 one connection per stream, over h2c one per 100 of the \
         provider's max_concurrency, at most 64); CPU and RSS of the Switchyard process are \
         measured over {:.0} s once all are open, streams {}. RSS per stream = (peak RSS in the \
         window - idle RSS) / streams.\n\n{}",
        ramp.as_secs_f64(),
        upstream_text(UPSTREAM, ""),
        window.as_secs_f64(),
        match journaled() {
            true => "journaled for resumption (`resume.enabled`, the default)",
            false => "not journaled (`resume.enabled = false`)",
        },
        table.render()
    );
    res.data = json!({ "levels": data });
    mock.stop().await;
    Ok(res)
}
