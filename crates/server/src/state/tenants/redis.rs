//! Fleet-wide tenant admission. Concurrency is a sorted set of slot ids
//! scored by lease expiry (`{t:<tenant>}:slots`), renewed while a request
//! lives, so a dead replica's slot lapses within its lease; the rate is a
//! token bucket in a hash (`:rate`: `tokens`, `last` ms). One script checks
//! both and takes nothing unless both pass.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::TenantDecision;
use crate::policy::token_bucket::TokenBucketConfig;
use crate::state::redis::{bad_reply, ms, num, reply, Redis, LUA_BUCKET, LUA_NOW};
use crate::state::StateError;

/// KEYS: slots, rate. ARGV: slot id, max concurrent, has rate, rate, burst, slot ttl ms.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_BUCKET}{}",
        r"
local now = now_ms()
local max = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if max > 0 and redis.call('ZCARD', KEYS[1]) >= max then
  return {'concurrency'}
end
if ARGV[3] == '1' then
  local wait = bucket_take(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]), now, false)
  if wait > 0 then return {'rate', wait} end
  bucket_take(KEYS[2], tonumber(ARGV[4]), tonumber(ARGV[5]), now, true)
end
if max > 0 then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[6]), ARGV[1])
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2])))
end
return {'ok'}
"
    ))
});

/// KEYS: slots. ARGV: slot id.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
return redis.call('ZREM', KEYS[1], ARGV[1])
",
    )
});

/// KEYS: slots. ARGV: slot id, lease ms. 0 when the slot is gone (released,
/// or lapsed): a renewal racing its release never brings it back.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{}",
        r"
local now = now_ms()
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not held or tonumber(held) <= now then return 0 end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], math.ceil(tonumber(last[2])))
return 1
"
    ))
});

