#!/usr/bin/env python3
"""The official `openai` Python SDK's Batch API (`client.files.create`,
`client.batches.create/retrieve/cancel`, `client.files.content`) against
Switchyard's durable queue. Run by tests/openai_batch.rs in phases, with a
SIGKILL of switchyard between them:

    submit  --base-url URL --out FILE    upload a JSONL file and create a batch
                                         (while every provider is down); write
                                         the ids to FILE
    finish  --base-url URL --ids FILE    poll until the batch completes, then
                                         check the output file line by line
    cancel  --base-url URL               a batch cancelled while queued
    expire  --base-url URL               a batch whose window passes while queued
    invalid --base-url URL               a file with a bad line fails the batch

Prints PASS/FAIL lines; exits 1 if a check failed.
"""

import argparse
import io
import json
import sys
import time
import traceback

from openai import OpenAI

EXPECTED = "".join(f"tok{i} " for i in range(16))
LINES = 5


def jsonl(n, model="chat"):
    rows = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"Question {i}"}]},
        }
        for i in range(n)
    ]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def create(client, data, window="24h"):
    f = client.files.create(file=("batch.jsonl", io.BytesIO(data)), purpose="batch")
    assert f.object == "file" and f.purpose == "batch" and f.bytes == len(data), f
    b = client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window=window,
        metadata={"suite": "switchyard"},
    )
    return f, b


def submit(client, args):
    f, b = create(client, jsonl(LINES))
    assert b.object == "batch", b
    assert b.status == "in_progress", b.status
    assert b.request_counts.total == LINES, b.request_counts
    assert b.metadata == {"suite": "switchyard"}, b.metadata
    assert client.batches.retrieve(b.id).status == "in_progress"
    with open(args.out, "w") as out:
        json.dump({"file": f.id, "batch": b.id}, out)


def finish(client, args):
    ids = json.load(open(args.ids))
    deadline = time.time() + 60
    while True:
        b = client.batches.retrieve(ids["batch"])
        if b.status in ("completed", "failed", "expired", "cancelled"):
            break
        assert time.time() < deadline, f"batch still {b.status}: {b.request_counts}"
        time.sleep(0.25)
    assert b.status == "completed", b
    assert b.request_counts.completed == LINES and b.request_counts.failed == 0, b.request_counts
    assert b.output_file_id and b.error_file_id is None, b
    assert b.completed_at and b.in_progress_at and b.finalizing_at, b
    text = client.files.content(b.output_file_id).text
    rows = [json.loads(line) for line in text.splitlines()]
    assert [r["custom_id"] for r in rows] == [f"req-{i}" for i in range(LINES)], rows
    for r in rows:
        assert r["error"] is None, r
        assert r["response"]["status_code"] == 200, r
        body = r["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == "chat", body
        assert body["choices"][0]["message"]["content"] == EXPECTED, body
    # The input file is still there, byte for byte.
    assert client.files.content(ids["file"]).content == jsonl(LINES)


def cancel(client, args):
    _, b = create(client, jsonl(3))
    assert b.status == "in_progress", b.status
    c = client.batches.cancel(b.id)
    assert c.status in ("cancelling", "cancelled"), c.status
    deadline = time.time() + 30
    while c.status != "cancelled":
        assert time.time() < deadline, c.status
        time.sleep(0.25)
        c = client.batches.retrieve(b.id)
    assert c.request_counts.failed == 3 and c.request_counts.completed == 0, c.request_counts
    rows = [json.loads(line) for line in client.files.content(c.error_file_id).text.splitlines()]
    assert {r["error"]["code"] for r in rows} == {"batch_cancelled"}, rows


def expire(client, args):
    # Every provider is down: the window passes with the lines still queued.
    _, b = create(client, jsonl(2), window="1s")
    assert b.status == "in_progress", b.status
    time.sleep(1.5)
    deadline = time.time() + 30
    while b.status != "expired":
        assert time.time() < deadline, b.status
        b = client.batches.retrieve(b.id)
        time.sleep(0.25)
    assert b.expired_at and b.request_counts.failed == 2, b
    rows = [json.loads(line) for line in client.files.content(b.error_file_id).text.splitlines()]
    assert {r["error"]["code"] for r in rows} == {"batch_expired"}, rows


def invalid(client, args):
    data = jsonl(2) + b'{"custom_id": "req-0", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    _, b = create(client, data)
    assert b.status == "failed", b.status
    codes = [(e.line, e.param) for e in b.errors.data]
    assert (3, "custom_id") in codes, b.errors
    try:
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                              completion_window="24h")
    except Exception as e:  # noqa: BLE001 - the SDK's NotFoundError
        assert getattr(e, "status_code", None) == 404, e
    else:
        raise AssertionError("an unknown input file was accepted")


PHASES = {"submit": submit, "finish": finish, "cancel": cancel, "expire": expire, "invalid": invalid}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("phase", choices=sorted(PHASES))
    p.add_argument("--base-url", required=True, help="http://HOST:PORT/v1")
    p.add_argument("--out")
    p.add_argument("--ids")
    p.add_argument("--api-key", default="unused-in-open-mode")
    args = p.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=30)
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
