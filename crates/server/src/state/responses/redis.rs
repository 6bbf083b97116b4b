//! Stored responses on Redis, in the tenant's hash slot: one hash per
//! response (`{t:<tenant>}:resp:<id>`, fields `body` and `done`, expiring
//! with `responses.ttl`), an index of the tenant's responses by expiry
//! (`{t:<tenant>}:resp:index`, a sorted set) and their sizes with the total
//! (`{t:<tenant>}:resp:sizes`, a hash with field `_total`). Every write
//! first drops up to 200 lapsed index entries, so the index stays within
//! `max_per_tenant` (plus what lapsed since the last write) and the byte
//! total matches the live records; both index keys expire with the newest
//! record.

use std::sync::LazyLock;

use redis::{Script, Value};

use super::{Bounds, Finish, Full, Put};
use crate::state::redis::{bad_reply, ms, reply, Redis, LUA_NOW};
use crate::state::StateError;

/// Drops lapsed entries from the index (KEYS[2]) and sizes (KEYS[3]).
const PRUNE: &str = r"
local function prune(now)
  local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, 200)
  for _, id in ipairs(old) do
    local b = tonumber(redis.call('HGET', KEYS[3], id) or '0')
    redis.call('HDEL', KEYS[3], id)
    redis.call('HINCRBY', KEYS[3], '_total', -b)
    redis.call('ZREM', KEYS[2], id)
  end
end
";

/// KEYS: record, index, sizes. ARGV: id, body, done (0/1), ttl ms,
/// max count, max bytes. The bound checks are `super::room`'s.
static PUT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{PRUNE}
local now = now_ms()
prune(now)
local size = string.len(ARGV[2])
local prev = redis.call('HGET', KEYS[3], ARGV[1])
local count = redis.call('ZCARD', KEYS[2])
local total = tonumber(redis.call('HGET', KEYS[3], '_total') or '0')
if not prev and count >= tonumber(ARGV[5]) then return {{'count', count}} end
if total - tonumber(prev or '0') + size > tonumber(ARGV[6]) then return {{'bytes', total}} end
local ttl = tonumber(ARGV[4])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'body', ARGV[2], 'done', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now + ttl, ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], size)
redis.call('HINCRBY', KEYS[3], '_total', size - tonumber(prev or '0'))
redis.call('PEXPIRE', KEYS[2], ttl)
redis.call('PEXPIRE', KEYS[3], ttl)
return {{'ok'}}
"
    ))
});

/// KEYS: record, index, sizes. ARGV: id, body. Replaces a record that is
/// not done (keeping its expiry) and marks it done.
static FINISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local done = redis.call('HGET', KEYS[1], 'done')
if not done then return 'gone' end
if done == '1' then return 'done' end
local size = string.len(ARGV[2])
local prev = tonumber(redis.call('HGET', KEYS[3], ARGV[1]) or '0')
redis.call('HSET', KEYS[1], 'body', ARGV[2], 'done', '1')
redis.call('HSET', KEYS[3], ARGV[1], size)
redis.call('HINCRBY', KEYS[3], '_total', size - prev)
return 'ok'
",
    )
});

/// KEYS: record, index, sizes. ARGV: id.
static DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local existed = redis.call('DEL', KEYS[1])
local b = redis.call('HGET', KEYS[3], ARGV[1])
if b then
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('HINCRBY', KEYS[3], '_total', -tonumber(b))
end
redis.call('ZREM', KEYS[2], ARGV[1])
return existed
",
    )
});

/// KEYS: record (unused), index, sizes. The live count and bytes.
static USAGE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{PRUNE}
prune(now_ms())
return {{redis.call('ZCARD', KEYS[2]), tonumber(redis.call('HGET', KEYS[3], '_total') or '0')}}
"
    ))
});

impl Redis {
    /// The record, index and sizes keys of one tenant's response.
    fn response_keys(&self, tenant: &str, id: &str) -> [String; 3] {
        [
            self.tenant_key(tenant, &format!("resp:{id}")),
            self.tenant_key(tenant, "resp:index"),
            self.tenant_key(tenant, "resp:sizes"),
        ]
    }

