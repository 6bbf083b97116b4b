//! Scenario 3, burst: the secondary has 30 % of the primary's capacity (its
//! mock answers 529 beyond a concurrency limit) and its own traffic; then the
//! primary trips and its traffic fails over. Run twice: without the failover
//! ceiling and retry budget, and with them. Reports the secondary's peak load
//! as a multiple of its normal load and how often it refused (529).

use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{check_errors, errors_json, result};
use crate::clients::{grpc_call, Call, Grpc, Outcome};
use crate::load::open_loop;
use crate::procs::{config_text, MockProc, MockSpec, Provider, RouterProc};
use crate::report::{pct, Table};
use crate::{BenchError, Ctx, ScenarioResult, Target};
use switchyard_mock::{RequestRecord, Stats};

const TIMEOUT: Duration = Duration::from_secs(10);
/// Width of the windows the peak arrival rate is measured in.
const WINDOW_MS: f64 = 250.0;

struct Shape {
    primary_cap: u32,
    secondary_cap: u32,
    failover_ceiling: u32,
    main_rate: f64,
    side_rate: f64,
    normal: Duration,
    trip: Duration,
}

/// What the secondary saw in one phase.
struct Seen {
    stats: Stats,
    log: Vec<RequestRecord>,
}

impl Seen {
    fn refused(&self) -> usize {
        self.log
            .iter()
            .filter(|r| r.over_capacity || r.status == Some(529))
            .count()
    }

    /// Highest arrivals per second over `WINDOW_MS` windows.
    fn peak_rate(&self) -> f64 {
        let Some(first) = self.log.first().map(|r| r.arrived_ms) else {
            return 0.0;
        };
        let mut counts = std::collections::BTreeMap::<u64, u32>::new();
        for r in &self.log {
            *counts
                .entry(((r.arrived_ms - first) / WINDOW_MS) as u64)
                .or_insert(0) += 1;
        }
        f64::from(counts.values().copied().max().unwrap_or(0)) * 1000.0 / WINDOW_MS
    }
}

async fn seen(m: &MockProc) -> Result<Seen, BenchError> {
    Ok(Seen {
        stats: m.stats().await?,
        log: m.requests().await?,
    })
}

struct Outcomes {
    normal: Seen,
    trip: Seen,
    main: Vec<Outcome>,
    side: Vec<Outcome>,
    complete: bool,
}

