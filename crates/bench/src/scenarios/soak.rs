//! The chaos soak (`--scenario soak`, not part of `all`): mixed load for 15
//! minutes (`--quick`: seconds) while, every few seconds, a seeded random
//! choice from the fault catalogue hits one of the mocks, the config is
//! reloaded, or a provider actor is killed. Callers stream, call unary, read
//! slowly, hang up early, and submit jobs (each twice, with one key). The
//! router runs in this process so its actors can be killed. The invariants,
//! checked at the end: every request ended by its deadline, in-flight
//! permits back to 0, RSS within a bound, every job done exactly once, and
//! the attempts Switchyard counted equal to the requests the mocks saw.
//! `SWITCHYARD_SOAK_SECS` sets another length (the chaos pace stays the
//! full run's). `soak-status.json` and `soak-metrics.txt` in the output
//! directory keep the router's view at the end, for when a check fails.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tokio::sync::Mutex;
use tokio::time::Instant;

use super::{check_complete, result};
use crate::clients::{grpc_call, ms, Call, Grpc, Outcome};
use crate::load::open_loop;
use crate::procs::{config_text, self_usage, MockProc, MockSpec, Provider};
use crate::{BenchError, Check, Ctx, ScenarioResult};
use switchyard::proto;

/// The route's deadline; every call must end by it (plus transport slack).
const DEADLINE: Duration = Duration::from_secs(3);
/// Peak RSS of this process (load generator and router) allowed.
const RSS_BOUND_MB: u64 = 512;
const SEED: u64 = 14;
/// After the chaos, waiting for jobs gives up once none finished for this long.
const STALL: Duration = Duration::from_secs(30);

/// The faults drawn from (the mock's catalogue, less `refuse`, whose
/// connection errors the mock cannot log).
fn catalogue() -> Vec<Value> {
    vec![
        json!({}),
        json!({"type": "status", "status": 503}),
        json!({"type": "status", "status": 429, "headers": {"retry-after": "1"}}),
        json!({"type": "status", "status": 500, "fraction": 0.5}),
        json!({"type": "hang", "fraction": 0.3}),
        json!({"type": "slow_first_token", "delay_ms": 300}),
        json!({"type": "abort", "after_tokens": 3}),
        json!({"type": "abort", "after_tokens": 2, "reset": true}),
        json!({"type": "stall", "after_tokens": 2}),
        json!({"type": "error_event", "after_tokens": 4}),
        json!({"type": "malformed", "after_tokens": 1}),
        json!({"type": "no_terminator"}),
        json!({"type": "refusal", "after_tokens": 2}),
        json!({"type": "flood", "tokens": 5000}),
        json!({"type": "huge_line", "bytes": 4_000_000}),
        json!({"type": "trickle", "after_tokens": 2, "byte_delay_ms": 50}),
        json!({"type": "second_choice"}),
        json!({"type": "orphan_delta"}),
    ]
}

/// What the chaos task did.
#[derive(Default)]
struct Chaos {
    faults: usize,
    reloads: usize,
    reloads_refused: usize,
    kills: usize,
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("soak");
    let length = match std::env::var("SWITCHYARD_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(secs) => Duration::from_secs(secs),
        None => ctx.pick(Duration::from_secs(8), Duration::from_secs(15 * 60)),
    };
    let period = ctx.pick(Duration::from_millis(700), Duration::from_secs(4));
    let rate = ctx.pick(40.0, 100.0);
    let spec = MockSpec::new("openai", 16, 5);
    let primary = MockProc::start(ctx, "soak-primary", &spec).await?;
    let secondary =
        MockProc::start(ctx, "soak-secondary", &MockSpec::new("anthropic", 16, 5)).await?;
    let queue = ctx.path("soak-queue.sqlite3");
    let _ = std::fs::remove_file(&queue);
    // Breakers reopen for seconds, not minutes: once the chaos stops, the
    // jobs' drain must not wait out a 300 s backoff the faults earned.
    let breaker = "breaker = { open_for = \"1s\", max_open_for = \"3s\" }";
    let providers = [
        Provider {
            timeout: "1s",
            ..Provider::new("primary", "openai", &primary)
                .caps(32, 32)
                .extra(breaker)
        },
        Provider {
            timeout: "1s",
            ..Provider::new("secondary", "anthropic", &secondary)
                .caps(32, 32)
                .extra(breaker)
        },
    ];
    let text = config_text(
        // Jobs arrive at rate / 20 (5/s): the drain runs faster than that, so
        // a backlog the chaos built clears once it ends.
        &format!(
            "[queue]\npath = \"{}\"\ndrain = {{ rate = 20.0, burst = 10 }}\n",
            queue.display()
        ),
        &providers,
        &[("chat", &["primary", "secondary"])],
    )
    .replace("[server]\n", "[server]\nsend_timeout = \"1s\"\n")
        + &format!("deadline = \"{}ms\"\n", DEADLINE.as_millis());
    let path = ctx.path("switchyard-soak.toml");
    std::fs::write(&path, &text).map_err(|e| BenchError::Io(e.to_string()))?;
    let config = switchyard::config::Config::from_toml_str(&text)
        .map_err(|e| BenchError::start("switchyard (soak)", e))?;
    let running = switchyard::app::start(config, Some(path))
        .await
        .map_err(|e| BenchError::start("switchyard (soak)", e))?;
    let grpc = Grpc::connect(running.grpc_addr, 4).await?;
    let admin = running.admin_addr;
    let registry = running.registry.clone();
    let reloader = running.reloader.clone();

