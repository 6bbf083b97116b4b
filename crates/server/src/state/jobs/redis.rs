//! The fleet job queue on Redis, with the semantics of the SQLite
//! `state::jobs::JobStore`: bounded submit with idempotency-key dedup, claim with a
//! lease and a fencing claim token, finish at most once, expiry, recovery of
//! lapsed leases. Every key shares the `{jobs}` hash tag and every change is
//! one script; a Redis failure is `QueueError::Unavailable`, never a guess.
//!
//! Tenants take turns: a job's score in `queued` is its start tag (one after
//! its tenant's last waiting job, never below the tag that ran last), so the
//! lowest score is the next turn and one tenant's big batch interleaves with
//! every other tenant's jobs instead of running first.
//!
//! Keys under `{prefix}{jobs}:`: `job:<id>` (hash; `seq` holds its tag),
//! `queued` (zset by start tag), `expiry` (zset of queued ids by expiry ms),
//! `running` (zset by lease deadline), `tenants` (hash tenant -> jobs
//! waiting or running), `tenants:turns` (hash tenant -> its last tag, gone
//! with its last job), `clock` (the tag that ran last),
//! `idem:<len>:<tenant>:<key>` (job id). Files: see `state/files/redis.rs`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use redis::{Script, Value};
use tokio::sync::broadcast;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{JobRecord, JobState, Limits, QueueError};
use crate::policy::token_bucket::TokenBucketConfig;
use crate::state::redis::{ms, num, reply, Redis, LUA_BUCKET, LUA_NOW};
use crate::state::StateError;

/// Lua shared by the job scripts.
const LUA_JOBS: &str = r"
local function dec_tenant(tenants, tenant)
  if not tenant then return end
  local n = redis.call('HINCRBY', tenants, tenant, -1)
  if n <= 0 then
    redis.call('HDEL', tenants, tenant)
    redis.call('HDEL', tenants .. ':turns', tenant)
  end
end
local function expire_record(jk, ttl)
  redis.call('PEXPIRE', jk, ttl)
  local ik = redis.call('HGET', jk, 'idem')
  if ik then redis.call('PEXPIRE', ik, ttl) end
end
local function requeue(jk, id, queued, expiry)
  local f = redis.call('HMGET', jk, 'seq', 'expires_ms')
  redis.call('ZADD', queued, f[1], id)
  redis.call('ZADD', expiry, f[2], id)
end
";

/// KEYS: queued, running, tenants, clock, expiry, job, idem, turns.
/// ARGV: id, tenant, route, fingerprint, request, max jobs, max per tenant,
/// ttl ms, has idem, job key base, channel.
static SUBMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{}",
        r"
if ARGV[9] == '1' then
  local existing = redis.call('GET', KEYS[7])
  if existing then
    local ek = ARGV[10] .. existing
    local fp = redis.call('HGET', ek, 'fp')
    if fp then
      if fp ~= ARGV[4] then return {'reused'} end
      return {'job', redis.call('HGETALL', ek)}
    end
  end
end
local total = redis.call('ZCARD', KEYS[1]) + redis.call('ZCARD', KEYS[2])
if total >= tonumber(ARGV[6]) then return {'full', total} end
local tc = tonumber(redis.call('HGET', KEYS[3], ARGV[2])) or 0
if tc >= tonumber(ARGV[7]) then return {'tenant_full', tc} end
local now = now_ms()
local seq = tonumber(redis.call('GET', KEYS[4])) or 0
local last = tonumber(redis.call('HGET', KEYS[8], ARGV[2]))
if last and last + 1 > seq then seq = last + 1 end
redis.call('HSET', KEYS[8], ARGV[2], seq)
redis.call('HSET', KEYS[6], 'id', ARGV[1], 'tenant', ARGV[2], 'route', ARGV[3], 'fp', ARGV[4],
  'request', ARGV[5], 'state', 'QUEUED', 'attempts', 0, 'created_ms', now, 'updated_ms', now,
  'expires_ms', now + tonumber(ARGV[8]), 'seq', seq)
redis.call('ZADD', KEYS[1], seq, ARGV[1])
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[8]), ARGV[1])
redis.call('HINCRBY', KEYS[3], ARGV[2], 1)
if ARGV[9] == '1' then
  redis.call('SET', KEYS[7], ARGV[1])
  redis.call('HSET', KEYS[6], 'idem', KEYS[7])
end
redis.call('PUBLISH', ARGV[11], ARGV[1])
return {'job', redis.call('HGETALL', KEYS[6])}
"
    ))
});

/// Waiting jobs one claim expires, at most.
const EXPIRE_BATCH: usize = 256;

/// Ids looked up in one call (`states`), at most.
const IDS_PER_CALL: usize = 500;

/// KEYS: queued, running, tenants, expiry, clock. ARGV: job key base, lease
/// ms, claim token, ttl ms, channel, most jobs to expire.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_JOBS}{}",
        r"
local now = now_ms()
local ttl = tonumber(ARGV[4])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, tonumber(ARGV[6]))) do
  local jk = ARGV[1] .. id
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[1], id)
  local f = redis.call('HMGET', jk, 'state', 'tenant')
  if f[1] == 'QUEUED' then
    redis.call('HSET', jk, 'state', 'EXPIRED', 'error', 'job expired before it could run',
      'error_reason', 'JOB_EXPIRED', 'updated_ms', now)
    dec_tenant(KEYS[3], f[2])
    expire_record(jk, ttl)
    redis.call('PUBLISH', ARGV[5], id)
  end
