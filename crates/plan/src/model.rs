//! The capacity arithmetic of `switchyard plan`, pure: measured rates and
//! durations plus the config in, per-route rows out. Concurrency is Little's
//! law (`L = rate x mean attempt duration`); traffic a down target served moves
//! to the next live target of its route as failover traffic; the peak adds the
//! retries the route's budget allows. No I/O, no clock: sources fill
//! [`Observed`], the report prints [`Plan`].

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use switchyard::config::Config;

/// A row is `tight` when its peak uses more than this share of a ceiling.
pub const TIGHT: f64 = 0.8;
/// Suggested ceilings leave this much room above the peak (Little's law gives
/// the mean concurrency; the instantaneous one fluctuates around it).
pub const MARGIN: f64 = 1.25;

/// `(provider, model)`.
pub type TargetKey = (String, String);

/// What a source measured over its window, per Switchyard replica.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Observed {
    /// Length of the measurement window in seconds.
    pub window_secs: f64,
    /// Replicas the figures were divided over (1 for one admin listener).
    pub replicas: f64,
    /// Requests answered by a route's live targets per second, by `(route, provider)`.
    pub served: BTreeMap<(String, String), f64>,
    /// Requests shed per second, by `(route, reason)`.
    pub shed: BTreeMap<(String, String), f64>,
    /// Mean upstream attempt duration in seconds, by target.
    pub duration: BTreeMap<TargetKey, f64>,
    /// Upstream attempts per second, by target.
    pub attempts: BTreeMap<TargetKey, f64>,
    /// Attempts the upstream answered with a rate limit (429), per second, by target.
    pub rate_limited: BTreeMap<TargetKey, f64>,
    /// Breaker phase now (`closed`, `open`, ...), by target, when known.
    pub breakers: BTreeMap<TargetKey, String>,
    /// Requests a minute the upstream allows each provider's keys together
    /// (`switchyard_key_window_limit{kind="requests"}`: learned from its
    /// rate-limit headers, or configured), fleet-wide.
    pub upstream_rpm: BTreeMap<String, f64>,
}

/// A provider's ceilings, from the config.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Ceilings {
    pub max_concurrency: u32,
    pub failover_max_concurrency: u32,
    /// Requests a minute its keys may send together (`rpm`), fleet-wide.
    pub rpm: Option<u32>,
}

/// A route as the plan needs it, from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteShape {
    pub name: String,
    /// Targets in the route's order (the first is the primary).
    pub targets: Vec<TargetKey>,
    pub max_attempts: u32,
}

/// Everything the plan reads from the config.
#[derive(Debug, Clone, PartialEq)]
pub struct Topology {
    pub routes: Vec<RouteShape>,
    pub ceilings: BTreeMap<String, Ceilings>,
    /// `retry_budget.ratio`: retries and failovers per first attempt.
    pub budget_ratio: f64,
    /// `retry_budget.min_per_sec`: the budget's floor.
    pub budget_floor_per_sec: f64,
}

impl Topology {
    pub fn from_config(config: &Config) -> Topology {
        let split = |t: &str| {
            let (p, m) = t.split_once('/').unwrap_or((t, ""));
            (p.to_string(), m.to_string())
        };
        Topology {
            routes: config
                .routes
                .iter()
                .map(|r| RouteShape {
                    name: r.name.clone(),
                    targets: r.targets.iter().map(|t| split(&t.target)).collect(),
                    max_attempts: r.max_attempts,
                })
                .collect(),
            ceilings: config
                .providers
                .iter()
                .map(|p| {
                    (
                        p.id.clone(),
                        Ceilings {
                            max_concurrency: p.max_concurrency,
                            failover_max_concurrency: p.failover_max_concurrency,
                            rpm: configured_rpm(p),
                        },
                    )
                })
                .collect(),
            budget_ratio: config.retry_budget.ratio,
            budget_floor_per_sec: config.retry_budget.min_per_sec,
        }
    }
}