    // The chaos: one seeded schedule of faults, reloads and actor kills,
    // alongside the load until it ends.
    let stop = tokio_util::sync::CancellationToken::new();
    let chaos = async {
        let mut rng = StdRng::seed_from_u64(SEED);
        let faults = catalogue();
        let mocks = [&primary, &secondary];
        let mut done = Chaos::default();
        let mut tick = 0u64;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return done,
                _ = tokio::time::sleep(period) => {}
            }
            tick += 1;
            let mock = mocks[rng.random_range(0..mocks.len())];
            let fault = &faults[rng.random_range(0..faults.len())];
            if mock.set_fault(fault).await.is_ok() {
                done.faults += 1;
            }
            if tick % 4 == 0 {
                match reloader.reload(false).await {
                    Ok(_) => done.reloads += 1,
                    Err(_) => done.reloads_refused += 1,
                }
            }
            if tick % 6 == 3 {
                let id = ["primary", "secondary"][rng.random_range(0..2)];
                if let Some(entry) = registry.provider(id) {
                    entry.actor.kill();
                    done.kills += 1;
                }
            }
        }
    };
    let jobs: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let started = Instant::now();
    let load = {
        let (grpc, jobs) = (grpc.clone(), jobs.clone());
        async {
            let run = open_loop(ctx, "soak", rate, length, 10_000, move |i, t0| {
                let (grpc, jobs) = (grpc.clone(), jobs.clone());
                async move { caller(&grpc, i, t0, &jobs).await }
            })
            .await;
            stop.cancel();
            run
        }
    };
    let (run, chaos) = tokio::join!(load, chaos);
    primary.set_fault(&json!({})).await?;
    secondary.set_fault(&json!({})).await?;

    // Once the faults are gone the router serves again on its own: breakers
    // half-open and probe, cooldowns lapse (a lost probe ticket times out).
    let recovered = recovers(&grpc, Duration::from_secs(45)).await;
    // Jobs finish once the faults are gone (the drain resumes on its own).
    let jobs = jobs.lock().await.clone();
    let finished = wait_for_jobs(&grpc, &jobs, STALL).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let metrics = reqwest::get(format!("http://{admin}/metrics"))
        .await
        .map_err(|e| BenchError::Mock(e.to_string()))?
        .text()
        .await
        .map_err(|e| BenchError::Mock(e.to_string()))?;
    // The router's own view, kept for when a check fails.
    if let Ok(r) = reqwest::get(format!("http://{admin}/v1/status")).await {
        if let Ok(text) = r.text().await {
            let _ = std::fs::write(ctx.path("soak-status.json"), text);
        }
    }
    let _ = std::fs::write(ctx.path("soak-metrics.txt"), &metrics);
    let seen = primary.stats().await?.requests + secondary.stats().await?.requests;
    let usage = self_usage();
    running.shutdown().await;
    primary.stop().await;
    secondary.stop().await;

    // ---- the invariants
    let late = run
        .outcomes
        .iter()
        .filter(|o| o.error.as_deref().is_some_and(|e| e.starts_with("timeout")))
        .count();
    res.checks.push(check_complete("soak", &run));
    res.checks.push(Check::new(
        "serving again once the faults end",
        recovered.is_ok(),
        match &recovered {
            Ok(after) => format!(
                "a stream succeeded {} ms after the chaos",
                after.as_millis()
            ),
            Err(last) => format!("no stream succeeded in 45 s after the chaos; the last: {last}"),
        },
    ));
    res.checks.push(Check::new(
        "every request ended by its deadline",
        late == 0,
        format!(
            "{late} of {} outlived {} ms + 1 s",
            run.outcomes.len(),
            DEADLINE.as_millis()
        ),
    ));
    let in_flight = sum(&metrics, "switchyard_in_flight{");
    res.checks.push(Check::new(
        "in-flight permits back to 0",
        in_flight == 0.0,
        format!("switchyard_in_flight sums to {in_flight}"),
    ));
    let peak_mb = usage.hwm_kb / 1024;
    res.checks.push(Check::new(
        format!("peak RSS under {RSS_BOUND_MB} MB"),
        peak_mb < RSS_BOUND_MB,
        format!("{peak_mb} MB (load generator and router in one process)"),
    ));
    let keys_once = jobs.iter().all(|(a, b)| a == b);
    res.checks.push(Check::new(
        "every job done exactly once",
        keys_once && finished.lost == 0 && finished.failed == 0,
        format!(
            "{} jobs: {} succeeded, {} failed, {} not done {:?}; duplicate submits {} the same job",
            jobs.len(),
            finished.succeeded,
            finished.failed,
            finished.lost,
            finished.lost_states,
            if keys_once {
                "returned"
            } else {
                "did NOT return"
            }
        ),
    ));
    let counted = sum(&metrics, "switchyard_upstream_attempts_total{")
        - sum_matching(
            &metrics,
            "switchyard_upstream_attempts_total{",
            "outcome=\"connect\"",
        );
    res.checks.push(Check::new(
        "attempts counted match the mocks' logs",
        counted as u64 == seen,
        format!(
            "Switchyard counted {counted} attempts that reached a mock; the mocks logged {seen}"
        ),
    ));
    res.checks.push(Check::new(
        "the chaos happened",
        chaos.faults > 0 && chaos.kills > 0 && chaos.reloads > 0,
        format!(
            "{} faults, {} reloads ({} refused), {} provider actors killed",
            chaos.faults, chaos.reloads, chaos.reloads_refused, chaos.kills
        ),
    ));
    res.seconds = started.elapsed().as_secs_f64();
    res.data = json!({
        "seconds": res.seconds, "rate": rate, "requests": run.outcomes.len(),
        "ok": run.ok(), "errors": run.errors(), "late": late,
        "faults": chaos.faults, "reloads": chaos.reloads, "kills": chaos.kills,
        "jobs": jobs.len(), "peak_rss_mb": peak_mb, "attempts": counted, "mock_requests": seen,
    });
    res.markdown = format!(
        "{} requests at {rate}/s for {:.0} s ({} ok), {} faults, {} reloads, {} actor kills, {} jobs; peak RSS {peak_mb} MB.\n\nErrors by kind: {:?}\n",
        run.outcomes.len(),
        length.as_secs_f64(),
        run.ok(),
        chaos.faults,
        chaos.reloads,
        chaos.kills,
        jobs.len(),
        run.errors()
    );
    Ok(res)
}

