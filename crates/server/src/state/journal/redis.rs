//! Stream journals on Redis, both keys of one journal in its token's hash
//! slot:
//! - `{prefix}{j:<token>}:events`: a Redis Stream, one entry per event with
//!   the ID `<seq>-0` and the field `e` (the encoded event); markers wake
//!   tail readers: `<last_seq>-1` (field `m` = `finished`) when the owner
//!   finishes, `<last_seq>-2` (`m` = `dropped`) when the journal passes its
//!   byte bound and its events are deleted. Expires `resume.ttl` after the
//!   last write.
//! - `{prefix}{j:<token>}:meta`: a hash with `tenant`, `owner`,
//!   `lease_until` (Redis time, ms), `finished` (0/1), `bound` (empty, or
//!   `stream` once not resumable), `bytes` (of events held), `last_seq` and
//!   `expires_at` (Redis time, ms). Expires `2 x resume.ttl` after the last
//!   write, so an expired token answers `Expired` for one more ttl.
//!
//! Every mutation is one Lua script clocked by Redis `TIME` (the byte bound
//! and the lease are decided there, so two replicas never disagree); a tail
//! reader waits with `XREAD BLOCK` on a connection of its own, outside the
//! shared connection and its breaker, at most `MAX_WAIT` per call.

use std::sync::LazyLock;
use std::time::Duration;

use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Script, Value};

use super::{
    Appended, Batch, Bound, Bounds, Claim, Entry, JournalError, Owner, ResumeToken, Tail,
    MAX_BATCH, MAX_WAIT,
};
use crate::state::redis::{bad_reply, ms, reply, Redis, LUA_NOW};
use crate::state::StateError;

/// KEYS: meta, events. Moves both keys' expiry to `ttl` after `now`.
const TOUCH: &str = r"
local function touch(now, ttl)
  redis.call('HSET', KEYS[1], 'expires_at', now + ttl)
  redis.call('PEXPIRE', KEYS[1], 2 * ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
end
";

/// The owner's live journal (ARGV[1] is the owner): its fields, or nil and
/// a refusal.
const OWNED: &str = r"
local function owned(now)
  local m = redis.call('HMGET', KEYS[1], 'owner', 'expires_at', 'finished', 'bound', 'bytes', 'last_seq')
  if not m[1] then return nil, {'gone'} end
  if now >= tonumber(m[2]) then return nil, {'expired'} end
  if m[1] ~= ARGV[1] then return nil, {'fenced'} end
  return m, nil
end
";

/// The tenant's live journal (ARGV[1] is the tenant): its fields, or nil
/// and a refusal.
const OF_TENANT: &str = r"
local function of_tenant(now)
  local m = redis.call('HMGET', KEYS[1], 'tenant', 'expires_at', 'finished', 'bound', 'owner', 'lease_until', 'last_seq')
  if not m[1] or m[1] ~= ARGV[1] then return nil, {'gone'} end
  if now >= tonumber(m[2]) then return nil, {'expired'} end
  if m[4] ~= '' then return nil, {'unresumable', m[4]} end
  return m, nil
end
";

/// KEYS: meta, events. ARGV: tenant, owner, lease ms, ttl ms.
static OPEN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{TOUCH}
local now = now_ms()
if redis.call('EXISTS', KEYS[1]) == 1 then return 'exists' end
redis.call('HSET', KEYS[1], 'tenant', ARGV[1], 'owner', ARGV[2],
  'lease_until', now + tonumber(ARGV[3]), 'finished', '0', 'bound', '',
  'bytes', 0, 'last_seq', 0, 'request', ARGV[5])
touch(now, tonumber(ARGV[4]))
return 'ok'
"
    ))
});

