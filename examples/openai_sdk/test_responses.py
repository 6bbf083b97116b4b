#!/usr/bin/env python3
"""The official `openai` Python SDK's Responses API (`client.responses.*`)
against Switchyard's Responses door. Run by tests/responses_door.rs and
tests/responses_fleet.rs against the real binary and `switchyard
mock-upstream`s, whose control API it uses to set faults, script tool calls
and read what reached the upstream.

    checks       --base-url URL --primary URL --secondary URL
                 every single-replica check (PASS/FAIL line each)
    chain-first  --base-url URL --out FILE      a stored response; ids to FILE
    chain-next   --base-url URL --ids FILE      continue it (previous_response_id)
    chain-stranger --base-url URL --ids FILE --api-key KEY
                 another tenant: the id does not exist for it
    bg-start     --base-url URL --out FILE      a streamed background response,
                 left after `response.in_progress`; id and last event to FILE
    bg-resume    --base-url URL --ids FILE      resume it after that event

Exits 1 if a check failed.
"""

import argparse
import json
import pathlib
import sys
import time
import traceback

import openai
from openai import OpenAI

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from mock_control import Mock  # noqa: E402

EXPECTED = "".join(f"tok{i} " for i in range(16))
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
PARIS = {"name": "get_weather", "arguments": '{"city":"Paris"}', "text_after_result": True}


def last_messages(mock):
    return mock.requests()[-1]["body"]["messages"]


def check_plain(client, primary, secondary):
    raw = client.responses.with_raw_response.create(
        model="chat", input="Say hello.", instructions="Be brief."
    )
    assert raw.headers["x-switchyard-served-by"] == "primary/gpt-4o-mini", raw.headers
    assert raw.headers["x-switchyard-tier"] == "primary", raw.headers
    r = raw.parse()
    assert r.id.startswith("resp_") and r.object == "response", r
    assert r.status == "completed" and r.output_text == EXPECTED, r
    assert r.model == "chat" and r.instructions == "Be brief.", r
    assert r.output[0].type == "message" and r.output[0].content[0].annotations == [], r.output
    assert r.usage.output_tokens == 16, r.usage
    assert r.usage.total_tokens == r.usage.input_tokens + 16, r.usage
    assert last_messages(primary) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
    ], last_messages(primary)
    # Stored (the default): retrieved, listed, deleted.
    again = client.responses.retrieve(r.id)
    assert again.output_text == EXPECTED and again.status == "completed", again
    items = client.responses.input_items.list(r.id)
    assert [(i.type, i.role) for i in items.data] == [("message", "user")], items
    gone = client.responses.delete(r.id)
    assert gone is None or getattr(gone, "deleted", True), gone
    try:
        client.responses.retrieve(r.id)
    except openai.NotFoundError as e:
        assert "not found" in str(e), e
    else:
        raise AssertionError("a deleted response is still there")


def check_stream_events(client, primary, secondary):
    events = list(client.responses.create(model="chat", input="Say hello.", stream=True))
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events))), kinds
    assert kinds[:5] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
    ], kinds
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ], kinds
    assert kinds.count("response.output_text.delta") == 16, kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == EXPECTED, text
    assert events[-1].response.output_text == EXPECTED, events[-1]
    assert events[-1].response.usage.output_tokens == 16, events[-1].response.usage


def check_stream_helper(client, primary, secondary):
    # The SDK's own helper is strict about the order of events.
    with client.responses.stream(model="chat", input="Say hello.") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == EXPECTED, deltas
    assert final.output_text == EXPECTED and final.status == "completed", final


def check_function_tool_round_trip(client, primary, secondary):
    primary.tools(PARIS)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    r1 = client.responses.create(model="chat", input=ask, tools=[WEATHER])
    calls = [o for o in r1.output if o.type == "function_call"]
    assert len(calls) == 1, r1.output
    call = calls[0]
    assert call.name == "get_weather" and call.id.startswith("fc_"), call
    assert json.loads(call.arguments) == {"city": "Paris"}, call
    sent = primary.requests()[-1]["body"]
    assert sent["tools"][0]["function"]["name"] == "get_weather", sent["tools"]
    assert sent["tools"][0]["function"]["strict"] is True, sent["tools"]
    # Stateless: the whole history sent back.
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
    r2 = client.responses.create(model="chat", input=ask + r1.output + [result], tools=[WEATHER])
    assert r2.output_text == EXPECTED, r2
    msgs = last_messages(primary)
    assert msgs[1]["tool_calls"][0]["id"] == call.call_id, msgs
    assert msgs[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}, msgs
    # Stateful: previous_response_id and the result alone.
    r3 = client.responses.create(
        model="chat", previous_response_id=r1.id, input=[result], tools=[WEATHER]
    )
    assert r3.output_text == EXPECTED and r3.previous_response_id == r1.id, r3
    assert last_messages(primary) == msgs, (last_messages(primary), msgs)
    # Streamed, through the strict helper.
    with client.responses.stream(model="chat", input=ask, tools=[WEATHER]) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_response()
    assert "response.function_call_arguments.delta" in kinds, kinds
    assert "response.function_call_arguments.done" in kinds, kinds
    assert final.output[0].type == "function_call", final.output
    assert json.loads(final.output[0].arguments) == {"city": "Paris"}, final.output


