//! Builds the state backends `[state]` names: every store the request path
//! uses, embedded or on one Redis, and the start-up persistence check.

use std::sync::Arc;
use std::time::Duration;

use super::affinity::AffinityMemory;
use super::cost::{CostGuard, CostLedger};
use super::idempotency::{Idempotency, IdempotencyStore};
use super::redis::{Redis, RedisJobs};
use super::responses::{embedded, Bounds, EmbeddedResponses, ResponseStore};
use super::shared::{Retries, StateFaults};
use super::tenants::{TenantLimiter, TenantLimits};
use crate::config::{Config, StateBackend};
use crate::queue::Limits;
use crate::telemetry::metrics::Metrics;

/// The stores, ready for the dispatcher and the intake.
pub struct Stores {
    pub idempotency: Arc<Idempotency>,
    pub cost: Arc<CostLedger>,
    pub tenants: TenantLimits,
    /// Stored Responses API responses.
    pub responses: Arc<ResponseStore>,
    /// The Redis client, when the fleet backend is on.
    pub redis: Option<Redis>,
    /// Prompt-cache affinity's memory.
    pub affinity: Arc<AffinityMemory>,
}

/// Lease of a job run in Redis: renewed while the run lives, so a replica
/// killed mid-run loses its job to another replica within this.
pub const REDIS_JOB_LEASE: Duration = Duration::from_secs(10);

/// The stores for `config`; a Redis URL variable that is unset is an error.
/// On Redis the cost ledger's upkeep (heartbeat, owed charges) is spawned.
pub fn build(config: &Config, metrics: &Arc<Metrics>) -> Result<Stores, String> {
    let st = &config.state;
    if st.backend == StateBackend::Embedded {
        return Ok(Stores {
            idempotency: Arc::new(Idempotency::Embedded(IdempotencyStore::new(
                config.idempotency.ttl,
                config.idempotency.max_entries,
                config.idempotency.max_bytes,
            ))),
            cost: Arc::new(CostLedger::Embedded(CostGuard::new(config.cost.clone()))),
            tenants: TenantLimits::Embedded(TenantLimiter::new(&config.limits)),
            responses: Arc::new(embedded_responses(config)?),
            redis: None,
            affinity: Arc::default(),
        });
    }
    let url = std::env::var(&st.redis_url_env).map_err(|_| {
        format!(
            "state.redis_url_env: environment variable `{}` is not set (it holds the redis:// URL)",
            st.redis_url_env
        )
    })?;
    let redis = Redis::new(&url, &st.key_prefix, st.timeout)
        .map_err(|e| format!("state.redis_url_env: {e}"))?;
    let faults = StateFaults::new(metrics.clone());
    let retries = Retries::new(faults.clone());
    let cost = Arc::new(CostLedger::redis(
        config.cost.clone(),
        redis.clone(),
        faults.clone(),
    ));
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(cost.clone().upkeep());
    }
    Ok(Stores {
        idempotency: Arc::new(Idempotency::redis(
            redis.clone(),
            faults.clone(),
            retries.clone(),
            config.idempotency.ttl,
            st.lease,
        )),
        cost,
        responses: Arc::new(ResponseStore::redis(
            redis.clone(),
            faults.clone(),
            &config.responses,
        )),
        tenants: TenantLimits::redis(
            redis.clone(),
            faults.clone(),
            retries,
            &config.limits,
            st.lease,
        ),
        affinity: Arc::new(AffinityMemory::redis(redis.clone(), faults)),
        redis: Some(redis),
    })
}

/// The embedded response store: a file beside the queue's (a background
/// response lives as long as its job), else in memory.
fn embedded_responses(config: &Config) -> Result<ResponseStore, String> {
    let path = config
        .queue
        .as_ref()
        .map(|q| embedded::path_beside(&q.path));
    let store =
        EmbeddedResponses::open(path.as_deref(), Bounds::of(&config.responses)).map_err(|e| {
            match &path {
                Some(p) => format!("responses store {}: {e}", p.display()),
                None => format!("responses store: {e}"),
            }
        })?;
    Ok(ResponseStore::Embedded(Arc::new(store)))
}

/// The job store on Redis.
pub fn redis_jobs(redis: &Redis, limits: Limits) -> RedisJobs {
    RedisJobs::new(redis.clone(), limits)
}

/// Logs how durable Redis keeps what it acknowledged: a WARN naming the risk
/// when it is weaker than the queue's promise, or that it could not check.
pub async fn check_persistence(redis: &Redis) {
    match redis.persistence().await {
        Ok(p) if !p.appendonly => tracing::warn!(
            "Redis runs without appendonly: accepted jobs, idempotency records and spend are lost when it restarts; set `appendonly yes` and `appendfsync always` (or everysec)"
        ),
        Ok(p) if p.appendfsync == "no" => tracing::warn!(
            "Redis appendfsync is `no`: the OS decides when jobs reach disk, and a host crash can lose accepted jobs; set `appendfsync always` (or everysec)"
        ),
        Ok(p) if p.appendfsync == "everysec" => tracing::warn!(
            "Redis appendfsync is `everysec`: a host crash can lose up to one second of accepted jobs; `appendfsync always` closes that window"
        ),
        Ok(p) => tracing::info!(appendfsync = %p.appendfsync, "Redis persistence: appendonly yes"),
        Err(e) => tracing::warn!(error = %e, "could not check Redis persistence (CONFIG GET appendonly): make sure AOF is on"),
    }
}
