//! Scenario `limits`: what rate-limit-aware admission saves against an
//! upstream token window. One mock with two keys, each with a TPM window
//! (20,000 tokens per 60 s; quick: 2,500), and a load that exceeds both:
//! requests of about 1,000 tokens (a ~50-token prompt, `max_tokens` 950),
//! which the mock charges at arrival. Arms, each at the same open-loop load:
//!
//! - `direct`: a client sending straight to the mock, alternating the keys,
//!   ignoring the rate-limit headers: the baseline without admission (it is
//!   not a setting of the server);
//! - `learned`: Switchyard with both keys and no `tpm` configured: it learns
//!   the windows from the mock's `x-ratelimit-*` headers after the first
//!   answers;
//! - `configured`: the same with `tpm` set on each key;
//!
//! the two Switchyard arms on one replica (embedded state) and on two
//! replicas sharing a `redis-server` (`[state] backend = "redis"`, load
//! alternating between them; skipped, loudly, without redis-server).
//! Reported per arm: upstream 429s per 1,000 requests (the mock's log),
//! requests answered and refused with RATE_LIMITED, and each key's
//! `peak_tokens` against its window. Checked: with admission, fewer 429s
//! per 1,000 requests than the direct baseline, and on one replica no key's
//! peak above its window.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

use super::{check_complete, check_errors, errors_json, result};
use crate::clients::{grpc_call, http_client, ms, Call, Grpc, Outcome, Prompt};
use crate::load::{open_loop, Run};
use crate::procs::{config_text, route_text, MockProc, MockSpec, Provider, RouterProc};
use crate::report::Table;
use crate::{BenchError, Check, Ctx, ScenarioResult, Target};
use switchyard::state::redis::server::RedisServer;
use switchyard_mock::{LimitsView, RequestRecord};

const TIMEOUT: Duration = Duration::from_secs(10);
/// The mock's window (what `tpm` means: tokens per minute).
const WINDOW_MS: u64 = 60_000;
/// Output tokens each request asks for.
const MAX_TOKENS: u32 = 950;
/// The two keys: label, environment variable, value.
const KEYS: [(&str, &str, &str); 2] = [
    ("a", "SWITCHYARD_BENCH_LIMITS_KEY_A", "sk-bench-limits-a"),
    ("b", "SWITCHYARD_BENCH_LIMITS_KEY_B", "sk-bench-limits-b"),
];
/// The routers read the Redis URL from this variable.
const REDIS_ENV: &str = "SWITCHYARD_BENCH_LIMITS_REDIS_URL";
/// RESOURCE_EXHAUSTED with reason RATE_LIMITED, as the client writes it.
const RATE_LIMITED: &str = "RESOURCE_EXHAUSTED RATE_LIMITED";
/// What a replica answers while its target cools down after an upstream
/// 429 (for the `retry-after` the upstream sent).
const COOLING: &str = "UNAVAILABLE NO_HEALTHY_TARGET";

/// The sizes of one run.
struct Params {
    tpm: u64,
    rate: f64,
    duration: Duration,
    admission_wait: &'static str,
}

fn params(ctx: &Ctx) -> Params {
    Params {
        tpm: ctx.pick(2_500, 20_000),
        rate: ctx.pick(8.0, 1.0),
        duration: ctx.pick(Duration::from_millis(1500), Duration::from_secs(80)),
        admission_wait: ctx.pick("500ms", "2s"),
    }
}

/// One arm: who sends, what Switchyard knows, on how many replicas.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Arm {
    name: &'static str,
    /// `None`: the direct client.
    configured: Option<bool>,
    replicas: usize,
}

const DIRECT: Arm = Arm {
    name: "direct",
    configured: None,
    replicas: 0,
};

fn router_arms() -> [Arm; 4] {
    let arm = |name, configured, replicas| Arm {
        name,
        configured: Some(configured),
        replicas,
    };
    [
        arm("learned", false, 1),
        arm("configured", true, 1),
        arm("learned", false, 2),
        arm("configured", true, 2),
    ]
}

impl Arm {
    fn label(&self) -> String {
        match self.replicas {
            0 => self.name.to_string(),
            1 => format!("{}, 1 replica", self.name),
            n => format!("{}, {n} replicas on Redis", self.name),
        }
    }
}