async fn one_run(
    ctx: &Ctx,
    tag: &str,
    guarded: bool,
    s: &Shape,
    primary: &MockProc,
    secondary: &MockProc,
) -> Result<Outcomes, BenchError> {
    primary.set_fault(&json!({})).await?;
    primary.clear().await?;
    secondary.clear().await?;
    let (top, fo) = if guarded {
        (String::new(), s.failover_ceiling)
    } else {
        (
            "retry_budget = { ratio = 1000.0, min_per_sec = 1000.0 }".to_string(),
            10_000,
        )
    };
    let cfg = config_text(
        &top,
        &[
            Provider::new("primary", "openai", primary).caps(10_000, fo),
            Provider::new("secondary", "anthropic", secondary).caps(10_000, fo),
        ],
        &[
            ("chat", &["primary", "secondary"]),
            ("side", &["secondary"]),
        ],
    );
    let router = RouterProc::start(ctx, tag, &cfg).await?;
    let grpc = Grpc::connect(router.grpc, 2).await?;
    let total = s.normal + s.trip;
    let traffic = |route: &str, rate: f64, label: String| {
        let grpc = grpc.clone();
        let call = Call::new(route, true, TIMEOUT);
        open_loop(
            ctx,
            format!("{tag} {label}"),
            rate,
            total,
            5_000,
            move |i, t0| {
                let (grpc, call) = (grpc.clone(), call.clone());
                async move { grpc_call(grpc.client(i), &call, t0).await }
            },
        )
    };
    let control = async {
        tokio::time::sleep_until(Instant::now() + s.normal).await;
        let normal = seen(secondary).await?;
        secondary.clear().await?;
        primary
            .set_fault(&json!({"type": "status", "status": 500}))
            .await?;
        Ok::<Seen, BenchError>(normal)
    };
    let (main, side, normal) = tokio::join!(
        traffic("chat", s.main_rate, "main (primary first)".into()),
        traffic("side", s.side_rate, "side (secondary's own)".into()),
        control
    );
    let normal = normal?;
    let trip = seen(secondary).await?;
    router.stop().await;
    Ok(Outcomes {
        normal,
        trip,
        complete: main.accounted() && side.accounted(),
        main: main.outcomes,
        side: side.outcomes,
    })
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("burst");
    let cap = ctx.pick(40u32, 100);
    let s = Shape {
        primary_cap: cap,
        secondary_cap: cap * 3 / 10,
        failover_ceiling: cap * 3 / 20,
        // The quick run (CI) keeps five times its capacity in hand in the
        // normal phase, so a busy machine's slower answers never push a mock
        // past its limit before the trip: its checks prove accounting and
        // the guard, not the machine's speed.
        main_rate: f64::from(cap) * ctx.pick(1.0, 2.5),
        side_rate: f64::from(cap * 3 / 10) * ctx.pick(1.0, 5.0 / 3.0),
        normal: ctx.pick(Duration::from_secs(1), Duration::from_secs(4)),
        trip: ctx.pick(Duration::from_secs(2), Duration::from_secs(6)),
    };
    let mut spec = MockSpec::new("openai", 10, 20);
    spec.max_concurrency = s.primary_cap;
    let primary = MockProc::start(ctx, "burst-primary", &spec).await?;
    spec.kind = "anthropic";
    spec.max_concurrency = s.secondary_cap;
    let secondary = MockProc::start(ctx, "burst-secondary", &spec).await?;

    let mut table = Table::new(&[
        "Switchyard config",
        "secondary normal: peak in flight / arrivals per s",
        "after the trip: peak in flight / peak arrivals per s",
        "peak load multiple (arrivals)",
        "secondary 529s",
        "availability after the trip (main / side)",
        "errors after the trip",
    ]);
    let mut data = Vec::new();
    let normal_s = s.normal.as_secs_f64();
    for guarded in [false, true] {
        let (tag, label) = if guarded {
            (
                "burst-with",
                format!(
                    "with: failover ceiling {} + retry budget (default 10 %)",
                    s.failover_ceiling
                ),
            )
        } else {
            (
                "burst-without",
                "without: no failover ceiling, unlimited retry budget".to_string(),
            )
        };
        let o = one_run(ctx, tag, guarded, &s, &primary, &secondary).await?;
        let normal_rate = o.normal.log.len() as f64 / normal_s;
        let multiple = if normal_rate > 0.0 {
            o.trip.peak_rate() / normal_rate
        } else {
            0.0
        };
        let after = |v: &[Outcome]| -> Vec<Outcome> {
            v.iter().filter(|x| x.at >= normal_s).cloned().collect()
        };
        let (main_after, side_after) = (after(&o.main), after(&o.side));
        let avail =
            |v: &[Outcome]| v.iter().filter(|x| x.ok).count() as f64 / v.len().max(1) as f64;
        let mut all_after = main_after.clone();
        all_after.extend(side_after.iter().cloned());
        let errors = errors_json(&all_after);
        table.row(vec![
            label.clone(),
            format!("{} / {:.0}", o.normal.stats.max_in_flight, normal_rate),
            format!("{} / {:.0}", o.trip.stats.max_in_flight, o.trip.peak_rate()),
            format!("{multiple:.1}x"),
            o.trip.refused().to_string(),
            format!("{} / {}", pct(avail(&main_after)), pct(avail(&side_after))),
            errors
                .as_object()
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| format!("{k}: {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default(),
        ]);
        let l = if guarded { "with" } else { "without" };
        res.checks.push(super::Check::new(
            format!("{l}: every request accounted for"),
            o.complete,
            format!("{} main, {} side outcomes", o.main.len(), o.side.len()),
        ));
        let before = |v: &[Outcome]| -> Vec<Outcome> {
            v.iter()
                .filter(|x| x.at < normal_s * 0.9)
                .cloned()
                .collect()
        };
        let mut normal_outcomes = before(&o.main);
        normal_outcomes.extend(before(&o.side));
        res.checks.push(check_errors(
            &format!("{l}: normal phase"),
            &normal_outcomes,
            &[],
        ));
        let mut all = o.main.clone();
        all.extend(o.side.iter().cloned());
        res.checks.push(check_errors(
            &format!("{l}: whole run"),
            &all,
            &["UNAVAILABLE", "RESOURCE_EXHAUSTED"],
        ));
        if guarded {
            res.targets.push(Target {
                target: "the secondary is never pushed past its capacity".into(),
                met: if ctx.quick {
                    None
                } else {
                    Some(o.trip.refused() == 0)
                },
                detail: format!(
                    "{} refusals (529) with the ceiling; peak in flight {} of capacity {}",
                    o.trip.refused(),
                    o.trip.stats.max_in_flight,
                    s.secondary_cap
                ),
            });
        }
        data.push(json!({
            "config": label,
            "secondary_normal": {
                "max_in_flight": o.normal.stats.max_in_flight,
                "arrivals_per_s": normal_rate,
                "refused_529": o.normal.refused(),
            },
            "secondary_after_trip": {
                "max_in_flight": o.trip.stats.max_in_flight,
                "peak_arrivals_per_s": o.trip.peak_rate(),
                "arrivals": o.trip.log.len(),
                "refused_529": o.trip.refused(),
            },
            "peak_load_multiple": multiple,
            "availability_after_trip": {"main": avail(&main_after), "side": avail(&side_after)},
            "errors_after_trip": errors,
        }));
    }
    res.markdown = format!(
        "Primary capacity {} concurrent, secondary {} (30 %); both mocks answer 529/503 beyond \
         it. Streams of 10 tokens 20 ms apart. Route `chat` (primary, then secondary) gets \
         {:.0} requests/s, route `side` (the secondary's own traffic) {:.0}/s. After {:.0} s the \
         primary answers 500 to everything and its breaker opens; {:.0} s more. Peak arrivals \
         over {WINDOW_MS:.0} ms windows; the mock's in-flight count never exceeds its capacity \
         (beyond it, it refuses).\n\n{}",
        s.primary_cap,
        s.secondary_cap,
        s.main_rate,
        s.side_rate,
        normal_s,
        s.trip.as_secs_f64(),
        table.render()
    );
    res.data = json!({
        "primary_capacity": s.primary_cap, "secondary_capacity": s.secondary_cap,
        "failover_ceiling": s.failover_ceiling, "main_rate": s.main_rate,
        "side_rate": s.side_rate, "runs": data,
    });
    primary.stop().await;
    secondary.stop().await;
    Ok(res)
}
