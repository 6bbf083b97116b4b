//! Short-lived bytes cut from one buffer per thread: an upstream request's
//! body and its `content-length`, a door's JSON answer, the response
//! headers a request writes (`x-request-id`, `provider/model`). Each lives until
//! it is written to a socket; written into a `Vec` and turned into
//! [`Bytes`] it would cost two allocations (the buffer, and the shared
//! header `Bytes` puts on a `Vec` with room to spare). Cut from a chunk
//! shared with the strings before it, it costs none: the chunk is taken
//! once, and reused in place once every string cut from it is gone (or a
//! new one is taken while some still live).
//!
//! Bounded: one chunk per thread, [`CHUNK`] bytes unless a larger string
//! grew it, and a chunk grown past [`MAX_CHUNK`] is let go as soon as that
//! string is cut (it lives on only as long as the string does).

use std::cell::RefCell;

use bytes::{BufMut, Bytes, BytesMut};

/// A fresh chunk's size: room for dozens of typical bodies.
pub const CHUNK: usize = 16 * 1024;

/// A chunk grown past this by one large string is not kept.
pub const MAX_CHUNK: usize = 64 * 1024;

thread_local! {
    static ARENA: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// What `write` wrote, with room for `hint` bytes made first; `write`'s
/// error, when it failed, with nothing kept.
pub fn cut<E>(hint: usize, write: impl FnOnce(&mut BytesMut) -> Result<(), E>) -> Result<Bytes, E> {
    ARENA.with(|arena| match arena.try_borrow_mut() {
        Ok(mut arena) => {
            // What a failed write left behind is not the next string's.
            arena.clear();
            if arena.capacity() < hint {
                arena.reserve(hint.max(CHUNK));
            }
            let written = write(&mut arena);
            let grown = arena.capacity() > MAX_CHUNK;
            let out = arena.split().freeze();
            if grown {
                *arena = BytesMut::new();
            }
            written.map(|()| out)
        }
        // Only when `write` itself cuts: that string gets a buffer of its own.
        Err(_) => {
            let mut own = BytesMut::with_capacity(hint);
            write(&mut own)?;
            Ok(own.freeze())
        }
    })
}

/// `value` as JSON.
pub fn json<T: serde::Serialize + ?Sized>(hint: usize, value: &T) -> serde_json::Result<Bytes> {
    cut(hint, |buf| serde_json::to_writer(buf.writer(), value))
}

/// `parts` one after the other, copied: a header value a response holds
/// until its head is written (`x-request-id`, `provider/model`).
pub fn concat(parts: &[&[u8]]) -> Bytes {
    let len = parts.iter().map(|p| p.len()).sum();
    cut(len, |buf| {
        for p in parts {
            buf.put_slice(p);
        }
        Ok::<(), std::convert::Infallible>(())
    })
    .unwrap_or_else(|never| match never {})
}

/// `n` in decimal, for a header value such as `content-length`.
pub fn decimal(n: u64) -> Bytes {
    let mut digits = itoa::Buffer::new();
    concat(&[digits.format(n).as_bytes()])
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn at(b: &Bytes) -> usize {
        b.as_ptr() as usize
    }

    #[test]
    fn strings_share_a_chunk_and_a_freed_chunk_is_reused_in_place() {
        let a = json(64, &serde_json::json!({"a": 1})).unwrap();
        let b = decimal(200_000);
        assert_eq!(&a[..], br#"{"a":1}"#);
        assert_eq!(&b[..], b"200000");
        // Cut one after the other from the same chunk.
        assert_eq!(at(&b), at(&a) + a.len());
        let first = at(&a);
        drop((a, b));
        // Every string from the chunk is gone: a string that no longer fits
        // what is left of it starts the same chunk over.
        let big = cut(CHUNK - 2, |buf| {
            buf.put_bytes(b'x', CHUNK - 2);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(at(&big), first, "reused, not a new chunk");
        assert_eq!(big.len(), CHUNK - 2);
    }

    #[test]
    fn a_live_string_keeps_its_bytes_when_the_next_chunk_is_taken() {
        let kept = decimal(42);
        let big = cut(CHUNK, |buf| {
            buf.put_bytes(b'y', CHUNK);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(&kept[..], b"42");
        assert!(big.iter().all(|&c| c == b'y'));
    }

    #[test]
    fn a_failed_write_keeps_nothing_and_a_grown_chunk_is_let_go() {
        let failed = cut(8, |buf| {
            buf.put_slice(b"partial");
            Err("no")
        });
        assert_eq!(failed, Err("no"));
        assert_eq!(
            &decimal(7)[..],
            b"7",
            "nothing of the failed write before it"
        );
        // A string that grows the chunk past its bound, leaving room in it:
        // the room is not kept for the strings after it.
        let huge = cut(MAX_CHUNK * 2, |buf| {
            buf.put_bytes(b'z', MAX_CHUNK + 1);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(huge.len(), MAX_CHUNK + 1);
        ARENA.with(|a| assert_eq!(a.borrow().capacity(), 0, "the grown chunk is not kept"));
    }

    #[test]
    fn parts_are_copied_one_after_the_other() {
        assert_eq!(&concat(&[b"openai", b"/", b"gpt-4o"])[..], b"openai/gpt-4o");
        assert!(concat(&[]).is_empty());
    }

    #[test]
    fn a_cut_inside_a_cut_gets_its_own_buffer() {
        let outer = cut(16, |buf| {
            let inner = decimal(9);
            buf.put_slice(b"n=");
            buf.put_slice(&inner);
            Ok::<_, ()>(())
        })
        .unwrap();
        assert_eq!(&outer[..], b"n=9");
    }
}