/// KEYS: meta, events. ARGV: owner, max bytes, ttl ms, then each event's
/// seq and bytes (one call appends a batch, in order).
static APPEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{TOUCH}{OWNED}
local now = now_ms()
local m, refusal = owned(now)
if refusal then return refusal end
if m[3] == '1' then return {{'finished'}} end
if m[4] ~= '' then return {{'unresumable', m[4]}} end
local last = tonumber(m[6])
local bytes = tonumber(m[5])
local bound = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local answer = {{'ok'}}
for i = 4, #ARGV, 2 do
  if tonumber(ARGV[i]) ~= last + 1 then
    answer = {{'order', last + 1}}
    break
  end
  local size = string.len(ARGV[i + 1])
  if bytes + size > bound then
    redis.call('DEL', KEYS[2])
    redis.call('XADD', KEYS[2], last .. '-2', 'm', 'dropped')
    redis.call('HSET', KEYS[1], 'bound', 'stream', 'bytes', 0)
    touch(now, ttl)
    return {{'unresumable', 'stream'}}
  end
  redis.call('XADD', KEYS[2], ARGV[i] .. '-0', 'e', ARGV[i + 1])
  bytes = bytes + size
  last = last + 1
end
redis.call('HSET', KEYS[1], 'bytes', bytes, 'last_seq', last)
touch(now, ttl)
return answer
"
    ))
});

/// KEYS: meta, events. ARGV: owner, ttl ms.
static FINISH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{TOUCH}{OWNED}
local now = now_ms()
local m, refusal = owned(now)
if refusal then return refusal end
if m[3] == '1' then return {{'ok'}} end
redis.call('HSET', KEYS[1], 'finished', '1')
if m[4] == '' then
  redis.call('XADD', KEYS[2], m[6] .. '-1', 'm', 'finished')
end
touch(now, tonumber(ARGV[2]))
return {{'ok'}}
"
    ))
});

/// KEYS: meta, events. ARGV: owner, lease ms.
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{OWNED}
local now = now_ms()
local m, refusal = owned(now)
if refusal then return refusal end
redis.call('HSET', KEYS[1], 'lease_until', now + tonumber(ARGV[2]))
return {{'ok'}}
"
    ))
});

/// KEYS: meta, events. ARGV: tenant, owner, lease ms.
static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{OF_TENANT}
local now = now_ms()
local m, refusal = of_tenant(now)
if refusal then return refusal end
if m[3] == '1' then return {{'finished'}} end
if m[5] ~= ARGV[2] and tonumber(m[6]) > now then return {{'held'}} end
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'lease_until', now + tonumber(ARGV[3]))
return {{'taken', tonumber(m[7])}}
"
    ))
});

/// KEYS: meta, events. ARGV: tenant, after seq, most events. Answers
/// `ok`, finished (0/1), lease live (0/1), last seq, then seq and event
/// pairs (markers left out).
static READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{OF_TENANT}
local now = now_ms()
local m, refusal = of_tenant(now)
if refusal then return refusal end
local live = 0
if tonumber(m[6]) > now then live = 1 end
local out = {{'ok', tonumber(m[3]), live, tonumber(m[7])}}
local most = tonumber(ARGV[3])
local from = (tonumber(ARGV[2]) + 1) .. '-0'
local got = 0
for _, e in ipairs(redis.call('XRANGE', KEYS[2], from, '+', 'COUNT', most + 1)) do
  local dash = string.find(e[1], '-', 1, true)
  if got < most and string.sub(e[1], dash + 1) == '0' then
    table.insert(out, tonumber(string.sub(e[1], 1, dash - 1)))
    table.insert(out, e[2][2])
    got = got + 1
  end
end
return out
"
    ))
});

/// The fleet's journals on Redis.
#[derive(Clone)]
pub struct RedisJournal {
    redis: Redis,
    bounds: Bounds,
}

/// A tail reader's own connection.
pub struct Tailer {
    connection: MultiplexedConnection,
}

/// A script's refusal as an error (None for the shapes that are not refusals).
fn refusal(what: &str, items: &[Value]) -> Option<JournalError> {
    let word = items.first().and_then(reply::string)?;
    Some(match word.as_str() {
        "gone" => JournalError::NotFound,
        "expired" => JournalError::Expired,
        "fenced" => JournalError::Fenced,
        "finished" => JournalError::Finished,
        "unresumable" => JournalError::NotResumable(Bound::PerStream),
        "order" => JournalError::OutOfOrder {
            expected: items.get(1).and_then(reply::int).unwrap_or(0).max(0) as u64,
            got: 0,
        },
        "ok" | "taken" | "held" => return None,
        _ => JournalError::Unavailable(bad_reply(what)),
    })
}

