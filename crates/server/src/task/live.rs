//! The live rungs: the route's targets, walked as [`policy::next`] says.
//! Each attempt is admitted by its target's provider actor, paid from the
//! route's retry budget when it is not the first, sent inside its span,
//! reported once (the permit carries the outcome), billed, and counted; a
//! completed one is finished with usage, cost and who served it. On a
//! `cache_affinity` route, the target where the prompt's prefix is warm
//! goes first. It holds no policy of its own.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::admit::Windows;
use super::bill::{estimate_usage, price, Bill};
use super::continuation::{self, Continuing};
use super::Tasks;
use crate::actors::client::Admission;
use crate::actors::provider::{self, Permit, Refusal, TrafficClass};
use crate::actors::registry::ProviderEntry;
use crate::actors::router::{Candidate, Plan, Traffic, INLINE_TARGETS};
use crate::attempt::{self, AttemptEnd, AttemptInput, AttemptResult};
use crate::chat::{ChatRequest, Completion, Usage};
use crate::error::RequestError;
use crate::policy::affinity::{self, PrefixHash, Warm};
use crate::policy::next::{next, Next, Outcome, Tried, View};
use crate::request::RequestSpec;
use crate::sink::{EventSink, Finished, Started, Tier};
use crate::telemetry::metrics::TargetSeries;

/// Samples of a target's TTFT needed before deadline-aware admission trusts its p95.
const MIN_TTFT_SAMPLES: u64 = 5;

/// One request's walk, as each attempt sees it.
#[derive(Clone, Copy)]
pub(super) struct Call<'a> {
    pub(super) spec: &'a RequestSpec,
    pub(super) plan: &'a Plan,
    pub(super) candidate: &'a Candidate,
    pub(super) deadline: Instant,
    pub(super) affinity: Option<&'a Affinity>,
    /// This attempt continues the answer the caller holds.
    pub(super) continues: Option<&'a Continuing>,
    /// The caller takes one assembled answer (see [`Candidate::streamed`]).
    pub(super) buffered: bool,
}

/// A request's prompt-cache affinity, on a route with `cache_affinity`.
pub(super) struct Affinity {
    /// Its cacheable prefixes, longest first.
    prefixes: Vec<PrefixHash>,
    /// Where the longest warm one was answered, if any is.
    warm: Option<Warm>,
    ttl: Duration,
}

/// What a completed attempt adds to `Finished`.
struct Served {
    attempts: u32,
    upstream_request_id: Option<String>,
    /// Output tokens (estimated) of failed attempts whose text the caller
    /// kept (a continued answer): the usage sums them.
    carried: u32,
    /// A hedged request: the attempt that answered.
    won_attempt: Option<u32>,
}

/// A target that admitted an attempt, about to be sent.
pub(super) struct Turn<'a> {
    pub(super) entry: ProviderEntry,
    pub(super) permit: Permit,
    pub(super) traffic: TrafficClass,
    /// The attempt's holds on the target's rate windows, and the key
    /// admission chose (`None`: no key is bounded).
    pub(super) windows: Option<(Windows<'a>, Option<String>)>,
}

/// What rate-window admission needs to know about the request.
pub(super) struct Ask<'b> {
    pub(super) spec: &'b RequestSpec,
    pub(super) chat: &'b ChatRequest,
    pub(super) traffic: &'b Traffic,
    /// The key prompt-cache affinity prefers.
    pub(super) prefer: Option<&'b str>,
}

/// What the walk carries from one attempt to the next.
#[derive(Default)]
struct Walk {
    /// The candidate of the latest attempt.
    failed: Option<usize>,
    /// A continuation in progress (`mid_stream = "continue"`).
    continuing: Option<Continuing>,
    /// Output tokens of failed attempts the caller kept.
    carried: u32,
}

