//! The fleet cost ledger on Redis. Spend is a hash of at most 60 time
//! buckets per tenant (`{t:<tenant>}:spend`, field = bucket number, value =
//! USD), so a reservation sums 60 numbers whatever the request rate; buckets
//! that left the window are deleted and the key expires one window after its
//! last charge. Live reservations are a hash `id -> "<expiry ms> <amount>"`
//! (`:cost:res`), one field per request in flight. Reserve and settle are one
//! script each, clocked by Redis `TIME`, so replicas never both squeeze under
//! the cap; a reservation expires after its hold, so a replica that died
//! mid-request cannot pin the cap. Charges buffered during an outage settle
//! as a batch whose id is remembered for 10 minutes, so a retried batch
//! counts once. Also the fleet's replica heartbeat (`{fleet}:replicas`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::CostDecision;
use crate::state::redis::{bad_reply, ms, num, reply, Redis, LUA_NOW};
use crate::state::StateError;

/// How long a settled batch's id is remembered (a retry within it is a no-op).
const BATCH_MEMORY: Duration = Duration::from_secs(600);

/// Lua shared by the cost scripts: the bucket width, and the spend in the
/// window (dropping buckets that left it).
const LUA_SPEND: &str = r"
local BUCKETS = 60
local function bucket_width(window)
  return math.max(1, math.floor(window / BUCKETS))
end
local function spend_in_window(spend, now, window)
  local width = bucket_width(window)
  local first_live = math.floor(now / width) - BUCKETS + 1
  local total = 0
  local oldest = nil
  local f = redis.call('HGETALL', spend)
  for i = 1, #f, 2 do
    local b = tonumber(f[i])
    if b == nil or b < first_live then
      redis.call('HDEL', spend, f[i])
    else
      total = total + (tonumber(f[i + 1]) or 0)
      if oldest == nil or b < oldest then oldest = b end
    end
  end
  return total, oldest
end
local function held_in(res, now, except)
  local reserved = 0
  local f = redis.call('HGETALL', res)
  for i = 1, #f, 2 do
    local exp, amt = string.match(f[i + 1], '^(%S+) (%S+)$')
    exp = tonumber(exp)
    amt = tonumber(amt)
    if exp == nil or amt == nil or exp <= now then
      redis.call('HDEL', res, f[i])
    elseif f[i] ~= except then
      reserved = reserved + amt
    end
  end
  return reserved
end
";

/// KEYS: spend, reservations. ARGV: id, amount, cap, window ms, hold ms.
/// Answers `ok spent reserved` or `over spent reserved retry-ms`.
static RESERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_SPEND}{}",
        r"
local now = now_ms()
local amount = tonumber(ARGV[2])
local cap = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local hold = tonumber(ARGV[5])
local spent, oldest = spend_in_window(KEYS[1], now, window)
local reserved = held_in(KEYS[2], now, ARGV[1])
local s = string.format('%.17g', spent)
local r = string.format('%.17g', reserved)
if spent + reserved + amount > cap + 1e-9 then
  local retry = window
  if oldest then retry = (oldest + BUCKETS) * bucket_width(window) - now end
  if retry > window then retry = window end
  if retry < 1 then retry = 1 end
  return {'over', s, r, retry}
end
redis.call('HSET', KEYS[2], ARGV[1], tostring(now + hold) .. ' ' .. ARGV[2])
if redis.call('PTTL', KEYS[2]) < window + hold then
  redis.call('PEXPIRE', KEYS[2], window + hold)
end
return {'ok', s, r}
"
    ))
});

/// KEYS: spend, reservations. ARGV: actual, window ms, batch id ('' for
/// none), batch memory ms, reservation ids to drop...
static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_SPEND}{}",
        r"
local now = now_ms()
local actual = tonumber(ARGV[1]) or 0
local window = tonumber(ARGV[2])
local batch = ARGV[3]
if batch ~= '' and redis.call('HEXISTS', KEYS[2], 'batch:' .. batch) == 1 then
  return 0
end
for i = 5, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
if actual > 0 then
  local width = bucket_width(window)
  if redis.call('HLEN', KEYS[1]) >= BUCKETS then spend_in_window(KEYS[1], now, window) end
  redis.call('HINCRBYFLOAT', KEYS[1], math.floor(now / width), ARGV[1])
  redis.call('PEXPIRE', KEYS[1], (BUCKETS + 1) * width)
end
if batch ~= '' then
  local memory = tonumber(ARGV[4])
  redis.call('HSET', KEYS[2], 'batch:' .. batch, tostring(now + memory) .. ' 0')
  if redis.call('PTTL', KEYS[2]) < memory then redis.call('PEXPIRE', KEYS[2], memory) end
end
return 1
"
    ))
});

/// KEYS: spend. ARGV: window ms.
static SPENT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_SPEND}{}",
        r"
local spent = spend_in_window(KEYS[1], now_ms(), tonumber(ARGV[1]))
return string.format('%.17g', spent)
"
    ))
});

