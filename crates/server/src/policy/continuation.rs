//! Continuation (`mid_stream = "continue"`), pure: whether a target can
//! continue a partial answer or the request must fall back to `reset`,
//! the prefill to send it (the assistant text so far, in its dialect's
//! form), and the `Seam` that turns the continuation's first output into
//! exactly the characters the caller lacks. The rules are the reference's
//! D.8 (upstream-wire-and-faults.md, "Continuation (assistant prefill)");
//! each `Why` names the row it follows. No I/O, no wire types.

use crate::config::{Capability, ProviderKind};

/// What the caller holds when the upstream stream died.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partial<'a> {
    /// The answer text sent so far.
    pub text: &'a str,
    /// A tool call was being streamed.
    pub tool_call_open: bool,
    /// The request runs with extended thinking (reasoning) on.
    pub thinking: bool,
    /// The request's own trailing assistant message (the caller's prefill).
    pub caller_prefill: Option<&'a str>,
}

/// A candidate target as the decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub kind: ProviderKind,
    pub model: &'a str,
    pub capabilities: &'a [Capability],
}

/// How a prefill is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Anthropic Messages (and on Bedrock and Vertex): a trailing
    /// `assistant` turn; the answer continues it and excludes it.
    Anthropic,
    /// OpenAI-compatible servers: a trailing `assistant` message plus
    /// [`CONTINUE_FINAL_MESSAGE`] (vLLM requires both fields; llama.cpp
    /// prefills a trailing assistant message by default and newer builds
    /// take the same fields).
    ContinueFinalMessage,
}

/// The body fields a `ContinueFinalMessage` prefill adds: vLLM defaults
/// `add_generation_prompt` to true and answers 400 when both are true.
pub const CONTINUE_FINAL_MESSAGE: [(&str, bool); 2] = [
    ("continue_final_message", true),
    ("add_generation_prompt", false),
];

/// What to send the target that continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefill {
    pub dialect: Dialect,
    /// The trailing assistant message: the caller's own prefill, then the
    /// text sent, without trailing whitespace.
    pub assistant_text: String,
    /// The trailing whitespace the caller holds but the prefill leaves out;
    /// the continuation usually starts with it again, and the seam drops that.
    pub held: String,
}

impl Prefill {
    /// The seam for this prefill's continuation.
    pub fn seam(&self) -> Seam {
        Seam::new(&self.held)
    }
}

/// Why a target cannot continue (the request falls back to `reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A tool call was in progress: its arguments cannot be prefilled (issue 28).
    ToolCallOpen,
    /// Extended thinking is on: Anthropic prefills "only … non-extended
    /// thinking modes"; llama.cpp answers 400 "incompatible with enable_thinking".
    Thinking,
    /// No text was sent: there is nothing to continue.
    NothingSent,
    /// The model does not declare the `continuation` capability.
    NotDeclared,
    /// The provider kind has no prefill: OpenAI proper and Azure OpenAI
    /// start a new turn; Gemini's trailing `model` turn is unresearched.
    KindCannot(ProviderKind),
    /// Claude 4.6 and later answer 400 "does not support assistant message
    /// prefill", whatever the config declares.
    ModelRejectsPrefill,
}

/// Continue on this target, or reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Continue(Prefill),
    Reset(Why),
}

/// Whether `target` can continue `partial`, and with what prefill.
pub fn decide(partial: &Partial<'_>, target: &Target<'_>) -> Decision {
    match dialect(partial, target) {
        Ok(dialect) => Decision::Continue(prefill(partial, dialect)),
        Err(why) => Decision::Reset(why),
    }
}

