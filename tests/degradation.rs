//! The degradation ladder and recovery: downshift, cache and queue rungs with
//! their tiers labelled, the durable job queue (SIGKILL between accept and
//! completion), the recovery drain through its token bucket, the cache's tee
//! (no cost to time to first token) and the cost cap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;
use switchyard::proto::{self, router_client::RouterClient, JobState, Tier};
use tonic::Code;

fn route_with(name: &str, targets: &[&str], extra: &str) -> String {
    format!("{}{extra}\n", route(name, targets))
}

#[tokio::test]
async fn downshift_serves_when_the_route_targets_fail_and_says_so() {
    let big = Mock::start("openai", &[]).await;
    let cheap = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}{}",
        provider("big", "openai", &big.base_url(), "large"),
        provider("cheap", "openai", &cheap.base_url(), "mini"),
        route_with(
            "chat",
            &["big/large"],
            "ladder = [\"fallback\", \"downshift\", \"refuse\"]\ndownshift = [\"cheap/mini\"]"
        )
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    assert_eq!(got.finished.unwrap().tier, Tier::Primary as i32);
    assert!(
        cheap.requests().await.is_empty(),
        "downshift only when the route's targets cannot serve"
    );

    big.set_fault(json!({"type": "status", "status": 500}))
        .await;
    let got = stream(&mut client, request("chat")).await;
    assert_eq!(got.started[0].tier, Tier::Downshift as i32);
    let f = got.finished.unwrap();
    assert_eq!(
        f.tier,
        Tier::Downshift as i32,
        "a downshifted answer is never presented as primary"
    );
    assert_eq!(f.served_by.unwrap().model, "mini");
    assert_eq!(cheap.requests().await.len(), 1);
}

#[tokio::test]
async fn the_cache_rung_serves_the_last_good_answer_with_its_age() {
    let a = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("p", "openai", &a.base_url(), "m"),
        route_with(
            "chat",
            &["p/m"],
            "ladder = [\"fallback\", \"cache\", \"refuse\"]"
        )
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let live = stream(&mut client, request("chat")).await;
    // The answer is cached before its `Finished` goes out: no wait needed.
    assert_eq!(live.finished.as_ref().unwrap().tier, Tier::Primary as i32);

    a.set_fault(json!({"type": "status", "status": 503})).await;
    let cached = stream(&mut client, request("chat")).await;
    assert!(cached.status.is_none(), "{:?}", cached.status);
    let f = cached.finished.unwrap();
    assert_eq!(
        f.tier,
        Tier::Cache as i32,
        "a cached answer is labelled as such"
    );
    assert!(f.cache_age_ms >= 30, "with its age: {}", f.cache_age_ms);
    // Serving it does not store it again: its age keeps growing.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let again = stream(&mut client, request("chat")).await.finished.unwrap();
    assert_eq!(again.tier, Tier::Cache as i32);
    assert!(
        again.cache_age_ms >= f.cache_age_ms + 100,
        "{} then {}",
        f.cache_age_ms,
        again.cache_age_ms
    );
    assert_eq!(cached.text, live.text);
    assert!(f.attempts >= 1, "the live targets were tried first");
    assert_eq!(cached.started[0].tier, Tier::Cache as i32);

    // A different request has no stored answer: refused with a retry time.
    let mut other = request("chat");
    other.messages[0].content = "something else".into();
    let s = stream(&mut client, other).await.status.unwrap();
    assert_eq!(s.code(), Code::Unavailable);

    // Unary callers get the same.
    let r = client.complete(request("chat")).await.unwrap().into_inner();
    assert_eq!(r.tier, Tier::Cache as i32);
    assert_eq!(r.text, live.text);
}