/// A prompt of about 50 tokens as the mock counts them (JSON bytes / 4).
fn prompt() -> Prompt {
    Prompt {
        system: None,
        user: "Summarise the rate-limit behaviour of this benchmark in one short \
               paragraph, mentioning windows, keys, admission and retries, please."
            .into(),
    }
}

/// The tokens the mock charges one request: its input as the mock counts
/// it (the messages' JSON, 4 bytes a token) plus `max_tokens`.
fn charge() -> u64 {
    let p = prompt();
    let messages = json!([{"role": "user", "content": &*p.user}]).to_string();
    messages.len() as u64 / 4 + 1 + u64::from(MAX_TOKENS)
}

fn mock_limits(p: &Params) -> serde_json::Value {
    let keys: serde_json::Map<String, serde_json::Value> = KEYS
        .iter()
        .map(|(_, _, value)| (value.to_string(), json!({"tpm": p.tpm})))
        .collect();
    json!({"window_ms": WINDOW_MS, "keys": keys})
}

fn config(arm: &Arm, p: &Params, mock: &MockProc, redis: bool, quick: bool) -> String {
    let tpm = if arm.configured == Some(true) {
        format!(", tpm = {}", p.tpm)
    } else {
        String::new()
    };
    let keys: Vec<String> = KEYS
        .iter()
        .map(|(name, env, _)| format!("{{ name = \"{name}\", env = \"{env}\"{tpm} }}"))
        .collect();
    let provider =
        Provider::new("up", "openai", mock).extra(format!("keys = [{}]", keys.join(", ")));
    // Each Redis arm in its own key space: a window learned in one is not
    // the next one's.
    let top = if redis {
        let timeout = if quick { "timeout = \"2s\"\n" } else { "" };
        format!(
            "[state]\nbackend = \"redis\"\nredis_url_env = \"{REDIS_ENV}\"\n\
             key_prefix = \"bench-limits-{}:\"\n{timeout}",
            arm.name
        )
    } else {
        String::new()
    };
    config_text(&top, &[provider], &[])
        + &route_text(
            "chat",
            &["up"],
            &format!("admission_wait = \"{}\"", p.admission_wait),
        )
}

