//! The fault matrix (reference Part C.3): the single-fault rows as one table
//! (`rows()`), the rows that need a sequence of requests or timing as tests of
//! their own; each on
//! the real binary with real mock upstreams. Every test asserts both what the
//! client saw (status, ErrorInfo reason, finish reason, tier, served_by,
//! attempts) and what the upstreams saw (their request logs). Timing is only
//! ever a generous lower bound, or an upper bound far from the real value.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};
use switchyard::proto::{self, FinishReason, Tier};
use tonic::Code;
use tonic_types::StatusExt;

// ---- Rig: mocks + switchyard ------------------------------------------------

fn model_of(kind: &str) -> &'static str {
    if kind == "anthropic" {
        "claude-sonnet-4-5"
    } else {
        "gpt-4o-mini"
    }
}

/// A provider block with short timeouts; `extra` adds or overrides keys.
fn prov(id: &str, kind: &str, base_url: &str, extra: &str) -> String {
    let mut keys = String::new();
    if !extra.contains("first_token_timeout") {
        keys.push_str("first_token_timeout = \"300ms\"\n");
    }
    if !extra.contains("idle_timeout") {
        keys.push_str("idle_timeout = \"300ms\"\n");
    }
    let model = model_of(kind);
    format!(
        r#"
[[providers]]
id = "{id}"
kind = "{kind}"
base_url = "{base_url}"
{keys}{extra}
  [[providers.models]]
  name = "{model}"
  capabilities = ["chat", "stream", "tools", "json"]
  context_tokens = 128000
"#
    )
}

/// What a test needs started. `p_kind` "" means openai; no `s_kind`: one target.
#[derive(Default)]
struct Spec<'a> {
    p_kind: &'a str,
    s_kind: Option<&'a str>,
    p_args: &'a [&'a str],
    s_args: &'a [&'a str],
    p_extra: &'a str,
    s_extra: &'a str,
    /// Lines added to the `chat` route.
    route_extra: &'a str,
    /// Top-level tables (`[retry_budget]`, ...), placed first.
    top: &'a str,
    /// Base URL of the primary instead of its mock (e.g. a closed port).
    p_url: Option<String>,
}

struct Rig {
    p: Mock,
    s: Option<Mock>,
    sy: Switchyard,
}

impl Rig {
    fn s(&self) -> &Mock {
        self.s.as_ref().unwrap()
    }
    async fn client(&self) -> proto::router_client::RouterClient<tonic::transport::Channel> {
        self.sy.client().await
    }
}

async fn rig(spec: Spec<'_>) -> Rig {
    let p_kind = if spec.p_kind.is_empty() {
        "openai"
    } else {
        spec.p_kind
    };
    let p = Mock::start(p_kind, spec.p_args).await;
    let s = match spec.s_kind {
        Some(kind) => Some(Mock::start(kind, spec.s_args).await),
        None => None,
    };
    let p_url = spec.p_url.clone().unwrap_or_else(|| p.base_url());
    let mut config = format!(
        "{}\n{}",
        spec.top,
        prov("primary", p_kind, &p_url, spec.p_extra)
    );
    let mut targets = vec![format!("\"primary/{}\"", model_of(p_kind))];
    if let (Some(kind), Some(m)) = (spec.s_kind, &s) {
        config.push_str(&prov("secondary", kind, &m.base_url(), spec.s_extra));
        targets.push(format!("\"secondary/{}\"", model_of(kind)));
    }
    config.push_str(&format!(
        "\n[[routes]]\nname = \"chat\"\ntargets = [{}]\n{}\n",
        targets.join(", "),
        spec.route_extra
    ));
    let sy = Switchyard::start(&config).await;
    Rig { p, s, sy }
}

/// Primary (openai) + secondary (anthropic), defaults otherwise.
async fn two() -> Rig {
    rig(Spec {
        s_kind: Some("anthropic"),
        ..Spec::default()
    })
    .await
}

/// One openai target.
async fn one() -> Rig {
    rig(Spec::default()).await
}

// ---- Client-side helpers ------------------------------------------------------

/// A request carrying `grpc-timeout` (set by hand: tonic's own client timer
/// would answer CANCELLED locally; see tests/walking_skeleton.rs).
fn timed(req: proto::CompletionRequest, timeout: &str) -> tonic::Request<proto::CompletionRequest> {
    let mut r = tonic::Request::new(req);
    r.metadata_mut()
        .insert("grpc-timeout", timeout.parse().unwrap());
    r
}