impl Tasks {
    /// The live part of the ladder: asks the decision table what to do after
    /// each event and does it.
    // Not an `async fn`, on purpose: one keeps its by-value argument twice
    // in its future, and this future is part of every streaming request.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn drive<'a, 'b>(
        &'a self,
        spec: &'a RequestSpec,
        plan: &'a Plan,
        affinity: Option<&'a Affinity>,
        sink: &'a mut EventSink,
        bill: &'a mut Bill<'b>,
        first: Outcome,
    ) -> impl std::future::Future<Output = Result<(), RequestError>> + use<'a, 'b> {
        async move {
            let deadline = bill.deadline;
            let mut chat = spec.chat.clone();
            if chat.max_tokens.is_none() {
                chat.max_tokens = plan.default_max_tokens;
            }
            let policy = plan.policy();
            let providers = plan.providers();
            // Read once per request: the targets' p95 barely moves within one.
            let p95: smallvec::SmallVec<[Option<Duration>; INLINE_TARGETS]> =
                plan.candidates.iter().map(|c| self.p95_ttft(c)).collect();
            let mut tried = Tried::new(plan.candidates.len());
            let mut walk = Walk::default();
            if let Outcome::TakeOver { from } = first {
                walk.failed = Some(from);
            }
            let mut outcome = first;
            // Time spent waiting for a rate window (`admission_wait`).
            let mut waited = Duration::ZERO;
            loop {
                if sink.is_closed() {
                    return Ok(());
                }
                let view = View {
                    policy: &policy,
                    remaining: deadline.saturating_duration_since(Instant::now()),
                    p95_ttft: &p95,
                    providers: &providers,
                    backoff: &self.backoff,
                    caller_can_reset: sink.can_reset(),
                };
                // The thread's RNG, held only for the call (it is not `Send`).
                let step = next(&mut tried, outcome, &view, &mut rand::rng());
                let (to, wait) = match step {
                    Next::Done => {
                        if !waited.is_zero() {
                            self.count_admission_wait(&plan.route, "admitted");
                        }
                        return Ok(());
                    }
                    Next::Stop(RequestError::RateLimited { route, retry_in })
                        if tried.attempts() == 0 =>
                    {
                        let allowed = plan.traffic.admission_wait;
                        if self
                            .wait_for_window(&route, retry_in, &mut waited, allowed, deadline, sink)
                            .await
                        {
                            tried = Tried::new(plan.candidates.len());
                            outcome = Outcome::Begin;
                            continue;
                        }
                        if sink.is_closed() {
                            return Ok(());
                        }
                        return Err(RequestError::RateLimited { route, retry_in });
                    }
                    Next::Stop(e) => return Err(e),
                    Next::Reset { reason } => {
                        if sink.reset(reason, tried.attempts()).await.is_err() {
                            return Ok(());
                        }
                        if walk.continuing.is_some() {
                            // The answer starts over: no prefill.
                            chat.messages.clone_from(&spec.chat.messages);
                            chat.passthrough.clone_from(&spec.chat.passthrough);
                        }
                        walk = Walk::default();
                        outcome = Outcome::ResetSent;
                        continue;
                    }
                    Next::Continue { reason } => {
                        outcome =
                            self.plan_continuation(spec, plan, &tried, sink, &mut walk, &reason);
                        continue;
                    }
                    Next::FailOver { to } => (to, None),
                    Next::Retry { to, after } => (to, Some(after)),
                };
                if let Some(wait) = wait {
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = sink.closed() => return Ok(()),
                    }
                }
                walk.failed = Some(to);
                if let Some(c) = &walk.continuing {
                    (chat.messages, chat.passthrough) =
                        continuation::prefilled(&spec.chat, &c.prefill);
                }
                let call = Call {
                    spec,
                    plan,
                    candidate: &plan.candidates[to],
                    deadline,
                    affinity,
                    continues: walk.continuing.as_ref(),
                    buffered: sink.buffered(),
                };
                outcome = self
                    .attempt(&call, &mut chat, &mut tried, sink, bill, walk.carried)
                    .await?;
            }
        }
    }

    /// After output of candidate `walk.failed` was cut on a `continue`
    /// route: the candidate that continues the answer (with the prefill it
    /// is given), or none, for the decision table.
    fn plan_continuation(
        &self,
        spec: &RequestSpec,
        plan: &Plan,
        tried: &Tried,
        sink: &EventSink,
        walk: &mut Walk,
        reason: &str,
    ) -> Outcome {
        let failed = walk.failed.unwrap_or_default();
        let on = self.continuer(spec, plan, failed, sink);
        tracing::info!(
            request_id = %spec.request_id,
            %reason,
            continues_on = on.as_ref().map(|(i, _)| &*plan.candidates[*i].provider),
            "the stream failed after output: continuing it"
        );
        walk.carried += sink.attempt_chars().div_ceil(4) as u32;
        let to = on.map(|(to, prefill)| {
            walk.continuing = Some(Continuing {
                prefill,
                failed_attempt: tried.attempts(),
            });
            to
        });
        Outcome::ContinueOn(to)
    }

    /// One step of the walk: admission, the route's budget for any attempt
    /// after the first, then the attempt, its report and its bill.
    async fn attempt(
        &self,
        call: &Call<'_>,
        chat: &mut ChatRequest,
        tried: &mut Tried,
        sink: &mut EventSink,
        bill: &mut Bill<'_>,
        carried: u32,
    ) -> Result<Outcome, RequestError> {
        let candidate = call.candidate;
        chat.model = candidate.model.clone();
        chat.stream = candidate.streamed(call.buffered);
        let prefer = call.affinity.and_then(|a| {
            affinity::key_for(a.warm.as_ref(), &candidate.provider, &candidate.model)
        });
        let ask = Ask {
            spec: call.spec,
            chat,
            traffic: &call.plan.traffic,
            prefer,
        };
        let turn = match self
            .take_turn(candidate, &call.plan.route, tried, call.deadline, Some(ask))
            .await
        {
            Ok(turn) => turn,
            Err(outcome) => return Ok(outcome),
        };
        if let Some(hedge) = self.hedge_for(call, tried, sink) {
            // Boxed, as every rare path of a request is: a hedge's race and
            // its conclusion (4.9 KB of future) would otherwise be stored in
            // every request, and its locals would widen the streaming state.
            return Box::pin(self.attempt_hedged(
                call,
                chat,
                (tried, sink, bill),
                carried,
                turn,
                hedge,
            ))
            .await;
        }
        chat.service_tier = call
            .plan
            .service_tier
            .clone()
            .filter(|t| turn.entry.runtime.kind.quirks().takes_service_tier(t));
        let result = self
            .send(
                call,
                &turn.entry,
                chat,
                tried.attempts(),
                turn.traffic,
                turn.windows.as_ref(),
                sink,
            )
            .await;
        self.conclude(
            call,
            chat,
            turn,
            result,
            (tried, sink, bill),
            (carried, None),
        )
        .await
    }

    /// A hedged attempt that failed before any token while the other
    /// answered: settled, reported and counted, never billed.
    pub(super) async fn conclude_unanswered(
        &self,
        call: &Call<'_>,
        turn: Turn<'_>,
        result: &AttemptResult,
    ) {
        self.settle_windows(&turn, result).await;
        self.series(call.candidate, &turn.entry)
            .count_attempt(&self.metrics, result.end.class().as_str());
        turn.permit.report(provider::Outcome::of(result, 0));
        self.record_attempt(call.candidate, &turn.entry, result);
    }

    /// An attempt's holds settled and what its answers reported learned.
    async fn settle_windows(&self, turn: &Turn<'_>, result: &AttemptResult) {
        match &turn.windows {
            Some((w, _)) => w.settle(result).await,
            None if !result.reported.is_empty() => {
                super::admit::learn(
                    &self.limits,
                    &self.metrics,
                    &turn.entry.runtime,
                    result,
                    &[],
                )
                .await;
            }
            None => {}
        }
    }

    /// After an attempt: its windows settled, its report, its bill, and
    /// what the decision table reads next (a completed one is finished).
    pub(super) async fn conclude(
        &self,
        call: &Call<'_>,
        chat: &ChatRequest,
        turn: Turn<'_>,
        result: AttemptResult,
        (tried, sink, bill): (&mut Tried, &mut EventSink, &mut Bill<'_>),
        (carried, won_attempt): (u32, Option<u32>),
    ) -> Result<Outcome, RequestError> {
        self.settle_windows(&turn, &result).await;
        let Turn { entry, permit, .. } = turn;
        let candidate = call.candidate;
        let billed = self.report(call, &entry, permit, &result, sink);
        self.bill_failed_output(bill, billed).await?;
        self.record_attempt(candidate, &entry, &result);
        Ok(match result.end {
            AttemptEnd::Completed(completion) => {
                self.affinity_remember(call, result.key).await;
                let served = Served {
                    attempts: tried.attempts(),
                    upstream_request_id: result.upstream_request_id,
                    carried,
                    won_attempt,
                };
                let cost = self
                    .finish(call, &entry, chat, completion, served, sink)
                    .await;
                bill.spend(cost);
                Outcome::Completed
            }
            AttemptEnd::ClientGone => Outcome::Completed,
            AttemptEnd::DeadlineExceeded => Outcome::DeadlineExceeded,
            AttemptEnd::Failed(failure) => Outcome::Failed {
                failure,
                committed: sink.committed(),
                had_output: sink.attempt_had_output(),
                tokens_emitted: sink.attempt_chunks(),
            },
        })
    }

    /// A permit from the candidate's provider actor and, for any attempt
    /// after the first, one more attempt from the route's budget; `Err` is
    /// what the decision table reads when either refused (nothing was sent).
    pub(super) async fn take_turn(
        &self,
        c: &Candidate,
        route: &str,
        tried: &mut Tried,
        deadline: Instant,
        ask: Option<Ask<'_>>,
    ) -> Result<Turn<'_>, Outcome> {
        let traffic = if c.primary {
            TrafficClass::Own
        } else {
            TrafficClass::Failover
        };
        let admission = self
            .actors
            .take_permit(&c.provider, &c.model, traffic, deadline)
            .await;
        let (entry, mut permit) = match admission {
            Admission::Granted(entry, permit) => (entry, permit),
            Admission::Refused(refusal) => {
                tracing::debug!(provider = %c.provider, model = %c.model, %refusal, "target refused admission");
                return Err(Outcome::Refused {
                    saturated: matches!(refusal, Refusal::Saturated(_)),
                    retry_in: refusal.retry_in(),
                });
            }
            Admission::Unreachable => {
                tracing::warn!(provider = %c.provider, "provider actor unreachable; skipping it");
                return Err(Outcome::Refused {
                    saturated: false,
                    retry_in: None,
                });
            }
        };
        // A key with room in its rate windows, held before anything is sent.
        let configured = entry.runtime.endpoint.has_rate_limits();
        let windows = match ask {
            Some(ask) if self.limits.may_bound(&entry.runtime.id, configured) => {
                let w = Windows::new(
                    (&self.limits, &self.metrics),
                    entry.runtime.clone(),
                    ask.spec,
                    ask.chat,
                    ask.traffic.priority,
                    ask.traffic.batch_share,
                );
                match w.first(ask.prefer).await {
                    Ok(key) => Some((w, key)),
                    Err(retry_in) => {
                        tracing::debug!(provider = %c.provider, ?retry_in, "no key has room in its rate windows");
                        drop(permit);
                        return Err(Outcome::Limited { retry_in });
                    }
                }
            }
            _ => None,
        };
        // Only an attempt that will really be sent spends the budget: a
        // local refusal above cost nothing.
        if tried.needs_budget() && !self.actors.withdraw_retry(route).await {
            // Dropped unsent: it reports itself cancelled, and gives its
            // window back.
            drop(permit);
            if let Some((w, _)) = &windows {
                w.release().await;
            }
            return Err(Outcome::NoBudget);
        }
        tried.sent();
        permit.mark_sent();
        Ok(Turn {
            entry,
            permit,
            traffic,
            windows,
        })
    }

    /// Sends the attempt's one outcome to its provider actor and frees its
    /// permit; returns what a failed attempt's output cost.
    fn report(
        &self,
        call: &Call<'_>,
        entry: &ProviderEntry,
        permit: Permit,
        result: &AttemptResult,
        sink: &EventSink,
    ) -> f64 {
        let model = &call.candidate.model;
        // What streamed before the attempt failed, or before its caller hung
        // up and it was cancelled (`on_caller_gone = "cancel"`), is billed:
        // not zero, and not the maximum.
        let streamed = sink.attempt_chars().div_ceil(4) as u32;
        let failed_output_tokens = match result.end {
            AttemptEnd::Failed(_) => streamed,
            _ => 0,
        };
        let cut_short_tokens = match result.end {
            AttemptEnd::Failed(_) | AttemptEnd::ClientGone => streamed,
            _ => 0,
        };
        self.series(call.candidate, entry)
            .count_attempt(&self.metrics, result.end.class().as_str());
        for (key, event) in &result.key_events {
            self.metrics
                .key_events
                .get_or_create(&crate::telemetry::metrics::KeyLabels {
                    provider: call.candidate.provider.to_string(),
                    key: key.clone(),
                    event,
                })
                .inc();
        }
        permit.report(provider::Outcome::of(result, failed_output_tokens));
        let billed = price(entry, model).cost(0, cut_short_tokens);
        self.count_cost(&call.plan.route, call.candidate, billed);
        billed
    }

    /// Sends one attempt inside its span and logs how it ended.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        call: &Call<'_>,
        entry: &ProviderEntry,
        chat: &ChatRequest,
        attempt: u32,
        traffic: TrafficClass,
        windows: Option<&(Windows<'_>, Option<String>)>,
        sink: &mut EventSink,
    ) -> AttemptResult {
        begin(call, attempt, sink);
        let span = attempt_span(call.candidate, entry, attempt, traffic);
        let input = attempt_input(call, entry, chat, attempt, windows);
        let result = attempt::run(input, sink).instrument(span.clone()).await;
        close_span(&span, &result, sink.attempt_chars());
        log_attempt(call, attempt, &result);
        result
    }

    /// A completed attempt: usage, cost, the served counters, `Finished`.
    /// Returns what the answer cost.
    async fn finish(
        &self,
        call: &Call<'_>,
        entry: &ProviderEntry,
        chat: &ChatRequest,
        completion: Completion,
        served: Served,
        sink: &mut EventSink,
    ) -> f64 {
        let candidate = call.candidate;
        let (mut usage, usage_estimated) = match completion.usage {
            Some(u) => (u, served.carried > 0),
            None => (estimate_usage(chat, sink.attempt_chars()), true),
        };
        // A continued answer: the failed attempts' output the caller kept
        // (billed when they failed) is part of the answer's usage.
        usage.output_tokens = usage.output_tokens.saturating_add(served.carried);
        self.record_usage(&call.plan.route, candidate, entry, usage);
        let cost_usd =
            price(entry, &candidate.model).usage_cost(&usage, entry.runtime.kind.dialect());
        self.count_cost(&call.plan.route, candidate, cost_usd);
        self.served(&call.plan.route, candidate, candidate.tier());
        let _ = sink
            .finish(Finished {
                finish_reason: completion.finish_reason,
                usage,
                usage_estimated,
                provider: candidate.provider.clone(),
                model: candidate.model.clone(),
                tier: candidate.tier(),
                attempts: served.attempts,
                request_id: call.spec.request_id.clone(),
                upstream_request_id: served.upstream_request_id,
                replayed: false,
                cache_age: None,
                cache_similarity: None,
                cost_usd,
                service_tier: completion.service_tier,
                reasoning: completion.reasoning,
                dropped: sink.attempt_dropped(),
                resumable: false,
                hedged: served.won_attempt.is_some(),
                won_attempt: served.won_attempt.unwrap_or(0),
            })
            .await;
        cost_usd
    }

    /// On a `cache_affinity` route, the request's cacheable prefixes and
    /// where the longest warm one was answered; that target goes first in
    /// the plan (the policy in `policy::affinity`). Boxed: only such a
    /// route has one, and it is held for the whole request.
    pub(super) async fn affinity_place(
        &self,
        spec: &RequestSpec,
        plan: &mut Plan,
    ) -> Option<Box<Affinity>> {
        let ttl = plan.cache_affinity?;
        let prefixes = affinity::prefixes(&spec.chat, &spec.tenant, &plan.route);
        if prefixes.is_empty() {
            return None;
        }
        let warm = self.affinity.recall(&spec.tenant, &prefixes).await;
        if let Some(w) = &warm {
            affinity::place(&mut plan.candidates, |c| {
                !c.downshift && w.is(&c.provider, &c.model)
            });
        }
        Some(Box::new(Affinity {
            prefixes,
            warm,
            ttl,
        }))
    }

    /// An answer on a `cache_affinity` route: counts whether it came from
    /// where its prefix was warm, and remembers it there (with `key`) for
    /// the route's ttl. Done before `Finished` goes out, so the caller's
    /// next turn finds it.
    async fn affinity_remember(&self, call: &Call<'_>, key: Option<String>) {
        let Some(a) = call.affinity else { return };
        let c = call.candidate;
        let verdict = affinity::verdict(a.warm.as_ref(), &c.provider, &c.model);
        self.metrics
            .cache_affinity
            .get_or_create(&crate::telemetry::metrics::AffinityLabels {
                route: call.plan.route.to_string(),
                result: verdict.as_str(),
            })
            .inc();
        let warm = Warm {
            provider: c.provider.to_string(),
            model: c.model.to_string(),
            key,
        };
        self.affinity
            .remember(&call.spec.tenant, &a.prefixes, &warm, a.ttl)
            .await;
    }

    /// A target's p95 time to first token, once enough samples back it.
    pub(super) fn p95_ttft(&self, c: &Candidate) -> Option<Duration> {
        let entry = self.actors.provider(&c.provider)?;
        entry.runtime.with_snapshot(|snapshot| {
            let t = snapshot.models.get(&*c.model)?;
            (t.calls >= MIN_TTFT_SAMPLES)
                .then_some(t.p95_ttft)
                .flatten()
        })
    }

    fn record_attempt(&self, c: &Candidate, entry: &ProviderEntry, result: &AttemptResult) {
        let series = self.series(c, entry);
        series
            .operation_duration
            .observe(result.elapsed.as_secs_f64());
        if let Some(ttft) = result.ttft {
            series.time_to_first_token.observe(ttft.as_secs_f64());
        }
    }

    /// The GenAI token histogram (input counts every prompt token, cached
    /// or not, as the convention asks; output includes reasoning) and the
    /// route's prompt-cache reads and writes.
    fn record_usage(&self, route: &str, c: &Candidate, entry: &ProviderEntry, usage: Usage) {
        let series = self.series(c, entry);
        series.input_tokens.observe(f64::from(usage.total_input()));
        series.output_tokens.observe(f64::from(usage.output_tokens));
        for (kind, n) in [
            ("read", usage.cache_read_input_tokens),
            ("write", usage.cache_write_input_tokens),
        ] {
            if n > 0 {
                self.metrics
                    .prompt_cache_tokens
                    .get_or_create(&crate::telemetry::metrics::PromptCacheLabels {
                        route: route.to_string(),
                        provider: c.provider.to_string(),
                        model: c.model.to_string(),
                        kind,
                    })
                    .inc_by(u64::from(n));
            }
        }
    }

    /// Adds what an attempt cost to `switchyard_cost_usd_total`.
    fn count_cost(&self, route: &str, c: &Candidate, usd: f64) {
        if usd > 0.0 && usd.is_finite() {
            self.metrics
                .cost_usd
                .get_or_create(&crate::telemetry::metrics::RouteTargetLabels {
                    route: route.to_string(),
                    provider: c.provider.to_string(),
                    model: c.model.to_string(),
                })
                .inc_by(usd);
        }
    }

    pub(super) fn series(&self, c: &Candidate, entry: &ProviderEntry) -> Arc<TargetSeries> {
        self.metrics
            .target(entry.runtime.kind.as_str(), &c.provider, &c.model)
    }

    /// Counts an answer served by a live target and tells the router (its
    /// failover rate).
    pub(super) fn served(&self, route: &Arc<str>, c: &Candidate, tier: Tier) {
        self.count_served(route, tier, &c.provider);
        self.actors.served(route, c.position == 0);
    }
}

