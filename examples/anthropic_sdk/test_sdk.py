#!/usr/bin/env python3
"""The official `anthropic` Python SDK against Switchyard's Anthropic Messages
front door (`POST /v1/messages` on `[server] http_listen`). Run by
tests/anthropic_sdk.rs with a switchyard whose route `chat` goes to two
`switchyard mock-upstream`s (OpenAI-shaped primary, Anthropic-shaped
secondary); it sets the mocks' faults and reads their request logs over their
control API.

    pip install -r examples/anthropic_sdk/requirements.txt
    python3 examples/anthropic_sdk/test_sdk.py --base-url http://127.0.0.1:8080 \
        --primary http://127.0.0.1:8001 --secondary http://127.0.0.1:8002

Prints one PASS/FAIL line per check; exits 1 if any check failed.
"""

import pathlib
import sys

import anthropic
from anthropic import Anthropic

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from mock_control import arguments, run_checks  # noqa: E402

EXPECTED = "".join(f"tok{i} " for i in range(16))
HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a place",
    "input_schema": {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    },
}


def check_streaming_text(client, primary, secondary):
    seen = []
    with client.messages.stream(model="chat", max_tokens=64, messages=HELLO) as stream:
        for event in stream:
            seen.append(event.type)
        text = stream.get_final_text()
        final = stream.get_final_message()
    assert text == EXPECTED, text
    assert seen[0] == "message_start", seen
    assert "content_block_delta" in seen and seen[-1] == "message_stop", seen
    assert final.role == "assistant" and final.model == "chat", final
    assert final.stop_reason == "end_turn", final.stop_reason
    assert final.usage.output_tokens == 16, final.usage
    assert final.usage.input_tokens > 0, final.usage


def check_streaming_tool_use(client, primary, secondary):
    primary.clear()
    with client.messages.stream(
        model="chat",
        max_tokens=256,
        system="Use tools when they help.",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "tool", "name": "get_weather"},
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use", final.stop_reason
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1, final.content
    # The SDK parsed the streamed partial JSON into the input object.
    assert uses[0].name == "get_weather" and uses[0].id, uses[0]
    assert isinstance(uses[0].input, dict), uses[0].input
    assert isinstance(uses[0].input["query"], str), uses[0].input
    # The tool choice reached the (OpenAI-shaped) upstream in its dialect.
    body = primary.requests()[-1]["body"]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}, body
    assert body["messages"][0] == {"role": "system", "content": "Use tools when they help."}, body

    # Send the result back: the assistant's tool_use + a user tool_result.
    follow = client.messages.create(
        model="chat",
        max_tokens=64,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": uses[0].id, "name": "get_weather", "input": uses[0].input},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": uses[0].id, "content": "sunny"},
            ]},
        ],
    )
    assert follow.content[0].type == "text" and follow.content[0].text == EXPECTED, follow
    sent = primary.requests()[-1]["body"]["messages"]
    assert sent[1]["tool_calls"][0]["id"] == uses[0].id, sent
    assert sent[2] == {"role": "tool", "tool_call_id": uses[0].id, "content": "sunny"}, sent


def check_non_streaming(client, primary, secondary):
    m = client.messages.create(
        model="chat",
        max_tokens=3,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}],
        stop_sequences=["\n\n"],
        # This SDK has no sampling arguments any more; older clients send them.
        extra_body={"temperature": 0.2},
    )
    assert m.type == "message" and m.role == "assistant", m
    assert m.model == "chat", m.model
    assert m.id.startswith("msg_"), m.id
    assert [b.type for b in m.content] == ["text"], m.content
    assert m.content[0].text == "tok0 tok1 tok2 ", m.content
    assert m.stop_reason == "max_tokens", m.stop_reason
    assert m.usage.output_tokens == 3, m.usage

    count = client.messages.count_tokens(model="chat", messages=HELLO, system="Be brief.")
    assert count.input_tokens > 0, count