/// One unary-framed StreamCompletion call over raw HTTP/2 with `grpc-timeout`,
/// for the server's own answer to a request that fails before its first event
/// (a trailers-only response). tonic's channel would race its own client-side
/// timer against the server's DEADLINE_EXCEEDED and may report CANCELLED.
async fn raw_status(
    sy: &Switchyard,
    req: proto::CompletionRequest,
    timeout: &str,
) -> tonic::Status {
    let msg = prost::Message::encode_to_vec(&req);
    let mut body = vec![0u8];
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(&msg);
    let http = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let resp = http
        .post(format!(
            "http://{}/switchyard.v1.Router/StreamCompletion",
            sy.grpc
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", timeout)
        .body(body)
        .send()
        .await
        .unwrap();
    tonic::Status::from_header_map(resp.headers()).expect("a trailers-only status")
}

/// The stream ended OK with a `Finished`; returns it.
fn ok(got: &Collected) -> proto::Finished {
    assert!(got.status.is_none(), "expected OK, got {:?}", got.status);
    got.finished.clone().expect("a Finished event")
}

/// The stream ended with an error and never with a `Finished`; returns the status.
fn failed(got: &Collected) -> tonic::Status {
    assert!(
        got.finished.is_none(),
        "must not finish OK: {:?}",
        got.finished
    );
    got.status.clone().expect("an error status")
}

fn served_by(f: &proto::Finished) -> String {
    f.served_by.as_ref().unwrap().provider.to_string()
}

fn retry_delay(s: &tonic::Status) -> Option<Duration> {
    s.get_error_details()
        .retry_info()
        .and_then(|r| r.retry_delay)
}

/// The full text of a healthy mock answer of `n` tokens.
fn full_text(n: u32) -> String {
    (0..n).map(|i| format!("tok{i} ")).collect()
}

// ---- Upstream-side helpers ----------------------------------------------------

fn attempt_header(r: &Value) -> String {
    r["headers"]["x-switchyard-attempt"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

fn arrived(r: &Value) -> f64 {
    r["arrived_ms"].as_f64().unwrap()
}

/// Requests a caller caused (synthetic probes send `max_tokens: 1`, attempt 0).
fn user_requests(log: &[Value]) -> usize {
    log.iter().filter(|r| !is_probe(r)).count()
}

fn is_probe(r: &Value) -> bool {
    r["max_tokens"] == 1 && attempt_header(r) == "0"
}

/// Sum of the samples of metric `name` whose labels include all of `labels`.
async fn metric(sy: &Switchyard, name: &str, labels: &[(&str, &str)]) -> f64 {
    let (code, body) = sy.admin_get("/metrics").await;
    assert_eq!(code, 200);
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest),
                None => (series, ""),
            };
            (n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

/// Waits (briefly) until metric `name` with `labels` sums to `want`: outcome
/// reports reach the provider actor asynchronously, just after the caller's answer.
async fn expect_metric(sy: &Switchyard, name: &str, labels: &[(&str, &str)], want: f64) {
    let mut got = 0.0;
    for _ in 0..100 {
        got = metric(sy, name, labels).await;
        if got == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("metric {name}{labels:?} is {got}, expected {want}");
}

/// 0 closed, 1 half-open, 2 open.
async fn breaker_state(sy: &Switchyard, provider: &str, want: f64) {
    expect_metric(
        sy,
        "switchyard_breaker_state",
        &[("provider", provider)],
        want,
    )
    .await
}

/// All breaker transitions of `provider`.
async fn transitions(sy: &Switchyard, provider: &str, want: f64) {
    let labels = [("provider", provider)];
    expect_metric(sy, "switchyard_breaker_transitions_total", &labels, want).await
}

async fn transition(sy: &Switchyard, provider: &str, from: &str, to: &str, want: f64) {
    let labels = [("provider", provider), ("from", from), ("to", to)];
    expect_metric(sy, "switchyard_breaker_transitions_total", &labels, want).await
}

async fn attempts_metric(sy: &Switchyard, provider: &str, outcome: &str, want: f64) {
    let labels = [("provider", provider), ("outcome", outcome)];
    expect_metric(sy, "switchyard_upstream_attempts_total", &labels, want).await
}

async fn cooldowns(sy: &Switchyard, provider: &str, reason: &str, want: f64) {
    let labels = [("provider", provider), ("reason", reason)];
    expect_metric(sy, "switchyard_cooldowns_total", &labels, want).await
}

/// A port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

// ---- The table: one fault on the primary, one request -----------------------------

/// What the caller must see.
enum Expect {
    /// Served by this provider after this many attempts.
    Served(&'static str, u32),
    /// This status and `ErrorInfo` reason.
    Error(Code, &'static str),
}

/// One row: the primary's kind and fault, whether a secondary exists, what
/// the caller sees, and how often each upstream was hit.
struct Row {
    name: &'static str,
    p_kind: &'static str,
    secondary: bool,
    fault: Value,
    expect: Expect,
    p_hits: usize,
    s_hits: usize,
}

fn rows() -> Vec<Row> {
    use Expect::*;
    let row = |name, p_kind, secondary, fault, expect, p_hits, s_hits| Row {
        name,
        p_kind,
        secondary,
        fault,
        expect,
        p_hits,
        s_hits,
    };
    vec![
        row(
            "500 fails over",
            "openai",
            true,
            json!({"type": "status", "status": 500}),
            Served("secondary", 2),
            1,
            1,
        ),
        row(
            "502 fails over",
            "openai",
            true,
            json!({"type": "status", "status": 502}),
            Served("secondary", 2),
            1,
            1,
        ),
        row(
            "503 alone is retried, then UNAVAILABLE",
            "openai",
            false,
            json!({"type": "status", "status": 503}),
            Error(Code::Unavailable, "UPSTREAM_OVERLOADED"),
            3,
            0,
        ),
        row(
            "503 once alone is retried and served",
            "openai",
            false,
            json!({"type": "status", "status": 503, "times": 1}),
            Served("primary", 2),
            2,
            0,
        ),
        row(
            "529 (Anthropic) fails over",
            "anthropic",
            true,
            json!({"type": "status", "preset": "overloaded"}),
            Served("secondary", 2),
            1,
            1,
        ),
        row(
            "x-should-retry: false on 503 alone: one attempt",
            "openai",
            false,
            json!({"type": "status", "status": 503, "headers": {"x-should-retry": "false"}}),
            Error(Code::Unavailable, "UPSTREAM_OVERLOADED"),
            1,
            0,
        ),
        row(
            "404 model not found fails over",
            "openai",
            true,
            json!({"type": "status", "preset": "not_found"}),
            Served("secondary", 2),
            1,
            1,
        ),
        row(
            "404 model not found alone is NOT_FOUND, not retried",
            "openai",
            false,
            json!({"type": "status", "preset": "not_found"}),
            Error(Code::NotFound, "UPSTREAM_MODEL_NOT_FOUND"),
            1,
            0,
        ),
        row(
            "400 invalid is INVALID_ARGUMENT, no failover",
            "openai",
            true,
            json!({"type": "status", "preset": "invalid"}),
            Error(Code::InvalidArgument, "UPSTREAM_INVALID_REQUEST"),
            1,
            0,
        ),
        row(
            "quota alone is PROVIDER_QUOTA_EXHAUSTED",
            "openai",
            false,
            json!({"type": "status", "preset": "insufficient_quota"}),
            Error(Code::Unavailable, "PROVIDER_QUOTA_EXHAUSTED"),
            1,
            0,
        ),
        row(
            "empty [DONE] fails over",
            "openai",
            true,
            json!({"type": "empty_done"}),
            Served("secondary", 2),
            1,
            1,
        ),
        row(
            "no terminator after tokens is UNAVAILABLE (never OK)",
            "openai",
            true,
            json!({"type": "no_terminator"}),
            Error(Code::Unavailable, "UPSTREAM_STREAM_TRUNCATED"),
            1,
            0,
        ),
        row(
            "malformed first frame fails over",
            "openai",
            true,
            json!({"type": "malformed", "after_tokens": 0, "close": true}),
            Served("secondary", 2),
            1,
            1,
        ),
        row(
            "Anthropic overloaded_error event before text fails over",
            "anthropic",
            true,
            json!({"type": "error_event", "after_tokens": 0, "error_type": "overloaded_error"}),
            Served("secondary", 2),
            1,
            1,
        ),
        row(
            "llama.cpp legacy 400 is INVALID_ARGUMENT",
            "openai",
            true,
            json!({"type": "legacy_error", "code": 400}),
            Error(Code::InvalidArgument, "UPSTREAM_INVALID_REQUEST"),
            1,
            0,
        ),
    ]
}

#[tokio::test]
async fn the_fault_table_one_fault_one_request() {
    for row in rows() {
        let other = if row.p_kind == "anthropic" {
            "openai"
        } else {
            "anthropic"
        };
        let r = rig(Spec {
            p_kind: row.p_kind,
            s_kind: row.secondary.then_some(other),
            ..Spec::default()
        })
        .await;
        r.p.set_fault(row.fault.clone()).await;
        let mut c = r.client().await;
        let got = stream(&mut c, request("chat")).await;
        let name = row.name;
        match row.expect {
            Expect::Served(by, attempts) => {
                let f = got
                    .finished
                    .clone()
                    .unwrap_or_else(|| panic!("{name}: not served: {:?}", got.status));
                assert_eq!(served_by(&f), by, "{name}");
                assert_eq!(f.attempts, attempts, "{name}");
                assert_eq!(
                    got.started.len(),
                    1,
                    "{name}: failed attempts are invisible"
                );
                assert_eq!(got.text, full_text(16), "{name}: one whole answer");
            }
            Expect::Error(code, why) => {
                assert!(got.finished.is_none(), "{name}: must not finish OK");
                let s = got
                    .status
                    .clone()
                    .unwrap_or_else(|| panic!("{name}: no status"));
                assert_eq!(s.code(), code, "{name}: {s:?}");
                assert_eq!(reason(&s), why, "{name}");
            }
        }
        assert_eq!(
            user_requests(&r.p.requests().await),
            row.p_hits,
            "{name}: primary hits"
        );
        let s_hits = match &r.s {
            Some(m) => user_requests(&m.requests().await),
            None => 0,
        };
        assert_eq!(s_hits, row.s_hits, "{name}: secondary hits");
    }
}

// ---- Rows 1-2: Retry-After ----------------------------------------------------

#[tokio::test]
async fn row_01_retry_after_with_a_secondary_fails_over_at_once() {
    let r = two().await;
    r.p.set_fault(json!({"type": "status", "status": 503, "headers": {"retry-after": "2"}}))
        .await;
    let mut c = r.client().await;
    let t = Instant::now();
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "failed over without waiting the Retry-After"
    );
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.tier, Tier::Fallback as i32);
    assert_eq!(f.attempts, 2);
    assert_eq!(got.started.len(), 1, "the failed attempt is invisible");
    let (pl, sl) = (r.p.requests().await, r.s().requests().await);
    assert_eq!((pl.len(), sl.len()), (1, 1));
    assert_eq!(attempt_header(&pl[0]), "1");
    assert_eq!(attempt_header(&sl[0]), "2");
}

#[tokio::test]
async fn row_01_retry_after_single_target_waits_then_retries() {
    let r = one().await;
    r.p.set_fault(
        json!({"type": "status", "status": 503, "headers": {"retry-after": "1"}, "times": 1}),
    )
    .await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(served_by(&f), "primary");
    assert_eq!(f.tier, Tier::Primary as i32);
    assert_eq!(f.attempts, 2);
    let log = r.p.requests().await;
    assert_eq!(log.len(), 2, "P hit exactly twice");
    assert_eq!(attempt_header(&log[0]), "1");
    assert_eq!(attempt_header(&log[1]), "2");
    let gap = arrived(&log[1]) - arrived(&log[0]);
    assert!(gap >= 1000.0, "2nd attempt only {gap} ms after the 1st");
}

#[tokio::test]
async fn row_02_long_retry_after_with_short_deadline_fails_over() {
    let r = two().await;
    r.p.set_fault(json!({"type": "status", "status": 503, "headers": {"retry-after": "120"}}))
        .await;
    let mut c = r.client().await;
    let t = Instant::now();
    let got = stream(&mut c, timed(request("chat"), "3000m")).await;
    let f = ok(&got);
    assert!(t.elapsed() < Duration::from_secs(3), "no wait");
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert_eq!(r.p.requests().await.len(), 1);
    assert_eq!(r.s().requests().await.len(), 1);
}

#[tokio::test]
async fn row_02_long_retry_after_alone_is_unavailable_with_retry_info() {
    let r = one().await;
    r.p.set_fault(json!({"type": "status", "status": 503, "headers": {"retry-after": "120"}}))
        .await;
    let mut c = r.client().await;
    let t = Instant::now();
    let got = stream(&mut c, timed(request("chat"), "3000m")).await;
    let s = failed(&got);
    assert!(
        t.elapsed() < Duration::from_millis(2900),
        "answered at once, not at the deadline"
    );
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_OVERLOADED");
    assert_eq!(retry_delay(&s), Some(Duration::from_secs(120)));
    assert_eq!(error_meta(&s, "attempts").as_deref(), Some("1"));
    assert_eq!(r.p.requests().await.len(), 1, "P hit once");
}

// ---- Rows 3-4: overload and the breaker ------------------------------------------

#[tokio::test]
async fn row_03_anthropic_529_fails_over_and_is_recorded_as_overloaded() {
    let r = rig(Spec {
        p_kind: "anthropic",
        s_kind: Some("openai"),
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "preset": "overloaded"}))
        .await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    let pl = r.p.requests().await;
    assert_eq!(pl.len(), 1);
    assert_eq!(pl[0]["status"], 529);
    assert_eq!(r.s().requests().await.len(), 1);
    attempts_metric(&r.sy, "primary", "overloaded", 1.0).await;
    attempts_metric(&r.sy, "secondary", "ok", 1.0).await;
    // I7: the upstream's own request id reaches the caller.
    assert!(f.upstream_request_id.starts_with("req_mock"), "{f:?}");
    assert!(!f.request_id.is_empty());
}

#[tokio::test]
async fn row_04_five_failures_trip_the_breaker_then_a_probe_closes_it() {
    // A high health prior keeps P ranked first, so the breaker (not the
    // health ranking) is what takes it out of the plan.
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        p_extra: "breaker = { consecutive_failures = 5, open_for = \"500ms\", jitter = 0.0 }\nhealth = { prior_successes = 100 }",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "preset": "overloaded"}))
        .await;
    let mut c = r.client().await;
    for i in 0..5 {
        let f = ok(&stream(&mut c, request("chat")).await);
        assert_eq!(served_by(&f), "secondary", "request {i}");
        assert_eq!(f.attempts, 2);
    }
    assert_eq!(r.p.requests().await.len(), 5);
    breaker_state(&r.sy, "primary", 2.0).await;
    // Request 6: P is not even tried.
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 1);
    assert_eq!(f.tier, Tier::Fallback as i32);
    assert_eq!(r.p.requests().await.len(), 5, "request 6 never hit P");
    assert_eq!(r.s().requests().await.len(), 6);
    // P recovers; after open_for the next request is the probe and closes it.
    r.p.set_fault(json!({})).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "primary");
    assert_eq!(f.tier, Tier::Primary as i32);
    assert_eq!(r.p.requests().await.len(), 6);
    breaker_state(&r.sy, "primary", 0.0).await;
    transition(&r.sy, "primary", "closed", "open", 1.0).await;
    transition(&r.sy, "primary", "open", "half_open", 1.0).await;
    transition(&r.sy, "primary", "half_open", "closed", 1.0).await;
    transitions(&r.sy, "secondary", 0.0).await;
}

