//! Buffers a stream borrows from its thread and gives back when it is done
//! with them: the lists an attempt reads an upstream's events and chunks
//! into, the strings of those events, the list a journaled stream holds a
//! read's items in. Each was made, grown and freed once a stream; lent,
//! a thread's few spares serve every stream it runs, and a slow stream
//! keeps none between its reads.
//!
//! Bounded: a thread keeps at most `keep` spares of a kind, each no larger
//! than `max_capacity` (one that grew past it is freed, not kept). A buffer
//! given back on another thread than it was lent on joins that thread's
//! spares.

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::thread::LocalKey;

/// A buffer that can be emptied for its next user.
pub trait Reusable: Default {
    /// Empties it; what it can hold without growing.
    fn reset(&mut self) -> usize;
}

impl<T> Reusable for Vec<T> {
    fn reset(&mut self) -> usize {
        self.clear();
        self.capacity()
    }
}

impl Reusable for String {
    fn reset(&mut self) -> usize {
        self.clear();
        self.capacity()
    }
}

/// One thread's spare buffers of one kind (in a `thread_local!`).
pub struct Spares<T> {
    list: RefCell<Vec<T>>,
    keep: usize,
    max_capacity: usize,
}

impl<T: Reusable> Spares<T> {
    /// At most `keep` spares, each holding at most `max_capacity` items.
    pub const fn new(keep: usize, max_capacity: usize) -> Self {
        Spares {
            list: RefCell::new(Vec::new()),
            keep,
            max_capacity,
        }
    }

    /// A spare, or a new empty buffer.
    pub fn take(&self) -> T {
        self.list.borrow_mut().pop().unwrap_or_default()
    }

    /// Keeps `item` for the next [`Self::take`], emptied, unless it holds
    /// nothing, grew past the bound, or enough are kept.
    pub fn give(&self, mut item: T) {
        let capacity = item.reset();
        if capacity == 0 || capacity > self.max_capacity {
            return;
        }
        let mut list = self.list.borrow_mut();
        if list.len() < self.keep {
            list.push(item);
        }
    }

    /// How many are kept now.
    pub fn len(&self) -> usize {
        self.list.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A spare from this thread's `home`, or a new empty buffer; hand it back
/// with [`give`].
pub fn take<T: Reusable>(home: &'static LocalKey<Spares<T>>) -> T {
    home.with(Spares::take)
}

/// Gives `item` back to this thread's `home` (dropped when the thread is
/// ending and its spares are gone).
pub fn give<T: Reusable>(home: &'static LocalKey<Spares<T>>, item: T) {
    let _ = home.try_with(|spares| spares.give(item));
}

/// A buffer lent by this thread's `home`, given back when dropped (on
/// whichever thread drops it).
pub struct Lent<T: Reusable + 'static> {
    item: T,
    home: &'static LocalKey<Spares<T>>,
}

impl<T: Reusable + 'static> Lent<T> {
    pub fn from(home: &'static LocalKey<Spares<T>>) -> Self {
        Lent {
            item: take(home),
            home,
        }
    }
}

impl<T: Reusable + 'static> Deref for Lent<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.item
    }
}

impl<T: Reusable + 'static> DerefMut for Lent<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.item
    }
}

impl<T: Reusable + 'static> Drop for Lent<T> {
    fn drop(&mut self) {
        give(self.home, std::mem::take(&mut self.item));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    thread_local! {
        static LISTS: Spares<Vec<u32>> = const { Spares::new(2, 8) };
    }

    #[test]
    fn a_lent_buffer_comes_back_emptied_and_is_lent_again_without_allocating() {
        let grown = {
            let mut list = Lent::from(&LISTS);
            list.extend([1, 2, 3]);
            list.as_ptr()
        };
        assert_eq!(LISTS.with(Spares::len), 1);
        let again = Lent::from(&LISTS);
        assert!(again.is_empty(), "emptied");
        assert_eq!(again.as_ptr(), grown, "the same buffer");
        assert!(again.capacity() >= 3);
        drop(again);
        assert_eq!(LISTS.with(Spares::len), 1);
    }

    #[test]
    fn a_thread_keeps_few_spares_and_none_grown_past_the_bound() {
        LISTS.with(|s| {
            s.give(Vec::new());
            assert!(s.is_empty(), "one that holds nothing is not kept");
            s.give(Vec::with_capacity(9));
            assert!(s.is_empty(), "one grown past the bound is freed");
            for _ in 0..5 {
                s.give(Vec::with_capacity(4));
            }
            assert_eq!(s.len(), 2, "at most `keep`");
            let _ = (s.take(), s.take());
        });
    }
}
