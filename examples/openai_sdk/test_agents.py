#!/usr/bin/env python3
"""The OpenAI Agents SDK (`openai-agents`) against Switchyard's Responses
door: one `Agent` with one function tool, run with `Runner.run_sync` and
with `Runner.run_streamed`, and continued on the door's stored
conversation (`auto_previous_response_id`, `previous_response_id`), on the
SDK's default model class
(`OpenAIResponsesModel`, `POST /v1/responses`) and its default model name
(the route is named after it). Run by tests/responses_agents.rs against the real
binary and a `switchyard mock-upstream`, which is scripted to call the tool
and to answer with text once the tool's result comes back; every check also
reads what reached the upstream.

    --base-url URL --primary URL     PASS/FAIL line per check; exits 1 if one failed
"""

import argparse
import asyncio
import json
import os
import pathlib
import sys
import traceback

# Before the SDK is imported: nothing goes to OpenAI's trace exporter.
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

from agents import (  # noqa: E402
    Agent,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from agents.models import get_default_model  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from mock_control import Mock  # noqa: E402

EXPECTED = "".join(f"tok{i} " for i in range(16))
CALLS = []


@function_tool
def get_weather(city: str) -> str:
    """Return the weather for a city."""
    CALLS.append(city)
    return f"sunny in {city}"


def agent():
    # No model named: the SDK's default, which is also the route's name.
    return Agent(
        name="Weather",
        instructions="You answer weather questions using the tool.",
        tools=[get_weather],
    )


def script_the_tool_call(primary):
    primary.tools(
        {"name": "get_weather", "arguments": '{"city":"Paris"}', "text_after_result": True}
    )


def assert_the_upstream_saw_the_round_trip(primary):
    sent = [r["body"] for r in primary.requests() if r.get("path") == "/v1/chat/completions"]
    assert len(sent) == 2, [r.get("path") for r in primary.requests()]
    first, second = sent
    for body in sent:
        tools = body["tools"]
        assert [t["function"]["name"] for t in tools] == ["get_weather"], tools
        assert tools[0]["function"]["parameters"]["properties"] == {
            "city": {"title": "City", "type": "string"}
        }, tools
    assert first["messages"] == [
        {"role": "system", "content": "You answer weather questions using the tool."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ], first["messages"]
    msgs = second["messages"]
    assert msgs[:2] == first["messages"], msgs
    call = msgs[2]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather", msgs
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}, msgs
    assert msgs[3] == {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": "sunny in Paris",
    }, msgs
    assert len(msgs) == 4, msgs


def check_run_sync_with_a_function_tool(primary):
    script_the_tool_call(primary)
    result = Runner.run_sync(agent(), "What is the weather in Paris?")
    assert CALLS == ["Paris"], CALLS
    assert result.final_output == EXPECTED, result.final_output
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"], kinds
    assert result.last_response_id and result.last_response_id.startswith("resp_"), result
    assert_the_upstream_saw_the_round_trip(primary)


def check_run_streamed_with_a_function_tool(primary):
    script_the_tool_call(primary)

    async def run():
        result = Runner.run_streamed(agent(), "What is the weather in Paris?")
        deltas = []
        async for event in result.stream_events():
            if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
                deltas.append(event.data.delta)
        return result, deltas

    result, deltas = asyncio.run(run())
    assert CALLS == ["Paris"], CALLS
    assert result.final_output == EXPECTED, result.final_output
    assert "".join(deltas) == EXPECTED, deltas
    assert_the_upstream_saw_the_round_trip(primary)


def check_server_side_conversation(primary):
    # auto_previous_response_id: the second model call sends only the tool's
    # result with `previous_response_id`; the door's stored conversation
    # fills in the rest, so the upstream sees the same whole history.
    script_the_tool_call(primary)
    result = Runner.run_sync(
        agent(), "What is the weather in Paris?", auto_previous_response_id=True
    )
    assert CALLS == ["Paris"], CALLS
    assert result.final_output == EXPECTED, result.final_output
    assert_the_upstream_saw_the_round_trip(primary)
    # And a next turn continues from the last response by its id alone.
    before = len(primary.requests())
    again = Runner.run_sync(
        agent(), "And tomorrow?", previous_response_id=result.last_response_id
    )
    assert again.final_output == EXPECTED, again.final_output
    assert CALLS == ["Paris", "Paris"], CALLS
    msgs = primary.requests()[before]["body"]["messages"]
    assert msgs[3] == {
        "role": "tool",
        "tool_call_id": msgs[2]["tool_calls"][0]["id"],
        "content": "sunny in Paris",
    }, msgs
    assert msgs[4:] == [
        {"role": "assistant", "content": EXPECTED},
        {"role": "user", "content": "And tomorrow?"},
    ], msgs


CHECKS = [
    check_run_sync_with_a_function_tool,
    check_run_streamed_with_a_function_tool,
    check_server_side_conversation,
]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", required=True, help="http://HOST:PORT/v1")
    p.add_argument("--primary", required=True, help="the mock-upstream behind the route")
    args = p.parse_args()
    set_tracing_disabled(True)
    set_default_openai_api("responses")
    print(f"default model: {get_default_model()}")
    primary = Mock(args.primary)
    failed = 0
    for check in CHECKS:
        primary.clear()
        CALLS.clear()
        # A client per check: an AsyncOpenAI client belongs to one event
        # loop, and run_sync and asyncio.run each make their own.
        client = AsyncOpenAI(base_url=args.base_url, api_key="unused-in-open-mode", max_retries=0)
        set_default_openai_client(client, use_for_tracing=False)
        try:
            check(primary)
            print(f"PASS {check.__name__}")
        except Exception:  # noqa: BLE001 - report every check
            failed += 1
            print(f"FAIL {check.__name__}")
            traceback.print_exc(file=sys.stdout)
    print(f"agents checks: {len(CHECKS) - failed} ok, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
