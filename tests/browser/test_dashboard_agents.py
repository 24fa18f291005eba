"""The agents page in a real browser, with the real reference agent.

An agent identity is created on the page (its token shown once), ``python -m
app.agent`` runs against the live site with that token, the page sees it come
online over SSE, a model is deployed through the page's form (the agent starts a
fake OpenAI server), its progress reaches running, and it is stopped and the agent
deleted from the page. Errors (nothing online) reach the page as toasts.

``site`` comes before ``page`` in every signature: the browser closes first.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from playwright.async_api import Dialog, Page, expect

from tests.support.agents import run_agent
from tests.support.browser import Site, log_in_as_admin


def _accept_dialogs(page: Page) -> None:
    async def accept(dialog: Dialog) -> None:
        await dialog.accept()

    page.on("dialog", accept)


async def test_create_an_agent_deploy_and_stop_a_model_from_the_page(
    site: Site, page: Page, tmp_path: Path
) -> None:
    name = f"gpu-{uuid.uuid4().hex[:8]}"
    model = f"org/browser-{uuid.uuid4().hex[:6]}"
    toasts = page.locator("#toasts")
    await log_in_as_admin(page, site)
    await page.goto(f"{site.url}/admin")
    sections = page.get_by_role("navigation", name="Dashboard sections")
    await sections.get_by_role("link", name="Agents").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("GPU agents")

    # Nothing online yet: a deploy is refused with a toast.
    await page.get_by_label("Model", exact=True).fill(model)
    await page.get_by_role("button", name="Deploy", exact=True).click()
    await expect(toasts).to_contain_text("no agent is online")

    await page.get_by_label("Agent name").fill(name)
    await page.get_by_role("button", name="Create agent").click()
    await expect(toasts).to_contain_text(f"Agent {name} created")
    token = (await page.locator("#agent-token-value").inner_text()).strip()
    assert token.startswith("agt-")
    row = page.locator(f"#agent-{name}")
    await expect(row.locator(".agent-state")).to_have_text("offline")
    # A marker that a reload would wipe: what follows arrives over SSE.
    await page.evaluate("window.aronaTestMarker = 'same page'")

    with run_agent(site.url, token, tmp_path / "agent.log") as agent:
        await expect(row.locator(".agent-state")).to_have_text("online", timeout=15_000)
        await expect(row).to_contain_text("no telemetry")
        choice = page.get_by_label("Agent", exact=True)
        await expect(choice.locator("option", has_text=name)).to_have_count(1)
        await choice.select_option(label=f"{name} (no telemetry)")
        await page.get_by_label("Model", exact=True).fill(model)
        await page.get_by_role("button", name="Deploy", exact=True).click()
        await expect(toasts).to_contain_text(f"Deploying {model}")

        deployment = page.locator(f'tr.deployment[data-model="{model}"]')
        status = deployment.locator(".deployment-status")
        await expect(status).to_have_text("running", timeout=30_000)
        await expect(deployment.locator(".deployment-progress")).to_contain_text("100 %")
        await expect(deployment).to_contain_text(name)
        await expect(row).to_contain_text(model, timeout=10_000)  # the heartbeat lists it

        await deployment.get_by_role("button", name=f"Stop {model}").click()
        await expect(toasts).to_contain_text(f"Stopping {model}")
        await expect(status).to_have_text("stopped", timeout=15_000)
        assert agent.poll() is None
    # The agent exited: offline at once (its socket closed).
    await expect(row.locator(".agent-state")).to_have_text("offline", timeout=10_000)
    assert await page.evaluate("window.aronaTestMarker") == "same page"

    _accept_dialogs(page)
    await row.get_by_role("button", name=f"Delete {name}").click()
    await expect(toasts).to_contain_text("Agent deleted")
    await expect(row).to_have_count(0)
