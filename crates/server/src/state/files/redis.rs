//! Blobs on the fleet's Redis (Batch API files, batch records, line lists,
//! outputs), bounded: every blob is charged to its tenant, an upload past
//! the tenant's quotas or the store's budget is refused in the same script
//! that reserves its room, and big blobs travel in chunks of just under
//! 1 MiB on a connection of their own, each with `queue.blob_timeout`,
//! outside the request path's call timeout and breaker: a 40 MB upload
//! neither times out at 250 ms nor trips the breaker keyed requests need.
//!
//! A big blob is reserved (its room charged, under `upload:<id>`, for a
//! short lease), written chunk by chunk (each write fenced by the
//! reservation: a chunk that arrives after an abort is not stored), then
//! committed (one script: the chunks get the blob's TTL, the charge moves
//! to its name). A failed or abandoned upload is aborted (its chunks
//! deleted, its charge returned), retried until Redis answers or the lease
//! ends; past that its chunks expire with the lease and the next purge
//! returns the charge. Nothing stays behind.
//!
//! Keys under `{prefix}{jobs}:`: `obj:<name>` (hash: `t` tenant, `b` bytes,
//! `f` files, then `d` the bytes, or `n` chunks of upload `u`),
//! `chunk:<upload>:<i>`, `objs:exp` (zset: blob or upload -> expiry ms),
//! `objs:acct` (hash: blob or upload -> `bytes:files:tenant`), `objs:usage`
//! (hash: `f:<tenant>`, `b:<tenant>`, `total`). Expired charges are purged
//! a bounded number at a time, by every store and by the queue's sweep.

use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Script, Value};

use super::quota::{self, BlobKind, FileLimits, Usage};
use super::BlobPut;
use crate::state::jobs::QueueError;
use crate::state::redis::{ms, reply, Redis, LUA_NOW};
use crate::state::StateError;

/// Bytes in one chunk: just under 1 MiB, so a chunk and Redis's string
/// header fit the allocator's 1 MiB size class.
pub const CHUNK: usize = (1 << 20) - 1024;

/// Blobs up to this size are stored in one request-path call.
const INLINE: usize = 64 * 1024;

/// Expired charges one call purges, at most.
const PURGE_BATCH: usize = 100;

/// Room a pending upload holds beyond its chunks' worst-case time.
const LEASE_SLACK: Duration = Duration::from_secs(60);

/// Shared Lua: the OOM guard, charges (`bytes:files:tenant`), usage, purging.
///
/// Redis refuses a script's write past `maxmemory` only while the script has
/// written nothing yet: once any write ran (even a `DEL` of nothing), the rest
/// may grow memory. A script that adds data therefore starts with
/// `refuse_when_full`: a deny-oom write that changes nothing (an empty
/// `SETRANGE` on a key that never exists), so a full Redis refuses the whole
/// script before it changes anything.
const LUA_OBJS: &str = r"
local function refuse_when_full(near)
  redis.call('SETRANGE', near .. ':oom-guard', 0, '')
end
local function parse(v)
  local b, f, t = string.match(v, '^(%d+):(%d+):(.*)$')
  return tonumber(b), tonumber(f), t
end
local function bump(usage, field, delta)
  if delta == 0 then return end
  local n = redis.call('HINCRBY', usage, field, delta)
  if n <= 0 then redis.call('HDEL', usage, field) end
end
local function charge(usage, tenant, bytes, files, sign)
  bump(usage, 'b:' .. tenant, sign * bytes)
  bump(usage, 'total', sign * bytes)
  bump(usage, 'f:' .. tenant, sign * files)
end
local function del_chunks(base, up, n)
  for i = 0, n - 1 do redis.call('DEL', base .. up .. ':' .. i) end
end
local function forget(exp, acct, usage, member, base, chunk)
  redis.call('ZREM', exp, member)
  local v = redis.call('HGET', acct, member)
  if not v then return end
  redis.call('HDEL', acct, member)
  local b, f, t = parse(v)
  charge(usage, t, b, f, -1)
  local up = string.match(member, '^upload:(.*)$')
  if up then del_chunks(base, up, math.ceil(b / chunk)) end
end
local function purge(exp, acct, usage, now, limit, base, chunk)
  local gone = redis.call('ZRANGEBYSCORE', exp, '-inf', now, 'LIMIT', 0, limit)
  for _, m in ipairs(gone) do forget(exp, acct, usage, m, base, chunk) end
  return #gone
