//! Idempotency records, in one home: this face (`Idempotency`) with what a
//! Redis outage does, the in-process store (`embedded`) and the fleet's
//! records on Redis (`redis`).
//!
//! On Redis an in-flight claim is a lease (`state.lease`, 20 s) renewed while
//! its request lives, so a dead replica's claim lapses within it; a
//! completion or release that fails is retried with backoff until Redis
//! answers (or the lease has lapsed anyway). A claim Redis cannot answer
//! fails closed: STATE_UNAVAILABLE, never a silent second generation; with a
//! WARN and `switchyard_state_errors_total{function="idempotency"}`.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::RequestError;
use crate::sink::Event;
use crate::state::redis::lease::{Renewal, Retries};
use crate::state::redis::Redis;
use crate::state::{token, StateFaults};

pub mod embedded;
mod redis;

pub use embedded::{Claim, ClaimGuard, IdempotencyStore};

/// A stable digest of the parts of a request that determine its answer.
pub type Fingerprint = [u8; 32];

/// What an idempotency claim found.
#[derive(Debug, Clone, PartialEq)]
pub enum IdemClaim {
    /// First use: run the request, then complete or release the claim.
    Fresh,
    /// A finished request with the same fingerprint: these are its stored
    /// answer bytes, and its stream's resume token if it had one.
    Replay(Vec<u8>, Option<String>),
    /// The same key and fingerprint is being served now, by a run whose
    /// stream has this resume token (if any).
    InUse(Option<String>),
    /// The key was used with a different fingerprint.
    Mismatch,
}

/// Idempotency records: in process, or one record per `tenant:key` for the fleet.
pub enum Idempotency {
    Embedded(Arc<IdempotencyStore>),
    Redis(RedisIdempotency),
}

/// The fleet's records and what a claim needs to finish itself.
pub struct RedisIdempotency {
    redis: Redis,
    faults: Arc<StateFaults>,
    retries: Arc<Retries>,
    /// How long a finished answer is replayed.
    ttl: Duration,
    /// An unfinished claim lapses this long after its last renewal.
    lease: Duration,
}

/// What a claim found. `resume` is the resume token of the stream that
/// claimed the key first, when it had one: a reconnect follows its journal.
pub enum KeyClaim {
    Fresh(KeyGuard),
    Replay {
        events: Arc<Vec<Event>>,
        resume: Option<String>,
    },
    InUse {
        resume: Option<String>,
    },
    Mismatch,
}

/// A held claim: `complete` stores the answer; dropping it releases the key.
pub enum KeyGuard {
    Embedded(ClaimGuard),
    Redis(RedisClaim),
}

/// A claim on the fleet's record, renewed while held.
pub struct RedisClaim {
    redis: Redis,
    retries: Arc<Retries>,
    key: String,
    token: String,
    ttl: Duration,
    lease: Duration,
    done: bool,
    _renewal: Renewal,
}

impl Idempotency {
    pub fn redis(
        redis: Redis,
        faults: Arc<StateFaults>,
        retries: Arc<Retries>,
        ttl: Duration,
        lease: Duration,
    ) -> Self {
        Idempotency::Redis(RedisIdempotency {
            redis,
            faults,
            retries,
            ttl,
            lease,
        })
    }

    /// Claims `key` for a run whose stream has the journal `resume` (if any).
    pub async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        resume: Option<&str>,
        now: Instant,
    ) -> Result<KeyClaim, RequestError> {
        match self {
            Idempotency::Embedded(store) => Ok(match store.claim(key, fingerprint, resume, now) {
                Claim::Fresh(g) => KeyClaim::Fresh(KeyGuard::Embedded(g)),
                Claim::Replay { events, resume } => KeyClaim::Replay { events, resume },
                Claim::InUse { resume } => KeyClaim::InUse { resume },
                Claim::Mismatch => KeyClaim::Mismatch,
            }),
            Idempotency::Redis(r) => r.claim(key, fingerprint, resume).await,
        }
    }
}