impl RedisJournal {
    pub fn new(redis: Redis, bounds: Bounds) -> RedisJournal {
        RedisJournal { redis, bounds }
    }

    /// `{prefix}{j:<token>}:meta` and `:events`.
    fn keys(&self, token: &ResumeToken) -> [String; 2] {
        let tag = format!("{}{{j:{}}}", self.redis.prefix(), token.as_str());
        [format!("{tag}:meta"), format!("{tag}:events")]
    }

    /// Runs one script with the journal's keys and `args`.
    async fn run(
        &self,
        what: &'static str,
        script: &'static Script,
        token: &ResumeToken,
        args: Vec<Vec<u8>>,
    ) -> Result<Value, StateError> {
        let [meta, events] = self.keys(token);
        self.redis
            .call(what, |mut c| async move {
                let mut inv = script.key(&meta);
                inv.key(&events);
                for a in &args {
                    inv.arg(a.as_slice());
                }
                inv.invoke_async(&mut c).await
            })
            .await
    }

    /// Runs a script answering an array, mapping its refusals.
    async fn items(
        &self,
        what: &'static str,
        script: &'static Script,
        token: &ResumeToken,
        args: Vec<Vec<u8>>,
    ) -> Result<Vec<Value>, JournalError> {
        let v = self.run(what, script, token, args).await?;
        let items = reply::items(v).ok_or_else(|| bad_reply(what))?;
        match refusal(what, &items) {
            Some(e) => Err(e),
            None => Ok(items),
        }
    }

    pub async fn open(
        &self,
        tenant: &str,
        token: &ResumeToken,
        owner: &Owner,
        request: &[u8],
    ) -> Result<(), JournalError> {
        let args = vec![
            tenant.as_bytes().to_vec(),
            owner.as_str().as_bytes().to_vec(),
            ms(self.bounds.lease, 1).to_string().into_bytes(),
            ms(self.bounds.ttl, 1).to_string().into_bytes(),
            request.to_vec(),
        ];
        let v = self.run("journal_open", &OPEN, token, args).await?;
        match reply::string(&v).as_deref() {
            Some("ok") => Ok(()),
            // 128 random bits collided: say so rather than share a journal.
            _ => Err(bad_reply("journal_open").into()),
        }
    }

    /// One event (tests; the tee appends batches).
    #[cfg(test)]
    pub async fn append(
        &self,
        token: &ResumeToken,
        owner: &Owner,
        seq: u64,
        event: &[u8],
    ) -> Result<Appended, JournalError> {
        self.append_many(token, owner, &[(seq, event)]).await
    }

    /// Appends events numbered on from the journal's last, in one script
    /// call: all of them, or those before the one that passed a bound (the
    /// journal is then unresumable) or was out of order.
    pub async fn append_many(
        &self,
        token: &ResumeToken,
        owner: &Owner,
        events: &[(u64, &[u8])],
    ) -> Result<Appended, JournalError> {
        let Some(&(first, _)) = events.first() else {
            return Ok(Appended::Stored);
        };
        let mut args = Vec::with_capacity(3 + 2 * events.len());
        args.push(owner.as_str().as_bytes().to_vec());
        args.push(self.bounds.max_bytes_per_stream.to_string().into_bytes());
        args.push(ms(self.bounds.ttl, 1).to_string().into_bytes());
        for (seq, event) in events {
            args.push(seq.to_string().into_bytes());
            args.push(event.to_vec());
        }
        match self.items("journal_append", &APPEND, token, args).await {
            Ok(_) => Ok(Appended::Stored),
            Err(JournalError::NotResumable(bound)) => Ok(Appended::NotResumable(bound)),
            Err(JournalError::OutOfOrder { expected, .. }) => Err(JournalError::OutOfOrder {
                expected,
                got: first,
            }),
            Err(e) => Err(e),
        }
    }

