//! Rate-window admission of one attempt: which key of the target has room
//! for the request (its estimated input plus `max_tokens`, one request),
//! held before anything is sent; the other keys the attempt may move to
//! after a key-local refusal, admitted the same way; and afterwards the
//! holds settled to the real usage and what the upstream's rate-limit
//! headers reported learned (fleet-wide on Redis). A key known to be
//! exhausted is never sent to. The rules are `policy::rate_window`'s.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::bill::prompt_bytes;
use super::Tasks;
use crate::actors::provider::ProviderRuntime;
use crate::attempt::{AttemptEnd, AttemptResult, KeyAdmit};
use crate::chat::ChatRequest;
use crate::config::TrafficPriority;
use crate::policy::rate_window::{Limits, Priority};
use crate::request::RequestSpec;
use crate::state::limits::{KeyLimits, Reservation};
use crate::telemetry::metrics::{Metrics, WindowLabels};

/// Output tokens held for a request that sets no `max_tokens`.
const UNBOUNDED_OUTPUT: u64 = 4096;

/// One attempt's holds on its target's keys.
pub(super) struct Windows<'a> {
    limits: &'a KeyLimits,
    metrics: &'a Metrics,
    runtime: Arc<ProviderRuntime>,
    tokens: u64,
    priority: Priority,
    held: Mutex<Vec<(String, Reservation)>>,
}

/// The window id of a provider's key.
fn id(provider: &str, key: &str) -> String {
    format!("{provider}/{key}")
}

/// Bytes of JSON framing counted per message, tool call and tool.
const FRAMING: usize = 32;

/// What the request holds in a token window: its estimated input (a
/// conservative three bytes a token, with the wire's JSON framing: never
/// below what the upstream counts) and the most output it may ask for.
pub(super) fn window_tokens(chat: &ChatRequest) -> u64 {
    let parts = chat.messages.len()
        + chat.tools.len()
        + chat
            .messages
            .iter()
            .map(|m| m.tool_calls.len())
            .sum::<usize>();
    ((prompt_bytes(chat) + FRAMING * parts).div_ceil(3) + 1) as u64
        + chat.max_tokens.map_or(UNBOUNDED_OUTPUT, u64::from)
}

impl<'a> Windows<'a> {
    pub(super) fn new(
        (limits, metrics): (&'a KeyLimits, &'a Metrics),
        runtime: Arc<ProviderRuntime>,
        spec: &RequestSpec,
        chat: &ChatRequest,
        priority: TrafficPriority,
        batch_share: f64,
    ) -> Self {
        let priority = if spec.from_queue || priority == TrafficPriority::Batch {
            Priority::Batch { share: batch_share }
        } else {
            Priority::Interactive
        };
        Windows {
            limits,
            metrics,
            runtime,
            tokens: window_tokens(chat),
            priority,
            held: Mutex::default(),
        }
    }

    fn provider(&self) -> &str {
        &self.runtime.id
    }

    /// The first key with room, in the order the target tries its keys
    /// (`prefer` first): `Ok(None)` when no key is bounded (nothing to
    /// hold), `Ok(Some(key))` with it held, else the soonest reset.
    pub(super) async fn first(&self, prefer: Option<&str>) -> Result<Option<String>, Duration> {
        let endpoint = &self.runtime.endpoint;
        let keys = endpoint.rate_keys(Instant::now(), prefer);
        if !keys
            .iter()
            .any(|(k, l)| self.limits.bounded(&id(self.provider(), k), *l))
        {
            return Ok(None);
        }
        let mut soonest: Option<Duration> = None;
        for (key, limits) in keys {
            match self.hold(key, limits).await {
                Ok(()) => return Ok(Some(key.to_string())),
                Err(wait) => soonest = Some(soonest.map_or(wait, |s| s.min(wait))),
            }
        }
        // Every key cooling or disabled: the attempt says why.
        soonest.map_or(Ok(None), Err)
    }

    async fn hold(&self, key: &str, limits: Limits) -> Result<(), Duration> {
        let id = id(self.provider(), key);
        if !self.limits.bounded(&id, limits) {
            return Ok(());
        }
        let result = self
            .limits
            .reserve(&id, limits, self.tokens, self.priority)
            .await;
        self.gauge(key);
        let r = result?;
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((key.to_string(), r));
        Ok(())
    }

    /// Updates `switchyard_key_window_remaining` for `key`.
    fn gauge(&self, key: &str) {
        let configured = self.runtime.endpoint.key_limits(key);
        gauge(self.limits, self.metrics, self.provider(), key, configured);
    }

