//! An embeddings call's request task (`POST /v1/embeddings`, `Router.Embed`):
//! validation, a plan of the route's `embeddings` targets of one family
//! (the router actor's), the cost hold against the tenant's cap, then the
//! walk: each attempt admitted by its target's provider actor (breaker,
//! ceilings) and reported once, each retry or failover chosen by
//! [`policy::next`](crate::policy::next) and paid from the route's retry
//! budget, never past the deadline. The answer names the model that served:
//! vectors of different models are not comparable. Holds no policy of its own.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use tokio::time::{timeout_at, Instant};

use crate::actors::provider::{self, Refusal, TrafficClass};
use crate::actors::router::{Candidate, Plan, RouterMsg};
use crate::actors::CALL_TIMEOUT;
use crate::config::LimitsConfig;
use crate::dispatch::{admit, price, Admission, Dispatcher};
use crate::error::RequestError;
use crate::policy::next::{next, Next, Outcome, Tried, View};
use crate::semantic::embed::{self, Batch, Input, MAX_DIMENSION};
use crate::sink::Tier;
use crate::state::cost::{OnOutage, Reservation};
use crate::telemetry::metrics::ShedLabels;

/// Most inputs in one call (OpenAI's own limit).
pub const MAX_INPUTS: usize = 2048;
/// Largest upstream answer read for one call (2048 vectors of 1536
/// dimensions as base64 take about 17 MB).
pub const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

/// A validated embeddings call, ready to route.
#[derive(Debug, Clone)]
pub struct EmbedSpec {
    pub request_id: String,
    /// The route; `pin` narrows it to one `provider/model` target.
    pub route: String,
    pub pin: Option<String>,
    /// The caller's tenant ("default" when none is known).
    pub tenant: String,
    pub input: Input,
    /// Shorter vectors, from models that can make them.
    pub dimensions: Option<u32>,
    /// The caller's end-user id, passed on to the upstream.
    pub user: Option<String>,
    /// The caller's deadline, when it set one.
    pub deadline: Option<Instant>,
    /// The caller reads base64 (the upstream is asked for it too: a third
    /// of the bytes).
    pub base64: bool,
}

/// A served call.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// One per input, in input order.
    pub vectors: Vec<Vec<f32>>,
    pub provider: String,
    /// The model that served: vectors of another model are not comparable.
    pub model: String,
    pub tier: Tier,
    /// Upstream attempts made, across targets.
    pub attempts: u32,
    pub input_tokens: u32,
    /// The upstream sent no usage: `input_tokens` is estimated.
    pub usage_estimated: bool,
    pub cost_usd: f64,
}

impl EmbedSpec {
    /// Checks the call against the limits; errors name the field.
    pub fn validate(&self, limits: &LimitsConfig) -> Result<(), RequestError> {
        let invalid = |m: String| Err(RequestError::InvalidRequest(m));
        if self.route.is_empty() || self.route.len() > limits.max_id_bytes {
            return invalid(format!("route: must be 1 to {} bytes", limits.max_id_bytes));
        }
        for (field, value) in [("tenant", Some(&self.tenant)), ("user", self.user.as_ref())] {
            if value.is_some_and(|v| v.len() > limits.max_id_bytes) {
                return invalid(format!(
                    "{field}: longer than {} bytes",
                    limits.max_id_bytes
                ));
            }
        }
        if let Some(d) = self.dimensions {
            if d == 0 || d as usize > MAX_DIMENSION {
                return invalid(format!("dimensions: {d} is outside 1..={MAX_DIMENSION}"));
            }
        }
        check_input(&self.input, limits)
    }

