//! `switchyard bench --scenario all --quick` through the real binary: every
//! scenario runs, `bench.json` and `bench.md` are written, and the run's
//! correctness holds (counts match, no unexpected errors). Never asserts on time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_switchyard");
const SCENARIOS: &[&str] = switchyard_bench::SCENARIOS;

/// The bench runs load: one at a time, so neither starves the other's checks.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn bench_quick_runs_every_scenario_correctly() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "--scenario", "all", "--quick", "--out"])
        .arg(dir.path())
        .output()
        .expect("run switchyard bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let text = std::fs::read_to_string(dir.path().join("bench.json"))
        .unwrap_or_else(|e| panic!("no bench.json ({e}); stdout:\n{stdout}\nstderr:\n{stderr}"));
    let json: Value = serde_json::from_str(&text).unwrap();
    let md = std::fs::read_to_string(dir.path().join("bench.md")).unwrap();
    assert!(md.contains("Machine: "), "{md}");

    let scenarios = json["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, SCENARIOS);
    for s in scenarios {
        let checks = s["checks"].as_array().unwrap();
        if s["name"] == "state" && checks.is_empty() {
            // It needs redis-server: `.ci/run` installs it.
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but the state scenario did not run: {}",
                s["targets"]
            );
            eprintln!("\n*** SKIPPED bench state: redis-server not installed ***\n");
            continue;
        }
        assert!(!checks.is_empty(), "{} has no checks", s["name"]);
        for c in checks {
            assert_eq!(c["pass"], true, "{}: {}", s["name"], c);
        }
        assert!(md.contains(&format!("## {}", s["name"].as_str().unwrap())));
    }
    // A few counts read straight from the data, independent of the checks.
    let data = |name: &str| &scenarios[SCENARIOS.iter().position(|s| *s == name).unwrap()]["data"];
    let overhead = data("overhead")["rows"].as_array().unwrap();
    let mut modes: Vec<&str> = overhead
        .iter()
        .map(|r| r["mode"].as_str().unwrap())
        .collect();
    modes.dedup();
    assert_eq!(
        modes,
        ["grpc-stream", "grpc-unary", "http-stream", "http-unary"]
    );
    for row in overhead {
        for side in ["direct", "switchyard"] {
            assert_eq!(row[side]["failed"], 0, "{row}");
            assert_eq!(row[side]["unfinished"], 0, "{row}");
            assert!(row[side]["ok"].as_u64().unwrap() > 0, "{row}");
        }
        // The serve process counts its allocations in bench runs.
        let allocations = row["switchyard_allocations_per_request"].as_f64();
        assert!(allocations.is_some_and(|n| n > 1.0), "{row}");
        assert!(
            row["switchyard_cpu_us_per_request"].as_f64().unwrap() > 0.0,
            "{row}"
        );
    }
    for level in data("streams")["levels"].as_array().unwrap() {
        assert_eq!(level["streams_ok"], level["streams"], "{level}");
    }
    for row in data("amplification")["rows"].as_array().unwrap() {
        assert!(row["caller_requests"].as_u64().unwrap() > 0, "{row}");
    }
    for row in data("state")["rows"].as_array().into_iter().flatten() {
        assert!(row["throughput_rps"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["errors"], serde_json::json!({}), "{row}");
    }
    let cost = data("cost")["clients"].as_array().unwrap();
    let ids: Vec<&str> = cost.iter().map(|c| c["client"].as_str().unwrap()).collect();
    assert_eq!(ids, ["naive", "static", "exact", "semantic"]);
    let client = |id: &str| &cost[ids.iter().position(|i| *i == id).unwrap()];
    let number = |id: &str, key: &str| client(id)[key].as_f64().unwrap();
    assert!(number("exact", "deflection") > 0.0);
    assert!(number("semantic", "deflection") > number("exact", "deflection"));
    let blackout = |id: &str| client(id)["phases"][1]["availability"].as_f64().unwrap();
    assert!(blackout("semantic") > blackout("naive"), "{cost:?}");
    assert!(blackout("exact") > blackout("naive"), "{cost:?}");
    assert!(number("semantic", "cost_cents_per_task") < number("static", "cost_cents_per_task"));
    for c in cost {
        assert_eq!(c["tasks"], data("cost")["tasks"], "{c}");
    }
    let tail = data("tail")["arms"].as_array().unwrap();
    let arms: Vec<&str> = tail.iter().map(|a| a["arm"].as_str().unwrap()).collect();
    assert_eq!(arms, ["off", "p95", "fixed", "client retry"]);
    for arm in tail {
        assert_eq!(arm["answered"], arm["requests"], "{arm}");
        assert!(arm["upstream_requests"].as_u64().unwrap() >= arm["requests"].as_u64().unwrap());
        assert!(
            arm["cost_usd_per_1k_requests"].as_f64().unwrap() > 0.0,
            "{arm}"
        );
    }
    let limits = data("limits")["rows"].as_array().unwrap();
    assert_eq!(limits[0]["arm"], "direct");
    // The load exceeds the windows: the direct client meets 429s.
    assert!(
        limits[0]["upstream_429"].as_u64().unwrap() > 0,
        "{}",
        limits[0]
    );
    let replicas: Vec<u64> = limits
        .iter()
        .map(|r| r["replicas"].as_u64().unwrap())
        .collect();
    if replicas.len() < 5 {
        // The two-replica arms need redis-server: `.ci/run` installs it.
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but the limits scenario skipped its two-replica arms"
        );
        eprintln!("\n*** SKIPPED bench limits on two replicas: redis-server not installed ***\n");
    }
    for row in &limits[1..] {
        assert!(row["answered"].as_u64().unwrap() > 0, "{row}");
    }
    assert_eq!(json["correctness_passed"], true);
    assert!(out.status.success(), "stderr:\n{stderr}");
    assert!(json["machine"]["cores"].as_u64().unwrap() >= 1);
}