def check_failover_is_invisible_but_in_headers(client, primary, secondary):
    primary.fault({"type": "status", "status": 503})
    with client.responses.with_streaming_response.create(
        model="chat", input="Say hello.", stream=True
    ) as raw:
        assert raw.headers["x-switchyard-served-by"] == "secondary/claude-sonnet-4-5", raw.headers
        assert raw.headers["x-switchyard-tier"] == "fallback", raw.headers
        events = list(raw.parse())
    assert events[-1].type == "response.completed", [e.type for e in events]
    assert events[-1].response.output_text == EXPECTED, events[-1]
    primary.fault({})


def check_a_stream_that_fails_after_output_ends_failed(client, primary, secondary):
    primary.fault({"type": "abort", "after_tokens": 3})
    events = list(client.responses.create(model="chat", input="Say hello.", stream=True))
    kinds = [e.type for e in events]
    assert "response.completed" not in kinds, kinds
    assert kinds[-1] == "response.failed", kinds
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.code == "server_error", failed
    assert "tok0 tok1 tok2 " in "".join(
        e.delta for e in events if e.type == "response.output_text.delta"
    ), kinds
    primary.fault({})


def check_background_polled_and_resumed(client, primary, secondary):
    r = client.responses.create(model="chat", input="Say hello.", background=True)
    assert r.background is True and r.status in ("queued", "in_progress", "completed"), r
    deadline = time.time() + 30
    while r.status in ("queued", "in_progress"):
        assert time.time() < deadline, r.status
        time.sleep(0.1)
        r = client.responses.retrieve(r.id)
    assert r.status == "completed" and r.output_text == EXPECTED, r
    # Streamed from an event on: the same numbers as the first time.
    full = list(client.responses.retrieve(r.id, stream=True))
    assert [e.sequence_number for e in full] == list(range(len(full))), [e.type for e in full]
    assert full[0].type == "response.created" and full[0].response.status == "queued", full[0]
    tail = list(client.responses.retrieve(r.id, stream=True, starting_after=3))
    assert [e.sequence_number for e in tail] == list(range(4, len(full))), tail
    assert tail[-1].type == "response.completed", tail[-1]
    # Only background responses can be cancelled; a finished one stays as it is.
    assert client.responses.cancel(r.id).status == "completed"
    plain = client.responses.create(model="chat", input="Say hello.")
    try:
        client.responses.cancel(plain.id)
    except openai.BadRequestError as e:
        assert "background" in str(e), e
    else:
        raise AssertionError("a foreground response was cancelled")


def check_refusals_name_the_parameter(client, primary, secondary):
    def refused(kind, param, **kw):
        try:
            client.responses.create(model="chat", **kw)
        except kind as e:
            body = e.body if isinstance(e.body, dict) else {}
            assert body.get("param") == param, (param, e.body)
            return body
        raise AssertionError(f"accepted: {kw}")

    body = refused(openai.BadRequestError, "previous_response_id",
                   input="hi", previous_response_id="resp_doesnotexist")
    assert body["code"] == "previous_response_not_found", body
    assert body["message"] == "Previous response with id 'resp_doesnotexist' not found.", body
    refused(openai.BadRequestError, "tools[0].type", input="hi", tools=[{"type": "web_search"}])
    refused(openai.BadRequestError, "input[0].content[0].file_id",
            input=[{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}])
    refused(openai.BadRequestError, "input[0].type", input=[{"type": "item_reference", "id": "x"}])
    refused(openai.BadRequestError, "prompt", input="hi", prompt={"id": "pmpt_1"})
    try:
        client.responses.create(model="nope", input="hi")
    except openai.NotFoundError as e:
        assert e.body["param"] == "model", e.body
    else:
        raise AssertionError("an unknown route was served")
    # Beside function tools a built-in one is left out and reported, never faked.
    raw = client.responses.with_raw_response.create(
        model="chat", input="hi", tools=[WEATHER, {"type": "web_search"}],
        reasoning={"effort": "low", "summary": "auto"},
    )
    dropped = raw.headers.get("x-switchyard-dropped", "")
    assert "tools.web_search" in dropped and "reasoning.summary" in dropped, raw.headers
    sent = primary.requests()[-1]["body"]
    assert [t["function"]["name"] for t in sent["tools"]] == ["get_weather"], sent["tools"]