/// The partial answer's rules first (no target could continue it), then
/// the target's.
fn dialect(partial: &Partial<'_>, target: &Target<'_>) -> Result<Dialect, Why> {
    if partial.tool_call_open {
        return Err(Why::ToolCallOpen);
    }
    if partial.thinking {
        return Err(Why::Thinking);
    }
    if partial.text.trim().is_empty() {
        return Err(Why::NothingSent);
    }
    let dialect = match target.kind {
        ProviderKind::Anthropic
        | ProviderKind::BedrockAnthropic
        | ProviderKind::VertexAnthropic => Dialect::Anthropic,
        ProviderKind::Openai => Dialect::ContinueFinalMessage,
        kind @ (ProviderKind::AzureOpenai | ProviderKind::Gemini | ProviderKind::VertexGemini) => {
            return Err(Why::KindCannot(kind))
        }
    };
    if !target.capabilities.contains(&Capability::Continuation) {
        return Err(Why::NotDeclared);
    }
    if dialect == Dialect::Anthropic && rejects_prefill(target.model) {
        return Err(Why::ModelRejectsPrefill);
    }
    Ok(dialect)
}

/// The caller's prefill and the text sent, as one trailing assistant
/// message that does not end in whitespace (Anthropic refuses that; on
/// the OpenAI-compatible servers a trailing space would split the next
/// word's token, so they get the same cut).
fn prefill(partial: &Partial<'_>, dialect: Dialect) -> Prefill {
    let whole = format!("{}{}", partial.caller_prefill.unwrap_or(""), partial.text);
    let kept = whole.trim_end().len();
    // Only what the caller received is held for the seam.
    let held_from = kept.max(whole.len() - partial.text.len());
    Prefill {
        dialect,
        held: whole[held_from..].to_string(),
        assistant_text: whole[..kept].to_string(),
    }
}

/// A Claude model at 4.6 or later (by its name on any host: the Claude
/// API, Bedrock's `anthropic.claude-…-v1:0`, Vertex's `claude-…@date`).
/// A name without a Claude version is taken at its declared capability.
pub fn rejects_prefill(model: &str) -> bool {
    claude_version(model).is_some_and(|v| v >= (4, 6))
}

/// (major, minor) of a Claude model name: `claude-sonnet-4-5-20250929`
/// is (4, 5), `claude-3-5-sonnet-20241022` (3, 5), `claude-opus-4-20250514`
/// (4, 0); a date is never a minor version.
fn claude_version(model: &str) -> Option<(u32, u32)> {
    let lower = model.to_ascii_lowercase();
    let rest = &lower[lower.find("claude")? + "claude".len()..];
    let small = |p: &str| {
        (p.len() <= 2 && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse::<u32>().ok())
            .flatten()
    };
    let mut parts = rest
        .split(['-', '.', '@', ':', '_'])
        .filter(|p| !p.is_empty());
    let major = parts.by_ref().find_map(small)?;
    let minor = parts.next().and_then(small).unwrap_or(0);
    Some((major, minor))
}

/// Where the caller's text and the continuation meet: drops the start of
/// the continuation where it repeats the whitespace the caller already
/// holds (`Prefill::held`), and nothing else, so the caller's text plus
/// what passes equals the answer: no character twice, none lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seam {
    /// Held whitespace not yet matched by the continuation.
    held: String,
}

impl Seam {
    pub fn new(held: &str) -> Seam {
        Seam {
            held: held.to_string(),
        }
    }

