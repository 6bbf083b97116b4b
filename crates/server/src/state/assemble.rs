//! Builds the state backends `[state]` names: every store the request path
//! uses, embedded or on one Redis, the job queue `[queue]` names, and the
//! start-up persistence check.

use std::sync::Arc;
use std::time::Duration;

use super::affinity::AffinityMemory;
use super::cost::{CostGuard, CostLedger};
use super::idempotency::{Idempotency, IdempotencyStore};
use super::jobs::{JobStore, Jobs, Limits, RedisJobs};
use super::journal::{self, Journal};
use super::limits::KeyLimits;
use super::redis::lease::Retries;
use super::redis::Redis;
use super::responses::{embedded, Bounds, EmbeddedResponses, ResponseStore};
use super::tenants::{TenantLimiter, TenantLimits};
use super::StateFaults;
use crate::config::{Config, QueueConfig, StateBackend};
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
    /// The resume journal of streamed answers.
    pub journal: Journal,
    /// Every key's rate windows.
    pub limits: Arc<KeyLimits>,
}

/// Lease of a job run in Redis: renewed while the run lives, so a replica
/// killed mid-run loses its job to another replica within this.
pub const REDIS_JOB_LEASE: Duration = Duration::from_secs(10);
/// Lease of a job run in the SQLite file (no other process claims from it).
const EMBEDDED_JOB_LEASE: Duration = Duration::from_secs(600);

/// The stores for `config`; a Redis URL variable that is unset is an error.
/// On Redis the cost ledger's upkeep (heartbeat, owed charges) and the rate
/// windows' (which keys the fleet learned) are spawned.
pub fn build(config: &Config, metrics: &Arc<Metrics>) -> Result<Stores, String> {
    match config.state.backend {
        StateBackend::Embedded => embedded_stores(config),
        StateBackend::Redis => fleet_stores(config, metrics),
    }
}

/// Every store in this process.
fn embedded_stores(config: &Config) -> Result<Stores, String> {
    Ok(Stores {
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
        journal: Journal::embedded(journal::Bounds::of(&config.resume, config.state.lease)),
        limits: Arc::new(KeyLimits::embedded()),
    })
}

/// Every store on the Redis `[state]` names.
fn fleet_stores(config: &Config, metrics: &Arc<Metrics>) -> Result<Stores, String> {
    let st = &config.state;
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
    let limits = Arc::new(KeyLimits::redis(redis.clone(), faults.clone()));
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        rt.spawn(cost.clone().upkeep());
        rt.spawn(limits.clone().upkeep());
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
        affinity: Arc::new(AffinityMemory::redis(redis.clone(), faults.clone())),
        limits,
        journal: Journal::redis(
            redis.clone(),
            faults,
            journal::Bounds::of(&config.resume, st.lease),
        ),
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

/// Opens the job queue `q` names, on `redis` when the fleet backend is on;
/// runs cut short by a previous process go back to it.
pub async fn open_jobs(
    q: &QueueConfig,
    redis: Option<&Redis>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<Jobs>, String> {
    let limits = Limits {
        max_jobs: q.max_jobs,
        max_per_tenant: q.max_jobs_per_tenant,
        ttl: q.job_ttl,
    };
    if let Some(redis) = redis {
        // Shared by the fleet: `queue.path` is unused, and a dead replica's
        // runs come back when their lease lapses (see `Jobs::claim`).
        let store = RedisJobs::new(redis.clone(), limits);
        tracing::info!("job queue on Redis (shared by every replica on it)");
        let faults = StateFaults::new(metrics.clone());
        return Ok(Jobs::redis(store, faults, q.drain.rate, REDIS_JOB_LEASE));
    }
    let path = q.path.clone();
    let accept_empty = q.accept_empty_file;
    let store = tokio::task::spawn_blocking(move || JobStore::open(&path, limits, accept_empty))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{}: {e}", q.path.display()))?;
    let jobs = Jobs::new(store, q.drain.rate, EMBEDDED_JOB_LEASE);
    let requeued = jobs
        .requeue_all_running()
        .await
        .map_err(|e| e.to_string())?;
    let (depth, _) = jobs.depth().await.map_err(|e| e.to_string())?;
    tracing::info!(path = %q.path.display(), waiting = depth, requeued, "job queue open");
    Ok(jobs)
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