end
while true do
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local id = first[1]
  if not id then return {'none'} end
  local jk = ARGV[1] .. id
  redis.call('ZREM', KEYS[1], id)
  redis.call('ZREM', KEYS[4], id)
  if redis.call('HGET', jk, 'state') == 'QUEUED' then
    local tag = tonumber(first[2]) or 0
    if tag > (tonumber(redis.call('GET', KEYS[5])) or 0) then
      redis.call('SET', KEYS[5], tag)
    end
    local lease = now + tonumber(ARGV[2])
    redis.call('HINCRBY', jk, 'attempts', 1)
    redis.call('HSET', jk, 'state', 'RUNNING', 'claim', ARGV[3], 'lease_until_ms', lease,
      'updated_ms', now)
    redis.call('ZADD', KEYS[2], lease, id)
    redis.call('PUBLISH', ARGV[5], id)
    return {'job', redis.call('HGETALL', jk)}
  end
end
"
    ))
});

/// KEYS: job, running, tenants, queued, expiry. ARGV: id, claim, action,
/// ttl ms, channel, then per action: succeed result | fail error, reason |
/// renew lease ms | release.
static FINISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_JOBS}{}",
        r"
local f = redis.call('HMGET', KEYS[1], 'state', 'claim', 'tenant')
if f[1] ~= 'RUNNING' or f[2] ~= ARGV[2] then return 0 end
local now = now_ms()
local action = ARGV[3]
if action == 'renew' then
  local lease = now + tonumber(ARGV[6])
  redis.call('HSET', KEYS[1], 'lease_until_ms', lease)
  redis.call('ZADD', KEYS[2], lease, ARGV[1])
  return 1
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[1], 'claim')
if action == 'succeed' then
  redis.call('HSET', KEYS[1], 'state', 'SUCCEEDED', 'result', ARGV[6], 'updated_ms', now)
elseif action == 'fail' then
  redis.call('HSET', KEYS[1], 'state', 'FAILED', 'error', ARGV[6], 'error_reason', ARGV[7],
    'updated_ms', now)
else
  local attempts = tonumber(redis.call('HGET', KEYS[1], 'attempts')) or 0
  if attempts < 1 then attempts = 1 end
  redis.call('HSET', KEYS[1], 'state', 'QUEUED', 'attempts', attempts - 1, 'updated_ms', now)
  requeue(KEYS[1], ARGV[1], KEYS[4], KEYS[5])
  redis.call('PUBLISH', ARGV[5], ARGV[1])
  return 1
end
dec_tenant(KEYS[3], f[3])
expire_record(KEYS[1], tonumber(ARGV[4]))
redis.call('PUBLISH', ARGV[5], ARGV[1])
return 1
"
    ))
});

/// Cancels a job that has not started. KEYS: job, queued, expiry, tenants.
/// ARGV: id, error, ttl ms, channel.
static CANCEL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_JOBS}{}",
        r"
local f = redis.call('HMGET', KEYS[1], 'state', 'tenant')
if f[1] ~= 'QUEUED' then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HSET', KEYS[1], 'state', 'FAILED', 'error', ARGV[2], 'error_reason', 'CANCELLED',
  'updated_ms', now_ms())
dec_tenant(KEYS[4], f[2])
expire_record(KEYS[1], tonumber(ARGV[3]))
redis.call('PUBLISH', ARGV[4], ARGV[1])
return 1
"
    ))
});

/// KEYS: running, queued, expiry. ARGV: job key base, channel.
static RECOVER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_JOBS}{}",
        r"
local now = now_ms()
local n = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)) do
  local jk = ARGV[1] .. id
  redis.call('ZREM', KEYS[1], id)
  if redis.call('HGET', jk, 'state') == 'RUNNING' then
    redis.call('HDEL', jk, 'claim')
    redis.call('HSET', jk, 'state', 'QUEUED', 'updated_ms', now)
    requeue(jk, id, KEYS[2], KEYS[3])
    redis.call('PUBLISH', ARGV[2], id)
    n = n + 1
  end
end
return n
"
    ))
});

/// KEYS: queued. ARGV: job key base. Returns {count, age ms or -1}.
static DEPTH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{}",
        r"
local n = redis.call('ZCARD', KEYS[1])
local first = redis.call('ZRANGE', KEYS[1], 0, 0)
if not first[1] then return {n, -1} end
local created = tonumber(redis.call('HGET', ARGV[1] .. first[1], 'created_ms'))
if not created then return {n, -1} end
local age = now_ms() - created
if age < 0 then age = 0 end
return {n, age}
"
    ))
});

/// KEYS: queued, job. Queued jobs inserted before this one.
static POSITION: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local seq = redis.call('HGET', KEYS[2], 'seq')
if not seq then return 0 end
return redis.call('ZCOUNT', KEYS[1], '-inf', '(' .. seq)
",
    )
});

/// KEYS: bucket. ARGV: rate, burst.
static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_BUCKET}{}",
        r"