def check_structured_output_and_passthrough(client, primary, secondary):
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    client.responses.create(
        model="chat", input="Where?", max_output_tokens=5, temperature=0.5,
        text={"format": {"type": "json_schema", "name": "City", "schema": schema, "strict": True},
              "verbosity": "low"},
        prompt_cache_key="k1", user="u1", metadata={"a": "b"},
    )
    sent = primary.requests()[-1]["body"]
    assert sent["response_format"]["type"] == "json_schema", sent
    assert sent["response_format"]["json_schema"]["name"] == "City", sent
    assert sent["response_format"]["json_schema"]["schema"] == schema, sent
    assert sent["verbosity"] == "low" and sent["prompt_cache_key"] == "k1", sent
    assert sent["user"] == "u1" and sent["max_tokens"] == 5 and sent["temperature"] == 0.5, sent
    assert "metadata" not in sent and "store" not in sent, sent


CHECKS = [
    check_plain,
    check_stream_events,
    check_stream_helper,
    check_function_tool_round_trip,
    check_failover_is_invisible_but_in_headers,
    check_a_stream_that_fails_after_output_ends_failed,
    check_background_polled_and_resumed,
    check_refusals_name_the_parameter,
    check_structured_output_and_passthrough,
]


def checks(client, args):
    primary, secondary = Mock(args.primary), Mock(args.secondary)
    failed = 0
    for check in CHECKS:
        primary.clear()
        secondary.clear()
        try:
            check(client, primary, secondary)
            print(f"PASS {check.__name__}")
        except Exception:  # noqa: BLE001 - report every check
            failed += 1
            print(f"FAIL {check.__name__}")
            traceback.print_exc(file=sys.stdout)
    print(f"responses checks: {len(CHECKS) - failed} ok, {failed} failed")
    if failed:
        raise AssertionError(f"{failed} checks failed")


def chain_first(client, args):
    r = client.responses.create(model="chat", input="My name is Ada.")
    assert r.status == "completed" and r.output_text == EXPECTED, r
    json.dump({"id": r.id}, open(args.out, "w"))


def chain_next(client, args):
    first = json.load(open(args.ids))["id"]
    r = client.responses.create(model="chat", input="What is my name?", previous_response_id=first)
    assert r.status == "completed" and r.previous_response_id == first, r
    # The first response is readable here too.
    assert client.responses.retrieve(first).output_text == EXPECTED


def chain_stranger(client, args):
    first = json.load(open(args.ids))["id"]
    try:
        client.responses.create(model="chat", input="Who?", previous_response_id=first)
    except openai.BadRequestError as e:
        assert e.body["code"] == "previous_response_not_found", e.body
        assert e.body["message"] == f"Previous response with id '{first}' not found.", e.body
    else:
        raise AssertionError("another tenant continued the response")
    for call in (client.responses.retrieve, client.responses.delete):
        try:
            call(first)
        except openai.NotFoundError:
            pass
        else:
            raise AssertionError(f"another tenant reached it through {call.__name__}")


def bg_start(client, args):
    stream = client.responses.create(model="chat", input="Say hello.", background=True, stream=True)
    seen = []
    for event in stream:
        seen.append(event)
        if event.type == "response.in_progress":
            break
    stream.close()
    assert [e.type for e in seen] == ["response.created", "response.in_progress"], seen
    assert seen[0].response.status == "queued" and seen[0].response.background, seen[0]
    json.dump({"id": seen[0].response.id, "after": seen[-1].sequence_number}, open(args.out, "w"))


def bg_resume(client, args):
    ids = json.load(open(args.ids))
    events = list(client.responses.retrieve(ids["id"], stream=True, starting_after=ids["after"]))
    numbers = [e.sequence_number for e in events]
    assert numbers == list(range(ids["after"] + 1, ids["after"] + 1 + len(events))), numbers
    assert events[-1].type == "response.completed", [e.type for e in events]
    assert events[-1].response.output_text == EXPECTED, events[-1]
    polled = client.responses.retrieve(ids["id"])
    assert polled.status == "completed" and polled.output_text == EXPECTED, polled


PHASES = {
    "checks": checks,
    "chain-first": chain_first,
    "chain-next": chain_next,
    "chain-stranger": chain_stranger,
    "bg-start": bg_start,
    "bg-resume": bg_resume,
}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("phase", choices=sorted(PHASES))
    p.add_argument("--base-url", required=True, help="http://HOST:PORT/v1")
    p.add_argument("--primary")
    p.add_argument("--secondary")
    p.add_argument("--out")
    p.add_argument("--ids")
    p.add_argument("--api-key", default="unused-in-open-mode")
    args = p.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    try:
        PHASES[args.phase](client, args)
    except Exception:  # noqa: BLE001 - report the check
        print(f"FAIL {args.phase}")
        traceback.print_exc(file=sys.stdout)
        return 1
    print(f"PASS {args.phase}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