    /// Input tokens at most (token ids), or about (four characters a token).
    fn estimated_tokens(&self) -> u32 {
        let n: usize = match &self.input {
            Input::Texts(t) => t.iter().map(|s| s.chars().count().div_ceil(4).max(1)).sum(),
            Input::Tokens(t) => t.iter().map(Vec::len).sum(),
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// 1 to [`MAX_INPUTS`] non-empty inputs, within `limits.max_prompt_bytes`
/// all together (token ids count four bytes each).
fn check_input(input: &Input, limits: &LimitsConfig) -> Result<(), RequestError> {
    let invalid = |m: String| Err(RequestError::InvalidRequest(m));
    if input.is_empty() || input.len() > MAX_INPUTS {
        return invalid(format!(
            "input: {} inputs (1 to {MAX_INPUTS} accepted)",
            input.len()
        ));
    }
    let (empty, bytes) = match input {
        Input::Texts(t) => (
            t.iter().position(String::is_empty),
            t.iter().map(String::len).sum::<usize>(),
        ),
        Input::Tokens(t) => (
            t.iter().position(Vec::is_empty),
            t.iter().map(|ids| ids.len() * 4).sum(),
        ),
    };
    if let Some(i) = empty {
        return invalid(format!("input[{i}]: must not be empty"));
    }
    if bytes > limits.max_prompt_bytes {
        return invalid(format!(
            "input: {bytes} bytes exceed limits.max_prompt_bytes ({})",
            limits.max_prompt_bytes
        ));
    }
    Ok(())
}

/// Runs the call to its end. Counted among the running requests, and ended
/// with SERVER_DRAINING when the drain timeout passes.
pub async fn run(d: Arc<Dispatcher>, spec: EmbedSpec) -> Result<Embedded, RequestError> {
    d.active.fetch_add(1, Ordering::Relaxed);
    let result = tokio::select! {
        r = serve(&d, &spec) => r,
        _ = d.abort.cancelled() => Err(RequestError::Draining),
    };
    d.active.fetch_sub(1, Ordering::Relaxed);
    result
}

/// The plan, the cost hold, the walk, the bill.
async fn serve(d: &Dispatcher, spec: &EmbedSpec) -> Result<Embedded, RequestError> {
    let plan = plan(d, spec).await?;
    let deadline = spec.deadline.unwrap_or_else(|| {
        crate::policy::clock::after(Instant::now(), plan.deadline.unwrap_or(d.default_deadline))
    });
    let result = match hold(d, spec, &plan, deadline).await {
        Ok(held) => {
            let result = walk(d, spec, &plan, deadline).await;
            let spent = result.as_ref().map_or(0.0, |e| e.cost_usd);
            match held {
                Some(r) => d.cost.settle(r, spent).await,
                None => d.cost.charge(&spec.tenant, spent).await,
            }
            result
        }
        Err(e) => Err(e),
    };
    if let Some(reason) = result.as_ref().err().and_then(RequestError::shed_reason) {
        d.metrics
            .shed
            .get_or_create(&ShedLabels {
                route: plan.route.clone(),
                reason,
            })
            .inc();
    }
    result
}

/// The route's `embeddings` targets of one family, from the router actor.
async fn plan(d: &Dispatcher, spec: &EmbedSpec) -> Result<Plan, RequestError> {
    let router = d
        .registry
        .router()
        .ok_or_else(|| RequestError::Unavailable("router actor is not running".into()))?;
    let answer = router
        .call(
            |reply| RouterMsg::PlanEmbeddings {
                route: spec.route.clone(),
                pin: spec.pin.clone(),
                reply,
            },
            Some(CALL_TIMEOUT),
        )
        .await;
    match answer {
        Ok(CallResult::Success(plan)) => Ok(plan?),
        _ => Err(RequestError::Unavailable(
            "router actor did not answer".into(),
        )),
    }
}

/// Holds the call's most likely cost (its input at the dearest candidate's
/// input price) against the tenant's cap, or refuses with COST_CAP (or
/// STATE_UNAVAILABLE on a `fail_closed` route while the fleet ledger is away).
async fn hold(
    d: &Dispatcher,
    spec: &EmbedSpec,
    plan: &Plan,
    deadline: Instant,
) -> Result<Option<Reservation>, RequestError> {
    if !d.cost.has_cap(&spec.tenant) {
        return Ok(None);
    }
    let tokens = spec.estimated_tokens();
    let usd = plan
        .candidates
        .iter()
        .filter_map(|c| Some(price(&d.registry.provider(&c.provider)?, &c.model)))
        .map(|p| p.cost(tokens, 0))
        .fold(0.0, f64::max);
    // Held past the deadline by a margin, so a live call never loses it.
    let hold = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(30);
    let on_outage = if plan.fail_closed {
        OnOutage::Refuse
    } else {
        OnOutage::Allowance
    };
    d.cost
        .reserve(&spec.tenant, usd, hold, on_outage)
        .await
        .map_err(|refused| refused.into_error(&spec.tenant))
}

/// Asks the decision table what to do after each attempt and does it.
async fn walk(
    d: &Dispatcher,
    spec: &EmbedSpec,
    plan: &Plan,
    deadline: Instant,
) -> Result<Embedded, RequestError> {
    let policy = plan.policy();
    let providers: Vec<&str> = plan
        .candidates
        .iter()
        .map(|c| c.provider.as_str())
        .collect();
    // No time-to-first-token admission: an embeddings answer has no stream.
    let p95 = vec![None; plan.candidates.len()];
    let mut tried = Tried::new(plan.candidates.len());
    let mut outcome = Outcome::Begin;
    loop {
        let view = View {
            policy: &policy,
            remaining: deadline.saturating_duration_since(Instant::now()),
            p95_ttft: &p95,
            providers: &providers,
            backoff: &d.backoff,
        };
        let step = next(&mut tried, outcome, &view, &mut rand::rng());
        let (to, wait) = match step {
            Next::FailOver { to } => (to, None),
            Next::Retry { to, after } => (to, Some(after)),
            Next::Stop(e) => return Err(e),
            // Nothing reached the caller before an answer: there is nothing
            // to discard, and `Done` follows only a served attempt.
            Next::Reset { .. } => {
                outcome = Outcome::ResetSent;
                continue;
            }
            Next::Done => {
                return Err(RequestError::Unavailable(
                    "the walk ended without an answer".into(),
                ))
            }
        };
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
        outcome = match attempt(d, spec, plan, &plan.candidates[to], &mut tried, deadline).await {
            Ok(served) => return Ok(served),
            Err(outcome) => outcome,
        };
    }
}

/// One attempt: admission by the target's provider actor, the route's
/// budget for any attempt after the first, the upstream call and its one
/// outcome report. `Err` is what the decision table reads next.
async fn attempt(
    d: &Dispatcher,
    spec: &EmbedSpec,
    plan: &Plan,
    c: &Candidate,
    tried: &mut Tried,
    deadline: Instant,
) -> Result<Embedded, Outcome> {
    let traffic = if c.primary {
        TrafficClass::Own
    } else {
        TrafficClass::Failover
    };
    let (entry, mut permit) = match admit(&d.registry, &c.provider, &c.model, traffic, deadline)
        .await
    {
        Admission::Granted(entry, permit) => (entry, permit),
        Admission::Refused(refusal) => {
            tracing::debug!(provider = %c.provider, model = %c.model, %refusal, "target refused admission");
            return Err(Outcome::Refused {
                saturated: matches!(refusal, Refusal::Saturated(_)),
                retry_in: refusal.retry_in(),
            });
        }
        Admission::Unreachable => {
            return Err(Outcome::Refused {
                saturated: false,
                retry_in: None,
            })
        }
    };
    if tried.needs_budget() && !d.withdraw(&plan.route).await {
        // Dropped unsent: it reports itself cancelled.
        drop(permit);
        return Err(Outcome::NoBudget);
    }
    tried.sent();
    permit.mark_sent();
    let batch = Batch {
        model: &c.model,
        input: &spec.input,
        dimensions: spec.dimensions,
        user: spec.user.as_deref(),
        base64: spec.base64,
    };
    let sent = Instant::now();
    let answer = timeout_at(
        deadline,
        embed::fetch_batch(&entry.runtime.endpoint, &batch, MAX_ANSWER_BYTES),
    )
    .await;
    let class = match &answer {
        Ok(Ok(_)) => crate::policy::outcome::OutcomeClass::Ok,
        Ok(Err(f)) => f.class,
        Err(_) => crate::policy::outcome::OutcomeClass::Timeout,
    };
    let series = d
        .metrics
        .target(entry.runtime.kind.as_str(), &c.provider, &c.model);
    series.count_attempt(&d.metrics, class.as_str());
    series
        .operation_duration
        .observe(sent.elapsed().as_secs_f64());
    permit.report(provider::Outcome {
        class,
        retry_after: match &answer {
            Ok(Err(f)) => f.retry_after,
            _ => None,
        },
        elapsed: sent.elapsed(),
        ttft: None,
        failed_output_tokens: 0,
    });
    let attempts = tried.attempts();
    tracing::debug!(request_id = %spec.request_id, route = %plan.route, provider = %c.provider, model = %c.model, attempt = attempts, outcome = %class, "embeddings attempt ended");
    let vectors = match answer {
        Err(_) => return Err(Outcome::DeadlineExceeded),
        Ok(Err(failure)) => {
            tracing::info!(request_id = %spec.request_id, provider = %c.provider, model = %c.model, attempt = attempts, outcome = %class, http_status = failure.http_status, "embeddings attempt failed");
            return Err(Outcome::Failed {
                failure,
                committed: false,
                had_output: false,
                tokens_emitted: 0,
            });
        }
        Ok(Ok(v)) => v,
    };
    let (input_tokens, usage_estimated) = match vectors.prompt_tokens {
        Some(n) => (n, false),
        None => (spec.estimated_tokens(), true),
    };
    series.input_tokens.observe(f64::from(input_tokens));
    let tier = c.tier();
    d.served(&plan.route, c, tier);
    Ok(Embedded {
        vectors: vectors.vectors,
        provider: c.provider.clone(),
        model: c.model.clone(),
        tier,
        attempts,
        input_tokens,
        usage_estimated,
        cost_usd: price(&entry, &c.model).cost(input_tokens, 0),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn spec(input: Input) -> EmbedSpec {
        EmbedSpec {
            request_id: "r".into(),
            route: "embed".into(),
            pin: None,
            tenant: "default".into(),
            input,
            dimensions: None,
            user: None,
            deadline: None,
            base64: false,
        }
    }

    fn field(e: RequestError) -> String {
        match e {
            RequestError::InvalidRequest(m) => m.split_once(": ").unwrap().0.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals_name_the_field() {
        let limits = LimitsConfig::default();
        let texts = |t: &[&str]| Input::Texts(t.iter().map(|s| s.to_string()).collect());
        assert!(spec(texts(&["a", "b"])).validate(&limits).is_ok());
        assert!(spec(Input::Tokens(vec![vec![1, 2]]))
            .validate(&limits)
            .is_ok());
        let check = |s: EmbedSpec| field(s.validate(&limits).unwrap_err());
        assert_eq!(check(spec(texts(&[]))), "input");
        assert_eq!(check(spec(texts(&["a", ""]))), "input[1]");
        assert_eq!(check(spec(Input::Tokens(vec![vec![]]))), "input[0]");
        let many = vec!["x".to_string(); MAX_INPUTS + 1];
        assert_eq!(check(spec(Input::Texts(many))), "input");
        let big = "x".repeat(limits.max_prompt_bytes + 1);
        assert_eq!(check(spec(Input::Texts(vec![big]))), "input");
        let mut s = spec(texts(&["a"]));
        s.dimensions = Some(0);
        assert_eq!(check(s), "dimensions");
        let mut s = spec(texts(&["a"]));
        s.user = Some("u".repeat(limits.max_id_bytes + 1));
        assert_eq!(check(s), "user");
        let mut s = spec(texts(&["a"]));
        s.route = String::new();
        assert_eq!(check(s), "route");
    }

    #[test]
    fn the_estimate_counts_token_ids_exactly_and_text_by_characters() {
        assert_eq!(
            spec(Input::Tokens(vec![vec![1, 2, 3], vec![4]])).estimated_tokens(),
            4
        );
        // Four characters a token, at least one per input.
        let texts = Input::Texts(vec!["abcdefgh".into(), "é".into()]);
        assert_eq!(spec(texts).estimated_tokens(), 3);
    }
}
