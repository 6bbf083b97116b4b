//! How fast a request body must arrive (`server.body_read_timeout` and
//! `server.body_min_rate`, as nginx's `client_body_timeout` plus Kestrel's
//! minimum data rate). Every HTTP request's body is wrapped in [`Paced`] by
//! the listener, so whatever reads it (a door, the Batch API, multipart) gets
//! [`BodyTimedOut`] instead of waiting on a client that stalls or trickles.
//! The clock starts at the first read, so `Expect: 100-continue` is fair.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// How fast a body must arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyPace {
    /// Longest wait for the first or the next piece of a body; also the
    /// grace before the minimum rate applies.
    pub read_timeout: Duration,
    /// After the grace, at least this many bytes per second on average
    /// since the first read (0: no rate check).
    pub min_rate: u64,
}

/// The pure clock of one body: when the next piece is due.
#[derive(Debug, Clone, Copy)]
pub struct PaceClock {
    pace: BodyPace,
    started: Instant,
    last: Instant,
    received: u64,
}

impl PaceClock {
    pub fn start(pace: BodyPace, now: Instant) -> Self {
        PaceClock {
            pace,
            started: now,
            last: now,
            received: 0,
        }
    }

    /// `n` more bytes arrived at `now`.
    pub fn record(&mut self, n: usize, now: Instant) {
        self.received = self.received.saturating_add(n as u64);
        self.last = now;
    }

    /// Bytes received so far.
    pub fn received(&self) -> u64 {
        self.received
    }

    /// The latest moment the next piece may arrive: `read_timeout` after
    /// the last one, and no later than the minimum rate allows for what
    /// arrived so far (`started + read_timeout + received / min_rate`).
    pub fn due(&self) -> Instant {
        let gap = crate::policy::clock::after(self.last, self.pace.read_timeout);
        if self.pace.min_rate == 0 {
            return gap;
        }
        let earned = Duration::from_secs_f64(self.received as f64 / self.pace.min_rate as f64);
        let rate = crate::policy::clock::after(
            self.started,
            self.pace.read_timeout.saturating_add(earned),
        );
        gap.min(rate)
    }
}

/// A body that did not arrive at its pace.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request body did not arrive in time ({received} bytes received)")]
pub struct BodyTimedOut {
    pub received: u64,
}