/// KEYS: replicas. ARGV: replica id, ttl ms. Answers the live replicas.
static HEARTBEAT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{}",
        r"
local now = now_ms()
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
"
    ))
});

/// What the ledger held for a tenant when a reservation was decided
/// (before it): the spend in the window and the other live reservations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Seen {
    pub(crate) spent_usd: f64,
    pub(crate) reserved_usd: f64,
}

/// Charges to settle at once: the amount, the reservations they end, and
/// (for a buffered batch) an id so a retry counts once.
pub(crate) struct Settlement<'a> {
    pub(crate) actual_usd: f64,
    pub(crate) reservations: &'a [String],
    pub(crate) batch: Option<&'a str>,
}

impl Redis {
    /// Holds `amount_usd` against the tenant's cap for at most `hold`, unless
    /// charges in the window plus live holds plus this would pass `cap_usd`.
    #[cfg(test)]
    pub(crate) async fn cost_reserve(
        &self,
        tenant: &str,
        reservation_id: &str,
        amount_usd: f64,
        cap_usd: f64,
        window: Duration,
        hold: Duration,
    ) -> Result<CostDecision, StateError> {
        self.cost_reserve_seen(tenant, reservation_id, amount_usd, cap_usd, window, hold)
            .await
            .map(|(decision, _)| decision)
    }