end
local function held(usage, tenant)
  return tonumber(redis.call('HGET', usage, 'f:' .. tenant)) or 0,
    tonumber(redis.call('HGET', usage, 'b:' .. tenant)) or 0,
    tonumber(redis.call('HGET', usage, 'total')) or 0
end
-- mirrors quota::admit; nil when it fits
local function refused(usage, tenant, bytes, files, lf, lb, lt, less_b, less_f)
  local f, b, t = held(usage, tenant)
  f, b, t = f - less_f, b - less_b, t - less_b
  if f + files > lf or b + bytes > lb or t + bytes > lt then
    return {'refused', f, b, t}
  end
  return nil
end
-- drops the blob stored under `name` (its hash, chunks and charge)
local function drop(obj, acct, usage, name, base)
  local old = redis.call('HGET', acct, name)
  if old then
    redis.call('HDEL', acct, name)
    local b, f, t = parse(old)
    charge(usage, t, b, f, -1)
  end
  local o = redis.call('HMGET', obj, 'n', 'u')
  if o[2] then del_chunks(base, o[2], tonumber(o[1]) or 0) end
  redis.call('DEL', obj)
end
";

/// KEYS: obj, exp, acct, usage. ARGV: name, tenant, bytes, files, enforce,
/// limit files, limit bytes, limit total, ttl ms, data, chunk base, chunk
/// size, purge batch.
static PUT_INLINE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_OBJS}{}",
        r"
refuse_when_full(KEYS[2])
local now = now_ms()
local base, chunk = ARGV[11], tonumber(ARGV[12])
purge(KEYS[2], KEYS[3], KEYS[4], now, tonumber(ARGV[13]), base, chunk)
local bytes, files = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[5] == '1' then
  local less_b, less_f = 0, 0
  local old = redis.call('HGET', KEYS[3], ARGV[1])
  if old then
    local b, f, t = parse(old)
    if t == ARGV[2] then less_b, less_f = b, f end
  end
  local r = refused(KEYS[4], ARGV[2], bytes, files, tonumber(ARGV[6]), tonumber(ARGV[7]),
    tonumber(ARGV[8]), less_b, less_f)
  if r then return r end
end
drop(KEYS[1], KEYS[3], KEYS[4], ARGV[1], base)
redis.call('HSET', KEYS[1], 't', ARGV[2], 'b', bytes, 'f', files, 'd', ARGV[10])
redis.call('PEXPIRE', KEYS[1], ARGV[9])
redis.call('HSET', KEYS[3], ARGV[1], bytes .. ':' .. files .. ':' .. ARGV[2])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[9]), ARGV[1])
charge(KEYS[4], ARGV[2], bytes, files, 1)
return {'ok'}
"
    ))
});

/// KEYS: exp, acct, usage. ARGV: upload id, tenant, bytes, files, enforce,
/// limit files, limit bytes, limit total, lease ms, chunk base, chunk size,
/// purge batch.
static RESERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_OBJS}{}",
        r"
refuse_when_full(KEYS[1])
local now = now_ms()
purge(KEYS[1], KEYS[2], KEYS[3], now, tonumber(ARGV[12]), ARGV[10], tonumber(ARGV[11]))
local bytes, files = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[5] == '1' then
  local r = refused(KEYS[3], ARGV[2], bytes, files, tonumber(ARGV[6]), tonumber(ARGV[7]),
    tonumber(ARGV[8]), 0, 0)
  if r then return r end
end
local up = 'upload:' .. ARGV[1]
redis.call('HSET', KEYS[2], up, bytes .. ':' .. files .. ':' .. ARGV[2])
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[9]), up)
charge(KEYS[3], ARGV[2], bytes, files, 1)
return {'ok'}
"
    ))
});

/// One chunk, stored only while its upload's reservation holds. KEYS: acct,
/// chunk. ARGV: upload member, bytes, lease ms.
static CHUNK_PUT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
return 1
",
    )
});

/// KEYS: obj, exp, acct, usage. ARGV: name, upload id, chunks, ttl ms,
/// chunk base. `lost` when the reservation or a chunk is gone.
static COMMIT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_OBJS}{}",
        r"
local now = now_ms()
local up, n, ttl, base = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local v = redis.call('HGET', KEYS[3], 'upload:' .. up)
if not v then return {'lost'} end
for i = 0, n - 1 do
  if redis.call('EXISTS', base .. up .. ':' .. i) == 0 then return {'lost'} end
