//! The operator surfaces: the gRPC `switchyard.v1.Admin` service (behind the
//! admin token) and the status view it shares with `GET /v1/status`: per
//! target breaker state, health score, p95 TTFT, load, cooldown and failover
//! share; per route failover rate and retry budget. Reads snapshots; the
//! only writes are breaker overrides (through the provider actor) and reloads.

use std::sync::Arc;
use std::time::Duration;

use ractor::rpc::CallResult;
use serde::Serialize;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::auth::Authenticator;
use super::errors::{admin_status, AdminError};
use crate::actors::provider::{BreakerOverride, ProviderMsg};
use crate::actors::registry::Registry;
use crate::actors::router::{RouteStatus, RouterMsg};
use crate::actors::CALL_TIMEOUT;
use crate::policy::breaker::{BreakerState, Forced};
use crate::proto;
use crate::reload::Reloader;
use crate::state::limits::KeyLimits;
use crate::state::validation::record::RouteValidation;
use crate::state::validation::store::ValidationStore;

/// One target as operators see it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TargetView {
    pub provider: String,
    pub model: String,
    pub kind: &'static str,
    pub breaker_state: &'static str,
    pub breaker_retry_in_ms: u64,
    pub health_score: f64,
    pub success_rate: Option<f64>,
    pub calls: u64,
    pub p95_ttft_ms: Option<u64>,
    pub in_flight: usize,
    pub failover_in_flight: usize,
    pub cooldown_remaining_ms: u64,
    pub cooldown_reason: Option<&'static str>,
    pub failover_share: f64,
    /// A provider with several keys: each key's state, by name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<crate::upstream::keys::KeyView>,
    /// Each bounded key's rate windows as last seen, by name (`default`
    /// for a provider's single key).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<WindowView>,
}

/// What one key has left in its stricter window of each kind.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WindowView {
    pub key: String,
    pub requests_remaining: Option<u64>,
    pub tokens_remaining: Option<u64>,
    /// When the earliest window that bounds them resets, from when it was seen.
    pub reset_in_ms: Option<u64>,
}

/// `provider`'s keys that have windows, as the store last saw them.
fn windows(
    limits: &KeyLimits,
    provider: &str,
    endpoint: &crate::upstream::endpoint::Endpoint,
) -> Vec<WindowView> {
    let names: Vec<&str> = match &endpoint.keys {
        Some(pool) => pool.keys.iter().map(|k| k.name.as_str()).collect(),
        None => vec![crate::upstream::endpoint::SINGLE_KEY],
    };
    names
        .into_iter()
        .filter_map(|key| {
            let room = limits.room(&format!("{provider}/{key}"))?;
            Some(WindowView {
                key: key.to_string(),
                requests_remaining: room.requests,
                tokens_remaining: room.tokens,
                reset_in_ms: room.reset_in_ms,
            })
        })
        .collect()
}

/// Everything `ListProviders` and `/v1/status` show.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StatusView {
    pub targets: Vec<TargetView>,
    pub routes: Vec<RouteStatus>,
}

/// Collects the current status from the published snapshots and the router.
pub async fn collect(registry: &Registry, limits: &KeyLimits) -> StatusView {
    let now = Instant::now();
    let mut targets = Vec::new();
    for p in registry.providers() {
        let snapshot = p.runtime.snapshot();
        for model in &p.runtime.models {
            let Some(t) = snapshot.models.get(model.name.as_str()) else {
                continue;
            };
            let since = now.saturating_duration_since(snapshot.at);
            let retry_in = match t.breaker {
                BreakerState::Open { retry_in }
                | BreakerState::ForcedOpen {
                    retry_in: Some(retry_in),
                } => retry_in.saturating_sub(since),
                _ => Duration::ZERO,
            };
            targets.push(TargetView {
                provider: p.runtime.id.clone(),
                model: model.name.clone(),
                kind: p.runtime.kind.as_str(),
                breaker_state: t.breaker.phase().as_str(),
                breaker_retry_in_ms: retry_in.as_millis() as u64,
                health_score: t.score,
                success_rate: t.success_rate,
                calls: t.calls,
                p95_ttft_ms: t.p95_ttft.map(|d| d.as_millis() as u64),
                in_flight: p.runtime.in_flight(),
                failover_in_flight: p.runtime.failover_in_flight(),
                cooldown_remaining_ms: t
                    .cooldown_until
                    .map_or(0, |u| u.saturating_duration_since(now).as_millis() as u64),
                cooldown_reason: t.cooldown_until.filter(|u| *u > now).and(t.cooldown_reason),
                failover_share: t.failover_share,
                keys: p
                    .runtime
                    .endpoint
                    .keys
                    .as_ref()
                    .map(|k| k.view(now))
                    .unwrap_or_default(),
                windows: windows(limits, &p.runtime.id, &p.runtime.endpoint),
            });
        }
    }
    targets.sort_by(|a, b| (&a.provider, &a.model).cmp(&(&b.provider, &b.model)));
    let routes = match registry.router() {
        Some(r) => match r.call(RouterMsg::Status, Some(CALL_TIMEOUT)).await {
            Ok(CallResult::Success(routes)) => routes,
            _ => Vec::new(),
        },
        None => Vec::new(),
    };
    StatusView { targets, routes }
}

