#!/usr/bin/env python3
"""The official `anthropic` Python SDK sending what Claude-based agents send
through Switchyard's Anthropic door at full fidelity: images and PDFs,
prompt-cache markers (and the cache reads they buy), signed thinking across
a three-turn tool conversation, and a mid-conversation system turn. Run by
tests/content_anthropic.rs with a switchyard whose route `chat` goes to one
Anthropic-shaped `switchyard mock-upstream` (given as both --primary and
--secondary); the mock caches prefixes, signs its thinking and checks the
signatures it gets back.

    python3 examples/anthropic_sdk/test_content.py --base-url http://127.0.0.1:8080 \
        --primary http://127.0.0.1:8002 --secondary http://127.0.0.1:8002

Prints one PASS/FAIL line per check; exits 1 if any check failed.
"""

import base64
import pathlib
import sys

import anthropic
from anthropic import Anthropic

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from mock_control import arguments, run_checks  # noqa: E402

EXPECTED = "".join(f"tok{i} " for i in range(16))
# A 1x1 PNG and a one-page PDF, byte for byte.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)
PDF = (
    b"%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n"
    b"2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n"
    b"3 0 obj<</Type/Page/Parent 2 0 R/MediaBox[0 0 3 3]>>endobj\n"
    b"trailer<</Root 1 0 R>>\n%%EOF\n"
)
# About 2,500 tokens: over Anthropic's 1,024-token cache minimum.
LONG_SYSTEM = "You are a careful coding agent. Follow the project's rules. " * 170
TOOL = {
    "name": "read_file",
    "description": "Read a file of the project",
    "input_schema": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}
THINKING = {"type": "enabled", "budget_tokens": 2048}


def b64(data):
    return base64.b64encode(data).decode()


def check_image_and_pdf_reach_the_upstream_intact(client, mock, _):
    mock.clear()
    m = client.messages.create(
        model="chat",
        max_tokens=64,
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
            {"type": "document", "title": "spec.pdf",
             "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)}},
            {"type": "text", "text": "What do these show?"},
        ]}],
    )
    assert m.content[-1].text == EXPECTED, m.content
    blocks = mock.requests()[-1]["body"]["messages"][0]["content"]
    assert [b["type"] for b in blocks] == ["image", "image", "document", "text"], blocks
    assert blocks[0]["source"] == {"type": "base64", "media_type": "image/png", "data": b64(PNG)}, blocks[0]
    assert base64.b64decode(blocks[0]["source"]["data"]) == PNG
    # A URL image goes as a URL: Switchyard fetches nothing.
    assert blocks[1]["source"] == {"type": "url", "url": "https://example.com/cat.jpg"}, blocks[1]
    assert blocks[2]["source"]["media_type"] == "application/pdf", blocks[2]
    assert base64.b64decode(blocks[2]["source"]["data"]) == PDF
    assert blocks[2].get("title") == "spec.pdf", blocks[2]


