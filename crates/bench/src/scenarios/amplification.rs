//! Scenario 4, amplification: every provider answers 503; N concurrent
//! callers keep calling. Upstream attempts per caller request, counted by the
//! mocks, for naive stacked retries (3 at the caller around a client that
//! retries 3 times) versus Switchyard (without and with caller retries),
//! while the breakers trip and once they are open.

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{check_complete, check_errors, result};
use crate::clients::{grpc_call, http_client, retry_loop, Call, Grpc, Outcome};
use crate::load::{closed_loop, Run};
use crate::procs::{config_text, MockProc, MockSpec, Provider, RouterProc};
use crate::report::{ms, Table};
use crate::{BenchError, Ctx, ScenarioResult, Target};

const TIMEOUT: Duration = Duration::from_secs(10);
const CALLER_TRIES: u32 = 3;
const CLIENT_TRIES: u32 = 3;

#[derive(Clone, Copy, PartialEq)]
enum Who {
    Naive,
    Switchyard,
    SwitchyardCallerRetries,
}

impl Who {
    fn label(self) -> &'static str {
        match self {
            Who::Naive => "naive: 3 caller retries x 3 client retries",
            Who::Switchyard => "Switchyard, caller does not retry",
            Who::SwitchyardCallerRetries => "Switchyard, caller retries 3 times",
        }
    }
}

async fn upstream_total(mocks: &[&MockProc]) -> Result<u64, BenchError> {
    let mut n = 0;
    for m in mocks {
        n += m.stats().await?.requests;
    }
    Ok(n)
}

struct Measured {
    run: Run,
    early_attempts: u64,
    late_attempts: u64,
}