return bucket_take(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), now_ms(), true)
"
    ))
});

/// The job queue shared by the fleet; clones share the change feed.
#[derive(Clone)]
pub struct RedisJobs {
    redis: Redis,
    limits: Limits,
    changes: broadcast::Sender<String>,
    /// Stops the change-feed task when the last clone goes.
    _feed: Arc<DropGuard>,
}

impl std::fmt::Debug for RedisJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisJobs")
            .field("redis", &self.redis)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn unavailable(e: StateError) -> QueueError {
    match e {
        StateError::Unavailable(m) => QueueError::Unavailable(m),
    }
}

fn bad(what: &str) -> QueueError {
    QueueError::Unavailable(format!("redis {what}: unexpected reply"))
}

/// A job hash (HGETALL, flat or as a map) as a record.
fn record(v: &Value) -> Option<JobRecord> {
    let mut fields: HashMap<String, Vec<u8>> = HashMap::new();
    match v {
        Value::Array(items) => {
            for pair in items.chunks(2) {
                if let [k, val] = pair {
                    fields.insert(reply::string(k)?, reply::bytes(val)?);
                }
            }
        }
        Value::Map(pairs) => {
            for (k, val) in pairs {
                fields.insert(reply::string(k)?, reply::bytes(val)?);
            }
        }
        _ => return None,
    }
    if fields.is_empty() {
        return None;
    }
    let text = |k: &str| {
        fields
            .get(k)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    };
    let number = |k: &str| text(k).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    let state = JobState::parse(text("state").as_deref().unwrap_or_default());
    Some(JobRecord {
        id: text("id")?,
        tenant: text("tenant")?,
        route: text("route").unwrap_or_default(),
        request: fields.get("request").cloned().unwrap_or_default(),
        state,
        attempts: number("attempts") as u32,
        result: fields.get("result").cloned(),
        error: text("error"),
        error_reason: text("error_reason"),
        created_ms: number("created_ms"),
        updated_ms: number("updated_ms"),
        claim: text("claim"),
    })
}

/// `{"job", <hash>}` from a script, or `{"none"}`.
fn job_reply(v: Value, what: &str) -> Result<Option<JobRecord>, QueueError> {
    let items = reply::items(v).ok_or_else(|| bad(what))?;
    match items.first().and_then(reply::string).as_deref() {
        Some("job") => items
            .get(1)
            .and_then(record)
            .map(Some)
            .ok_or_else(|| bad(what)),
        Some("none") => Ok(None),
        _ => Err(bad(what)),
    }
}

/// The job `SUBMIT` stored or found, or the bound it refused at.
fn submitted(v: Value, tenant: &str) -> Result<JobRecord, QueueError> {
    let items = reply::items(v).ok_or_else(|| bad("jobs submit"))?;
    let count = || {
        items
            .get(1)
            .and_then(reply::int)
            .map(|n| n.max(0) as usize)
            .unwrap_or(0)
    };
    match items.first().and_then(reply::string).as_deref() {
        Some("reused") => Err(QueueError::KeyReused),
        Some("full") => Err(QueueError::Full(count())),
        Some("tenant_full") => Err(QueueError::TenantFull {
            tenant: tenant.to_string(),
            count: count(),
        }),
        Some("job") => items
            .get(1)
            .and_then(record)
            .ok_or_else(|| bad("jobs submit")),
        _ => Err(bad("jobs submit")),
    }
}

impl RedisJobs {
    /// The client the store talks through (the fleet's drain bucket uses it too).
    pub fn redis(&self) -> &Redis {
        &self.redis
    }