impl RedisIdempotency {
    async fn claim(
        &self,
        key: &str,
        fingerprint: Fingerprint,
        resume: Option<&str>,
    ) -> Result<KeyClaim, RequestError> {
        let token = token();
        let claim = self
            .redis
            .idem_claim(key, &fingerprint, &token, self.lease, resume)
            .await
            .map_err(|e| {
                self.faults.record(
                    "idempotency",
                    &e,
                    "keyed requests are refused (fail closed)",
                );
                RequestError::StateUnavailable(format!(
                    "idempotency records cannot be checked: {e}"
                ))
            })?;
        Ok(match claim {
            IdemClaim::Fresh => KeyClaim::Fresh(KeyGuard::Redis(self.held(key, token))),
            IdemClaim::Replay(bytes, resume) => {
                match serde_json::from_slice::<Vec<Event>>(&bytes) {
                    Ok(events) => KeyClaim::Replay {
                        events: Arc::new(events),
                        resume,
                    },
                    Err(e) => {
                        return Err(RequestError::StateUnavailable(format!(
                            "the stored answer for this key is unreadable: {e}"
                        )))
                    }
                }
            }
            IdemClaim::InUse(resume) => KeyClaim::InUse { resume },
            IdemClaim::Mismatch => KeyClaim::Mismatch,
        })
    }

    /// The claim `token` on `key`, renewed until completed or dropped.
    fn held(&self, key: &str, token: String) -> RedisClaim {
        let (redis, k, t, lease) = (
            self.redis.clone(),
            key.to_string(),
            token.clone(),
            self.lease,
        );
        let renewal = Renewal::start(self.faults.clone(), "idempotency", lease, move || {
            let (redis, k, t) = (redis.clone(), k.clone(), t.clone());
            async move { redis.idem_renew(&k, &t, lease).await }
        });
        RedisClaim {
            redis: self.redis.clone(),
            retries: self.retries.clone(),
            key: key.to_string(),
            token,
            ttl: self.ttl,
            lease,
            done: false,
            _renewal: renewal,
        }
    }
}

impl KeyGuard {
    /// Stores the finished answer for replays.
    pub async fn complete(self, events: Vec<Event>) {
        match self {
            KeyGuard::Embedded(g) => g.complete(events, Instant::now()),
            KeyGuard::Redis(mut c) => match serde_json::to_vec(&events) {
                Ok(bytes) => {
                    c.done = true;
                    c.store(bytes).await;
                }
                // Dropping the claim releases the key: a duplicate runs again.
                Err(e) => tracing::warn!(error = %e, "idempotency record not stored"),
            },
        }
    }
}

impl RedisClaim {
    /// Stores the answer; while Redis does not take it, retries in the
    /// background (or, past the retry bounds, releases the key instead).
    async fn store(&self, answer: Vec<u8>) {
        let first = self
            .redis
            .idem_complete(&self.key, &self.token, &answer, self.ttl)
            .await;
        if first.is_ok() {
            return;
        }
        let (redis, key, token, ttl) = (
            self.redis.clone(),
            self.key.clone(),
            self.token.clone(),
            self.ttl,
        );
        let answer = Arc::new(answer);
        let bytes = answer.len();
        let completing = self
            .retries
            .spawn("idempotency", bytes, self.lease, move || {
                let (redis, key, token, answer) =
                    (redis.clone(), key.clone(), token.clone(), answer.clone());
                async move {
                    redis.idem_complete(&key, &token, &answer, ttl).await?;
                    Ok(())
                }
            });
        if !completing {
            self.release();
        }
    }

    /// Frees the key, retried until Redis answers.
    fn release(&self) {
        let (redis, key, token) = (self.redis.clone(), self.key.clone(), self.token.clone());
        let releasing = self.retries.spawn("idempotency", 0, self.lease, move || {
            let (redis, key, token) = (redis.clone(), key.clone(), token.clone());
            async move { redis.idem_release(&key, &token).await }
        });
        if !releasing {
            tracing::warn!(
                "too many releases being retried: an idempotency key lapses with its lease"
            );
        }
    }
}

impl Drop for RedisClaim {
    fn drop(&mut self) {
        if !self.done {
            self.release();
        }
    }
}
