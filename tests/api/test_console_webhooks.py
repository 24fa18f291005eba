"""The Webhooks tab over HTTP: an owner adds a webhook (its secret shown once), sends a
test event to a real HTTPS receiver and sees it in the delivery log, retries a failed
one, and gets a refused URL back beside its field; a member sees neither URLs nor
forms."""

from __future__ import annotations

import re
from typing import Any

from litestar import Litestar
from litestar.testing import AsyncTestClient

from tests.support.helpers import console_login, new_project, new_user
from tests.support.webhooks import WebhookReceiver

Client = AsyncTestClient[Litestar]
CSRF = re.compile(r'"X-CSRF-Token": "([^"]+)"')
SECRET = re.compile(r'id="new-secret-value">(whsec_[A-Za-z0-9_-]+)<')


async def _console(client: Any, email: str) -> dict[str, str]:
    """Sign ``client`` into the console; the headers of an HTMX post."""
    assert (await console_login(client, email)).status_code == 303
    page = await client.get("/projects")
    found = CSRF.search(page.text)
    assert found, page.text
    return {"HX-Request": "true", "X-CSRF-Token": found.group(1)}


def _toast(response: Any) -> str:
    return str(response.headers.get("HX-Trigger", ""))


async def test_an_owner_adds_a_webhook_tests_it_and_retries_a_failed_delivery(
    webhook_client: Client, webhook_receiver: WebhookReceiver
) -> None:
    client, receiver = webhook_client, webhook_receiver
    email, headers = await new_user(client, "console-hooks")
    pid = (await new_project(client, headers))["id"]
    htmx = await _console(client, email)
    base = f"/projects/{pid}"

    empty = await client.get(f"{base}/tabs/webhooks", headers={"HX-Request": "true"})
    assert empty.status_code == 200, empty.text
    assert "No webhook yet." in empty.text
    assert "Nothing sent yet." in empty.text
    whole = await client.get(f"{base}/tabs/webhooks")  # a full page load has the tab in it
    assert whole.status_code == 200
    assert 'id="webhooks-heading"' in whole.text

    refused = await client.post(f"{base}/webhooks", data={"url": "ftp://nope"}, headers=htmx)
    assert refused.status_code == 422, refused.text
    assert 'id="webhook-url-error"' in refused.text
    assert 'value="ftp://nope"' in refused.text  # what was typed is kept

    added = await client.post(
        f"{base}/webhooks", data={"url": receiver.url(), "description": "pager"}, headers=htmx
    )
    assert added.status_code == 200, added.text
    secret = SECRET.search(added.text)
    assert secret, added.text
    assert "shown only once" in _toast(added)
    listed = await client.get(f"{base}/tabs/webhooks", headers={"HX-Request": "true"})
    assert secret.group(1) not in listed.text  # never again
    assert "••••" + secret.group(1)[-4:] in listed.text
    hook_id = re.search(rf"{base}/webhooks/([0-9a-f-]+)/test", listed.text)
    assert hook_id, listed.text

    sent = await client.post(f"{base}/webhooks/{hook_id.group(1)}/test", headers=htmx)
    assert sent.status_code == 200, sent.text
    assert "Test event delivered (200)" in _toast(sent)
    assert len(receiver.received) == 1
    assert '<span class="badge ok">delivered</span>' in sent.text

    receiver.default = 500
    failed = await client.post(f"{base}/webhooks/{hook_id.group(1)}/test", headers=htmx)
    assert "Test event failed: answered 500" in _toast(failed)
    assert '<span class="badge bad">failed</span>' in failed.text
    retry = re.search(rf"{base}/webhook-deliveries/([0-9a-f-]+)/retry", failed.text)
    assert retry, failed.text

    receiver.default = 200
    retried = await client.post(retry.group(0), headers=htmx)
    assert retried.status_code == 200, retried.text
    assert "Delivered on retry (200)" in _toast(retried)
    assert "/retry" not in retried.text  # nothing failed is left
    again = await client.post(retry.group(0), headers=htmx)
    assert again.status_code == 422
    assert "only a failed delivery can be retried" in _toast(again)

    disabled = await client.post(
        f"{base}/webhooks/{hook_id.group(1)}/edit",
        data={"url": receiver.url(), "description": "pager"},  # the box unticked
        headers=htmx,
    )
    assert disabled.status_code == 200, disabled.text
    assert '<span class="badge warn">disabled</span>' in disabled.text

    rotated = await client.post(f"{base}/webhooks/{hook_id.group(1)}/rotate", headers=htmx)
    new_secret = SECRET.search(rotated.text)
    assert new_secret
    assert new_secret.group(1) != secret.group(1)
    assert "the previous one also signs until" in rotated.text

    deleted = await client.post(f"{base}/webhooks/{hook_id.group(1)}/delete", headers=htmx)
    assert "No webhook yet." in deleted.text
    assert "Nothing sent yet." in deleted.text


async def test_a_member_sees_no_webhook_and_cannot_add_one(
    webhook_client: Client, webhook_receiver: WebhookReceiver
) -> None:
    client = webhook_client
    _, owner = await new_user(client, "hooks-owner")
    pid = (await new_project(client, owner))["id"]
    created = await client.post(
        f"/api/projects/{pid}/webhooks", json={"url": webhook_receiver.url()}, headers=owner
    )
    assert created.status_code == 201
    member_email, _ = await new_user(client, "hooks-member")
    added = await client.post(
        f"/api/projects/{pid}/members", json={"email": member_email}, headers=owner
    )
    assert added.status_code == 201, added.text
    htmx = await _console(client, member_email)
    tab = await client.get(f"/projects/{pid}/tabs/webhooks", headers={"HX-Request": "true"})
    assert tab.status_code == 200
    assert "only the project's owners and platform admins can see and change webhooks" in tab.text
    assert webhook_receiver.url() not in tab.text
    denied = await client.post(
        f"/projects/{pid}/webhooks", data={"url": webhook_receiver.url()}, headers=htmx
    )
    assert denied.status_code == 403
