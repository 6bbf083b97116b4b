//! The mock's request log and in-flight accounting.
//! Owns [`RequestRecord`] and the [`Attempt`] guard that finalises a record
//! exactly once: completed, aborted by the mock, or dropped (client hung up).
//! Never stores credentials: only whether an auth header was present.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::MockKind;

/// One non-control request the mock received, as served by `GET /_mock/requests`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// 1-based arrival order since the mock started (not reset by a clear).
    pub seq: u64,
    /// Request path, e.g. `/v1/chat/completions`.
    pub path: String,
    /// Wire format chosen by the path.
    pub dialect: MockKind,
    /// `model` from the body, if any.
    pub model: Option<String>,
    /// `stream` from the body (false when absent).
    pub stream: bool,
    /// `max_tokens` (or OpenAI `max_completion_tokens`) from the body.
    pub max_tokens: Option<u32>,
    /// The body carried a non-empty `tools` array.
    pub has_tools: bool,
    /// The parsed JSON body (`null` if it did not parse).
    pub body: serde_json::Value,
    /// An `authorization`, `x-api-key` or `api-key` header was present (the value is never kept).
    pub authorization_present: bool,
    /// Selected request headers, lower-case names: `x-switchyard-attempt`,
    /// `x-request-id`, `idempotency-key`, `x-stainless-retry-count`.
    pub headers: BTreeMap<String, String>,
    /// Milliseconds since the mock started when the request arrived.
    pub arrived_ms: f64,
    /// Milliseconds since the mock started when the response ended (any way).
    pub finished_ms: Option<f64>,
    /// HTTP status sent (`null` when no response head was produced, e.g. `hang`).
    pub status: Option<u16>,
    /// Fault type applied to this request, or `null` when served healthy.
    pub fault: Option<String>,
    /// Content tokens (or tool-argument fragments) handed to the connection.
    pub tokens_sent: u32,
    /// The whole response the mock meant to send was written and ended normally.
    pub completed: bool,
    /// The client went away before the response ended.
    pub client_hung_up: bool,
    /// Rejected because `max_concurrency` requests were already in flight.
    pub over_capacity: bool,
    /// The label `PUT /_mock/keys` gave the key this request came with
    /// (`labels`), so tests see which key was used (never the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_label: Option<String>,
    /// Tokens charged to the key's rate-limit window (`PUT /_mock/limits`):
    /// input plus `max_tokens`; 0 when the key is unlimited or was refused.
    #[serde(default)]
    pub rate_tokens: u32,
    /// Answered 429 by the key's rate-limit window.
    #[serde(default)]
    pub rate_limited: bool,
    /// The time-to-first-token wait sampled for this request (`ttft` of
    /// `PUT /_mock/config`), in ms.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Milliseconds since the mock started when the first content token
    /// was handed to the connection (`null` if none was).
    #[serde(default)]
    pub first_token_ms: Option<f64>,
    /// Milliseconds since the mock started when it noticed the client had
    /// gone away (set with `client_hung_up`).
    #[serde(default)]
    pub hung_up_ms: Option<f64>,
    /// The HTTP version the request came over: `HTTP/1.1`, or `HTTP/2.0`
    /// for a client speaking HTTP/2 with prior knowledge (h2c).
    #[serde(default)]
    pub http_version: String,
    /// The client's address (`127.0.0.1:54321`): requests with the same
    /// one came over the same connection.
    #[serde(default)]
    pub peer: String,
}

impl Default for RequestRecord {
    /// An empty record (for tests that build logs by hand).
    fn default() -> Self {
        RequestRecord {
            seq: 0,
            path: String::new(),
            dialect: MockKind::Openai,
            model: None,
            stream: false,
            max_tokens: None,
            has_tools: false,
            body: serde_json::Value::Null,
            authorization_present: false,
            headers: BTreeMap::new(),
            arrived_ms: 0.0,
            finished_ms: None,
            status: None,
            fault: None,
            tokens_sent: 0,
            completed: false,
            client_hung_up: false,
            over_capacity: false,
            key_label: None,
            rate_tokens: 0,
            rate_limited: false,
            ttft_ms: None,
            first_token_ms: None,
            hung_up_ms: None,
            http_version: String::new(),
            peer: String::new(),
        }
    }
}

/// Concurrency counters, as served by `GET /_mock/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Admitted requests whose response has not ended yet.
    pub in_flight: u32,
    /// Highest `in_flight` since start or since the last `DELETE /_mock/requests`.
    pub max_in_flight: u32,
    /// Requests logged since start or the last clear (the log itself keeps
    /// only the newest 100 000).
    pub requests: u64,
}

/// How a record was finalised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    /// Everything was written and the response ended normally.
    Completed,
    /// The mock cut the connection on purpose (fault).
    Aborted,
    /// The response (or handler) was dropped before it ended.
    HungUp,
}

/// Records kept before the oldest are dropped (long benchmarks).
const MAX_RECORDS: usize = 100_000;

