//! Scenario `tail`: what hedged first tokens buy against a slow tail. One
//! mock whose time to first token is 20 ms for 95 % of requests and 2 s for
//! 5 % (seeded, shorter in quick mode), two providers on it (models `m-a`
//! and `m-b`, so the mock's log tells them apart; `b` is the pricier
//! backup), one route. The same seeded open-loop load of streamed requests
//! runs through four arms, each on its own `switchyard serve`:
//!
//! - `off`: no hedging;
//! - `p95`: `hedge = { after = "p95" }`, after a warm-up that gives the
//!   first target the 5 samples its p95 needs (the p95 in force is reported);
//! - `fixed`: `hedge = { after = "100ms" }`;
//! - `client retry`: no hedging in the router; the client itself abandons a
//!   stream that has no token after a timeout and sends it again.
//!
//! Reported per arm: TTFT percentiles as the client saw them, upstream
//! requests per request (from the mock's log), cost per request (the sum of
//! `Finished.cost_usd`), and for the hedged arms `switchyard_hedges_total`.
//! Checked: every request answered in every arm; in the hedged arms at most
//! two upstream requests per request, and no more extra ones than the retry
//! budget allows.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{check_complete, errors_json, result};
use crate::clients::{grpc_call, grpc_stream_or_abandon, Call, Grpc, Outcome, Prompt, ABANDONED};
use crate::load::{open_loop, Dist, Run};
use crate::procs::{config_text, route_over, MockProc, MockSpec, Provider, RouterProc};
use crate::report::{ms, Table};
use crate::{BenchError, Check, Ctx, ScenarioResult};
use switchyard_mock::RequestRecord;

/// A caller's deadline for one request.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The seed of the mock's TTFT draws, the same for every arm.
const TTFT_SEED: u64 = 7;
/// Time to first token of the fast 95 %.
const FAST_MS: u64 = 20;
/// Sends of the naive client per request (the last is never abandoned).
const CLIENT_TRIES: u32 = 3;
/// The route's retry budget, spelled out (Switchyard's defaults) so the
/// allowance check uses the numbers the router runs with.
const BUDGET_RATIO: f64 = 0.1;
const BUDGET_MIN_PER_SEC: f64 = 1.0;
const BUDGET_TTL_S: f64 = 10.0;

/// The sizes of one run.
struct Params {
    requests: u64,
    rate: f64,
    slow_ms: u64,
    hedge_after_ms: u64,
    client_timeout_ms: u64,
    warmup: u64,
}

fn params(ctx: &Ctx) -> Params {
    Params {
        requests: ctx.pick(40, 200),
        rate: ctx.pick(40.0, 20.0),
        slow_ms: ctx.pick(400, 2000),
        hedge_after_ms: 100,
        client_timeout_ms: ctx.pick(200, 500),
        warmup: ctx.pick(6, 10),
    }
}

/// One way of meeting the slow tail.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Arm {
    Off,
    P95,
    Fixed,
    ClientRetry,
}

impl Arm {
    const ALL: [Arm; 4] = [Arm::Off, Arm::P95, Arm::Fixed, Arm::ClientRetry];

    fn name(self) -> &'static str {
        match self {
            Arm::Off => "off",
            Arm::P95 => "p95",
            Arm::Fixed => "fixed",
            Arm::ClientRetry => "client retry",
        }
    }

    fn hedged(self) -> bool {
        matches!(self, Arm::P95 | Arm::Fixed)
    }

    /// The route's `hedge` line.
    fn hedge_line(self, p: &Params) -> String {
        match self {
            Arm::P95 => "hedge = { after = \"p95\", max_extra = 1 }".into(),
            Arm::Fixed => format!(
                "hedge = {{ after = \"{}ms\", max_extra = 1 }}",
                p.hedge_after_ms
            ),
            Arm::Off | Arm::ClientRetry => String::new(),
        }
    }

    fn describe(self, p: &Params) -> String {
        match self {
            Arm::Off => "no hedging".into(),
            Arm::P95 => "`hedge = { after = \"p95\" }`".into(),
            Arm::Fixed => format!("`hedge = {{ after = \"{}ms\" }}`", p.hedge_after_ms),
            Arm::ClientRetry => format!(
                "no hedging; the client abandons a stream without a token after {} ms and \
                 sends it again (at most {CLIENT_TRIES} sends)",
                p.client_timeout_ms
            ),
        }
    }
}