    /// The queue on `redis` with these bounds. Inside a Tokio runtime this
    /// starts the change feed (a pub/sub subscriber that resubscribes after
    /// Redis restarts); outside one, `subscribe_changes` hears nothing.
    pub fn new(redis: Redis, limits: Limits) -> RedisJobs {
        let (changes, _) = broadcast::channel(1024);
        let stop = CancellationToken::new();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(change_feed(
                redis.client().clone(),
                redis.jobs_channel(),
                changes.clone(),
                stop.clone(),
                redis.call_timeout(),
            ));
        } else {
            tracing::warn!("redis job store built outside a runtime: no change feed");
        }
        RedisJobs {
            redis,
            limits,
            changes,
            _feed: Arc::new(stop.drop_guard()),
        }
    }

    /// Ids of jobs that changed anywhere in the fleet (best effort: a notice
    /// can be lost while Redis is down; poll as well).
    pub fn subscribe_changes(&self) -> broadcast::Receiver<String> {
        self.changes.subscribe()
    }

    fn key(&self, suffix: &str) -> String {
        self.redis.jobs_key(suffix)
    }

    fn job_base(&self) -> String {
        self.key("job:")
    }

    fn ttl_ms(&self) -> u64 {
        ms(self.limits.ttl, 1)
    }

    /// Accepts a job, or returns the existing job for the same tenant,
    /// idempotency key and fingerprint. Acknowledged only once Redis stored it.
    pub async fn submit(
        &self,
        tenant: &str,
        route: &str,
        idempotency_key: Option<&str>,
        fingerprint: &[u8],
        request: &[u8],
    ) -> Result<JobRecord, QueueError> {
        let id = format!("job-{:016x}{:08x}", now_ms(), rand::random::<u32>());
        let idem = match idempotency_key {
            Some(k) => self.key(&format!("idem:{}:{tenant}:{k}", tenant.len())),
            None => self.key("idem:"),
        };
        let keys = [
            self.key("queued"),
            self.key("running"),
            self.key("tenants"),
            self.key("clock"),
            self.key("expiry"),
            self.key(&format!("job:{id}")),
            idem,
            self.key("tenants:turns"),
        ];
        let args: [Vec<u8>; 11] = [
            id.clone().into_bytes(),
            tenant.as_bytes().to_vec(),
            route.as_bytes().to_vec(),
            fingerprint.to_vec(),
            request.to_vec(),
            self.limits.max_jobs.to_string().into_bytes(),
            self.limits.max_per_tenant.to_string().into_bytes(),
            self.ttl_ms().to_string().into_bytes(),
            if idempotency_key.is_some() {
                b"1"
            } else {
                b"0"
            }
            .to_vec(),
            self.job_base().into_bytes(),
            self.redis.jobs_channel().into_bytes(),
        ];
        let v: Value = self
            .redis
            .call("jobs submit", |mut c| async move {
                let mut inv = SUBMIT.prepare_invoke();
                for k in &keys {
                    inv.key(k);
                }
                for a in &args {
                    inv.arg(a.as_slice());
                }
                inv.invoke_async(&mut c).await
            })
            .await
            .map_err(unavailable)?;
        submitted(v, tenant)
    }

    pub async fn get(&self, id: &str) -> Result<Option<JobRecord>, QueueError> {
        let key = self.key(&format!("job:{id}"));
        let v: Value = self
            .redis
            .call("jobs get", |mut c| async move {
                redis::cmd("HGETALL").arg(key).query_async(&mut c).await
            })
            .await
            .map_err(unavailable)?;
        Ok(record(&v))
    }

    /// The states of these jobs (`None`: no such job), in order; reads no
    /// request or answer, a few hundred ids per call.
    pub async fn states(&self, ids: &[String]) -> Result<Vec<Option<JobState>>, QueueError> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(IDS_PER_CALL) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|id| self.key(&format!("job:{id}")))
                .collect();
            let states: Vec<Option<String>> = self
                .redis
                .call("jobs states", |mut c| async move {
                    let mut pipe = redis::pipe();
                    for k in &keys {
                        pipe.cmd("HGET").arg(k).arg("state");
                    }
                    pipe.query_async(&mut c).await
                })
                .await
                .map_err(unavailable)?;
            if states.len() != chunk.len() {
                return Err(bad("jobs states"));
            }
            out.extend(
                states
                    .into_iter()
                    .map(|s| s.as_deref().map(JobState::parse)),
            );
        }
        Ok(out)
    }

    /// Claims the waiting job whose turn it is (the lowest start tag) for a
    /// run of at most `lease`, after expiring waiting jobs past their TTL.
    pub async fn claim(&self, lease: Duration) -> Result<Option<JobRecord>, QueueError> {
        let keys = [
            self.key("queued"),
            self.key("running"),
            self.key("tenants"),
            self.key("expiry"),
            self.key("clock"),
        ];
        let base = self.job_base();
        let token = format!("{:016x}", rand::random::<u64>());
        let channel = self.redis.jobs_channel();
        let ttl = self.ttl_ms();
        let v: Value = self
            .redis
            .call("jobs claim", |mut c| async move {
                CLAIM
                    .key(&keys[..])
                    .arg(base)
                    .arg(ms(lease, 1))
                    .arg(token)
                    .arg(ttl)
                    .arg(channel)
                    .arg(EXPIRE_BATCH)
                    .invoke_async(&mut c)
                    .await
            })
            .await
            .map_err(unavailable)?;
        job_reply(v, "jobs claim")
    }

    /// One fenced change of a running job; `false` if `claim` no longer holds it.
    async fn finish(
        &self,
        what: &'static str,
        id: &str,
        claim: &str,
        action: &str,
        extra: &[&[u8]],
    ) -> Result<bool, QueueError> {
        let keys = [
            self.key(&format!("job:{id}")),
            self.key("running"),
            self.key("tenants"),
            self.key("queued"),
            self.key("expiry"),
        ];
        let channel = self.redis.jobs_channel();
        let ttl = self.ttl_ms();
        let done: i64 = self
            .redis
            .call(what, |mut c| async move {
                let mut inv = FINISH.key(&keys[..]);
                inv.arg(id).arg(claim).arg(action).arg(ttl).arg(channel);
                for a in extra {
                    inv.arg(*a);
                }
                inv.invoke_async(&mut c).await
            })
            .await
            .map_err(unavailable)?;
        Ok(done == 1)
    }

    /// Extends the lease of the run holding `claim`.
    pub async fn renew(&self, id: &str, claim: &str, lease: Duration) -> Result<bool, QueueError> {
        let lease = ms(lease, 1).to_string();
        self.finish("jobs renew", id, claim, "renew", &[lease.as_bytes()])
            .await
    }

    /// Records the answer of the run holding `claim`; `false` if that claim
    /// no longer holds the job.
    pub async fn succeed(&self, id: &str, claim: &str, result: &[u8]) -> Result<bool, QueueError> {
        self.finish("jobs succeed", id, claim, "succeed", &[result])
            .await
    }

    /// Ends the run holding `claim` with a final error.
    pub async fn fail(
        &self,
        id: &str,
        claim: &str,
        error: &str,
        reason: &str,
    ) -> Result<bool, QueueError> {
        self.finish(
            "jobs fail",
            id,
            claim,
            "fail",
            &[error.as_bytes(), reason.as_bytes()],
        )
        .await
    }

    /// Puts the job back at its original place; the run does not count.
    pub async fn release(&self, id: &str, claim: &str) -> Result<bool, QueueError> {
        self.finish("jobs release", id, claim, "release", &[]).await
    }

    /// Ends a job that has not started (FAILED, reason CANCELLED); `false`
    /// if it is running or final already.
    pub async fn cancel(&self, id: &str, error: &str) -> Result<bool, QueueError> {
        let keys = [
            self.key(&format!("job:{id}")),
            self.key("queued"),
            self.key("expiry"),
            self.key("tenants"),
        ];
        let channel = self.redis.jobs_channel();
        let ttl = self.ttl_ms();
        let done: i64 = self
            .redis
            .call("jobs cancel", |mut c| async move {
                CANCEL
                    .key(&keys[..])
                    .arg(id)
                    .arg(error)
                    .arg(ttl)
                    .arg(channel)
                    .invoke_async(&mut c)
                    .await
            })
            .await
            .map_err(unavailable)?;
        Ok(done == 1)
    }

    /// Returns runs whose lease ran out to the queue, at their original place.
    pub async fn recover_expired_leases(&self) -> Result<usize, QueueError> {
        let keys = [self.key("running"), self.key("queued"), self.key("expiry")];
        let base = self.job_base();
        let channel = self.redis.jobs_channel();
        let n: i64 = self
            .redis
            .call("jobs recover", |mut c| async move {
                RECOVER
                    .key(&keys[..])
                    .arg(base)
                    .arg(channel)
                    .invoke_async(&mut c)
                    .await
            })
            .await
            .map_err(unavailable)?;
        Ok(n.max(0) as usize)
    }

    /// Jobs waiting, and the age of the oldest.
    pub async fn depth(&self) -> Result<(u64, Option<Duration>), QueueError> {
        let queued = self.key("queued");
        let base = self.job_base();
        let (n, age): (i64, i64) = self
            .redis
            .call("jobs depth", |mut c| async move {
                DEPTH.key(queued).arg(base).invoke_async(&mut c).await
            })
            .await
            .map_err(unavailable)?;
        let age = (age >= 0).then(|| Duration::from_millis(age as u64));
        Ok((n.max(0) as u64, age))
    }

    /// Jobs waiting ahead of this one (0 if it is unknown).
    pub async fn position(&self, id: &str) -> Result<u64, QueueError> {
        let keys = [self.key("queued"), self.key(&format!("job:{id}"))];
        let n: i64 = self
            .redis
            .call("jobs position", |mut c| async move {
                POSITION.key(&keys[..]).invoke_async(&mut c).await
            })
            .await
            .map_err(unavailable)?;
        Ok(n.max(0) as u64)
    }
}