/// Tells the sink an attempt begins (its `Started`, or a continuation's
/// `Continued`, goes out with the first chunk).
pub(super) fn begin(call: &Call<'_>, attempt: u32, sink: &mut EventSink) {
    let candidate = call.candidate;
    match call.continues {
        Some(c) => sink.begin_continuation(
            c.event(&candidate.provider, &candidate.model, attempt),
            c.prefill.seam(),
        ),
        None => sink.begin_attempt(Started {
            provider: candidate.provider.clone(),
            model: candidate.model.clone(),
            attempt,
            tier: candidate.tier(),
            request_id: call.spec.request_id.clone(),
            dropped: Vec::new(),
            resume_token: None,
        }),
    }
}

/// The attempt's client span (GenAI conventions).
pub(super) fn attempt_span(
    candidate: &Candidate,
    entry: &ProviderEntry,
    attempt: u32,
    traffic: TrafficClass,
) -> tracing::Span {
    tracing::info_span!(
        "attempt",
        otel.name = %format!("chat {}", candidate.model),
        otel.kind = "client",
        provider = %candidate.provider,
        gen_ai.provider.name = entry.runtime.kind.as_str(),
        gen_ai.request.model = %candidate.model,
        attempt,
        traffic = traffic.as_str(),
        outcome = tracing::field::Empty,
        ttft_ms = tracing::field::Empty,
        output_chars = tracing::field::Empty,
    )
}