// ---- Rows 5-8: throttles, quota, too large, auth ----------------------------------

#[tokio::test]
async fn row_05_rate_limit_fails_over_and_cools_p_down_without_tripping() {
    let r = two().await;
    r.p.set_fault(json!({"type": "status", "preset": "rate_limit",
        "headers": {"retry-after-ms": "1500"}, "times": 1}))
        .await;
    let mut c = r.client().await;
    let t0 = Instant::now();
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert_eq!(r.p.requests().await[0]["status"], 429);
    // Within the cooldown P is skipped.
    for _ in 0..3 {
        let f = ok(&stream(&mut c, request("chat")).await);
        assert_eq!(served_by(&f), "secondary");
        assert_eq!(f.attempts, 1, "P was not tried");
    }
    assert!(
        t0.elapsed() < Duration::from_millis(1400),
        "test too slow to be inside the cooldown"
    );
    assert_eq!(r.p.requests().await.len(), 1);
    // After it P serves again.
    tokio::time::sleep(Duration::from_millis(1600).saturating_sub(t0.elapsed())).await;
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "primary");
    assert_eq!(r.p.requests().await.len(), 2);
    assert_eq!(r.s().requests().await.len(), 4);
    breaker_state(&r.sy, "primary", 0.0).await;
    transitions(&r.sy, "primary", 0.0).await;
    cooldowns(&r.sy, "primary", "rate_limited", 1.0).await;
}

#[tokio::test]
async fn row_06_insufficient_quota_hits_p_once_then_skips_it() {
    let r = two().await;
    r.p.set_fault(json!({"type": "status", "preset": "insufficient_quota"}))
        .await;
    let mut c = r.client().await;
    let t = Instant::now();
    let f = ok(&stream(&mut c, request("chat")).await);
    assert!(t.elapsed() < Duration::from_secs(1), "no backoff sleep");
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    for _ in 0..3 {
        let f = ok(&stream(&mut c, request("chat")).await);
        assert_eq!(served_by(&f), "secondary");
        assert_eq!(f.attempts, 1);
    }
    assert_eq!(r.p.requests().await.len(), 1, "P hit exactly once");
    assert_eq!(r.s().requests().await.len(), 4);
    transitions(&r.sy, "primary", 0.0).await;
}

#[tokio::test]
async fn row_06_spend_limit_alone_is_provider_quota_exhausted() {
    let r = rig(Spec {
        p_kind: "anthropic",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "preset": "spend_limit"}))
        .await;
    let mut c = r.client().await;
    let s = failed(&stream(&mut c, request("chat")).await);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "PROVIDER_QUOTA_EXHAUSTED");
    assert_eq!(error_meta(&s, "attempts").as_deref(), Some("1"));
    // Cooling down: the next request makes no upstream call at all.
    let s = failed(&stream(&mut c, request("chat")).await);
    assert_eq!(s.code(), Code::Unavailable);
    assert_eq!(r.p.requests().await.len(), 1);
}

#[tokio::test]
async fn row_07_request_too_large_fails_over_for_that_request_only() {
    let r = two().await;
    r.p.set_fault(json!({"type": "status", "preset": "request_too_large", "times": 1}))
        .await;
    let mut c = r.client().await;
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    let pl = r.p.requests().await;
    assert_eq!(pl.len(), 1, "P hit once for that request");
    assert_eq!(pl[0]["status"], 429);
    // The next request still goes to P.
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "primary");
    assert_eq!(f.attempts, 1);
    assert_eq!(r.p.requests().await.len(), 2);
    assert_eq!(r.s().requests().await.len(), 1);
    breaker_state(&r.sy, "primary", 0.0).await;
    transitions(&r.sy, "primary", 0.0).await;
}