    /// After the attempt: every reported window is learned, then the
    /// answering key's hold settles to the real usage and a key the
    /// upstream refused gives its hold back (a refused request is not
    /// counted). In that order: a hold given back before its key's report
    /// is known would let another request into a window the upstream
    /// already counted full.
    pub(super) async fn settle(&self, result: &AttemptResult) {
        let used = match &result.end {
            AttemptEnd::Completed(c) => c
                .usage
                .map(|u| u64::from(u.total_input()) + u64::from(u.output_tokens)),
            _ => None,
        };
        let held = self.take_held();
        learn(self.limits, self.metrics, &self.runtime, result, &held).await;
        for (key, r) in &held {
            let refused = result.key_events.iter().any(|(k, _)| k == key);
            // A provider's single key has no name in the result.
            let answered = result.key.as_deref().is_none_or(|k| k == key);
            let other_answered = result.key.as_deref().is_some_and(|k| k != key);
            let tokens = match (refused || other_answered, answered, used) {
                (true, _, _) => Some(0),
                (false, true, Some(used)) => Some(used),
                // Failed or cut: what the upstream counted is unknown; the
                // configured window keeps the hold.
                _ => None,
            };
            self.limits.settle(r, tokens).await;
        }
    }
}

/// Learns what the attempt's answers reported about their keys' windows
/// (also for a provider no admission asked about yet: that is how its
/// keys become bounded); `held` are the attempt's holds, each answered by
/// its key's report.
pub(super) async fn learn(
    limits: &KeyLimits,
    metrics: &Metrics,
    runtime: &ProviderRuntime,
    result: &AttemptResult,
    held: &[(String, Reservation)],
) {
    for (key, reported, at) in &result.reported {
        let configured = runtime.endpoint.key_limits(key);
        // A stream's answer is learned when it ends: its resets count
        // from when its headers came, not from now.
        let reported = reported.aged(at.elapsed());
        let answering = held.iter().find(|(k, _)| k == key).map(|(_, r)| r);
        limits
            .learn(
                &runtime.id,
                &id(&runtime.id, key),
                configured,
                reported,
                answering,
            )
            .await;
        gauge(limits, metrics, &runtime.id, key, configured);
    }
}

/// Updates `switchyard_key_window_remaining` and `_limit` for `provider`'s `key`.
fn gauge(limits: &KeyLimits, metrics: &Metrics, provider: &str, key: &str, configured: Limits) {
    let id = id(provider, key);
    let Some(room) = limits.room(&id) else {
        return;
    };
    let (requests, tokens) = limits.sizes(&id, configured);
    let set = |family: &prometheus_client::metrics::family::Family<
        WindowLabels,
        prometheus_client::metrics::gauge::Gauge,
    >,
               kind: &'static str,
               value: Option<u64>| {
        if let Some(v) = value {
            family
                .get_or_create(&WindowLabels {
                    provider: provider.to_string(),
                    key: key.to_string(),
                    kind,
                })
                .set(i64::try_from(v).unwrap_or(i64::MAX));
        }
    };
    set(&metrics.key_window_remaining, "requests", room.requests);
    set(&metrics.key_window_remaining, "tokens", room.tokens);
    set(&metrics.key_window_limit, "requests", requests);
    set(&metrics.key_window_limit, "tokens", tokens);
}

impl Windows<'_> {
    /// The attempt was not sent: every hold goes back.
    pub(super) async fn release(&self) {
        for (_, r) in &self.take_held() {
            self.limits.settle(r, Some(0)).await;
        }
    }

    fn take_held(&self) -> Vec<(String, Reservation)> {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl KeyAdmit for Windows<'_> {
    fn admit<'b>(&'b self, name: &'b str) -> BoxFuture<'b, Result<(), Duration>> {
        Box::pin(async move {
            let limits = self.runtime.endpoint.key_limits(name);
            self.hold(name, limits).await
        })
    }
}

impl Tasks {
    /// Waits out a full window for the route's `admission_wait` (within
    /// the deadline): true when it is worth walking the targets again.
    pub(super) async fn wait_for_window(
        &self,
        route: &str,
        retry_in: Duration,
        waited: &mut Duration,
        allowed: Duration,
        deadline: Instant,
        sink: &crate::sink::EventSink,
    ) -> bool {
        let left = allowed
            .saturating_sub(*waited)
            .min(deadline.saturating_duration_since(Instant::now()));
        if left.is_zero() {
            if !allowed.is_zero() {
                self.count_admission_wait(route, "rate_limited");
            }
            return false;
        }
        let nap = retry_in.min(left).max(Duration::from_millis(1));
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            _ = sink.closed() => return false,
        }
        *waited += nap;
        true
    }

    pub(super) fn count_admission_wait(&self, route: &str, outcome: &'static str) {
        self.metrics
            .admission_waits
            .get_or_create(&crate::telemetry::metrics::RouteOutcomeLabels {
                route: route.to_string(),
                outcome,
            })
            .inc();
    }
}