/// The mock's TTFT distribution: the slow tail, or the fast mode alone.
fn ttft(p: &Params, tail: bool) -> serde_json::Value {
    if tail {
        json!({"ttft": [{"p": 0.95, "ms": FAST_MS}, {"p": 0.05, "ms": p.slow_ms}],
               "ttft_seed": TTFT_SEED})
    } else {
        json!({"ttft": [{"p": 1.0, "ms": FAST_MS}], "ttft_seed": TTFT_SEED})
    }
}

fn config(arm: Arm, p: &Params, mock: &MockProc) -> String {
    let providers = [
        Provider::new("a", "openai", mock)
            .model("m-a")
            .model_extra("price = { input_per_mtok = 2.5, output_per_mtok = 10.0 }"),
        Provider::new("b", "openai", mock)
            .model("m-b")
            .model_extra("price = { input_per_mtok = 5.0, output_per_mtok = 20.0 }"),
    ];
    let top = format!(
        "retry_budget = {{ ratio = {BUDGET_RATIO}, min_per_sec = {BUDGET_MIN_PER_SEC}, \
         ttl = \"{BUDGET_TTL_S}s\" }}"
    );
    config_text(&top, &providers, &[])
        + &route_over(
            "chat",
            &["a/m-a".to_string(), "b/m-b".to_string()],
            &arm.hedge_line(p),
        )
}

/// Request `i`'s call: its own prompt, so the mock's log groups its sends.
fn call(arm: Arm, i: u64) -> Call {
    Call::new("chat", true, TIMEOUT).prompt(Prompt {
        system: None,
        user: format!("tail {} request {i}", arm.name()).into(),
    })
}

/// The naive client: abandons a stream without a token after `timeout` and
/// sends the request again; the last send is waited for.
async fn client_retry(grpc: Grpc, i: u64, call: Call, t0: Instant, timeout: Duration) -> Outcome {
    for send in 1..CLIENT_TRIES {
        let o = grpc_stream_or_abandon(grpc.client(i), &call, t0, timeout).await;
        if o.error.as_deref() != Some(ABANDONED) {
            return Outcome {
                attempts: send,
                ..o
            };
        }
    }
    let o = grpc_call(grpc.client(i), &call, t0).await;
    Outcome {
        attempts: CLIENT_TRIES,
        ..o
    }
}

async fn drive(ctx: &Ctx, arm: Arm, p: &Params, grpc: &Grpc) -> Run {
    let grpc = grpc.clone();
    let timeout = Duration::from_millis(p.client_timeout_ms);
    let f = move |i: u64, t0: Instant| {
        let grpc = grpc.clone();
        async move {
            let call = call(arm, i);
            match arm {
                Arm::ClientRetry => client_retry(grpc, i, call, t0, timeout).await,
                _ => grpc_call(grpc.client(i), &call, t0).await,
            }
        }
    };
    let d = Duration::from_secs_f64(p.requests as f64 / p.rate);
    open_loop(ctx, format!("tail {}", arm.name()), p.rate, d, 1_000, f).await
}

/// `p95_ttft_ms` of target `a/m-a` in the router's `/v1/status`.
async fn p95_of_a(router: &RouterProc) -> Option<u64> {
    let text = router.admin_get("/v1/status").await.ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["targets"]
        .as_array()?
        .iter()
        .find(|t| t["provider"] == "a")?["p95_ttft_ms"]
        .as_u64()
}