#[tokio::test]
async fn row_08_auth_failure_fails_over_and_p_is_skipped_afterwards() {
    let r = two().await;
    r.p.set_fault(json!({"type": "status", "preset": "auth"}))
        .await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    for _ in 0..2 {
        let f = ok(&stream(&mut c, request("chat")).await);
        assert_eq!(served_by(&f), "secondary");
        assert_eq!(f.attempts, 1);
    }
    assert_eq!(r.p.requests().await.len(), 1);
    assert_eq!(r.s().requests().await.len(), 3);
    cooldowns(&r.sy, "primary", "auth", 1.0).await;
}

#[tokio::test]
async fn row_08_auth_failure_alone_is_unavailable_and_never_leaks_the_body() {
    let r = one().await;
    r.p.set_fault(json!({"type": "status", "preset": "auth"}))
        .await;
    let mut c = r.client().await;
    let s = failed(&stream(&mut c, request("chat")).await);
    assert_ne!(s.code(), Code::Unauthenticated);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "PROVIDER_AUTH_FAILED");
    let all = format!("{s:?} {:?}", s.get_error_details());
    assert!(
        !all.contains("sk-secret-upstream-401-body"),
        "upstream 401 body leaked: {all}"
    );
    assert!(!r.sy.logs().contains("sk-secret-upstream-401-body"));
    assert_eq!(r.p.requests().await.len(), 1, "no retry on 401");
}

// ---- Rows 9-12: caller errors, 404, x-should-retry, refused ---------------------

#[tokio::test]
async fn row_09_invalid_request_is_invalid_argument_without_failover() {
    let r = two().await;
    for preset in ["invalid", "context_length"] {
        r.p.set_fault(json!({"type": "status", "preset": preset}))
            .await;
        let mut c = r.client().await;
        let s = failed(&stream(&mut c, request("chat")).await);
        assert_eq!(s.code(), Code::InvalidArgument, "{preset}: {s:?}");
        assert_eq!(reason(&s), "UPSTREAM_INVALID_REQUEST");
        assert_eq!(error_meta(&s, "provider").as_deref(), Some("primary"));
        let id = error_meta(&s, "upstream_request_id").unwrap_or_default();
        assert!(id.starts_with("req_mock"), "I7: upstream request id {id:?}");
    }
    assert_eq!(r.p.requests().await.len(), 2, "P hit once per request");
    assert_eq!(r.s().requests().await.len(), 0, "S2 never hit");
    transitions(&r.sy, "primary", 0.0).await;
}

#[tokio::test]
async fn row_11_should_retry_false_still_allows_failover() {
    let r = two().await;
    r.p.set_fault(json!({"type": "status", "status": 503, "headers": {"x-should-retry": "false"}}))
        .await;
    let mut c = r.client().await;
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert_eq!(r.p.requests().await.len(), 1);
    assert_eq!(r.s().requests().await.len(), 1);
}

#[tokio::test]
async fn row_11_should_retry_true_on_400_is_retried() {
    let r = one().await;
    r.p.set_fault(json!({"type": "status", "status": 400,
        "headers": {"x-should-retry": "true"}, "times": 1}))
        .await;
    let mut c = r.client().await;
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "primary");
    assert_eq!(f.attempts, 2);
    let log = r.p.requests().await;
    assert_eq!(log.len(), 2, "exactly two attempts");
    assert_eq!(log[0]["status"], 400);
    assert_eq!(attempt_header(&log[1]), "2");
}

#[tokio::test]
async fn row_12_connection_refused_fails_over_to_the_secondary() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        p_url: Some(format!("http://127.0.0.1:{}/v1", closed_port())),
        ..Spec::default()
    })
    .await;
    let mut c = r.client().await;
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert_eq!(f.tier, Tier::Fallback as i32);
    assert_eq!(r.p.requests().await.len(), 0);
    assert_eq!(r.s().requests().await.len(), 1);
    attempts_metric(&r.sy, "primary", "connect", 1.0).await;
}

// ---- Rows 13-16: timeouts, deadline, cancel ---------------------------------------

#[tokio::test]
async fn row_13_hang_times_out_and_fails_over_within_the_deadline() {
    let r = two().await;
    r.p.set_fault(json!({"type": "hang"})).await;
    let mut c = r.client().await;
    let t = Instant::now();
    let f = ok(&stream(&mut c, timed(request("chat"), "5000m")).await);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(280), "waited for the timeout");
    assert!(
        took < Duration::from_secs(4),
        "well before the 5 s deadline"
    );
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    r.p.wait_for("P's request was dropped", |l| {
        l.len() == 1 && l[0]["client_hung_up"] == true
    })
    .await;
    assert_eq!(r.s().requests().await.len(), 1);
    attempts_metric(&r.sy, "primary", "timeout", 1.0).await;
}

#[tokio::test]
async fn row_14_slow_first_token_fails_over() {
    let r = two().await;
    r.p.set_fault(json!({"type": "slow_first_token", "delay_ms": 3000}))
        .await;
    let mut c = r.client().await;
    let t = Instant::now();
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert!(t.elapsed() >= Duration::from_millis(280));
    assert!(
        t.elapsed() < Duration::from_millis(2900),
        "did not wait for P"
    );
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(got.started.len(), 1);
    assert_eq!(got.text, full_text(16));
    r.p.wait_for("P's slow request was cancelled", |l| {
        l.len() == 1 && l[0]["client_hung_up"] == true && l[0]["tokens_sent"] == 0
    })
    .await;
    assert_eq!(r.s().requests().await.len(), 1);
}

#[tokio::test]
async fn row_15_client_deadline_is_deadline_exceeded_and_closes_upstream() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        p_extra: "first_token_timeout = \"10s\"",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "slow_first_token", "delay_ms": 2000}))
        .await;
    let t = Instant::now();
    let s = raw_status(&r.sy, request("chat"), "500m").await;
    assert_eq!(s.code(), Code::DeadlineExceeded, "{s:?}");
    assert_eq!(reason(&s), "DEADLINE_EXCEEDED");
    assert!(t.elapsed() >= Duration::from_millis(450));
    assert!(
        t.elapsed() < Duration::from_millis(1900),
        "did not wait for P"
    );
    r.p.wait_for("P's request was closed", |l| {
        l.len() == 1 && l[0]["client_hung_up"] == true
    })
    .await;
    assert_eq!(
        r.s().requests().await.len(),
        0,
        "no attempt that cannot finish"
    );
    breaker_state(&r.sy, "primary", 0.0).await;
    attempts_metric(&r.sy, "primary", "cancelled", 1.0).await;
    attempts_metric(&r.sy, "primary", "timeout", 0.0).await;
}

#[tokio::test]
async fn row_16_client_cancel_mid_stream_closes_upstream_without_retry() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        p_args: &["--tokens", "200", "--token-delay-ms", "50"],
        ..Spec::default()
    })
    .await;
    let mut c = r.client().await;
    let mut req = request("chat");
    req.max_tokens = 1000;
    let mut s = c.stream_completion(req).await.unwrap().into_inner();
    let mut seen = 0;
    while seen < 3 {
        if let Some(proto::completion_event::Event::Delta(_)) =
            s.message().await.unwrap().unwrap().event
        {
            seen += 1;
        }
    }
    drop(s);
    drop(c);
    let log =
        r.p.wait_for("P saw the client hang up", |l| {
            l.len() == 1 && l[0]["client_hung_up"] == true
        })
        .await;
    assert!(log[0]["tokens_sent"].as_u64().unwrap() < 200);
    // The attempt's outcome is reported (the request task is done with it):
    // nothing was retried or failed over.
    attempts_metric(&r.sy, "primary", "cancelled", 1.0).await;
    assert_eq!(r.p.requests().await.len(), 1, "no retry");
    assert_eq!(r.s().requests().await.len(), 0, "no failover");
    breaker_state(&r.sy, "primary", 0.0).await;
}

