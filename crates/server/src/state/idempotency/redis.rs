//! Fleet idempotency records: one hash per scoped key (`{i:<tenant:key>}`)
//! holding the state (`inflight` or `done`), the request fingerprint, the
//! claim token of the run serving it and, once done, the answer bytes. An
//! in-flight claim is a lease renewed while its run lives, so a dead
//! replica's claim lapses; only the claim's holder may renew, finish or
//! release it.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use super::IdemClaim;
use crate::state::redis::{bad_reply, ms, reply, Redis};
use crate::state::StateError;

/// KEYS: record. ARGV: fingerprint, token, in-flight ttl ms, resume token
/// of the run's stream ('' when it has none).
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local rec = redis.call('HMGET', KEYS[1], 'state', 'fp', 'answer', 'resume')
if not rec[1] then
  redis.call('HSET', KEYS[1], 'state', 'inflight', 'fp', ARGV[1], 'token', ARGV[2], 'resume', ARGV[4])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return {'fresh'}
end
if rec[2] ~= ARGV[1] then return {'mismatch'} end
if rec[1] == 'inflight' then return {'inuse', rec[4] or ''} end
return {'replay', rec[3] or '', rec[4] or ''}
",
    )
});

/// KEYS: record. ARGV: token, answer, ttl ms.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local rec = redis.call('HMGET', KEYS[1], 'state', 'token')
if rec[1] ~= 'inflight' or rec[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'done', 'answer', ARGV[2])
redis.call('HDEL', KEYS[1], 'token')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
",
    )
});

/// KEYS: record. ARGV: token, lease ms. 0 unless the record is still in
/// flight under this token: a renewal racing a release or a completion never
/// brings the claim back.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local rec = redis.call('HMGET', KEYS[1], 'state', 'token')
if rec[1] ~= 'inflight' or rec[2] ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
",
    )
});

/// KEYS: record. ARGV: token.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local rec = redis.call('HMGET', KEYS[1], 'state', 'token')
if rec[1] ~= 'inflight' or rec[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
",
    )
});