#[tokio::test]
async fn serve_fresh_within_answers_without_an_upstream_call() {
    let a = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("p", "openai", &a.base_url(), "m"),
        route_with("chat", &["p/m"], "serve_fresh_within = \"10s\"")
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let first = stream(&mut client, request("chat")).await;
    let second = stream(&mut client, request("chat")).await;
    assert_eq!(second.finished.as_ref().unwrap().tier, Tier::Cache as i32);
    assert_eq!(second.finished.unwrap().attempts, 0);
    assert_eq!(second.text, first.text);
    assert_eq!(
        a.requests().await.len(),
        1,
        "the fresh hit made no upstream call"
    );
}

#[tokio::test]
async fn caching_adds_nothing_to_time_to_first_token() {
    // 10 tokens 80 ms apart: a cache that buffered the answer before
    // forwarding it would delay the first token by the whole stream.
    let a = Mock::start("openai", &["--tokens", "10", "--token-delay-ms", "80"]).await;
    let config = format!(
        "{}{}{}",
        provider("p", "openai", &a.base_url(), "m"),
        route_with(
            "cached",
            &["p/m"],
            "ladder = [\"fallback\", \"cache\", \"refuse\"]"
        ),
        route("plain", &["p/m"])
    );
    let sy = Switchyard::start(&config).await;
    let client = sy.client().await;
    let ttft = |route: &'static str, i: usize| {
        let mut client = client.clone();
        async move {
            let mut req = request(route);
            req.messages[0].content = format!("question {i}");
            let start = Instant::now();
            let mut s = client.stream_completion(req).await.unwrap().into_inner();
            let mut first = None;
            while let Some(ev) = s.message().await.unwrap() {
                if let Some(proto::completion_event::Event::Delta(_)) = ev.event {
                    first.get_or_insert(start.elapsed());
                }
            }
            (first.unwrap(), start.elapsed())
        }
    };
    let mut with = Vec::new();
    let mut without = Vec::new();
    for i in 0..3 {
        with.push(ttft("cached", i).await);
        without.push(ttft("plain", i).await);
    }
    assert_ttft_unchanged(with, without, "the cache");
}

fn queue_config(mocks: &[&Mock], dir: &std::path::Path, extra: &str) -> String {
    let mut c = format!(
        "[queue]\npath = \"{}\"\nmax_jobs_per_tenant = 5000\nmax_jobs = 5000\n{extra}\n",
        dir.join("jobs.sqlite3").display()
    );
    for (i, m) in mocks.iter().enumerate() {
        c.push_str(&provider(&format!("p{i}"), "openai", &m.base_url(), "m"));
    }
    let targets: Vec<String> = (0..mocks.len()).map(|i| format!("p{i}/m")).collect();
    let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
    c.push_str(&route_with(
        "chat",
        &targets,
        "ladder = [\"fallback\", \"queue\"]",
    ));
    c
}

