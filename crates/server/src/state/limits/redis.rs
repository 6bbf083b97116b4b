//! The fleet's rate windows on Redis: one hash per key
//! (`{fleet}:limits:<provider/key>`) holding the configured window's start
//! and usage, what every replica holds and has not had answered yet, what
//! the upstream last reported (remaining, reset, used since) and until when
//! batch work yields. Each operation is one script
//! clocked by Redis, so replicas agree on the window whatever their clocks;
//! the hash expires a minute after its last window ends.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use crate::policy::rate_window::{
    Hold, Limits, Priority, Reported, Room, PRESSURE_MS, SAME_WINDOW_MS, WINDOW_MS,
};
use crate::state::redis::{bad_reply, num, reply, Redis, LUA_NOW};
use crate::state::StateError;

/// The set of keys that reported windows (`{fleet}:limits-reporting`).
const REPORTING: &str = "limits-reporting";

/// Reads the hash, rolls lapsed windows and defines `room()`.
const LUA_WINDOW: &str = r"
local function load(key, now, window)
  local t = {}
  local flat = redis.call('HGETALL', key)
  for i = 1, #flat, 2 do t[flat[i]] = tonumber(flat[i + 1]) end
  local w = {start = t.start or 0, ureq = t.ureq or 0, utok = t.utok or 0,
    oreq = t.oreq or 0, otok = t.otok or 0,
    rq_rem = t.rq_rem or 0, rq_at = t.rq_at or 0, rq_used = t.rq_used or 0, rq_lim = t.rq_lim or 0,
    tk_rem = t.tk_rem or 0, tk_at = t.tk_at or 0, tk_used = t.tk_used or 0, tk_lim = t.tk_lim or 0,
    pressure = t.pressure or 0}
  if w.start == 0 or now >= w.start + window then
    w.start = now; w.ureq = 0; w.utok = 0; w.oreq = 0; w.otok = 0
  end
  -- A lapsed reported window starts again from its size, when known.
  if w.rq_at ~= 0 and now >= w.rq_at then
    w.rq_used = 0
    if w.rq_lim > 0 then w.rq_rem = w.rq_lim; w.rq_at = now + window else w.rq_at = 0 end
  end
  if w.tk_at ~= 0 and now >= w.tk_at then
    w.tk_used = 0
    if w.tk_lim > 0 then w.tk_rem = w.tk_lim; w.tk_at = now + window else w.tk_at = 0 end
  end
  return w
end
local function save(key, w, now, window)
  redis.call('HSET', key, 'start', w.start, 'ureq', w.ureq, 'utok', w.utok,
    'oreq', w.oreq, 'otok', w.otok,
    'rq_rem', w.rq_rem, 'rq_at', w.rq_at, 'rq_used', w.rq_used, 'rq_lim', w.rq_lim,
    'tk_rem', w.tk_rem, 'tk_at', w.tk_at, 'tk_used', w.tk_used, 'tk_lim', w.tk_lim,
    'pressure', w.pressure)
  local last = math.max(w.start + window, w.rq_at, w.tk_at, w.pressure)
  redis.call('PEXPIREAT', key, last + window)
end
-- Left in the stricter window of each kind (-1: unbounded) and the
-- soonest reset among the windows that bound them (-1: none).
local function room(w, rpm, tpm, window)
  local reset = -1
  local function note(at) if reset < 0 or at < reset then reset = at end end
  local function stricter(limit, used, at, rem, lused)
    local left = -1
    if limit > 0 then left = math.max(limit - used, 0); note(w.start + window) end
    if at ~= 0 then
      local l = math.max(rem - lused, 0)
      if left < 0 or l < left then left = l end
      note(at)
    end
    return left
  end
  local req = stricter(rpm, w.ureq, w.rq_at, w.rq_rem, w.rq_used)
  local tok = stricter(tpm, w.utok, w.tk_at, w.tk_rem, w.tk_used)
  return req, tok, reset
end
";

/// KEYS: the key's hash. ARGV: rpm (0 none), tpm (0 none), tokens, batch
/// (0/1), batch share, window ms, pressure ms.
/// -> {1, window start, req left, tok left, reset at, now} or {0, wait ms, req left, tok left, reset at, now}.
static RESERVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_WINDOW}{}",
        r"
local now = now_ms()
local rpm, tpm, tokens = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local batch, window = ARGV[4] == '1', tonumber(ARGV[6])
local w = load(KEYS[1], now, window)
local share = 1
if batch and now < w.pressure then share = tonumber(ARGV[5]) end
local function cap(x) return math.floor(x * share) end
local wait = -1
local function refuse(at)
  local d = math.max(at - now, 1)
  if wait < 0 or d < wait then wait = d end