    pub async fn finish(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        let args = vec![
            owner.as_str().as_bytes().to_vec(),
            ms(self.bounds.ttl, 1).to_string().into_bytes(),
        ];
        self.items("journal_finish", &FINISH, token, args).await?;
        Ok(())
    }

    pub async fn renew(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        let args = vec![
            owner.as_str().as_bytes().to_vec(),
            ms(self.bounds.lease, 1).to_string().into_bytes(),
        ];
        self.items("journal_renew", &RENEW, token, args).await?;
        Ok(())
    }

    /// Ends the owner's lease now (it is leaving: a drain), so another
    /// replica may take the journal over at once.
    pub async fn release(&self, token: &ResumeToken, owner: &Owner) -> Result<(), JournalError> {
        let args = vec![owner.as_str().as_bytes().to_vec(), b"1".to_vec()];
        self.items("journal_release", &RENEW, token, args).await?;
        Ok(())
    }

    pub async fn claim(
        &self,
        tenant: &str,
        token: &ResumeToken,
        owner: &Owner,
    ) -> Result<Claim, JournalError> {
        let args = vec![
            tenant.as_bytes().to_vec(),
            owner.as_str().as_bytes().to_vec(),
            ms(self.bounds.lease, 1).to_string().into_bytes(),
        ];
        let items = match self.items("journal_claim", &CLAIM, token, args).await {
            Err(JournalError::Finished) => return Ok(Claim::Finished),
            other => other?,
        };
        match items.first().and_then(reply::string).as_deref() {
            Some("taken") => Ok(Claim::Taken {
                last_seq: items
                    .get(1)
                    .and_then(reply::int)
                    .ok_or_else(|| bad_reply("journal_claim"))?
                    .max(0) as u64,
            }),
            Some("held") => Ok(Claim::Held),
            _ => Err(bad_reply("journal_claim").into()),
        }
    }