/// `switchyard_hedges_total` by outcome, from `/metrics`.
fn hedge_counts(metrics: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("switchyard_hedges_total{"))
    {
        let outcome = line
            .split("outcome=\"")
            .nth(1)
            .and_then(|s| s.split('"').next());
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(o), Some(v)) = (outcome, value) {
            *out.entry(o.to_string()).or_insert(0) += v as u64;
        }
    }
    out
}

/// Upstream requests per caller request: each request's prompt is its own.
fn sends_per_request(log: &[RequestRecord]) -> BTreeMap<String, u32> {
    let mut m = BTreeMap::new();
    for r in log {
        *m.entry(r.body["messages"].to_string()).or_insert(0) += 1;
    }
    m
}

/// What one arm produced.
struct ArmResult {
    arm: Arm,
    run: Run,
    log: Vec<RequestRecord>,
    hedges: BTreeMap<String, u64>,
    p95_ms: (Option<u64>, Option<u64>),
    /// Requests sent to the router, warm-up included, and over how long.
    routed: u64,
    span_s: f64,
}

impl ArmResult {
    fn requests(&self) -> f64 {
        self.run.outcomes.len().max(1) as f64
    }

    fn upstream_per_request(&self) -> f64 {
        self.log.len() as f64 / self.requests()
    }

    fn max_sends(&self) -> u32 {
        sends_per_request(&self.log)
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    }

    fn cost_per_1k(&self) -> f64 {
        let sum: f64 = self
            .run
            .outcomes
            .iter()
            .filter_map(|o| o.answer.as_ref())
            .map(|a| a.cost_usd)
            .sum();
        sum / self.requests() * 1000.0
    }

    fn hedged(&self) -> (usize, usize) {
        let answers = || self.run.outcomes.iter().filter_map(|o| o.answer.as_ref());
        (
            answers().filter(|a| a.hedged).count(),
            answers().filter(|a| a.hedged && a.won_attempt > 1).count(),
        )
    }

    /// Upstream requests beyond one per request.
    fn extra(&self) -> u64 {
        (self.log.len() as u64).saturating_sub(self.run.outcomes.len() as u64)
    }

    /// The most extra attempts the retry budget can pay for: withdrawals
    /// still counted are at most the reserve plus the deposits of the last
    /// ttl, and a withdrawal counts for at least 0.9 ttl, so over the span
    /// at most `ceil(span / 0.9 ttl)` reserves and each deposit twice.
    fn allowance(&self) -> f64 {
        let chunks = (self.span_s / (0.9 * BUDGET_TTL_S)).ceil().max(1.0);
        chunks * BUDGET_MIN_PER_SEC * BUDGET_TTL_S + 2.0 * BUDGET_RATIO * self.routed as f64
    }
}

async fn run_arm(
    ctx: &Ctx,
    arm: Arm,
    p: &Params,
    mock: &MockProc,
) -> Result<ArmResult, BenchError> {
    let tag = format!("tail-{}", arm.name().replace(' ', "-"));
    let router = RouterProc::start(ctx, &tag, &config(arm, p, mock)).await?;
    let grpc = Grpc::connect(router.grpc, 2).await?;
    let started = Instant::now();
    let mut routed = 0;
    if arm == Arm::P95 {
        // The first target's p95 needs 5 answers: give it the fast mode.
        mock.set_config(&ttft(p, false)).await?;
        for i in 0..p.warmup {
            let warm = Call::new("chat", true, TIMEOUT);
            let _ = grpc_call(grpc.client(i), &warm, Instant::now()).await;
            routed += 1;
        }
    }
    mock.set_config(&ttft(p, true)).await?;
    mock.clear().await?;
    let p95_before = p95_of_a(&router).await;
    let run = drive(ctx, arm, p, &grpc).await;
    routed += run.outcomes.len() as u64;
    let span_s = started.elapsed().as_secs_f64();
    // The mock logs an abandoned request when it notices the hang-up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = mock.requests().await?;
    let hedges = hedge_counts(&router.admin_get("/metrics").await?);
    let p95_after = p95_of_a(&router).await;
    router.stop().await;
    Ok(ArmResult {
        arm,
        run,
        log,
        hedges,
        p95_ms: (p95_before, p95_after),
        routed,
        span_s,
    })
}

