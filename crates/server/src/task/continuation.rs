//! `mid_stream = "continue"` on the request path: which of the route's
//! targets continues the answer the caller holds (the first, after the one
//! that failed, that `policy::continuation` lets continue it), and the
//! request that target is sent: the caller's messages plus the answer so
//! far as a trailing assistant prefill, with the body fields its dialect
//! needs. The decision is `policy::continuation`'s; this only looks up the
//! targets and puts the prefill on the request.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::Tasks;
use crate::actors::router::Plan;
use crate::chat::{ChatMessage, ChatRequest, Dialect as WireDialect, Passthrough};
use crate::policy::continuation::{
    self, Decision, Dialect, Partial, Prefill, Target, CONTINUE_FINAL_MESSAGE,
};
use crate::request::RequestSpec;
use crate::sink::{Continued, EventSink};

/// A continuation in progress: what the continuing attempt is given.
pub(super) struct Continuing {
    pub(super) prefill: Prefill,
    /// The attempt that failed after output.
    pub(super) failed_attempt: u32,
}

impl Continuing {
    /// The `Continued` event announcing the attempt `attempt` on `provider/model`.
    pub(super) fn event(&self, provider: &str, model: &str, attempt: u32) -> Continued {
        Continued {
            failed_attempt: self.failed_attempt,
            provider: provider.to_string(),
            model: model.to_string(),
            attempt,
            at_seq: 0,
        }
    }
}

impl Tasks {
    /// The candidate that continues the answer `sink` holds after candidate
    /// `failed` failed: the next in plan order (the failed one last) whose
    /// provider kind and model can take the prefill. `None` when none can.
    pub(super) fn continuer(
        &self,
        spec: &RequestSpec,
        plan: &Plan,
        failed: usize,
        sink: &EventSink,
    ) -> Option<(usize, Prefill)> {
        let (text, tool_call_open) = sink.answer_so_far();
        let partial = Partial {
            text,
            tool_call_open,
            thinking: spec.chat.reasoning.is_some(),
            caller_prefill: caller_prefill(&spec.chat),
        };
        let n = plan.candidates.len();
        (1..=n).map(|k| (failed + k) % n).find_map(|idx| {
            let c = &plan.candidates[idx];
            let entry = self.actors.provider(&c.provider)?;
            let model = entry.runtime.models.iter().find(|m| *m.name == *c.model)?;
            let target = Target {
                kind: entry.runtime.kind,
                model: &c.model,
                capabilities: &model.capabilities,
            };
            match continuation::decide(&partial, &target) {
                Decision::Continue(prefill) => Some((idx, prefill)),
                Decision::Reset(why) => {
                    tracing::debug!(provider = %c.provider, model = %c.model, ?why, "cannot continue the answer");
                    None
                }
            }
        })
    }
}

/// The caller's own trailing assistant message (its prefill), if any.
fn caller_prefill(chat: &ChatRequest) -> Option<&str> {
    chat.messages
        .last()
        .filter(|m| m.role == "assistant" && m.parts.is_empty() && m.tool_calls.is_empty())
        .map(|m| m.content.as_str())
}

/// `base` (the caller's request) with `prefill` as its trailing assistant
/// message, replacing the caller's own prefill (the prefill includes it),
/// and, for an OpenAI-compatible server, `continue_final_message` and
/// `add_generation_prompt: false` in the body.
pub(super) fn prefilled(
    base: &ChatRequest,
    prefill: &Prefill,
) -> (Arc<Vec<ChatMessage>>, Option<Arc<Passthrough>>) {
    let mut messages = Vec::clone(&base.messages);
    if caller_prefill(base).is_some() {
        messages.pop();
    }
    messages.push(ChatMessage {
        role: "assistant".into(),
        content: prefill.assistant_text.clone(),
        ..ChatMessage::default()
    });
    let passthrough = match (prefill.dialect, base.passthrough.as_deref()) {
        (Dialect::Anthropic, _) => base.passthrough.clone(),
        (Dialect::ContinueFinalMessage, None) => Some(Arc::new(Passthrough {
            dialect: Some(WireDialect::Openai),
            fields: continue_fields(Map::new()),
            ..Passthrough::default()
        })),
        (Dialect::ContinueFinalMessage, Some(p)) if p.dialect == Some(WireDialect::Openai) => {
            Some(Arc::new(Passthrough {
                fields: continue_fields(p.fields.clone()),
                ..p.clone()
            }))
        }
        // Another dialect's passthrough stays (and is reported dropped);
        // llama.cpp continues a trailing assistant message without the fields.
        (Dialect::ContinueFinalMessage, Some(_)) => base.passthrough.clone(),
    };
    (Arc::new(messages), passthrough)
}

fn continue_fields(mut fields: Map<String, Value>) -> Map<String, Value> {
    for (key, value) in CONTINUE_FINAL_MESSAGE {
        fields.insert(key.into(), Value::Bool(value));
    }
    fields
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn prefill(dialect: Dialect) -> Prefill {
        Prefill {
            dialect,
            assistant_text: "Sure: tok0 tok1".into(),
            held: " ".into(),
        }
    }

    fn ask(messages: &[(&str, &str)]) -> ChatRequest {
        ChatRequest {
            messages: messages
                .iter()
                .map(|(role, content)| ChatMessage {
                    role: (*role).into(),
                    content: (*content).into(),
                    ..ChatMessage::default()
                })
                .collect::<Vec<_>>()
                .into(),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn the_prefill_is_the_last_message_and_replaces_the_callers_own() {
        let (m, p) = prefilled(&ask(&[("user", "hi")]), &prefill(Dialect::Anthropic));
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[1].role.as_str(), m[1].content.as_str()),
            ("assistant", "Sure: tok0 tok1")
        );
        assert!(p.is_none(), "Anthropic needs no field");

        let base = ask(&[("user", "hi"), ("assistant", "Sure:")]);
        assert_eq!(caller_prefill(&base), Some("Sure:"));
        let (m, _) = prefilled(&base, &prefill(Dialect::Anthropic));
        assert_eq!(m.len(), 2, "the caller's prefill is inside the new one");
        assert_eq!(m[1].content, "Sure: tok0 tok1");
    }

    #[test]
    fn an_openai_compatible_server_is_asked_to_continue_the_final_message() {
        let (_, p) = prefilled(
            &ask(&[("user", "hi")]),
            &prefill(Dialect::ContinueFinalMessage),
        );
        let p = p.unwrap();
        assert_eq!(p.dialect, Some(WireDialect::Openai));
        assert_eq!(p.fields["continue_final_message"], Value::Bool(true));
        assert_eq!(p.fields["add_generation_prompt"], Value::Bool(false));

        // The caller's own OpenAI passthrough is kept beside them.
        let mut base = ask(&[("user", "hi")]);
        let mut fields = Map::new();
        fields.insert("seed".into(), Value::from(7));
        base.passthrough = Some(Arc::new(Passthrough {
            dialect: Some(WireDialect::Openai),
            fields,
            ..Passthrough::default()
        }));
        let (_, p) = prefilled(&base, &prefill(Dialect::ContinueFinalMessage));
        let p = p.unwrap();
        assert_eq!(p.fields["seed"], Value::from(7));
        assert_eq!(p.fields["continue_final_message"], Value::Bool(true));
    }
}
