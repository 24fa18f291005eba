"""The project tabs in a real browser: custom LLMs (Bob, a name conflict resolved by a
suggested name), secrets shown masked, an API key shown once, the usage chart, and
the rules every tab follows (no CSP violation, fits a phone, keyboard reachable)."""

from __future__ import annotations

import datetime
import re
import uuid

from playwright.async_api import ConsoleMessage, Page, expect

from app.domain.usage.entry import UsageEntry
from app.domain.usage.writer import UsageWriter
from tests.support.browser import Site, log_in_as_admin

TAB_LABELS = (
    "Overview",
    "Custom LLMs",
    "Secrets",
    "Overrides",
    "Quotas and usage",
    "Keys",
    "Models",
    "Conversations",
    "Webhooks",
)


def watch_console(page: Page) -> list[str]:
    errors: list[str] = []

    def seen(msg: ConsoleMessage) -> None:
        # The browser's own favicon probe is not the page's doing.
        if msg.type == "error" and not msg.location.get("url", "").endswith("/favicon.ico"):
            errors.append(msg.text)

    page.on("console", seen)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors


async def new_project(page: Page, site: Site, name: str = "Tabs project") -> str:
    """Create a project through the console; returns its id."""
    await log_in_as_admin(page, site)
    await page.get_by_label("Name", exact=True).fill(name)
    await page.get_by_role("button", name="Create project").click()
    await expect(page.get_by_role("heading", level=1)).to_contain_text(name)
    match = re.search(r"/projects/([0-9a-f-]{36})", page.url)
    assert match, page.url
    return match.group(1)


async def open_tab(page: Page, label: str) -> None:
    await page.get_by_role("tab", name=label).click()
    await expect(page.get_by_role("tab", name=label)).to_have_attribute("aria-selected", "true")
    await expect(page.locator("#tab-panel")).to_have_attribute(
        "aria-labelledby", re.compile(r"tab-.+")
    )


async def test_a_bob_name_conflict_is_solved_with_one_click(page: Page, site: Site) -> None:
    errors = watch_console(page)
    await new_project(page, site)
    await open_tab(page, "Custom LLMs")
    panel = page.locator("#tab-panel")
    # Bob: the locked values are shown, not editable.
    await expect(panel.get_by_text("https://api.us-east.bob.ibm.com/inference/v1")).to_be_visible()
    await expect(panel.get_by_label("Base URL")).to_have_count(0)
    await expect(panel.get_by_label("Name", exact=True)).to_have_value("bob")

    await panel.get_by_label("Or an API key").fill("sk-browser-bob-0001")
    await panel.get_by_role("button", name="Add custom LLM").click()
    await expect(page.locator(".toast")).to_contain_text("Custom LLM bob added")
    await expect(panel.locator("tbody tr")).to_have_count(1)
    await expect(panel.locator("tbody")).to_contain_text("••••0001")

    # The same name again: refused, with free names to pick.
    await panel.get_by_label("Or an API key").fill("sk-browser-bob-0002")
    await panel.get_by_role("button", name="Add custom LLM").click()
    name_field = panel.get_by_label("Name", exact=True)
    await expect(name_field).to_have_attribute("aria-invalid", "true")
    await expect(name_field).to_have_attribute("aria-describedby", re.compile("llm-name-error"))
    await expect(panel.locator("#llm-name-error")).to_contain_text("already has a custom LLM")
    # The typed key survived the refusal (never sent back, kept by the browser).
    await expect(panel.get_by_label("Or an API key")).to_have_value("sk-browser-bob-0002")
    await panel.get_by_role("button", name="Use bob-2").click()

    await expect(page.locator(".toast").last).to_contain_text("Custom LLM bob-2 added")
    await expect(panel.locator("tbody tr")).to_have_count(2)
    row = panel.locator("tbody tr", has_text="custom:bob-2")
    await expect(row).to_contain_text("••••0002")
    assert "sk-browser-bob-000" not in await page.content()

    # Switch to Custom: every field appears, what was typed stays.
    await panel.get_by_label("Name", exact=True).fill("my-endpoint")
    await panel.get_by_role("radio", name=re.compile("^Custom")).check()
    await expect(panel.get_by_label("Base URL")).to_be_visible()
    await expect(panel.get_by_label("Name", exact=True)).to_have_value("my-endpoint")
    await panel.get_by_role("radio", name=re.compile("^Bob")).check()
    await expect(panel.get_by_label("Base URL")).to_have_count(0)

    # Disable one, from the keyboard.
    await row.get_by_role("button", name="Disable bob-2").focus()
    await page.keyboard.press("Enter")
    await expect(panel.locator("tbody tr", has_text="custom:bob-2")).to_contain_text("disabled")
    assert not [e for e in errors if "Content Security Policy" in e], errors


