//! [`unless`]: a busy future raced against the rare ends that cut it short,
//! without polling those on every wake. A `select!` polls each branch
//! whenever its task wakes, and the futures raced here wake often: a
//! request's body on every upstream read (against the drain's abort, whose
//! token takes a lock shared by every request on each poll, and the overrun
//! net, a watch and a timer), an HTTP connection on every read and write
//! of the requests it serves (against the shutdown token, its own close
//! token and its idle timer). Here the rare side is polled only when its
//! own waker fired.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// The rare side's waker: notes that it fired and wakes the task.
struct Fired {
    fired: AtomicBool,
    task: AtomicWaker,
}

impl Wake for Fired {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// `main`'s output, unless `rare` ends first. `main` is polled on every
/// wake (and first); `rare` on the first poll and then only after its own
/// waker fired. Both are pinned by the caller: moved into this future, a
/// request's whole body would be stored twice over.
pub async fn unless<T, M, R>(mut main: Pin<&mut M>, mut rare: Pin<&mut R>) -> T
where
    M: Future<Output = T>,
    R: Future<Output = T>,
{
    let fired = Arc::new(Fired {
        fired: AtomicBool::new(true),
        task: AtomicWaker::new(),
    });
    let rare_waker = Waker::from(fired.clone());
    std::future::poll_fn(move |cx| {
        if let Poll::Ready(v) = main.as_mut().poll(cx) {
            return Poll::Ready(v);
        }
        // Registered before the flag is read: a wake between the two
        // finds this waker, so it is never lost.
        fired.task.register(cx.waker());
        if fired.fired.swap(false, Ordering::AcqRel) {
            if let Poll::Ready(v) = rare.as_mut().poll(&mut Context::from_waker(&rare_waker)) {
                return Poll::Ready(v);
            }
        }
        Poll::Pending
    })
    .await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    /// Counts its polls, then waits forever.
    struct Counted<'a>(&'a AtomicUsize);

    impl Future for Counted<'_> {
        type Output = &'static str;
        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<&'static str> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Poll::Pending
        }
    }

    #[tokio::test(start_paused = true)]
    async fn main_wins_and_the_rare_side_is_polled_once_however_often_main_wakes() {
        let polls = AtomicUsize::new(0);
        let main = async {
            for _ in 0..100 {
                tokio::task::yield_now().await;
            }
            "main"
        };
        let (main, rare) = (pin!(main), pin!(Counted(&polls)));
        assert_eq!(unless(main, rare).await, "main");
        assert_eq!(polls.load(Ordering::Relaxed), 1, "only the first poll");
    }

    #[tokio::test(start_paused = true)]
    async fn the_rare_side_ends_it_when_its_waker_fires() {
        let token = tokio_util::sync::CancellationToken::new();
        let cancel = token.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            cancel.cancel();
        });
        let main = async {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let started = tokio::time::Instant::now();
        let rare = pin!(async {
            token.cancelled().await;
            "aborted"
        });
        let ended = unless(pin!(main), rare).await;
        assert_eq!(ended, "aborted");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rare_timer_fires_while_main_waits() {
        let rare = pin!(async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            "overrun"
        });
        let ended = unless(pin!(std::future::pending()), rare).await;
        assert_eq!(ended, "overrun");
    }
}
