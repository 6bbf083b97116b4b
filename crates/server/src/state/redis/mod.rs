//! The fleet backend on Redis: one cheap-to-clone client that owns the
//! connection (made lazily, remade after errors, so service resumes when Redis
//! comes back), the per-call timeout, the breaker and the key layout. Each
//! function's scripts (Lua clocked by `TIME`) live with its store, in
//! `state/<store>/redis.rs` (cost, tenants, affinity, idempotency,
//! responses, jobs, files); the leases the stores hold are kept and given
//! back by `lease`. This file must not log URLs (they may carry a password).
//!
//! Key layout (the prefix defaults to `switchyard:`; every key carries a hash
//! tag so Redis Cluster keeps each script's keys in one slot):
//! - `{prefix}{t:<tenant>}:spend`, `:cost:res`, `:slots`, `:rate`, `:affinity`: per tenant;
//! - `{prefix}{i:<scoped key>}`: one idempotency record;
//! - `{prefix}{fleet}:replicas`: the replicas' heartbeats;
//! - `{prefix}{jobs}:...`: the whole job queue, its blobs (Batch API files),
//!   and `{prefix}{jobs}:drain:<name>`.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError};
use tokio::time::Instant;

use super::{Persistence, StateError};

mod breaker;
#[cfg(test)]
mod faults;
pub mod lease;
pub mod server;
#[cfg(test)]
pub(crate) mod testutil;

use breaker::{Admit, Breaker, Transition};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "switchyard:";

/// A client of the shared Redis; clones share one connection and one breaker.
#[derive(Clone)]
pub struct Redis {
    inner: Arc<Inner>,
}

struct Inner {
    client: redis::Client,
    config: AsyncConnectionConfig,
    prefix: String,
    call_timeout: Duration,
    /// The live connection and its generation, if one is up.
    slot: Mutex<Option<(u64, MultiplexedConnection)>>,
    /// Held while connecting, so callers wait for one attempt instead of racing.
    connecting: tokio::sync::Mutex<()>,
    /// Generations handed to connections.
    next_connection: AtomicU64,
    breaker: Mutex<Breaker>,
    errors: AtomicU64,
}

impl std::fmt::Debug for Redis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the URL: it may carry a password.
        f.debug_struct("Redis")
            .field("prefix", &self.inner.prefix)
            .field("call_timeout", &self.inner.call_timeout)
            .finish_non_exhaustive()
    }
}

/// Why one call failed, before it becomes a `StateError`.
enum CallError {
    /// Redis answered with an error or the connection broke; the generation
    /// of the connection used, if one was reached.
    Redis(Option<u64>, RedisError),
    /// No answer within the call timeout.
    Timeout,
}

