//! The request task: one per call. It asks the router actor for a plan, asks
//! each candidate's provider actor for a permit, runs the attempt, reports its
//! one outcome back, and moves on before the first token or ends the stream
//! after it. Policy decisions come from the actors; this module carries them out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::actors::provider::{OutcomeReport, Permit, ProviderMsg, Refusal, TrafficClass};
use crate::actors::registry::{ProviderEntry, Registry};
use crate::actors::router::{Candidate, PlanError, RouterMsg};
use crate::actors::CALL_TIMEOUT;
use crate::attempt::{self, AttemptEnd, AttemptInput};
use crate::error::RequestError;
use crate::policy::outcome::Failure;
use crate::request::RequestSpec;
use crate::sink::{EventSink, Finished, Started, Tier};
use crate::upstream::{ChatRequest, Usage};

/// Shared by all request tasks.
pub struct Dispatcher {
    pub registry: Arc<Registry>,
    pub default_deadline: Duration,
    /// Cancelled when the drain timeout passes: remaining requests end with
    /// UNAVAILABLE (SERVER_DRAINING) and their upstream calls are dropped.
    pub abort: CancellationToken,
    /// Requests running now.
    pub active: AtomicUsize,
}

impl Dispatcher {
    pub fn new(registry: Arc<Registry>, default_deadline: Duration) -> Self {
        Dispatcher {
            registry,
            default_deadline,
            abort: CancellationToken::new(),
            active: AtomicUsize::new(0),
        }
    }

    /// Runs the request to its end; the outcome reaches the caller through `sink`.
    pub async fn run(self: Arc<Self>, spec: RequestSpec, mut sink: EventSink) {
        self.active.fetch_add(1, Ordering::Relaxed);
        let result = tokio::select! {
            r = self.drive(&spec, &mut sink) => r,
            _ = self.abort.cancelled() => Err(RequestError::Draining),
        };
        if let Err(e) = result {
            sink.fail(e).await;
        }
        self.active.fetch_sub(1, Ordering::Relaxed);
    }

