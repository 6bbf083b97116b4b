//! Plain-text rendering of a [`Plan`]: a header with the window and the
//! retry multipliers, one table per route (rate, duration, concurrency now and
//! moved, each ceiling's burst, peak and headroom), the suggestions, and the
//! verdict. Formatting only; the numbers come from `model`.

use switchyard_drill::report::table;

use super::model::{CeilingCheck, Plan, RoutePlan, Row, Verdict};

fn num(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

fn check(c: &CeilingCheck) -> [String; 2] {
    [
        format!("{} / {} / {}", num(c.burst), num(c.peak), c.ceiling),
        num(c.headroom),
    ]
}

fn verdict(r: &Row) -> &'static str {
    let worst = [r.failover.verdict, r.total.verdict]
        .into_iter()
        .chain(r.upstream.map(|u| u.verdict))
        .max_by_key(|v| match v {
            Verdict::Ok => 0,
            Verdict::Tight => 1,
            Verdict::Exceeded => 2,
        })
        .unwrap_or(Verdict::Ok);
    worst.as_str()
}

fn row_cells(r: &Row) -> Vec<String> {
    let [fo, fo_head] = check(&r.failover);
    let [tot, tot_head] = check(&r.total);
    vec![
        format!("{}/{}", r.provider, r.model),
        if r.down.is_empty() {
            "-".into()
        } else {
            r.down.join(",")
        },
        r.breaker.clone().unwrap_or_else(|| "?".into()),
        format!("{} -> {}", num(r.rate_per_sec), num(r.rate_after_per_sec)),
        match r.mean_duration_ms {
            Some(ms) if r.duration_estimated => format!("{ms:.0}*"),
            Some(ms) => format!("{ms:.0}"),
            None => "?".into(),
        },
        num(r.concurrency_now),
        num(r.moved_concurrency),
        fo,
        fo_head,
        tot,
        tot_head,
        r.upstream.map_or_else(
            || "-".into(),
            |u| format!("{} / {}", num(u.peak), u.ceiling),
        ),
        if r.upstream_429_per_sec > 0.0 {
            num(r.upstream_429_per_sec)
        } else {
            "-".into()
        },
        verdict(r).into(),
    ]
}

const HEADER: &[&str] = &[
    "target",
    "down",
    "breaker",
    "req/s now -> after",
    "ms",
    "conc now",
    "+moved",
    "failover burst / peak / ceiling",
    "headroom",
    "total burst / peak / ceiling",
    "headroom",
    "upstream req/min peak / limit",
    "429/s",
    "verdict",
];

fn route(r: &RoutePlan) -> String {
    let mut out = format!(
        "route {}: {} req/s ({} shed/s); retry multiplier bound {}\n",
        r.name,
        num(r.demand_per_sec),
        num(r.shed_per_sec),
        num(r.retry_multiplier)
    );
    let rows: Vec<Vec<String>> = r.rows.iter().map(row_cells).collect();
    out.push_str(&table(HEADER, &rows));
    for row in &r.rows {
        for s in &row.suggestions {
            out.push_str(&format!("  suggest: {s}\n"));
        }
    }
    out
}

/// The whole report.
pub fn text(plan: &Plan, source: &str) -> String {
    let mut out = format!(
        "switchyard plan: {source}, window {:.1} s, per replica ({} reporting); measured retry \
         multiplier {} (upstream attempts per answer - 1)\n",
        plan.window_secs,
        plan.replicas,
        num(plan.measured_retry_multiplier)
    );
    out.push_str(if plan.what_if.is_empty() {
        "each target with every earlier target of its route down; the primary as it runs now\n"
    } else {
        "what if down: "
    });
    if !plan.what_if.is_empty() {
        out.push_str(&format!("{}\n", plan.what_if.join(", ")));
    }
    out.push_str(
        "concurrency is mean in flight (rate x mean attempt duration; * = the route's mean); \
         burst and peak are provider-wide; peak = burst x (1 + the route's retry multiplier bound)\n",
    );
    for r in &plan.routes {
        out.push('\n');
        out.push_str(&route(r));
    }
    let exceeded = plan
        .routes
        .iter()
        .flat_map(|r| &r.rows)
        .filter(|r| r.exceeded())
        .count();
    out.push_str(&if exceeded == 0 {
        "\nplan: every ceiling fits\n".to_string()
    } else {
        format!("\nplan: EXCEEDED: {exceeded} row(s) put a ceiling over its limit\n")
    });
    out
}
