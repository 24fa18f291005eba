"""Per-key governance seen from the calls: expiry, allowed models and a key's own
rate, through the official SDK on ``/v1`` and the runtime API, and the Projects API
that edits them (validation, tenancy)."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from app.db.models.usage import UsageRecord
from tests.support.api import eventually
from tests.support.gateway import GatewayEnv, unique
from tests.support.helpers import bearer, new_project, new_user
from tests.support.runtime import RuntimeEnv, runtime_env

HELLO = [{"role": "user", "content": "hi"}]


def _iso(moment: datetime.datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _in(seconds: float) -> str:
    return _iso(datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds))


async def new_key(env: GatewayEnv, **fields: Any) -> dict[str, Any]:
    response = await env.http.post(
        f"/api/projects/{env.project_id}/api-keys",
        json={"name": unique("k"), **fields},
        headers=env.user_headers,
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def patch_key(env: GatewayEnv, key_id: str, **fields: Any) -> Any:
    return await env.http.patch(
        f"/api/projects/{env.project_id}/api-keys/{key_id}", json=fields, headers=env.user_headers
    )


def _error(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = response.json()
    assert set(body["error"]) >= {"message", "type", "code", "param"}, body
    error: dict[str, Any] = body["error"]
    return error


async def _rows(env: GatewayEnv, key_id: str) -> list[UsageRecord]:
    return [r for r in await env.usage_rows() if str(r.api_key_id) == key_id]


@pytest.fixture
async def rt(env: GatewayEnv) -> AsyncIterator[RuntimeEnv]:
    runtime = await runtime_env(env)
    yield runtime
    await runtime.cleanup()


# ------------------------------------------------------------------------ expiry


async def test_an_expired_key_is_refused_and_a_patch_extends_it(env: GatewayEnv) -> None:
    _, url = await env.fake("exp", models=["exp-model"])
    await env.register(unique("exp"), url)
    key = await new_key(env, expiresAt=_in(2))
    assert key["expiresAt"] is not None
    client = env.sdk(key["key"])
    reply = await client.chat.completions.create(model="exp-model", messages=HELLO)  # type: ignore[arg-type]
    assert reply.choices[0].message.content

    async def refused() -> bool:
        response = await env.http.get("/v1/models", headers=bearer(key["key"]))
        return response.status_code == 401

    await eventually(refused, within=15)
    with pytest.raises(openai.AuthenticationError) as info:
        await client.chat.completions.create(model="exp-model", messages=HELLO)  # type: ignore[arg-type]
    error = _error(info.value.response)
    assert error["code"] == "api_key_expired"
    assert error["type"] == "authentication_error"
    # The Projects API refuses it too, like a revoked key.
    listed = await env.http.get(
        f"/api/projects/{env.project_id}/api-keys", headers=bearer(key["key"])
    )
    assert listed.status_code == 401

    extended = await patch_key(env, key["id"], expiresAt=_in(3600))
    assert extended.status_code == 200, extended.text
    assert extended.json()["id"] == key["id"]
    # Same secret, usable again at once: the edit does not rotate the key.
    reply = await client.chat.completions.create(model="exp-model", messages=HELLO)  # type: ignore[arg-type]
    assert reply.choices[0].message.content
    cleared = await patch_key(env, key["id"], expiresAt=None)
    assert cleared.json()["expiresAt"] is None


# --------------------------------------------------------------- allowed models


async def test_allowed_models_refuse_others_before_any_upstream_call(env: GatewayEnv) -> None:
    tag = uuid.uuid4().hex[:6]
    exact, prefixed, other = f"alpha-{tag}", f"beta-{tag}-mini", f"gamma-{tag}"
    fake, url = await env.fake("allowed", models=[exact, prefixed, other])
    await env.register(unique("allowed"), url)
    key = await new_key(env, allowedModels=[exact, f"beta-{tag}*"])
    assert key["allowedModels"] == [exact, f"beta-{tag}*"]
    client = env.sdk(key["key"])

    for model in (exact, prefixed):  # an exact id, and a prefix match
        reply = await client.chat.completions.create(model=model, messages=HELLO)  # type: ignore[arg-type]
        assert reply.model == model
    chats = fake.stats.chats
    with pytest.raises(openai.PermissionDeniedError) as info:
        await client.chat.completions.create(model=other, messages=HELLO)  # type: ignore[arg-type]
    error = _error(info.value.response)
    assert error["code"] == "model_not_allowed"
    assert error["param"] == "model"
    assert other in error["message"]
    assert fake.stats.chats == chats  # refused before routing
    with pytest.raises(openai.PermissionDeniedError):
        await client.chat.completions.create(model=f"alpha-{tag}-x", messages=HELLO)  # type: ignore[arg-type]

    listed = {m.id async for m in client.models.list()}
    assert {exact, prefixed} <= listed
    assert other not in listed
    assert all(m == exact or m.startswith(f"beta-{tag}") for m in listed)
    # The project's other key still sees and calls everything.
    everything = {m.id async for m in env.sdk().models.list()}
    assert other in everything
    refused = [r for r in await _rows(env, key["id"]) if r.status == 403]
    assert [r.error_code for r in refused] == ["model_not_allowed", "model_not_allowed"]

    # Clearing the list (null) lifts the restriction at once.
    assert (await patch_key(env, key["id"], allowedModels=None)).status_code == 200
    reply = await client.chat.completions.create(model=other, messages=HELLO)  # type: ignore[arg-type]
    assert reply.model == other


async def test_a_runtime_token_lists_and_calls_only_its_allowed_models(
    env: GatewayEnv, rt: RuntimeEnv
) -> None:
    model = unique("rtm")
    await rt.pool(model, [[]])
    allowed = await rt.profile(model)
    blocked = await rt.profile(unique("other-base"))
    response = await env.http.post(
        f"/api/projects/{env.project_id}/runtime-tokens",
        json={"name": "limited", "allowedModels": [allowed]},
        headers=env.user_headers,
    )
    assert response.status_code == 201, response.text
    headers = bearer(response.json()["token"])
    catalog = await env.http.get("/api/runtime/llms", headers=headers)
    assert catalog.status_code == 200, catalog.text
    ids = [llm["id"] for llm in catalog.json()["llms"]]
    assert ids == [allowed]
    full = await env.http.get("/api/runtime/llms", headers=rt.headers)
    assert blocked in [llm["id"] for llm in full.json()["llms"]]

    conversation = await rt.conversation()
    refused = await rt.chat(conversation, headers=headers, modelProfileId=blocked)
    assert refused.status == 403
    assert refused.body["error"]["code"] == "model_not_allowed"
    served = await rt.chat(conversation, headers=headers, modelProfileId=allowed)
    assert served.status == 200
    assert served.done


# --------------------------------------------------------------------------- rpm


async def test_a_runtime_token_rpm_refuses_the_runtime_chat(
    env: GatewayEnv, rt: RuntimeEnv
) -> None:
    model = unique("rtrpm")
    await rt.pool(model, [[]])
    profile = await rt.profile(model)
    response = await env.http.post(
        f"/api/projects/{env.project_id}/runtime-tokens",
        json={"name": "slow", "rpm": 1},
        headers=env.user_headers,
    )
    assert response.status_code == 201, response.text
    headers = bearer(response.json()["token"])
    conversation = await rt.conversation()
    first = await rt.chat(conversation, headers=headers, modelProfileId=profile)
    assert first.status == 200
    second = await rt.chat(conversation, headers=headers, modelProfileId=profile)
    assert second.status == 429
    assert second.body["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(second.headers["retry-after"]) <= 60
    # The project's other runtime token is not held back.
    other = await rt.chat(conversation, modelProfileId=profile)
    assert other.status == 200


async def test_a_runtime_tokens_chats_are_charged_to_it(env: GatewayEnv, rt: RuntimeEnv) -> None:
    model = unique("rtspend")
    await rt.pool(model, [[]])
    profile = await rt.profile(model)
    url = f"/api/projects/{env.project_id}/runtime-tokens"
    response = await env.http.post(
        url, json={"name": "metered", "rpm": 1}, headers=env.user_headers
    )
    assert response.status_code == 201, response.text
    token = response.json()
    headers = bearer(token["token"])
    conversation = await rt.conversation()
    assert (await rt.chat(conversation, headers=headers, modelProfileId=profile)).status == 200
    assert (await rt.chat(conversation, headers=headers, modelProfileId=profile)).status == 429
    assert (await rt.chat(conversation, modelProfileId=profile)).status == 200  # another token

    # Served and refused calls alike carry the token's id (``api_key_id``: a credential
    # id, no foreign key), so its spend can be shown beside its limits.
    rows = await _rows(env, token["id"])
    assert sorted(r.status for r in rows) == [200, 429]
    assert {r.endpoint for r in rows} == {"runtime_chat"}
    read = await env.http.get(f"{url}/{token['id']}", headers=env.user_headers)
    spend = read.json()["spend"]
    assert (spend["requests"], spend["tokens"]) == (2, sum(r.total_tokens for r in rows))
    assert spend["tokens"] > 0


async def test_a_key_rpm_refuses_with_429_and_is_metered(env: GatewayEnv) -> None:
    _, url = await env.fake("rpm", models=["rpm-model"])
    await env.register(unique("rpm"), url)
    key = await new_key(env, rpm=2)
    assert key["rpm"] == 2
    client = env.sdk(key["key"])
    for _ in range(2):
        await client.chat.completions.create(model="rpm-model", messages=HELLO)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="rpm-model", messages=HELLO)  # type: ignore[arg-type]
    error = _error(info.value.response)
    assert error["code"] == "rate_limit_exceeded"
    assert "2 requests per minute" in error["message"]
    assert 1 <= int(info.value.response.headers["retry-after"]) <= 60
    # The limit is the key's: the project's other key is not held back.
    await env.sdk().chat.completions.create(model="rpm-model", messages=HELLO)  # type: ignore[arg-type]
    rows = await _rows(env, key["id"])
    assert sorted(r.status for r in rows) == [200, 200, 429]
    assert [r.error_code for r in rows if r.status == 429] == ["rate_limit_exceeded"]

    # Raising the limit applies to the running minute at once, no new key needed.
    assert (await patch_key(env, key["id"], rpm=5)).status_code == 200
    await client.chat.completions.create(model="rpm-model", messages=HELLO)  # type: ignore[arg-type]


# ------------------------------------------------------------ the Projects API


async def test_governance_fields_are_shown_edited_and_cleared(env: GatewayEnv) -> None:
    key = await new_key(
        env,
        rpm=10,
        tpm=5000,
        budget="12.5",
        budgetPeriod="day",
        labels={"team": "search", "env": "prod"},
    )
    assert (key["rpm"], key["tpm"], key["budget"], key["budgetPeriod"]) == (10, 5000, "12.5", "day")
    url = f"/api/projects/{env.project_id}/api-keys/{key['id']}"
    patched = await patch_key(env, key["id"], rpm=None, budget=3, labels={"team": "ads"})
    assert patched.status_code == 200, patched.text
    body = patched.json()
    assert body["rpm"] is None  # null clears
    assert body["tpm"] == 5000  # unsent stays
    assert (body["budget"], body["budgetPeriod"]) == ("3", "day")
    assert body["labels"] == {"team": "ads"}
    assert "key" not in body
    got = await env.http.get(url, headers=env.user_headers)
    assert got.json() == body
    listed = await env.http.get(
        f"/api/projects/{env.project_id}/api-keys", headers=env.user_headers
    )
    assert body in listed.json()["items"]
    # The key still authenticates: a PATCH never rotates it.
    assert (await env.http.get("/v1/models", headers=bearer(key["key"]))).status_code == 200


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"expiresAt": "2020-01-01T00:00:00Z"}, "expiresAt", "expires_in_past"),
        ({"rpm": -1}, "rpm", "invalid_limit"),
        ({"tpm": -5}, "tpm", "invalid_limit"),
        ({"budget": "-3"}, "budget", "invalid_limit"),
        ({"budget": "1.1234567"}, "budget", "invalid_limit"),
        ({"budget": 5, "budgetPeriod": "week"}, "budgetPeriod", "invalid_budget_period"),
        ({"allowedModels": ["gpt-*-mini"]}, "allowedModels", "invalid_model_pattern"),
        ({"allowedModels": ["*"]}, "allowedModels", "invalid_model_pattern"),
        ({"labels": {"bad key!": "x"}}, "labels", "invalid_labels"),
        ({"labels": {f"k{i}": "v" for i in range(21)}}, "labels", "invalid_labels"),
    ],
)
async def test_invalid_governance_is_a_400_naming_the_field(
    env: GatewayEnv, fields: dict[str, Any], param: str, code: str
) -> None:
    created = await env.http.post(
        f"/api/projects/{env.project_id}/api-keys", json=fields, headers=env.user_headers
    )
    assert created.status_code == 400, created.text
    assert (_error(created)["param"], _error(created)["code"]) == (param, code)
    key = await new_key(env)
    patched = await patch_key(env, key["id"], **fields)
    assert patched.status_code == 400, patched.text
    assert (_error(patched)["param"], _error(patched)["code"]) == (param, code)


async def test_another_tenants_key_cannot_be_read_or_edited(env: GatewayEnv) -> None:
    key = await new_key(env, rpm=3)
    _, stranger = await new_user(env.http, "stranger")  # type: ignore[arg-type]
    theirs = await new_project(env.http, stranger)  # type: ignore[arg-type]
    mine = f"/api/projects/{env.project_id}/api-keys/{key['id']}"
    across = f"/api/projects/{theirs['id']}/api-keys/{key['id']}"
    for url in (mine, across):
        patched = await env.http.patch(url, json={"rpm": 1000}, headers=stranger)
        assert patched.status_code == 404, patched.text
        assert _error(patched)["type"] == "not_found_error"
        assert (await env.http.get(url, headers=stranger)).status_code == 404
    assert (await env.http.get(mine, headers=env.user_headers)).json()["rpm"] == 3
    revoked = await env.http.delete(mine, headers=env.user_headers)
    assert revoked.status_code == 204
    edited = await env.http.patch(mine, json={"rpm": 1}, headers=env.user_headers)
    assert edited.status_code == 409
    assert _error(edited)["code"] == "revoked"


async def test_a_runtime_token_expiry_can_only_move_earlier(env: GatewayEnv) -> None:
    url = f"/api/projects/{env.project_id}/runtime-tokens"
    created = await env.http.post(
        url, json={"expiresAt": _in(7200), "labels": {"app": "bot"}}, headers=env.user_headers
    )
    assert created.status_code == 201, created.text
    token = created.json()
    headers = bearer(token["token"])
    assert (await env.http.get("/api/runtime/me", headers=headers)).status_code == 200
    later = await env.http.patch(
        f"{url}/{token['id']}", json={"expiresAt": _in(99_999)}, headers=env.user_headers
    )
    assert later.status_code == 400
    assert (_error(later)["code"], _error(later)["param"]) == ("expiry_not_extendable", "expiresAt")
    earlier = await env.http.patch(
        f"{url}/{token['id']}", json={"expiresAt": _in(2)}, headers=env.user_headers
    )
    assert earlier.status_code == 200, earlier.text
    assert earlier.json()["labels"] == {"app": "bot"}
    got = await env.http.get(f"{url}/{token['id']}", headers=env.user_headers)
    assert got.json() == earlier.json()
    invalid = await env.http.post(url, json={"rpm": -1}, headers=env.user_headers)
    assert (invalid.status_code, _error(invalid)["param"]) == (400, "rpm")
    _, stranger = await new_user(env.http, "stranger")  # type: ignore[arg-type]
    foreign = await env.http.patch(f"{url}/{token['id']}", json={"rpm": 1}, headers=stranger)
    assert foreign.status_code == 404

    async def expired() -> bool:
        response = await env.http.get("/api/runtime/me", headers=headers)
        return response.status_code == 401 and _error(response)["code"] == "token_expired"

    await eventually(expired, within=15)


async def test_a_key_with_limits_may_not_issue_or_edit_credentials(env: GatewayEnv) -> None:
    limited = await new_key(env, rpm=100)
    plain = await new_key(env)
    keys = f"/api/projects/{env.project_id}/api-keys"
    own = bearer(limited["key"])
    minted = await env.http.post(keys, json={"name": "twin"}, headers=own)
    assert minted.status_code == 403, minted.text
    assert _error(minted)["code"] == "key_restricted"
    lifted = await env.http.patch(f"{keys}/{limited['id']}", json={"rpm": None}, headers=own)
    assert lifted.status_code == 403
    assert _error(lifted)["code"] == "key_restricted"
    token = await env.http.post(
        f"/api/projects/{env.project_id}/runtime-tokens", json={}, headers=own
    )
    assert token.status_code == 403
    # An unrestricted key keeps managing the project's credentials (automation).
    shaped = await env.http.patch(
        f"{keys}/{limited['id']}", json={"rpm": 50}, headers=bearer(plain["key"])
    )
    assert shaped.status_code == 200, shaped.text
    assert shaped.json()["rpm"] == 50