impl Redis {
    /// A client for `url` (`redis://` or `rediss://`); connects on first use,
    /// so Redis need not be up yet.
    pub fn new(url: &str, key_prefix: &str, call_timeout: Duration) -> Result<Redis, StateError> {
        if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
            return Err(StateError::Unavailable(
                "redis url must start with redis:// or rediss://".into(),
            ));
        }
        if key_prefix.contains(['{', '}']) {
            return Err(StateError::Unavailable(
                "redis key prefix must not contain braces (they are hash tags)".into(),
            ));
        }
        // The parse error may echo the URL; say only that it did not parse.
        let client = redis::Client::open(url)
            .map_err(|_| StateError::Unavailable("redis url does not parse".into()))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(call_timeout))
            .set_response_timeout(Some(call_timeout));
        Ok(Redis {
            inner: Arc::new(Inner {
                client,
                config,
                prefix: key_prefix.to_string(),
                call_timeout,
                slot: Mutex::new(None),
                connecting: tokio::sync::Mutex::new(()),
                next_connection: AtomicU64::new(1),
                breaker: Mutex::new(Breaker::new()),
                errors: AtomicU64::new(0),
            }),
        })
    }

    /// The breaker is closed: recent calls reached Redis.
    pub fn is_healthy(&self) -> bool {
        lock(&self.inner.breaker).is_closed()
    }

    /// Calls that failed (a Redis error or a timeout) since start; fast
    /// failures of an open breaker are not counted.
    pub fn errors_total(&self) -> u64 {
        self.inner.errors.load(Ordering::Relaxed)
    }

    /// How Redis keeps what it acknowledged (`CONFIG GET`); an error if
    /// `CONFIG` is disabled or renamed.
    pub async fn persistence(&self) -> Result<Persistence, StateError> {
        let (aof, fsync) = self
            .call("persistence", |mut c| async move {
                let aof: Vec<String> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("appendonly")
                    .query_async(&mut c)
                    .await?;
                let fsync: Vec<String> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("appendfsync")
                    .query_async(&mut c)
                    .await?;
                Ok((aof, fsync))
            })
            .await?;
        match (aof.get(1), fsync.get(1)) {
            (Some(aof), Some(fsync)) => Ok(Persistence {
                appendonly: aof.eq_ignore_ascii_case("yes"),
                appendfsync: fsync.to_ascii_lowercase(),
            }),
            _ => Err(StateError::Unavailable(
                "redis CONFIG GET returned nothing (CONFIG disabled?)".into(),
            )),
        }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.inner.prefix
    }

    pub(crate) fn call_timeout(&self) -> Duration {
        self.inner.call_timeout
    }

    pub(crate) fn client(&self) -> &redis::Client {
        &self.inner.client
    }

    /// `{prefix}{t:<tenant>}:<suffix>`.
    pub(crate) fn tenant_key(&self, tenant: &str, suffix: &str) -> String {
        format!("{}{{t:{tenant}}}:{suffix}", self.inner.prefix)
    }

    /// `{prefix}{i:<scoped key>}`.
    pub(crate) fn idem_key(&self, scoped_key: &str) -> String {
        format!("{}{{i:{scoped_key}}}", self.inner.prefix)
    }

    /// `{prefix}{fleet}:<suffix>`.
    pub(crate) fn fleet_key(&self, suffix: &str) -> String {
        format!("{}{{fleet}}:{suffix}", self.inner.prefix)
    }

    /// `{prefix}{jobs}:<suffix>`.
    pub(crate) fn jobs_key(&self, suffix: &str) -> String {
        format!("{}{{jobs}}:{suffix}", self.inner.prefix)
    }

    /// The live connection, or a new one.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        if let Some(live) = lock(&self.inner.slot).clone() {
            return Ok(live);
        }
        let _one_at_a_time = self.inner.connecting.lock().await;
        if let Some(live) = lock(&self.inner.slot).clone() {
            return Ok(live);
        }
        let conn = self
            .inner
            .client
            .get_multiplexed_async_connection_with_config(&self.inner.config)
            .await?;
        let generation = self.inner.next_connection.fetch_add(1, Ordering::Relaxed);
        *lock(&self.inner.slot) = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// Drops the connection (of `generation`, or whichever is up) so the next call reconnects.
    fn drop_connection(&self, generation: Option<u64>) {
        let mut slot = lock(&self.inner.slot);
        if let Some((live, _)) = slot.as_ref() {
            if generation.is_none_or(|g| g == *live) {
                *slot = None;
            }
        }
    }

    /// Runs one Redis exchange behind the breaker and the call timeout.
    pub(crate) async fn call<T, F, Fut>(&self, what: &'static str, f: F) -> Result<T, StateError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = Result<T, RedisError>>,
    {
        let admitted = lock(&self.inner.breaker).admit(Instant::now());
        let (generation, probe) = match admitted {
            Admit::Call(g) => (g, false),
            Admit::Probe(g) => (g, true),
            Admit::Reject(left) => {
                return Err(StateError::Unavailable(format!(
                    "redis breaker open ({what}; next probe in {} ms)",
                    left.as_millis()
                )))
            }
        };
        let mut abandon = AbandonGuard {
            redis: self,
            generation,
            armed: probe,
        };
        // Boxed: the exchange (about 2.6 KB of future) is stored on the
        // heap for the call's length instead of inside every request's
        // future that might make a Redis call.
        let outcome = Box::pin(tokio::time::timeout(self.inner.call_timeout, async {
            let (conn_gen, conn) = self
                .connection()
                .await
                .map_err(|e| CallError::Redis(None, e))?;
            f(conn)
                .await
                .map_err(|e| CallError::Redis(Some(conn_gen), e))
        }))
        .await
        .unwrap_or(Err(CallError::Timeout));
        abandon.armed = false;
        match outcome {
            Ok(value) => {
                let t = lock(&self.inner.breaker).success(generation);
                self.log_transition(t, what, None);
                Ok(value)
            }
            Err(err) => {
                self.inner.errors.fetch_add(1, Ordering::Relaxed);
                let message = match &err {
                    CallError::Timeout => {
                        // A connection that does not answer may be wedged: start afresh.
                        self.drop_connection(None);
                        format!(
                            "redis {what} timed out after {} ms",
                            self.inner.call_timeout.as_millis()
                        )
                    }
                    CallError::Redis(conn_gen, e) => {
                        if !matches!(e.kind(), redis::ErrorKind::Server(_)) {
                            self.drop_connection(*conn_gen);
                        }
                        format!("redis {what}: {e}")
                    }
                };
                let t = lock(&self.inner.breaker).failure(generation, Instant::now());
                self.log_transition(t, what, Some(&message));
                Err(StateError::Unavailable(message))
            }
        }
    }

    fn log_transition(&self, t: Option<Transition>, what: &str, error: Option<&str>) {
        match t {
            Some(Transition::Opened) => tracing::warn!(
                call = what,
                error = error.unwrap_or(""),
                "redis breaker open after {} consecutive failures; failing fast for {} ms",
                breaker::FAILURES_TO_OPEN,
                breaker::OPEN_FOR.as_millis()
            ),
            Some(Transition::Reopened) => tracing::warn!(
                call = what,
                error = error.unwrap_or(""),
                "redis breaker probe failed; open again"
            ),
            Some(Transition::Closed) => {
                tracing::info!(call = what, "redis breaker closed: redis answers again")
            }
            None => {}
        }
    }
}

