//! Load generation: open loop at a fixed rate on a schedule (a late request
//! is timed from when it was *due*, so queueing shows in the latency), closed
//! loop with N workers, a progress line every second, and percentiles from
//! sorted vectors. Every loop is bounded in time and in count.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::clients::Outcome;
use super::Ctx;

/// How long the outcomes of requests still running at the end are awaited.
const GRACE: Duration = Duration::from_secs(15);

/// Counters shown by the progress line.
#[derive(Default)]
struct Progress {
    sent: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    in_flight: AtomicU64,
}

impl Progress {
    fn finish(&self, o: &Outcome) {
        if o.ok {
            self.ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn ticker(ctx: &Ctx, label: String, total_s: f64, p: Arc<Progress>) -> tokio::task::JoinHandle<()> {
    let started = Instant::now();
    let print = ctx.progress_printer();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        // Bounded: the task is aborted when the run ends; the cap is a backstop.
        for _ in 0..3600 {
            tick.tick().await;
            print(format!(
                "   {label}: {:.0}/{:.0} s sent {} ok {} failed {} in flight {}",
                started.elapsed().as_secs_f64(),
                total_s,
                p.sent.load(Ordering::Relaxed),
                p.ok.load(Ordering::Relaxed),
                p.failed.load(Ordering::Relaxed),
                p.in_flight.load(Ordering::Relaxed),
            ));
        }
    })
}

/// Everything a load run produced.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub outcomes: Vec<Outcome>,
    /// Requests the schedule called for.
    pub scheduled: u64,
    /// Not sent because the in-flight cap was reached (open loop only).
    pub skipped: u64,
    /// Sent but with no outcome within the grace period.
    pub unfinished: u64,
    /// From the first scheduled send to the last outcome.
    pub elapsed_s: f64,
    /// Length of the sending window.
    pub window_s: f64,
}

impl Run {
    pub fn ok(&self) -> usize {
        self.outcomes.iter().filter(|o| o.ok).count()
    }

    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.ok()
    }

    /// Answered requests per second over the sending window.
    pub fn throughput(&self) -> f64 {
        if self.window_s <= 0.0 {
            return 0.0;
        }
        self.ok() as f64 / self.elapsed_s.max(self.window_s)
    }

    /// Every request scheduled has an outcome or was counted as skipped.
    pub fn accounted(&self) -> bool {
        self.unfinished == 0 && self.outcomes.len() as u64 + self.skipped == self.scheduled
    }

    /// Every request scheduled has an outcome (none skipped or lost).
    pub fn complete(&self) -> bool {
        self.skipped == 0 && self.unfinished == 0 && self.outcomes.len() as u64 == self.scheduled
    }

    /// Error kinds and their counts.
    pub fn errors(&self) -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for e in self.outcomes.iter().filter_map(|o| o.error.clone()) {
            *m.entry(e).or_insert(0) += 1;
        }
        m
    }

    pub fn latency(&self) -> Dist {
        Dist::of(self.outcomes.iter().filter(|o| o.ok).map(|o| o.latency_ms))
    }

    /// Latency of every outcome, failed ones included.
    pub fn latency_all(&self) -> Dist {
        Dist::of(self.outcomes.iter().map(|o| o.latency_ms))
    }

    pub fn ttft(&self) -> Dist {
        Dist::of(
            self.outcomes
                .iter()
                .filter(|o| o.ok)
                .filter_map(|o| o.ttft_ms),
        )
    }
}

/// Percentiles of a sample, in ms.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Dist {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Dist {
    pub fn of(values: impl Iterator<Item = f64>) -> Dist {
        let mut v: Vec<f64> = values.filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Dist::default();
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let q = |p: f64| v[((p * n as f64).ceil() as usize).clamp(1, n) - 1];
        Dist {
            n,
            p50: q(0.50),
            p95: q(0.95),
            p99: q(0.99),
            max: v[n - 1],
            mean: v.iter().sum::<f64>() / n as f64,
        }
    }
}

/// Sends `rate` requests per second for `duration`, each due at its slot;
/// `f(i, due)` makes request `i`. At most `max_in_flight` run at once (the
/// rest are counted as skipped, never queued unseen).
pub async fn open_loop<F, Fut>(
    ctx: &Ctx,
    label: impl Into<String>,
    rate: f64,
    duration: Duration,
    max_in_flight: u64,
    f: F,
) -> Run
where
    F: Fn(u64, Instant) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    open_loop_grace(ctx, label, rate, duration, max_in_flight, GRACE, f).await
}