// ---- Rows 17-19: cut streams ---------------------------------------------------

#[tokio::test]
async fn row_17_stall_after_tokens_ends_unavailable_without_retry() {
    let r = two().await;
    r.p.set_fault(json!({"type": "stall", "after_tokens": 3}))
        .await;
    let mut c = r.client().await;
    let t = Instant::now();
    let got = stream(&mut c, request("chat")).await;
    let s = failed(&got);
    assert!(
        t.elapsed() >= Duration::from_millis(280),
        "ended by the idle timeout"
    );
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_STREAM_TRUNCATED");
    assert_eq!(error_meta(&s, "tokens_emitted").as_deref(), Some("3"));
    assert_eq!(got.deltas, 3);
    assert_eq!(got.text, full_text(3));
    r.p.wait_for("the stalled request was closed", |l| {
        l.len() == 1 && l[0]["client_hung_up"] == true
    })
    .await;
    assert_eq!(r.s().requests().await.len(), 0, "no retry after commit");
}

/// A stream cut after `n` tokens were forwarded: UNAVAILABLE, truncated,
/// with `n` tokens emitted, after one attempt.
fn truncated_after(got: &Collected, n: u32) {
    let s = failed(got);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_STREAM_TRUNCATED", "{s:?}");
    let emitted = n.to_string();
    assert_eq!(error_meta(&s, "tokens_emitted").as_deref(), Some(&*emitted));
    assert_eq!(error_meta(&s, "attempts").as_deref(), Some("1"));
}

async fn cut_stream(reset: bool) {
    let r = two().await;
    let mut c = r.client().await;
    // Post-commit: never OK, tokens_emitted = N, one attempt.
    r.p.set_fault(json!({"type": "abort", "after_tokens": 3, "reset": reset}))
        .await;
    let got = stream(&mut c, request("chat")).await;
    truncated_after(&got, 3);
    assert_eq!(got.deltas, 3);
    assert_eq!(r.s().requests().await.len(), 0);
    attempts_metric(&r.sy, "primary", "truncated", 1.0).await;
    // Pre-commit (N = 0): transparent failover.
    r.p.set_fault(json!({"type": "abort", "after_tokens": 0, "reset": reset}))
        .await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert!(got.resets.is_empty());
    assert_eq!(got.started.len(), 1);
    assert_eq!(got.text, full_text(16));
    assert_eq!(r.p.requests().await.len(), 2);
    assert_eq!(r.s().requests().await.len(), 1);
}

#[tokio::test]
async fn row_18_fin_after_tokens_is_truncated_and_fin_before_fails_over() {
    cut_stream(false).await;
}

#[tokio::test]
async fn row_19_rst_after_tokens_is_truncated_and_rst_before_fails_over() {
    cut_stream(true).await;
}

/// The primary reached over HTTP/2 with prior knowledge (h2c,
/// `http2_prior_knowledge`): concurrent streams are served over it, and
/// rows 18-19 hold over it, where a cut stream is a reset HTTP/2 stream
/// rather than a closed socket. The secondary stays on HTTP/1.1.
#[tokio::test]
async fn an_h2c_upstream_serves_concurrent_streams_and_classifies_its_cuts_the_same() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        // Generous timeouts: eight streams at once on a loaded machine.
        p_extra:
            "http2_prior_knowledge = true\nfirst_token_timeout = \"5s\"\nidle_timeout = \"5s\"",
        ..Spec::default()
    })
    .await;
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let sy = r.sy.grpc.clone();
            tokio::spawn(async move {
                let mut c = proto::router_client::RouterClient::connect(format!("http://{sy}"))
                    .await
                    .unwrap();
                stream(&mut c, request("chat")).await
            })
        })
        .collect();
    for call in calls {
        let got = call.await.unwrap();
        let f = ok(&got);
        assert_eq!(served_by(&f), "primary");
        assert_eq!(f.attempts, 1);
        assert_eq!(got.text, full_text(16));
    }
    let log = r.p.requests().await;
    assert_eq!(log.len(), 8, "{log:?}");
    for rec in &log {
        assert_eq!(rec["http_version"], "HTTP/2.0", "{rec}");
        assert_eq!(rec["completed"], true, "{rec}");
        assert_eq!(rec["tokens_sent"], 16, "{rec}");
    }
    r.p.clear().await;

    // Cut after three tokens (FIN, then RST): truncated, one attempt, no failover.
    let mut c = r.client().await;
    for reset in [false, true] {
        r.p.set_fault(json!({"type": "abort", "after_tokens": 3, "reset": reset}))
            .await;
        let got = stream(&mut c, request("chat")).await;
        truncated_after(&got, 3);
        assert_eq!(got.text, full_text(3), "reset {reset}");
    }
    assert_eq!(r.s().requests().await.len(), 0, "no failover after commit");
    attempts_metric(&r.sy, "primary", "truncated", 2.0).await;

    // Cut before the first token: transparent failover to the HTTP/1.1 secondary.
    r.p.set_fault(json!({"type": "abort", "after_tokens": 0}))
        .await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert_eq!(got.text, full_text(16));
    let primary = r.p.requests().await;
    assert_eq!(primary.len(), 3, "{primary:?}");
    assert!(
        primary.iter().all(|x| x["http_version"] == "HTTP/2.0"),
        "{primary:?}"
    );
    let secondary = r.s().requests().await;
    assert_eq!(secondary.len(), 1, "{secondary:?}");
    assert_eq!(secondary[0]["http_version"], "HTTP/1.1");
}

// ---- Rows 20-24: Anthropic events, refusals --------------------------------------

async fn anthropic_first() -> Rig {
    rig(Spec {
        p_kind: "anthropic",
        s_kind: Some("openai"),
        ..Spec::default()
    })
    .await
}

#[tokio::test]
async fn row_20_anthropic_overloaded_event_before_text_fails_over() {
    let r = anthropic_first().await;
    r.p.set_fault(
        json!({"type": "error_event", "after_tokens": 0, "error_type": "overloaded_error"}),
    )
    .await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert_eq!(got.started.len(), 1, "no partial content from P");
    assert!(got.resets.is_empty());
    assert_eq!(got.text, full_text(16));
    assert_eq!(r.p.requests().await.len(), 1);
    assert_eq!(r.s().requests().await.len(), 1);
    attempts_metric(&r.sy, "primary", "overloaded", 1.0).await;
}

#[tokio::test]
async fn row_21_anthropic_overloaded_event_after_text_is_unavailable() {
    let r = anthropic_first().await;
    r.p.set_fault(
        json!({"type": "error_event", "after_tokens": 3, "error_type": "overloaded_error"}),
    )
    .await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let s = failed(&got);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_OVERLOADED");
    assert_eq!(error_meta(&s, "tokens_emitted").as_deref(), Some("3"));
    assert_eq!(error_meta(&s, "attempts").as_deref(), Some("1"));
    assert_eq!(error_meta(&s, "provider").as_deref(), Some("primary"));
    let id = error_meta(&s, "upstream_request_id").unwrap_or_default();
    assert!(id.starts_with("req_mock"), "I7: upstream request id {id:?}");
    assert_eq!(got.deltas, 3);
    assert_eq!(r.p.requests().await.len(), 1, "exactly one attempt");
    assert_eq!(r.s().requests().await.len(), 0);
}

#[tokio::test]
async fn row_22_anthropic_stream_without_message_stop_is_never_ok() {
    let r = anthropic_first().await;
    r.p.set_fault(json!({"type": "no_terminator"})).await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let s = failed(&got);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_STREAM_TRUNCATED");
    assert_eq!(got.deltas, 16);
    let pl = r.p.requests().await;
    assert_eq!(pl.len(), 1);
    assert_eq!(pl[0]["tokens_sent"], 16);
    assert_eq!(r.s().requests().await.len(), 0);
}

