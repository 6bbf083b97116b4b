//! Incremental WHATWG server-sent-events parser: bytes in, dispatched events out,
//! identical results under any chunking of the same bytes.
//! Owns line splitting (CR, LF, CRLF across feeds), field rules and the EOF flush.
//! Knows nothing of JSON or providers and does no I/O. Odd input is skipped,
//! except a non-standard `error:` field, which is surfaced; the one failure is
//! size: a line or an event larger than its bound (an upstream that never
//! sends a newline must not grow memory without end).

use crate::spares::{self, Spares};

/// One dispatched SSE event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field; `None` means the default "message".
    pub event: Option<String>,
    /// `data:` lines joined with `\n`.
    pub data: String,
    /// The `id:` field of this event (not carried over to later events).
    pub id: Option<String>,
    pub retry: Option<u64>,
    /// A non-standard `error:` field (llama.cpp legacy builds send `error: {json}`).
    /// Spec parsers drop it; we surface it so the decoder can fail the attempt.
    pub error: Option<String>,
}

/// Longest line accepted by default (a streamed delta is a few hundred bytes;
/// a whole tool-call argument in one frame can be large).
pub const MAX_LINE_BYTES: usize = 1024 * 1024;
/// Largest event (all its fields) accepted by default.
pub const MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// A line buffer up to this size is kept for the next line held across
/// feeds; a larger one is freed (one huge line must not pin memory).
const KEPT_LINE_CAPACITY: usize = 4096;

/// A line or an event went past its bound; the stream cannot be parsed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an SSE {what} exceeds {limit} bytes")]
pub struct TooLarge {
    pub what: &'static str,
    pub limit: usize,
}

/// Incremental parser. Feed it bytes as they arrive, then call [`SseParser::finish`].
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bounds on a line and on an event.
    max_line: usize,
    max_event: usize,
    /// Bytes held by the event being built.
    event_bytes: usize,
    /// Bytes of the current, not yet terminated line.
    line: Vec<u8>,
    /// The previous feed ended on CR: a leading LF of the next feed belongs to it.
    skip_lf: bool,
    /// No line has completed yet (a leading UTF-8 BOM is stripped from the first).
    first_line: bool,
    /// Fields of the event being built.
    pending: Pending,
}

/// Strings kept for reuse per thread, and the largest one kept (a few
/// events a read; one huge event must not pin memory).
const KEPT_SPARES: usize = 16;
const KEPT_SPARE_CAPACITY: usize = 4096;

thread_local! {
    /// Emptied strings of events handed back ([`SseParser::recycle`]), for
    /// the next events' `data` and `event` fields, whichever stream on this
    /// thread parses them.
    static SPARE: Spares<String> = const { Spares::new(KEPT_SPARES, KEPT_SPARE_CAPACITY) };
}

/// The event under construction.
#[derive(Debug, Default)]
struct Pending {
    event: Option<String>,
    /// `None` until a `data` line arrives; `Some("")` after `data:` with no value.
    data: Option<String>,
    id: Option<String>,
    retry: Option<u64>,
    error: Option<String>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.event.is_none()
            && self.data.is_none()
            && self.id.is_none()
            && self.retry.is_none()
            && self.error.is_none()
    }

    fn take_event(&mut self) -> Option<SseEvent> {
        if self.is_empty() {
            return None;
        }
        let p = std::mem::take(self);
        Some(SseEvent {
            event: p.event,
            data: p.data.unwrap_or_default(),
            id: p.id,
            retry: p.retry,
            error: p.error,
        })
    }
}

/// Appends `value` to a multi-line buffer, joining lines with `\n`; a new
/// buffer is a spare one when there is one.
fn append_line(buf: &mut Option<String>, value: &str) {
    match buf {
        Some(existing) => {
            existing.push('\n');
            existing.push_str(value);
        }
        None => *buf = Some(owned(value)),
    }
}

/// `value` in a spare string when there is one.
fn owned(value: &str) -> String {
    let mut s = spares::take(&SPARE);
    s.push_str(value);
    s
}