fn target_proto(t: &TargetView) -> proto::TargetStatus {
    proto::TargetStatus {
        provider: t.provider.clone(),
        model: t.model.clone(),
        breaker_state: t.breaker_state.to_string(),
        breaker_retry_in_ms: t.breaker_retry_in_ms,
        health_score: t.health_score,
        success_rate: t.success_rate.unwrap_or(1.0),
        calls: t.calls,
        p95_ttft_ms: t.p95_ttft_ms.unwrap_or(0),
        in_flight: t.in_flight as u32,
        failover_in_flight: t.failover_in_flight as u32,
        cooldown_remaining_ms: t.cooldown_remaining_ms,
        cooldown_reason: t.cooldown_reason.unwrap_or_default().to_string(),
        failover_share: t.failover_share,
        kind: t.kind.to_string(),
        key_windows: t
            .windows
            .iter()
            .map(|w| proto::KeyWindow {
                key: w.key.clone(),
                requests_remaining: w.requests_remaining.map_or(-1, |n| n as i64),
                tokens_remaining: w.tokens_remaining.map_or(-1, |n| n as i64),
                reset_in_ms: w.reset_in_ms.unwrap_or(0),
            })
            .collect(),
    }
}

/// The gRPC Admin service.
#[derive(Clone)]
pub struct AdminService {
    registry: Arc<Registry>,
    reloader: Arc<Reloader>,
    validations: Arc<ValidationStore>,
    limits: Arc<KeyLimits>,
}

impl AdminService {
    pub fn new(
        registry: Arc<Registry>,
        reloader: Arc<Reloader>,
        validations: Arc<ValidationStore>,
        limits: Arc<KeyLimits>,
    ) -> Self {
        AdminService {
            registry,
            reloader,
            validations,
            limits,
        }
    }
}

/// One route's validations as `ListProviders` shows them.
fn validations_proto(r: &RouteStatus) -> Vec<proto::TargetValidation> {
    let Some(v) = &r.validation else {
        return Vec::new();
    };
    v.targets
        .iter()
        .map(|t| proto::TargetValidation {
            target: t.target.clone(),
            validated: t.validated,
            validated_unix_ms: v.validated_unix_ms,
            set_sha256: v.set_sha256.clone(),
            answer_similarity: t.answer_similarity,
            failures: t.failures.clone(),
        })
        .collect()
}

/// Who may call the Admin service.
#[derive(Clone)]
pub enum AdminAccess {
    /// Holders of the admin token.
    Token(Authenticator),
    /// Everyone (no admin token, and caller auth is open: local use).
    Open,
    /// No one (no admin token while callers must authenticate).
    Disabled,
}

impl AdminAccess {
    /// The interceptor body.
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        match self {
            AdminAccess::Token(auth) => auth.check(request),
            AdminAccess::Open => Ok(request),
            AdminAccess::Disabled => Err(admin_status(&AdminError::Disabled)),
        }
    }
}

