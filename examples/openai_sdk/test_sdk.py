#!/usr/bin/env python3
"""The official `openai` Python SDK against Switchyard's OpenAI-compatible
front door (`[server] http_listen`). Run by tests/openai_sdk.rs with a
switchyard whose route `chat` goes to two `switchyard mock-upstream`s; it sets
the mocks' faults and reads their request logs over their control API.

    pip install -r examples/openai_sdk/requirements.txt
    python3 examples/openai_sdk/test_sdk.py --base-url http://127.0.0.1:8080/v1 \
        --primary http://127.0.0.1:8001 --secondary http://127.0.0.1:8002

Prints one PASS/FAIL line per check; exits 1 if any check failed.
"""

import json
import pathlib
import sys

import openai
from openai import OpenAI

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from mock_control import arguments, run_checks  # noqa: E402

EXPECTED = "".join(f"tok{i} " for i in range(16))
HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a place",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}


def check_streaming_text(client, primary, secondary):
    stream = client.chat.completions.create(
        model="chat",
        messages=HELLO,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage, roles = "", None, None, []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk", chunk
        if not chunk.choices:
            usage = chunk.usage
            continue
        choice = chunk.choices[0]
        if choice.delta.role:
            roles.append(choice.delta.role)
        text += choice.delta.content or ""
        finish = choice.finish_reason or finish
    assert roles == ["assistant"], roles
    assert text == EXPECTED, text
    assert finish == "stop", finish
    assert usage is not None and usage.completion_tokens == 16, usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def check_streaming_tool_calls(client, primary, secondary):
    # The SDK's own accumulator (`.stream()`) joins the deltas by index.
    with client.chat.completions.stream(
        model="chat",
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert len(calls) == 1, calls
    assert calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert calls[0].id, calls[0]
    args = json.loads(calls[0].function.arguments)
    assert isinstance(args["query"], str), args

    # Send the result back: assistant tool_calls + a tool message.
    follow = client.chat.completions.create(
        model="chat",
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": calls[0].id,
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": calls[0].function.arguments,
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": calls[0].id, "content": "sunny"},
        ],
    )
    assert follow.choices[0].message.content == EXPECTED, follow


def check_non_streaming(client, primary, secondary):
    c = client.chat.completions.create(
        model="chat",
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Say hello."}]},
        ],
        max_completion_tokens=3,
        temperature=0.2,
        stop=["\n\n"],
    )
    assert c.object == "chat.completion", c
    assert c.model == "chat", c.model
    assert c.choices[0].message.role == "assistant"
    assert c.choices[0].message.content == "tok0 tok1 tok2 ", c
    assert c.choices[0].finish_reason == "length", c
    assert c.usage.completion_tokens == 3, c.usage


def check_unknown_model_raises_not_found(client, primary, secondary):
    primary.clear()
    secondary.clear()
    try:
        client.chat.completions.create(model="no-such-route", messages=HELLO)
    except openai.NotFoundError as e:
        assert e.status_code == 404
        assert e.code == "UNKNOWN_ROUTE", e.code
        assert e.param == "model", e.param
        assert e.type == "invalid_request_error", e.type
        assert e.request_id, "x-request-id header"
    else:
        raise AssertionError("no NotFoundError")
    try:
        client.chat.completions.create(model="chat", messages=HELLO, temperature=5)
    except openai.BadRequestError as e:
        assert e.param == "temperature", e.param
    else:
        raise AssertionError("no BadRequestError")
    assert primary.requests() == [] and secondary.requests() == [], "an upstream was called"


def check_cut_stream_raises(client, primary, secondary):
    # Whichever target serves is cut after 3 tokens: the SDK must raise, not
    # end the iteration as if the answer were complete.
    for m in (primary, secondary):
        m.fault({"type": "abort", "after_tokens": 3})
    try:
        stream = client.chat.completions.create(model="chat", messages=HELLO, stream=True)
        text = ""
        try:
            for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
        except openai.APIError as e:
            assert "stream" in str(e.message), e.message
            assert text and text != EXPECTED, text
        else:
            raise AssertionError(f"a cut stream ended quietly with {text!r}")
    finally:
        primary.clear()
        secondary.clear()


def check_failover_only_in_headers(client, primary, secondary):
    primary.fault({"type": "status", "status": 503})
    try:
        raw = client.chat.completions.with_raw_response.create(model="chat", messages=HELLO)
        assert raw.headers["x-switchyard-served-by"] == "secondary/claude-sonnet-4-5", raw.headers
        assert raw.headers["x-switchyard-tier"] == "fallback"
        c = raw.parse()
        assert c.model == "chat", c.model
        assert c.choices[0].message.content == EXPECTED, c

        raw = client.chat.completions.with_raw_response.create(
            model="chat", messages=HELLO, stream=True
        )
        assert raw.headers["x-switchyard-served-by"] == "secondary/claude-sonnet-4-5"
        text = "".join(
            (ch.choices[0].delta.content or "") for ch in raw.parse() if ch.choices
        )
        assert text == EXPECTED, text
        assert primary.requests(), "the primary was tried first"
    finally:
        primary.clear()


CHECKS = [
    check_streaming_text,
    check_streaming_tool_calls,
    check_non_streaming,
    check_unknown_model_raises_not_found,
    check_cut_stream_raises,
    check_failover_only_in_headers,
]


def main():
    args = arguments(__doc__.splitlines()[0], "http://HOST:PORT/v1")
    # max_retries=0: every error is what Switchyard answered, not a retry's.
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=30)
    print(f"openai {openai.__version__}")
    return run_checks(CHECKS, client, args)


if __name__ == "__main__":
    sys.exit(main())