end
if rpm > 0 and w.ureq + 1 > cap(rpm) then refuse(w.start + window) end
if tpm > 0 and w.utok + tokens > cap(tpm) then refuse(w.start + window) end
if w.rq_at ~= 0 and w.rq_used + 1 > cap(w.rq_rem) then refuse(w.rq_at) end
if w.tk_at ~= 0 and w.tk_used + tokens > cap(w.tk_rem) then refuse(w.tk_at) end
local ok = 1
if wait >= 0 then
  ok = 0
  if not batch then w.pressure = now + tonumber(ARGV[7]) end
else
  w.ureq = w.ureq + 1; w.utok = w.utok + tokens
  w.oreq = w.oreq + 1; w.otok = w.otok + tokens
  if w.rq_at ~= 0 then w.rq_used = w.rq_used + 1 end
  if w.tk_at ~= 0 then w.tk_used = w.tk_used + tokens end
end
save(KEYS[1], w, now, window)
local req, tok, reset = room(w, rpm, tpm, window)
if ok == 1 then return {1, w.start, req, tok, reset, now} end
return {0, wait, req, tok, reset, now}
"
    ))
});

/// KEYS: the key's hash. ARGV: window start, held tokens, used tokens
/// (-1: unknown, the hold stays in the configured window).
static SETTLE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local start = tonumber(redis.call('HGET', KEYS[1], 'start') or '0')
if start ~= tonumber(ARGV[1]) then return 0 end
local held, used = tonumber(ARGV[2]), tonumber(ARGV[3])
local function less(field, by)
  local v = tonumber(redis.call('HGET', KEYS[1], field) or '0')
  redis.call('HSET', KEYS[1], field, math.max(v - by, 0))
end
less('oreq', 1)
less('otok', held)
if used >= 0 then less('utok', held - used) end
return 1
",
    )
});

/// KEYS: the key's hash, the set of reporting keys. ARGV: requests left
/// (-1 unknown), reset in ms, tokens left (-1 unknown), reset in ms, rpm,
/// tpm, window ms, same-window ms, requests limit (0 unknown), tokens limit
/// (0 unknown), the key's id, the answered hold's window start (0: none)
/// and tokens.
/// -> {req left, tok left, reset at, now}.
static LEARN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{LUA_NOW}{LUA_WINDOW}{}",
        r"
local now = now_ms()
local window = tonumber(ARGV[7])
local w = load(KEYS[1], now, window)
local rq, rq_in, tk, tk_in = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local same = tonumber(ARGV[8])
-- What is outstanding stays counted against the report (it may not be
-- in it); within the same window an answer only lowers what is left.
local function merge(rem, at, used, new, new_at, out)
  if at ~= 0 and math.abs(at - new_at) < same then
    return math.min(new, math.max(rem - used, 0) + out), math.max(at, new_at)
  end
  return new, new_at
end
local rq_lim, tk_lim = tonumber(ARGV[9]), tonumber(ARGV[10])
-- The answered request is in its own report; every other one out may not be.
local oreq, otok = w.oreq, w.otok
if tonumber(ARGV[12]) == w.start then
  oreq = math.max(oreq - 1, 0); otok = math.max(otok - tonumber(ARGV[13]), 0)
end
if rq >= 0 and rq_in > 0 then
  w.rq_rem, w.rq_at = merge(w.rq_rem, w.rq_at, w.rq_used, rq, now + rq_in, oreq); w.rq_used = oreq
  if rq_lim > 0 then w.rq_lim = rq_lim end
end
if tk >= 0 and tk_in > 0 then
  w.tk_rem, w.tk_at = merge(w.tk_rem, w.tk_at, w.tk_used, tk, now + tk_in, otok); w.tk_used = otok
  if tk_lim > 0 then w.tk_lim = tk_lim end
end
save(KEYS[1], w, now, window)
-- The fleet learns which keys report windows (a replica asks about them
-- from then on, even before its own first answer from them).
redis.call('SADD', KEYS[2], ARGV[11])
redis.call('PEXPIRE', KEYS[2], 86400000)
local req, tok, reset = room(w, tonumber(ARGV[5]), tonumber(ARGV[6]), window)
return {req, tok, reset, now}
"
    ))
});

fn room_of(items: &[Value], from: usize) -> Option<Room> {
    let int = |i: usize| items.get(i).and_then(reply::int);
    let left = |v: i64| (v >= 0).then_some(v as u64);
    let (req, tok, reset, now) = (int(from)?, int(from + 1)?, int(from + 2)?, int(from + 3)?);
    Some(Room {
        requests: left(req),
        tokens: left(tok),
        reset_in_ms: left(reset).map(|at| at.saturating_sub(now as u64)),
    })
}