#[tonic::async_trait]
impl proto::admin_server::Admin for AdminService {
    async fn list_providers(
        &self,
        _request: Request<proto::ListProvidersRequest>,
    ) -> Result<Response<proto::ListProvidersResponse>, Status> {
        let view = collect(&self.registry, &self.limits).await;
        Ok(Response::new(proto::ListProvidersResponse {
            targets: view.targets.iter().map(target_proto).collect(),
            routes: view
                .routes
                .iter()
                .map(|r| proto::RouteStatus {
                    name: r.name.clone(),
                    targets: r.targets.clone(),
                    failover_rate: r.failover_rate,
                    retry_budget_remaining: r.retry_budget_remaining,
                    validations: validations_proto(r),
                    require_validated: r.require_validated,
                })
                .collect(),
        }))
    }

    async fn set_breaker(
        &self,
        request: Request<proto::SetBreakerRequest>,
    ) -> Result<Response<proto::SetBreakerResponse>, Status> {
        let r = request.into_inner();
        let until = (r.duration_ms > 0).then(|| {
            crate::policy::clock::after(Instant::now(), Duration::from_millis(r.duration_ms))
        });
        let change = match proto::BreakerAction::try_from(r.action) {
            Ok(proto::BreakerAction::ForceOpen) => BreakerOverride::Force(Forced::Open { until }),
            Ok(proto::BreakerAction::ForceClosed) => {
                BreakerOverride::Force(Forced::Closed { until })
            }
            Ok(proto::BreakerAction::Clear) => BreakerOverride::Clear,
            _ => {
                return Err(admin_status(&AdminError::InvalidArgument {
                    field: "action",
                    message: "one of FORCE_OPEN, FORCE_CLOSED, CLEAR".into(),
                }))
            }
        };
        if matches!(change, BreakerOverride::Force(_)) && r.reason.trim().is_empty() {
            return Err(admin_status(&AdminError::InvalidArgument {
                field: "reason",
                message: "required when forcing a breaker".into(),
            }));
        }
        let entry = self
            .registry
            .provider(&r.provider)
            .ok_or_else(|| admin_status(&AdminError::UnknownProvider(r.provider.clone())))?;
        let answer = entry
            .actor
            .call(
                |reply| ProviderMsg::SetBreaker {
                    model: r.model.clone(),
                    change,
                    reason: r.reason.clone(),
                    reply,
                },
                Some(CALL_TIMEOUT),
            )
            .await;
        match answer {
            Ok(CallResult::Success(Ok(()))) => {}
            Ok(CallResult::Success(Err(e))) => {
                return Err(admin_status(&AdminError::UnknownModel(e.to_string())))
            }
            _ => {
                return Err(admin_status(&AdminError::ProviderUnavailable(
                    r.provider.clone(),
                )))
            }
        }
        let view = collect(&self.registry, &self.limits).await;
        let target = view
            .targets
            .iter()
            .find(|t| t.provider == r.provider && t.model == r.model)
            .map(target_proto);
        Ok(Response::new(proto::SetBreakerResponse { target }))
    }

    async fn record_validation(
        &self,
        request: Request<proto::RecordValidationRequest>,
    ) -> Result<Response<proto::RecordValidationResponse>, Status> {
        let record = RouteValidation::parse(&request.into_inner().record_json).map_err(|e| {
            admin_status(&AdminError::InvalidArgument {
                field: "record_json",
                message: e
                    .strip_prefix("record_json: ")
                    .map(str::to_string)
                    .unwrap_or(e),
            })
        })?;
        let known = self
            .reloader
            .config()
            .iter()
            .flat_map(|c| c.routes.iter())
            .any(|r| r.name == record.route);
        if !known {
            return Err(admin_status(&AdminError::UnknownRoute(record.route)));
        }
        let persisted = self
            .validations
            .record(record)
            .await
            .map_err(|e| admin_status(&AdminError::RecordFile(e.to_string())))?;
        Ok(Response::new(proto::RecordValidationResponse { persisted }))
    }

    async fn reload_config(
        &self,
        request: Request<proto::ReloadConfigRequest>,
    ) -> Result<Response<proto::ReloadConfigResponse>, Status> {
        let force = request.into_inner().force;
        Ok(Response::new(match self.reloader.reload(force).await {
            Ok(report) => proto::ReloadConfigResponse {
                applied: true,
                message: report.summary(),
                providers_added: report.added,
                providers_removed: report.removed,
                providers_changed: report.changed,
            },
            Err(message) => proto::ReloadConfigResponse {
                applied: false,
                message,
                ..Default::default()
            },
        }))
    }
}
