"""Every paid call is charged to a project: a user's own token names one it belongs to
(``X-Arona-Project``), or it is refused; the project's quota, custom LLMs and metering
then apply exactly as for its API keys."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from app.db.models.usage import UsageRecord
from app.fakes.openai_upstream import FakeOpenAI
from app.lib.settings import Settings
from tests.support.gateway import ADMIN, GatewayEnv, unique
from tests.support.helpers import assert_error, custom_llm_body, new_project, new_user
from tests.support.settings import with_settings

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "who pays?"}]


@pytest.fixture(scope="module")
def gateway_settings(gateway_settings: Settings) -> Settings:
    # Custom LLMs on the loopback fakes, which the SSRF guard refuses by default.
    return with_settings(gateway_settings, custom_llm_allow_private=True)


@pytest.fixture
async def upstream(env: GatewayEnv) -> tuple[FakeOpenAI, str]:
    model = unique("paid")
    fake, url = await env.fake("paid", models=[model, "embed-" + model])
    await env.register(unique("paid"), url)
    return fake, model


def user_sdk(env: GatewayEnv, headers: dict[str, str], project: str | None) -> Any:
    token = headers["Authorization"].removeprefix("Bearer ")
    extra = {"X-Arona-Project": project} if project is not None else {}
    return openai.AsyncOpenAI(
        base_url=f"{env.url}/v1", api_key=token, max_retries=0, default_headers=extra
    )


async def test_a_user_token_without_a_project_is_refused_for_every_paid_call(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str]
) -> None:
    fake, model = upstream
    _, headers = await new_user(env.http, "loner")  # type: ignore[arg-type]  # no project at all
    client = user_sdk(env, headers, None)
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(model=model, messages=MESSAGES)
    assert caught.value.body["code"] == "project_required"  # type: ignore[index]
    assert "X-Arona-Project" in caught.value.body["message"]  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        await client.embeddings.create(model="embed-" + model, input="x")
    with pytest.raises(openai.BadRequestError):
        await client.models.list()
    response = await env.http.post(
        "/v1/video/generations", json={"model": "v", "prompt": "p"}, headers=headers
    )
    assert_error(response, 400, "project_required")
    assert fake.stats.chats == fake.stats.embeddings == 0


async def test_a_project_the_user_does_not_belong_to_is_not_found(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str]
) -> None:
    fake, model = upstream
    _, stranger = await new_user(env.http, "stranger")  # type: ignore[arg-type]
    for named in (env.project_id, str(uuid.uuid4()), "no-such-slug", "x" * 500):
        client = user_sdk(env, stranger, named)
        with pytest.raises(openai.NotFoundError) as caught:
            await client.chat.completions.create(model=model, messages=MESSAGES)
        assert caught.value.body["code"] == "project_not_found"  # type: ignore[index]
    assert fake.stats.chats == 0


async def test_a_members_token_is_charged_to_the_named_project(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str]
) -> None:
    _, model = upstream
    project = await env.http.get(f"/api/projects/{env.project_id}", headers=env.user_headers)
    slug = project.json()["slug"]
    user_id = (await env.http.get("/api/auth/me", headers=env.user_headers)).json()["id"]
    for named in (env.project_id, slug):
        client = user_sdk(env, env.user_headers, named)
        reply = await client.chat.completions.create(model=model, messages=MESSAGES)
        assert reply.choices[0].message.content
    embedded = await user_sdk(env, env.user_headers, slug).embeddings.create(
        model="embed-" + model, input="x"
    )
    assert embedded.data
    rows: list[UsageRecord] = await env.usage_rows()
    mine = [r for r in rows if r.model_requested in (model, "embed-" + model)]
    assert len(mine) == 3
    for row in mine:
        assert str(row.project_id) == env.project_id
        assert str(row.user_id) == user_id
        assert row.api_key_id is None


async def test_the_projects_quota_applies_to_its_members_tokens(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str]
) -> None:
    _, model = upstream
    response = await env.http.put(
        f"/api/admin/projects/{env.project_id}/quota",
        json={"perMinute": 1, "perDay": None, "perMonth": None},
        headers=ADMIN,
    )
    assert response.status_code == 200, response.text
    try:
        client = user_sdk(env, env.user_headers, env.project_id)
        await client.chat.completions.create(model=model, messages=MESSAGES)
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model=model, messages=MESSAGES)
        # One quota for the project: its API key is refused too now.
        with pytest.raises(openai.RateLimitError):
            await env.sdk().chat.completions.create(model=model, messages=MESSAGES)
    finally:
        await env.http.put(
            f"/api/admin/projects/{env.project_id}/quota",
            json={"perMinute": None, "perDay": None, "perMonth": None},
            headers=ADMIN,
        )


async def test_a_projects_custom_llm_is_reachable_with_a_members_token(env: GatewayEnv) -> None:
    fake, url = await env.fake("own", models=["their-model"])
    name = unique("own")
    response = await env.http.post(
        f"/api/projects/{env.project_id}/custom-llms",
        json=custom_llm_body(name, url, "their-model", apiKey="sk-own-" + "k" * 20),
        headers=env.user_headers,
    )
    assert response.status_code == 201, response.text
    client = user_sdk(env, env.user_headers, env.project_id)
    reply = await client.chat.completions.create(model=f"custom:{name}", messages=MESSAGES)
    assert reply.choices[0].message.content == f"Hello from {fake.name}"
    # Another project of the same user does not have it.
    other = await new_project(env.http, env.user_headers)  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        await user_sdk(env, env.user_headers, other["id"]).chat.completions.create(
            model=f"custom:{name}", messages=MESSAGES
        )


async def test_an_api_key_always_charges_its_own_project(
    env: GatewayEnv, upstream: tuple[FakeOpenAI, str]
) -> None:
    _, model = upstream
    other = await new_project(env.http, env.user_headers)  # type: ignore[arg-type]
    client = openai.AsyncOpenAI(
        base_url=f"{env.url}/v1",
        api_key=env.api_key,
        max_retries=0,
        default_headers={"X-Arona-Project": other["id"]},
    )
    await client.chat.completions.create(model=model, messages=MESSAGES)
    rows = await env.usage_rows()
    assert str(rows[-1].project_id) == env.project_id