/// A provider's configured requests a minute, all its keys together (a key
/// without its own `rpm` has the provider's); `None` when one is unbounded.
fn configured_rpm(p: &switchyard::config::ProviderConfig) -> Option<u32> {
    let rpm = match &p.keys {
        Some(keys) => keys.iter().map(|k| k.rpm.or(p.rpm)).sum::<Option<u64>>()?,
        None => p.rpm?,
    };
    Some(u32::try_from(rpm).unwrap_or(u32::MAX))
}

/// How one ceiling fares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The peak stays under [`TIGHT`] of the ceiling.
    Ok,
    /// The peak fits, with less than `1 - TIGHT` of the ceiling to spare.
    Tight,
    /// The peak (or the burst) is above the ceiling: traffic would be shed.
    Exceeded,
}

impl Verdict {
    fn of(peak: f64, ceiling: u32) -> Verdict {
        let c = f64::from(ceiling);
        if peak > c {
            Verdict::Exceeded
        } else if peak > TIGHT * c {
            Verdict::Tight
        } else {
            Verdict::Ok
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Tight => "tight",
            Verdict::Exceeded => "EXCEEDED",
        }
    }
}

/// One ceiling against the load the scenario puts on it (provider-wide).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CeilingCheck {
    /// Mean concurrency with the scenario's traffic moved.
    pub burst: f64,
    /// `burst x (1 + retry multiplier)`.
    pub peak: f64,
    pub ceiling: u32,
    /// `ceiling - peak` (negative when exceeded).
    pub headroom: f64,
    pub verdict: Verdict,
}

impl CeilingCheck {
    fn new(burst: f64, peak: f64, ceiling: u32) -> CeilingCheck {
        CeilingCheck {
            burst,
            peak,
            ceiling,
            headroom: f64::from(ceiling) - peak,
            verdict: Verdict::of(peak, ceiling),
        }
    }
}

/// One target of a route under one scenario.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub provider: String,
    pub model: String,
    /// 0 for the route's primary.
    pub position: usize,
    /// Providers assumed down for this row.
    pub down: Vec<String>,
    /// This route's requests the target serves now, per second.
    pub rate_per_sec: f64,
    /// This route's requests it would serve in the scenario, per second.
    pub rate_after_per_sec: f64,
    /// Mean upstream attempt duration in ms (`None`: never measured anywhere on the route).
    pub mean_duration_ms: Option<f64>,
    /// True when the duration is the route's mean, not this target's own.
    pub duration_estimated: bool,
    /// This route's concurrency on the target now.
    pub concurrency_now: f64,
    /// Concurrency the scenario moves onto the target from this route.
    pub moved_concurrency: f64,
    /// The provider's failover ceiling against its failover traffic, all routes.
    pub failover: CeilingCheck,
    /// The provider's total ceiling against all its traffic, all routes.
    pub total: CeilingCheck,
    /// The upstream's own request limit, a minute, fleet-wide (the stricter
    /// of configured `rpm` and the windows it reports) against the
    /// provider's requests a minute in the scenario, all routes and
    /// replicas; `None` when nothing says the upstream's limit.
    pub upstream: Option<CeilingCheck>,
    /// Upstream 429s per second in the window (the upstream's own limit showing).
    pub upstream_429_per_sec: f64,
    pub breaker: Option<String>,
    pub suggestions: Vec<String>,
}

impl Row {
    pub fn exceeded(&self) -> bool {
        self.failover.verdict == Verdict::Exceeded
            || self.total.verdict == Verdict::Exceeded
            || self
                .upstream
                .is_some_and(|u| u.verdict == Verdict::Exceeded)
    }
}

/// One route's table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoutePlan {
    pub name: String,
    /// Requests per second: answered by live targets plus shed.
    pub demand_per_sec: f64,
    pub shed_per_sec: f64,
    /// The most retries and failovers per request the budget allows:
    /// `min(max_attempts - 1, ratio + min_per_sec / demand)`.
    pub retry_multiplier: f64,
    /// One row per target that is live in its scenario.
    pub rows: Vec<Row>,
}

