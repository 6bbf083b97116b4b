//! `switchyard plan` against the real binary after scripted traffic: a
//! closed loop of callers on two routes, then `plan --admin` reads the
//! running router. The route whose secondary's failover ceiling is 1 is
//! flagged with numbers the test checks against its own measurement and the
//! formula; the roomy route is not; exit codes 0, 1 and 2.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{provider, request, route, stream, Mock, Switchyard, BIN};
use serde_json::Value;

/// Callers kept busy on route `tight` (primary `pa`, secondary `pb` with a
/// failover ceiling of 1) and on `roomy` (`pc`, then `pd` with 64).
const TIGHT_CALLERS: usize = 4;
const ROOMY_CALLERS: usize = 2;

fn with_ceilings(block: String, max: u32, failover: u32) -> String {
    block.replace(
        "  [[providers.models]]",
        &format!("max_concurrency = {max}\nfailover_max_concurrency = {failover}\n  [[providers.models]]"),
    )
}

fn config(mock: &Mock) -> String {
    let url = mock.base_url();
    let p = |id: &str, max: u32, failover: u32| {
        with_ceilings(provider(id, "openai", &url, "m"), max, failover)
    };
    format!(
        "{}{}{}{}{}{}",
        p("pa", 64, 16),
        p("pb", 64, 1),
        p("pc", 64, 16),
        p("pd", 64, 64),
        route("tight", &["pa/m", "pb/m"]),
        route("roomy", &["pc/m", "pd/m"]),
    )
}

/// Completed requests per route while the callers run.
struct Traffic {
    stop: Arc<AtomicBool>,
    done: Vec<(String, Arc<AtomicU64>)>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Traffic {
    async fn start(sy: &Switchyard, routes: &[(&str, usize)]) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let mut done = Vec::new();
        let mut tasks = Vec::new();
        for (name, callers) in routes {
            let count = Arc::new(AtomicU64::new(0));
            done.push((name.to_string(), count.clone()));
            for _ in 0..*callers {
                let mut client = sy.client().await;
                let (stop, count, name) = (stop.clone(), count.clone(), name.to_string());
                tasks.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let got = stream(&mut client, request(&name)).await;
                        assert!(got.finished.is_some(), "{name}: {:?}", got.status);
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
        Traffic { stop, done, tasks }
    }

    fn count(&self, route: &str) -> u64 {
        self.done
            .iter()
            .find(|(n, _)| n == route)
            .map_or(0, |(_, c)| c.load(Ordering::Relaxed))
    }

    async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

async fn plan(args: &[&str]) -> Run {
    let out = tokio::process::Command::new(BIN)
        .arg("plan")
        .args(args)
        .output()
        .await
        .expect("run switchyard plan");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn json(run: &Run) -> Value {
    serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", run.stdout, run.stderr))
}

/// The element of `parent[list]` whose `key` is `value`.
fn find<'a>(parent: &'a Value, list: &str, key: &str, value: &str) -> &'a Value {
    parent[list]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r[key] == value)
        .unwrap_or_else(|| panic!("no {list} with {key} {value}: {parent:#}"))
}

fn route_plan<'a>(plan: &'a Value, name: &str) -> &'a Value {
    find(plan, "routes", "name", name)
}

fn row<'a>(route: &'a Value, provider: &str) -> &'a Value {
    find(route, "rows", "provider", provider)
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        "{what}: {a} != {b}"
    );
}

/// `min(max_attempts - 1, ratio + min_per_sec / demand)` with the defaults 3, 0.1 and 1.0/s.
fn budget_multiplier(demand: f64) -> f64 {
    (0.1 + 1.0 / demand).min(2.0)
}