impl Redis {
    /// Claims `scoped_key` for a run whose stream has the journal `resume`
    /// (if any), or says who has it.
    pub async fn idem_claim(
        &self,
        scoped_key: &str,
        fingerprint: &[u8; 32],
        claim_token: &str,
        in_flight_ttl: Duration,
        resume: Option<&str>,
    ) -> Result<IdemClaim, StateError> {
        let key = self.idem_key(scoped_key);
        let resume = resume.unwrap_or_default().to_string();
        let v: Value = self
            .call("idem_claim", |mut c| async move {
                CLAIM
                    .key(key)
                    .arg(&fingerprint[..])
                    .arg(claim_token)
                    .arg(ms(in_flight_ttl, 1))
                    .arg(&resume)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let items = reply::items(v).ok_or_else(|| bad_reply("idem_claim"))?;
        // The stream's resume token, when the run that claimed it has one.
        let resume = |at: usize| {
            items
                .get(at)
                .and_then(reply::string)
                .filter(|t| !t.is_empty())
        };
        match items.first().and_then(reply::string).as_deref() {
            Some("fresh") => Ok(IdemClaim::Fresh),
            Some("inuse") => Ok(IdemClaim::InUse(resume(1))),
            Some("mismatch") => Ok(IdemClaim::Mismatch),
            Some("replay") => items
                .get(1)
                .and_then(reply::bytes)
                .map(|answer| IdemClaim::Replay(answer, resume(2)))
                .ok_or_else(|| bad_reply("idem_claim")),
            _ => Err(bad_reply("idem_claim")),
        }
    }

    /// Extends the claim's lease to `lease` from now; false when it is no
    /// longer in flight under `claim_token` (released, completed, lapsed).
    pub async fn idem_renew(
        &self,
        scoped_key: &str,
        claim_token: &str,
        lease: Duration,
    ) -> Result<bool, StateError> {
        let key = self.idem_key(scoped_key);
        let held: i64 = self
            .call("idem_renew", |mut c| async move {
                RENEW
                    .key(key)
                    .arg(claim_token)
                    .arg(ms(lease, 1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(held == 1)
    }

    /// Stores the answer if the record is still in flight under `claim_token`.
    pub async fn idem_complete(
        &self,
        scoped_key: &str,
        claim_token: &str,
        answer: &[u8],
        ttl: Duration,
    ) -> Result<bool, StateError> {
        let key = self.idem_key(scoped_key);
        let stored: i64 = self
            .call("idem_complete", |mut c| async move {
                COMPLETE
                    .key(key)
                    .arg(claim_token)
                    .arg(answer)
                    .arg(ms(ttl, 1))
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(stored == 1)
    }

    /// Forgets the claim if it is still in flight under `claim_token`.
    pub async fn idem_release(
        &self,
        scoped_key: &str,
        claim_token: &str,
    ) -> Result<(), StateError> {
        let key = self.idem_key(scoped_key);
        let _: i64 = self
            .call("idem_release", |mut c| async move {
                RELEASE.key(key).arg(claim_token).invoke_async(&mut c).await
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

    const TTL: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn fresh_in_use_mismatch_replay_and_token_fencing() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let a = server.client();
        let b = server.client();
        let fp = [7u8; 32];
        let other = [8u8; 32];
        assert_eq!(
            a.idem_claim("t/k", &fp, "tok-a", TTL, None).await.unwrap(),
            IdemClaim::Fresh
        );
        assert_eq!(
            b.idem_claim("t/k", &fp, "tok-b", TTL, None).await.unwrap(),
            IdemClaim::InUse(None)
        );
        assert_eq!(
            b.idem_claim("t/k", &other, "tok-b", TTL, None)
                .await
                .unwrap(),
            IdemClaim::Mismatch
        );
        // Only the holder's token completes or releases it.
        assert!(!b
            .idem_complete("t/k", "tok-b", b"wrong", TTL)
            .await
            .unwrap());
        b.idem_release("t/k", "tok-b").await.unwrap();
        assert_eq!(
            b.idem_claim("t/k", &fp, "tok-b", TTL, None).await.unwrap(),
            IdemClaim::InUse(None)
        );
        let answer = [0u8, 159, 146, 150, 255, 0, 1];
        assert!(a.idem_complete("t/k", "tok-a", &answer, TTL).await.unwrap());
        assert!(
            !a.idem_complete("t/k", "tok-a", b"again", TTL)
                .await
                .unwrap(),
            "completed once"
        );
        assert_eq!(
            b.idem_claim("t/k", &fp, "tok-c", TTL, None).await.unwrap(),
            IdemClaim::Replay(answer.to_vec(), None),
            "binary-safe answer"
        );
        assert_eq!(
            b.idem_claim("t/k", &other, "tok-c", TTL, None)
                .await
                .unwrap(),
            IdemClaim::Mismatch
        );
        a.idem_release("t/k", "tok-a").await.unwrap();
        assert!(
            matches!(
                b.idem_claim("t/k", &fp, "x", TTL, None).await.unwrap(),
                IdemClaim::Replay(..)
            ),
            "a done record is not released"
        );
        // Release by the holder frees the key.
        assert_eq!(
            a.idem_claim("t/r", &fp, "tok", TTL, None).await.unwrap(),
            IdemClaim::Fresh
        );
        a.idem_release("t/r", "tok").await.unwrap();
        assert_eq!(
            b.idem_claim("t/r", &other, "tok2", TTL, None)
                .await
                .unwrap(),
            IdemClaim::Fresh
        );
        let ttl: i64 = server.raw(&["PTTL", "switchyard:{i:t/k}"]).await.unwrap();
        assert!(ttl > 0 && ttl <= TTL.as_millis() as i64);
    }

    #[tokio::test]
    async fn an_in_flight_claim_lapses_after_its_ttl() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let fp = [1u8; 32];
        let short = Duration::from_millis(200);
        assert_eq!(
            r.idem_claim("k", &fp, "dead", short, None).await.unwrap(),
            IdemClaim::Fresh
        );
        assert_eq!(
            r.idem_claim("k", &fp, "live", short, None).await.unwrap(),
            IdemClaim::InUse(None)
        );
        tokio::time::sleep(short + Duration::from_millis(50)).await;
        assert_eq!(
            r.idem_claim("k", &fp, "live", TTL, None).await.unwrap(),
            IdemClaim::Fresh
        );
        assert!(
            !r.idem_complete("k", "dead", b"late", TTL).await.unwrap(),
            "the lapsed claim cannot complete"
        );
        assert!(r.idem_complete("k", "live", b"ok", TTL).await.unwrap());
    }

    #[tokio::test]
    async fn a_renewed_claim_outlives_its_lease_and_only_a_live_claim_is_renewed() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let r = server.client();
        let fp = [3u8; 32];
        let lease = Duration::from_secs(1);
        assert_eq!(
            r.idem_claim("k", &fp, "run", lease, None).await.unwrap(),
            IdemClaim::Fresh
        );
        for _ in 0..5 {
            tokio::time::sleep(lease / 4).await;
            assert!(r.idem_renew("k", "run", lease).await.unwrap());
        }
        assert_eq!(
            r.idem_claim("k", &fp, "other", lease, None).await.unwrap(),
            IdemClaim::InUse(None),
            "held past its first lease"
        );
        assert!(!r.idem_renew("k", "other", lease).await.unwrap());
        // A completed claim is not renewed (its record keeps the answer's ttl)...
        assert!(r.idem_complete("k", "run", b"answer", TTL).await.unwrap());
        assert!(!r.idem_renew("k", "run", lease).await.unwrap());
        let ttl: i64 = server.raw(&["PTTL", "switchyard:{i:k}"]).await.unwrap();
        assert!(ttl > 1000, "a done record keeps its ttl: {ttl}");
        // ...nor a released one brought back.
        assert_eq!(
            r.idem_claim("r", &fp, "run", lease, None).await.unwrap(),
            IdemClaim::Fresh
        );
        r.idem_release("r", "run").await.unwrap();
        assert!(!r.idem_renew("r", "run", lease).await.unwrap());
        let exists: i64 = server.raw(&["EXISTS", "switchyard:{i:r}"]).await.unwrap();
        assert_eq!(exists, 0);
    }
}
