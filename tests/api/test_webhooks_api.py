"""The webhooks API over HTTP: CRUD, the signing secret shown once and rotated, test
events and retries through a real HTTPS receiver, the paged delivery log, validation
and access. The apps run on a PostgreSQL database of this module's own (their
dispatchers must not take other tests' rows, nor leave theirs to other tests' apps).
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from app.domain.quotas.alerts import BudgetAlert
from app.lib.clock import utcnow
from tests.support.api import create_api_key, eventually, resources_of
from tests.support.helpers import assert_error, new_project, new_user
from tests.support.webhooks import WebhookReceiver, verify_signature

Client = AsyncTestClient[Litestar]


@pytest.fixture
def client(webhook_client: Client) -> Client:
    """Loopback receivers allowed (the test's), its certificate authority trusted."""
    return webhook_client


@pytest.fixture
def strict(webhook_strict: Client) -> Client:
    """The production default: public HTTPS receivers only."""
    return webhook_strict


@pytest.fixture
def receiver(webhook_receiver: WebhookReceiver) -> WebhookReceiver:
    return webhook_receiver


async def owner_project(client: Client) -> tuple[str, dict[str, str], str]:
    email, headers = await new_user(client, "hooks")
    project = await new_project(client, headers)
    return email, headers, project["id"]


async def create_hook(
    client: Client, pid: str, headers: dict[str, str], url: str, **fields: Any
) -> dict[str, Any]:
    response = await client.post(
        f"/api/projects/{pid}/webhooks", json={"url": url, **fields}, headers=headers
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


# ------------------------------------------------------------------ CRUD


async def test_a_webhook_is_created_listed_changed_and_deleted(
    client: Client, receiver: WebhookReceiver
) -> None:
    _, headers, pid = await owner_project(client)
    base = f"/api/projects/{pid}/webhooks"
    created = await create_hook(client, pid, headers, receiver.url(), description="alerts")
    secret = created["secret"]
    assert secret.startswith("whsec_")
    assert created["secretHint"] == "••••" + secret[-4:]
    assert created["events"] == ["budget.threshold"]
    assert created["enabled"] is True
    assert created["previousSecretExpiresAt"] is None

    listed = (await client.get(base, headers=headers)).json()
    assert listed["total"] == 1
    [item] = listed["items"]
    assert "secret" not in item  # shown once
    assert (item["id"], item["url"]) == (created["id"], receiver.url())
    one = await client.get(f"{base}/{created['id']}", headers=headers)
    assert one.json() == item

    changed = await client.patch(
        f"{base}/{created['id']}",
        json={"enabled": False, "description": "paused", "url": receiver.url(path="/v2?token=t")},
        headers=headers,
    )
    assert changed.status_code == 200, changed.text
    assert (changed.json()["enabled"], changed.json()["description"]) == (False, "paused")
    assert changed.json()["url"].endswith("/v2?token=t")  # a receiver's own token is kept

    deleted = await client.delete(f"{base}/{created['id']}", headers=headers)
    assert deleted.status_code == 204
    assert_error(
        await client.get(f"{base}/{created['id']}", headers=headers), 404, "webhook_not_found"
    )
    assert_error(await client.delete(f"{base}/{created['id']}", headers=headers), 404)


async def test_urls_are_checked_when_written(client: Client, strict: Client) -> None:
    for app, refused in (
        (
            strict,
            {
                "http://hooks.example.com/in": "url_not_https",
                "https://127.0.0.1/hook": "url_not_allowed",
                "https://10.1.2.3/hook": "url_not_allowed",
                "https://[::1]:8443/hook": "url_not_allowed",
            },
        ),
        (
            client,
            {
                "not a url": "invalid_url",
                "hooks.example.com/in": "invalid_url",
                "ftp://hooks.example.com/in": "invalid_url",
                "https://user:pw@hooks.example.com/in": "invalid_url",
                "https://hooks.example.com/in#frag": "invalid_url",
                "https://169.254.169.254/latest": "url_not_allowed",  # metadata: never
                "https://metadata.google.internal/x": "url_not_allowed",
            },
        ),
    ):
        _, headers, pid = await owner_project(app)
        for url, code in refused.items():
            response = await app.post(
                f"/api/projects/{pid}/webhooks", json={"url": url}, headers=headers
            )
            error = assert_error(response, 400, code)
            assert error["param"] == "url", url
        listed = await app.get(f"/api/projects/{pid}/webhooks", headers=headers)
        assert listed.json()["total"] == 0

    _, headers, pid = await owner_project(client)
    base = f"/api/projects/{pid}/webhooks"
    for body in (
        {},
        {"url": "https://hooks.example.com", "events": []},
        {"url": "https://hooks.example.com", "events": ["budget.exceeded"]},
        {"url": "https://hooks.example.com", "secret": "mine"},  # never chosen by the caller
        {"url": "https://hooks.example.com/" + "x" * 2100},
    ):
        assert_error(await client.post(base, json=body, headers=headers), 400)
    hook = await create_hook(client, pid, headers, "https://127.0.0.1:9/hook")
    patched = await client.patch(f"{base}/{hook['id']}", json={"url": "ftp://x"}, headers=headers)
    assert assert_error(patched, 400, "invalid_url")["param"] == "url"


async def test_only_owners_reach_a_projects_webhooks(client: Client) -> None:
    _, owner, pid = await owner_project(client)
    hook = await create_hook(client, pid, owner, "https://127.0.0.1:9/hook")
    base = f"/api/projects/{pid}/webhooks"

    assert_error(await client.get(f"/api/projects/{uuid.uuid4()}/webhooks", headers=owner), 404)
    _, stranger = await new_user(client, "stranger")
    assert_error(await client.get(base, headers=stranger), 404, "project_not_found")
    assert_error(await client.get(f"{base}/{hook['id']}", headers=stranger), 404)

    member_email, member = await new_user(client, "member")
    added = await client.post(
        f"/api/projects/{pid}/members", json={"email": member_email}, headers=owner
    )
    assert added.status_code == 201, added.text
    key = {"Authorization": f"Bearer {(await create_api_key(client, pid, owner))['key']}"}
    for caller in (member, key):
        assert_error(await client.get(base, headers=caller), 403, "insufficient_role")
        response = await client.post(base, json={"url": "https://127.0.0.1:9/x"}, headers=caller)
        assert_error(response, 403, "insufficient_role")
        assert_error(await client.delete(f"{base}/{hook['id']}", headers=caller), 403)

    # Another project's webhook is not found through this one.
    _, other_headers, other = await owner_project(client)
    response = await client.get(
        f"/api/projects/{other}/webhooks/{hook['id']}", headers=other_headers
    )
    assert_error(response, 404, "webhook_not_found")
    assert_error(await client.get(base, headers={}), 401)


# ------------------------------------------------------------------ deliveries


async def test_a_test_event_is_signed_and_a_rotation_signs_with_both_secrets(
    client: Client, receiver: WebhookReceiver
) -> None:
    _, headers, pid = await owner_project(client)
    hook = await create_hook(client, pid, headers, receiver.url())
    base = f"/api/projects/{pid}/webhooks/{hook['id']}"

    sent = await client.post(f"{base}/test", headers=headers)
    assert sent.status_code == 201, sent.text
    delivery = sent.json()
    assert delivery["lastError"] is None, delivery
    assert (delivery["status"], delivery["attempts"], delivery["lastStatusCode"]) == (
        "delivered",
        1,
        200,
    )
    assert delivery["event"] == "webhook.test"
    assert [a["statusCode"] for a in delivery["attemptLog"]] == [200]
    [got] = receiver.received
    assert got.json() == delivery["payload"]
    assert got.json()["type"] == "webhook.test"
    assert got.json()["data"]["webhookId"] == hook["id"]
    assert verify_signature(hook["secret"], got.headers["x-arona-signature"], got.body)

    rotated = await client.post(f"{base}/rotate-secret", headers=headers)
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()
    assert new["secret"] != hook["secret"]
    assert new["secretHint"] == "••••" + new["secret"][-4:]
    assert new["previousSecretExpiresAt"] is not None
    await client.post(f"{base}/test", headers=headers)
    second = receiver.received[-1]
    header = second.headers["x-arona-signature"]
    assert header.count("v1=") == 2  # the old secret still signs during the grace period
    assert verify_signature(new["secret"], header, second.body)
    assert verify_signature(hook["secret"], header, second.body)

    at_once = await client.post(f"{base}/rotate-secret?graceSeconds=0", headers=headers)
    newest = at_once.json()
    assert newest["previousSecretExpiresAt"] is None
    await client.post(f"{base}/test", headers=headers)
    third = receiver.received[-1]
    assert third.headers["x-arona-signature"].count("v1=") == 1
    assert verify_signature(newest["secret"], third.headers["x-arona-signature"], third.body)
    assert not verify_signature(new["secret"], third.headers["x-arona-signature"], third.body)
    assert_error(await client.post(f"{base}/rotate-secret?graceSeconds=-1", headers=headers), 400)


async def test_the_delivery_log_pages_newest_first_and_a_failed_one_is_retried(
    client: Client, receiver: WebhookReceiver
) -> None:
    _, headers, pid = await owner_project(client)
    hook = await create_hook(client, pid, headers, receiver.url())
    base = f"/api/projects/{pid}/webhooks/{hook['id']}"
    receiver.default = 500
    ids = []
    for _ in range(5):
        sent = await client.post(f"{base}/test", headers=headers)
        # A test event is one attempt: failed at once, with what the receiver said.
        assert (sent.json()["status"], sent.json()["lastError"]) == ("failed", "answered 500")
        assert sent.json()["lastResponse"] == "receiver says 500"
        ids.append(sent.json()["id"])

    first = (await client.get(f"{base}/deliveries?limit=2", headers=headers)).json()
    assert (first["total"], first["limit"], first["offset"]) == (5, 2, 0)
    assert [d["id"] for d in first["items"]] == ids[::-1][:2]
    last = (await client.get(f"{base}/deliveries?limit=2&offset=4", headers=headers)).json()
    assert [d["id"] for d in last["items"]] == [ids[0]]
    assert_error(await client.get(f"{base}/deliveries?limit=0", headers=headers), 400)

    receiver.default = 200
    retried = await client.post(f"{base}/deliveries/{ids[0]}/retry", headers=headers)
    assert retried.status_code == 200, retried.text
    assert (retried.json()["status"], retried.json()["attempts"]) == ("delivered", 2)
    assert [a["statusCode"] for a in retried.json()["attemptLog"]] == [500, 200]
    again = await client.post(f"{base}/deliveries/{ids[0]}/retry", headers=headers)
    assert_error(again, 409, "delivery_not_failed")
    one = await client.get(f"{base}/deliveries/{ids[0]}", headers=headers)
    assert one.json()["status"] == "delivered"
    assert_error(await client.get(f"{base}/deliveries/{uuid.uuid4()}", headers=headers), 404)


async def test_a_threshold_alert_reaches_the_projects_webhook_through_the_apps_sink(
    client: Client, receiver: WebhookReceiver
) -> None:
    _, headers, pid = await owner_project(client)
    hook = await create_hook(client, pid, headers, receiver.url())
    resources = resources_of(client)
    assert resources.alert_sinks == [resources.webhook_dispatcher]
    now = utcnow()
    alert = BudgetAlert(
        alert_id=f"{pid}:cost:month:2026-12:100",
        project_id=uuid.UUID(pid),
        credential_id=None,
        metric="cost",
        window="month",
        threshold=100,
        used=5_000_000,
        limit=5_000_000,
        currency="USD",
        resets_at=now + datetime.timedelta(days=20),
        at=now,
    )
    for sink in resources.alert_sinks:
        await sink.alert(alert)
    [got] = await receiver.wait_for(1)
    assert got.json()["data"] == alert.event(resources.instance_id)
    assert verify_signature(hook["secret"], got.headers["x-arona-signature"], got.body)

    async def delivered() -> bool:
        log = await client.get(
            f"/api/projects/{pid}/webhooks/{hook['id']}/deliveries", headers=headers
        )
        return [d["status"] for d in log.json()["items"]] == ["delivered"]

    await eventually(delivered, within=10.0)
    scraped = (await client.get("/metrics")).text
    assert 'arona_webhook_attempts_total{result="delivered"} 1.0' in scraped
    assert "arona_webhook_alerts_queued 0.0" in scraped