    pub async fn responses_put(
        &self,
        tenant: &str,
        id: &str,
        body: &[u8],
        done: bool,
        bounds: &Bounds,
    ) -> Result<Put, StateError> {
        let keys = self.response_keys(tenant, id);
        let v: Value = self
            .call("responses_put", |mut c| async move {
                PUT.key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .arg(id)
                    .arg(body)
                    .arg(if done { "1" } else { "0" })
                    .arg(ms(bounds.ttl, 1))
                    .arg(bounds.max_count)
                    .arg(bounds.max_bytes)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let items = reply::items(v).ok_or_else(|| bad_reply("responses_put"))?;
        let held = || {
            items
                .get(1)
                .and_then(reply::int)
                .map(|n| n.max(0) as u64)
                .ok_or_else(|| bad_reply("responses_put"))
        };
        match items.first().and_then(reply::string).as_deref() {
            Some("ok") => Ok(Put::Stored),
            Some("count") => Ok(Put::Refused(Full::Count { count: held()? })),
            Some("bytes") => Ok(Put::Refused(Full::Bytes { bytes: held()? })),
            _ => Err(bad_reply("responses_put")),
        }
    }

    pub async fn responses_finish(
        &self,
        tenant: &str,
        id: &str,
        body: &[u8],
    ) -> Result<Finish, StateError> {
        let keys = self.response_keys(tenant, id);
        let v: String = self
            .call("responses_finish", |mut c| async move {
                FINISH
                    .key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .arg(id)
                    .arg(body)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        match v.as_str() {
            "ok" => Ok(Finish::Finished),
            "done" => Ok(Finish::AlreadyDone),
            "gone" => Ok(Finish::Gone),
            _ => Err(bad_reply("responses_finish")),
        }
    }

    pub async fn responses_get(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<Vec<u8>>, StateError> {
        let [record, ..] = self.response_keys(tenant, id);
        let v: Value = self
            .call("responses_get", |mut c| async move {
                redis::cmd("HGET")
                    .arg(&record)
                    .arg("body")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(match v {
            Value::Nil => None,
            other => Some(reply::bytes(&other).ok_or_else(|| bad_reply("responses_get"))?),
        })
    }

    pub async fn responses_delete(&self, tenant: &str, id: &str) -> Result<bool, StateError> {
        let keys = self.response_keys(tenant, id);
        let n: i64 = self
            .call("responses_delete", |mut c| async move {
                DELETE
                    .key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .arg(id)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(n == 1)
    }

    /// The tenant's live records and their bytes.
    pub async fn responses_usage(&self, tenant: &str) -> Result<(u64, u64), StateError> {
        let keys = self.response_keys(tenant, "");
        let v: Value = self
            .call("responses_usage", |mut c| async move {
                USAGE
                    .key(&keys[0])
                    .key(&keys[1])
                    .key(&keys[2])
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let items = reply::items(v).ok_or_else(|| bad_reply("responses_usage"))?;
        let n = |i: usize| {
            items
                .get(i)
                .and_then(reply::int)
                .map(|n| n.max(0) as u64)
                .ok_or_else(|| bad_reply("responses_usage"))
        };
        Ok((n(0)?, n(1)?))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::state::redis::testutil::RedisServer;

    fn bounds(ttl: Duration) -> Bounds {
        Bounds {
            ttl,
            max_count: 2,
            max_bytes: 10,
        }
    }

    #[tokio::test]
    async fn records_are_bounded_per_tenant_and_scoped_by_it() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let b = bounds(Duration::from_secs(60));
        assert_eq!(
            r.responses_put("a", "r1", b"1234", true, &b).await.unwrap(),
            Put::Stored
        );
        assert_eq!(
            r.responses_put("a", "r2", b"1234567", true, &b)
                .await
                .unwrap(),
            Put::Refused(Full::Bytes { bytes: 4 })
        );
        assert_eq!(
            r.responses_put("a", "r2", b"12", true, &b).await.unwrap(),
            Put::Stored
        );
        assert_eq!(
            r.responses_put("a", "r3", b"1", true, &b).await.unwrap(),
            Put::Refused(Full::Count { count: 2 })
        );
        assert_eq!(r.responses_usage("a").await.unwrap(), (2, 6));
        // Another tenant sees nothing of a's and has bounds of its own.
        assert_eq!(r.responses_get("b", "r1").await.unwrap(), None);
        assert!(!r.responses_delete("b", "r1").await.unwrap());
        assert_eq!(
            r.responses_put("b", "r3", b"1", true, &b).await.unwrap(),
            Put::Stored
        );
        assert!(r.responses_delete("a", "r1").await.unwrap());
        assert_eq!(r.responses_usage("a").await.unwrap(), (1, 2));
        assert_eq!(
            r.responses_get("a", "r2").await.unwrap().as_deref(),
            Some(&b"12"[..])
        );
        // The record carries its TTL; the keys sit in the tenant's slot.
        let pttl: i64 = server
            .raw(&["PTTL", "switchyard:{t:a}:resp:r2"])
            .await
            .unwrap();
        assert!(pttl > 50_000 && pttl <= 60_000, "{pttl}");
    }

    #[tokio::test]
    async fn lapsed_records_leave_the_index_and_the_first_finish_wins() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let short = bounds(Duration::from_millis(50));
        r.responses_put("a", "r1", b"12345", true, &short)
            .await
            .unwrap();
        r.responses_put("a", "r2", b"12345", true, &short)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(120)).await;
        assert_eq!(r.responses_get("a", "r1").await.unwrap(), None);
        assert_eq!(
            r.responses_usage("a").await.unwrap(),
            (0, 0),
            "the index forgets lapsed records"
        );
        let b = bounds(Duration::from_secs(60));
        r.responses_put("a", "bg", b"q", false, &b).await.unwrap();
        assert_eq!(
            r.responses_finish("a", "bg", b"done").await.unwrap(),
            Finish::Finished
        );
        assert_eq!(
            r.responses_finish("a", "bg", b"late").await.unwrap(),
            Finish::AlreadyDone
        );
        assert_eq!(
            r.responses_get("a", "bg").await.unwrap().as_deref(),
            Some(&b"done"[..])
        );
        assert_eq!(r.responses_usage("a").await.unwrap(), (1, 4));
        assert_eq!(
            r.responses_finish("b", "bg", b"x").await.unwrap(),
            Finish::Gone
        );
    }
}