pub(super) fn close_span(span: &tracing::Span, result: &AttemptResult, output_chars: usize) {
    span.record("outcome", result.end.class().as_str());
    if let Some(ttft) = result.ttft {
        span.record("ttft_ms", ttft.as_millis() as u64);
    }
    span.record("output_chars", output_chars as u64);
}

/// What the attempt is sent with: the key admission held (else the one
/// prompt-cache affinity prefers) and the windows other keys must pass.
pub(super) fn attempt_input<'a>(
    call: &Call<'a>,
    entry: &'a ProviderEntry,
    chat: &'a ChatRequest,
    attempt: u32,
    windows: Option<&'a (Windows<'_>, Option<String>)>,
) -> AttemptInput<'a> {
    let candidate = call.candidate;
    let affinity_key = call
        .affinity
        .and_then(|a| affinity::key_for(a.warm.as_ref(), &candidate.provider, &candidate.model));
    AttemptInput {
        endpoint: &entry.runtime.endpoint,
        chat,
        deadline: call.deadline,
        attempt,
        key: match windows {
            Some((_, Some(key))) => Some(key.as_str()),
            _ => affinity_key,
        },
        admit: windows
            .filter(|(_, key)| key.is_some())
            .map(|(w, _)| w as &dyn crate::attempt::KeyAdmit),
    }
}

/// Logs how an attempt ended: every one at DEBUG (it is on the hot path),
/// failures at INFO.
fn log_attempt(call: &Call<'_>, attempt: u32, result: &AttemptResult) {
    let candidate = call.candidate;
    let class = result.end.class();
    tracing::debug!(
        request_id = %call.spec.request_id,
        route = %call.plan.route,
        provider = %candidate.provider,
        model = %candidate.model,
        attempt,
        outcome = %class,
        ttft_ms = result.ttft.map(|d| d.as_millis() as u64),
        elapsed_ms = result.elapsed.as_millis() as u64,
        "attempt ended"
    );
    if let AttemptEnd::Failed(f) = &result.end {
        tracing::info!(
            request_id = %call.spec.request_id,
            provider = %candidate.provider,
            model = %candidate.model,
            attempt,
            outcome = %class,
            http_status = f.http_status,
            "attempt failed"
        );
    }
}