/// Tells the breaker when a probe's caller drops the call mid-flight, so the
/// breaker does not wait forever for its outcome.
struct AbandonGuard<'a> {
    redis: &'a Redis,
    generation: u64,
    armed: bool,
}

impl Drop for AbandonGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            lock(&self.redis.inner.breaker).abandoned(self.generation, Instant::now());
        }
    }
}

/// Locks a mutex, riding over poisoning (the guarded state stays consistent:
/// no code panics while holding these locks).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A reply did not have the shape the script returns.
pub(crate) fn bad_reply(what: &str) -> StateError {
    StateError::Unavailable(format!("redis {what}: unexpected reply"))
}

/// Reply helpers: scripts answer arrays of bulk strings and integers.
pub(crate) mod reply {
    use redis::Value;

    pub(crate) fn items(v: Value) -> Option<Vec<Value>> {
        match v {
            Value::Array(items) | Value::Set(items) => Some(items),
            _ => None,
        }
    }

    pub(crate) fn bytes(v: &Value) -> Option<Vec<u8>> {
        match v {
            Value::BulkString(b) => Some(b.clone()),
            Value::SimpleString(s) => Some(s.as_bytes().to_vec()),
            Value::Okay => Some(b"OK".to_vec()),
            Value::Int(i) => Some(i.to_string().into_bytes()),
            _ => None,
        }
    }

    pub(crate) fn string(v: &Value) -> Option<String> {
        bytes(v).and_then(|b| String::from_utf8(b).ok())
    }

    pub(crate) fn int(v: &Value) -> Option<i64> {
        match v {
            Value::Int(i) => Some(*i),
            other => string(other).and_then(|s| s.parse().ok()),
        }
    }

    pub(crate) fn float(v: &Value) -> Option<f64> {
        string(v).and_then(|s| s.parse().ok())
    }
}

/// Shared Lua: the server clock in milliseconds.
pub(crate) const LUA_NOW: &str = r"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
";

/// Shared Lua: the token bucket of tenant rates and of the job drain.
/// `bucket_take` answers 0 if a token was taken, else ms until one is
/// available. Rates below one a day act as one a day and a burst of 0 as 1,
/// as in `policy::token_bucket`.
pub(crate) const LUA_BUCKET: &str = r"
local function bucket_take(key, rate, burst, now, take)
  if burst < 1 then burst = 1 end
  if rate ~= rate or rate < 1 / 86400 then rate = 1 / 86400 end
  local st = redis.call('HMGET', key, 'tokens', 'last')
  local tokens = tonumber(st[1])
  local last = tonumber(st[2])
  if tokens == nil or last == nil then
    tokens = burst
    last = now
  end
  if now > last then
    tokens = math.min(burst, tokens + (now - last) * rate / 1000)
    last = now
  end
  if tokens < 1 then
    local wait = math.ceil((1 - tokens) * 1000 / rate)
    if wait < 1 then wait = 1 end
    return wait
  end
  if take then
    redis.call('HSET', key, 'tokens', string.format('%.17g', tokens - 1), 'last', last)
    redis.call('PEXPIRE', key, math.min(math.ceil(burst * 1000 / rate) + 1000, 1e12))
  end
  return 0
end
";

/// Formats a float for Lua's `tonumber` without losing precision.
pub(crate) fn num(x: f64) -> String {
    if x.is_finite() {
        format!("{x:?}")
    } else {
        "0".to_string()
    }
}

/// Milliseconds of a duration, at least `min`.
pub(crate) fn ms(d: Duration, min: u64) -> u64 {
    (d.as_millis().min(u128::from(u64::MAX)) as u64).max(min)
}