fn checks(r: &ArmResult) -> Vec<Check> {
    let label = format!("tail {}", r.arm.name());
    let mut out = vec![
        check_complete(&label, &r.run),
        Check::new(
            format!("{label}: every request answered"),
            r.run.complete() && r.run.failed() == 0,
            format!(
                "{} of {} answered ({:?})",
                r.run.ok(),
                r.run.scheduled,
                r.run.errors()
            ),
        ),
    ];
    if r.arm.hedged() {
        let most_reported = r.run.outcomes.iter().map(|o| o.attempts).max();
        out.push(Check::new(
            format!("{label}: at most 2 upstream requests per request"),
            r.max_sends() <= 2 && most_reported.unwrap_or(0) <= 2,
            format!(
                "most sends of one request in the mock's log {}, most Finished.attempts {}",
                r.max_sends(),
                most_reported.unwrap_or(0)
            ),
        ));
        out.push(Check::new(
            format!("{label}: extra upstream requests within the retry budget"),
            r.extra() as f64 <= r.allowance(),
            format!(
                "{} extra for {} routed requests over {:.1} s; the budget allows at most {:.0}",
                r.extra(),
                r.routed,
                r.span_s,
                r.allowance()
            ),
        ));
    }
    out
}

fn p95_text(p95: (Option<u64>, Option<u64>)) -> String {
    let f = |v: Option<u64>| v.map_or("unknown".to_string(), |v| format!("{v} ms"));
    format!("{} at start, {} at end", f(p95.0), f(p95.1))
}