async fn one(
    ctx: &Ctx,
    who: Who,
    callers: usize,
    d: Duration,
    warm: Duration,
    mocks: [&MockProc; 2],
) -> Result<Measured, BenchError> {
    for m in mocks {
        m.clear().await?;
    }
    let router = if who == Who::Naive {
        None
    } else {
        let cfg = config_text(
            "",
            &[
                Provider::new("primary", "openai", mocks[0]),
                Provider::new("secondary", "anthropic", mocks[1]),
            ],
            &[("chat", &["primary", "secondary"])],
        );
        let tag = if who == Who::Switchyard {
            "amplification"
        } else {
            "amplification-caller-retries"
        };
        Some(RouterProc::start(ctx, tag, &cfg).await?)
    };
    let grpc = match &router {
        Some(r) => Some(Grpc::connect(r.grpc, 2).await?),
        None => None,
    };
    let http = http_client()?;
    let base = mocks[0].base_url();
    let call = Call::new("chat", true, TIMEOUT);
    let f = move |i: u64, t0: Instant| {
        let (http, base, grpc, call) = (http.clone(), base.clone(), grpc.clone(), call.clone());
        async move {
            let tries = if who == Who::Switchyard {
                1
            } else {
                CALLER_TRIES
            };
            let mut attempts = 0;
            let mut last = Outcome::default();
            for _ in 0..tries {
                let o = match &grpc {
                    Some(g) => grpc_call(g.client(i), &call, t0).await,
                    None => retry_loop(&http, &base, false, CLIENT_TRIES, t0, TIMEOUT).await,
                };
                attempts += o.attempts;
                last = o;
                if last.ok {
                    break;
                }
            }
            Outcome { attempts, ..last }
        }
    };
    let early = async {
        tokio::time::sleep(warm).await;
        upstream_total(&mocks).await
    };
    let pause = Duration::from_millis(20);
    let (run, early) = tokio::join!(closed_loop(ctx, who.label(), callers, d, pause, f), early);
    let early = early?;
    let total = upstream_total(&mocks).await?;
    if let Some(r) = router {
        r.stop().await;
    }
    Ok(Measured {
        run,
        early_attempts: early,
        late_attempts: total.saturating_sub(early),
    })
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("amplification");
    let callers = ctx.pick(10, 50);
    let d = ctx.pick(Duration::from_secs(2), Duration::from_secs(8));
    let warm = ctx.pick(Duration::from_millis(500), Duration::from_secs(2));
    let mut spec = MockSpec::new("openai", 16, 0);
    spec.fault = Some(json!({"type": "status", "status": 503}));
    let primary = MockProc::start(ctx, "amplification-primary", &spec).await?;
    spec.kind = "anthropic";
    let secondary = MockProc::start(ctx, "amplification-secondary", &spec).await?;

    let mut table = Table::new(&[
        "client",
        "caller requests",
        "upstream attempts",
        &format!(
            "attempts / request, first {:.1} s (breakers tripping)",
            warm.as_secs_f64()
        ),
        "attempts / request after (breakers open)",
        "attempts / request, whole run",
        "failure latency p50 / p99 ms",
    ]);
    let mut data = Vec::new();
    let warm_s = warm.as_secs_f64();
    for who in [Who::Naive, Who::Switchyard, Who::SwitchyardCallerRetries] {
        let m = one(ctx, who, callers, d, warm, [&primary, &secondary]).await?;
        let n = m.run.outcomes.len();
        let n_early = m.run.outcomes.iter().filter(|o| o.at < warm_s).count();
        let n_late = n - n_early;
        let per = |a: u64, r: usize| if r == 0 { 0.0 } else { a as f64 / r as f64 };
        let (early, late) = (per(m.early_attempts, n_early), per(m.late_attempts, n_late));
        let whole = per(m.early_attempts + m.late_attempts, n);
        let lat = m.run.latency_all();
        table.row(vec![
            who.label().into(),
            n.to_string(),
            (m.early_attempts + m.late_attempts).to_string(),
            format!("{early:.2}"),
            format!("{late:.3}"),
            format!("{whole:.2}"),
            format!("{} / {}", ms(lat.p50), ms(lat.p99)),
        ]);
        res.checks.push(check_complete(who.label(), &m.run));
        let allowed: &[&str] = if who == Who::Naive {
            &["HTTP"]
        } else {
            &["UNAVAILABLE", "RESOURCE_EXHAUSTED"]
        };
        res.checks
            .push(check_errors(who.label(), &m.run.outcomes, allowed));
        res.checks.push(super::Check::new(
            format!(
                "{}: nothing succeeds while every provider is down",
                who.label()
            ),
            m.run.ok() == 0,
            format!("{} of {n} succeeded", m.run.ok()),
        ));
        if who != Who::Naive {
            res.targets.push(Target {
                target: format!(
                    "{}: at most 1.1 attempts per request once breakers are open",
                    who.label()
                ),
                met: if ctx.quick { None } else { Some(late <= 1.1) },
                detail: format!("{late:.3} after the first {warm_s:.1} s, {whole:.2} over the run"),
            });
        }
        data.push(json!({
            "client": who.label(), "caller_requests": n,
            "requests_first_window": n_early, "requests_after": n_late,
            "upstream_attempts_first_window": m.early_attempts,
            "upstream_attempts_after": m.late_attempts,
            "attempts_per_request_first_window": early,
            "attempts_per_request_after": late,
            "attempts_per_request": whole,
            "failure_latency_ms": lat,
        }));
    }
    res.markdown = format!(
        "Both providers answer 503 to everything. {callers} concurrent callers, each sending \
         its next request 20 ms after the last ended, for {:.0} s. Attempts are counted by \
         the mocks. Switchyard runs its default policy (breaker: 5 consecutive failures, \
         retry budget 10 %).\n\n{}",
        d.as_secs_f64(),
        table.render()
    );
    res.data = json!({ "callers": callers, "duration_s": d.as_secs_f64(), "first_window_s": warm_s, "rows": data });
    primary.stop().await;
    secondary.stop().await;
    Ok(res)
}