impl SseParser {
    pub fn new() -> Self {
        Self::with_limits(MAX_LINE_BYTES, MAX_EVENT_BYTES)
    }

    /// A parser with its own bounds on a line and on an event.
    pub fn with_limits(max_line: usize, max_event: usize) -> Self {
        SseParser {
            first_line: true,
            max_line,
            max_event,
            ..Default::default()
        }
    }

    /// Takes back an event's strings once it has been read, so that the
    /// next events reuse them instead of allocating.
    pub fn recycle(&mut self, event: SseEvent) {
        for s in [Some(event.data), event.event].into_iter().flatten() {
            spares::give(&SPARE, s);
        }
    }

    /// Parses `bytes`, pushing every event completed by them onto `out`.
    /// After `Err` the parser holds nothing and must not be fed again.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), TooLarge> {
        let fed = self.feed_inner(bytes, out);
        if fed.is_err() {
            let limits = (self.max_line, self.max_event);
            *self = SseParser::with_limits(limits.0, limits.1);
        }
        fed
    }

    fn feed_inner(&mut self, mut bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), TooLarge> {
        if self.skip_lf {
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
                self.skip_lf = false;
            } else if !bytes.is_empty() {
                self.skip_lf = false;
            }
        }
        while let Some(pos) = memchr::memchr2(b'\r', b'\n', bytes) {
            if self.line.is_empty() {
                // The whole line is in this feed: parse it where it is.
                if pos > self.max_line {
                    return Err(TooLarge {
                        what: "line",
                        limit: self.max_line,
                    });
                }
                self.end_line_of(&bytes[..pos], out)?;
            } else {
                self.extend_line(&bytes[..pos])?;
                self.end_line(out)?;
            }
            let is_cr = bytes[pos] == b'\r';
            bytes = &bytes[pos + 1..];
            if is_cr {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
        }
        self.extend_line(bytes)
    }

    fn extend_line(&mut self, bytes: &[u8]) -> Result<(), TooLarge> {
        if self.line.len() + bytes.len() > self.max_line {
            return Err(TooLarge {
                what: "line",
                limit: self.max_line,
            });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    /// Bytes of the unterminated line held between feeds (never above `max_line`).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.line.len()
    }

    /// The body ended: flushes an unterminated last line and dispatches the
    /// pending event even without its blank line (llama.cpp sends a bare
    /// `data: [DONE]`). The parser is reset afterwards.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), TooLarge> {
        let ended = if self.line.is_empty() {
            Ok(())
        } else {
            self.end_line(out)
        };
        out.extend(self.pending.take_event());
        *self = SseParser::with_limits(self.max_line, self.max_event);
        ended
    }

    /// Ends the line held across feeds, keeping its buffer (unless large).
    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), TooLarge> {
        let mut held = std::mem::take(&mut self.line);
        let ended = self.end_line_of(&held, out);
        if held.capacity() <= KEPT_LINE_CAPACITY {
            held.clear();
            self.line = held;
        }
        ended
    }

    fn end_line_of(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), TooLarge> {
        if !bytes.starts_with(b":") {
            self.event_bytes += bytes.len();
        }
        if self.event_bytes > self.max_event {
            return Err(TooLarge {
                what: "event",
                limit: self.max_event,
            });
        }
        // Valid UTF-8 is the rule: `from_utf8` checks it faster than the
        // lossy conversion walks it; only invalid bytes pay for replacement.
        let mut line = match std::str::from_utf8(bytes) {
            Ok(s) => std::borrow::Cow::Borrowed(s),
            Err(_) => String::from_utf8_lossy(bytes),
        };
        if self.first_line {
            self.first_line = false;
            if let Some(rest) = line.strip_prefix('\u{feff}') {
                line = std::borrow::Cow::Owned(rest.to_owned());
            }
        }
        self.process_line(&line, out);
        Ok(())
    }

    fn process_line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            self.event_bytes = 0;
            out.extend(self.pending.take_event());
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        self.apply_field(field, value);
    }

    fn apply_field(&mut self, field: &str, value: &str) {
        let p = &mut self.pending;
        match field {
            "event" => p.event = Some(owned(value)),
            "data" => append_line(&mut p.data, value),
            "id" if !value.contains('\0') => p.id = Some(value.to_owned()),
            "retry" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) => {
                if let Ok(ms) = value.parse() {
                    p.retry = Some(ms);
                }
            }
            "error" => append_line(&mut p.error, value),
            _ => {}
        }
    }
}

