//! Response scripts: a fault plus a request become a list of [`Step`]s
//! (bytes, sleeps, stall, connection abort), and [`into_body`] plays them as an
//! HTTP body while keeping the request log's [`Attempt`] up to date.
//! The only place that decides *where* in a stream a fault strikes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;

use super::faults::Fault;
use super::log::{Attempt, Ending};
use super::wire::{self, Finish, Gen};
use super::MockKind;

/// Pause before an abort so hyper flushes what was already yielded (it drops
/// its write buffer on a body error) and the client can read it before an RST.
const ABORT_GRACE: Duration = Duration::from_millis(25);

/// One action of a response body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Step {
    Sleep(Duration),
    /// Bytes to send, and how many tokens they carry.
    Data(Bytes, u32),
    /// Send nothing more, keep the connection open.
    Stall,
    /// Cut the connection (RST when `reset`, else FIN) without ending the body.
    Abort {
        reset: bool,
    },
}

/// Per-connection control, inserted into every request's extensions.
#[derive(Debug, Default)]
pub(crate) struct ConnCtl {
    /// Close with SO_LINGER 0 (RST) when the connection is dropped.
    pub reset: AtomicBool,
    /// The client's address: which connection a request came over.
    pub peer: Option<std::net::SocketAddr>,
}

/// Steps of a streaming (SSE) answer under `fault`.
pub(crate) fn stream_steps(g: &Gen, fault: &Fault, token_delay: Duration) -> Vec<Step> {
    let mut out = Vec::new();
    match fault {
        Fault::EmptyDone => {
            if g.dialect == MockKind::Openai {
                out.push(Step::Data(wire::done(), 0));
            }
            return out;
        }
        Fault::LegacyError { code, message } => {
            out.push(Step::Data(
                wire::legacy_error(code.unwrap_or(400), message.as_deref()),
                0,
            ));
            return out;
        }
        Fault::SlowFirstToken { delay_ms } => {
            out.push(Step::Sleep(Duration::from_millis(*delay_ms)))
        }
        _ => {}
    }
    let data = |b: Bytes| Step::Data(b, 0);
    out.extend(wire::prelude(g).into_iter().map(data));
    if let Fault::HugeLine { bytes } = fault {
        // Shared 64 KiB pieces: the mock itself holds almost nothing.
        const PIECE: usize = 64 * 1024;
        let piece = Bytes::from(vec![b'x'; PIECE]);
        out.push(data(Bytes::from_static(b"data: ")));
        let mut left = *bytes as usize;
        while left > 0 {
            let n = left.min(PIECE);
            out.push(data(piece.slice(..n)));
            left -= n;
        }
        out.push(Step::Stall);
        return out;
    }
    if *fault == Fault::OrphanDelta && g.dialect == MockKind::Anthropic {
        out.push(data(wire::orphan_delta()));
    }
    let cut = fault.after_tokens().map(|k| k.min(g.n));
    // A continuation goes on from the first token its prefill lacks.
    let from = g.req.continue_from.min(g.n);
    let mut i = from;
    loop {
        if cut == Some(i) && strike(g, fault, i, &mut out) {
            return out;
        }
        if i == g.n {
            break;
        }
        if i > from && !token_delay.is_zero() {
            out.push(Step::Sleep(token_delay));
        }
        out.push(Step::Data(wire::token(g, i), 1));
        if *fault == Fault::SecondChoice && g.dialect == MockKind::Openai {
            out.push(data(wire::second_choice(g, i)));
        }
        i += 1;
    }
    let terminator = *fault != Fault::NoTerminator;
    out.extend(
        wire::epilogue(g, g.finish(), g.n - from, terminator)
            .into_iter()
            .map(data),
    );
    out
}

/// Applies a mid-stream fault after `k` tokens; true when the script ends there.
fn strike(g: &Gen, fault: &Fault, k: u32, out: &mut Vec<Step>) -> bool {
    match fault {
        Fault::Abort { reset, .. } => {
            out.push(Step::Sleep(ABORT_GRACE));
            out.push(Step::Abort { reset: *reset });
            true
        }
        Fault::Stall { .. } => {
            out.push(Step::Stall);
            true
        }
        Fault::ErrorEvent {
            error_type,
            message,
            then_done,
            ..
        } => {
            out.push(Step::Data(
                wire::error_frame(g, error_type.as_deref(), message.as_deref()),
                0,
            ));
            if *then_done && g.dialect == MockKind::Openai {
                out.push(Step::Data(wire::done(), 0));
            }
            true
        }
        Fault::Refusal { .. } => {
            let frames = wire::epilogue(g, Finish::Refusal, k, true);
            out.extend(frames.into_iter().map(|b| Step::Data(b, 0)));
            true
        }
        Fault::Malformed { close, .. } => {
            out.push(Step::Data(wire::malformed_frame(g), 0));
            *close
        }
        Fault::Trickle { byte_delay_ms, .. } => {
            let frame = wire::token(g, k);
            for i in 0..frame.len() {
                out.push(Step::Sleep(Duration::from_millis(*byte_delay_ms)));
                out.push(Step::Data(frame.slice(i..i + 1), 0));
            }
            out.push(Step::Stall);
            true
        }
        _ => false,
    }
}

/// Steps of a non-streaming answer under a fault that does not map to a status.
pub(crate) fn json_steps(g: &Gen, fault: &Fault) -> Vec<Step> {
    let full = |finish, k| Step::Data(wire::full_body(g, finish, k), k);
    match fault {
        Fault::Abort { reset, .. } => vec![Step::Abort { reset: *reset }],
        Fault::Stall { .. } => vec![Step::Stall],
        Fault::SlowFirstToken { delay_ms } => vec![
            Step::Sleep(Duration::from_millis(*delay_ms)),
            full(g.finish(), g.n),
        ],
        Fault::Refusal { after_tokens } => vec![full(Finish::Refusal, (*after_tokens).min(g.n))],
        Fault::Malformed { .. } => vec![Step::Data(wire::malformed_body(g), 0)],
        Fault::EmptyDone | Fault::LegacyError { .. } => vec![],
        _ => vec![full(g.finish(), g.n)],
    }
}

/// State carried by the body stream.
struct Player {
    steps: std::vec::IntoIter<Step>,
    attempt: Attempt,
    conn: Option<Arc<ConnCtl>>,
}

/// Plays `steps` as a body. Ending normally marks the record completed; an
/// abort marks it aborted; dropping it early marks the client as gone.
pub(crate) fn into_body(steps: Vec<Step>, attempt: Attempt, conn: Option<Arc<ConnCtl>>) -> Body {
    let player = Player {
        steps: steps.into_iter(),
        attempt,
        conn,
    };
    let stream = futures_util::stream::unfold(player, |mut p| async move {
        loop {
            match p.steps.next() {
                None => {
                    p.attempt.finish(Ending::Completed);
                    return None;
                }
                Some(Step::Sleep(d)) => tokio::time::sleep(d).await,
                Some(Step::Data(bytes, tokens)) => {
                    p.attempt.add_tokens(tokens);
                    return Some((Ok(bytes), p));
                }
                Some(Step::Stall) => std::future::pending::<()>().await,
                Some(Step::Abort { reset }) => {
                    if let (true, Some(conn)) = (reset, &p.conn) {
                        conn.reset.store(true, Ordering::SeqCst);
                    }
                    p.attempt.finish(Ending::Aborted);
                    let err = std::io::Error::other("mock-upstream: connection aborted by fault");
                    return Some((Err(err), p));
                }
            }
        }
    });
    Body::from_stream(stream)
}
