#!/usr/bin/env python3
"""LangChain's structured output through Switchyard's doors, answered by
`switchyard mock-upstream`s that honour the schema. Run by
tests/structured_output.rs with a switchyard whose route `schema_openai`
goes to an OpenAI-shaped mock (with the `json_schema` capability) and route
`schema_anthropic` to an Anthropic-shaped one.

    pip install -r examples/structured_output/requirements.txt
    python3 examples/structured_output/test_langchain.py --base-url http://127.0.0.1:8080 \
        --primary http://127.0.0.1:8001 --secondary http://127.0.0.1:8002

- `ChatOpenAI(...).with_structured_output(Person, method="json_schema")`:
  Chat Completions `response_format` json_schema (strict, named Person).
- `ChatAnthropic(...).with_structured_output(Person)`: its default, a forced
  tool named Person; with `method="json_schema"`, `output_config.format`.

Prints one PASS/FAIL line per check; exits 1 if any check failed.
"""

import os
import pathlib
import sys
from typing import Literal

from langchain_anthropic import ChatAnthropic
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from mock_control import arguments, run_checks  # noqa: E402

os.environ.pop("LANGSMITH_TRACING", None)
os.environ.pop("LANGCHAIN_TRACING_V2", None)


class Person(BaseModel):
    """A person."""

    name: str = Field(description="Full name")
    age: int = Field(ge=18, description="Age in years")
    role: Literal["admin", "user"]


class LoosePerson(BaseModel):
    """A person (no numeric bounds: Anthropic's output_config.format takes none)."""

    name: str = Field(description="Full name")
    age: int = Field(description="Age in years")
    role: Literal["admin", "user"]


PROMPT = "Who is the admin? Answer with the person."


def assert_person(p, cls=Person, age=18):
    assert isinstance(p, cls), repr(p)
    # The mock's instance of the schema: the tokens in the first plain
    # string, the lowest allowed number, the first enum value.
    assert p.name.startswith("tok0 tok1 "), p
    assert p.age == age, p
    assert p.role == "admin", p


def check_chat_openai_json_schema(args, primary, secondary):
    primary.clear()
    llm = ChatOpenAI(
        model="schema_openai",
        base_url=args.base_url + "/v1",
        api_key=args.api_key,
        max_retries=0,
    )
    person = llm.with_structured_output(Person, method="json_schema").invoke(PROMPT)
    assert_person(person)
    log = primary.requests()
    assert len(log) == 1, log
    fmt = log[0]["body"]["response_format"]
    assert fmt["type"] == "json_schema", fmt
    assert fmt["json_schema"]["name"] == "Person", fmt
    assert fmt["json_schema"]["strict"] is True, fmt
    schema = fmt["json_schema"]["schema"]
    assert schema["properties"]["age"]["minimum"] == 18, schema
    assert schema["additionalProperties"] is False, schema
    assert "tools" not in log[0]["body"], log[0]["body"]


def check_chat_anthropic_tool(args, primary, secondary):
    secondary.clear()
    llm = ChatAnthropic(
        model="schema_anthropic",
        base_url=args.base_url,
        api_key=args.api_key,
        max_tokens=1024,
        max_retries=0,
    )
    person = llm.with_structured_output(Person).invoke(PROMPT)
    assert_person(person)
    log = secondary.requests()
    assert len(log) == 1, log
    body = log[0]["body"]
    assert body["tool_choice"]["type"] == "tool", body["tool_choice"]
    assert body["tool_choice"]["name"] == "Person", body["tool_choice"]
    assert [t["name"] for t in body["tools"]] == ["Person"], body["tools"]
    assert body["tools"][0]["input_schema"]["properties"]["role"]["enum"] == [
        "admin",
        "user",
    ], body["tools"][0]


def check_chat_anthropic_json_schema(args, primary, secondary):
    secondary.clear()
    llm = ChatAnthropic(
        model="schema_anthropic",
        base_url=args.base_url,
        api_key=args.api_key,
        max_tokens=1024,
        max_retries=0,
    )
    person = llm.with_structured_output(LoosePerson, method="json_schema").invoke(
        PROMPT
    )
    assert_person(person, LoosePerson, 0)
    log = secondary.requests()
    assert len(log) == 1, log
    body = log[0]["body"]
    fmt = body["output_config"]["format"]
    assert fmt["type"] == "json_schema", fmt
    assert fmt["schema"]["properties"]["role"]["enum"] == ["admin", "user"], fmt
    assert "tools" not in body, body


def main():
    args = arguments(
        __doc__.splitlines()[0],
        "Switchyard's HTTP door, without /v1 (http://HOST:PORT)",
    )
    checks = [
        check_chat_openai_json_schema,
        check_chat_anthropic_tool,
        check_chat_anthropic_json_schema,
    ]
    return run_checks(checks, args, args)


if __name__ == "__main__":
    sys.exit(main())