#[tokio::test]
async fn row_23_anthropic_refusal_is_ok_with_refusal_and_not_laundered() {
    let r = anthropic_first().await;
    r.p.set_fault(json!({"type": "refusal", "after_tokens": 2}))
        .await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(f.finish_reason, FinishReason::Refusal as i32);
    assert_eq!(served_by(&f), "primary");
    assert_eq!(f.attempts, 1);
    assert_eq!(got.text, full_text(2), "the partial text is forwarded");
    assert_eq!(r.p.requests().await.len(), 1);
    assert_eq!(r.s().requests().await.len(), 0, "no failover");
    attempts_metric(&r.sy, "primary", "refusal", 1.0).await;
}

#[tokio::test]
async fn row_24_openai_content_filter_is_ok_with_content_filter() {
    let r = two().await;
    r.p.set_fault(json!({"type": "refusal", "after_tokens": 2}))
        .await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(f.finish_reason, FinishReason::ContentFilter as i32);
    assert_eq!(served_by(&f), "primary");
    assert_eq!(f.attempts, 1);
    assert_eq!(r.p.requests().await.len(), 1);
    assert_eq!(r.s().requests().await.len(), 0);
}

// ---- Rows 25-31: OpenAI-compatible stream faults ------------------------------------

#[tokio::test]
async fn row_25_openai_error_frame_fails_over_before_text_and_fails_after() {
    let r = two().await;
    let mut c = r.client().await;
    r.p.set_fault(json!({"type": "error_event", "after_tokens": 0}))
        .await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert_eq!(got.started.len(), 1);
    r.p.set_fault(json!({"type": "error_event", "after_tokens": 3}))
        .await;
    let got = stream(&mut c, request("chat")).await;
    let s = failed(&got);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(error_meta(&s, "tokens_emitted").as_deref(), Some("3"));
    assert_eq!(r.p.requests().await.len(), 2);
    assert_eq!(r.s().requests().await.len(), 1, "no failover after commit");
}

#[tokio::test]
async fn row_26_vllm_error_then_done_is_never_ok() {
    let r = two().await;
    let mut c = r.client().await;
    r.p.set_fault(json!({"type": "error_event", "after_tokens": 0, "then_done": true}))
        .await;
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "secondary", "P's [DONE] did not make it OK");
    assert_eq!(f.attempts, 2);
    r.p.set_fault(json!({"type": "error_event", "after_tokens": 2, "then_done": true}))
        .await;
    let got = stream(&mut c, request("chat")).await;
    let s = failed(&got);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(got.deltas, 2);
    assert_eq!(r.p.requests().await.len(), 2);
    assert_eq!(r.s().requests().await.len(), 1);
}

#[tokio::test]
async fn row_28_llamacpp_legacy_400_is_invalid_argument_without_retry() {
    let r = two().await;
    r.p.set_fault(json!({"type": "legacy_error", "code": 400}))
        .await;
    let mut c = r.client().await;
    let s = failed(&stream(&mut c, request("chat")).await);
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_INVALID_REQUEST");
    assert_eq!(r.p.requests().await.len(), 1);
    assert_eq!(r.s().requests().await.len(), 0);
    // The server keeps serving.
    r.p.set_fault(json!({})).await;
    ok(&stream(&mut c, request("chat")).await);
}

fn tool_request() -> proto::CompletionRequest {
    let mut req = request("chat");
    req.tools.push(proto::Tool {
        name: "search".into(),
        description: "Search".into(),
        parameters_json: r#"{"type":"object","properties":{"query":{"type":"string"}}}"#.into(),
        ..Default::default()
    });
    req
}

/// Never a TOOL_CALLS finish with arguments that do not parse.
fn assert_no_bad_tool_call(finish: i32, fragments: &[proto::ToolCallDelta]) {
    if finish == FinishReason::ToolCalls as i32 {
        let args: String = fragments.iter().map(|t| t.arguments.as_str()).collect();
        serde_json::from_str::<Value>(&args)
            .unwrap_or_else(|e| panic!("TOOL_CALLS with unparseable arguments {args:?}: {e}"));
    }
}

#[tokio::test]
async fn row_30_truncated_tool_arguments_never_finish_as_tool_calls() {
    let r = one().await;
    let mut c = r.client().await;
    // max_tokens caps the arguments mid-JSON: the mock ends with `length`.
    let mut req = tool_request();
    req.max_tokens = 3;
    let got = stream(&mut c, req.clone()).await;
    let f = ok(&got);
    assert_eq!(f.finish_reason, FinishReason::Length as i32);
    assert_no_bad_tool_call(f.finish_reason, &got.tool_calls);
    let resp = c.complete(req).await.unwrap().into_inner();
    assert_ne!(resp.finish_reason, FinishReason::ToolCalls as i32);
    // A stream cut inside the arguments is an error, never a tool call.
    r.p.set_fault(json!({"type": "abort", "after_tokens": 2}))
        .await;
    let got = stream(&mut c, tool_request()).await;
    let s = failed(&got);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_STREAM_TRUNCATED");
    let log = r.p.requests().await;
    assert_eq!(log.len(), 3);
    assert!(log.iter().all(|l| l["has_tools"] == true));
    // And healthy, complete arguments still finish as TOOL_CALLS.
    r.p.set_fault(json!({})).await;
    let got = stream(&mut c, tool_request()).await;
    let f = ok(&got);
    assert_eq!(f.finish_reason, FinishReason::ToolCalls as i32);
    assert_no_bad_tool_call(f.finish_reason, &got.tool_calls);
}

#[tokio::test]
async fn row_31_malformed_frame_fails_over_before_text_and_is_internal_after() {
    let r = two().await;
    let mut c = r.client().await;
    r.p.set_fault(json!({"type": "malformed", "after_tokens": 0}))
        .await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    attempts_metric(&r.sy, "primary", "protocol", 1.0).await;
    r.p.set_fault(json!({"type": "malformed", "after_tokens": 3}))
        .await;
    let got = stream(&mut c, request("chat")).await;
    let s = failed(&got);
    assert_eq!(s.code(), Code::Internal, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_PROTOCOL_ERROR");
    assert_eq!(got.deltas, 3);
    assert_eq!(r.p.requests().await.len(), 2);
    assert_eq!(r.s().requests().await.len(), 1);
}

// ---- Mid-stream reset policy --------------------------------------------------

#[tokio::test]
async fn mid_stream_reset_policy_resets_and_serves_from_the_secondary() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        route_extra: "mid_stream = \"reset\"",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "abort", "after_tokens": 3}))
        .await;
    let mut c = r.client().await;
    let got = stream(&mut c, request("chat")).await;
    let f = ok(&got);
    assert_eq!(got.resets.len(), 1, "a Reset event");
    assert_eq!(got.resets[0].failed_attempt, 1);
    assert_eq!(got.started.len(), 2);
    assert_eq!(got.started[0].provider, "primary");
    assert_eq!(got.started[1].provider, "secondary");
    assert_eq!(got.started[1].attempt, 2);
    assert_eq!(got.started[1].tier, Tier::Fallback as i32);
    assert_eq!(got.text, full_text(16), "the whole answer after the reset");
    assert_eq!(got.deltas, 3 + 16);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.tier, Tier::Fallback as i32);
    assert_eq!(f.attempts, 2);
    assert_eq!(r.p.requests().await.len(), 1);
    assert_eq!(r.s().requests().await.len(), 1);
}

// ---- Rows 35-36, 42-43: overload, outage, budget, local rejections ----------------