async def test_a_secret_is_shown_masked_only(page: Page, site: Site) -> None:
    value = f"plain-{uuid.uuid4().hex}"
    await new_project(page, site, "Secret project")
    await open_tab(page, "Secrets")
    panel = page.locator("#tab-panel")
    await panel.get_by_label("Name", exact=True).fill("provider-key")
    await panel.get_by_label("Value", exact=True).fill(value)
    await panel.get_by_role("button", name="Add secret").click()
    await expect(page.locator(".toast")).to_contain_text("Secret provider-key added")
    row = panel.locator("tbody tr", has_text="provider-key")
    await expect(row).to_contain_text("••••" + value[-4:])
    await expect(panel.get_by_label("Value", exact=True)).to_have_value("")
    assert value not in await page.content()

    # A refused form keeps what was typed and says what is wrong next to the field.
    await panel.get_by_label("Name", exact=True).fill("provider-key")
    await panel.get_by_label("Value", exact=True).fill(value)
    await panel.get_by_role("button", name="Add secret").click()
    await expect(panel.locator("#secret-name-error")).to_contain_text("already exists")
    await expect(panel.get_by_label("Name", exact=True)).to_have_value("provider-key")
    await expect(page.locator(".toast-error")).to_be_visible()
    assert value not in await page.content()

    # Reloading the tab's address shows the whole page with the tab in it.
    await page.reload()
    await expect(page.get_by_role("tab", name="Secrets")).to_have_attribute("aria-selected", "true")
    await expect(page.locator("#tab-panel tbody")).to_contain_text("provider-key")
    assert value not in await page.content()


async def test_a_new_api_key_is_shown_once(page: Page, site: Site) -> None:
    await new_project(page, site, "Keys project")
    await open_tab(page, "Keys")
    panel = page.locator("#tab-panel")
    await panel.get_by_label("Name of the new API key").fill("ci")
    await panel.get_by_role("button", name="Create API key").click()
    once = panel.locator(".secret-once")
    await expect(once).to_have_text(re.compile(r"^ak-\S{20,}$"))
    key = (await once.text_content() or "").strip()
    copy = panel.get_by_role("button", name="Copy API key")
    await expect(copy).to_have_attribute("data-copy", "#new-secret-value")
    await expect(copy).to_be_focused()
    listed = panel.locator("tbody tr", has_text="ci")
    await expect(listed).to_contain_text(key[:10])

    # The key works, and is not shown again.
    answer = await site.http.get("/api/projects", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200
    await open_tab(page, "Overview")
    await open_tab(page, "Keys")
    await expect(panel.locator(".secret-once")).to_have_count(0)
    assert key not in await page.content()

    page.on("dialog", lambda dialog: dialog.accept())
    await panel.get_by_role("button", name="Revoke ci").click()
    await expect(panel.locator("tbody tr", has_text="ci")).to_contain_text("revoked")


async def test_the_quota_tab_draws_usage_on_the_server(page: Page, site: Site) -> None:
    project_id = await new_project(page, site, "Usage project")
    writer = UsageWriter(site.resources.db_config.get_engine())
    now = datetime.datetime.now(datetime.UTC)
    for day, model, tokens in ((0, "gpt-4o", 1200), (1, "gpt-4o", 800), (3, "llama-3", 300)):
        writer.record(
            UsageEntry(
                project_id=uuid.UUID(project_id),
                model_requested=model,
                endpoint="chat",
                status=200,
                total_tokens=tokens,
                created_at=now - datetime.timedelta(days=day),
            )
        )
    assert await writer.flush() == 3
    await open_tab(page, "Quotas and usage")
    panel = page.locator("#tab-panel")
    chart = panel.locator("svg.chart#chart-requests")
    await expect(chart).to_be_visible()
    assert await chart.locator("rect.bar").count() == 30
    await expect(chart).to_have_attribute("role", "img")
    tall = await chart.locator("rect.bar").last.get_attribute("height")
    assert tall is not None
    assert float(tall) > 0
    await expect(panel.locator("svg.chart#chart-models rect.bar")).to_have_count(2)
    await expect(panel.get_by_role("table", name="Usage per day")).to_contain_text("1,200")
    await panel.get_by_role("link", name="7 days").click()
    await expect(panel.locator("svg.chart#chart-requests rect.bar")).to_have_count(7)

    await panel.get_by_label("Requests per day (UTC)", exact=True).fill("100")
    await panel.get_by_label("Budget per day (UTC)", exact=True).fill("2.50")
    await panel.get_by_label("Tokens per minute", exact=True).fill("0")
    await panel.get_by_role("button", name="Save limits").click()
    await expect(page.locator(".toast").last).to_contain_text("limits are saved")
    requests = panel.get_by_role("table", name="Requests per window")
    await expect(requests.locator("tbody tr", has_text="Requests per day")).to_contain_text("100")
    spend = panel.get_by_role("table", name="Spend per window")
    await expect(spend.locator("tbody tr", has_text="Budget per day")).to_contain_text("2.5 USD")
    await expect(spend.locator("meter")).to_have_count(1)  # the limited, counted window
    # A limit of 0 is pointed out beside its field, and the field says so to readers.
    per_minute = panel.get_by_label("Tokens per minute", exact=True)
    await expect(per_minute).to_have_accessible_description(re.compile("0 blocks every call"))


async def test_every_tab_fits_a_phone_and_is_reachable_by_keyboard(page: Page, site: Site) -> None:
    errors = watch_console(page)
    await page.set_viewport_size({"width": 390, "height": 844})
    await new_project(page, site, "A project with a rather long name to wrap on phones")
    for label in TAB_LABELS:
        await open_tab(page, label)
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, (label, width)
    # Tabs are links: reachable with Tab, opened with Enter.
    await page.get_by_role("tab", name="Secrets").focus()
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("tab", name="Secrets")).to_have_attribute("aria-selected", "true")
    assert not errors, errors