def check_errors_with_max_retries_0(client, primary, secondary):
    primary.clear()
    secondary.clear()
    try:
        client.messages.create(model="no-such-route", max_tokens=8, messages=HELLO)
    except anthropic.NotFoundError as e:
        assert e.status_code == 404, e.status_code
        assert e.body["error"]["type"] == "not_found_error", e.body
        assert e.body["error"]["details"]["error_code"] == "UNKNOWN_ROUTE", e.body
        assert e.request_id, "request-id header"
    else:
        raise AssertionError("no NotFoundError")
    try:
        client.messages.create(
            model="chat", max_tokens=8, messages=HELLO, extra_body={"temperature": 5}
        )
    except anthropic.BadRequestError as e:
        assert "temperature" in e.message, e.message
    else:
        raise AssertionError("no BadRequestError")
    assert primary.requests() == [] and secondary.requests() == [], "an upstream was called"

    # Nothing can serve: Anthropic's overloaded error (529).
    primary.fault({"type": "status", "status": 503})
    secondary.fault({"type": "status", "status": 503})
    try:
        client.messages.create(model="chat", max_tokens=8, messages=HELLO)
    except anthropic.APIStatusError as e:
        assert e.status_code == 529, e.status_code
        assert e.body["error"]["type"] == "overloaded_error", e.body
        # Both targets tried, within the route's attempt bound: no retry storm.
        tried = (len(primary.requests()), len(secondary.requests()))
        assert min(tried) >= 1 and sum(tried) <= 3, f"attempts (primary, secondary): {tried}"
    else:
        raise AssertionError("no error when every target is down")
    finally:
        primary.clear()
        secondary.clear()


def check_cut_stream_raises(client, primary, secondary):
    # Whichever target serves is cut after 3 tokens: the SDK must raise on
    # the `error` event, not end the stream as if the answer were whole.
    for m in (primary, secondary):
        m.fault({"type": "abort", "after_tokens": 3})
    try:
        text = ""
        try:
            with client.messages.stream(model="chat", max_tokens=64, messages=HELLO) as stream:
                for t in stream.text_stream:
                    text += t
        except anthropic.APIStatusError as e:
            assert e.body["error"]["type"] == "overloaded_error", e.body
            assert text and text != EXPECTED, text
        else:
            raise AssertionError(f"a cut stream ended quietly with {text!r}")
    finally:
        primary.clear()
        secondary.clear()


def check_failover_only_in_headers(client, primary, secondary):
    primary.fault({"type": "status", "status": 503})
    try:
        raw = client.messages.with_raw_response.create(model="chat", max_tokens=64, messages=HELLO)
        assert raw.headers["x-switchyard-served-by"] == "secondary/claude-sonnet-4-5", raw.headers
        assert raw.headers["x-switchyard-tier"] == "fallback"
        m = raw.parse()
        assert m.model == "chat", m.model
        assert m.content[0].text == EXPECTED, m

        with client.messages.with_streaming_response.create(
            model="chat", max_tokens=64, messages=HELLO, stream=True
        ) as raw:
            assert raw.headers["x-switchyard-served-by"] == "secondary/claude-sonnet-4-5"
            text = ""
            for event in raw.parse():
                if event.type == "content_block_delta":
                    text += event.delta.text
        assert text == EXPECTED, text
        assert primary.requests(), "the primary was tried first"
    finally:
        primary.clear()


CHECKS = [
    check_streaming_text,
    check_streaming_tool_use,
    check_non_streaming,
    check_errors_with_max_retries_0,
    check_cut_stream_raises,
    check_failover_only_in_headers,
]


def main():
    args = arguments(__doc__.splitlines()[0], "http://HOST:PORT")
    # max_retries=0: every error is what Switchyard answered, not a retry's.
    client = Anthropic(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=30)
    print(f"anthropic {anthropic.__version__}")
    return run_checks(CHECKS, client, args)


if __name__ == "__main__":
    sys.exit(main())