/// [`open_loop`] awaiting outcomes for `grace` after the last send.
pub async fn open_loop_grace<F, Fut>(
    ctx: &Ctx,
    label: impl Into<String>,
    rate: f64,
    duration: Duration,
    max_in_flight: u64,
    grace: Duration,
    f: F,
) -> Run
where
    F: Fn(u64, Instant) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let rate = rate.max(0.1);
    let total = (rate * duration.as_secs_f64()).round().max(1.0) as u64;
    let progress = Arc::new(Progress::default());
    let tick = ticker(ctx, label.into(), duration.as_secs_f64(), progress.clone());
    let (tx, mut rx) = mpsc::unbounded_channel::<Outcome>();
    let start = Instant::now() + Duration::from_millis(2);
    let mut skipped = 0;
    let mut sent = 0u64;
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate);
        // A past deadline would still wait for the next timer tick.
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        if progress.in_flight.load(Ordering::Relaxed) >= max_in_flight {
            skipped += 1;
            continue;
        }
        progress.in_flight.fetch_add(1, Ordering::Relaxed);
        progress.sent.fetch_add(1, Ordering::Relaxed);
        sent += 1;
        let fut = f(i, due);
        let tx = tx.clone();
        let p = progress.clone();
        tokio::spawn(async move {
            let mut o = fut.await;
            o.index = i;
            o.at = due.saturating_duration_since(start).as_secs_f64();
            p.finish(&o);
            let _ = tx.send(o);
        });
    }
    let window_s = start.elapsed().as_secs_f64();
    drop(tx);
    let outcomes = collect(&mut rx, sent, grace).await;
    tick.abort();
    Run {
        unfinished: sent.saturating_sub(outcomes.len() as u64),
        outcomes,
        scheduled: total,
        skipped,
        elapsed_s: start.elapsed().as_secs_f64(),
        window_s,
    }
}

async fn collect(
    rx: &mut mpsc::UnboundedReceiver<Outcome>,
    expected: u64,
    grace: Duration,
) -> Vec<Outcome> {
    let mut outcomes = Vec::with_capacity(expected as usize);
    let deadline = Instant::now() + grace;
    while (outcomes.len() as u64) < expected {
        tokio::select! {
            o = rx.recv() => match o {
                Some(o) => outcomes.push(o),
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    outcomes
}

/// `workers` callers, each sending its next request when the last ended
/// (after `pause`), for `duration`.
pub async fn closed_loop<F, Fut>(
    ctx: &Ctx,
    label: impl Into<String>,
    workers: usize,
    duration: Duration,
    pause: Duration,
    f: F,
) -> Run
where
    F: Fn(u64, Instant) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let f = Arc::new(f);
    let progress = Arc::new(Progress::default());
    let tick = ticker(ctx, label.into(), duration.as_secs_f64(), progress.clone());
    let (tx, mut rx) = mpsc::unbounded_channel::<Outcome>();
    let start = Instant::now();
    let end = start + duration;
    let counter = Arc::new(AtomicU64::new(0));
    for _ in 0..workers.max(1) {
        let (f, tx, p, counter) = (f.clone(), tx.clone(), progress.clone(), counter.clone());
        tokio::spawn(async move {
            // Bounded by `end` and by a count backstop.
            for _ in 0..10_000_000u64 {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let i = counter.fetch_add(1, Ordering::Relaxed);
                p.in_flight.fetch_add(1, Ordering::Relaxed);
                p.sent.fetch_add(1, Ordering::Relaxed);
                let mut o = f(i, t0).await;
                o.index = i;
                o.at = t0.saturating_duration_since(start).as_secs_f64();
                p.finish(&o);
                if tx.send(o).is_err() {
                    break;
                }
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        });
    }
    drop(tx);
    let mut outcomes = Vec::new();
    let deadline = end + GRACE;
    loop {
        tokio::select! {
            o = rx.recv() => match o {
                Some(o) => outcomes.push(o),
                None => break,
            },
            _ = tokio::time::sleep_until(deadline) => break,
        }
    }
    tick.abort();
    let sent = progress.sent.load(Ordering::Relaxed);
    Run {
        unfinished: sent.saturating_sub(outcomes.len() as u64),
        scheduled: sent,
        outcomes,
        skipped: 0,
        elapsed_s: start.elapsed().as_secs_f64(),
        window_s: duration.as_secs_f64(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn bench_percentiles_of_a_known_sample() {
        let d = Dist::of((1..=100).map(f64::from));
        assert_eq!(d.n, 100);
        assert_eq!(d.p50, 50.0);
        assert_eq!(d.p99, 99.0);
        assert_eq!(d.max, 100.0);
        assert_eq!(Dist::of(std::iter::empty()), Dist::default());
    }
}