/// One caller of the mix: mostly streams, some unary calls, slow readers,
/// callers that hang up after the first event, and job submitters.
async fn caller(grpc: &Grpc, i: u64, t0: Instant, jobs: &Mutex<Vec<(String, String)>>) -> Outcome {
    let client = grpc.client(i);
    let timeout = DEADLINE + Duration::from_secs(1);
    match i % 20 {
        0..=13 => grpc_call(client, &Call::new("chat", true, timeout), t0).await,
        14..=16 => grpc_call(client, &Call::new("chat", false, timeout), t0).await,
        17 => read_slowly(client, t0, false).await,
        18 => read_slowly(client, t0, true).await,
        _ => submit_twice(client, i, t0, jobs).await,
    }
}

fn soak_request() -> proto::CompletionRequest {
    proto::CompletionRequest {
        route: "chat".into(),
        messages: vec![proto::Message {
            role: "user".into(),
            content: "soak".into(),
            ..Default::default()
        }],
        max_tokens: 16,
        ..Default::default()
    }
}

/// A stream read one event per 100 ms, or dropped after its first event.
async fn read_slowly(
    mut client: proto::router_client::RouterClient<tonic::transport::Channel>,
    t0: Instant,
    hang_up: bool,
) -> Outcome {
    let limit = DEADLINE + Duration::from_secs(2);
    let read = async {
        let mut stream = client.stream_completion(soak_request()).await?.into_inner();
        while stream.message().await?.is_some() {
            if hang_up {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<(), tonic::Status>(())
    };
    let ended = tokio::time::timeout(limit, read).await;
    Outcome {
        ok: matches!(ended, Ok(Ok(()))),
        latency_ms: ms(t0.elapsed()),
        error: match ended {
            Err(_) => Some("timeout (slow reader)".into()),
            Ok(Err(s)) => Some(format!("{:?}", s.code())),
            Ok(Ok(())) => None,
        },
        ..Outcome::default()
    }
}

/// Submits one job twice under one idempotency key; both ids are kept.
async fn submit_twice(
    mut client: proto::router_client::RouterClient<tonic::transport::Channel>,
    i: u64,
    t0: Instant,
    jobs: &Mutex<Vec<(String, String)>>,
) -> Outcome {
    let mut req = soak_request();
    req.idempotency_key = format!("soak-{i}");
    let first = client.submit_job(req.clone()).await;
    let second = client.submit_job(req).await;
    let error = match (first, second) {
        (Ok(a), Ok(b)) => {
            jobs.lock()
                .await
                .push((a.into_inner().id, b.into_inner().id));
            None
        }
        (Err(s), _) | (_, Err(s)) => Some(format!("{:?} submit", s.code())),
    };
    Outcome {
        ok: error.is_none(),
        latency_ms: ms(t0.elapsed()),
        error,
        ..Outcome::default()
    }
}

/// How long after the chaos a fresh stream first succeeded, or the last
/// error if none did within `limit`.
async fn recovers(grpc: &Grpc, limit: Duration) -> Result<Duration, String> {
    let t0 = Instant::now();
    let mut last = String::from("no call made");
    while t0.elapsed() < limit {
        let call = Call::new("chat", true, DEADLINE + Duration::from_secs(1));
        let outcome = grpc_call(grpc.client(0), &call, Instant::now()).await;
        if outcome.ok {
            return Ok(t0.elapsed());
        }
        last = outcome.error.unwrap_or_default();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Err(last)
}

#[derive(Default)]
struct JobsDone {
    succeeded: usize,
    failed: usize,
    lost: usize,
    /// The last state seen of each job not done.
    lost_states: Vec<String>,
}

/// Polls every job until it is terminal, or until none finished for `stall`.
async fn wait_for_jobs(grpc: &Grpc, jobs: &[(String, String)], stall: Duration) -> JobsDone {
    let mut until = Instant::now() + stall;
    let mut client = grpc.client(0);
    let mut pending: Vec<&str> = jobs.iter().map(|(a, _)| a.as_str()).collect();
    let mut done = JobsDone::default();
    let mut last = std::collections::HashMap::new();
    while !pending.is_empty() && Instant::now() < until {
        let before = pending.len();
        let mut still = Vec::new();
        for id in pending {
            let job = client
                .get_job(proto::GetJobRequest { id: id.to_string() })
                .await
                .map(|r| r.into_inner());
            let state = job.as_ref().map(|j| j.state).map_err(|e| e.code());
            last.insert(
                id,
                match &job {
                    Ok(j) => format!("{:?} after {} runs", j.state(), j.attempts),
                    Err(e) => format!("{:?}", e.code()),
                },
            );
            match state {
                Ok(s) if s == proto::JobState::Succeeded as i32 => done.succeeded += 1,
                Ok(s)
                    if s == proto::JobState::Failed as i32
                        || s == proto::JobState::Expired as i32 =>
                {
                    done.failed += 1
                }
                _ => still.push(id),
            }
        }
        pending = still;
        if pending.len() < before {
            until = Instant::now() + stall;
        }
        if !pending.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    done.lost = pending.len();
    // The first few: enough to find them in the logs.
    done.lost_states = pending
        .iter()
        .take(5)
        .map(|id| format!("{id}: {}", last.get(id).map_or("?", |s| s.as_str())))
        .collect();
    done
}

fn sum(metrics: &str, prefix: &str) -> f64 {
    sum_matching(metrics, prefix, "")
}

/// Sums the samples of lines starting with `prefix` and containing `with`.
fn sum_matching(metrics: &str, prefix: &str, with: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix) && l.contains(with))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