/// One request straight to the mock with key `key`, unary, no retry.
async fn direct_call(http: reqwest::Client, base: String, key: &str, t0: Instant) -> Outcome {
    let p = prompt();
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": &*p.user}],
        "max_tokens": MAX_TOKENS,
    });
    let sent = http
        .post(format!("{base}/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .timeout(TIMEOUT)
        .send()
        .await;
    let (ok, error) = match sent {
        Ok(r) if r.status().is_success() => (r.bytes().await.is_ok(), None),
        Ok(r) => (false, Some(format!("HTTP {}", r.status().as_u16()))),
        Err(e) => (false, Some(format!("transport: {e}"))),
    };
    Outcome {
        ok,
        latency_ms: ms(t0.elapsed()),
        attempts: 1,
        error: error.or_else(|| (!ok).then(|| "transport: body".to_string())),
        ..Outcome::default()
    }
}

async fn drive(ctx: &Ctx, arm: &Arm, p: &Params, mock: &MockProc, grpcs: &[Grpc]) -> Run {
    let http = http_client().unwrap_or_default();
    let base = mock.base_url();
    let grpcs = grpcs.to_vec();
    let call = Call {
        max_tokens: MAX_TOKENS,
        ..Call::new("chat", false, TIMEOUT).prompt(prompt())
    };
    let f = move |i: u64, t0: Instant| {
        let (http, base, call) = (http.clone(), base.clone(), call.clone());
        let grpc = (!grpcs.is_empty()).then(|| grpcs[i as usize % grpcs.len()].clone());
        async move {
            match grpc {
                Some(g) => grpc_call(g.client(i), &call, t0).await,
                None => direct_call(http, base, KEYS[i as usize % 2].2, t0).await,
            }
        }
    };
    open_loop(
        ctx,
        format!("limits {}", arm.label()),
        p.rate,
        p.duration,
        1_000,
        f,
    )
    .await
}

/// What one arm produced.
struct ArmResult {
    arm: Arm,
    run: Run,
    log: Vec<RequestRecord>,
    limits: LimitsView,
}

impl ArmResult {
    fn upstream_429(&self) -> usize {
        self.log
            .iter()
            .filter(|r| r.status == Some(429) || r.rate_limited)
            .count()
    }

    fn per_1k(&self) -> f64 {
        self.upstream_429() as f64 * 1000.0 / self.run.outcomes.len().max(1) as f64
    }

    fn rate_limited(&self) -> usize {
        self.run
            .outcomes
            .iter()
            .filter(|o| o.error.as_deref() == Some(RATE_LIMITED))
            .count()
    }

    fn peak(&self, label: &str) -> u64 {
        self.limits.keys.get(label).map_or(0, |k| k.peak_tokens)
    }

    /// Tokens sent to key `label` in its busiest window, refused requests
    /// included: the mock's fixed windows rebuilt from its log.
    fn offered_peak(&self, label: &str) -> u64 {
        let mut arrivals: Vec<(f64, u64)> = self
            .log
            .iter()
            .filter(|r| r.key_label.as_deref() == Some(label))
            .map(|r| {
                let input = r.body["messages"].to_string().len() as u64 / 4 + 1;
                (r.arrived_ms, input + u64::from(r.max_tokens.unwrap_or(0)))
            })
            .collect();
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (mut peak, mut start, mut sum) = (0, f64::NEG_INFINITY, 0);
        for (at, tokens) in arrivals {
            if at >= start + WINDOW_MS as f64 {
                (start, sum) = (at, 0);
            }
            sum += tokens;
            peak = peak.max(sum);
        }
        peak
    }
}

async fn run_arm(
    ctx: &Ctx,
    arm: Arm,
    p: &Params,
    mock: &MockProc,
) -> Result<ArmResult, BenchError> {
    let mut routers = Vec::new();
    let mut grpcs = Vec::new();
    for n in 0..arm.replicas {
        let cfg = config(&arm, p, mock, arm.replicas > 1, ctx.quick);
        let tag = format!("limits-{}-{}of{}", arm.name, n + 1, arm.replicas);
        let router = RouterProc::start(ctx, &tag, &cfg).await?;
        grpcs.push(Grpc::connect(router.grpc, 2).await?);
        routers.push(router);
    }
    // A fresh window and counters for each arm.
    mock.set_limits(&mock_limits(p)).await?;
    mock.clear().await?;
    let run = drive(ctx, &arm, p, mock, &grpcs).await;
    let log = mock.requests().await?;
    let limits = mock.limits().await?;
    for r in routers {
        r.stop().await;
    }
    Ok(ArmResult {
        arm,
        run,
        log,
        limits,
    })
}

fn checks(r: &ArmResult, baseline: &ArmResult, tpm: u64) -> Vec<Check> {
    let label = format!("limits {}", r.arm.label());
    let mut out = vec![check_complete(&label, &r.run)];
    if r.arm.replicas == 0 {
        out.push(check_errors(&label, &r.run.outcomes, &["HTTP"]));
        return out;
    }
    let unexpected: Vec<&str> = r
        .run
        .outcomes
        .iter()
        .filter_map(|o| o.error.as_deref())
        .filter(|e| !e.starts_with("RESOURCE_EXHAUSTED ") && *e != COOLING)
        .collect();
    out.push(Check::new(
        format!("{label}: no errors besides RESOURCE_EXHAUSTED and {COOLING}"),
        unexpected.is_empty(),
        format!(
            "{} unexpected of {} ({})",
            unexpected.len(),
            r.run.outcomes.len(),
            unexpected
                .iter()
                .take(3)
                .copied()
                .collect::<Vec<_>>()
                .join("; ")
        ),
    ));
    out.push(Check::new(
        format!("{label}: fewer upstream 429s per 1,000 requests than the direct client"),
        r.per_1k() < baseline.per_1k(),
        format!(
            "{:.0} against {:.0} ({} and {} 429s)",
            r.per_1k(),
            baseline.per_1k(),
            r.upstream_429(),
            baseline.upstream_429()
        ),
    ));
    if r.arm.replicas == 1 {
        let peaks: Vec<u64> = KEYS.iter().map(|(l, _, _)| r.peak(l)).collect();
        out.push(Check::new(
            format!("{label}: no key's peak_tokens above its window"),
            peaks.iter().all(|p| *p <= tpm),
            format!("peak_tokens {peaks:?}, window {tpm}"),
        ));
    }
    out
}

/// Errors other than RATE_LIMITED, by their reason (HTTP ones whole), with counts.
fn other_errors(run: &Run) -> String {
    let mut m = BTreeMap::<&str, usize>::new();
    for e in run.outcomes.iter().filter_map(|o| o.error.as_deref()) {
        if e != RATE_LIMITED {
            let reason = match e.split_once(' ') {
                Some((code, reason)) if code != "HTTP" => reason,
                _ => e,
            };
            *m.entry(reason).or_insert(0) += 1;
        }
    }
    if m.is_empty() {
        return "0".into();
    }
    let parts: Vec<String> = m.iter().map(|(e, n)| format!("{n} {e}")).collect();
    parts.join(", ")
}

fn row(r: &ArmResult, tpm: u64, table: &mut Table) -> serde_json::Value {
    let answered = r.run.ok();
    let rate_limited = r.rate_limited();
    let other = r.run.outcomes.len() - answered - rate_limited;
    let peaks: Vec<String> = KEYS
        .iter()
        .map(|(l, _, _)| format!("{} / {}", r.peak(l), r.offered_peak(l)))
        .collect();
    table.row(vec![
        r.arm.label(),
        format!("{}", r.run.outcomes.len()),
        format!("{answered}"),
        format!("{rate_limited}"),
        other_errors(&r.run),
        format!("{}", r.log.len()),
        format!("{}", r.upstream_429()),
        format!("{:.0}", r.per_1k()),
        format!("{} (window {tpm})", peaks.join("; ")),
    ]);
    let keys: BTreeMap<&str, serde_json::Value> = KEYS
        .iter()
        .map(|(l, _, _)| {
            let usage = r.limits.keys.get(*l);
            (
                *l,
                json!({"peak_tokens": r.peak(l), "offered_peak_tokens": r.offered_peak(l),
                       "limited": usage.map_or(0, |u| u.limited)}),
            )
        })
        .collect();
    json!({
        "arm": r.arm.name,
        "replicas": r.arm.replicas,
        "requests": r.run.outcomes.len(),
        "scheduled": r.run.scheduled,
        "answered": answered,
        "rate_limited": rate_limited,
        "other_errors": other,
        "errors": errors_json(&r.run.outcomes),
        "upstream_requests": r.log.len(),
        "upstream_429": r.upstream_429(),
        "upstream_429_per_1k": r.per_1k(),
        "tpm": tpm,
        "keys": keys,
    })
}

/// A `redis-server` on loopback, or why not.
async fn start_redis(ctx: &Ctx) -> Result<RedisServer, String> {
    let dir = ctx.path("redis-limits");
    let _ = std::fs::remove_dir_all(&dir);
    tokio::task::spawn_blocking(move || RedisServer::start(&dir, &[]))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r)
}