async fn wait_job(
    client: &mut RouterClient<tonic::transport::Channel>,
    id: &str,
    secs: u64,
) -> proto::Job {
    for _ in 0..secs * 20 {
        let job = client
            .get_job(proto::GetJobRequest { id: id.into() })
            .await
            .unwrap()
            .into_inner();
        if job.state == JobState::Succeeded as i32 || job.state == JobState::Failed as i32 {
            return job;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("job {id} never finished");
}

#[tokio::test]
async fn the_queue_rung_answers_with_a_job_that_completes_when_capacity_returns() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mock::start("openai", &[]).await;
    a.set_fault(json!({"type": "status", "status": 500})).await;
    let sy = Switchyard::start(&queue_config(&[&a], dir.path(), "")).await;
    let mut client = sy.client().await;
    let got = stream(&mut client, request("chat")).await;
    assert!(got.status.is_none(), "{:?}", got.status);
    assert!(
        got.finished.is_none() && got.deltas == 0,
        "no tokens: a job instead"
    );
    let job = got.job.expect("the queue rung answered with a job");
    assert_eq!(job.state, JobState::Queued as i32);
    assert!(job.id.starts_with("job-"));

    // Watch it through to the end once the upstream recovers.
    let mut watch = client
        .watch_job(proto::GetJobRequest { id: job.id.clone() })
        .await
        .unwrap()
        .into_inner();
    a.set_fault(json!({})).await;
    let mut states = Vec::new();
    let last = loop {
        let j = tokio::time::timeout(Duration::from_secs(15), watch.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        states.push(j.state);
        if j.state == JobState::Succeeded as i32 {
            break j;
        }
    };
    // Waiting, or mid-run (the recovery actor keeps trying while the upstream fails).
    assert!(
        [JobState::Queued as i32, JobState::Running as i32].contains(&states[0]),
        "{states:?}"
    );
    let result = last.result.unwrap();
    assert!(!result.text.is_empty());
    assert_eq!(result.finish_reason, proto::FinishReason::Stop as i32);

    // Unary callers get the job too, with tier QUEUED.
    a.set_fault(json!({"type": "status", "status": 500})).await;
    let mut req = request("chat");
    req.messages[0].content = "unary".into();
    let r = client.complete(req).await.unwrap().into_inner();
    assert_eq!(r.tier, Tier::Queued as i32);
    assert!(r.job.is_some());
}

#[tokio::test]
async fn submit_job_is_bounded_per_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let a = Mock::start("openai", &[]).await;
    a.set_fault(json!({"type": "status", "status": 500})).await;
    let config = queue_config(&[&a], dir.path(), "")
        .replace("max_jobs_per_tenant = 5000", "max_jobs_per_tenant = 2");
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    for i in 0..2 {
        let mut req = request("chat");
        req.tenant = "team-a".into();
        req.messages[0].content = format!("q{i}");
        client.submit_job(req).await.unwrap();
    }
    let mut req = request("chat");
    req.tenant = "team-a".into();
    let s = client.submit_job(req).await.unwrap_err();
    assert_eq!(s.code(), Code::ResourceExhausted);
    assert_eq!(reason(&s), "QUEUE_FULL");
    let mut other = request("chat");
    other.tenant = "team-b".into();
    assert!(
        client.submit_job(other).await.is_ok(),
        "another tenant has its own bound"
    );
    let s = client
        .get_job(proto::GetJobRequest {
            id: "job-nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::NotFound);
}

#[tokio::test]
async fn a_job_accepted_survives_sigkill_and_completes_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    // Slow upstream: the job is mid-run when the process is killed.
    let a = Mock::start("openai", &["--tokens", "40", "--token-delay-ms", "50"]).await;
    let config = queue_config(&[&a], dir.path(), "");
    let mut sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let mut req = request("chat");
    req.messages[0].content = "durable question".into();
    let job = client.submit_job(req).await.unwrap().into_inner();
    a.wait_for("the job's run reached the upstream", |l| !l.is_empty())
        .await;
    sy.child.start_kill().unwrap();
    sy.child.wait().await.unwrap();

    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let done = wait_job(&mut client, &job.id, 20).await;
    assert_eq!(done.state, JobState::Succeeded as i32, "{done:?}");
    assert!(
        done.attempts >= 2,
        "the killed run and the one after the restart: {}",
        done.attempts
    );
    let log = a.requests().await;
    let completed = log.iter().filter(|r| r["completed"] == true).count();
    assert_eq!(completed, 1, "exactly one complete answer: {log:#?}");
    assert_eq!(
        log[0]["client_hung_up"], true,
        "the first run died with the process"
    );
}

#[tokio::test]
async fn the_recovery_drain_never_exceeds_its_bucket_and_every_job_completes() {
    const JOBS: usize = 1000;
    const RATE: f64 = 250.0;
    const BURST: usize = 10;
    let dir = tempfile::tempdir().unwrap();
    let a = Mock::start("openai", &["--tokens", "2"]).await;
    a.set_fault(json!({"type": "status", "status": 503})).await;
    let extra = format!("drain = {{ rate = {RATE}, burst = {BURST} }}");
    let config = queue_config(&[&a], dir.path(), &extra).replace(
        "  [[providers.models]]",
        "breaker = { consecutive_failures = 1, open_for = \"500ms\", max_open_for = \"500ms\", jitter = 0.0 }\n  [[providers.models]]",
    );
    let sy = Switchyard::start(&config).await;
    let client = sy.client().await;
    // Accept 1,000 jobs while the provider is down.
    let mut tasks = Vec::new();
    for w in 0..8 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in (w..JOBS).step_by(8) {
                let mut req = request("chat");
                req.messages[0].content = format!("job {i}");
                ids.push(client.submit_job(req).await.unwrap().into_inner().id);
            }
            ids
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    assert_eq!(ids.len(), JOBS);
    // Capacity returns: the breaker closes after its probe, and the backlog drains.
    a.clear().await;
    a.set_fault(json!({})).await;
    let log = a
        .wait_for_secs("every job reached the upstream", 60, |l| {
            l.iter().filter(|r| r["status"] == 200).count() >= JOBS
        })
        .await;
    let mut times: Vec<f64> = log
        .iter()
        .filter(|r| r["status"] == 200)
        .map(|r| r["arrived_ms"].as_f64().unwrap())
        .collect();
    times.sort_by(f64::total_cmp);
    // In any one-second window, at most burst + rate arrivals, plus those a
    // busy machine delayed on their way: a run granted up to 100 ms before
    // the window may reach the upstream inside it (a bucket that let the
    // backlog go at once would put hundreds more in one window).
    const LATE: f64 = RATE * 0.1;
    let mut worst = 0;
    let mut j = 0;
    for i in 0..times.len() {
        while times[i] - times[j] >= 1000.0 {
            j += 1;
        }
        worst = worst.max(i - j + 1);
    }
    assert!(
        worst as f64 <= RATE + BURST as f64 + LATE,
        "{worst} arrivals within one second"
    );
    let span = (times[times.len() - 1] - times[0]) / 1000.0;
    assert!(
        span >= (JOBS - BURST) as f64 / RATE * 0.9,
        "drained over {span:.2} s, not at once"
    );

    let mut client = client.clone();
    let mut done = 0;
    for id in &ids {
        let job = wait_job(&mut client, id, 30).await;
        assert_eq!(job.state, JobState::Succeeded as i32);
        done += 1;
    }
    assert_eq!(done, JOBS);
}

#[tokio::test]
async fn the_cost_cap_stops_a_tenant_and_names_it() {
    let a = Mock::start("openai", &[]).await;
    let config = format!(
        // Each request reserves its maximum (64 tokens at 1 USD/Mtok, plus
        // the prompt) and settles to the 16 tokens the mock sends: two fit.
        "[cost]\ndefault_cap_usd = 0.0001\n{}{}",
        provider("p", "openai", &a.base_url(), "m").replace(
            "context_tokens = 128000",
            "context_tokens = 128000\n  price = { input_per_mtok = 1.0, output_per_mtok = 1.0 }"
        ),
        route("chat", &["p/m"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    let mut served = 0;
    let mut capped = None;
    for _ in 0..20 {
        let mut req = request("chat");
        req.tenant = "team-a".into();
        let got = stream(&mut client, req).await;
        match (got.finished, got.status) {
            (Some(f), None) => {
                assert!(f.cost_usd > 0.0);
                served += 1;
            }
            (None, Some(s)) => {
                capped = Some(s);
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    let s = capped.expect("the cap stopped the tenant");
    assert_eq!(s.code(), Code::ResourceExhausted);
    assert_eq!(reason(&s), "COST_CAP");
    assert_eq!(served, 2, "two maximum-cost holds fit the cap");
    assert_eq!(
        a.requests().await.len(),
        served,
        "no upstream call past the cap"
    );
    let mut other = request("chat");
    other.tenant = "team-b".into();
    assert!(
        stream(&mut client, other).await.finished.is_some(),
        "other tenants are unaffected"
    );
}
