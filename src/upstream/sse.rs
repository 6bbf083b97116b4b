//! (in progress) WHATWG server-sent-events parser.

/// One dispatched SSE event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field; `None` means the default "message".
    pub event: Option<String>,
    /// `data:` lines joined with `\n`.
    pub data: String,
    pub id: Option<String>,
    pub retry: Option<u64>,
}