/// The whole answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Plan {
    pub window_secs: f64,
    pub replicas: f64,
    /// Upstream attempts per answered request minus one, all routes together.
    pub measured_retry_multiplier: f64,
    /// The `--what-if` providers, when given (then every row uses them).
    pub what_if: Vec<String>,
    pub routes: Vec<RoutePlan>,
    /// Some ceiling would be exceeded (exit code 1).
    pub exceeded: bool,
}

/// Mean concurrency per provider, split by traffic class, with the peak of each.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ProviderLoad {
    own: f64,
    own_peak: f64,
    failover: f64,
    failover_peak: f64,
    /// Requests a second, and with the retries the budgets allow.
    rate: f64,
    rate_peak: f64,
}

/// One route's traffic under a scenario: per target position, the rate now,
/// the rate after moving, and the mean duration used.
struct RouteFlow {
    now: Vec<f64>,
    after: Vec<f64>,
    duration: Vec<Option<(f64, bool)>>,
}

fn route_demand(route: &RouteShape, obs: &Observed) -> (f64, f64) {
    let served: f64 = distinct_providers(route)
        .iter()
        .map(|p| {
            obs.served
                .get(&(route.name.clone(), p.clone()))
                .copied()
                .unwrap_or(0.0)
        })
        .sum();
    // A fold from +0.0: an empty `sum` of floats is -0.0.
    let shed: f64 = obs
        .shed
        .iter()
        .filter(|((r, _), _)| *r == route.name)
        .fold(0.0, |acc, (_, v)| acc + v);
    (served + shed, shed)
}

fn distinct_providers(route: &RouteShape) -> Vec<String> {
    let mut seen = BTreeSet::new();
    route
        .targets
        .iter()
        .filter(|(p, _)| seen.insert(p.clone()))
        .map(|(p, _)| p.clone())
        .collect()
}

/// `min(max_attempts - 1, ratio + floor / demand)`; 0 without demand.
pub fn retry_multiplier(topo: &Topology, route: &RouteShape, demand: f64) -> f64 {
    if demand <= 0.0 {
        return 0.0;
    }
    let cap = f64::from(route.max_attempts.saturating_sub(1));
    (topo.budget_ratio + topo.budget_floor_per_sec / demand).min(cap)
}

fn flow(route: &RouteShape, obs: &Observed, down: &BTreeSet<String>) -> RouteFlow {
    // Served counters carry the provider, not the model: a provider listed
    // twice in one route is credited to its first position.
    let mut credited = BTreeSet::new();
    let now: Vec<f64> = route
        .targets
        .iter()
        .map(|(p, _)| {
            if credited.insert(p.clone()) {
                obs.served
                    .get(&(route.name.clone(), p.clone()))
                    .copied()
                    .unwrap_or(0.0)
            } else {
                0.0
            }
        })
        .collect();
    let mut after = now.clone();
    let mut carried = 0.0;
    for (i, (p, _)) in route.targets.iter().enumerate() {
        if down.contains(p) {
            carried += after[i];
            after[i] = 0.0;
        } else {
            after[i] += carried;
            carried = 0.0;
        }
    }
    // The route's own mean duration, weighted by rate, for targets never measured.
    let (mut weighted, mut rate) = (0.0, 0.0);
    for (t, r) in route.targets.iter().zip(&now) {
        if let Some(d) = obs.duration.get(t) {
            weighted += d * r;
            rate += r;
        }
    }
    let route_mean = if rate > 0.0 {
        Some(weighted / rate)
    } else {
        route
            .targets
            .iter()
            .find_map(|t| obs.duration.get(t).copied())
    };
    let duration = route
        .targets
        .iter()
        .map(|t| match obs.duration.get(t) {
            Some(d) => Some((*d, false)),
            None => route_mean.map(|d| (d, true)),
        })
        .collect();
    RouteFlow {
        now,
        after,
        duration,
    }
}

