"""``/v1`` refuses at the edge what an upstream's parser would refuse: a 400 in the
error shape, and the upstream never sees the call (it used to answer 400, which the
client got as a 502)."""

from __future__ import annotations

import httpx
import pytest

from app.fakes.openai_upstream import FakeOpenAI
from tests.support.gateway import GatewayEnv, unique
from tests.support.helpers import assert_error, bearer


@pytest.fixture
async def upstream(env: GatewayEnv) -> tuple[FakeOpenAI, str]:
    model = unique("edge-model")
    fake, url = await env.fake("edge", models=[model])
    await env.register(unique("edge"), url)
    return fake, model


def body(model: str, content: bytes) -> bytes:
    return (
        b'{"model": "'
        + model.encode()
        + b'", "messages": [{"role": "user", "content": '
        + (content + b"}]}")
    )


async def post(env: GatewayEnv, path: str, raw: bytes) -> httpx.Response:
    return await env.http.post(
        path, content=raw, headers={**bearer(env.api_key), "content-type": "application/json"}
    )


@pytest.mark.parametrize(
    ("content", "code"),
    [
        (b'"caf\xe9 au lait"', "invalid_json"),  # latin-1, not UTF-8
        (b'"\xff\xfe"', "invalid_json"),
        (b"1" * 5000, "invalid_json"),  # a number no parser represents
        (b"1e400", "invalid_json"),
        (b'"\\ud800"', "invalid_json"),  # a lone surrogate escape
        (b"[" * 1000 + b"]" * 1000, "json_too_deep"),
        (b"[" * 64 + b"]" * 64, "json_too_deep"),  # 3 levels of body around it: 67
    ],
)
async def test_what_no_upstream_parses_is_a_400_and_never_sent(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str], content: bytes, code: str
) -> None:
    fake, model = upstream
    before = fake.stats.requests
    response = await post(env, "/v1/chat/completions", body(model, content))
    assert_error(response, 400, code)
    assert fake.stats.requests == before


async def test_embeddings_are_checked_the_same_way(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str]
) -> None:
    fake, model = upstream
    raw = b'{"model": "' + model.encode() + b'", "input": "\xc3\x28"}'
    response = await post(env, "/v1/embeddings", raw)
    assert_error(response, 400, "invalid_json")
    assert fake.stats.embeddings == 0


async def test_nesting_within_the_bound_and_nul_in_a_prompt_are_relayed(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str]
) -> None:
    # A prompt is passed on, not stored: NUL in it is the upstream's business.
    _, model = upstream
    response = await post(env, "/v1/chat/completions", body(model, b'"a\\u0000b"'))
    assert response.status_code == 200, response.text
    tool = b'{"type": "object", "properties": {"x": ' + b"[" * 40 + b"]" * 40 + b"}}"
    raw = body(model, b'"hi"')[:-1] + b', "extra": ' + tool + b"}"
    response = await post(env, "/v1/chat/completions", raw)
    assert response.status_code == 200, response.text


async def test_nul_in_a_stored_field_names_it(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str]
) -> None:
    fake, model = upstream
    for field in ("model", "conversation_id", "provider"):
        raw = body(model, b'"hi"')[:-1] + f', "{field}": "x\\u0000y"}}'.encode()
        response = await post(env, "/v1/chat/completions", raw)
        error = assert_error(response, 400, "unsupported_character")
        assert error["param"] == field
    assert fake.stats.chats == 0