/// Runs `n` streaming calls at once; returns each result and how long it took.
async fn burst(
    c: &proto::router_client::RouterClient<tonic::transport::Channel>,
    n: usize,
) -> Vec<(Collected, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let mut c = c.clone();
            tokio::spawn(async move {
                let t = Instant::now();
                let got = stream(&mut c, timed(request("chat"), "10000m")).await;
                (got, t.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(
            tokio::time::timeout(Duration::from_secs(15), t)
                .await
                .expect("no request hangs")
                .unwrap(),
        );
    }
    out
}

#[tokio::test]
async fn row_35_failover_burst_is_bounded_by_the_secondarys_failover_ceiling() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        s_args: &["--token-delay-ms", "150"],
        s_extra: "failover_max_concurrency = 3",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "status": 500}))
        .await;
    let c = r.client().await;
    let results = burst(&c, 20).await;
    let mut served = Vec::new();
    let mut shed = Vec::new();
    for (got, took) in &results {
        match &got.status {
            None => {
                let f = ok(got);
                assert_eq!(served_by(&f), "secondary");
                assert_eq!(got.text, full_text(16));
                served.push(*took);
            }
            Some(s) => {
                assert!(
                    matches!(s.code(), Code::ResourceExhausted | Code::Unavailable),
                    "{s:?}"
                );
                assert!(got.finished.is_none());
                shed.push(*took);
            }
        }
    }
    let stats = r.s().stats().await;
    assert!(
        stats["max_in_flight"].as_u64().unwrap() <= 3,
        "S2 in flight above its failover ceiling: {stats}"
    );
    assert!(!served.is_empty() && served.len() <= 20);
    assert!(
        !shed.is_empty(),
        "20 requests cannot all fit 3 slots at once"
    );
    // The excess was shed at once, not queued behind S2's answers.
    let fastest_served = served.iter().min().unwrap();
    let slowest_shed = shed.iter().max().unwrap();
    assert!(
        slowest_shed < fastest_served,
        "shed {slowest_shed:?} vs served {fastest_served:?}"
    );
    let (pl, sl) = (r.p.requests().await, r.s().requests().await);
    assert_eq!(sl.len(), served.len(), "every S2 attempt served");
    assert!(
        (pl.len() + sl.len()) as f64 <= 1.1 * 20.0 + 10.0,
        "attempts {} + {} over the budget",
        pl.len(),
        sl.len()
    );
    breaker_state(&r.sy, "secondary", 0.0).await;
    transitions(&r.sy, "secondary", 0.0).await;
}

#[tokio::test]
async fn row_36_all_providers_down_fail_fast_with_retry_info() {
    let breaker = "breaker = { consecutive_failures = 2, open_for = \"5s\", jitter = 0.0 }";
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        p_extra: breaker,
        s_extra: breaker,
        route_extra: "max_attempts = 2",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "status": 500}))
        .await;
    r.s()
        .set_fault(json!({"type": "status", "preset": "overloaded"}))
        .await;
    let mut c = r.client().await;
    for _ in 0..2 {
        let s = failed(&stream(&mut c, request("chat")).await);
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert_eq!(error_meta(&s, "attempts").as_deref(), Some("2"));
    }
    assert_eq!(r.p.requests().await.len(), 2);
    assert_eq!(r.s().requests().await.len(), 2);
    breaker_state(&r.sy, "primary", 2.0).await;
    breaker_state(&r.sy, "secondary", 2.0).await;
    // Both open: a burst makes no upstream call and fails fast.
    for (got, took) in burst(&c, 10).await {
        let s = failed(&got);
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert_eq!(reason(&s), "NO_HEALTHY_TARGET");
        let delay = retry_delay(&s).expect("RetryInfo");
        assert!(
            delay > Duration::ZERO && delay <= Duration::from_secs(5),
            "{delay:?}"
        );
        assert!(took < Duration::from_secs(1), "fail fast: {took:?}");
    }
    let total = r.p.requests().await.len() + r.s().requests().await.len();
    assert_eq!(total, 4, "no attempts while the breakers are open");
    assert!(total as f64 <= 1.1 * 12.0 + 10.0);
}

#[tokio::test]
async fn row_42_retry_budget_bounds_failovers() {
    // The breaker is off and P stays ranked first, so only the budget limits.
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        p_extra: "breaker = { consecutive_failures = 0, failure_rate = 2.0 }\nhealth = { prior_successes = 1000 }",
        top: "[retry_budget]\nratio = 0.1\nmin_per_sec = 0.1\n",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "status": 500}))
        .await;
    let mut c = r.client().await;
    let mut served = 0;
    let mut exhausted = 0;
    for i in 0..50 {
        let got = stream(&mut c, request("chat")).await;
        match &got.status {
            None => {
                let f = ok(&got);
                assert_eq!(served_by(&f), "secondary");
                assert_eq!(f.attempts, 2);
                served += 1;
            }
            Some(s) => {
                assert_eq!(s.code(), Code::Unavailable, "{s:?}");
                assert_eq!(reason(s), "RETRY_BUDGET_EXHAUSTED", "request {i}");
                assert_eq!(error_meta(s, "attempts").as_deref(), Some("1"));
                assert!(retry_delay(s).is_some());
                exhausted += 1;
            }
        }
        if i == 1 {
            assert_eq!(exhausted, 1, "the floor (1 retry) is gone after request 1");
        }
    }
    let (pl, sl) = (r.p.requests().await.len(), r.s().requests().await.len());
    assert_eq!(pl, 50, "every request had its first attempt");
    assert_eq!(sl, served);
    // retries <= ratio * originals + min_per_sec * ttl = 5 + 1.
    assert!((1..=6).contains(&sl), "{sl} failovers for 50 requests");
    assert_eq!(served + exhausted, 50);
    assert!((pl + sl) as f64 <= 1.1 * 50.0 + 1.0);
}

#[tokio::test]
async fn row_43_local_saturation_never_trips_the_breaker() {
    let r = rig(Spec {
        p_args: &["--token-delay-ms", "100"],
        p_extra: "max_concurrency = 1\nfailover_max_concurrency = 1\nbreaker = { consecutive_failures = 2 }",
        ..Spec::default()
    })
    .await;
    let c = r.client().await;
    let results = burst(&c, 8).await;
    let served = results.iter().filter(|(g, _)| g.status.is_none()).count();
    assert!(served >= 1);
    for (got, _) in results.iter().filter(|(g, _)| g.status.is_some()) {
        let s = failed(got);
        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
        assert_eq!(reason(&s), "CONCURRENCY_LIMIT");
    }
    assert!(
        served < 8,
        "a ceiling of 1 sheds some of 8 concurrent calls"
    );
    assert_eq!(
        r.p.requests().await.len(),
        served,
        "shed calls never reached P"
    );
    assert!(
        metric(
            &r.sy,
            "switchyard_permits_refused_total",
            &[("provider", "primary"), ("reason", "saturated_own")]
        )
        .await
            >= 2.0
    );
    breaker_state(&r.sy, "primary", 0.0).await;
    transitions(&r.sy, "primary", 0.0).await;
    let f = ok(&stream(&mut c.clone(), request("chat")).await);
    assert_eq!(served_by(&f), "primary");
}

#[tokio::test]
async fn row_43_refused_admissions_do_not_spend_the_retry_budget() {
    // P refuses connections (fail over, never retried on P); its breaker is off
    // and it stays ranked first, so every request needs a failover to S2.
    // S2 admits one failover at a time and answers slowly.
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        p_url: Some(format!("http://127.0.0.1:{}/v1", closed_port())),
        p_extra: "breaker = { consecutive_failures = 0, failure_rate = 2.0 }\nhealth = { prior_successes = 1000 }",
        s_args: &["--token-delay-ms", "100"],
        s_extra: "failover_max_concurrency = 1",
        ..Spec::default()
    })
    .await;
    let c = r.client().await;
    let results = burst(&c, 12).await;
    let served = results.iter().filter(|(g, _)| g.status.is_none()).count();
    assert_eq!(served, r.s().requests().await.len());
    assert!(served <= 2, "one failover slot: {served} served");
    // Only `served` failovers were made, far below the floor of 10: the
    // budget must still grant the next one.
    let got = stream(&mut c.clone(), request("chat")).await;
    if let Some(s) = &got.status {
        panic!(
            "{served} real failovers emptied the budget: {} {s:?}",
            reason(s)
        );
    }
    let f = ok(&got);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
}