def cached_call(client, question, stream):
    args = dict(
        model="chat",
        max_tokens=64,
        system=[{"type": "text", "text": LONG_SYSTEM, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        tools=[{**TOOL, "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
        messages=[{"role": "user", "content": question}],
    )
    if not stream:
        return client.messages.create(**args)
    with client.messages.stream(**args) as s:
        for _ in s:
            pass
        return s.get_final_message()


def check_cache_markers_reach_the_upstream_and_the_second_call_reads(client, mock, _):
    mock.clear()
    first = cached_call(client, "First question?", stream=False)
    body = mock.requests()[-1]["body"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}, body["system"]
    assert body["tools"][0]["cache_control"] == {"type": "ephemeral", "ttl": "1h"}, body["tools"]
    u = first.usage
    assert u.cache_read_input_tokens == 0, u
    assert u.cache_creation_input_tokens > 1024, u
    # Both markers are 1h: the whole write is billed at the 1h rate.
    assert u.cache_creation.ephemeral_1h_input_tokens == u.cache_creation_input_tokens, u
    assert u.cache_creation.ephemeral_5m_input_tokens == 0, u

    second = cached_call(client, "Second question?", stream=True)
    v = second.usage
    assert v.cache_read_input_tokens == u.cache_creation_input_tokens, (u, v)
    assert v.cache_creation_input_tokens == 0, v
    assert v.input_tokens > 0 and v.output_tokens == 16, v


def thinking_turn(client, messages, stream):
    args = dict(model="chat", max_tokens=4096, thinking=THINKING, tools=[TOOL], messages=messages)
    if not stream:
        return client.messages.create(**args)
    with client.messages.stream(**args) as s:
        kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
        final = s.get_final_message()
    # Thinking streams first, its signature last, before the tool input.
    assert kinds[0] == "thinking_delta", kinds
    assert kinds.index("signature_delta") < kinds.index("input_json_delta"), kinds
    return final


def check_a_tool_conversation_with_thinking_survives_three_turns(client, mock, _):
    mock.clear()
    messages = [{"role": "user", "content": "Read the README and summarise it."}]
    answers = []
    for turn in range(3):
        m = thinking_turn(client, messages, stream=turn != 1)
        assert [b.type for b in m.content] == ["thinking", "tool_use"], m.content
        assert m.content[0].signature, m.content[0]
        assert m.stop_reason == "tool_use", m.stop_reason
        answers.append(m)
        use = m.content[1]
        messages = messages + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": f"file {turn}"}]},
        ]
    sent = [r["body"] for r in mock.requests()]
    assert len(sent) == 3, len(sent)
    assert all(b["thinking"] == THINKING for b in sent), sent
    # Turn 3 sent both earlier thinking blocks back as signed.
    back = [blk for msg in sent[2]["messages"] if msg["role"] == "assistant" for blk in msg["content"]]
    assert [b["type"] for b in back] == ["thinking", "tool_use"] * 2, back
    for blk, answer in zip(back[::2], answers):
        assert blk["thinking"] == answer.content[0].thinking, blk
        assert blk["signature"] == answer.content[0].signature, blk

    # An altered thinking block: the upstream refuses it, and so does the door.
    messages[1]["content"][0]["thinking"] += " (edited)"
    try:
        thinking_turn(client, messages, stream=False)
    except anthropic.BadRequestError as e:
        assert e.status_code == 400, e.status_code
        assert e.body["error"]["type"] == "invalid_request_error", e.body
    else:
        raise AssertionError("an altered thinking block was accepted")
    assert mock.requests()[-1]["status"] == 400, mock.requests()[-1]


def check_a_mid_conversation_system_turn_is_accepted(client, mock, _):
    mock.clear()
    m = client.messages.create(
        model="chat",
        max_tokens=64,
        system="You are terse.",
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "system", "content": "The user is now on a phone."},
            {"role": "user", "content": "and now?"},
        ],
        extra_headers={"anthropic-beta": "mid-conversation-system-2026-04-07"},
    )
    assert m.content[0].text == EXPECTED, m.content
    body = mock.requests()[-1]["body"]
    assert body["system"] == "You are terse.", body["system"]
    roles = [msg["role"] for msg in body["messages"]]
    assert roles == ["user", "assistant", "system", "user"], roles
    assert mock.requests()[-1]["headers"].get("anthropic-beta") == "mid-conversation-system-2026-04-07", \
        mock.requests()[-1]["headers"]


def main():
    args = arguments(__doc__.splitlines()[0], "Switchyard HTTP base URL (no /v1)")
    client = Anthropic(base_url=args.base_url, api_key=args.api_key, max_retries=0)
    checks = [
        check_image_and_pdf_reach_the_upstream_intact,
        check_cache_markers_reach_the_upstream_and_the_second_call_reads,
        check_a_tool_conversation_with_thinking_survives_three_turns,
        check_a_mid_conversation_system_turn_is_accepted,
    ]
    return run_checks(checks, client, args)


if __name__ == "__main__":
    sys.exit(main())
