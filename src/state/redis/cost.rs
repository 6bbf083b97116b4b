//! The fleet cost ledger: a sliding window of charges per tenant (a sorted
//! set scored by time, members `<amount>|<nonce>`) and live reservations (a
//! hash `id -> "<expiry ms> <amount>"`). Reserve and settle are one script
//! each, so replicas never both squeeze under the cap; a reservation expires
//! after its hold, so a replica that died mid-request cannot pin the cap.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::{bad_reply, ms, num, reply, Redis, LUA_NOW};
use crate::state::{CostDecision, StateError};

/// Lua shared by the cost scripts: drop old charges, sum what is left.
const LUA_SPENT: &str = r"
local function spent_in_window(charges, now, window)
  redis.call('ZREMRANGEBYSCORE', charges, '-inf', now - window)
  local spent = 0
  for _, m in ipairs(redis.call('ZRANGE', charges, 0, -1)) do
    spent = spent + (tonumber(string.match(m, '^[^|]*')) or 0)
  end
  return spent
end
";

/// KEYS: charges, reservations. ARGV: id, amount, cap, window ms, hold ms.
static RESERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_SPENT}{}",
        r"
local now = now_ms()
local amount = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local hold = tonumber(ARGV[5])
local spent = spent_in_window(KEYS[1], now, window)
local reserved = 0
local res = redis.call('HGETALL', KEYS[2])
for i = 1, #res, 2 do
  local exp, amt = string.match(res[i + 1], '^(%S+) (%S+)$')
  exp = tonumber(exp)
  amt = tonumber(amt)
  if exp == nil or amt == nil or exp <= now then
    redis.call('HDEL', KEYS[2], res[i])
  elseif res[i] ~= ARGV[1] then
    reserved = reserved + amt
  end
end
if spent + reserved + amount > cap + 1e-9 then
  local retry = window
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if oldest[2] then retry = math.ceil(tonumber(oldest[2]) + window - now) end
  if retry > window then retry = window end
  if retry < 1 then retry = 1 end
  return {'over', string.format('%.17g', spent), string.format('%.17g', reserved), retry}
end
redis.call('HSET', KEYS[2], ARGV[1], tostring(now + hold) .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[2], window + hold)
redis.call('PEXPIRE', KEYS[1], window + hold)
return {'ok'}
"
    ))
});

/// KEYS: charges, reservations. ARGV: id, actual, window ms, nonce.
static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{}",
        r"
local now = now_ms()
local window = tonumber(ARGV[3])
redis.call('HDEL', KEYS[2], ARGV[1])
local actual = tonumber(ARGV[2]) or 0
if actual > 0 then
  redis.call('ZADD', KEYS[1], now, ARGV[2] .. '|' .. ARGV[4])
  if redis.call('PTTL', KEYS[1]) < window then
    redis.call('PEXPIRE', KEYS[1], window)
  end
end
return 1
"
    ))
});

/// KEYS: charges. ARGV: window ms.
static SPENT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_SPENT}{}",
        r"
return string.format('%.17g', spent_in_window(KEYS[1], now_ms(), tonumber(ARGV[1])))
"
    ))
});

