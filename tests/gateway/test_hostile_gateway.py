"""A hostile upstream seen through the gateway and the runtime, with the official SDK.

Oversize, garbage and truncated answers become a 502 in the error shape (before the
first byte) or an error event (after it), are metered as failures, and the runtime
never stores a cut answer as a complete turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.fakes.hostile_upstream import HostileUpstream
from app.fakes.serve import serve_asgi
from tests.support.gateway import GatewayEnv, unique
from tests.support.runtime import RuntimeEnv, runtime_env

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def hostile(env: GatewayEnv) -> AsyncIterator[tuple[HostileUpstream, str]]:
    """A hostile fake registered as a backend serving a model of its own."""
    model = unique("hostile-model")
    fake = HostileUpstream(unique("hostile"), models=(model,))
    async with serve_asgi(fake) as url:
        await env.register(unique("hostile"), url)
        yield fake, model


async def stream_text(stream: Any) -> str:
    parts = []
    async for chunk in stream:
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
    return "".join(parts)


async def test_an_oversize_answer_is_a_502_in_the_error_shape(
    env: GatewayEnv, hostile: tuple[HostileUpstream, str]
) -> None:
    fake, model = hostile
    fake.control.mode, fake.control.size = "oversize", 64 * 1024 * 1024
    with pytest.raises(openai.APIStatusError) as caught:
        await env.sdk().chat.completions.create(model=model, messages=HELLO)
    assert caught.value.status_code == 502
    error = caught.value.body
    assert isinstance(error, dict)
    assert set(error) >= {"message", "type", "code", "param"}
    assert error["code"] == "bad_gateway"
    assert "larger than the 33554432-byte limit" in error["message"]
    rows = await env.usage_rows()
    assert (rows[-1].status, rows[-1].error_code) == (502, "bad_gateway")


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("garbage", "not an event stream"),
        ("invalid_frames", "not JSON"),
        ("wrong_shape", "without choices"),
        ("upstream_error", "model crashed"),
        ("truncated", "without [DONE]"),
    ],
)
async def test_a_broken_stream_is_an_error_never_a_success(
    env: GatewayEnv, hostile: tuple[HostileUpstream, str], mode: str, reason: str
) -> None:
    fake, model = hostile
    fake.control.mode = mode  # type: ignore[assignment]
    with pytest.raises(openai.APIError) as caught:
        await stream_text(
            await env.sdk().chat.completions.create(model=model, messages=HELLO, stream=True)
        )
    assert reason in str(caught.value)
    rows = await env.usage_rows()
    assert rows[-1].status == 502
    assert rows[-1].error_code == "bad_gateway"


async def test_a_garbage_completion_is_a_502(
    env: GatewayEnv, hostile: tuple[HostileUpstream, str]
) -> None:
    fake, model = hostile
    fake.control.mode = "wrong_shape"
    with pytest.raises(openai.APIStatusError) as caught:
        await env.sdk().chat.completions.create(model=model, messages=HELLO)
    assert caught.value.status_code == 502
    assert "without choices" in str(caught.value)


async def test_the_same_upstream_answers_again_once_it_behaves(
    env: GatewayEnv, hostile: tuple[HostileUpstream, str]
) -> None:
    fake, model = hostile
    fake.control.mode = "truncated"
    with pytest.raises(openai.APIError):
        await stream_text(
            await env.sdk().chat.completions.create(model=model, messages=HELLO, stream=True)
        )
    fake.control.mode = "well"
    text = await stream_text(
        await env.sdk().chat.completions.create(model=model, messages=HELLO, stream=True)
    )
    assert text == "Hello there"


@pytest.fixture
async def rt(env: GatewayEnv) -> AsyncIterator[RuntimeEnv]:
    runtime = await runtime_env(env)
    yield runtime
    await runtime.cleanup()


@pytest.mark.parametrize("mode", ["truncated", "invalid_frames", "upstream_error"])
async def test_the_runtime_never_stores_a_cut_answer_as_a_turn(
    rt: RuntimeEnv, hostile: tuple[HostileUpstream, str], mode: str
) -> None:
    fake, model = hostile
    profile = await rt.profile(model)
    conversation = await rt.conversation(modelProfileId=profile)
    fake.control.mode = mode  # type: ignore[assignment]

    result = await rt.chat(conversation, "Tell me everything")

    stored = [m["role"] for m in await rt.messages(conversation)]
    if result.status == 200:
        # The first chunk had come: the failure travels in the stream.
        assert len(result.errors) == 1
        assert result.errors[0]["error"]["code"] == "bad_gateway"
        assert result.done
        assert stored == ["user"]
    else:
        # It failed within the upstream's first read: nothing was relayed, so the
        # runtime gets the status and no turn is stored at all.
        assert result.status == 502
        assert result.body["error"]["code"] == "bad_gateway"
        assert stored == []
    rows = await rt.gw.usage_rows()
    assert rows[-1].status == 502
