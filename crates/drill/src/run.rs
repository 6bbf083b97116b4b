//! Executes a scenario's phases against a router: sets each phase's faults,
//! clears the mock logs, sends the phase's requests (one at a time with a line
//! per request, or concurrently with a progress count) and keeps what every
//! request, mock log and status snapshot showed, for the report and the checks.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::Channel;

use switchyard::proto;
use switchyard::proto::router_client::RouterClient;
use switchyard_mock::RequestRecord;

use super::control::{Mock, Snapshot, StatusSource};
use super::report;
use super::scenario::{Phase, Scenario};
use super::DrillError;

/// How one drill request ended, as the client saw it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestResult {
    /// 1-based across the whole drill.
    pub n: usize,
    pub ok: bool,
    /// The gRPC status code of a failed request.
    pub code: Option<tonic::Code>,
    /// `ErrorInfo.reason` of a failed request.
    pub reason: String,
    pub message: String,
    /// `provider/model` that served it.
    pub served_by: Option<(String, String)>,
    /// Tier of the answer (`primary`, `fallback`, ...).
    pub tier: Option<String>,
    /// Upstream attempts (from `Finished` or the error's metadata).
    pub attempts: u32,
    /// Time to the first delta (streams only).
    pub ttft: Option<Duration>,
    /// Output tokens (usage when given, else deltas received).
    pub tokens: u32,
    pub resets: u32,
    /// The answer is exactly `tok0 tok1 ...` (nothing stitched).
    pub clean: bool,
}

/// Everything one phase produced.
#[derive(Debug, Clone, Default)]
pub struct PhaseResult {
    pub name: String,
    pub requests: Vec<RequestResult>,
    /// Each mock's request log for the phase.
    pub upstream: BTreeMap<String, Vec<RequestRecord>>,
    pub max_in_flight: BTreeMap<String, u32>,
    /// Router status at the end of the phase (`None`: could not be read).
    pub end: Option<Snapshot>,
    pub elapsed: Duration,
}

/// What the phases run against.
pub struct Env {
    pub client: RouterClient<Channel>,
    pub mocks: BTreeMap<String, Mock>,
    pub status: StatusSource,
    pub route: String,
    /// Caller bearer token for the Router service, if the target needs one.
    pub caller_token: Option<String>,
}

/// Runs every phase in order.
pub async fn run_phases(
    scenario: &Scenario,
    env: &mut Env,
    out: &mut (dyn Write + Send),
    quiet: bool,
) -> Result<Vec<PhaseResult>, DrillError> {
    let mut results = Vec::new();
    let mut next_n = 1;
    for phase in &scenario.phases {
        let r = run_phase(phase, env, next_n, out, quiet).await?;
        next_n += r.requests.len();
        results.push(r);
    }
    Ok(results)
}

async fn run_phase(
    phase: &Phase,
    env: &mut Env,
    first_n: usize,
    out: &mut (dyn Write + Send),
    quiet: bool,
) -> Result<PhaseResult, DrillError> {
    for (mock, spec) in &phase.fault_specs {
        if let Some(m) = env.mocks.get(mock) {
            m.set_fault(spec).await?;
        }
    }
    for m in env.mocks.values() {
        m.clear().await?;
    }
    if !quiet {
        let faults = report::describe_faults(phase);
        let _ = writeln!(
            out,
            "\n== phase {}: {} request(s), concurrency {}, {}{}",
            phase.name,
            phase.requests,
            phase.concurrency,
            if phase.stream { "streaming" } else { "unary" },
            faults
        );
    }
    if phase.pause_ms > 0 {
        tokio::time::sleep(Duration::from_millis(phase.pause_ms)).await;
    }
    let started = Instant::now();
    let requests = if phase.concurrency == 1 {
        sequential(phase, env, first_n, out, quiet).await?
    } else {
        concurrent(phase, env, first_n, out, quiet).await
    };
    let elapsed = started.elapsed();
    let mut result = PhaseResult {
        name: phase.name.clone(),
        requests,
        elapsed,
        ..PhaseResult::default()
    };
    for (name, m) in &env.mocks {
        result.upstream.insert(name.clone(), m.requests().await?);
        result
            .max_in_flight
            .insert(name.clone(), m.stats().await?.max_in_flight);
    }
    result.end = env.status.snapshot(&env.route).await;
    Ok(result)
}