impl Redis {
    fn limits_key(&self, id: &str) -> String {
        self.fleet_key(&format!("limits:{id}"))
    }

    /// One request of `tokens` on key `id`: held, or the wait until the
    /// soonest full window resets; and what the key has left after it.
    pub(super) async fn limits_reserve(
        &self,
        id: &str,
        limits: Limits,
        tokens: u64,
        priority: Priority,
    ) -> Result<(Result<Hold, Duration>, Room), StateError> {
        let key = self.limits_key(id);
        let (batch, share) = match priority {
            Priority::Interactive => ("0", 1.0),
            Priority::Batch { share } => ("1", share),
        };
        let v: Value = self
            .call("limits_reserve", |mut c| async move {
                RESERVE
                    .key(key)
                    .arg(limits.rpm.unwrap_or(0))
                    .arg(limits.tpm.unwrap_or(0))
                    .arg(tokens)
                    .arg(batch)
                    .arg(num(share))
                    .arg(WINDOW_MS)
                    .arg(PRESSURE_MS)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let items = reply::items(v).ok_or_else(|| bad_reply("limits_reserve"))?;
        let int = |i: usize| items.get(i).and_then(reply::int);
        let room = room_of(&items, 2).ok_or_else(|| bad_reply("limits_reserve"))?;
        let result = match (int(0), int(1)) {
            (Some(1), Some(start)) => Ok(Hold {
                tokens,
                window_start_ms: start as u64,
            }),
            (Some(0), Some(wait)) => Err(Duration::from_millis(wait.max(1) as u64)),
            _ => return Err(bad_reply("limits_reserve")),
        };
        Ok((result, room))
    }

    /// A held request was answered, having used `tokens` (`None`: unknown).
    pub(super) async fn limits_settle(
        &self,
        id: &str,
        hold: Hold,
        tokens: Option<u64>,
    ) -> Result<(), StateError> {
        let tokens = tokens.map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX));
        let key = self.limits_key(id);
        let _: i64 = self
            .call("limits_settle", |mut c| async move {
                SETTLE
                    .key(key)
                    .arg(hold.window_start_ms)
                    .arg(hold.tokens)
                    .arg(tokens)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        Ok(())
    }

    /// The upstream reported key `id`'s windows (reset times relative to
    /// now), answering the request `answering` held.
    pub(super) async fn limits_learn(
        &self,
        id: &str,
        limits: Limits,
        reported: Reported,
        answering: Option<Hold>,
    ) -> Result<Room, StateError> {
        let answering = answering.unwrap_or(Hold {
            tokens: 0,
            window_start_ms: 0,
        });
        let key = self.limits_key(id);
        let triple = |l: Option<crate::policy::rate_window::Left>| {
            l.map_or((-1_i64, 0_u64, 0_u64), |l| {
                (l.remaining as i64, l.reset_at_ms, l.limit.unwrap_or(0))
            })
        };
        let (rq, rq_in, rq_lim) = triple(reported.requests);
        let (tk, tk_in, tk_lim) = triple(reported.tokens);
        let reporting = self.fleet_key(REPORTING);
        let v: Value = self
            .call("limits_learn", |mut c| async move {
                LEARN
                    .key(key)
                    .key(reporting)
                    .arg(rq)
                    .arg(rq_in)
                    .arg(tk)
                    .arg(tk_in)
                    .arg(limits.rpm.unwrap_or(0))
                    .arg(limits.tpm.unwrap_or(0))
                    .arg(WINDOW_MS)
                    .arg(SAME_WINDOW_MS)
                    .arg(rq_lim)
                    .arg(tk_lim)
                    .arg(id)
                    .arg(answering.window_start_ms)
                    .arg(answering.tokens)
                    .invoke_async(&mut c)
                    .await
            })
            .await?;
        let items = reply::items(v).ok_or_else(|| bad_reply("limits_learn"))?;
        room_of(&items, 0).ok_or_else(|| bad_reply("limits_learn"))
    }

    /// The keys (`provider/key`) some replica learned windows for, at
    /// most `max`.
    pub(super) async fn limits_reporting(&self, max: usize) -> Result<Vec<String>, StateError> {
        let set = self.fleet_key(REPORTING);
        let ids: Vec<String> = self
            .call("limits_reporting", |mut c| async move {
                redis::cmd("SRANDMEMBER")
                    .arg(set)
                    .arg(max)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok(ids)
    }
}