    /// `cost_reserve`, with what the ledger held before this reservation.
    pub(crate) async fn cost_reserve_seen(
        &self,
        tenant: &str,
        reservation_id: &str,
        amount_usd: f64,
        cap_usd: f64,
        window: Duration,
        hold: Duration,
    ) -> Result<(CostDecision, Seen), StateError> {
        let spend = self.tenant_key(tenant, "spend");
        let reservations = self.tenant_key(tenant, "cost:res");
        let v: Value = self
            .call("cost_reserve", |mut c| async move {
                RESERVE
                    .key(spend)
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
        let field = |i: usize| items.get(i).ok_or_else(|| bad_reply("cost_reserve"));
        let float = |i: usize| reply::float(field(i)?).ok_or_else(|| bad_reply("cost_reserve"));
        let seen = Seen {
            spent_usd: float(1)?,
            reserved_usd: float(2)?,
        };
        match items.first().and_then(reply::string).as_deref() {
            Some("ok") => Ok((CostDecision::Reserved, seen)),
            Some("over") => {
                let retry = reply::int(field(3)?).ok_or_else(|| bad_reply("cost_reserve"))?;
                let decision = CostDecision::OverCap {
                    spent_usd: seen.spent_usd,
                    reserved_usd: seen.reserved_usd,
                    retry_in: Duration::from_millis(retry.max(1) as u64),
                };
                Ok((decision, seen))
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
        let ids = [reservation_id.to_string()];
        let settlement = Settlement {
            actual_usd,
            reservations: &ids,
            batch: None,
        };
        self.cost_settle_many(tenant, &settlement, window).await
    }

    /// Records `s.actual_usd` in the current bucket and drops its
    /// reservations, in one script; a batch already settled is not counted again.
    pub(crate) async fn cost_settle_many(
        &self,
        tenant: &str,
        s: &Settlement<'_>,
        window: Duration,
    ) -> Result<(), StateError> {
        let spend = self.tenant_key(tenant, "spend");
        let reservations = self.tenant_key(tenant, "cost:res");
        let _: Value = self
            .call("cost_settle", |mut c| async move {
                let mut call = SETTLE.key(spend);
                call.key(reservations)
                    .arg(num(s.actual_usd.max(0.0)))
                    .arg(ms(window, 1))
                    .arg(s.batch.unwrap_or(""))
                    .arg(ms(BATCH_MEMORY, 1));
                for id in s.reservations {
                    call.arg(id);
                }
                call.invoke_async(&mut c).await
            })
            .await?;
        Ok(())
    }

    /// Charges in the window (reservations not included).
    pub async fn cost_spent(&self, tenant: &str, window: Duration) -> Result<f64, StateError> {
        let spend = self.tenant_key(tenant, "spend");
        let v: Value = self
            .call("cost_spent", |mut c| async move {
                SPENT
                    .key(spend)
                    .arg(ms(window, 1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        reply::float(&v).ok_or_else(|| bad_reply("cost_spent"))
    }

    /// Marks this replica live for `ttl` and answers how many replicas are
    /// live (this one included).
    pub(crate) async fn replicas_heartbeat(
        &self,
        replica_id: &str,
        ttl: Duration,
    ) -> Result<u32, StateError> {
        let key = self.fleet_key("replicas");
        let n: i64 = self
            .call("replicas_heartbeat", |mut c| async move {
                HEARTBEAT
                    .key(key)
                    .arg(replica_id)
                    .arg(ms(ttl, 1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(u32::try_from(n.max(1)).unwrap_or(u32::MAX))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::state::redis::testutil::RedisServer;

    const WINDOW: Duration = Duration::from_secs(60);
    const HOLD: Duration = Duration::from_secs(30);
    /// Buckets in one window (`BUCKETS` in the Lua).
    const BUCKETS: i64 = 60;

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

    /// Charges `n` times `usd` for `tenant`, 64 at a time on one connection.
    async fn charge_many(r: &Redis, tenant: &str, n: usize, usd: f64, window: Duration) {
        let mut left = n;
        while left > 0 {
            let batch = left.min(64);
            let calls = (0..batch).map(|i| {
                let r = r.clone();
                async move { r.cost_settle(tenant, &format!("c{i}"), usd, window).await }
            });
            for result in futures_util::future::join_all(calls).await {
                result.unwrap();
            }
            left -= batch;
        }
    }

    /// R1: 200,000 charges in a tenant's window (about an hour at 55
    /// requests a second) leave one small hash, and a reservation still
    /// decides exactly within the call timeout. With a member per charge
    /// the key held 200,000 members and every reservation summed them all.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reservation_stays_fast_and_the_ledger_small_after_200k_charges() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let hour = Duration::from_secs(3600);
        charge_many(&r, "busy", 200_000, 0.000_01, hour).await;
        let fields: i64 = server
            .raw(&["HLEN", "switchyard:{t:busy}:spend"])
            .await
            .unwrap();
        assert!((1..=BUCKETS).contains(&fields), "{fields} buckets");
        let bytes: i64 = server
            .raw(&["MEMORY", "USAGE", "switchyard:{t:busy}:spend"])
            .await
            .unwrap();
        assert!(bytes < 4096, "the ledger key takes {bytes} bytes");
        let spent = r.cost_spent("busy", hour).await.unwrap();
        assert!((spent - 2.0).abs() < 1e-6, "{spent}");
        // Within the 200 ms call timeout, and exact: 2 spent + 3 fits 5, 0.01 more does not.
        let (d, seen) = r
            .cost_reserve_seen("busy", "a", 3.0, 5.0 + 1e-7, hour, HOLD)
            .await
            .unwrap();
        assert_eq!(d, CostDecision::Reserved);
        assert!((seen.spent_usd - 2.0).abs() < 1e-6, "{seen:?}");
        assert!(matches!(
            r.cost_reserve("busy", "b", 0.01, 5.0, hour, HOLD).await.unwrap(),
            CostDecision::OverCap { reserved_usd, .. } if reserved_usd == 3.0
        ));
    }

    /// Buckets that left the window are dropped: charges spread over twice
    /// the window never leave more than 60 fields, and the key expires.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn old_buckets_are_dropped_and_the_key_expires() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let window = Duration::from_millis(600);
        let until = tokio::time::Instant::now() + 2 * window;
        let mut most = 0;
        while tokio::time::Instant::now() < until {
            charge_many(&r, "t", 8, 0.5, window).await;
            let fields: i64 = server
                .raw(&["HLEN", "switchyard:{t:t}:spend"])
                .await
                .unwrap();
            most = most.max(fields);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(most > 0 && most <= BUCKETS, "{most} fields");
        let ttl: i64 = server
            .raw(&["PTTL", "switchyard:{t:t}:spend"])
            .await
            .unwrap();
        assert!(ttl > 0 && ttl <= 620, "{ttl}");
        tokio::time::sleep(window + Duration::from_millis(100)).await;
        let exists: i64 = server
            .raw(&["EXISTS", "switchyard:{t:t}:spend"])
            .await
            .unwrap();
        assert_eq!(exists, 0, "an idle tenant's ledger expires");
    }

    #[tokio::test]
    async fn a_batch_settles_once_however_often_it_is_sent() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        assert_eq!(
            r.cost_reserve("t", "held", 2.0, 5.0, WINDOW, HOLD)
                .await
                .unwrap(),
            CostDecision::Reserved
        );
        let ids = ["held".to_string()];
        let batch = Settlement {
            actual_usd: 1.5,
            reservations: &ids,
            batch: Some("b1"),
        };
        for _ in 0..3 {
            r.cost_settle_many("t", &batch, WINDOW).await.unwrap();
        }
        assert_eq!(r.cost_spent("t", WINDOW).await.unwrap(), 1.5);
        let (_, seen) = r
            .cost_reserve_seen("t", "next", 0.0, 5.0, WINDOW, HOLD)
            .await
            .unwrap();
        assert_eq!(seen.reserved_usd, 0.0, "the batch dropped the hold");
    }

    #[tokio::test]
    async fn the_heartbeat_counts_live_replicas() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let short = Duration::from_millis(300);
        assert_eq!(r.replicas_heartbeat("a", short).await.unwrap(), 1);
        assert_eq!(r.replicas_heartbeat("b", WINDOW).await.unwrap(), 2);
        assert_eq!(r.replicas_heartbeat("a", short).await.unwrap(), 2);
        tokio::time::sleep(short + Duration::from_millis(50)).await;
        assert_eq!(
            r.replicas_heartbeat("b", WINDOW).await.unwrap(),
            1,
            "a stopped beating"
        );
    }
}