end
redis.call('HDEL', KEYS[3], 'upload:' .. up)
redis.call('ZREM', KEYS[2], 'upload:' .. up)
drop(KEYS[1], KEYS[3], KEYS[4], ARGV[1], base)
local b, f, t = parse(v)
redis.call('HSET', KEYS[1], 't', t, 'b', b, 'f', f, 'n', n, 'u', up)
redis.call('PEXPIRE', KEYS[1], ttl)
for i = 0, n - 1 do redis.call('PEXPIRE', base .. up .. ':' .. i, ttl) end
redis.call('HSET', KEYS[3], ARGV[1], v)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
return {'ok'}
"
    ))
});

/// KEYS: exp, acct, usage. ARGV: upload id, chunks, chunk base, chunk size.
static ABORT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_OBJS}{}",
        r"
forget(KEYS[1], KEYS[2], KEYS[3], 'upload:' .. ARGV[1], ARGV[3], tonumber(ARGV[4]))
del_chunks(ARGV[3], ARGV[1], tonumber(ARGV[2]))
return 1
"
    ))
});

/// KEYS: obj, exp, acct, usage. ARGV: name, chunk base.
static DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_OBJS}{}",
        r"
local had = redis.call('EXISTS', KEYS[1])
drop(KEYS[1], KEYS[3], KEYS[4], ARGV[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[1])
return had
"
    ))
});

/// KEYS: exp, acct, usage. ARGV: tenant, chunk base, chunk size, purge
/// batch. Returns {files, bytes, total} after purging.
static USAGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_OBJS}{}",
        r"
purge(KEYS[1], KEYS[2], KEYS[3], now_ms(), tonumber(ARGV[4]), ARGV[2], tonumber(ARGV[3]))
local f, b, t = held(KEYS[3], ARGV[1])
return {f, b, t}
"
    ))
});

/// KEYS: exp, acct, usage. ARGV: chunk base, chunk size, most to purge.
static PURGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_OBJS}{}",
        r"
return purge(KEYS[1], KEYS[2], KEYS[3], now_ms(), tonumber(ARGV[3]), ARGV[1], tonumber(ARGV[2]))
"
    ))
});

/// The blob store; clones share the chunk connection.
#[derive(Clone)]
pub struct RedisBlobs {
    redis: Redis,
    /// The chunks' own connection, made lazily, dropped after an error.
    chunks: Arc<Mutex<Option<MultiplexedConnection>>>,
}

impl std::fmt::Debug for RedisBlobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBlobs").finish_non_exhaustive()
    }
}

fn unavailable(e: StateError) -> QueueError {
    match e {
        StateError::Unavailable(m) => QueueError::Unavailable(m),
    }
}

fn bad(what: &str) -> QueueError {
    QueueError::Unavailable(format!("redis {what}: unexpected reply"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `{"ok"}`, or `{"refused", files, bytes, total}` as the refusal `admit`
/// gives for that usage.
fn admitted(
    v: Value,
    what: &str,
    blob: &BlobPut<'_>,
    bytes: u64,
    limits: &FileLimits,
) -> Result<(), QueueError> {
    let items = reply::items(v).ok_or_else(|| bad(what))?;
    match items.first().and_then(reply::string).as_deref() {
        Some("ok") => Ok(()),
        Some("refused") => {
            let n = |i: usize| items.get(i).and_then(reply::int).unwrap_or(0).max(0) as u64;
            let usage = Usage {
                files: n(1),
                bytes: n(2),
                total_bytes: n(3),
            };
            quota::admit(limits, blob.tenant, usage, bytes, blob.kind)?;
            // Lua and `admit` disagree only if the limits moved in between.
            Err(bad(what))
        }
        _ => Err(bad(what)),
    }
}

/// Deletes an upload's chunks and returns its room unless disarmed: a
/// failed upload, or one whose caller went away mid-write.
struct PendingUpload {
    blobs: RedisBlobs,
    upload: String,
    chunks: usize,
    /// Past this the chunks expire on their own.
    lease: Duration,
    armed: bool,
}

impl Drop for PendingUpload {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (blobs, upload, chunks) = (self.blobs.clone(), self.upload.clone(), self.chunks);
        let until = tokio::time::Instant::now() + self.lease;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { blobs.abort_until(&upload, chunks, until).await });
        }
    }
}

impl RedisBlobs {
    pub fn new(redis: Redis) -> RedisBlobs {
        RedisBlobs {
            redis,
            chunks: Arc::new(Mutex::new(None)),
        }
    }

    fn key(&self, suffix: &str) -> String {
        self.redis.jobs_key(suffix)
    }

