//! The five scenarios of the issue, one module each, `state`, `cost`,
//! `tail` (hedged first tokens) and `limits` (rate-window admission), plus
//! `peers` and `soak` (not in `all`). Every scenario starts
//! its own mocks and Switchyard processes, returns its data, its Markdown,
//! its correctness checks and the targets, and stops what it started.

mod amplification;
mod blackout;
mod burst;
mod cost;
mod h2load;
mod limits;
mod overhead;
mod peers;
mod soak;
mod state;
mod streams;
mod tail;

use super::clients::Outcome;
use super::load::Run;
use super::{BenchError, Check, Ctx, ScenarioResult};

/// Runs scenario `name`.
pub async fn run(name: &str, ctx: &Ctx) -> Result<ScenarioResult, BenchError> {
    match name {
        "overhead" => overhead::run(ctx).await,
        "blackout" => blackout::run(ctx).await,
        "burst" => burst::run(ctx).await,
        "amplification" => amplification::run(ctx).await,
        "streams" => streams::run(ctx).await,
        "state" => state::run(ctx).await,
        "cost" => cost::run(ctx).await,
        "tail" => tail::run(ctx).await,
        "limits" => limits::run(ctx).await,
        "peers" => peers::run(ctx).await,
        "h2load" => h2load::run(ctx).await,
        "soak" => soak::run(ctx).await,
        other => Err(BenchError::Usage(format!("unknown scenario `{other}`"))),
    }
}

/// How a build reaches its mocks: HTTP/1.1 (default), or HTTP/2 with prior
/// knowledge when `var` is `h2c` (`http2_prior_knowledge`, as a provider
/// reached over TLS negotiates HTTP/2 by ALPN). A baseline build that
/// predates the key refuses the config, so each build has its own variable.
fn upstream_h2c(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.trim() == "h2c")
}

/// `false` in `var`: the build's providers get `stream_unary = false`, so
/// a caller taking one answer is served by one non-streamed upstream call
/// (as the direct path and Busbar call the mock). Unset: the default, every
/// call streamed from the upstream. Each build has its own variable.
fn stream_unary_off(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v.trim() == "false")
}

/// The provider keys a build's two variables ask for ([`upstream_h2c`],
/// [`stream_unary_off`]), one per line, each after a newline.
fn upstream_keys(proto_var: &str, unary_var: &str) -> String {
    let mut keys = String::new();
    if upstream_h2c(proto_var) {
        keys.push_str("\nhttp2_prior_knowledge = true");
    }
    if stream_unary_off(unary_var) {
        keys.push_str("\nstream_unary = false");
    }
    keys
}

/// `provider` (with no other extra keys) given the keys [`upstream_keys`]
/// asks for.
fn with_upstream_keys(
    provider: crate::procs::Provider,
    proto_var: &str,
    unary_var: &str,
) -> crate::procs::Provider {
    let keys = upstream_keys(proto_var, unary_var);
    provider.extra(keys.trim_start_matches('\n'))
}

/// [`upstream_keys`] in words, for a report.
fn upstream_text(proto_var: &str, unary_var: &str) -> String {
    let proto = match upstream_h2c(proto_var) {
        true => "HTTP/2 with prior knowledge (h2c)",
        false => "HTTP/1.1",
    };
    match stream_unary_off(unary_var) {
        true => format!("{proto}, unary callers non-streamed (`stream_unary = false`)"),
        false => proto.to_string(),
    }
}

/// A result skeleton.
fn result(name: &str) -> ScenarioResult {
    ScenarioResult {
        name: name.to_string(),
        seconds: 0.0,
        data: serde_json::Value::Null,
        markdown: String::new(),
        checks: Vec::new(),
        targets: Vec::new(),
    }
}

/// Every scheduled request has an outcome or was counted as not sent (the
/// load generator's in-flight cap: a rate not sustained is a result, not an error).
fn check_complete(label: &str, run: &Run) -> Check {
    Check::new(
        format!("{label}: every request accounted for"),
        run.accounted(),
        format!(
            "scheduled {} outcomes {} skipped (in-flight cap) {} unfinished {}",
            run.scheduled,
            run.outcomes.len(),
            run.skipped,
            run.unfinished
        ),
    )
}

/// Only errors whose kind is in `allowed` (an empty list: no errors at all).
fn check_errors(label: &str, outcomes: &[Outcome], allowed: &[&str]) -> Check {
    let bad: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| !o.ok)
        .filter(|o| !o.error_kind().is_some_and(|k| allowed.contains(&k)))
        .collect();
    let sample = bad
        .iter()
        .take(3)
        .filter_map(|o| o.error.clone())
        .collect::<Vec<_>>()
        .join("; ");
    Check::new(
        if allowed.is_empty() {
            format!("{label}: no errors")
        } else {
            format!("{label}: no errors besides {}", allowed.join(", "))
        },
        bad.is_empty(),
        format!("{} unexpected of {} ({sample})", bad.len(), outcomes.len()),
    )
}

/// Error strings with counts, as JSON.
fn errors_json(outcomes: &[Outcome]) -> serde_json::Value {
    let mut m = std::collections::BTreeMap::<String, usize>::new();
    for e in outcomes.iter().filter_map(|o| o.error.clone()) {
        *m.entry(e).or_insert(0) += 1;
    }
    serde_json::json!(m)
}