async def test_a_keys_limits_are_edited_in_place(page: Page, site: Site) -> None:
    errors = watch_console(page)
    await new_project(page, site, "Limits project")
    await open_tab(page, "Keys")
    panel = page.locator("#tab-panel")
    await panel.get_by_label("Name of the new API key").fill("bot")
    await panel.get_by_role("button", name="Create API key").click()
    key = (await panel.locator(".secret-once").text_content() or "").strip()
    await open_tab(page, "Overview")
    await open_tab(page, "Keys")

    edit = panel.locator("details.key-edit", has_text="API key bot")
    await edit.locator("summary").click()
    await edit.get_by_label("Requests per minute").fill("-1")
    await edit.get_by_label("Labels").fill("team")
    await edit.get_by_role("button", name="Save limits").click()
    # Both errors at once, beside their fields; the form stays open on the first.
    edit = panel.locator("details.key-edit", has_text="API key bot")
    await expect(edit).to_have_attribute("open", "")
    rpm = edit.get_by_label("Requests per minute")
    await expect(rpm).to_have_attribute("aria-invalid", "true")
    await expect(rpm).to_be_focused()
    await expect(edit.locator(".field-error")).to_have_count(2)
    await expect(edit.get_by_label("Labels")).to_have_attribute("aria-invalid", "true")

    await rpm.fill("5")
    await edit.get_by_label("Allowed models").fill("gpt-4o, claude-*")
    await edit.get_by_label("Labels").fill("team=search")
    await edit.get_by_role("button", name="Save limits").click()
    row = panel.locator("tbody tr", has_text="bot")
    await expect(row).to_contain_text("5 req/min")
    await expect(row).to_contain_text("models: gpt-4o, claude-*")
    await expect(row).to_contain_text("team=search")
    # The key was not rotated.
    answer = await site.http.get("/api/projects", headers={"Authorization": f"Bearer {key}"})
    assert answer.status_code == 200
    # The refused form answered 422, as every refused form does; nothing else failed.
    assert [e for e in errors if "422" not in e] == [], errors


async def test_an_owner_adds_a_member_by_email(page: Page, site: Site) -> None:
    errors = watch_console(page)
    email = f"invitee-{uuid.uuid4().hex[:8]}@browser.test"
    registered = await site.http.post(
        "/api/auth/register", json={"email": email, "password": "invitee password 1"}
    )
    assert registered.status_code == 201, registered.text
    await new_project(page, site, "Members project")
    panel = page.locator("#tab-panel")
    members = panel.locator("section", has=page.get_by_role("heading", name=re.compile("Members")))
    email_field = panel.get_by_label("Email of the person to add")

    # Nobody has this address: said beside the field, and what was typed stays.
    await email_field.fill("nobody-here@browser.test")
    await panel.get_by_role("button", name="Add member").click()
    error = panel.locator("#member-email-error")
    await expect(error).to_contain_text("No one has an Arona account with nobody-here@browser.test")
    await expect(email_field).to_have_value("nobody-here@browser.test")
    await expect(email_field).to_have_attribute("aria-invalid", "true")

    await email_field.fill(email)
    await panel.get_by_label("Role").select_option("owner")
    await panel.get_by_role("button", name="Add member").click()
    await expect(page.locator(".toast-success")).to_contain_text(f"{email} added as owner")
    row = members.locator("tbody tr", has_text=email)
    await expect(row).to_contain_text("owner")
    await expect(members.locator(".badge").first).to_have_text("2")
    await expect(email_field).to_have_value("")

    await email_field.fill(email)
    await panel.get_by_role("button", name="Add member").click()
    await expect(error).to_contain_text(f"{email} is already a member of this project.")
    await expect(members.locator("tbody tr", has_text=email)).to_have_count(1)
    # The two refusals are 422 answers, which the browser logs; nothing else went wrong.
    assert [e for e in errors if "status of 422" not in e] == [], errors