#[tokio::test]
async fn outage_primary_down_gets_only_probes_and_attempts_stay_in_budget() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        p_extra: "synthetic_probes = true\nbreaker = { open_for = \"300ms\", jitter = 0.0 }\nhealth = { prior_successes = 1000 }",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "status": 500}))
        .await;
    let mut c = r.client().await;
    let n = 60;
    for i in 0..n {
        let f = ok(&stream(&mut c, request("chat")).await);
        assert_eq!(served_by(&f), "secondary", "request {i}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pl =
        r.p.wait_for("at least one synthetic probe", |l| l.iter().any(is_probe))
            .await;
    assert_eq!(
        user_requests(&pl),
        5,
        "P got callers until the breaker opened"
    );
    assert!(
        pl[..5].iter().all(|l| !is_probe(l)),
        "the first five were callers"
    );
    for p in &pl[5..] {
        assert!(is_probe(p), "after the trip only probes: {p}");
        assert_eq!(p["max_tokens"], 1);
    }
    let sl = r.s().requests().await;
    assert_eq!(sl.len(), n);
    let total = pl.len() + sl.len();
    assert!(
        total as f64 <= 1.1 * n as f64 + 10.0,
        "{total} attempts for {n} requests"
    );
    transition(&r.sy, "primary", "closed", "open", 1.0).await;
}

// ---- Rows 46-51: idempotency, one retry layer ------------------------------------

fn keyed(key: &str, text: &str) -> proto::CompletionRequest {
    let mut req = request("chat");
    req.messages = vec![user(text)];
    req.idempotency_key = key.into();
    req
}

#[tokio::test]
async fn row_46_idempotent_replay_makes_no_upstream_call() {
    let r = one().await;
    let mut c = r.client().await;
    let first = stream(&mut c, keyed("k-46", "hello")).await;
    let f1 = ok(&first);
    assert!(!f1.replayed);
    let second = stream(&mut c, keyed("k-46", "hello")).await;
    let f2 = ok(&second);
    assert!(f2.replayed, "Finished.replayed");
    assert_eq!(second.text, first.text, "identical text");
    assert_eq!(f2.finish_reason, f1.finish_reason);
    assert_eq!(served_by(&f2), served_by(&f1));
    assert_eq!(
        r.p.requests().await.len(),
        1,
        "exactly one upstream request"
    );
}

#[tokio::test]
async fn row_47_concurrent_duplicate_is_aborted() {
    let r = rig(Spec {
        p_args: &["--token-delay-ms", "100"],
        p_extra: "idle_timeout = \"5s\"",
        ..Spec::default()
    })
    .await;
    let c = r.client().await;
    let mut c1 = c.clone();
    let mut s1 = c1
        .stream_completion(keyed("k-47", "hello"))
        .await
        .unwrap()
        .into_inner();
    // The first is streaming now.
    s1.message().await.unwrap().unwrap();
    let got = stream(&mut c.clone(), keyed("k-47", "hello")).await;
    let s = failed(&got);
    assert_eq!(s.code(), Code::Aborted, "{s:?}");
    assert_eq!(reason(&s), "IDEMPOTENCY_KEY_IN_USE");
    let mut finished = false;
    while let Some(ev) = s1.message().await.unwrap() {
        finished |= matches!(ev.event, Some(proto::completion_event::Event::Finished(_)));
    }
    assert!(finished, "the first call completes");
    assert_eq!(
        r.p.requests().await.len(),
        1,
        "exactly one upstream generation"
    );
}

#[tokio::test]
async fn row_48_same_key_different_payload_is_rejected() {
    let r = one().await;
    let mut c = r.client().await;
    ok(&stream(&mut c, keyed("k-48", "hello")).await);
    let s = failed(&stream(&mut c, keyed("k-48", "something else")).await);
    assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
    assert_eq!(reason(&s), "IDEMPOTENCY_KEY_REUSED");
    assert_eq!(r.p.requests().await.len(), 1, "no upstream call");
}

#[tokio::test]
async fn row_49_key_after_a_retryable_failure_runs_again() {
    let r = rig(Spec {
        route_extra: "max_attempts = 1",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "status": 503}))
        .await;
    let mut c = r.client().await;
    let s = failed(&stream(&mut c, keyed("k-49", "hello")).await);
    assert_eq!(s.code(), Code::Unavailable);
    r.p.set_fault(json!({})).await;
    let got = stream(&mut c, keyed("k-49", "hello")).await;
    let f = ok(&got);
    assert!(!f.replayed, "a new execution, not a replay");
    assert_eq!(got.text, full_text(16));
    let log = r.p.requests().await;
    assert_eq!(log.len(), 2, "upstream called again");
    assert_eq!(log[0]["status"], 503);
}

#[tokio::test]
async fn row_49_key_after_its_ttl_runs_again() {
    let r = rig(Spec {
        top: "[idempotency]\nttl = \"300ms\"\n",
        ..Spec::default()
    })
    .await;
    let mut c = r.client().await;
    ok(&stream(&mut c, keyed("k-49-ttl", "hello")).await);
    assert!(ok(&stream(&mut c, keyed("k-49-ttl", "hello")).await).replayed);
    assert_eq!(r.p.requests().await.len(), 1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let f = ok(&stream(&mut c, keyed("k-49-ttl", "hello")).await);
    assert!(!f.replayed, "past its TTL the key runs again");
    assert_eq!(r.p.requests().await.len(), 2);
}

#[tokio::test]
async fn row_51_the_upstream_sees_exactly_the_planned_attempts() {
    let r = rig(Spec {
        route_extra: "max_attempts = 3",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "status": 500}))
        .await;
    let mut c = r.client().await;
    let s = failed(&stream(&mut c, request("chat")).await);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_SERVER_ERROR");
    assert_eq!(error_meta(&s, "attempts").as_deref(), Some("3"));
    let log = r.p.requests().await;
    let headers: Vec<String> = log.iter().map(attempt_header).collect();
    assert_eq!(headers, ["1", "2", "3"], "3 attempts, not 9");
    assert!(log.iter().all(|l| l["status"] == 500));
}

// ---- Side effects ----------------------------------------------------------------

#[tokio::test]
async fn side_effects_route_never_repeats_a_sent_request() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        route_extra: "side_effects = true",
        ..Spec::default()
    })
    .await;
    r.p.set_fault(json!({"type": "status", "status": 500}))
        .await;
    let mut c = r.client().await;
    let s = failed(&stream(&mut c, request("chat")).await);
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert_eq!(reason(&s), "UPSTREAM_SERVER_ERROR");
    assert_eq!(error_meta(&s, "attempts").as_deref(), Some("1"));
    assert_eq!(r.p.requests().await.len(), 1, "not retried");
    assert_eq!(r.s().requests().await.len(), 0, "not failed over");
}

#[tokio::test]
async fn side_effects_route_still_fails_over_a_refused_connection() {
    let r = rig(Spec {
        s_kind: Some("anthropic"),
        route_extra: "side_effects = true",
        p_url: Some(format!("http://127.0.0.1:{}/v1", closed_port())),
        ..Spec::default()
    })
    .await;
    let mut c = r.client().await;
    let f = ok(&stream(&mut c, request("chat")).await);
    assert_eq!(served_by(&f), "secondary");
    assert_eq!(f.attempts, 2);
    assert_eq!(r.s().requests().await.len(), 1);
}

#[tokio::test]
async fn row_46_a_unary_duplicate_right_after_the_answer_replays() {
    let a = Mock::start("openai", &[]).await;
    let config = format!(
        "{}{}",
        provider("p", "openai", &a.base_url(), "m"),
        route("chat", &["p/m"])
    );
    let sy = Switchyard::start(&config).await;
    let mut client = sy.client().await;
    for i in 0..5 {
        let mut req = request("chat");
        req.idempotency_key = format!("key-{i}");
        let first = client.complete(req.clone()).await.unwrap().into_inner();
        // No pause: the record is stored before the answer leaves.
        let again = client.complete(req).await.unwrap().into_inner();
        assert!(again.replayed, "replayed at once");
        assert_eq!(again.text, first.text);
    }
    assert_eq!(a.requests().await.len(), 5);
}
