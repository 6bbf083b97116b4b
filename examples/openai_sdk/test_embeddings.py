#!/usr/bin/env python3
"""Embeddings and the model list through Switchyard's HTTP doors with the
official clients: the `openai` SDK (`embeddings.create`, whose default is
base64, float, lists, `dimensions`; `models.list()` and `retrieve()`),
LangChain's `OpenAIEmbeddings` and the `anthropic` SDK's `models.list()`.
Run by tests/embeddings.rs with a switchyard whose route `embed` goes to
provider `a`, the mock-upstream `--primary` (model `text-embedding-3-small`),
then `b`, the mock-upstream `--secondary` (`te3-small`, declared the same
family); it sets the mocks' faults and reads their request logs.

    pip install -r examples/openai_sdk/requirements.txt
    python3 examples/openai_sdk/test_embeddings.py --base-url http://127.0.0.1:8080/v1 \
        --primary http://127.0.0.1:8001 --secondary http://127.0.0.1:8002

Prints one PASS/FAIL line per check; exits 1 if any check failed.
"""

import os
import pathlib
import sys

import openai
from openai import OpenAI

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from mock_control import arguments, run_checks  # noqa: E402

ARGS = None


def last_body(mock):
    log = [r for r in mock.requests() if r["path"] == "/v1/embeddings"]
    assert log, "the mock saw no embeddings request"
    return log[-1]["body"]


def check_default_is_base64_and_decoded(client, primary, secondary):
    raw = client.embeddings.with_raw_response.create(
        model="embed", input="What is the refund policy?"
    )
    # On the wire, base64 (the SDK's default ask); the SDK decodes it.
    wire = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(wire, str), type(wire)
    r = raw.parse()
    assert r.model == "text-embedding-3-small", r.model
    assert len(r.data) == 1 and r.data[0].index == 0, r.data
    v = r.data[0].embedding
    assert len(v) == 512, len(v)
    assert any(x != 0.0 for x in v), "an all-zero vector"
    # The SDK asked for base64; Switchyard asked the upstream for it too.
    assert last_body(primary)["encoding_format"] == "base64"
    f = client.embeddings.create(
        model="embed", input="What is the refund policy?", encoding_format="float"
    )
    assert last_body(primary)["encoding_format"] == "float"
    assert f.data[0].embedding == v, "base64 and float answers differ"
    assert r.usage.prompt_tokens > 0, r.usage


def check_a_list_keeps_its_order(client, primary, secondary):
    texts = ["refund policy", "What is the refund policy?", "reset my password"]
    r = client.embeddings.create(model="embed", input=texts)
    assert [d.index for d in r.data] == [0, 1, 2], r.data
    a, b, c = (d.embedding for d in r.data)
    # The mock embeds content words: the first two are the same question.
    assert a == b, "same content words, different vectors"
    assert a != c
    assert last_body(primary)["input"] == texts


def check_dimensions(client, primary, secondary):
    r = client.embeddings.create(model="embed", input="refund policy", dimensions=64)
    assert len(r.data[0].embedding) == 64, len(r.data[0].embedding)
    assert last_body(primary)["dimensions"] == 64


def check_failover_names_the_model_that_served(client, primary, secondary):
    primary.fault({"type": "status", "status": 503})
    try:
        raw = client.embeddings.with_raw_response.create(model="embed", input="refund policy")
        r = raw.parse()
        assert r.model == "te3-small", r.model
        assert raw.headers["x-switchyard-served-by"] == "b/te3-small"
        assert raw.headers["x-switchyard-tier"] == "fallback"
    finally:
        primary.clear()


def check_a_chat_route_cannot_embed(client, primary, secondary):
    try:
        client.embeddings.create(model="chat", input="x")
    except openai.BadRequestError as e:
        assert e.body["code"] == "NO_CAPABLE_TARGET", e.body
        assert "embeddings" in e.body["message"], e.body
    else:
        raise AssertionError("route `chat` embedded")


def check_models_list_and_retrieve(client, primary, secondary):
    ids = [m.id for m in client.models.list()]
    for want in ["embed", "chat", "a/text-embedding-3-small", "b/te3-small"]:
        assert want in ids, ids
    m = client.models.retrieve("embed")
    assert (m.id, m.object, m.owned_by) == ("embed", "model", "switchyard"), m
    assert m.created > 0
    # A pinned target's id has a slash in it.
    assert client.models.retrieve("b/te3-small").owned_by == "b"
    try:
        client.models.retrieve("no-such-model")
    except openai.NotFoundError as e:
        assert e.body["code"] == "UNKNOWN_ROUTE", e.body
    else:
        raise AssertionError("an unknown model was found")


def check_langchain_openai_embeddings(client, primary, secondary):
    os.environ.pop("LANGSMITH_TRACING", None)
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: LangChain sends strings instead of
    # token ids (its tokenizer would be downloaded first, offline here).
    emb = OpenAIEmbeddings(
        model="embed",
        base_url=ARGS.base_url,
        api_key=ARGS.api_key,
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    docs = emb.embed_documents(["refund policy", "What is the refund policy?"])
    assert len(docs) == 2 and len(docs[0]) == 512, [len(d) for d in docs]
    assert docs[0] == docs[1]
    q = emb.embed_query("refund policy")
    assert q == docs[0]
    body = last_body(primary)
    assert body["input"] == ["refund policy"] and body["encoding_format"] == "base64", body


def check_anthropic_sdk_lists_models(client, primary, secondary):
    import anthropic

    root = ARGS.base_url.rstrip("/").removesuffix("/v1")
    a = anthropic.Anthropic(base_url=root, api_key=ARGS.api_key, max_retries=0)
    page = a.models.list(limit=2)
    assert [m.id for m in page.data] == ["embed", "chat"], page.data
    assert page.has_more and page.last_id == "chat", page
    ids = [m.id for m in a.models.list(limit=1000)]
    assert "b/te3-small" in ids, ids
    m = a.models.retrieve("chat")
    assert (m.id, m.type, m.display_name) == ("chat", "model", "chat"), m
    try:
        a.models.retrieve("no-such-model")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error", e.body
    else:
        raise AssertionError("an unknown model was found")


CHECKS = [
    check_default_is_base64_and_decoded,
    check_a_list_keeps_its_order,
    check_dimensions,
    check_failover_names_the_model_that_served,
    check_a_chat_route_cannot_embed,
    check_models_list_and_retrieve,
    check_langchain_openai_embeddings,
    check_anthropic_sdk_lists_models,
]


def main():
    global ARGS
    ARGS = arguments(__doc__.splitlines()[0], "http://HOST:PORT/v1")
    # max_retries=0: every error is what Switchyard answered, not a retry's.
    client = OpenAI(base_url=ARGS.base_url, api_key=ARGS.api_key, max_retries=0, timeout=30)
    print(f"openai {openai.__version__}")
    return run_checks(CHECKS, client, ARGS)


if __name__ == "__main__":
    sys.exit(main())
