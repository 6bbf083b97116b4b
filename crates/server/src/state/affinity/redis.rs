//! The fleet's affinity memory on Redis: one hash per tenant
//! (`{t:<tenant>}:affinity`) of at most [`SLOTS`] fields. A prefix digest
//! picks its field (slot) and is stored there with its expiry and where it is
//! warm; a newer prefix on a taken slot replaces the older one (a miss for
//! it later, never a wrong answer: the digest is checked). The hash expires
//! with its youngest entry. Recall and remember are one script call each,
//! clocked by Redis's `TIME`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use crate::policy::affinity::{PrefixHash, Warm};
use crate::state::redis::{bad_reply, ms, reply, Redis, LUA_NOW};
use crate::state::StateError;

/// Fields of a tenant's hash: its prefixes remembered at once (about 136
/// bytes each by `MEMORY USAGE`: 557 KB for a full hash).
pub const SLOTS: u16 = 4096;

/// KEYS: the tenant's hash. ARGV: slot, id, slot, id, ... (longest prefix
/// first). The first entry whose id matches and has not expired.
static RECALL: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{LUA_NOW}
local now = now_ms()
for i = 1, #ARGV, 2 do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v and string.sub(v, 1, 32) == ARGV[i + 1] then
    local nl = string.find(v, '\n', 34, true)
    if nl and tonumber(string.sub(v, 34, nl - 1)) > now then
      return string.sub(v, nl + 1)
    end
  end
end
return false
"
    ))
});

/// KEYS: the tenant's hash. ARGV: ttl ms, where it is warm, then slot, id
/// pairs. The hash lives as long as its youngest entry.
static REMEMBER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        r"{LUA_NOW}
local ttl = tonumber(ARGV[1])
local expires = now_ms() + ttl
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1] .. ' ' .. expires .. '\n' .. ARGV[2])
end
if redis.call('PTTL', KEYS[1]) < ttl then
  redis.call('PEXPIRE', KEYS[1], ttl)
end
return 1
"
    ))
});

/// A digest's field and the id checked there.
fn slot_and_id(p: &PrefixHash) -> (u16, String) {
    let slot = u16::from_be_bytes([p[0], p[1]]) % SLOTS;
    let id = p[2..18].iter().map(|b| format!("{b:02x}")).collect();
    (slot, id)
}

/// Where it is warm, as stored: provider, model and key on lines of their own.
fn encode(w: &Warm) -> String {
    format!(
        "{}\n{}\n{}",
        w.provider,
        w.model,
        w.key.as_deref().unwrap_or_default()
    )
}

fn decode(s: &str) -> Option<Warm> {
    let mut lines = s.splitn(3, '\n');
    let (provider, model, key) = (lines.next()?, lines.next()?, lines.next()?);
    Some(Warm {
        provider: provider.to_string(),
        model: model.to_string(),
        key: (!key.is_empty()).then(|| key.to_string()),
    })
}

impl Redis {
    /// Where the longest of `prefixes` still warm was answered.
    pub async fn affinity_recall(
        &self,
        tenant: &str,
        prefixes: &[PrefixHash],
    ) -> Result<Option<Warm>, StateError> {
        let key = self.tenant_key(tenant, "affinity");
        let v: Value = self
            .call("affinity_recall", |mut c| async move {
                let mut call = RECALL.key(key);
                for p in prefixes {
                    let (slot, id) = slot_and_id(p);
                    call.arg(slot).arg(id);
                }
                call.invoke_async(&mut c).await
            })
            .await?;
        match v {
            Value::Nil | Value::Boolean(false) => Ok(None),
            v => reply::string(&v)
                .and_then(|s| decode(&s))
                .map(Some)
                .ok_or_else(|| bad_reply("affinity_recall")),
        }
    }

