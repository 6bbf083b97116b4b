//! Scenario 2, blackout: the launch-day 120 s primary blackout scaled in
//! time. Constant load from three clients side by side on the same mocks:
//! (A) one provider with an immediate-retry loop, (B) static primary then
//! secondary with buffered answers, (C) Switchyard. The primary fails every
//! request (500, 503 and 429 in rotation) for the middle third of the run.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{check_complete, check_errors, errors_json, result};
use crate::clients::{
    grpc_call, http_client, retry_loop, static_failover, Call, Grpc, Outcome, Prompt,
};
use crate::load::{open_loop, Dist, Run};
use crate::procs::{config_text, MockProc, MockSpec, Provider, RouterProc};
use crate::report::{delta, ms, pct, Table};
use crate::{BenchError, Ctx, ScenarioResult, Target};

const TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts of client A's retry loop.
const A_ATTEMPTS: u32 = 5;
pub(super) const PHASES: [&str; 3] = ["before", "blackout", "after"];

pub(super) struct PhaseStats {
    pub(super) n: usize,
    pub(super) availability: f64,
    pub(super) ttft: Dist,
    pub(super) attempts_per_request: f64,
}

fn phase_stats(outcomes: &[&Outcome]) -> PhaseStats {
    let n = outcomes.len();
    let ok = outcomes.iter().filter(|o| o.ok).count();
    PhaseStats {
        n,
        availability: if n == 0 { 0.0 } else { ok as f64 / n as f64 },
        ttft: Dist::of(outcomes.iter().filter(|o| o.ok).filter_map(|o| o.ttft_ms)),
        attempts_per_request: if n == 0 {
            0.0
        } else {
            outcomes.iter().map(|o| f64::from(o.attempts)).sum::<f64>() / n as f64
        },
    }
}

/// The phase (0, 1 or 2 of [`PHASES`]) of a request scheduled `at` seconds
/// into the run; anything late counts as `after`.
pub(super) fn phase_index(at: f64, phase_s: f64) -> usize {
    ((at / phase_s).floor().max(0.0) as usize).min(2)
}

pub(super) fn by_phase(run: &Run, phase_s: f64) -> Vec<PhaseStats> {
    (0..3)
        .map(|p| {
            let v: Vec<&Outcome> = run
                .outcomes
                .iter()
                .filter(|o| phase_index(o.at, phase_s) == p)
                .collect();
            phase_stats(&v)
        })
        .collect()
}

/// Provider lines for a blackout `phase` long, and the breaker's `open_for`
/// in ms: the default breaker opens for 30 s against a 120 s blackout, so
/// it is scaled to a quarter of the phase; synthetic probes.
pub(super) fn scaled_breaker(phase: Duration) -> (String, u128) {
    let open_ms = phase.as_millis() / 4;
    let lines = format!(
        "synthetic_probes = true\nbreaker = {{ open_for = \"{open_ms}ms\", max_open_for = \"{}ms\" }}",
        phase.as_millis()
    );
    (lines, open_ms)
}

