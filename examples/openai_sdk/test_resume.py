"""The official openai SDK resumes a dropped stream through Switchyard.

Streams a chat completion with an Idempotency-Key, reads the raw SSE lines
until a few events have arrived (each frame carries `id: <seq>`), closes the
connection, then makes the same call again with the same key and a
`Last-Event-ID` header: the SDK gets only what follows, and the two parts
are one answer. Prints one PASS line per check; exits non-zero on a failure.

    python3 test_resume.py --base-url http://127.0.0.1:8080/v1 --expected "tok0 tok1 ..."
"""

import argparse
import json
import sys

import openai


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--base-url", required=True)
    p.add_argument("--expected", required=True)
    a = p.parse_args()
    client = openai.OpenAI(base_url=a.base_url, api_key="unused", max_retries=0)
    key = {"Idempotency-Key": "sdk-resume-1"}
    ask = dict(
        model="chat",
        messages=[{"role": "user", "content": "hello"}],
        stream=True,
        max_tokens=40,
    )

    # 1. Read until event 6 has arrived, then drop the connection.
    held, last_id = "", 0
    with client.chat.completions.with_streaming_response.create(
        extra_headers=key, **ask
    ) as response:
        token = response.headers.get("x-switchyard-resume-token", "")
        frame_id = None
        for line in response.iter_lines():
            if line.startswith("id: "):
                frame_id = int(line[4:])
            elif line.startswith("data: ") and line != "data: [DONE]":
                delta = json.loads(line[6:])["choices"][0]["delta"]
                held += delta.get("content") or ""
            elif line == "" and frame_id is not None:
                last_id = frame_id
                if last_id >= 6:
                    break
    check(len(token) == 22, f"the response names its journal ({token!r})")
    check(last_id >= 6 and held, f"dropped after event {last_id} holding {held!r}")

    # 2. The same call, the same key, and Last-Event-ID: only the rest.
    rest = ""
    stream = client.chat.completions.create(
        extra_headers={**key, "Last-Event-ID": str(last_id)}, **ask
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            rest += chunk.choices[0].delta.content
    check(held + rest == a.expected, f"one answer: {held!r} + {rest!r}")
    return 0


def check(ok: bool, what: str) -> None:
    if not ok:
        print(f"FAIL {what}")
        sys.exit(1)
    print(f"PASS {what}")


if __name__ == "__main__":
    sys.exit(main())