    /// The request the stream answers (what a new owner continues), if
    /// it is the tenant's.
    pub async fn request(
        &self,
        tenant: &str,
        token: &ResumeToken,
    ) -> Result<Option<Bytes>, JournalError> {
        let [meta, _] = self.keys(token);
        let (owner_tenant, request): (Option<Vec<u8>>, Option<Vec<u8>>) = self
            .redis
            .call("journal_request", |mut c| async move {
                ::redis::cmd("HMGET")
                    .arg(&meta)
                    .arg("tenant")
                    .arg("request")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        if owner_tenant.as_deref() != Some(tenant.as_bytes()) {
            return Err(JournalError::NotFound);
        }
        Ok(request.filter(|r| !r.is_empty()).map(Bytes::from))
    }

    /// One read by script: what the journal holds after `after_seq`.
    async fn read_now(
        &self,
        tenant: &str,
        token: &ResumeToken,
        after_seq: u64,
    ) -> Result<Batch, JournalError> {
        let args = vec![
            tenant.as_bytes().to_vec(),
            after_seq.to_string().into_bytes(),
            MAX_BATCH.to_string().into_bytes(),
        ];
        let items = self.items("journal_read", &READ, token, args).await?;
        let bad = || JournalError::Unavailable(bad_reply("journal_read"));
        let int = |i: usize| items.get(i).and_then(reply::int).ok_or_else(bad);
        let (finished, live, last_seq) = (int(1)? == 1, int(2)? == 1, int(3)?.max(0) as u64);
        let mut events = Vec::new();
        for pair in items[4..].chunks(2) {
            let [seq, event] = pair else {
                return Err(bad());
            };
            let seq = reply::int(seq).ok_or_else(bad)?.max(0) as u64;
            let event = reply::bytes(event).ok_or_else(bad)?;
            events.push(Entry {
                seq,
                event: Bytes::from(event),
            });
        }
        let tail = match (finished, live) {
            (true, _) => Tail::Finished,
            (false, true) => Tail::Live,
            (false, false) => Tail::Orphaned,
        };
        Ok(Batch {
            events,
            tail,
            last_seq,
        })
    }

    /// Events after `after_seq`; when there are none and the owner holds
    /// its lease, waits up to `wait` on `tail` (made on first use) for the
    /// next entry and reads once more.
    pub(super) async fn read(
        &self,
        tenant: &str,
        token: &ResumeToken,
        after_seq: u64,
        wait: Duration,
        tail: &mut Option<Tailer>,
    ) -> Result<Batch, JournalError> {
        let batch = self.read_now(tenant, token, after_seq).await?;
        if !batch.events.is_empty() || batch.tail != Tail::Live || wait.is_zero() {
            return Ok(batch);
        }
        self.wait_for_entry(token, after_seq, wait.min(MAX_WAIT), tail)
            .await?;
        self.read_now(tenant, token, after_seq).await
    }

    /// Blocks until the stream holds an entry after `<after_seq>-0` (an
    /// event or a marker) or `wait` passes.
    async fn wait_for_entry(
        &self,
        token: &ResumeToken,
        after_seq: u64,
        wait: Duration,
        tail: &mut Option<Tailer>,
    ) -> Result<(), JournalError> {
        let timeout = self.redis.call_timeout();
        if tail.is_none() {
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(MAX_WAIT + timeout));
            let connection = tokio::time::timeout(
                timeout,
                self.redis
                    .client()
                    .get_multiplexed_async_connection_with_config(&config),
            )
            .await
            .map_err(|_| StateError::Unavailable("redis journal tail: connect timed out".into()))?
            .map_err(|e| StateError::Unavailable(format!("redis journal tail: {e}")))?;
            *tail = Some(Tailer { connection });
        }
        let Some(Tailer { connection }) = tail.as_mut() else {
            return Ok(());
        };
        let [_, events] = self.keys(token);
        let blocked: Result<Result<Value, redis::RedisError>, _> = tokio::time::timeout(
            wait + timeout,
            redis::cmd("XREAD")
                .arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(ms(wait, 1))
                .arg("STREAMS")
                .arg(&events)
                .arg(format!("{after_seq}-0"))
                .query_async(connection),
        )
        .await;
        match blocked {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                *tail = None;
                Err(StateError::Unavailable(format!("redis journal tail: {e}")).into())
            }
            Err(_) => {
                *tail = None;
                Err(StateError::Unavailable("redis journal tail timed out".into()).into())
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::state::redis::testutil::RedisServer;

    fn bounds(ttl: Duration, lease: Duration) -> Bounds {
        Bounds {
            ttl,
            max_bytes_per_stream: 100,
            max_total_bytes: 0,
            lease,
        }
    }

    fn ev(n: usize) -> Vec<u8> {
        vec![b'x'; n]
    }

    async fn read(j: &RedisJournal, tenant: &str, t: &ResumeToken, after: u64) -> Batch {
        j.read(tenant, t, after, Duration::ZERO, &mut None)
            .await
            .unwrap()
    }

    /// A journal of tenant `a` opened on `server` (ttl 60 s, lease 20 s).
    async fn opened(server: &RedisServer) -> (RedisJournal, Owner, ResumeToken) {
        let j = RedisJournal::new(
            server.client(),
            bounds(Duration::from_secs(60), Duration::from_secs(20)),
        );
        let o = Owner::generate();
        let t = ResumeToken::generate();
        j.open("a", &t, &o, b"").await.unwrap();
        (j, o, t)
    }

    #[tokio::test]
    async fn redis_a_batch_appends_in_one_call_in_order_up_to_a_bound() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let (j, o, t) = opened(&server).await;
        let batch: Vec<(u64, &[u8])> = vec![(1, b"a"), (2, b"bb"), (3, b"c")];
        assert_eq!(
            j.append_many(&t, &o, &batch).await.unwrap(),
            Appended::Stored
        );
        j.append(&t, &o, 4, b"d").await.unwrap();
        let b = read(&j, "a", &t, 0).await;
        let got: Vec<(u64, &[u8])> = b.events.iter().map(|e| (e.seq, e.event.as_ref())).collect();
        assert_eq!(got, vec![(1, &b"a"[..]), (2, b"bb"), (3, b"c"), (4, b"d")]);
        assert_eq!(b.last_seq, 4);
        // A gap inside a batch stores what came before it and says where.
        let gap: Vec<(u64, &[u8])> = vec![(5, b"e"), (7, b"g")];
        assert_eq!(
            j.append_many(&t, &o, &gap).await.unwrap_err(),
            JournalError::OutOfOrder {
                expected: 6,
                got: 5
            }
        );
        assert_eq!(read(&j, "a", &t, 0).await.last_seq, 5);
        // Passing the 100-byte bound mid-batch makes the stream unresumable.
        let (big, more) = (ev(60), ev(60));
        let past: Vec<(u64, &[u8])> = vec![(6, &big), (7, &more)];
        assert!(matches!(
            j.append_many(&t, &o, &past).await.unwrap(),
            Appended::NotResumable(_)
        ));
    }

    #[tokio::test]
    async fn redis_events_read_back_in_order_with_their_bytes_and_the_expiry_set() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let (j, o, t) = opened(&server).await;
        for seq in 1..=3u64 {
            let e = format!("e{seq}\0bin");
            assert_eq!(
                j.append(&t, &o, seq, e.as_bytes()).await.unwrap(),
                Appended::Stored
            );
        }
        let b = read(&j, "a", &t, 1).await;
        assert_eq!(
            b.events,
            vec![
                Entry {
                    seq: 2,
                    event: Bytes::from_static(b"e2\0bin")
                },
                Entry {
                    seq: 3,
                    event: Bytes::from_static(b"e3\0bin")
                },
            ]
        );
        assert_eq!((b.tail, b.last_seq), (Tail::Live, 3));
        assert_eq!(
            j.append(&t, &o, 5, b"x").await.unwrap_err(),
            JournalError::OutOfOrder {
                expected: 4,
                got: 5
            }
        );
        j.finish(&t, &o).await.unwrap();
        assert!(read(&j, "a", &t, 1).await.ends_stream(1));
        assert_eq!(
            j.append(&t, &o, 4, b"x").await.unwrap_err(),
            JournalError::Finished
        );
        // The layout: a stream of three events and the finish marker,
        // expiring with the ttl; the meta hash lives twice as long.
        let base = format!("switchyard:{{j:{}}}", t.as_str());
        let len: i64 = server
            .raw(&["XLEN", &format!("{base}:events")])
            .await
            .unwrap();
        assert_eq!(len, 4);
        let pttl: i64 = server
            .raw(&["PTTL", &format!("{base}:events")])
            .await
            .unwrap();
        assert!(pttl > 50_000 && pttl <= 60_000, "{pttl}");
        let pttl: i64 = server
            .raw(&["PTTL", &format!("{base}:meta")])
            .await
            .unwrap();
        assert!(pttl > 110_000 && pttl <= 120_000, "{pttl}");
        let bytes: String = server
            .raw(&["HGET", &format!("{base}:meta"), "bytes"])
            .await
            .unwrap();
        assert_eq!(bytes, "18");
    }

    #[tokio::test]
    async fn redis_another_tenant_gets_not_found_and_an_expired_token_expired() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let j = RedisJournal::new(
            server.client(),
            bounds(Duration::from_millis(300), Duration::from_secs(20)),
        );
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o, b"").await.unwrap();
            t
        };
        j.append(&t, &o, 1, b"x").await.unwrap();
        let other = Owner::generate();
        assert_eq!(
            j.read("b", &t, 0, Duration::ZERO, &mut None)
                .await
                .unwrap_err(),
            JournalError::NotFound
        );
        assert_eq!(
            j.claim("b", &t, &other).await.unwrap_err(),
            JournalError::NotFound
        );
        assert_eq!(
            j.read("a", &ResumeToken::generate(), 0, Duration::ZERO, &mut None)
                .await
                .unwrap_err(),
            JournalError::NotFound
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            j.read("a", &t, 0, Duration::ZERO, &mut None)
                .await
                .unwrap_err(),
            JournalError::Expired
        );
        assert_eq!(
            j.read("b", &t, 0, Duration::ZERO, &mut None)
                .await
                .unwrap_err(),
            JournalError::NotFound,
            "not even that it expired"
        );
        // The events are gone with the ttl; the meta hash answers Expired
        // for one more ttl, then nothing is left.
        let base = format!("switchyard:{{j:{}}}", t.as_str());
        let events: i64 = server
            .raw(&["EXISTS", &format!("{base}:events")])
            .await
            .unwrap();
        assert_eq!(events, 0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            j.read("a", &t, 0, Duration::ZERO, &mut None)
                .await
                .unwrap_err(),
            JournalError::NotFound
        );
    }

    #[tokio::test]
    async fn redis_past_the_byte_bound_the_journal_is_dropped_and_not_resumable() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let j = RedisJournal::new(
            server.client(),
            bounds(Duration::from_secs(60), Duration::from_secs(20)),
        );
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            j.open("a", &t, &o, b"").await.unwrap();
            t
        };
        assert_eq!(
            j.append(&t, &o, 1, &ev(60)).await.unwrap(),
            Appended::Stored
        );
        assert_eq!(
            j.append(&t, &o, 2, &ev(40)).await.unwrap(),
            Appended::Stored,
            "exactly at the bound"
        );
        assert_eq!(
            j.append(&t, &o, 3, &ev(1)).await.unwrap(),
            Appended::NotResumable(Bound::PerStream)
        );
        assert_eq!(
            j.append(&t, &o, 4, &ev(1)).await.unwrap(),
            Appended::NotResumable(Bound::PerStream),
            "later appends refused, with no sequence check"
        );
        let base = format!("switchyard:{{j:{}}}", t.as_str());
        let len: i64 = server
            .raw(&["XLEN", &format!("{base}:events")])
            .await
            .unwrap();
        assert_eq!(len, 1, "only the marker is left");
        assert_eq!(
            j.read("a", &t, 0, Duration::ZERO, &mut None)
                .await
                .unwrap_err(),
            JournalError::NotResumable(Bound::PerStream)
        );
        j.finish(&t, &o).await.unwrap();
    }

    #[tokio::test]
    async fn redis_a_lapsed_lease_by_redis_time_lets_a_survivor_take_over() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let lease = Duration::from_millis(300);
        let b = bounds(Duration::from_secs(60), lease);
        let first = RedisJournal::new(server.client(), b);
        let second = RedisJournal::new(server.client(), b);
        let (old, new) = (Owner::generate(), Owner::generate());
        let t = {
            let t = ResumeToken::generate();
            first.open("a", &t, &old, b"").await.unwrap();
            t
        };
        first.append(&t, &old, 1, b"a").await.unwrap();
        assert_eq!(second.claim("a", &t, &new).await.unwrap(), Claim::Held);
        // The old owner stops renewing (a SIGKILL): the lease lapses in Redis.
        tokio::time::sleep(lease + Duration::from_millis(100)).await;
        assert_eq!(read(&second, "a", &t, 1).await.tail, Tail::Orphaned);
        assert_eq!(
            second.claim("a", &t, &new).await.unwrap(),
            Claim::Taken { last_seq: 1 }
        );
        assert_eq!(
            first.append(&t, &old, 2, b"b").await.unwrap_err(),
            JournalError::Fenced
        );
        assert_eq!(
            first.renew(&t, &old).await.unwrap_err(),
            JournalError::Fenced
        );
        second.append(&t, &new, 2, b"b").await.unwrap();
        second.renew(&t, &new).await.unwrap();
        assert_eq!(read(&first, "a", &t, 0).await.tail, Tail::Live);
        assert_eq!(
            first.claim("a", &t, &old).await.unwrap(),
            Claim::Held,
            "the new owner's lease is live"
        );
        second.finish(&t, &new).await.unwrap();
        assert_eq!(second.claim("a", &t, &old).await.unwrap(), Claim::Finished);
        // The lease is Redis's: lease_until sits within a lease of Redis TIME.
        let base = format!("switchyard:{{j:{}}}", t.as_str());
        let until: i64 = server
            .raw(&["HGET", &format!("{base}:meta"), "lease_until"])
            .await
            .unwrap();
        let time: Vec<i64> = server.raw(&["TIME"]).await.unwrap();
        let now = time[0] * 1000 + time[1] / 1000;
        assert!(until > now - 1000 && until <= now + 300, "{until} vs {now}");
    }

    #[tokio::test]
    async fn redis_the_tail_wait_wakes_on_an_append_and_is_bounded() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let b = bounds(Duration::from_secs(60), Duration::from_secs(20));
        let owner_side = RedisJournal::new(server.client(), b);
        let reader_side = RedisJournal::new(server.client(), b);
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            owner_side.open("a", &t, &o, b"").await.unwrap();
            t
        };
        // Nothing comes: the wait lasts its bound (at least) and ends empty.
        let mut tail = None;
        let start = std::time::Instant::now();
        let batch = reader_side
            .read("a", &t, 0, Duration::from_millis(300), &mut tail)
            .await
            .unwrap();
        assert!(batch.events.is_empty());
        assert!(start.elapsed() >= Duration::from_millis(300));
        assert!(tail.is_some(), "the tail waits on a connection of its own");
        // An append wakes a reader waiting 20 s long before the bound.
        let appender = {
            let (j, t, o) = (owner_side.clone(), t.clone(), o);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                j.append(&t, &o, 1, b"t1").await.unwrap();
            })
        };
        let start = std::time::Instant::now();
        let batch = reader_side
            .read("a", &t, 0, Duration::from_secs(20), &mut tail)
            .await
            .unwrap();
        appender.await.unwrap();
        assert_eq!(batch.events.len(), 1);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "woken, not timed out"
        );
        // So does a finish.
        let finisher = {
            let (j, t, o) = (owner_side.clone(), t.clone(), o);
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                j.finish(&t, &o).await.unwrap();
            })
        };
        let start = std::time::Instant::now();
        let batch = reader_side
            .read("a", &t, 1, Duration::from_secs(20), &mut tail)
            .await
            .unwrap();
        finisher.await.unwrap();
        assert!(batch.ends_stream(1));
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "woken, not timed out"
        );
    }

    #[tokio::test]
    async fn redis_two_replicas_tail_one_stream_to_its_end() {
        let Some(server) = RedisServer::start() else {
            return;
        };
        let b = bounds(Duration::from_secs(60), Duration::from_secs(20));
        let owner_side = RedisJournal::new(server.client(), b);
        let o = Owner::generate();
        let t = {
            let t = ResumeToken::generate();
            owner_side.open("a", &t, &o, b"").await.unwrap();
            t
        };
        owner_side.append(&t, &o, 1, b"t1").await.unwrap();
        let mut readers = Vec::new();
        for _ in 0..2 {
            let j = super::super::Journal::Redis {
                journal: RedisJournal::new(server.client(), b),
                faults: crate::state::StateFaults::new(std::sync::Arc::new(
                    crate::telemetry::metrics::Metrics::new(),
                )),
            };
            let t = t.clone();
            readers.push(tokio::spawn(async move {
                let mut r = j.reader("a", &t, 0).await.unwrap();
                let mut got = Vec::new();
                loop {
                    let batch = r.next(Duration::from_secs(5)).await.unwrap();
                    let after = r.position();
                    got.extend(batch.events.iter().map(|e| e.event.clone()));
                    if batch.ends_stream(after) {
                        return got;
                    }
                }
            }));
        }
        for seq in 2..=20u64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            owner_side
                .append(&t, &o, seq, format!("t{seq}").as_bytes())
                .await
                .unwrap();
        }
        owner_side.finish(&t, &o).await.unwrap();
        let want: Vec<Bytes> = (1..=20).map(|i| Bytes::from(format!("t{i}"))).collect();
        for r in readers {
            let got = tokio::time::timeout(Duration::from_secs(10), r)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, want);
        }
    }
}
