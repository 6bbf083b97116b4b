//! The process's allocator: mimalloc (glibc's malloc and free were 12 % of
//! the request path's CPU at 3,000/s, with `unlink_chunk` alone 2 %), with
//! allocation counting for the bench: allocations and their bytes are
//! counted once [`enable`] has been called
//! (`switchyard serve` calls it when `SWITCHYARD_COUNT_ALLOCATIONS=1`), and
//! the collector that exports the counts as
//! `switchyard_process_allocations_total` and
//! `switchyard_process_allocated_bytes_total`. Off, it costs one relaxed load
//! per allocation; on, one relaxed add into this thread's own shard (no cache
//! line is shared between two threads that allocate).
//!
//! [`commit_memory_as_used`] sets one of mimalloc's options before the
//! first allocation: arena memory is committed as it is used. With
//! mimalloc's default a slow stream cost about 15 KB more RSS
//! (docs/performance.md).

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc as Inner;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// The environment variable that turns counting on in `switchyard serve`.
pub const ENV: &str = "SWITCHYARD_COUNT_ALLOCATIONS";

const SHARDS: usize = 32;

/// One thread's counts, on a cache line of its own.
#[repr(align(128))]
struct Shard {
    allocations: AtomicU64,
    bytes: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Shard = Shard {
    allocations: AtomicU64::new(0),
    bytes: AtomicU64::new(0),
};

static ENABLED: AtomicBool = AtomicBool::new(false);
static COUNTS: [Shard; SHARDS] = [EMPTY; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    // Const-initialised and without a destructor: safe to touch inside the
    // allocator (no lazy init, nothing allocated, nothing registered).
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// mimalloc, counting when enabled.
pub struct Counting;

impl Counting {
    #[inline]
    fn count(size: usize) {
        if !ENABLED.load(Ordering::Relaxed) {
            return;
        }
        let i = SHARD
            .try_with(|s| {
                let mut i = s.get();
                if i == usize::MAX {
                    i = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
                    s.set(i);
                }
                i
            })
            .unwrap_or(0);
        let shard = &COUNTS[i];
        shard.allocations.fetch_add(1, Ordering::Relaxed);
        shard.bytes.fetch_add(size as u64, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to mimalloc; counting touches
// only static atomics and a const thread-local, and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        Self::count(layout.size());
        // SAFETY: the caller's contract, forwarded.
        unsafe { Inner.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        Self::count(layout.size());
        // SAFETY: the caller's contract, forwarded.
        unsafe { Inner.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, forwarded.
        unsafe { Inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // A growth is an allocator call of its own; count the bytes it adds.
        Self::count(new_size.saturating_sub(layout.size()));
        // SAFETY: the caller's contract, forwarded.
        unsafe { Inner.realloc(ptr, layout, new_size) }
    }
}

/// mimalloc's `arena_eager_commit` option: its number in v3's
/// `mi_option_e` (libmimalloc-sys exports no constant for it) and its
/// documented default, by which a build checks that the numbering is the
/// one it knows before it sets anything.
const ARENA_EAGER_COMMIT: (libmimalloc_sys::mi_option_t, std::ffi::c_long) = (4, 2);

/// Commits arena memory as it is used (`arena_eager_commit` 0, not 2: on
/// Linux mimalloc otherwise commits each arena whole), unless the
/// environment set `MIMALLOC_ARENA_EAGER_COMMIT` (mimalloc reads it
/// itself) to another value than the default. Measured: about 15 KB less
/// RSS per slow stream, no CPU cost within the bench's noise; an immediate
/// purge (`purge_delay` 0) took a few KB more at 5-15 % more CPU per
/// request, so it stays at mimalloc's 1 s. The binary calls this from an
/// ELF constructor, before anything is allocated: mimalloc reserves its
/// first arena at the first allocation, and a later change misses it. So
/// it allocates nothing itself. A value that is not the default is left
/// alone: the environment set it, or the numbering is not the one this
/// build knows (a unit test checks the numbering).
pub fn commit_memory_as_used() {
    let (option, default) = ARENA_EAGER_COMMIT;
    // SAFETY: reads mimalloc's option table (it reads the environment on
    // first use); called before any other thread exists.
    let now = unsafe { libmimalloc_sys::mi_option_get(option) };
    if now == default {
        // SAFETY: as above.
        unsafe { libmimalloc_sys::mi_option_set(option, 0) };
    }
}

/// Starts counting (from zero: nothing before this call is counted).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Whether counting is on.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Allocations (including reallocations) and bytes counted so far.
pub fn totals() -> (u64, u64) {
    COUNTS.iter().fold((0, 0), |(n, b), s| {
        (
            n + s.allocations.load(Ordering::Relaxed),
            b + s.bytes.load(Ordering::Relaxed),
        )
    })
}

/// Exports [`totals`] at scrape time; registered only when counting is on.
#[derive(Debug)]
pub struct AllocCollector;

impl Collector for AllocCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (allocations, bytes) = totals();
        for (name, help, value) in [
            (
                "switchyard_process_allocations",
                "Heap allocations and reallocations since counting began (SWITCHYARD_COUNT_ALLOCATIONS=1)",
                allocations,
            ),
            (
                "switchyard_process_allocated_bytes",
                "Bytes allocated since counting began (SWITCHYARD_COUNT_ALLOCATIONS=1)",
                bytes,
            ),
        ] {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn mimallocs_option_number_is_the_one_this_build_sets() {
        // Catches a libmimalloc-sys update that renumbers the options
        // (then `commit_memory_as_used` would leave it alone).
        if std::env::var_os("MIMALLOC_ARENA_EAGER_COMMIT").is_some() {
            eprintln!("SKIPPED: MIMALLOC_ARENA_EAGER_COMMIT is set in this environment");
            return;
        }
        let (option, default) = ARENA_EAGER_COMMIT;
        // SAFETY: a read of mimalloc's option table.
        let now = unsafe { libmimalloc_sys::mi_option_get(option) };
        assert_eq!(now, default);
    }

    #[test]
    fn the_collector_renders_both_counters() {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(AllocCollector));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("switchyard_process_allocations_total "),
            "{text}"
        );
        assert!(
            text.contains("switchyard_process_allocated_bytes_total "),
            "{text}"
        );
    }
}
