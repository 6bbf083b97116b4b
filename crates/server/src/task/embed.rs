//! An embeddings call's request task (`POST /v1/embeddings`, `Router.Embed`):
//! a plan of the route's `embeddings` targets of one family (the router
//! actor's), the cost hold against the tenant's cap, then the walk: each
//! attempt admitted by its target's provider actor (breaker, ceilings) and
//! reported once, each retry or failover chosen by [`policy::next`] and
//! paid from the route's retry budget, never past the deadline. No ladder:
//! an embedding has no stored or queued stand-in. The call's vocabulary
//! and validation are in [`crate::embeddings`].

use std::sync::Arc;

use tokio::time::{timeout_at, Instant};

use super::bill::price;
use super::live::Turn;
use super::{Running, Tasks};
use crate::actors::provider;
use crate::actors::router::{Candidate, Plan};
use crate::embeddings::{EmbedSpec, Embedded, MAX_ANSWER_BYTES};
use crate::error::RequestError;
use crate::policy::next::{next, Next, Outcome, Tried, View};
use crate::policy::outcome::{Failure, OutcomeClass};
use crate::semantic::embed::{self, Batch, Vectors};

impl Tasks {
    /// Runs an embeddings call to its end. Counted among the running
    /// requests, and ended with SERVER_DRAINING when the drain timeout passes.
    pub async fn embed(self: Arc<Self>, spec: EmbedSpec) -> Result<Embedded, RequestError> {
        let _running = Running::count(&self.active);
        tokio::select! {
            r = self.serve_embed(&spec) => r,
            _ = self.abort.cancelled() => Err(RequestError::Draining),
        }
    }

    /// The plan, the cost hold, the walk, the bill.
    async fn serve_embed(&self, spec: &EmbedSpec) -> Result<Embedded, RequestError> {
        let plan = self
            .actors
            .plan_embeddings(&spec.route, spec.pin.as_deref())
            .await?;
        let deadline = spec.deadline.unwrap_or_else(|| {
            let within = plan.deadline.unwrap_or(self.default_deadline);
            crate::policy::clock::after(Instant::now(), within)
        });
        let result = match self.reserve_embeddings(spec, &plan, deadline).await {
            Ok(held) => {
                let result = self.walk_embed(spec, &plan, deadline).await;
                let spent = result.as_ref().map_or(0.0, |e| e.cost_usd);
                self.settle_embeddings(&spec.tenant, held, spent).await;
                result
            }
            Err(e) => Err(e),
        };
        if let Err(e) = &result {
            self.count_shed(&plan.route, e);
        }
        result
    }

    /// Asks the decision table what to do after each attempt and does it.
    async fn walk_embed(
        &self,
        spec: &EmbedSpec,
        plan: &Plan,
        deadline: Instant,
    ) -> Result<Embedded, RequestError> {
        let policy = plan.policy();
        let providers = plan.providers();
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
                backoff: &self.backoff,
                caller_can_reset: true,
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
                // Never committed either: nothing to continue.
                Next::Continue { .. } => {
                    outcome = Outcome::ContinueOn(None);
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
            let c = &plan.candidates[to];
            outcome = match self.embed_once(spec, plan, c, &mut tried, deadline).await {
                Ok(served) => return Ok(served),
                Err(outcome) => outcome,
            };
        }
    }

    /// One attempt: admission and the route's budget, the upstream call
    /// and its one outcome report. `Err` is what the decision table reads next.
    async fn embed_once(
        &self,
        spec: &EmbedSpec,
        plan: &Plan,
        c: &Candidate,
        tried: &mut Tried,
        deadline: Instant,
    ) -> Result<Embedded, Outcome> {
        let Turn { entry, permit, .. } = self
            .take_turn(c, &plan.route, tried, deadline, None)
            .await?;
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
            Ok(Ok(_)) => OutcomeClass::Ok,
            Ok(Err(f)) => f.class,
            Err(_) => OutcomeClass::Timeout,
        };
        let series = self.series(c, &entry);
        series.count_attempt(&self.metrics, class.as_str());
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
                return Err(failed(failure));
            }
            Ok(Ok(v)) => v,
        };
        let usage = match vectors.prompt_tokens {
            Some(n) => (n, false),
            None => (spec.estimated_tokens(), true),
        };
        series.input_tokens.observe(f64::from(usage.0));
        self.served(&plan.route, c, c.tier());
        let cost_usd = price(&entry, &c.model).cost(usage.0, 0);
        Ok(embedded(c, vectors, attempts, usage, cost_usd))
    }
}

/// A failed embeddings attempt, as the decision table reads it: nothing
/// reached the caller.
fn failed(failure: Failure) -> Outcome {
    Outcome::Failed {
        failure,
        committed: false,
        had_output: false,
        tokens_emitted: 0,
    }
}

/// The served call: its vectors, who served them, usage (input tokens,
/// and whether they are estimated) and cost.
fn embedded(
    c: &Candidate,
    vectors: Vectors,
    attempts: u32,
    (input_tokens, usage_estimated): (u32, bool),
    cost_usd: f64,
) -> Embedded {
    Embedded {
        vectors: vectors.vectors,
        provider: c.provider.to_string(),
        model: c.model.to_string(),
        tier: c.tier(),
        attempts,
        input_tokens,
        usage_estimated,
        cost_usd,
    }
}