fn provider_loads(
    topo: &Topology,
    obs: &Observed,
    down: &BTreeSet<String>,
) -> BTreeMap<String, ProviderLoad> {
    let mut loads: BTreeMap<String, ProviderLoad> = BTreeMap::new();
    for route in &topo.routes {
        let (demand, _) = route_demand(route, obs);
        let m = retry_multiplier(topo, route, demand);
        let f = flow(route, obs, down);
        for (i, (p, _)) in route.targets.iter().enumerate() {
            let load = loads.entry(p.clone()).or_default();
            load.rate += f.after[i];
            load.rate_peak += f.after[i] * (1.0 + m);
            let Some((w, _)) = f.duration[i] else {
                continue;
            };
            let l = f.after[i] * w;
            if i == 0 {
                load.own += l;
                load.own_peak += l * (1.0 + m);
            } else {
                load.failover += l;
                load.failover_peak += l * (1.0 + m);
            }
        }
    }
    loads
}

fn ceil(x: f64) -> u32 {
    x.ceil().clamp(1.0, f64::from(u32::MAX)) as u32
}

fn suggest(provider: &str, c: &Ceilings, row: &Row, load: &ProviderLoad) -> Vec<String> {
    let mut out = Vec::new();
    let limited = row.upstream_429_per_sec > 0.0;
    if row.total.verdict != Verdict::Ok {
        let want = ceil(row.total.peak * MARGIN);
        if limited {
            out.push(format!(
                "providers.{provider}: the upstream answered 429 ({:.2}/s) at the current load: \
                 its own limit is near it, so raise the upstream quota (or add a target) before \
                 max_concurrency",
                row.upstream_429_per_sec
            ));
        } else {
            out.push(format!(
                "providers.{provider}.max_concurrency = {} -> {want} if the upstream can serve \
                 that much",
                c.max_concurrency
            ));
        }
        let spare = f64::from(c.max_concurrency) - load.own_peak;
        if row.total.verdict == Verdict::Exceeded && spare >= 1.0 {
            let keep = spare.floor() as u32;
            if keep < c.failover_max_concurrency {
                out.push(format!(
                    "or providers.{provider}.failover_max_concurrency = {} -> {keep}, so failover \
                     traffic cannot crowd out the provider's own",
                    c.failover_max_concurrency
                ));
            }
        }
    }
    if let Some(u) = row.upstream.filter(|u| u.verdict != Verdict::Ok) {
        out.push(format!(
            "providers.{provider}: the upstream allows {} requests a minute (its rate-limit \
             headers, or rpm) and the scenario asks up to {:.0}: add a key (keys = [...]) or \
             a target before traffic waits or gets RATE_LIMITED",
            u.ceiling, u.peak
        ));
    }
    if row.failover.verdict != Verdict::Ok {
        let want = ceil(row.failover.peak * MARGIN).min(c.max_concurrency);
        let room = row.total.verdict == Verdict::Ok && !limited;
        if want > c.failover_max_concurrency {
            out.push(format!(
                "providers.{provider}.failover_max_concurrency = {} -> {want}{}",
                c.failover_max_concurrency,
                if room && row.failover.verdict == Verdict::Exceeded {
                    ": it sheds failover traffic the provider's total ceiling has room for"
                } else {
                    ""
                }
            ));
        }
    }
    out
}

/// The row for route target `position` with `down` providers.
fn row(
    topo: &Topology,
    obs: &Observed,
    route: &RouteShape,
    position: usize,
    down: &BTreeSet<String>,
) -> Option<Row> {
    let (provider, model) = &route.targets[position];
    if down.contains(provider) {
        return None;
    }
    let c = topo.ceilings.get(provider)?;
    let f = flow(route, obs, down);
    let load = provider_loads(topo, obs, down)
        .get(provider)
        .copied()
        .unwrap_or_default();
    let duration = f.duration[position];
    let w = duration.map_or(0.0, |(w, _)| w);
    let key = (provider.clone(), model.clone());
    let mut r = Row {
        provider: provider.clone(),
        model: model.clone(),
        position,
        down: down.iter().cloned().collect(),
        rate_per_sec: f.now[position],
        rate_after_per_sec: f.after[position],
        mean_duration_ms: duration.map(|(w, _)| w * 1000.0),
        duration_estimated: duration.is_some_and(|(_, est)| est),
        concurrency_now: f.now[position] * w,
        moved_concurrency: (f.after[position] - f.now[position]) * w,
        failover: CeilingCheck::new(
            load.failover,
            load.failover_peak,
            c.failover_max_concurrency,
        ),
        total: CeilingCheck::new(
            load.own + load.failover,
            load.own_peak + load.failover_peak,
            c.max_concurrency,
        ),
        upstream: upstream_ceiling(c, obs.upstream_rpm.get(provider).copied()).map(|rpm| {
            let per_min = 60.0 * obs.replicas.max(1.0);
            CeilingCheck::new(load.rate * per_min, load.rate_peak * per_min, rpm)
        }),
        upstream_429_per_sec: obs.rate_limited.get(&key).copied().unwrap_or(0.0),
        breaker: obs.breakers.get(&key).cloned(),
        suggestions: Vec::new(),
    };
    r.suggestions = suggest(provider, c, &r, &load);
    Some(r)
}