/// Busy loops that end with the test (also when it fails).
struct BusyLoops(Vec<std::process::Child>);

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The `state` scenario's quick run is correct on a machine busy on every
/// core (two busy loops per core beside it, as a parallel build would be):
/// every request answered, none refused. With Redis calls timing out at
/// 250 ms, a loaded machine made a few calls miss it and keyed requests came
/// back STATE_UNAVAILABLE (2 of 400 once in CI; three misses in a row open
/// the Redis breaker and refuse hundreds).
#[test]
fn the_state_scenario_is_correct_on_a_machine_busy_on_every_core() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if switchyard::state::redis::server::find_binary().is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but redis-server is not installed"
        );
        eprintln!("\n*** SKIPPED busy-machine state bench: redis-server not installed ***\n");
        return;
    }
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let busy = BusyLoops(
        (0..2 * cores)
            .map(|_| {
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()
                    .expect("start a busy loop")
            })
            .collect(),
    );
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "--scenario", "state", "--quick", "--out"])
        .arg(dir.path())
        .output()
        .expect("run switchyard bench");
    drop(busy);
    let text = std::fs::read_to_string(dir.path().join("bench.json")).unwrap_or_else(|e| {
        panic!(
            "no bench.json ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let json: Value = serde_json::from_str(&text).unwrap();
    let state = &json["scenarios"][0];
    assert_eq!(state["name"], "state");
    let checks = state["checks"].as_array().unwrap();
    assert!(!checks.is_empty(), "{}", state["targets"]);
    for c in checks {
        assert_eq!(c["pass"], true, "{c}");
    }
    for row in state["data"]["rows"].as_array().unwrap() {
        assert_eq!(row["errors"], serde_json::json!({}), "{row}");
    }
    assert!(out.status.success());
}

/// The chaos soak in quick mode: seeded faults, reloads and provider actor
/// kills under mixed load, and every invariant holds at the end.
#[test]
fn bench_soak_quick_keeps_every_invariant() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["bench", "--scenario", "soak", "--quick", "--out"])
        .arg(dir.path())
        .output()
        .expect("run switchyard bench");
    let text = std::fs::read_to_string(dir.path().join("bench.json")).unwrap_or_else(|e| {
        panic!(
            "no bench.json ({e}); stderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let json: Value = serde_json::from_str(&text).unwrap();
    let soak = &json["scenarios"][0];
    assert_eq!(soak["name"], "soak");
    let checks = soak["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 8, "{checks:?}");
    for c in checks {
        assert_eq!(c["pass"], true, "{c}");
    }
    let data = &soak["data"];
    assert!(data["kills"].as_u64().unwrap() > 0, "{data}");
    assert!(data["faults"].as_u64().unwrap() > 0, "{data}");
    assert_eq!(
        data["attempts"].as_f64().unwrap() as u64,
        data["mock_requests"].as_u64().unwrap()
    );
    assert!(out.status.success());
}