    /// What of this chunk of the continuation to send the caller: always
    /// a suffix of it. A chunk that only repeats held whitespace passes
    /// nothing and the seam stays open for the next one.
    pub fn pass<'a>(&mut self, chunk: &'a str) -> &'a str {
        if self.held.is_empty() {
            return chunk;
        }
        let same: usize = self
            .held
            .chars()
            .zip(chunk.chars())
            .take_while(|(h, c)| h == c)
            .map(|(h, _)| h.len_utf8())
            .sum();
        let rest = &chunk[same..];
        if rest.is_empty() {
            self.held.drain(..same);
        } else {
            // The continuation went its own way: whatever it says now is new.
            self.held.clear();
        }
        rest
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const DECLARED: &[Capability] = &[Capability::Chat, Capability::Continuation];
    const PLAIN: &[Capability] = &[Capability::Chat, Capability::Stream];

    fn partial(text: &str) -> Partial<'_> {
        Partial {
            text,
            tool_call_open: false,
            thinking: false,
            caller_prefill: None,
        }
    }

    fn target(kind: ProviderKind, model: &str) -> Target<'_> {
        Target {
            kind,
            model,
            capabilities: DECLARED,
        }
    }

    fn continues(d: Decision) -> Prefill {
        match d {
            Decision::Continue(p) => p,
            Decision::Reset(why) => panic!("reset: {why:?}"),
        }
    }

    #[test]
    fn anthropic_up_to_4_5_continues_with_a_trailing_assistant_turn() {
        for model in [
            "claude-sonnet-4-5",
            "claude-sonnet-4-5-20250929",
            "claude-3-5-sonnet-20241022",
            "claude-opus-4-20250514",
            "claude-opus-4-1",
        ] {
            let p = continues(decide(
                &partial("The answer is"),
                &target(ProviderKind::Anthropic, model),
            ));
            assert_eq!(p.dialect, Dialect::Anthropic, "{model}");
            assert_eq!(p.assistant_text, "The answer is");
        }
        for (kind, model) in [
            (
                ProviderKind::BedrockAnthropic,
                "anthropic.claude-sonnet-4-5-20250929-v1:0",
            ),
            (ProviderKind::VertexAnthropic, "claude-sonnet-4-5@20250929"),
        ] {
            let p = continues(decide(&partial("x"), &target(kind, model)));
            assert_eq!(p.dialect, Dialect::Anthropic, "{model}");
        }
    }

    #[test]
    fn claude_4_6_and_later_reset_even_when_declared() {
        for model in [
            "claude-opus-4-6",
            "claude-sonnet-4-6",
            "claude-opus-4-7",
            "claude-opus-5",
            "anthropic.claude-opus-4-6-v1:0",
            "claude-sonnet-5-0@20270101",
        ] {
            assert_eq!(
                decide(&partial("x"), &target(ProviderKind::Anthropic, model)),
                Decision::Reset(Why::ModelRejectsPrefill),
                "{model}"
            );
        }
        // A name without a Claude version (a mock) is taken as declared.
        assert!(!rejects_prefill("mock-model"));
        assert!(!rejects_prefill("claude-mock"));
    }

    #[test]
    fn openai_compatible_servers_continue_the_final_message_without_a_generation_prompt() {
        let p = continues(decide(
            &partial("Counting: 1 2 3"),
            &target(ProviderKind::Openai, "meta-llama/Llama-3.1-8B-Instruct"),
        ));
        assert_eq!(p.dialect, Dialect::ContinueFinalMessage);
        assert_eq!(p.assistant_text, "Counting: 1 2 3");
        assert_eq!(
            CONTINUE_FINAL_MESSAGE,
            [
                ("continue_final_message", true),
                ("add_generation_prompt", false)
            ]
        );
    }

    #[test]
    fn openai_proper_azure_and_gemini_fall_back_to_reset() {
        for kind in [
            ProviderKind::AzureOpenai,
            ProviderKind::Gemini,
            ProviderKind::VertexGemini,
        ] {
            assert_eq!(
                decide(&partial("x"), &target(kind, "m")),
                Decision::Reset(Why::KindCannot(kind))
            );
        }
        // OpenAI proper declares no continuation: a trailing assistant
        // message would be history, not a prefill.
        let gpt = Target {
            kind: ProviderKind::Openai,
            model: "gpt-4o",
            capabilities: PLAIN,
        };
        assert_eq!(
            decide(&partial("x"), &gpt),
            Decision::Reset(Why::NotDeclared)
        );
    }

    #[test]
    fn a_model_without_the_continuation_capability_resets() {
        let t = Target {
            kind: ProviderKind::Anthropic,
            model: "claude-sonnet-4-5",
            capabilities: PLAIN,
        };
        assert_eq!(decide(&partial("x"), &t), Decision::Reset(Why::NotDeclared));
    }

    #[test]
    fn a_tool_call_in_progress_extended_thinking_or_nothing_sent_reset_on_any_target() {
        let t = target(ProviderKind::Anthropic, "claude-sonnet-4-5");
        let mut p = partial("Let me look");
        p.tool_call_open = true;
        assert_eq!(decide(&p, &t), Decision::Reset(Why::ToolCallOpen));
        let mut p = partial("Let me look");
        p.thinking = true;
        assert_eq!(decide(&p, &t), Decision::Reset(Why::Thinking));
        let llama = target(ProviderKind::Openai, "llama");
        assert_eq!(decide(&p, &llama), Decision::Reset(Why::Thinking));
        assert_eq!(
            decide(&partial(" \n"), &t),
            Decision::Reset(Why::NothingSent)
        );
    }

    #[test]
    fn the_prefill_never_ends_in_whitespace_and_the_seam_holds_it() {
        let p = continues(decide(
            &partial("Hello, \n"),
            &target(ProviderKind::Anthropic, "claude-sonnet-4-5"),
        ));
        assert_eq!(p.assistant_text, "Hello,");
        assert_eq!(p.held, " \n");
    }

    #[test]
    fn a_caller_prefill_is_extended_not_sent_twice() {
        let mut part = partial("\"a\": 1, ");
        part.caller_prefill = Some("{");
        let p = continues(decide(
            &part,
            &target(ProviderKind::Anthropic, "claude-sonnet-4-5"),
        ));
        assert_eq!(p.assistant_text, "{\"a\": 1,");
        assert_eq!(p.held, " ");
    }

    #[test]
    fn the_seam_drops_whitespace_the_continuation_repeats() {
        let mut s = Seam::new(" ");
        assert_eq!(s.pass(" world"), "world");
        assert_eq!(s.pass(" again"), " again", "only once, at the seam");
    }

    #[test]
    fn the_seam_waits_across_chunks_that_only_repeat_held_whitespace() {
        let mut s = Seam::new("\n\n");
        assert_eq!(s.pass(""), "");
        assert_eq!(s.pass("\n"), "");
        assert_eq!(s.pass("\nNext"), "Next");
        assert_eq!(s.pass("\n"), "\n", "closed: later whitespace is new");
    }

    #[test]
    fn the_seam_keeps_what_does_not_repeat() {
        // The continuation glues on without the space: the caller's space stays.
        let mut s = Seam::new(" ");
        assert_eq!(s.pass("world"), "world");
        // More whitespace than was held: the extra is new.
        let mut s = Seam::new(" ");
        assert_eq!(s.pass("  x"), " x");
        // Different whitespace: nothing repeats, nothing is dropped.
        let mut s = Seam::new(" ");
        assert_eq!(s.pass("\nx"), "\nx");
        // No held whitespace: everything passes.
        let mut s = Seam::new("");
        assert_eq!(s.pass(" x"), " x");
    }

    /// The done-means answer: numbered tokens cut at every character, the
    /// target continuing from its prefill in three-character chunks: the
    /// caller's text is the full answer, exactly.
    #[test]
    fn a_cut_anywhere_gives_the_full_answer_once() {
        let full: String = (1..=40).map(|i| format!(" tok{i}")).collect::<String>() + "\n\nEnd.";
        let t = target(ProviderKind::Anthropic, "claude-sonnet-4-5");
        for cut in 1..full.len() {
            let sent = &full[..cut];
            let Decision::Continue(p) = decide(&partial(sent), &t) else {
                assert!(sent.trim().is_empty(), "cut {cut}");
                continue;
            };
            let continuation = &full[p.assistant_text.len()..];
            let mut seam = p.seam();
            let mut got = sent.to_string();
            let chars: Vec<char> = continuation.chars().collect();
            for chunk in chars.chunks(3) {
                got.push_str(seam.pass(&chunk.iter().collect::<String>()));
            }
            assert_eq!(got, full, "cut {cut}");
        }
    }
}