/// Mutable log state behind one lock (never held across an await).
#[derive(Default)]
struct Inner {
    /// Records in arrival order, at most [`MAX_RECORDS`].
    records: VecDeque<RequestRecord>,
    /// Requests logged since start or the last clear.
    total: u64,
    /// Next sequence number to hand out.
    next_seq: u64,
    /// Admitted requests not yet finalised.
    in_flight: u32,
    /// High-water mark of `in_flight`.
    max_in_flight: u32,
}

/// The shared request log.
pub(crate) struct Log {
    /// Time zero for `arrived_ms` / `finished_ms`.
    started: Instant,
    inner: Mutex<Inner>,
}

impl Log {
    pub(crate) fn new(started: Instant) -> Self {
        Log {
            started,
            inner: Mutex::new(Inner {
                next_seq: 1,
                ..Inner::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now_ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1000.0
    }

    /// Records an arrival. Admits it unless `max_concurrency` (> 0) requests
    /// are already in flight, in which case the record is marked over capacity.
    pub(crate) fn begin(
        self: &Arc<Self>,
        mut record: RequestRecord,
        max_concurrency: u32,
    ) -> Attempt {
        let mut inner = self.lock();
        record.seq = inner.next_seq;
        inner.next_seq += 1;
        record.arrived_ms = self.now_ms();
        let admitted = max_concurrency == 0 || inner.in_flight < max_concurrency;
        record.over_capacity = !admitted;
        if admitted {
            inner.in_flight += 1;
            inner.max_in_flight = inner.max_in_flight.max(inner.in_flight);
        }
        let seq = record.seq;
        if inner.records.len() >= MAX_RECORDS {
            inner.records.pop_front();
        }
        inner.records.push_back(record);
        inner.total += 1;
        Attempt {
            log: Arc::clone(self),
            seq,
            counted: admitted,
            done: false,
        }
    }

    fn update(&self, seq: u64, f: impl FnOnce(&mut RequestRecord)) {
        let mut inner = self.lock();
        if let Ok(i) = inner.records.binary_search_by_key(&seq, |r| r.seq) {
            f(&mut inner.records[i]);
        }
    }

    pub(crate) fn snapshot(&self) -> Vec<RequestRecord> {
        self.lock().records.iter().cloned().collect()
    }

    /// Empties the log and restarts the high-water mark from the current load.
    pub(crate) fn clear(&self) {
        let mut inner = self.lock();
        inner.records.clear();
        inner.total = 0;
        inner.max_in_flight = inner.in_flight;
    }

    pub(crate) fn stats(&self) -> Stats {
        let inner = self.lock();
        Stats {
            in_flight: inner.in_flight,
            max_in_flight: inner.max_in_flight,
            requests: inner.total,
        }
    }
}

/// Guard for one logged request: finalises its record exactly once, and
/// marks `client_hung_up` if dropped before that (handler or body dropped).
pub(crate) struct Attempt {
    log: Arc<Log>,
    /// Sequence number of the record.
    seq: u64,
    /// Counted in `in_flight` (admitted).
    counted: bool,
    /// Already finalised.
    done: bool,
}

impl Attempt {
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    pub(crate) fn over_capacity(&self) -> bool {
        !self.counted
    }

    pub(crate) fn set_fault(&self, name: Option<&str>) {
        let name = name.map(str::to_owned);
        self.log.update(self.seq, |r| r.fault = name);
    }

    pub(crate) fn set_key_label(&self, label: String) {
        self.log.update(self.seq, |r| r.key_label = Some(label));
    }

    pub(crate) fn set_status(&self, status: u16) {
        self.log.update(self.seq, |r| r.status = Some(status));
    }

    /// Logs the key's rate-limit charge and whether its window refused it.
    pub(crate) fn set_rate(&self, tokens: u32, limited: bool) {
        self.log.update(self.seq, |r| {
            r.rate_tokens = tokens;
            r.rate_limited = limited;
        });
    }

    pub(crate) fn set_ttft(&self, ms: u64) {
        self.log.update(self.seq, |r| r.ttft_ms = Some(ms as f64));
    }

    /// Counts `n` content tokens handed to the connection; the first
    /// marks `first_token_ms`.
    pub(crate) fn add_tokens(&self, n: u32) {
        if n > 0 {
            let now = self.log.now_ms();
            self.log.update(self.seq, |r| {
                r.tokens_sent += n;
                r.first_token_ms.get_or_insert(now);
            });
        }
    }

    pub(crate) fn finish(&mut self, ending: Ending) {
        if self.done {
            return;
        }
        self.done = true;
        let now = self.log.now_ms();
        self.log.update(self.seq, |r| {
            r.finished_ms = Some(now);
            r.completed = ending == Ending::Completed;
            r.client_hung_up = ending == Ending::HungUp;
            if r.client_hung_up {
                r.hung_up_ms = Some(now);
            }
        });
        if self.counted {
            let mut inner = self.log.lock();
            inner.in_flight = inner.in_flight.saturating_sub(1);
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.finish(Ending::HungUp);
    }
}