impl Redis {
    /// Admits one request of `tenant` under its fleet-wide concurrency
    /// (`max_concurrent`, 0 = unlimited) and rate; the slot lapses after `slot_ttl`.
    pub async fn tenant_acquire(
        &self,
        tenant: &str,
        slot_id: &str,
        max_concurrent: u32,
        rate: Option<TokenBucketConfig>,
        slot_ttl: Duration,
    ) -> Result<TenantDecision, StateError> {
        let slots = self.tenant_key(tenant, "slots");
        let bucket = self.tenant_key(tenant, "rate");
        let (has_rate, per_s, burst) = match &rate {
            Some(c) => ("1", c.rate, c.burst),
            None => ("0", 0.0, 0),
        };
        let v: Value = self
            .call("tenant_acquire", |mut c| async move {
                ACQUIRE
                    .key(slots)
                    .key(bucket)
                    .arg(slot_id)
                    .arg(max_concurrent)
                    .arg(has_rate)
                    .arg(num(per_s))
                    .arg(burst)
                    .arg(ms(slot_ttl, 1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let items = reply::items(v).ok_or_else(|| bad_reply("tenant_acquire"))?;
        match items.first().and_then(reply::string).as_deref() {
            Some("ok") => Ok(TenantDecision::Admitted),
            Some("concurrency") => Ok(TenantDecision::Concurrency),
            Some("rate") => {
                let wait = items
                    .get(1)
                    .and_then(reply::int)
                    .ok_or_else(|| bad_reply("tenant_acquire"))?;
                Ok(TenantDecision::Rate {
                    retry_after: Duration::from_millis(wait.max(1) as u64),
                })
            }
            _ => Err(bad_reply("tenant_acquire")),
        }
    }

    /// Extends the slot's lease to `lease` from now; false when the slot is
    /// gone (released or lapsed).
    pub async fn tenant_renew(
        &self,
        tenant: &str,
        slot_id: &str,
        lease: Duration,
    ) -> Result<bool, StateError> {
        let slots = self.tenant_key(tenant, "slots");
        let held: i64 = self
            .call("tenant_renew", |mut c| async move {
                RENEW
                    .key(slots)
                    .arg(slot_id)
                    .arg(ms(lease, 1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(held == 1)
    }

    /// Frees the slot (a no-op if it lapsed).
    pub async fn tenant_release(&self, tenant: &str, slot_id: &str) -> Result<(), StateError> {
        let slots = self.tenant_key(tenant, "slots");
        let _: i64 = self
            .call("tenant_release", |mut c| async move {
                RELEASE.key(slots).arg(slot_id).invoke_async(&mut c).await
            })
            .await?;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::state::redis::testutil::RedisServer;

    const SLOT_TTL: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn concurrency_is_fleet_wide_and_release_frees_a_slot() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let a = server.client();
        let b = server.client();
        assert_eq!(
            a.tenant_acquire("t", "s1", 2, None, SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Admitted
        );
        assert_eq!(
            b.tenant_acquire("t", "s2", 2, None, SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Admitted
        );
        assert_eq!(
            a.tenant_acquire("t", "s3", 2, None, SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Concurrency
        );
        assert_eq!(
            b.tenant_acquire("u", "s3", 2, None, SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Admitted,
            "another tenant has its own slots"
        );
        b.tenant_release("t", "s1").await.unwrap();
        assert_eq!(
            a.tenant_acquire("t", "s3", 2, None, SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Admitted
        );
        // Unlimited stores nothing.
        for i in 0..5 {
            assert_eq!(
                a.tenant_acquire("free", &format!("x{i}"), 0, None, SLOT_TTL)
                    .await
                    .unwrap(),
                TenantDecision::Admitted
            );
        }
        let n: i64 = server
            .raw(&["EXISTS", "switchyard:{t:free}:slots"])
            .await
            .unwrap();
        assert_eq!(n, 0);
        // A dead replica's slot lapses.
        let short = Duration::from_millis(200);
        assert_eq!(
            a.tenant_acquire("d", "dead", 1, None, short).await.unwrap(),
            TenantDecision::Admitted
        );
        assert_eq!(
            b.tenant_acquire("d", "live", 1, None, short).await.unwrap(),
            TenantDecision::Concurrency
        );
        tokio::time::sleep(short + Duration::from_millis(50)).await;
        assert_eq!(
            b.tenant_acquire("d", "live", 1, None, short).await.unwrap(),
            TenantDecision::Admitted
        );
    }

    #[tokio::test]
    async fn a_renewed_slot_outlives_its_lease_and_an_unrenewed_one_lapses() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let lease = Duration::from_secs(1);
        for id in ["renewed", "dead"] {
            assert_eq!(
                r.tenant_acquire("t", id, 2, None, lease).await.unwrap(),
                TenantDecision::Admitted
            );
        }
        for _ in 0..5 {
            tokio::time::sleep(lease / 4).await;
            assert!(r.tenant_renew("t", "renewed", lease).await.unwrap());
        }
        assert!(
            !r.tenant_renew("t", "dead", lease).await.unwrap(),
            "a lapsed slot is not brought back"
        );
        assert_eq!(
            r.tenant_acquire("t", "new", 2, None, lease).await.unwrap(),
            TenantDecision::Admitted,
            "the unrenewed slot lapsed"
        );
        assert_eq!(
            r.tenant_acquire("t", "more", 2, None, lease).await.unwrap(),
            TenantDecision::Concurrency,
            "the renewed one is still held"
        );
        let ttl: i64 = server
            .raw(&["PTTL", "switchyard:{t:t}:slots"])
            .await
            .unwrap();
        assert!(ttl > 0 && ttl <= 1000, "{ttl}");
        r.tenant_release("t", "renewed").await.unwrap();
        assert!(
            !r.tenant_renew("t", "renewed", lease).await.unwrap(),
            "a released slot is not brought back"
        );
    }

    #[tokio::test]
    async fn the_rate_is_fleet_wide_and_a_refusal_takes_nothing() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let a = server.client();
        let b = server.client();
        // One token a minute, burst 3: three admitted across both clients.
        let rate = Some(TokenBucketConfig {
            rate: 1.0 / 60.0,
            burst: 3,
        });
        let mut admitted = 0;
        for i in 0..6 {
            let r = if i % 2 == 0 { &a } else { &b };
            match r
                .tenant_acquire("t", &format!("s{i}"), 0, rate.clone(), SLOT_TTL)
                .await
                .unwrap()
            {
                TenantDecision::Admitted => admitted += 1,
                TenantDecision::Rate { retry_after } => {
                    assert!(
                        retry_after > Duration::from_secs(55)
                            && retry_after <= Duration::from_secs(60),
                        "{retry_after:?}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(admitted, 3);
        // Concurrency is checked first and a refusal takes no token.
        let rate2 = Some(TokenBucketConfig {
            rate: 1.0 / 60.0,
            burst: 1,
        });
        assert_eq!(
            a.tenant_acquire("c", "s1", 1, rate2.clone(), SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Admitted
        );
        assert_eq!(
            b.tenant_acquire("c", "s2", 1, rate2.clone(), SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Concurrency
        );
        a.tenant_release("c", "s1").await.unwrap();
        assert!(matches!(
            b.tenant_acquire("c", "s2", 1, rate2.clone(), SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Rate { .. }
        ));
        // A rate refusal stores no slot.
        let r = Some(TokenBucketConfig {
            rate: 0.001,
            burst: 1,
        });
        assert_eq!(
            a.tenant_acquire("e", "s1", 5, r.clone(), SLOT_TTL)
                .await
                .unwrap(),
            TenantDecision::Admitted
        );
        assert!(matches!(
            a.tenant_acquire("e", "s2", 5, r, SLOT_TTL).await.unwrap(),
            TenantDecision::Rate { .. }
        ));
        let n: i64 = server
            .raw(&["ZCARD", "switchyard:{t:e}:slots"])
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
}