    fn obj_key(&self, name: &str) -> String {
        self.key(&format!("obj:{name}"))
    }

    fn chunk_base(&self) -> String {
        self.key("chunk:")
    }

    fn accounts(&self) -> [String; 3] {
        [
            self.key("objs:exp"),
            self.key("objs:acct"),
            self.key("objs:usage"),
        ]
    }

    /// Stores (or replaces) a blob for its TTL; an upload past a quota is
    /// refused with `QueueError::Quota` and nothing is stored.
    pub async fn put(
        &self,
        blob: &BlobPut<'_>,
        value: &[u8],
        limits: &FileLimits,
    ) -> Result<(), QueueError> {
        if value.len() <= INLINE {
            return self.put_inline(blob, value, limits).await;
        }
        self.put_chunked(blob, value, limits).await
    }

    async fn put_inline(
        &self,
        blob: &BlobPut<'_>,
        value: &[u8],
        limits: &FileLimits,
    ) -> Result<(), QueueError> {
        let [exp, acct, usage] = self.accounts();
        let keys = [self.obj_key(blob.name), exp, acct, usage];
        let bytes = value.len() as u64;
        let args: [Vec<u8>; 13] = [
            blob.name.as_bytes().to_vec(),
            blob.tenant.as_bytes().to_vec(),
            bytes.to_string().into_bytes(),
            blob.kind.files().to_string().into_bytes(),
            enforce(blob.kind),
            limits.max_files_per_tenant.to_string().into_bytes(),
            limits.max_bytes_per_tenant.to_string().into_bytes(),
            limits.max_stored_bytes.to_string().into_bytes(),
            ms(blob.ttl, 1).to_string().into_bytes(),
            value.to_vec(),
            self.chunk_base().into_bytes(),
            CHUNK.to_string().into_bytes(),
            PURGE_BATCH.to_string().into_bytes(),
        ];
        let v: Value = self
            .redis
            .call("blob put", |mut c| async move {
                let mut inv = PUT_INLINE.prepare_invoke();
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
        admitted(v, "blob put", blob, bytes, limits)
    }

    async fn put_chunked(
        &self,
        blob: &BlobPut<'_>,
        value: &[u8],
        limits: &FileLimits,
    ) -> Result<(), QueueError> {
        let upload = format!("{:016x}", rand::random::<u64>());
        let parts: Vec<&[u8]> = value.chunks(CHUNK).collect();
        let lease = limits
            .chunk_timeout
            .saturating_mul(parts.len() as u32)
            .saturating_add(LEASE_SLACK);
        self.reserve(blob, &upload, value.len() as u64, lease, limits)
            .await?;
        let mut pending = PendingUpload {
            blobs: self.clone(),
            upload: upload.clone(),
            chunks: parts.len(),
            lease,
            armed: true,
        };
        let base = format!("{}{upload}:", self.chunk_base());
        let (acct, member) = (self.key("objs:acct"), format!("upload:{upload}"));
        for (i, part) in parts.iter().enumerate() {
            let keys = [acct.clone(), format!("{base}{i}")];
            let (member, part, lease) = (member.clone(), part.to_vec(), ms(lease, 1));
            let stored: i64 = self
                .chunk_call("blob chunk put", limits, |mut c| async move {
                    CHUNK_PUT
                        .key(&keys[..])
                        .arg(member)
                        .arg(part)
                        .arg(lease)
                        .invoke_async(&mut c)
                        .await
                })
                .await?;
            if stored != 1 {
                return Err(QueueError::Unavailable(
                    "redis blob chunk put: the upload's lease ran out before it was stored".into(),
                ));
            }
        }
        self.commit(blob, &upload, parts.len()).await?;
        pending.armed = false;
        Ok(())
    }

    async fn reserve(
        &self,
        blob: &BlobPut<'_>,
        upload: &str,
        bytes: u64,
        lease: Duration,
        limits: &FileLimits,
    ) -> Result<(), QueueError> {
        let keys = self.accounts();
        let args: [Vec<u8>; 12] = [
            upload.as_bytes().to_vec(),
            blob.tenant.as_bytes().to_vec(),
            bytes.to_string().into_bytes(),
            blob.kind.files().to_string().into_bytes(),
            enforce(blob.kind),
            limits.max_files_per_tenant.to_string().into_bytes(),
            limits.max_bytes_per_tenant.to_string().into_bytes(),
            limits.max_stored_bytes.to_string().into_bytes(),
            ms(lease, 1).to_string().into_bytes(),
            self.chunk_base().into_bytes(),
            CHUNK.to_string().into_bytes(),
            PURGE_BATCH.to_string().into_bytes(),
        ];
        let v: Value = self
            .redis
            .call("blob reserve", |mut c| async move {
                let mut inv = RESERVE.prepare_invoke();
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
        admitted(v, "blob reserve", blob, bytes, limits)
    }

    async fn commit(
        &self,
        blob: &BlobPut<'_>,
        upload: &str,
        chunks: usize,
    ) -> Result<(), QueueError> {
        let [exp, acct, usage] = self.accounts();
        let keys = [self.obj_key(blob.name), exp, acct, usage];
        let (name, ttl, base) = (blob.name, ms(blob.ttl, 1), self.chunk_base());
        let v: Value = self
            .redis
            .call("blob commit", |mut c| async move {
                COMMIT
                    .key(&keys[..])
                    .arg(name)
                    .arg(upload)
                    .arg(chunks)
                    .arg(ttl)
                    .arg(base)
                    .invoke_async(&mut c)
                    .await
            })
            .await
            .map_err(unavailable)?;
        let items = reply::items(v).ok_or_else(|| bad("blob commit"))?;
        match items.first().and_then(reply::string).as_deref() {
            Some("ok") => Ok(()),
            Some("lost") => Err(QueueError::Unavailable(
                "redis blob commit: the upload's lease ran out before it was stored".into(),
            )),
            _ => Err(bad("blob commit")),
        }
    }

    /// Aborts an upload, retrying (100 ms, doubling to 2 s) while Redis
    /// does not answer, until `until`.
    async fn abort_until(&self, upload: &str, chunks: usize, until: tokio::time::Instant) {
        let mut wait = Duration::from_millis(100);
        loop {
            match self.abort(upload, chunks).await {
                Ok(()) => return,
                Err(e) if tokio::time::Instant::now() + wait >= until => {
                    tracing::warn!(error = %e, "a failed blob upload could not be cleaned up; its chunks expire with its lease");
                    return;
                }
                Err(_) => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Deletes an upload's chunks and returns its charge.
    async fn abort(&self, upload: &str, chunks: usize) -> Result<(), QueueError> {
        let keys = self.accounts();
        let base = self.chunk_base();
        self.redis
            .call("blob abort", |mut c| async move {
                ABORT
                    .key(&keys[..])
                    .arg(upload)
                    .arg(chunks)
                    .arg(base)
                    .arg(CHUNK)
                    .invoke_async::<i64>(&mut c)
                    .await
            })
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Deletes a blob, its chunks and its charge; `false` if there was none.
    pub async fn delete(&self, name: &str) -> Result<bool, QueueError> {
        let [exp, acct, usage] = self.accounts();
        let keys = [self.obj_key(name), exp, acct, usage];
        let base = self.chunk_base();
        let had: i64 = self
            .redis
            .call("blob delete", |mut c| async move {
                DELETE
                    .key(&keys[..])
                    .arg(name)
                    .arg(base)
                    .invoke_async(&mut c)
                    .await
            })
            .await
            .map_err(unavailable)?;
        Ok(had == 1)
    }

    /// A blob's bytes, unless it expired (or a chunk of it is gone).
    pub async fn get(
        &self,
        name: &str,
        limits: &FileLimits,
    ) -> Result<Option<Vec<u8>>, QueueError> {
        let key = self.obj_key(name);
        let v: Value = self
            .redis
            .call("blob get", |mut c| async move {
                redis::cmd("HGETALL").arg(key).query_async(&mut c).await
            })
            .await
            .map_err(unavailable)?;
        let fields = fields(&v).ok_or_else(|| bad("blob get"))?;
        if fields.is_empty() {
            return self.get_legacy(name).await;
        }
        let field = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v);
        if let Some(data) = field("d") {
            return Ok(Some(data.clone()));
        }
        let text = |k: &str| field(k).map(|b| String::from_utf8_lossy(b).into_owned());
        let (Some(n), Some(upload)) = (text("n").and_then(|n| n.parse::<usize>().ok()), text("u"))
        else {
            return Err(bad("blob get"));
        };
        let bytes = text("b").and_then(|b| b.parse::<usize>().ok()).unwrap_or(0);
        let mut out = Vec::with_capacity(bytes);
        for i in 0..n {
            let key = format!("{}{upload}:{i}", self.chunk_base());
            let part: Option<Vec<u8>> = self
                .chunk_call("blob chunk get", limits, |mut c| async move {
                    redis::cmd("GET").arg(key).query_async(&mut c).await
                })
                .await?;
            let Some(part) = part else {
                return Ok(None);
            };
            out.extend_from_slice(&part);
        }
        Ok(Some(out))
    }

    /// A blob an older version stored as one string.
    async fn get_legacy(&self, name: &str) -> Result<Option<Vec<u8>>, QueueError> {
        let key = self.key(&format!("blob:{name}"));
        self.redis
            .call("blob get", |mut c| async move {
                redis::cmd("GET").arg(key).query_async(&mut c).await
            })
            .await
            .map_err(unavailable)
    }

    /// What `tenant` keeps now, and every tenant together.
    pub async fn usage(&self, tenant: &str) -> Result<Usage, QueueError> {
        let keys = self.accounts();
        let base = self.chunk_base();
        let (files, bytes, total): (i64, i64, i64) = self
            .redis
            .call("blob usage", |mut c| async move {
                USAGE
                    .key(&keys[..])
                    .arg(tenant)
                    .arg(base)
                    .arg(CHUNK)
                    .arg(PURGE_BATCH)
                    .invoke_async(&mut c)
                    .await
            })
            .await
            .map_err(unavailable)?;
        Ok(Usage {
            files: files.max(0) as u64,
            bytes: bytes.max(0) as u64,
            total_bytes: total.max(0) as u64,
        })
    }

    /// Returns the charges of at most `limit` expired blobs and lapsed uploads.
    pub async fn purge(&self, limit: usize) -> Result<usize, QueueError> {
        let keys = self.accounts();
        let base = self.chunk_base();
        let n: i64 = self
            .redis
            .call("blob purge", |mut c| async move {
                PURGE
                    .key(&keys[..])
                    .arg(base)
                    .arg(CHUNK)
                    .arg(limit)
                    .invoke_async(&mut c)
                    .await
            })
            .await
            .map_err(unavailable)?;
        Ok(n.max(0) as usize)
    }

    /// The chunks' connection, or a new one.
    async fn chunk_connection(
        &self,
        timeout: Duration,
    ) -> Result<MultiplexedConnection, QueueError> {
        if let Some(c) = lock(&self.chunks).clone() {
            return Ok(c);
        }
        let config = AsyncConnectionConfig::new().set_connection_timeout(Some(timeout));
        let c = self
            .redis
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(|e| QueueError::Unavailable(format!("redis blob connection: {e}")))?;
        *lock(&self.chunks) = Some(c.clone());
        Ok(c)
    }

    /// One chunk's exchange on the chunks' connection, within
    /// `limits.chunk_timeout` and outside the request path's breaker.
    async fn chunk_call<T, F, Fut>(
        &self,
        what: &'static str,
        limits: &FileLimits,
        f: F,
    ) -> Result<T, QueueError>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: std::future::Future<Output = Result<T, redis::RedisError>>,
    {
        let timeout = limits.chunk_timeout;
        let outcome = tokio::time::timeout(timeout, async {
            let c = self.chunk_connection(timeout).await?;
            f(c).await
                .map_err(|e| QueueError::Unavailable(format!("redis {what}: {e}")))
        })
        .await;
        match outcome {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                *lock(&self.chunks) = None;
                Err(e)
            }
            Err(_) => {
                *lock(&self.chunks) = None;
                Err(QueueError::Unavailable(format!(
                    "redis {what} timed out after {} ms (queue.blob_timeout)",
                    timeout.as_millis()
                )))
            }
        }
    }
}

/// Whether the scripts check the quotas for this kind.
fn enforce(kind: BlobKind) -> Vec<u8> {
    match kind {
        BlobKind::Upload => b"1".to_vec(),
        BlobKind::Owed => b"0".to_vec(),
    }
}

/// A hash reply (flat or as a map) as field/value pairs.
fn fields(v: &Value) -> Option<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    match v {
        Value::Array(items) => {
            for pair in items.chunks(2) {
                if let [k, val] = pair {
                    out.push((reply::string(k)?, reply::bytes(val)?));
                }
            }
        }
        Value::Map(pairs) => {
            for (k, val) in pairs {
                out.push((reply::string(k)?, reply::bytes(val)?));
            }
        }
        Value::Nil => {}
        _ => return None,
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::state::files::quota::Refusal;
    use crate::state::redis::testutil::RedisServer;

    fn limits() -> FileLimits {
        FileLimits {
            max_files_per_tenant: 2,
            max_bytes_per_tenant: 64 << 20,
            max_stored_bytes: 96 << 20,
            chunk_timeout: Duration::from_secs(5),
        }
    }

    fn upload<'a>(name: &'a str, tenant: &'a str) -> BlobPut<'a> {
        BlobPut {
            name,
            tenant,
            kind: BlobKind::Upload,
            ttl: Duration::from_secs(600),
        }
    }

    async fn dbsize(server: &RedisServer) -> i64 {
        server.raw(&["DBSIZE"]).await.unwrap()
    }

    async fn used_memory(server: &RedisServer) -> i64 {
        let info: String = server.raw(&["INFO", "memory"]).await.unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Waits (up to 5 s) until the server holds `keys` keys.
    async fn settle(server: &RedisServer, keys: i64) {
        for _ in 0..100 {
            if dbsize(server).await == keys {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let left: Vec<String> = server.raw(&["KEYS", "*"]).await.unwrap();
        panic!("{} keys left, want {keys}: {left:?}", left.len());
    }

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i % 251) as u8).collect()
    }

    #[tokio::test]
    async fn a_tenant_past_its_file_quota_is_refused_while_another_tenant_stores() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let blobs = RedisBlobs::new(server.client());
        let l = limits();
        blobs.put(&upload("a1", "a"), b"one", &l).await.unwrap();
        blobs
            .put(&upload("a2", "a"), &data(200_000), &l)
            .await
            .unwrap();
        let before = dbsize(&server).await;
        for (name, n) in [("a3", 10), ("a4", 200_000)] {
            let refused = blobs
                .put(&upload(name, "a"), &data(n), &l)
                .await
                .unwrap_err();
            assert!(
                matches!(
                    refused,
                    QueueError::Quota(Refusal::Files {
                        files: 2,
                        limit: 2,
                        ..
                    })
                ),
                "{refused}"
            );
            assert_eq!(blobs.get(name, &l).await.unwrap(), None);
        }
        assert_eq!(
            dbsize(&server).await,
            before,
            "a refused upload stores nothing"
        );
        blobs.put(&upload("b1", "b"), b"fine", &l).await.unwrap();
        let owed = BlobPut {
            kind: BlobKind::Owed,
            ..upload("a-out", "a")
        };
        blobs.put(&owed, b"output", &l).await.unwrap();
        let u = blobs.usage("a").await.unwrap();
        assert_eq!((u.files, u.bytes), (2, 3 + 200_000 + 6));
        assert_eq!(u.total_bytes, 3 + 200_000 + 6 + 4);
        // Bytes bound uploads too; the budget bounds every tenant together.
        let tight = FileLimits {
            max_files_per_tenant: 10,
            max_bytes_per_tenant: 200_100,
            max_stored_bytes: 200_120,
            ..l
        };
        assert!(matches!(
            blobs.put(&upload("a5", "a"), &data(100), &tight).await,
            Err(QueueError::Quota(Refusal::Bytes { .. }))
        ));
        assert!(matches!(
            blobs.put(&upload("c1", "c"), &data(200), &tight).await,
            Err(QueueError::Quota(Refusal::Budget { .. }))
        ));
        // Deleting returns the charge.
        assert!(blobs.delete("a2").await.unwrap());
        assert_eq!(blobs.usage("a").await.unwrap().files, 1);
    }

    #[tokio::test]
    async fn a_40_mb_blob_travels_in_chunks_past_the_call_timeout_and_comes_back_whole() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let redis = server.client();
        let blobs = RedisBlobs::new(redis.clone());
        let l = limits();
        let big = data(40_000_000);
        blobs.put(&upload("big", "a"), &big, &l).await.unwrap();
        let back = blobs.get("big", &l).await.unwrap().unwrap();
        assert!(back == big, "the blob comes back whole");
        let chunks = big.len().div_ceil(CHUNK) as i64;
        // The blob's hash, its chunks, and the three accounting keys.
        assert_eq!(dbsize(&server).await, 1 + chunks + 3);
        let names: Vec<String> = server
            .raw(&["KEYS", "switchyard:{jobs}:chunk:*"])
            .await
            .unwrap();
        assert_eq!(names.len() as i64, chunks);
        let ttl: i64 = server.raw(&["PTTL", &names[0]]).await.unwrap();
        assert!(
            ttl > 590_000 && ttl <= 600_000,
            "chunks live as long as the blob: {ttl}"
        );
        assert!(redis.is_healthy());
        assert_eq!(redis.errors_total(), 0, "no request-path call failed");
        assert_eq!(blobs.usage("a").await.unwrap().bytes, 40_000_000);
        // Replaced: the old chunks go.
        blobs
            .put(&upload("big", "a"), b"small now", &l)
            .await
            .unwrap();
        assert_eq!(dbsize(&server).await, 1 + 3);
        assert_eq!(blobs.usage("a").await.unwrap().bytes, 9);
    }

    #[tokio::test]
    async fn an_upload_redis_cannot_hold_fails_leaves_nothing_and_keeps_the_breaker_closed() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let redis = server.client();
        let blobs = RedisBlobs::new(redis.clone());
        let l = limits();
        blobs.put(&upload("small", "a"), b"kept", &l).await.unwrap();
        let (keys, memory) = (dbsize(&server).await, used_memory(&server).await);
        let cap = (memory + (8 << 20)).to_string();
        let _: () = server
            .raw(&["CONFIG", "SET", "maxmemory", &cap])
            .await
            .unwrap();
        let failed = blobs
            .put(&upload("big", "a"), &data(40_000_000), &l)
            .await
            .unwrap_err();
        assert!(failed.to_string().contains("OOM"), "{failed}");
        settle(&server, keys).await;
        let after = used_memory(&server).await;
        assert!(
            after < memory + (1 << 20),
            "memory back: {memory} -> {after}"
        );
        assert_eq!(
            blobs.usage("a").await.unwrap().bytes,
            4,
            "the charge is returned"
        );
        assert!(
            redis.is_healthy(),
            "chunk failures do not trip the request path's breaker"
        );
        assert_eq!(redis.errors_total(), 0);
        assert_eq!(blobs.get("small", &l).await.unwrap().unwrap(), b"kept");
    }

    #[tokio::test]
    async fn a_full_redis_refuses_a_blob_before_it_changes_anything() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let blobs = RedisBlobs::new(server.client());
        let l = limits();
        blobs.put(&upload("kept", "a"), b"kept", &l).await.unwrap();
        let keys = dbsize(&server).await;
        let _: () = server
            .raw(&["CONFIG", "SET", "maxmemory", "1"])
            .await
            .unwrap();
        // Small (one script) and big (reserve, chunks, commit) alike.
        for (name, n) in [("small", 10), ("big", 2_000_000)] {
            let refused = blobs
                .put(&upload(name, "b"), &data(n), &l)
                .await
                .unwrap_err();
            assert!(refused.to_string().contains("OOM"), "{refused}");
        }
        assert_eq!(dbsize(&server).await, keys, "nothing was written");
        let _: () = server
            .raw(&["CONFIG", "SET", "maxmemory", "0"])
            .await
            .unwrap();
        assert_eq!(
            blobs.usage("b").await.unwrap(),
            Usage {
                total_bytes: 4,
                ..Usage::default()
            }
        );
        assert_eq!(blobs.get("kept", &l).await.unwrap().unwrap(), b"kept");
    }

    #[tokio::test]
    async fn an_upload_abandoned_mid_write_is_deleted() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let blobs = RedisBlobs::new(server.client());
        let l = limits();
        let big = data(40_000_000);
        let blob = upload("big", "a");
        let put = blobs.put(&blob, &big, &l);
        let started = async {
            while dbsize(&server).await < 4 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        };
        tokio::select! {
            done = put => panic!("the upload finished before it was abandoned: {done:?}"),
            _ = started => {}
        }
        settle(&server, 0).await;
        assert_eq!(blobs.usage("a").await.unwrap(), Usage::default());
    }

    #[tokio::test]
    async fn an_expired_blob_returns_its_charge() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let blobs = RedisBlobs::new(server.client());
        let l = limits();
        let short = BlobPut {
            ttl: Duration::from_millis(100),
            ..upload("a1", "a")
        };
        blobs.put(&short, &data(100_000), &l).await.unwrap();
        blobs.put(&upload("a2", "a"), b"x", &l).await.unwrap();
        assert!(matches!(
            blobs.put(&upload("a3", "a"), b"x", &l).await,
            Err(QueueError::Quota(_))
        ));
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(blobs.get("a1", &l).await.unwrap(), None);
        blobs.put(&upload("a3", "a"), b"x", &l).await.unwrap();
        let u = blobs.usage("a").await.unwrap();
        assert_eq!((u.files, u.bytes), (2, 2));
        assert_eq!(
            blobs.purge(10).await.unwrap(),
            0,
            "already purged by the store"
        );
    }
}