/// The stricter of the configured `rpm` and the one the upstream reports.
fn upstream_ceiling(c: &Ceilings, learned: Option<f64>) -> Option<u32> {
    let learned = learned
        .filter(|r| r.is_finite() && *r > 0.0)
        .map(|r| r.min(f64::from(u32::MAX)) as u32);
    match (c.rpm, learned) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Upstream attempts per answered request, minus one (0 without traffic).
pub fn measured_retry_multiplier(obs: &Observed) -> f64 {
    let served: f64 = obs.served.values().sum();
    let attempts: f64 = obs.attempts.values().sum();
    if served <= 0.0 {
        return 0.0;
    }
    (attempts / served - 1.0).max(0.0)
}

/// The plan. Without `what_if`, every target is checked with every earlier
/// target of its route down (the primary with none); with it, every live
/// target with exactly those providers down.
pub fn plan(topo: &Topology, obs: &Observed, what_if: &BTreeSet<String>) -> Plan {
    let routes: Vec<RoutePlan> = topo
        .routes
        .iter()
        .map(|route| {
            let (demand, shed) = route_demand(route, obs);
            let rows = (0..route.targets.len())
                .filter_map(|i| {
                    let down = if what_if.is_empty() {
                        route.targets[..i].iter().map(|(p, _)| p.clone()).collect()
                    } else {
                        what_if.clone()
                    };
                    row(topo, obs, route, i, &down)
                })
                .collect();
            RoutePlan {
                name: route.name.clone(),
                demand_per_sec: demand,
                shed_per_sec: shed,
                retry_multiplier: retry_multiplier(topo, route, demand),
                rows,
            }
        })
        .collect();
    let exceeded = routes.iter().flat_map(|r| &r.rows).any(Row::exceeded);
    Plan {
        window_secs: obs.window_secs,
        replicas: obs.replicas,
        measured_retry_multiplier: measured_retry_multiplier(obs),
        what_if: what_if.iter().cloned().collect(),
        routes,
        exceeded,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn key(p: &str, m: &str) -> TargetKey {
        (p.to_string(), m.to_string())
    }

    fn topo(failover_ceiling: u32) -> Topology {
        Topology {
            routes: vec![
                RouteShape {
                    name: "chat".into(),
                    targets: vec![key("a", "m"), key("b", "m")],
                    max_attempts: 3,
                },
                RouteShape {
                    name: "side".into(),
                    targets: vec![key("b", "m")],
                    max_attempts: 3,
                },
            ],
            ceilings: [
                (
                    "a".to_string(),
                    Ceilings {
                        max_concurrency: 64,
                        failover_max_concurrency: 16,
                        rpm: None,
                    },
                ),
                (
                    "b".to_string(),
                    Ceilings {
                        max_concurrency: 20,
                        failover_max_concurrency: failover_ceiling,
                        rpm: None,
                    },
                ),
            ]
            .into(),
            budget_ratio: 0.1,
            budget_floor_per_sec: 1.0,
        }
    }

    /// Route `chat`: 50/s on `a` at 200 ms (L = 10); route `side`: 10/s on
    /// `b` at 300 ms (L = 3).
    fn observed() -> Observed {
        Observed {
            window_secs: 60.0,
            replicas: 1.0,
            served: [
                (("chat".into(), "a".into()), 50.0),
                (("side".into(), "b".into()), 10.0),
            ]
            .into(),
            duration: [(key("a", "m"), 0.2), (key("b", "m"), 0.3)].into(),
            attempts: [(key("a", "m"), 55.0), (key("b", "m"), 10.0)].into(),
            ..Default::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn the_budget_bounds_the_retry_multiplier() {
        let t = topo(16);
        let chat = &t.routes[0];
        // 0.1 + 1.0 / 50
        assert!(close(retry_multiplier(&t, chat, 50.0), 0.12));
        // 0.1 + 1.0 / 0.5 = 2.1, capped by max_attempts - 1 = 2
        assert!(close(retry_multiplier(&t, chat, 0.5), 2.0));
        assert!(close(retry_multiplier(&t, chat, 0.0), 0.0));
    }

    #[test]
    fn a_down_primary_moves_its_rate_at_the_secondarys_duration() {
        let p = plan(&topo(16), &observed(), &BTreeSet::new());
        let chat = &p.routes[0];
        assert!(close(chat.demand_per_sec, 50.0));
        let primary = &chat.rows[0];
        assert!(primary.down.is_empty());
        assert!(close(primary.concurrency_now, 10.0));
        // a's own traffic: 10 x (1 + 0.12)
        assert!(close(primary.total.peak, 11.2));
        assert_eq!(primary.total.verdict, Verdict::Ok);

        let secondary = &chat.rows[1];
        assert_eq!(secondary.down, vec!["a".to_string()]);
        assert!(close(secondary.rate_after_per_sec, 50.0));
        // 50/s at b's 300 ms
        assert!(close(secondary.moved_concurrency, 15.0));
        assert!(close(secondary.failover.burst, 15.0));
        assert!(close(secondary.failover.peak, 15.0 * 1.12));
        // b's own 3 (route side: 0.1 + 1/10 = 0.2) plus the failover
        assert!(close(secondary.total.burst, 18.0));
        assert!(close(secondary.total.peak, 3.0 * 1.2 + 15.0 * 1.12));
        assert!(close(secondary.total.headroom, 20.0 - 20.4));
        assert_eq!(secondary.failover.verdict, Verdict::Exceeded);
        assert_eq!(secondary.total.verdict, Verdict::Exceeded);
        assert!(p.exceeded);
    }

    #[test]
    fn a_failover_ceiling_under_a_roomy_total_is_flagged_as_shedding() {
        let mut t = topo(4);
        t.ceilings.get_mut("b").unwrap().max_concurrency = 64;
        let p = plan(&t, &observed(), &BTreeSet::new());
        let secondary = &p.routes[0].rows[1];
        assert_eq!(secondary.failover.verdict, Verdict::Exceeded);
        assert_eq!(secondary.total.verdict, Verdict::Ok);
        // ceil(16.8 x 1.25) = 21
        assert_eq!(
            secondary.suggestions,
            vec![
                "providers.b.failover_max_concurrency = 4 -> 21: it sheds failover traffic the \
                 provider's total ceiling has room for"
                    .to_string()
            ]
        );
    }

    #[test]
    fn a_full_total_suggests_both_ways_out() {
        let p = plan(&topo(16), &observed(), &BTreeSet::new());
        let s = &p.routes[0].rows[1].suggestions;
        // ceil(20.4 x 1.25) = 26; room for failover: 20 - 3.6 = 16.4 -> 16, not below 16
        assert_eq!(
            s[0],
            "providers.b.max_concurrency = 20 -> 26 if the upstream can serve that much"
        );
        // failover_max_concurrency 16 -> ceil(16.8 x 1.25) = 21, capped by max 20
        assert_eq!(s[1], "providers.b.failover_max_concurrency = 16 -> 20");
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn upstream_429s_turn_the_suggestion_to_the_quota() {
        let mut o = observed();
        o.rate_limited.insert(key("b", "m"), 0.5);
        let p = plan(&topo(16), &o, &BTreeSet::new());
        let s = &p.routes[0].rows[1].suggestions;
        assert!(s[0].contains("answered 429 (0.50/s)"), "{s:?}");
        assert!(!s.iter().any(|x| x.contains("max_concurrency = 20 ->")));
    }

    #[test]
    fn comfortable_ceilings_are_ok_and_suggest_nothing() {
        let mut t = topo(64);
        t.ceilings.get_mut("b").unwrap().max_concurrency = 64;
        let p = plan(&t, &observed(), &BTreeSet::new());
        assert!(!p.exceeded);
        for r in p.routes.iter().flat_map(|r| &r.rows) {
            assert_eq!(r.failover.verdict, Verdict::Ok, "{r:?}");
            assert_eq!(r.total.verdict, Verdict::Ok, "{r:?}");
            assert!(r.suggestions.is_empty());
        }
    }

    #[test]
    fn what_if_applies_one_scenario_to_every_route() {
        let what_if: BTreeSet<String> = ["b".to_string()].into();
        let p = plan(&topo(16), &observed(), &what_if);
        // chat: only a remains, unchanged; side: nothing live, no row.
        assert_eq!(p.routes[0].rows.len(), 1);
        assert!(close(p.routes[0].rows[0].total.burst, 10.0));
        assert!(p.routes[1].rows.is_empty());
        assert!(!p.exceeded);
    }

    #[test]
    fn an_unmeasured_target_borrows_the_routes_mean_duration() {
        let mut o = observed();
        o.duration.remove(&key("b", "m"));
        let p = plan(&topo(64), &o, &BTreeSet::new());
        let secondary = &p.routes[0].rows[1];
        assert!(secondary.duration_estimated);
        assert!(close(secondary.moved_concurrency, 10.0));
    }

    #[test]
    fn traffic_skips_every_down_target_in_order() {
        let route = RouteShape {
            name: "r".into(),
            targets: vec![key("a", "m"), key("b", "m"), key("c", "m")],
            max_attempts: 3,
        };
        let mut o = Observed::default();
        o.served.insert(("r".into(), "a".into()), 8.0);
        o.served.insert(("r".into(), "b".into()), 2.0);
        let down: BTreeSet<String> = ["a".to_string(), "b".to_string()].into();
        let f = flow(&route, &o, &down);
        assert_eq!(f.after, vec![0.0, 0.0, 10.0]);
    }

    #[test]
    fn measured_multiplier_is_attempts_per_answer() {
        assert!(close(
            measured_retry_multiplier(&observed()),
            65.0 / 60.0 - 1.0
        ));
        assert!(close(measured_retry_multiplier(&Observed::default()), 0.0));
    }

    #[test]
    fn the_upstreams_request_limit_is_a_ceiling_learned_or_configured() {
        let mut t = topo(16);
        let mut o = observed();
        let none = BTreeSet::new();
        let a_row = |p: &Plan| p.routes[0].rows[0].clone();
        assert_eq!(
            a_row(&plan(&t, &o, &none)).upstream,
            None,
            "nothing says it"
        );
        // The upstream reports 60 requests a minute for a's keys together.
        o.upstream_rpm.insert("a".into(), 60.0);
        let p = plan(&t, &o, &none);
        let u = a_row(&p).upstream.unwrap();
        assert_eq!(u.ceiling, 60);
        assert!(u.peak > 60.0, "{u:?}");
        assert_eq!(u.verdict, Verdict::Exceeded);
        assert!(p.exceeded);
        assert!(a_row(&p)
            .suggestions
            .iter()
            .any(|s| s.contains("the upstream allows 60 requests a minute")));
        // A configured rpm stricter than what is reported wins.
        t.ceilings.get_mut("a").unwrap().rpm = Some(30);
        assert_eq!(a_row(&plan(&t, &o, &none)).upstream.unwrap().ceiling, 30);
        // Room to spare: no verdict against it.
        o.upstream_rpm.insert("a".into(), 1_000_000.0);
        t.ceilings.get_mut("a").unwrap().rpm = None;
        assert_eq!(
            a_row(&plan(&t, &o, &none)).upstream.unwrap().verdict,
            Verdict::Ok
        );
    }
}