impl BodyTimedOut {
    /// The [`BodyTimedOut`] somewhere in an error's chain (a body error
    /// arrives wrapped by axum and by `Limited`).
    pub fn find(e: &(dyn std::error::Error + 'static)) -> Option<BodyTimedOut> {
        let mut next = Some(e);
        while let Some(e) = next {
            if let Some(t) = e.downcast_ref::<BodyTimedOut>() {
                return Some(*t);
            }
            next = e.source();
        }
        None
    }
}

/// A request body read under a [`BodyPace`]. `timed_out` is set when it
/// gives up, so the listener can close the connection after the answer.
pub struct Paced<B> {
    inner: B,
    pace: BodyPace,
    clock: Option<PaceClock>,
    sleep: Pin<Box<Sleep>>,
    timed_out: Arc<AtomicBool>,
    done: bool,
}

impl<B> Paced<B> {
    pub fn new(inner: B, pace: BodyPace, timed_out: Arc<AtomicBool>) -> Self {
        Paced {
            inner,
            pace,
            clock: None,
            sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
            timed_out,
            done: false,
        }
    }
}

impl<B> Body for Paced<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let now = Instant::now();
        if this.clock.is_none() {
            let clock = PaceClock::start(this.pace, now);
            this.sleep.as_mut().reset(clock.due());
            this.clock = Some(clock);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(clock)) = (frame.data_ref(), this.clock.as_mut()) {
                    clock.record(data.len(), now);
                    this.sleep.as_mut().reset(clock.due());
                }
                return Poll::Ready(Some(Ok(frame)));
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => {
                this.done = true;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.done = true;
                this.timed_out.store(true, Ordering::Relaxed);
                let received = this.clock.map_or(0, |c| c.received());
                Poll::Ready(Some(Err(Box::new(BodyTimedOut { received }))))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    const PACE: BodyPace = BodyPace {
        read_timeout: Duration::from_secs(10),
        min_rate: 100,
    };

    #[tokio::test(start_paused = true)]
    async fn the_next_piece_is_due_by_the_gap_or_the_rate_whichever_is_sooner() {
        let t0 = Instant::now();
        let mut c = PaceClock::start(PACE, t0);
        // Nothing yet: the first piece within the read timeout.
        assert_eq!(c.due(), t0 + Duration::from_secs(10));
        // 500 bytes at 1 s earn 5 s past the grace: due at 15 s, but the gap
        // says 11 s.
        c.record(500, t0 + Duration::from_secs(1));
        assert_eq!(c.due(), t0 + Duration::from_secs(11));
        // 1 byte at 10.5 s: the gap would allow 20.5 s, the rate only 15.01 s.
        c.record(1, t0 + Duration::from_millis(10_500));
        assert_eq!(c.due(), t0 + Duration::from_millis(15_010));
        // Without a rate only the gap counts.
        let mut free = PaceClock::start(
            BodyPace {
                min_rate: 0,
                ..PACE
            },
            t0,
        );
        free.record(1, t0 + Duration::from_secs(9));
        assert_eq!(free.due(), t0 + Duration::from_secs(19));
    }

    #[tokio::test(start_paused = true)]
    async fn a_huge_timeout_never_overflows() {
        let t0 = Instant::now();
        let c = PaceClock::start(
            BodyPace {
                read_timeout: Duration::MAX,
                min_rate: 1,
            },
            t0,
        );
        assert!(c.due() > t0);
    }

    type Item = Result<Frame<Bytes>, std::convert::Infallible>;
    type Fed = http_body_util::StreamBody<tokio_stream::wrappers::ReceiverStream<Item>>;

    /// A body fed through a channel, one frame per message.
    fn fed() -> (tokio::sync::mpsc::Sender<Item>, Paced<Fed>, Arc<AtomicBool>) {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let flag = Arc::new(AtomicBool::new(false));
        let body = http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx));
        (tx, Paced::new(body, PACE, flag.clone()), flag)
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_fails_at_its_deadline_and_says_how_much_came() {
        let (tx, mut body, flag) = fed();
        tx.send(Ok(Frame::data(Bytes::from_static(b"0123456789"))))
            .await
            .unwrap();
        let t0 = Instant::now();
        assert_eq!(
            body.frame()
                .await
                .unwrap()
                .unwrap()
                .into_data()
                .unwrap()
                .len(),
            10
        );
        let err = body.frame().await.unwrap().unwrap_err();
        assert_eq!(t0.elapsed(), Duration::from_secs(10));
        assert_eq!(BodyTimedOut::find(&*err).unwrap().received, 10);
        assert!(flag.load(Ordering::Relaxed));
        assert!(body.frame().await.is_none(), "nothing after the timeout");
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_under_the_minimum_rate_is_cut_and_a_steady_body_is_not() {
        // 10 bytes every 2 s: each gap is fine, the rate (5 B/s) is not. The
        // rate deadline is 10 s + received / 100 B/s: after the piece at 10 s
        // (60 bytes) it is 10.6 s, and the next piece is due at 12 s.
        let (tx, mut body, _) = fed();
        let t0 = Instant::now();
        let feeder = tokio::spawn(async move {
            for _ in 0..20 {
                if tx
                    .send(Ok(Frame::data(Bytes::from_static(b"0123456789"))))
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
        let mut pieces = 0;
        let err = loop {
            match body.frame().await.unwrap() {
                Ok(_) => pieces += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(pieces, 6, "pieces at 0, 2, 4, 6, 8 and 10 s");
        assert_eq!(t0.elapsed(), Duration::from_millis(10_600));
        assert_eq!(BodyTimedOut::find(&*err).unwrap().received, 60);
        feeder.abort();

        // 200 bytes a second for 30 s, then the end: never cut.
        let (tx, body, flag) = fed();
        tokio::spawn(async move {
            for _ in 0..30 {
                tx.send(Ok(Frame::data(Bytes::from(vec![b'a'; 200]))))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(all.len(), 6000);
        assert!(!flag.load(Ordering::Relaxed));
    }
}