    async fn drive(&self, spec: &RequestSpec, sink: &mut EventSink) -> Result<(), RequestError> {
        let router = self
            .registry
            .router()
            .ok_or_else(|| RequestError::Unavailable("router actor is not running".into()))?;
        let plan = match router
            .call(
                |reply| RouterMsg::Plan {
                    route: spec.route.clone(),
                    needs: spec.needs.clone(),
                    reply,
                },
                Some(CALL_TIMEOUT),
            )
            .await
        {
            Ok(CallResult::Success(Ok(plan))) => plan,
            Ok(CallResult::Success(Err(PlanError::UnknownRoute(r)))) => {
                return Err(RequestError::UnknownRoute(r))
            }
            Ok(CallResult::Success(Err(PlanError::NoCapableTarget { route, missing }))) => {
                return Err(RequestError::NoCapableTarget { route, missing })
            }
            _ => {
                return Err(RequestError::Unavailable(
                    "router actor did not answer".into(),
                ))
            }
        };
        let deadline = spec
            .deadline
            .unwrap_or_else(|| Instant::now() + plan.deadline.unwrap_or(self.default_deadline));
        let mut chat = spec.chat.clone();
        if chat.max_tokens.is_none() {
            chat.max_tokens = plan.default_max_tokens;
        }

        let mut attempts = 0u32;
        let mut last: Option<(Failure, String)> = None;
        for candidate in &plan.candidates {
            if Instant::now() >= deadline {
                return Err(RequestError::DeadlineExceeded { attempts });
            }
            let traffic = if candidate.primary {
                TrafficClass::Own
            } else {
                TrafficClass::Failover
            };
            let (entry, permit) = match self.admit(candidate, traffic).await {
                Admission::Granted(entry, permit) => (entry, permit),
                Admission::Refused(refusal) => {
                    tracing::debug!(provider = %candidate.provider, %refusal, "target refused admission");
                    continue;
                }
                Admission::Unreachable => {
                    tracing::warn!(provider = %candidate.provider, "provider actor unreachable; skipping it");
                    continue;
                }
            };

            attempts += 1;
            chat.model = candidate.model.clone();
            chat.stream = candidate.streams;
            let tier = if candidate.position == 0 {
                Tier::Primary
            } else {
                Tier::Fallback
            };
            sink.begin_attempt(Started {
                provider: candidate.provider.clone(),
                model: candidate.model.clone(),
                attempt: attempts,
                tier,
                request_id: spec.request_id.clone(),
            });
            let result = attempt::run(
                AttemptInput {
                    runtime: &entry.runtime,
                    chat: &chat,
                    deadline,
                    attempt: attempts,
                },
                sink,
            )
            .await;
            drop(permit);
            let class = result.end.class();
            let _ = entry.actor.cast(ProviderMsg::Report(OutcomeReport {
                model: candidate.model.clone(),
                class,
                traffic,
                elapsed: result.elapsed,
                ttft: result.ttft,
            }));
            tracing::info!(
                request_id = %spec.request_id,
                provider = %candidate.provider,
                model = %candidate.model,
                attempt = attempts,
                outcome = %class,
                ttft_ms = result.ttft.map(|d| d.as_millis() as u64),
                elapsed_ms = result.elapsed.as_millis() as u64,
                "attempt ended"
            );

            match result.end {
                AttemptEnd::Completed(completion) => {
                    let (usage, usage_estimated) = match completion.usage {
                        Some(u) => (u, false),
                        None => (estimate_usage(&chat, sink.attempt_chars()), true),
                    };
                    let _ = sink
                        .finish(Finished {
                            finish_reason: completion.finish_reason,
                            usage,
                            usage_estimated,
                            provider: candidate.provider.clone(),
                            model: candidate.model.clone(),
                            tier,
                            attempts,
                            request_id: spec.request_id.clone(),
                            upstream_request_id: result.upstream_request_id,
                        })
                        .await;
                    return Ok(());
                }
                AttemptEnd::ClientGone => return Ok(()),
                AttemptEnd::DeadlineExceeded => {
                    return Err(RequestError::DeadlineExceeded { attempts })
                }
                AttemptEnd::Failed(failure) => {
                    if sink.committed() {
                        return Err(RequestError::MidStream {
                            tokens_emitted: sink.attempt_chunks(),
                            failure,
                            provider: candidate.provider.clone(),
                            attempts,
                        });
                    }
                    if !failure.class.fail_over() {
                        return Err(RequestError::Exhausted {
                            failure,
                            provider: candidate.provider.clone(),
                            attempts,
                        });
                    }
                    if sink.attempt_had_output() {
                        // Buffered caller: discard the partial answer.
                        let _ = sink
                            .reset(
                                format!("{} from {}", failure.class, candidate.provider),
                                attempts,
                            )
                            .await;
                    }
                    last = Some((failure, candidate.provider.clone()));
                }
            }
        }
        match last {
            Some((failure, provider)) => Err(RequestError::Exhausted {
                failure,
                provider,
                attempts,
            }),
            None => Err(RequestError::Saturated { route: plan.route }),
        }
    }
}

/// The answer to an admission request.
enum Admission {
    Granted(ProviderEntry, Permit),
    Refused(Refusal),
    /// The actor is gone and no new incarnation appeared in time.
    Unreachable,
}

/// How long a request waits for a restarting provider actor to reappear.
const RESTART_GRACE: Duration = Duration::from_millis(500);

impl Dispatcher {
    /// Asks the candidate's provider actor for a permit. If the actor is
    /// being restarted, waits briefly for its next incarnation.
    async fn admit(&self, candidate: &Candidate, traffic: TrafficClass) -> Admission {
        let give_up = Instant::now() + RESTART_GRACE;
        loop {
            let Some(entry) = self.registry.provider(&candidate.provider) else {
                return Admission::Unreachable;
            };
            let answer = entry
                .actor
                .call(
                    |reply| ProviderMsg::Admit {
                        model: candidate.model.clone(),
                        class: traffic,
                        reply,
                    },
                    Some(CALL_TIMEOUT),
                )
                .await;
            match answer {
                Ok(CallResult::Success(Ok(permit))) => return Admission::Granted(entry, permit),
                Ok(CallResult::Success(Err(refusal))) => return Admission::Refused(refusal),
                _ if Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                _ => return Admission::Unreachable,
            }
        }
    }
}

/// Rough usage when the upstream sent none: about four characters a token.
fn estimate_usage(chat: &ChatRequest, output_chars: usize) -> Usage {
    let prompt_chars: usize = chat
        .messages
        .iter()
        .map(|m| m.content.len() + m.role.len())
        .sum();
    Usage {
        input_tokens: (prompt_chars / 4).max(1) as u32,
        output_tokens: output_chars.div_ceil(4) as u32,
    }
}