/// Test helper shared by the decoder tests: runs bytes through the parser and a
/// decoder under a given chunking.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub(crate) mod transcript {
    use super::{SseEvent, SseParser};
    use crate::policy::outcome::Failure;
    use crate::upstream::{Chunk, Completion, StreamDecoder};
    use rand::{Rng, SeedableRng};

    /// What one run produced: forwarded chunks and the attempt's end.
    pub type Run = (Vec<Chunk>, Result<Completion, Failure>);

    /// Splits `bytes` into pieces: whole, byte-by-byte, fixed sizes and seeded random cuts.
    pub fn chunkings(bytes: &[u8]) -> Vec<Vec<&[u8]>> {
        let mut all = vec![vec![bytes], bytes.chunks(1).collect()];
        for size in [2, 3, 7, 64] {
            all.push(bytes.chunks(size).collect());
        }
        for seed in 0..8u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut pieces = Vec::new();
            let mut rest = bytes;
            while !rest.is_empty() {
                let n = rng.random_range(1..=rest.len().min(40));
                let (head, tail) = rest.split_at(n);
                pieces.push(head);
                rest = tail;
            }
            all.push(pieces);
        }
        all
    }

    /// Feeds `pieces` through a parser and `decoder`; stops at the first error.
    pub fn run(pieces: &[&[u8]], decoder: &mut dyn StreamDecoder) -> Run {
        let mut parser = SseParser::new();
        let mut chunks = Vec::new();
        let mut events: Vec<SseEvent> = Vec::new();
        for piece in pieces {
            parser.feed(piece, &mut events).unwrap();
            for ev in events.drain(..) {
                if let Err(f) = decoder.on_event(&ev, &mut chunks) {
                    return (chunks, Err(f));
                }
            }
        }
        parser.finish(&mut events).unwrap();
        for ev in events.drain(..) {
            if let Err(f) = decoder.on_event(&ev, &mut chunks) {
                return (chunks, Err(f));
            }
        }
        (chunks, decoder.finish())
    }

    /// Runs `text` (and its CRLF and CR variants) under every chunking, asserts
    /// all runs agree and returns the common result.
    pub fn run_all<D: StreamDecoder>(text: &str, mut new: impl FnMut() -> D) -> Run {
        let crlf = text.replace('\n', "\r\n");
        let cr = text.replace('\n', "\r");
        let first = run(&[text.as_bytes()], &mut new());
        for variant in [text, crlf.as_str(), cr.as_str()] {
            for pieces in chunkings(variant.as_bytes()) {
                let got = run(&pieces, &mut new());
                assert_eq!(got, first, "chunking changed the result");
            }
        }
        first
    }

    /// Concatenates all text chunks.
    pub fn text_of(chunks: &[Chunk]) -> String {
        chunks
            .iter()
            .filter_map(|c| match c {
                Chunk::Text(t) => Some(t.as_str()),
                Chunk::ToolCall { .. } | Chunk::Reasoning { .. } => None,
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(bytes, &mut out).unwrap();
        p.finish(&mut out).unwrap();
        out
    }

    /// A recycled event's buffers carry the next events, emptied first; a
    /// large one is not kept.
    #[test]
    fn recycled_events_lend_their_buffers_to_the_next_ones() {
        let spare = || SPARE.with(Spares::len);
        let mut p = SseParser::new();
        let mut out = Vec::new();
        p.feed(b"event: a\ndata: first one\n\n", &mut out).unwrap();
        let first = out.pop().unwrap();
        let (data_ptr, event_ptr) = (first.data.as_ptr(), first.event.as_ref().unwrap().as_ptr());
        p.recycle(first);
        assert_eq!(spare(), 2, "both strings are kept");
        // By the thread: another stream's parser takes them.
        let mut p = SseParser::new();
        p.feed(b"event: bb\ndata: 2\ndata: x\n\n", &mut out)
            .unwrap();
        assert_eq!(spare(), 0, "and both are taken again");
        let second = out.pop().unwrap();
        assert_eq!(second.event.as_deref(), Some("bb"));
        assert_eq!(second.data, "2\nx");
        // The spares are taken last-in first-out: `event` then `data`.
        let reused = [
            second.data.as_ptr(),
            second.event.as_ref().unwrap().as_ptr(),
        ];
        assert!(reused.contains(&data_ptr) && reused.contains(&event_ptr));

        p.recycle(SseEvent {
            data: "x".repeat(KEPT_SPARE_CAPACITY + 1),
            ..SseEvent::default()
        });
        assert_eq!(spare(), 0);
        p.feed(b"data: 3\n\n", &mut out).unwrap();
        assert_eq!(out.pop().unwrap().data, "3");
    }

    fn parse_pieces(pieces: &[&[u8]]) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for piece in pieces {
            p.feed(piece, &mut out).unwrap();
        }
        p.finish(&mut out).unwrap();
        out
    }

    fn data(d: &str) -> SseEvent {
        SseEvent {
            data: d.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn splits_on_lf_crlf_and_cr() {
        for sep in ["\n", "\r\n", "\r"] {
            let text = format!("data: a{sep}{sep}data: b{sep}{sep}");
            assert_eq!(
                parse(text.as_bytes()),
                vec![data("a"), data("b")],
                "{sep:?}"
            );
        }
    }

    #[test]
    fn crlf_split_across_feeds_is_one_break() {
        let got = parse_pieces(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]);
        assert_eq!(got, vec![data("a\nb")]);
    }

    #[test]
    fn cr_at_end_of_feed_then_empty_feed_then_lf() {
        let got = parse_pieces(&[b"data: a\r", b"", b"\n\r\n"]);
        assert_eq!(got, vec![data("a")]);
    }

    #[test]
    fn cr_cr_is_two_breaks() {
        assert_eq!(parse(b"data: a\r\rdata: b\r\r"), vec![data("a"), data("b")]);
    }

    #[test]
    fn comments_are_ignored() {
        assert_eq!(parse(b": keep-alive\n\n:\ndata: x\n\n"), vec![data("x")]);
    }

    #[test]
    fn multi_line_data_joined_with_newline() {
        assert_eq!(parse(b"data: a\ndata:b\ndata\n\n"), vec![data("a\nb\n")]);
    }

    #[test]
    fn only_one_leading_space_is_stripped() {
        assert_eq!(parse(b"data:  two\n\n"), vec![data(" two")]);
        assert_eq!(parse(b"data:none\n\n"), vec![data("none")]);
    }

    #[test]
    fn event_and_id_fields() {
        let got = parse(b"event: message_start\nid: 7\ndata: {}\n\n");
        let want = SseEvent {
            event: Some("message_start".into()),
            id: Some("7".into()),
            data: "{}".into(),
            ..Default::default()
        };
        assert_eq!(got, vec![want]);
    }

    #[test]
    fn id_with_nul_is_ignored() {
        assert_eq!(parse(b"id: a\0b\ndata: x\n\n"), vec![data("x")]);
    }

    #[test]
    fn id_does_not_carry_over() {
        let got = parse(b"id: 1\ndata: a\n\ndata: b\n\n");
        assert_eq!(got[1], data("b"));
    }

    #[test]
    fn retry_must_be_an_integer() {
        assert_eq!(parse(b"retry: 10x\ndata: x\n\n"), vec![data("x")]);
        assert_eq!(parse(b"retry: -1\ndata: x\n\n"), vec![data("x")]);
        assert_eq!(parse(b"retry:\ndata: x\n\n"), vec![data("x")]);
        let got = parse(b"retry: 1500\n\n");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].retry, Some(1500));
    }

    #[test]
    fn unknown_fields_are_ignored_and_do_not_dispatch() {
        assert_eq!(parse(b"foo: bar\n\nbaz\n\n"), vec![]);
        assert_eq!(parse(b"foo: bar\ndata: x\n\n"), vec![data("x")]);
    }

    #[test]
    fn error_field_is_surfaced() {
        let got = parse(b"error: {\"code\":400}\n\ndata: [DONE]\n\n");
        let want = SseEvent {
            error: Some("{\"code\":400}".into()),
            ..Default::default()
        };
        assert_eq!(got, vec![want, data("[DONE]")]);
    }

    #[test]
    fn blank_lines_alone_dispatch_nothing() {
        assert_eq!(parse(b"\n\n\r\n\r\r\n"), vec![]);
    }

    #[test]
    fn empty_data_field_dispatches_empty_event() {
        assert_eq!(parse(b"data:\n\n"), vec![data("")]);
    }

    #[test]
    fn eof_flushes_event_without_blank_line() {
        assert_eq!(
            parse(b"data: a\n\ndata: [DONE]"),
            vec![data("a"), data("[DONE]")]
        );
        assert_eq!(parse(b"data: [DONE]\n"), vec![data("[DONE]")]);
    }

    #[test]
    fn leading_bom_is_stripped() {
        assert_eq!(parse(b"\xef\xbb\xbfdata: x\n\n"), vec![data("x")]);
    }

    #[test]
    fn invalid_utf8_is_replaced_not_fatal() {
        assert_eq!(parse(b"data: \xff\n\n"), vec![data("\u{fffd}")]);
    }

    #[test]
    fn line_without_colon_is_a_field_with_empty_value() {
        assert_eq!(parse(b"data\n\n"), vec![data("")]);
    }

    #[test]
    fn a_line_without_end_stops_at_its_bound_under_any_chunking() {
        let mut p = SseParser::with_limits(1024, 4096);
        let mut out = Vec::new();
        let piece = [b'x'; 100];
        let mut fed = 0;
        let err = loop {
            match p.feed(&piece, &mut out) {
                Ok(()) => fed += piece.len(),
                Err(e) => break e,
            }
        };
        assert_eq!(
            err,
            TooLarge {
                what: "line",
                limit: 1024
            }
        );
        assert_eq!(fed, 1000, "refused at the piece that would pass 1024 bytes");
        assert!(p.line.capacity() < 2048, "the held line was dropped");
    }

    #[test]
    fn an_event_of_many_data_lines_stops_at_its_bound() {
        let mut p = SseParser::with_limits(1024, 4096);
        let mut out = Vec::new();
        let line = format!("data: {}\n", "y".repeat(500));
        let results: Vec<_> = (0..10).map(|_| p.feed(line.as_bytes(), &mut out)).collect();
        assert!(results[..8].iter().all(Result::is_ok), "{results:?}");
        assert_eq!(
            results[8],
            Err(TooLarge {
                what: "event",
                limit: 4096
            })
        );
        assert!(out.is_empty());
        // Many small events of the same total are fine: the bound is per event.
        let mut p = SseParser::with_limits(1024, 4096);
        let event = format!("data: {}\n\n", "y".repeat(500));
        for _ in 0..100 {
            p.feed(event.as_bytes(), &mut out).unwrap();
        }
        assert_eq!(out.len(), 100);
        // Comment lines (keep-alives) hold nothing and count for nothing.
        let mut p = SseParser::with_limits(1024, 4096);
        for _ in 0..100 {
            p.feed(
                b": keep-alive 0123456789012345678901234567890123456789\n",
                &mut out,
            )
            .unwrap();
        }
    }
}