/// The mock, the router on both routes, and the callers, warmed up for a second.
async fn busy_router() -> (Mock, Switchyard, Traffic) {
    // ~200 ms per answer: 5 tokens, 40 ms apart.
    let mock = Mock::start("openai", &["--tokens", "5", "--token-delay-ms", "40"]).await;
    let sy = Switchyard::start(&config(&mock)).await;
    let traffic = Traffic::start(&sy, &[("tight", TIGHT_CALLERS), ("roomy", ROOMY_CALLERS)]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    (mock, sy, traffic)
}

/// The tight route's primary row against the callers' own count: its rate
/// within `tolerance`, and Little's law: four closed-loop callers keep about
/// four in flight (a little less: the caller's share of each request is
/// outside the attempt; a request per caller more or less falls in the
/// window). Returns the rate and the concurrency.
fn primary_matches_the_callers(primary: &Value, measured: f64, tolerance: f64) -> (f64, f64) {
    let rate = f(&primary["rate_per_sec"]);
    assert!(
        (rate - measured).abs() <= tolerance * measured,
        "plan says {rate}/s, the callers completed {measured}/s"
    );
    let l = f(&primary["concurrency_now"]);
    assert!(
        (0.6 * TIGHT_CALLERS as f64..=1.15 * TIGHT_CALLERS as f64).contains(&l),
        "primary concurrency {l}"
    );
    (rate, l)
}

/// Every row of the route fits both ceilings and suggests nothing.
fn fits(route: &Value) {
    for r in route["rows"].as_array().unwrap() {
        assert_eq!(r["failover"]["verdict"], "ok", "{r:#}");
        assert_eq!(r["total"]["verdict"], "ok", "{r:#}");
        assert_eq!(r["suggestions"], serde_json::json!([]), "{r:#}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_flags_the_low_failover_ceiling_with_its_numbers_and_passes_the_roomy_route() {
    let (_mock, sy, traffic) = busy_router().await;
    let file = sy.config_file.as_ref().unwrap().path().to_str().unwrap();

    let (before, t0) = (traffic.count("tight"), Instant::now());
    let flagged = plan(&[
        "--config", file, "--admin", &sy.admin, "--window", "3s", "--json",
    ])
    .await;
    let measured_rate = (traffic.count("tight") - before) as f64 / t0.elapsed().as_secs_f64();
    assert_eq!(flagged.code, 1, "{}\n{}", flagged.stdout, flagged.stderr);
    let p = json(&flagged);
    assert_eq!(p["exceeded"], true);
    println!("{}", flagged.stdout);

    let tight = route_plan(&p, "tight");
    let primary = row(tight, "pa");
    let secondary = row(tight, "pb");
    // Same traffic, windows a few hundred ms apart.
    let (rate, l) = primary_matches_the_callers(primary, measured_rate, 0.25);
    close(
        l,
        rate * f(&primary["mean_duration_ms"]) / 1000.0,
        "L = rate x W",
    );
    assert_eq!(primary["failover"]["verdict"], "ok");
    assert_eq!(primary["total"]["verdict"], "ok");

    // The secondary with the primary down: all of the route's traffic at the
    // route's mean duration (it never served), against a failover ceiling of 1.
    assert_eq!(secondary["down"], serde_json::json!(["pa"]));
    assert_eq!(secondary["duration_estimated"], true);
    close(f(&secondary["rate_per_sec"]), 0.0, "secondary rate now");
    close(f(&secondary["rate_after_per_sec"]), rate, "moved rate");
    close(f(&secondary["moved_concurrency"]), l, "moved concurrency");
    let burst = f(&secondary["failover"]["burst"]);
    close(burst, l, "failover burst");
    let demand = f(&tight["demand_per_sec"]);
    close(demand, rate, "demand (nothing shed)");
    let m = budget_multiplier(demand);
    close(f(&tight["retry_multiplier"]), m, "retry multiplier bound");
    let peak = f(&secondary["failover"]["peak"]);
    close(peak, burst * (1.0 + m), "peak = burst x (1 + m)");
    assert_eq!(secondary["failover"]["ceiling"], 1);
    close(
        f(&secondary["failover"]["headroom"]),
        1.0 - peak,
        "headroom",
    );
    assert_eq!(secondary["failover"]["verdict"], "exceeded");
    assert_eq!(secondary["total"]["verdict"], "ok");
    let want = (peak * 1.25).ceil() as u64;
    assert_eq!(
        secondary["suggestions"],
        serde_json::json!([format!(
            "providers.pb.failover_max_concurrency = 1 -> {want}: it sheds failover traffic the provider's total ceiling has room for"
        )])
    );

    // The roomy route: the same shape with a ceiling of 64 fits.
    let roomy = route_plan(&p, "roomy");
    let pd = row(roomy, "pd");
    assert!(f(&pd["failover"]["burst"]) > 0.5, "{pd:#}");
    fits(roomy);

    // What if only the roomy primary fails: everything fits, exit 0.
    let fits = plan(&[
        "--config",
        file,
        "--admin",
        &sy.admin,
        "--window",
        "2s",
        "--json",
        "--what-if",
        "pc=down",
    ])
    .await;
    assert_eq!(fits.code, 0, "{}\n{}", fits.stdout, fits.stderr);
    let p = json(&fits);
    assert_eq!(p["what_if"], serde_json::json!(["pc"]));
    let pd = row(route_plan(&p, "roomy"), "pd");
    assert_eq!(pd["down"], serde_json::json!(["pc"]));
    assert!(f(&pd["moved_concurrency"]) > 0.5, "{pd:#}");
    let pb = row(route_plan(&p, "tight"), "pb");
    close(f(&pb["failover"]["burst"]), 0.0, "pb untouched by pc");

    // The text report of the named failure that does not fit.
    let text = plan(&[
        "--config",
        file,
        "--admin",
        &sy.admin,
        "--window",
        "1s",
        "--what-if",
        "pa=down",
    ])
    .await;
    assert_eq!(text.code, 1, "{}\n{}", text.stdout, text.stderr);
    println!("{}", text.stdout);
    assert!(text.stdout.contains("what if down: pa"), "{}", text.stdout);
    assert!(text.stdout.contains("route tight:"), "{}", text.stdout);
    assert!(
        text.stdout
            .contains("suggest: providers.pb.failover_max_concurrency = 1 -> "),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("plan: EXCEEDED: 1 row(s)"),
        "{}",
        text.stdout
    );

    traffic.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_exits_2_when_it_cannot_run() {
    let mock = Mock::start("openai", &[]).await;
    let sy = Switchyard::start(&config(&mock)).await;
    let file = sy.config_file.as_ref().unwrap().path().to_str().unwrap();

    let unknown = plan(&[
        "--config",
        file,
        "--admin",
        &sy.admin,
        "--what-if",
        "nope=down",
    ])
    .await;
    assert_eq!(unknown.code, 2, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("no provider `nope`"),
        "{}",
        unknown.stderr
    );

    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let unreachable = plan(&["--config", file, "--admin", &addr, "--window", "1s"]).await;
    assert_eq!(unreachable.code, 2, "{}", unreachable.stderr);
    assert!(
        unreachable.stderr.contains("cannot read the figures"),
        "{}",
        unreachable.stderr
    );

    let bad = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(bad.path(), "[server]\nnope = 1\n").unwrap();
    let invalid = plan(&[
        "--config",
        bad.path().to_str().unwrap(),
        "--admin",
        &sy.admin,
    ])
    .await;
    assert_eq!(invalid.code, 2, "{}", invalid.stderr);
    assert!(invalid.stderr.contains("server.nope"), "{}", invalid.stderr);
}

/// A real Prometheus server scraping `admin` every second, with the rules
/// loaded; killed on drop.
struct Prometheus {
    child: tokio::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts one, or returns `None` after a loud SKIPPED line (a failure under CI).
    async fn start(test: &str, admin: &str) -> Option<Prometheus> {
        let found = std::process::Command::new("prometheus")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            if std::env::var_os("CI").is_some() {
                panic!("CI is set but prometheus is not installed ({test}); .ci/run installs the Debian package prometheus");
            }
            eprintln!(
                "\n*** SKIPPED {test}: prometheus not installed (apt-get install prometheus) ***\n"
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheus/rules.yaml");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: [\"{rules}\"]\n\
                 scrape_configs:\n  - job_name: switchyard\n    static_configs:\n      - targets: [\"{admin}\"]\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = tokio::process::Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn prometheus");
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..300 {
            if let Ok(r) = reqwest::get(format!("{url}/-/ready")).await {
                if r.status().is_success() {
                    return Some(Prometheus {
                        child,
                        url,
                        _dir: dir,
                    });
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("prometheus did not become ready");
    }

    async fn query(&self, promql: &str) -> Vec<Value> {
        let v: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", promql)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(v["status"], "success", "{promql}: {v}");
        v["data"]["result"].as_array().unwrap().clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_reads_the_same_from_a_real_prometheus_and_the_recording_rules_evaluate() {
    let (_mock, sy, traffic) = busy_router().await;
    let Some(mut prom) = Prometheus::start(
        "plan_reads_the_same_from_a_real_prometheus_and_the_recording_rules_evaluate",
        &sy.admin,
    )
    .await
    else {
        traffic.stop().await;
        return;
    };
    // Prometheus' first scrape comes a few seconds after it is ready (target
    // discovery); then the callers' own rate over the ten seconds its window covers.
    let mut scraped = false;
    for _ in 0..200 {
        scraped = !prom.query(r#"up{job="switchyard"} == 1"#).await.is_empty();
        if scraped {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(scraped, "prometheus never scraped {}", sy.admin);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (before, t0) = (traffic.count("tight"), Instant::now());
    tokio::time::sleep(Duration::from_secs(10)).await;
    let measured = (traffic.count("tight") - before) as f64 / t0.elapsed().as_secs_f64();
    let file = sy.config_file.as_ref().unwrap().path().to_str().unwrap();
    let run = plan(&[
        "--config",
        file,
        "--prometheus",
        &prom.url,
        "--window",
        "10s",
        "--json",
    ])
    .await;
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let p = json(&run);
    assert_eq!(p["replicas"], 1.0);
    let tight = route_plan(&p, "tight");
    let primary = row(tight, "pa");
    let secondary = row(tight, "pb");
    let (_, l) = primary_matches_the_callers(primary, measured, 0.3);
    assert_eq!(secondary["failover"]["verdict"], "exceeded");
    assert_eq!(secondary["failover"]["ceiling"], 1);
    close(f(&secondary["failover"]["burst"]), l, "failover burst");
    fits(route_plan(&p, "roomy"));

    // The recording rules, evaluated by Prometheus on the real series.
    let answered = prom.query("switchyard:route_answered:ratio_rate5m").await;
    let routes: BTreeSet<&str> = answered
        .iter()
        .map(|s| s["metric"]["route"].as_str().unwrap())
        .collect();
    assert_eq!(routes, BTreeSet::from(["roomy", "tight"]), "{answered:?}");
    for s in &answered {
        assert_eq!(s["value"][1], "1", "nothing was shed: {s}");
    }
    let ratio = prom.query("switchyard:in_flight:ratio").await;
    assert_eq!(ratio.len(), 4, "one per provider: {ratio:?}");
    let ttft = prom.query("switchyard:ttft_seconds:p95_5m").await;
    assert!(
        ttft.iter().any(|s| s["metric"]["provider"] == "pa"),
        "{ttft:?}"
    );
    // Nothing is wrong, so nothing fires.
    let alerts = prom.query("ALERTS").await;
    assert!(alerts.is_empty(), "{alerts:?}");
    traffic.stop().await;
    prom.child.kill().await.unwrap();
}