fn row(r: &ArmResult, table: &mut Table) -> serde_json::Value {
    let t: Dist = r.run.ttft();
    let (hedged, won) = r.hedged();
    let hung_up = r.log.iter().filter(|l| l.client_hung_up).count();
    let backup = r
        .log
        .iter()
        .filter(|l| l.model.as_deref() == Some("m-b"))
        .count();
    let hedges = if r.arm.hedged() {
        let n = |k: &str| r.hedges.get(k).copied().unwrap_or(0);
        format!(
            "{} / {} / {} / {}",
            n("won"),
            n("lost"),
            n("cancelled"),
            n("budget")
        )
    } else {
        "-".into()
    };
    table.row(vec![
        r.arm.name().into(),
        format!("{} / {}", r.run.ok(), r.run.scheduled),
        format!("{} / {} / {}", ms(t.p50), ms(t.p95), ms(t.p99)),
        format!("{:.3} (max {})", r.upstream_per_request(), r.max_sends()),
        format!("{hung_up}"),
        format!("{backup}"),
        format!("{:.4}", r.cost_per_1k()),
        if r.arm.hedged() {
            format!("{hedged} ({won} won by the hedge)")
        } else {
            "-".into()
        },
        hedges,
    ]);
    json!({
        "arm": r.arm.name(),
        "requests": r.run.scheduled,
        "answered": r.run.ok(),
        "errors": errors_json(&r.run.outcomes),
        "ttft_ms": t,
        "upstream_requests": r.log.len(),
        "upstream_per_request": r.upstream_per_request(),
        "max_upstream_per_request": r.max_sends(),
        "upstream_hung_up": hung_up,
        "upstream_to_backup": backup,
        "cost_usd_per_1k_requests": r.cost_per_1k(),
        "hedged_requests": hedged,
        "won_by_hedge": won,
        "hedges_total": r.hedges,
        "p95_ttft_ms_of_a": {"start": r.p95_ms.0, "end": r.p95_ms.1},
        "extra_upstream": r.extra(),
        "budget_allowance": r.allowance(),
    })
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("tail");
    let p = params(ctx);
    let mock = MockProc::start(ctx, "tail", &MockSpec::new("openai", 16, 5)).await?;
    let mut arms = Vec::new();
    for arm in Arm::ALL {
        let r = run_arm(ctx, arm, &p, &mock).await?;
        let t = r.run.ttft();
        ctx.progress(format!(
            "   tail {}: {} of {} answered, TTFT p50 {} p99 {} ms, {:.3} upstream requests each",
            arm.name(),
            r.run.ok(),
            r.run.scheduled,
            ms(t.p50),
            ms(t.p99),
            r.upstream_per_request()
        ));
        res.checks.extend(checks(&r));
        arms.push(r);
    }
    mock.stop().await;
    let mut table = Table::new(&[
        "arm",
        "answered",
        "TTFT p50 / p95 / p99 ms",
        "upstream requests per request",
        "upstream requests abandoned",
        "upstream requests to b",
        "cost USD per 1,000 requests",
        "hedged requests",
        "hedges_total won / lost / cancelled / budget",
    ]);
    let rows: Vec<serde_json::Value> = arms.iter().map(|r| row(r, &mut table)).collect();
    let p95 = arms
        .iter()
        .find(|r| r.arm == Arm::P95)
        .map_or(String::new(), |r| p95_text(r.p95_ms));
    let arms_text: Vec<String> = Arm::ALL
        .iter()
        .map(|a| format!("- `{}`: {}", a.name(), a.describe(&p)))
        .collect();
    res.markdown = format!(
        "One mock, time to first token {FAST_MS} ms for 95 % of requests and {} ms for 5 % \
         (seeded draws, seed {TTFT_SEED}, the same for every arm), 16 tokens 5 ms apart; two \
         providers on it, `a/m-a` (USD 2.50 / 10 per million tokens in / out) then `b/m-b` \
         (USD 5 / 20), one route; {} streamed requests at {:.0} per second, open loop, each \
         arm on its own `switchyard serve`. Retry budget: ratio {BUDGET_RATIO}, \
         min_per_sec {BUDGET_MIN_PER_SEC}, ttl {BUDGET_TTL_S} s (the defaults).\n\n{}\n\n\
         The `p95` arm first sends {} requests at the fast mode alone, so target `a` has the \
         5 answers its p95 needs; the router's p95 TTFT of `a` was {p95}. TTFT is the \
         client's, from the request's scheduled start to its first token (the client-retry \
         arm's from its first send). Upstream requests come from the mock's log (grouped by \
         each request's own prompt); abandoned ones are those whose caller (the router, or \
         the client through it) hung up. Cost is the sum of `Finished.cost_usd`: the serving \
         attempt only, so an abandoned upstream request's prompt, which a provider may still \
         bill, is not in it.\n\n{}",
        p.slow_ms,
        p.requests,
        p.rate,
        arms_text.join("\n"),
        p.warmup,
        table.render()
    );
    res.data = json!({
        "requests": p.requests,
        "rate": p.rate,
        "fast_ms": FAST_MS,
        "slow_ms": p.slow_ms,
        "hedge_after_ms": p.hedge_after_ms,
        "client_timeout_ms": p.client_timeout_ms,
        "arms": rows,
    });
    Ok(res)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bench_tail_reads_hedges_by_outcome() {
        let metrics = "# TYPE switchyard_hedges counter\n\
            switchyard_hedges_total{route=\"chat\",outcome=\"won\"} 3\n\
            switchyard_hedges_total{route=\"chat\",outcome=\"budget\"} 1\n\
            switchyard_requests_total{route=\"chat\"} 9\n";
        let m = hedge_counts(metrics);
        assert_eq!(m.get("won"), Some(&3));
        assert_eq!(m.get("budget"), Some(&1));
        assert_eq!(m.len(), 2);
    }
}