async fn sequential(
    phase: &Phase,
    env: &mut Env,
    first_n: usize,
    out: &mut (dyn Write + Send),
    quiet: bool,
) -> Result<Vec<RequestResult>, DrillError> {
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut results = Vec::new();
    for i in 0..phase.requests as usize {
        let mut client = env.client.clone();
        let r = call(
            &mut client,
            &env.route,
            phase,
            first_n + i,
            env.caller_token.as_deref(),
        )
        .await;
        let mut upstream = Vec::new();
        for (name, m) in &env.mocks {
            let log = m.requests().await?;
            let last = seen.get(name).copied().unwrap_or(0);
            let fresh: Vec<RequestRecord> = log.into_iter().filter(|x| x.seq > last).collect();
            if let Some(max) = fresh.iter().map(|x| x.seq).max() {
                seen.insert(name.clone(), max);
            }
            upstream.push((name.clone(), fresh));
        }
        if !quiet {
            let snapshot = env.status.snapshot(&env.route).await;
            let line = report::request_line(&phase.name, &r, &upstream, snapshot.as_ref());
            let _ = writeln!(out, "{line}");
        }
        results.push(r);
    }
    Ok(results)
}

async fn concurrent(
    phase: &Phase,
    env: &mut Env,
    first_n: usize,
    out: &mut (dyn Write + Send),
    quiet: bool,
) -> Vec<RequestResult> {
    let total = phase.requests as usize;
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (tx, mut rx) = mpsc::unbounded_channel();
    for _ in 0..phase.concurrency {
        let mut client = env.client.clone();
        let next = next.clone();
        let tx = tx.clone();
        let phase = phase.clone();
        let route = env.route.clone();
        let token = env.caller_token.clone();
        tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    return;
                }
                let r = call(&mut client, &route, &phase, first_n + i, token.as_deref()).await;
                if tx.send(r).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);
    let mut results = Vec::with_capacity(total);
    let step = (total / 10).max(1);
    while let Some(r) = rx.recv().await {
        results.push(r);
        let done = results.len();
        if !quiet && (done % step == 0 || done == total) {
            let ok = results.iter().filter(|r| r.ok).count();
            let _ = writeln!(
                out,
                "   {}: {done}/{total} done, {ok} ok, {} failed",
                phase.name,
                done - ok
            );
        }
    }
    results.sort_by_key(|r| r.n);
    results
}

fn completion_request(
    route: &str,
    phase: &Phase,
    n: usize,
    token: Option<&str>,
) -> tonic::Request<proto::CompletionRequest> {
    let mut req = tonic::Request::new(proto::CompletionRequest {
        route: route.to_string(),
        messages: vec![proto::Message {
            role: "user".into(),
            content: format!("Drill request #{n}: say something."),
            ..Default::default()
        }],
        max_tokens: phase.max_tokens,
        ..Default::default()
    });
    req.set_timeout(Duration::from_millis(phase.deadline_ms));
    if let Some(value) = token.and_then(|t| format!("Bearer {t}").parse().ok()) {
        req.metadata_mut().insert("authorization", value);
    }
    req
}

/// Sends one request and records how it ended.
pub async fn call(
    client: &mut RouterClient<Channel>,
    route: &str,
    phase: &Phase,
    n: usize,
    token: Option<&str>,
) -> RequestResult {
    let req = completion_request(route, phase, n, token);
    let mut r = if phase.stream {
        stream(client, req).await
    } else {
        unary(client, req).await
    };
    r.n = n;
    r
}