impl Redis {
    /// `{prefix}jobs:changed`.
    pub(crate) fn jobs_channel(&self) -> String {
        format!("{}jobs:changed", self.prefix())
    }

    /// Takes one token from the fleet-wide bucket `name`
    /// (`{prefix}{jobs}:drain:<name>`), so all replicas together drain at `cfg.rate`.
    pub async fn bucket_take(
        &self,
        name: &str,
        cfg: TokenBucketConfig,
    ) -> Result<bool, StateError> {
        let key = self.jobs_key(&format!("drain:{name}"));
        let wait: i64 = self
            .call("bucket_take", |mut c| async move {
                TAKE.key(key)
                    .arg(num(cfg.rate))
                    .arg(cfg.burst)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(wait == 0)
    }
}

/// Feeds `tx` from the change channel, resubscribing after Redis restarts;
/// a ping every few seconds notices a connection that died quietly.
async fn change_feed(
    client: redis::Client,
    channel: String,
    tx: broadcast::Sender<String>,
    stop: CancellationToken,
    call_timeout: Duration,
) {
    const MIN_BACKOFF: Duration = Duration::from_millis(100);
    const MAX_BACKOFF: Duration = Duration::from_secs(1);
    const PING_EVERY: Duration = Duration::from_secs(5);
    let mut backoff = MIN_BACKOFF;
    let mut lost = false;
    loop {
        let subscribed = tokio::time::timeout(call_timeout.max(Duration::from_secs(1)), async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        if let Ok(Ok(pubsub)) = subscribed {
            if lost {
                tracing::info!("redis job change feed resubscribed");
            }
            backoff = MIN_BACKOFF;
            let (mut sink, mut stream) = pubsub.split();
            let mut ping = tokio::time::interval(PING_EVERY);
            ping.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    msg = stream.next() => match msg {
                        Some(msg) => {
                            if let Ok(id) = msg.get_payload::<String>() {
                                let _ = tx.send(id);
                            }
                        }
                        None => break,
                    },
                    _ = ping.tick() => {
                        let alive = tokio::time::timeout(call_timeout, sink.ping::<Value>()).await;
                        if !matches!(alive, Ok(Ok(_))) {
                            break;
                        }
                    }
                }
            }
            tracing::warn!("redis job change feed lost; resubscribing");
            lost = true;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::state::redis::testutil::RedisServer;

    const LEASE: Duration = Duration::from_secs(30);

    fn limits(max: usize, per_tenant: usize) -> Limits {
        Limits {
            max_jobs: max,
            max_per_tenant: per_tenant,
            ttl: Duration::from_secs(3600),
        }
    }

    fn store(server: &RedisServer, l: Limits) -> RedisJobs {
        RedisJobs::new(server.client(), l)
    }

    #[tokio::test]
    async fn a_job_runs_once_in_order_and_a_stale_claim_cannot_finish() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let a = store(&server, limits(10, 10));
        let b = store(&server, limits(10, 10));
        let request = [0u8, 255, 10, 13, 0];
        let j1 = a.submit("t", "chat", None, b"fp", &request).await.unwrap();
        let j2 = b.submit("t", "chat", None, b"fp", b"two").await.unwrap();
        assert!(
            j1.id.starts_with("job-") && j1.id.len() == 4 + 24,
            "{}",
            j1.id
        );
        assert_eq!(
            (j1.state, j1.attempts, j1.claim.clone()),
            (JobState::Queued, 0, None)
        );
        assert_eq!(j1.request, request.to_vec(), "binary-safe request");
        assert_eq!(a.get(&j1.id).await.unwrap().unwrap(), j1);
        assert_eq!(a.get("job-nope").await.unwrap(), None);
        assert_eq!(a.position(&j1.id).await.unwrap(), 0);
        assert_eq!(a.position(&j2.id).await.unwrap(), 1);
        let (n, age) = a.depth().await.unwrap();
        assert_eq!(n, 2);
        assert!(age.unwrap() < Duration::from_secs(5));

        let c1 = b.claim(LEASE).await.unwrap().unwrap();
        assert_eq!(
            (c1.id.clone(), c1.state, c1.attempts),
            (j1.id.clone(), JobState::Running, 1)
        );
        let c2 = a.claim(LEASE).await.unwrap().unwrap();
        assert_eq!(c2.id, j2.id, "oldest first");
        assert!(a.claim(LEASE).await.unwrap().is_none(), "nothing left");
        assert_eq!(a.depth().await.unwrap(), (0, None));

        let t1 = c1.claim.clone().unwrap();
        assert!(!a.succeed(&j1.id, "not-the-token", b"x").await.unwrap());
        assert!(a.renew(&j1.id, &t1, LEASE).await.unwrap());
        let answer = [1u8, 0, 2, 255];
        assert!(a.succeed(&j1.id, &t1, &answer).await.unwrap());
        assert!(
            !b.succeed(&j1.id, &t1, b"again").await.unwrap(),
            "at most once"
        );
        assert!(!b.fail(&j1.id, &t1, "e", "R").await.unwrap());
        assert!(!b.release(&j1.id, &t1).await.unwrap());
        assert!(!b.renew(&j1.id, &t1, LEASE).await.unwrap());
        let done = b.get(&j1.id).await.unwrap().unwrap();
        assert_eq!(done.state, JobState::Succeeded);
        assert_eq!(done.result, Some(answer.to_vec()));
        assert_eq!(done.claim, None);

        let t2 = c2.claim.clone().unwrap();
        assert!(b
            .fail(&j2.id, &t2, "provider said no", "UPSTREAM")
            .await
            .unwrap());
        let failed = a.get(&j2.id).await.unwrap().unwrap();
        assert_eq!(failed.state, JobState::Failed);
        assert_eq!(failed.error.as_deref(), Some("provider said no"));
        assert_eq!(failed.error_reason.as_deref(), Some("UPSTREAM"));
        // Finished records expire after the TTL.
        let ttl: i64 = server
            .raw(&["PTTL", &format!("switchyard:{{jobs}}:job:{}", j2.id)])
            .await
            .unwrap();
        assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{ttl}");
        let tenants: i64 = server
            .raw(&["HLEN", "switchyard:{jobs}:tenants"])
            .await
            .unwrap();
        assert_eq!(tenants, 0, "finished jobs leave the tenant count");
    }

    #[tokio::test]
    async fn release_keeps_the_place_and_lapsed_leases_come_back_in_order() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let s = store(&server, limits(10, 10));
        let a = s.submit("t", "chat", None, b"a", b"a").await.unwrap();
        let b = s.submit("t", "chat", None, b"b", b"b").await.unwrap();
        let c = s.submit("t", "chat", None, b"c", b"c").await.unwrap();
        let ca = s.claim(LEASE).await.unwrap().unwrap();
        assert_eq!(ca.id, a.id);
        assert_eq!(s.position(&c.id).await.unwrap(), 1);
        assert!(s
            .release(&a.id, ca.claim.as_deref().unwrap())
            .await
            .unwrap());
        let again = s.get(&a.id).await.unwrap().unwrap();
        assert_eq!(
            (again.state, again.attempts, again.claim),
            (JobState::Queued, 0, None)
        );
        assert_eq!(s.position(&c.id).await.unwrap(), 2, "a is ahead again");
        assert!(!s
            .release(&a.id, ca.claim.as_deref().unwrap())
            .await
            .unwrap());

        // a and b run with a short lease and their runners die.
        let short = Duration::from_millis(100);
        let ra = s.claim(short).await.unwrap().unwrap();
        let rb = s.claim(short).await.unwrap().unwrap();
        assert_eq!((ra.id.clone(), rb.id.clone()), (a.id.clone(), b.id.clone()));
        assert_eq!(
            s.recover_expired_leases().await.unwrap(),
            0,
            "leases still live"
        );
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(s.recover_expired_leases().await.unwrap(), 2);
        assert_eq!(s.depth().await.unwrap().0, 3);
        assert_eq!(s.position(&b.id).await.unwrap(), 1, "original order");
        let next = s.claim(LEASE).await.unwrap().unwrap();
        assert_eq!((next.id.clone(), next.attempts), (a.id.clone(), 2));
        assert!(
            !s.succeed(&a.id, ra.claim.as_deref().unwrap(), b"stale")
                .await
                .unwrap(),
            "the lapsed run's token is fenced off"
        );
        assert!(s
            .succeed(&a.id, next.claim.as_deref().unwrap(), b"fresh")
            .await
            .unwrap());
        // A renewed lease is not recovered.
        let nb = s.claim(short).await.unwrap().unwrap();
        assert_eq!(nb.id, b.id);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(s
            .renew(&b.id, nb.claim.as_deref().unwrap(), LEASE)
            .await
            .unwrap());
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(s.recover_expired_leases().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn bounds_and_idempotency_keys() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let s = store(&server, limits(3, 2));
        s.submit("a", "chat", None, b"1", b"r").await.unwrap();
        s.submit("a", "chat", None, b"2", b"r").await.unwrap();
        assert!(matches!(
            s.submit("a", "chat", None, b"3", b"r").await,
            Err(QueueError::TenantFull { ref tenant, count: 2 }) if tenant == "a"
        ));
        let k = s.submit("b", "chat", Some("k"), b"x", b"r").await.unwrap();
        assert!(matches!(
            s.submit("c", "chat", None, b"4", b"r").await,
            Err(QueueError::Full(3))
        ));
        assert_eq!(
            s.submit("b", "chat", Some("k"), b"x", b"r")
                .await
                .unwrap()
                .id,
            k.id,
            "same key, same request: the same job (even when full)"
        );
        assert!(matches!(
            s.submit("b", "chat", Some("k"), b"y", b"r").await,
            Err(QueueError::KeyReused)
        ));
        assert_eq!(s.depth().await.unwrap().0, 3);
        // A finished job frees its place, and its key still dedups.
        let c = s.claim(LEASE).await.unwrap().unwrap();
        assert!(s
            .succeed(&c.id, c.claim.as_deref().unwrap(), b"ok")
            .await
            .unwrap());
        s.submit("c", "chat", None, b"4", b"r").await.unwrap();
        let c = loop {
            let c = s.claim(LEASE).await.unwrap().unwrap();
            if c.id == k.id {
                break c;
            }
        };
        assert!(s
            .succeed(&c.id, c.claim.as_deref().unwrap(), b"done")
            .await
            .unwrap());
        let again = s.submit("b", "chat", Some("k"), b"x", b"r").await.unwrap();
        assert_eq!((again.id, again.state), (k.id.clone(), JobState::Succeeded));
        // Keys are per tenant.
        let other = s.submit("z", "chat", Some("k"), b"y", b"r").await.unwrap();
        assert_ne!(other.id, k.id);
    }

    #[tokio::test]
    async fn waiting_jobs_expire_at_claim_time() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let l = Limits {
            max_jobs: 10,
            max_per_tenant: 1,
            ttl: Duration::from_millis(150),
        };
        let s = store(&server, l);
        let j = s.submit("t", "chat", Some("k"), b"x", b"r").await.unwrap();
        assert!(matches!(
            s.submit("t", "chat", None, b"y", b"r").await,
            Err(QueueError::TenantFull { .. })
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            s.depth().await.unwrap().0,
            1,
            "expired only when a claim looks"
        );
        assert!(s.claim(LEASE).await.unwrap().is_none());
        let e = s.get(&j.id).await.unwrap().unwrap();
        assert_eq!(e.state, JobState::Expired);
        assert_eq!(e.error_reason.as_deref(), Some("JOB_EXPIRED"));
        assert_eq!(e.error.as_deref(), Some("job expired before it could run"));
        assert_eq!(s.depth().await.unwrap(), (0, None));
        s.submit("t", "chat", None, b"y", b"r").await.unwrap();
        // The expired record (and its key) go after the TTL.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(s.get(&j.id).await.unwrap(), None);
        let n: i64 = server
            .raw(&["EXISTS", "switchyard:{jobs}:idem:1:t:k"])
            .await
            .unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn tenants_take_turns_so_a_big_backlog_does_not_hold_another_tenants_job_back() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let s = store(&server, limits(100, 100));
        let mut a = Vec::new();
        for i in 0..20u8 {
            a.push(s.submit("a", "chat", None, &[i], b"r").await.unwrap().id);
        }
        assert_eq!(s.claim(LEASE).await.unwrap().unwrap().id, a[0]);
        let b = s.submit("b", "chat", None, b"b", b"r").await.unwrap();
        assert_eq!(s.position(&b.id).await.unwrap(), 0, "b's job is next");
        let mut order = Vec::new();
        for _ in 0..3 {
            order.push(s.claim(LEASE).await.unwrap().unwrap().id);
        }
        assert_eq!(order, vec![b.id.clone(), a[1].clone(), a[2].clone()]);
        // Two tenants with backlogs alternate.
        let mut d = Vec::new();
        for i in 0..3u8 {
            d.push(
                s.submit("d", "chat", None, &[b'd', i], b"r")
                    .await
                    .unwrap()
                    .id,
            );
        }
        let mut next = Vec::new();
        for _ in 0..4 {
            next.push(s.claim(LEASE).await.unwrap().unwrap().id);
        }
        // d joins at the turn that ran last (a's third job), then each turn
        // takes one job of each tenant (equal tags in either order).
        assert_eq!(next[0], d[0]);
        let mut turn = next[1..3].to_vec();
        turn.sort();
        let mut want = vec![d[1].clone(), a[3].clone()];
        want.sort();
        assert_eq!(turn, want, "one of each tenant per turn");
        assert!(next[3] == a[4] || next[3] == d[2], "{next:?}");
        // A tenant whose last job went starts afresh (no stale turn).
        let turns: i64 = server
            .raw(&["HEXISTS", "switchyard:{jobs}:tenants:turns", "b"])
            .await
            .unwrap();
        assert_eq!(turns, 1, "b's job is still running");
        let c = s.get(&b.id).await.unwrap().unwrap();
        assert!(s
            .succeed(&b.id, c.claim.as_deref().unwrap(), b"ok")
            .await
            .unwrap());
        let turns: i64 = server
            .raw(&["HEXISTS", "switchyard:{jobs}:tenants:turns", "b"])
            .await
            .unwrap();
        assert_eq!(turns, 0);
    }

    #[tokio::test]
    async fn states_are_read_in_order_without_bodies() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let s = store(&server, limits(10, 10));
        let a = s.submit("t", "chat", None, b"a", b"r").await.unwrap();
        let b = s.submit("t", "chat", None, b"b", b"r").await.unwrap();
        let c = s.claim(LEASE).await.unwrap().unwrap();
        assert!(s
            .succeed(&c.id, c.claim.as_deref().unwrap(), b"ok")
            .await
            .unwrap());
        let ids = vec![b.id.clone(), "job-nope".to_string(), a.id.clone()];
        assert_eq!(
            s.states(&ids).await.unwrap(),
            vec![Some(JobState::Queued), None, Some(JobState::Succeeded)]
        );
        let many: Vec<String> = (0..1200).map(|i| format!("job-{i}")).collect();
        assert_eq!(s.states(&many).await.unwrap().len(), 1200);
    }

    #[tokio::test]
    async fn change_notices_reach_every_replica() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let a = store(&server, limits(10, 10));
        let b = store(&server, limits(10, 10));
        let mut ra = a.subscribe_changes();
        let mut rb = b.subscribe_changes();
        // Both feeds are subscribed before anything is published.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let subs: Vec<Value> = server
                .raw(&["PUBSUB", "NUMSUB", "switchyard:jobs:changed"])
                .await
                .unwrap();
            if subs.get(1).and_then(reply::int) == Some(2) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "feeds never subscribed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let j = a.submit("t", "chat", None, b"x", b"r").await.unwrap();
        let wait = Duration::from_secs(2);
        for r in [&mut ra, &mut rb] {
            assert_eq!(
                tokio::time::timeout(wait, r.recv()).await.unwrap().unwrap(),
                j.id
            );
        }
        let c = b.claim(LEASE).await.unwrap().unwrap();
        assert!(b
            .succeed(&c.id, c.claim.as_deref().unwrap(), b"ok")
            .await
            .unwrap());
        for r in [&mut ra, &mut rb] {
            assert_eq!(
                tokio::time::timeout(wait, r.recv()).await.unwrap().unwrap(),
                j.id,
                "claimed"
            );
            assert_eq!(
                tokio::time::timeout(wait, r.recv()).await.unwrap().unwrap(),
                j.id,
                "succeeded"
            );
        }
    }

    #[tokio::test]
    async fn the_drain_bucket_is_shared_by_the_fleet_and_refills() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let a = server.client();
        let b = server.client();
        let cfg = TokenBucketConfig {
            rate: 4.0,
            burst: 4,
        };
        let mut taken = 0;
        for i in 0..10 {
            let r = if i % 2 == 0 { &a } else { &b };
            if r.bucket_take("drain", cfg.clone()).await.unwrap() {
                taken += 1;
            }
        }
        assert!(
            (4..=5).contains(&taken),
            "burst 4 (plus at most one refilled while the loop ran): {taken}"
        );
        assert!(
            a.bucket_take("other", cfg.clone()).await.unwrap(),
            "buckets are apart"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut again = 0;
        for _ in 0..4 {
            if b.bucket_take("drain", cfg.clone()).await.unwrap() {
                again += 1;
            }
        }
        assert!((2..=3).contains(&again), "refilled at 4/s: {again}");
        let n: i64 = server
            .raw(&["EXISTS", "switchyard:{jobs}:drain:drain"])
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
}