/// Rotates the primary's fault through 500, 503 and 429 during the blackout.
pub(super) async fn blackout(
    primary: &MockProc,
    start: Instant,
    phase: Duration,
) -> Result<u32, BenchError> {
    tokio::time::sleep_until(start + phase).await;
    let end = start + phase * 2;
    let mut flips = 0;
    // Bounded by `end` and the count.
    for i in 0..100_000u32 {
        if Instant::now() >= end {
            break;
        }
        let status = [500, 503, 429][(i % 3) as usize];
        primary
            .set_fault(&json!({"type": "status", "status": status}))
            .await?;
        flips += 1;
        let next = (Instant::now() + Duration::from_millis(100)).min(end);
        tokio::time::sleep_until(next).await;
    }
    primary.set_fault(&json!({})).await?;
    Ok(flips)
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("blackout");
    let phase = ctx.pick(Duration::from_secs(1), Duration::from_secs(10));
    let rate = ctx.pick(40.0, 100.0);
    let spec = MockSpec::new("openai", 16, 5);
    let primary = MockProc::start(ctx, "blackout-primary", &spec).await?;
    let secondary = MockProc::start(
        ctx,
        "blackout-secondary",
        &MockSpec {
            kind: "anthropic",
            ..spec
        },
    )
    .await?;
    let (breaker, open_ms) = scaled_breaker(phase);
    let cfg = config_text(
        "",
        &[
            Provider::new("primary", "openai", &primary).extra(breaker.clone()),
            Provider::new("secondary", "anthropic", &secondary).extra(breaker),
        ],
        &[("chat", &["primary", "secondary"])],
    );
    let router = RouterProc::start(ctx, "blackout", &cfg).await?;
    let grpc = Grpc::connect(router.grpc, 2).await?;
    let http = http_client()?;
    let total = phase * 3;
    let (pu, su) = (primary.base_url(), secondary.base_url());

    let a = {
        let (http, pu) = (http.clone(), pu.clone());
        open_loop(ctx, "A retry loop", rate, total, 5_000, move |_, t0| {
            let (http, pu) = (http.clone(), pu.clone());
            async move { retry_loop(&http, &pu, true, A_ATTEMPTS, t0, TIMEOUT).await }
        })
    };
    let b = {
        let (http, bases) = (http.clone(), vec![pu.clone(), su.clone()]);
        open_loop(
            ctx,
            "B static failover",
            rate,
            total,
            5_000,
            move |_, t0| {
                let (http, bases) = (http.clone(), bases.clone());
                async move {
                    static_failover(&http, &bases, &Prompt::default(), false, t0, TIMEOUT).await
                }
            },
        )
    };
    let c = {
        let grpc = grpc.clone();
        let call = Call::new("chat", true, TIMEOUT);
        open_loop(ctx, "C switchyard", rate, total, 5_000, move |i, t0| {
            let (grpc, call) = (grpc.clone(), call.clone());
            async move { grpc_call(grpc.client(i), &call, t0).await }
        })
    };
    let start = Instant::now();
    let (ra, rb, rc, flips) = tokio::join!(a, b, c, blackout(&primary, start, phase));
    let flips = flips?;

    let logs = [primary.requests().await?, secondary.requests().await?];
    let via_upstream: usize = logs
        .iter()
        .map(|l| {
            l.iter()
                .filter(|r| r.headers.contains_key("x-switchyard-attempt"))
                .count()
        })
        .sum();

    let phase_s = phase.as_secs_f64();
    let clients = [
        ("A: single provider, immediate retries (5)", &ra),
        ("B: static primary/secondary, buffered", &rb),
        ("C: Switchyard", &rc),
    ];
    let mut table = Table::new(&[
        "client",
        "phase",
        "requests",
        "availability",
        "TTFT p50 / p95 ms",
        "upstream attempts / request",
    ]);
    let mut data = Vec::new();
    for (name, run) in clients {
        let stats = by_phase(run, phase_s);
        let mut phases = Vec::new();
        for (p, s) in PHASES.iter().zip(&stats) {
            table.row(vec![
                name.to_string(),
                p.to_string(),
                s.n.to_string(),
                pct(s.availability),
                format!("{} / {}", ms(s.ttft.p50), ms(s.ttft.p95)),
                format!("{:.2}", s.attempts_per_request),
            ]);
            phases.push(json!({
                "phase": p, "requests": s.n, "availability": s.availability,
                "ttft_ms": s.ttft, "attempts_per_request": s.attempts_per_request,
            }));
        }
        let overall = run.ok() as f64 / run.outcomes.len().max(1) as f64;
        table.row(vec![
            name.to_string(),
            "**whole run**".into(),
            run.outcomes.len().to_string(),
            pct(overall),
            "".into(),
            "".into(),
        ]);
        data.push(json!({
            "client": name, "phases": phases, "availability": overall,
            "errors": errors_json(&run.outcomes),
        }));
        res.checks.push(check_complete(name, run));
    }
    res.checks.push(check_errors("A", &ra.outcomes, &["HTTP"]));
    res.checks.push(check_errors("B", &rb.outcomes, &["HTTP"]));
    res.checks.push(check_errors(
        "C",
        &rc.outcomes,
        &["UNAVAILABLE", "RESOURCE_EXHAUSTED"],
    ));
    let before: Vec<Outcome> = rc
        .outcomes
        .iter()
        .filter(|o| o.at < phase_s)
        .cloned()
        .collect();
    res.checks
        .push(check_errors("C before the blackout", &before, &[]));

    let c = by_phase(&rc, phase_s);
    let overall = rc.ok() as f64 / rc.outcomes.len().max(1) as f64;
    let judge = |ok: bool| if ctx.quick { None } else { Some(ok) };
    res.targets.push(Target {
        target: "Switchyard availability at least 99.9 %".into(),
        met: judge(overall >= 0.999),
        detail: format!(
            "{} over the run, {} during the blackout",
            pct(overall),
            pct(c[1].availability)
        ),
    });
    let (d50, d95) = (c[1].ttft.p50 - c[0].ttft.p50, c[1].ttft.p95 - c[0].ttft.p95);
    res.targets.push(Target {
        target: "Switchyard TTFT during the blackout within 50 ms of before it".into(),
        met: judge(d50 <= 50.0 && d95 <= 50.0),
        detail: format!("p50 {} ms, p95 {} ms", delta(d50), delta(d95)),
    });
    let via_per_request = via_upstream as f64 / rc.outcomes.len().max(1) as f64;
    res.markdown = format!(
        "{:.0} s per phase ({:.0} s in all) standing for 40 s of a 120 s blackout; each client \
         sends {rate:.0} streaming requests per second (B asks for buffered answers, so its \
         TTFT is the whole answer). Mocks: 16 tokens, 5 ms apart; during the blackout the \
         primary answers every request with 500, 503 or 429, rotating every 100 ms ({flips} \
         changes). Switchyard: default breaker with `open_for` scaled to {open_ms} ms, synthetic \
         probes. Switchyard's upstream requests from the mock logs (probes included): \
         {via_per_request:.2} per request.\n\n{}",
        phase_s,
        phase_s * 3.0,
        table.render()
    );
    res.data = json!({
        "phase_s": phase_s, "rate_per_client": rate, "clients": data,
        "switchyard_upstream_requests": via_upstream,
        "switchyard_upstream_per_request": via_per_request,
        "fault_changes": flips,
    });
    router.stop().await;
    primary.stop().await;
    secondary.stop().await;
    Ok(res)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bench_requests_fall_into_their_phase_and_late_ones_into_after() {
        let phases: Vec<usize> = [0.0, 0.99, 1.0, 1.5, 2.0, 2.99, 3.0, 7.0]
            .iter()
            .map(|at| phase_index(*at, 1.0))
            .collect();
        assert_eq!(phases, [0, 0, 1, 1, 2, 2, 2, 2]);
        assert_eq!(phase_index(0.3, 0.1), 2);
    }
}