async fn stream(
    client: &mut RouterClient<Channel>,
    req: tonic::Request<proto::CompletionRequest>,
) -> RequestResult {
    use proto::completion_event::Event;
    let start = Instant::now();
    let mut r = RequestResult::default();
    let mut s = match client.stream_completion(req).await {
        Ok(s) => s.into_inner(),
        Err(status) => return failed(r, &status),
    };
    let mut text = String::new();
    let mut deltas = 0u32;
    loop {
        match s.message().await {
            Ok(Some(ev)) => match ev.event {
                Some(Event::Started(x)) => r.tier = Some(tier_name(x.tier)),
                Some(Event::Delta(d)) => {
                    r.ttft.get_or_insert_with(|| start.elapsed());
                    deltas += 1;
                    text.push_str(&d.text);
                }
                Some(Event::Reset(_)) => {
                    r.resets += 1;
                    text.clear();
                    deltas = 0;
                }
                Some(Event::Finished(f)) => finished(&mut r, &f),
                // A continuation's text simply follows what the caller holds;
                // a drill's single replica never moves a stream.
                Some(Event::Continued(_) | Event::Moved(_)) => {}
                // A queued answer is not a live one: the drill counts it as served by "queue".
                Some(Event::Job(_)) => {
                    r.tier = Some("queued".into());
                    r.served_by = Some(("queue".into(), String::new()));
                }
                None => {}
            },
            Ok(None) => break,
            Err(status) => {
                r.tokens = deltas;
                return failed(r, &status);
            }
        }
    }
    if r.served_by.is_none() {
        r.message = "stream ended without Finished".into();
        r.tokens = deltas;
        return r;
    }
    if r.tokens == 0 {
        r.tokens = deltas;
    }
    r.ok = true;
    r.clean = is_clean(&text);
    r
}

fn finished(r: &mut RequestResult, f: &proto::Finished) {
    r.served_by = f
        .served_by
        .as_ref()
        .map(|s| (s.provider.to_string(), s.model.to_string()));
    r.tier = Some(tier_name(f.tier));
    r.attempts = f.attempts;
    r.tokens = f.usage.as_ref().map_or(0, |u| u.output_tokens);
}

async fn unary(
    client: &mut RouterClient<Channel>,
    req: tonic::Request<proto::CompletionRequest>,
) -> RequestResult {
    let mut r = RequestResult::default();
    match client.complete(req).await {
        Ok(resp) => {
            let c = resp.into_inner();
            r.ok = true;
            r.served_by = c.served_by.map(|s| (s.provider.into(), s.model.into()));
            r.tier = Some(tier_name(c.tier));
            r.attempts = c.attempts;
            r.tokens = c.usage.map_or(0, |u| u.output_tokens);
            r.clean = is_clean(&c.text);
            r
        }
        Err(status) => failed(r, &status),
    }
}

fn failed(mut r: RequestResult, status: &tonic::Status) -> RequestResult {
    use tonic_types::StatusExt;
    r.ok = false;
    r.code = Some(status.code());
    r.message = status.message().to_string();
    if let Some(info) = status.get_error_details().error_info() {
        r.reason = info.reason.clone();
        r.attempts = info
            .metadata
            .get("attempts")
            .and_then(|a| a.parse().ok())
            .unwrap_or(0);
    }
    r
}

fn tier_name(tier: i32) -> String {
    proto::Tier::try_from(tier)
        .map(|t| {
            t.as_str_name()
                .trim_start_matches("TIER_")
                .to_ascii_lowercase()
        })
        .unwrap_or_else(|_| tier.to_string())
}

/// The mocks answer `tok0 tok1 ...`: anything else was stitched or cut.
pub fn is_clean(text: &str) -> bool {
    let mut n = 0usize;
    for (i, word) in text.split_whitespace().enumerate() {
        if word != format!("tok{i}") {
            return false;
        }
        n += 1;
    }
    n > 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn drill_clean_answers_are_one_unbroken_token_sequence() {
        assert!(is_clean("tok0 tok1 tok2 "));
        assert!(!is_clean("tok0 tok1 tok0 tok1 "));
        assert!(!is_clean("tok1 tok2 "));
        assert!(!is_clean(""));
    }

    #[test]
    fn drill_tier_names_are_short() {
        assert_eq!(tier_name(proto::Tier::Fallback as i32), "fallback");
    }
}