    /// `prefixes` are warm at `warm` for `ttl` from now.
    pub async fn affinity_remember(
        &self,
        tenant: &str,
        prefixes: &[PrefixHash],
        warm: &Warm,
        ttl: Duration,
    ) -> Result<(), StateError> {
        let key = self.tenant_key(tenant, "affinity");
        let at = encode(warm);
        let _: i64 = self
            .call("affinity_remember", |mut c| async move {
                let mut call = REMEMBER.key(key);
                call.arg(ms(ttl, 1)).arg(at);
                for p in prefixes {
                    let (slot, id) = slot_and_id(p);
                    call.arg(slot).arg(id);
                }
                call.invoke_async(&mut c).await
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

    fn warm(p: &str, key: Option<&str>) -> Warm {
        Warm {
            provider: p.into(),
            model: "claude/sonnet@2025".into(),
            key: key.map(str::to_string),
        }
    }

    /// A digest on slot `slot` (its first two bytes) with `rest` after.
    fn digest(slot: u8, rest: u8) -> PrefixHash {
        let mut d = [rest; 32];
        d[..2].copy_from_slice(&[0, slot]);
        d
    }

    #[tokio::test]
    async fn replicas_share_a_tenants_prefixes_until_they_expire() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let (a, b) = (server.client(), server.client());
        let (long, short) = (digest(1, 1), digest(2, 2));
        let ttl = Duration::from_millis(400);
        assert_eq!(a.affinity_recall("t", &[long, short]).await.unwrap(), None);
        a.affinity_remember("t", &[long, short], &warm("p1", Some("k2")), ttl)
            .await
            .unwrap();
        assert_eq!(
            b.affinity_recall("t", &[long, short]).await.unwrap(),
            Some(warm("p1", Some("k2"))),
            "another replica reads it"
        );
        assert_eq!(
            b.affinity_recall("other", &[long, short]).await.unwrap(),
            None,
            "another tenant does not"
        );
        // The memory moves: the longest prefix warm elsewhere wins.
        b.affinity_remember("t", &[long], &warm("p2", None), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            a.affinity_recall("t", &[long, short]).await.unwrap(),
            Some(warm("p2", None))
        );
        assert_eq!(
            a.affinity_recall("t", &[short]).await.unwrap(),
            Some(warm("p1", Some("k2")))
        );
        tokio::time::sleep(ttl + Duration::from_millis(100)).await;
        assert_eq!(a.affinity_recall("t", &[short]).await.unwrap(), None);
        let ttl_left: i64 = server
            .raw(&["PTTL", "switchyard:{t:t}:affinity"])
            .await
            .unwrap();
        assert!(
            ttl_left > 50_000,
            "the hash lives with its youngest entry: {ttl_left}"
        );
    }

    #[tokio::test]
    async fn a_tenants_hash_is_bounded_and_a_slot_keeps_only_its_newest_prefix() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let ttl = Duration::from_secs(60);
        // Two digests on one slot (same first two bytes): the newer wins,
        // the older is a miss, never the newer's target.
        let (old, new) = (digest(5, 1), digest(5, 2));
        r.affinity_remember("t", &[old], &warm("p1", None), ttl)
            .await
            .unwrap();
        r.affinity_remember("t", &[new], &warm("p2", None), ttl)
            .await
            .unwrap();
        assert_eq!(r.affinity_recall("t", &[old]).await.unwrap(), None);
        assert_eq!(
            r.affinity_recall("t", &[new]).await.unwrap(),
            Some(warm("p2", None))
        );
        // However many prefixes, at most SLOTS fields.
        for i in 0..(u32::from(SLOTS) + 500) {
            let b = i.to_be_bytes();
            let mut d = [9u8; 32];
            d[..4].copy_from_slice(&b);
            d.swap(0, 2);
            d.swap(1, 3);
            r.affinity_remember("t", &[d], &warm("p", None), ttl)
                .await
                .unwrap();
        }
        let fields: i64 = server
            .raw(&["HLEN", "switchyard:{t:t}:affinity"])
            .await
            .unwrap();
        assert!(fields <= i64::from(SLOTS), "{fields}");
    }

    #[test]
    fn where_it_is_warm_round_trips_through_its_stored_form() {
        for w in [warm("p", Some("key-1")), warm("p", None)] {
            assert_eq!(decode(&encode(&w)), Some(w));
        }
        assert_eq!(decode("only-one-line"), None);
    }
}