pub async fn run(ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    let mut res = result("limits");
    let p = params(ctx);
    for (_, env, value) in KEYS {
        // The routers read their keys from these (set before they start).
        std::env::set_var(env, value);
    }
    let redis = match start_redis(ctx).await {
        Ok(r) => {
            std::env::set_var(REDIS_ENV, r.url());
            Some(r)
        }
        Err(e) => {
            ctx.progress(format!(
                "   *** SKIPPING the two-replica limits arms: no redis-server ({e}; \
                 apt-get install redis-server) ***"
            ));
            res.targets.push(Target {
                target: "Fleet-wide windows on two replicas measured".into(),
                met: None,
                detail: format!("not available: {e} (apt-get install redis-server)"),
            });
            None
        }
    };
    let mock = MockProc::start(ctx, "limits", &MockSpec::new("openai", 16, 2)).await?;
    let labels: serde_json::Map<String, serde_json::Value> = KEYS
        .iter()
        .map(|(label, _, value)| (value.to_string(), json!(label)))
        .collect();
    mock.set_keys(&json!({ "labels": labels })).await?;
    let baseline = run_arm(ctx, DIRECT, &p, &mock).await?;
    res.checks.extend(checks(&baseline, &baseline, p.tpm));
    let mut arms = vec![];
    for arm in router_arms() {
        if arm.replicas > 1 && redis.is_none() {
            continue;
        }
        let r = run_arm(ctx, arm, &p, &mock).await?;
        res.checks.extend(checks(&r, &baseline, p.tpm));
        arms.push(r);
    }
    mock.stop().await;
    drop(redis);
    let mut table = Table::new(&[
        "arm",
        "requests",
        "answered",
        "RATE_LIMITED",
        "other errors",
        "upstream requests",
        "upstream 429s",
        "429s per 1,000 requests",
        "peak / offered tokens in a window, key a; key b",
    ]);
    let mut rows = vec![row(&baseline, p.tpm, &mut table)];
    for r in &arms {
        ctx.progress(format!(
            "   limits {}: {} answered, {} RATE_LIMITED, {} upstream 429s ({:.0} per 1,000; direct {:.0})",
            r.arm.label(),
            r.run.ok(),
            r.rate_limited(),
            r.upstream_429(),
            r.per_1k(),
            baseline.per_1k()
        ));
        rows.push(row(r, p.tpm, &mut table));
    }
    let skipped = if arms.iter().any(|r| r.arm.replicas > 1) {
        ""
    } else {
        "\n\n**The two-replica arms did not run: no `redis-server` on this machine.**"
    };
    res.markdown = format!(
        "One mock, two keys `a` and `b`, each with a window of {} tokens per {} s, charged at \
         arrival (input plus `max_tokens`: {} tokens a request here). Requests of \
         `max_tokens` {MAX_TOKENS} at {} per second for {:.0} s, open loop, unary. `direct` sends \
         straight to the mock, alternating the keys, without admission (the baseline: \
         Switchyard has no setting that turns admission off); `learned` is Switchyard with \
         both keys and no `tpm` (it learns the windows from the `x-ratelimit-*` headers of \
         the answers); `configured` has `tpm = {}` on each key. Route `admission_wait = \
         \"{}\"`. Two replicas share one `redis-server` (`[state] backend = \"redis\"`), the \
         load alternating between them. Peak is the mock's `peak_tokens` (what one window \
         held; it never charges past the limit, a refused request is not charged); offered \
         counts every request sent to the key in that window, refused ones included. A replica \
         that met an upstream 429 cools its target down for the `retry-after` the mock sent \
         and answers `UNAVAILABLE NO_HEALTHY_TARGET` meanwhile; `UPSTREAM_RATE_LIMITED` is \
         the 429 itself passed on.{skipped}\
         \n\n{}",
        p.tpm,
        WINDOW_MS / 1000,
        charge(),
        p.rate,
        p.duration.as_secs_f64(),
        p.tpm,
        p.admission_wait,
        table.render()
    );
    res.data = json!({
        "tpm": p.tpm,
        "window_ms": WINDOW_MS,
        "rate": p.rate,
        "duration_s": p.duration.as_secs_f64(),
        "tokens_per_request": charge(),
        "rows": rows,
    });
    Ok(res)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bench_limits_requests_are_about_a_thousand_tokens() {
        let c = charge();
        assert!((950..1100).contains(&c), "{c}");
    }

    #[test]
    fn bench_limits_rebuild_the_mocks_fixed_windows() {
        let record = |at: f64, key: &str| RequestRecord {
            arrived_ms: at,
            key_label: Some(key.into()),
            max_tokens: Some(99),
            body: json!({"messages": []}),
            ..RequestRecord::default()
        };
        // `[]` is 2 bytes: 1 input token, 100 a request.
        let log = vec![
            record(0.0, "a"),
            record(59_000.0, "a"),
            record(60_500.0, "a"),
            record(61_000.0, "a"),
            record(62_000.0, "a"),
            record(1.0, "b"),
        ];
        let r = ArmResult {
            arm: DIRECT,
            run: Run::default(),
            log,
            limits: LimitsView::default(),
        };
        assert_eq!(r.offered_peak("a"), 300);
        assert_eq!(r.offered_peak("b"), 100);
    }
}