impl Redis {
    /// Holds `amount_usd` against the tenant's cap for at most `hold`, unless
    /// charges in the window plus live holds plus this would pass `cap_usd`.
    pub async fn cost_reserve(
        &self,
        tenant: &str,
        reservation_id: &str,
        amount_usd: f64,
        cap_usd: f64,
        window: Duration,
        hold: Duration,
    ) -> Result<CostDecision, StateError> {
        let charges = self.tenant_key(tenant, "cost");
        let reservations = self.tenant_key(tenant, "cost:res");
        let v: Value = self
            .call("cost_reserve", |mut c| async move {
                RESERVE
                    .key(charges)
                    .key(reservations)
                    .arg(reservation_id)
                    .arg(num(amount_usd.max(0.0)))
                    .arg(num(cap_usd))
                    .arg(ms(window, 1))
                    .arg(ms(hold, 1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let items = reply::items(v).ok_or_else(|| bad_reply("cost_reserve"))?;
        match items.first().and_then(reply::string).as_deref() {
            Some("ok") => Ok(CostDecision::Reserved),
            Some("over") => {
                let field = |i: usize| items.get(i).ok_or_else(|| bad_reply("cost_reserve"));
                let spent = reply::float(field(1)?).ok_or_else(|| bad_reply("cost_reserve"))?;
                let reserved = reply::float(field(2)?).ok_or_else(|| bad_reply("cost_reserve"))?;
                let retry = reply::int(field(3)?).ok_or_else(|| bad_reply("cost_reserve"))?;
                Ok(CostDecision::OverCap {
                    spent_usd: spent,
                    reserved_usd: reserved,
                    retry_in: Duration::from_millis(retry.max(1) as u64),
                })
            }
            _ => Err(bad_reply("cost_reserve")),
        }
    }

    /// Drops the reservation and records what was actually spent (also when
    /// the reservation is unknown or expired: the money was spent).
    pub async fn cost_settle(
        &self,
        tenant: &str,
        reservation_id: &str,
        actual_usd: f64,
        window: Duration,
    ) -> Result<(), StateError> {
        let charges = self.tenant_key(tenant, "cost");
        let reservations = self.tenant_key(tenant, "cost:res");
        let nonce = format!("{:016x}", rand::random::<u64>());
        let _: Value = self
            .call("cost_settle", |mut c| async move {
                SETTLE
                    .key(charges)
                    .key(reservations)
                    .arg(reservation_id)
                    .arg(num(actual_usd.max(0.0)))
                    .arg(ms(window, 1))
                    .arg(nonce)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(())
    }

    /// Charges in the window (reservations not included).
    pub async fn cost_spent(&self, tenant: &str, window: Duration) -> Result<f64, StateError> {
        let charges = self.tenant_key(tenant, "cost");
        let v: Value = self
            .call("cost_spent", |mut c| async move {
                SPENT
                    .key(charges)
                    .arg(ms(window, 1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        reply::float(&v).ok_or_else(|| bad_reply("cost_spent"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::testutil::RedisServer;
    use super::*;

    const WINDOW: Duration = Duration::from_secs(60);
    const HOLD: Duration = Duration::from_secs(30);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn twenty_concurrent_reserves_from_two_clients_admit_exactly_five() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let a = server.client();
        let b = server.client();
        let mut tasks = Vec::new();
        for i in 0..20 {
            let r = if i % 2 == 0 { a.clone() } else { b.clone() };
            tasks.push(tokio::spawn(async move {
                r.cost_reserve("acme", &format!("r{i}"), 1.0, 5.0, WINDOW, HOLD)
                    .await
                    .unwrap()
            }));
        }
        let mut reserved = 0;
        let mut over = 0;
        for t in tasks {
            match t.await.unwrap() {
                CostDecision::Reserved => reserved += 1,
                CostDecision::OverCap {
                    spent_usd,
                    reserved_usd,
                    retry_in,
                } => {
                    assert_eq!(spent_usd, 0.0);
                    assert_eq!(reserved_usd, 5.0);
                    assert_eq!(retry_in, WINDOW, "no charge yet: the whole window");
                    over += 1;
                }
            }
        }
        assert_eq!((reserved, over), (5, 15));
        assert_eq!(a.cost_spent("acme", WINDOW).await.unwrap(), 0.0);
        assert_eq!(
            b.cost_spent("other", WINDOW).await.unwrap(),
            0.0,
            "tenants are apart"
        );
    }

    #[tokio::test]
    async fn settling_lower_frees_room_and_charges_count_until_they_leave_the_window() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        for i in 0..5 {
            let d = r
                .cost_reserve("t", &format!("r{i}"), 1.0, 5.0, WINDOW, HOLD)
                .await
                .unwrap();
            assert_eq!(d, CostDecision::Reserved);
        }
        assert!(matches!(
            r.cost_reserve("t", "r5", 1.0, 5.0, WINDOW, HOLD)
                .await
                .unwrap(),
            CostDecision::OverCap { .. }
        ));
        // r0 cost only a quarter of what it held.
        r.cost_settle("t", "r0", 0.25, WINDOW).await.unwrap();
        assert_eq!(r.cost_spent("t", WINDOW).await.unwrap(), 0.25);
        assert_eq!(
            r.cost_reserve("t", "r5", 0.75, 5.0, WINDOW, HOLD)
                .await
                .unwrap(),
            CostDecision::Reserved,
            "0.25 + 4 held + 0.75 is exactly the cap"
        );
        match r
            .cost_reserve("t", "r6", 0.01, 5.0, WINDOW, HOLD)
            .await
            .unwrap()
        {
            CostDecision::OverCap {
                spent_usd,
                reserved_usd,
                retry_in,
            } => {
                assert_eq!(spent_usd, 0.25);
                assert_eq!(reserved_usd, 4.75);
                assert!(retry_in <= WINDOW && retry_in > WINDOW - Duration::from_secs(5));
            }
            other => panic!("{other:?}"),
        }
        // An unknown reservation still records the money spent.
        r.cost_settle("t", "never-reserved", 0.5, WINDOW)
            .await
            .unwrap();
        assert_eq!(r.cost_spent("t", WINDOW).await.unwrap(), 0.75);
        // A short window: the charges leave it.
        let short = Duration::from_millis(300);
        r.cost_settle("s", "x", 2.0, short).await.unwrap();
        match r
            .cost_reserve("s", "y", 1.0, 2.5, short, HOLD)
            .await
            .unwrap()
        {
            CostDecision::OverCap { retry_in, .. } => {
                assert!(retry_in <= short && retry_in >= Duration::from_millis(1))
            }
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(short + Duration::from_millis(50)).await;
        assert_eq!(r.cost_spent("s", short).await.unwrap(), 0.0);
        assert_eq!(
            r.cost_reserve("s", "y", 1.0, 2.5, short, HOLD)
                .await
                .unwrap(),
            CostDecision::Reserved
        );
    }

    #[tokio::test]
    async fn a_reservation_expires_after_its_hold() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let hold = Duration::from_millis(200);
        assert_eq!(
            r.cost_reserve("t", "dead-replica", 5.0, 5.0, WINDOW, hold)
                .await
                .unwrap(),
            CostDecision::Reserved
        );
        assert!(matches!(
            r.cost_reserve("t", "b", 1.0, 5.0, WINDOW, hold)
                .await
                .unwrap(),
            CostDecision::OverCap { reserved_usd, .. } if reserved_usd == 5.0
        ));
        tokio::time::sleep(hold + Duration::from_millis(50)).await;
        assert_eq!(
            r.cost_reserve("t", "b", 1.0, 5.0, WINDOW, hold)
                .await
                .unwrap(),
            CostDecision::Reserved
        );
        // Keys carry a TTL so idle tenants vanish.
        let ttl: i64 = server
            .raw(&["PTTL", "switchyard:{t:t}:cost:res"])
            .await
            .unwrap();
        assert!(
            ttl > 0 && ttl <= (WINDOW + hold).as_millis() as i64,
            "{ttl}"
        );
    }
}
