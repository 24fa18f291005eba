"""Screenshots of the console and the dashboard for docs/console.md.

Run ``make demo`` in one terminal, then ``make screenshots`` (or
``python scripts/console_screenshots.py``) in another: the script reads the demo admin's
password from the demo data dir, logs in with Debian's Chromium (headless), and saves
PNGs under docs/img/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
from pathlib import Path

from playwright.async_api import Page, async_playwright

PAGES = (
    ("projects", "/projects", None),
    ("project-custom-llms", None, "custom-llms"),
    ("project-quota", None, "quota"),
    ("dashboard", "/admin", None),
    ("dashboard-backends", "/admin/backends", None),
    ("dashboard-failover", "/admin/failover", None),
)


async def _log_in(page: Page, url: str, email: str, password: str) -> None:
    await page.goto(f"{url}/login")
    await page.get_by_label("Email").fill(email)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Log in").click()
    await page.wait_for_url(re.compile(r".*/projects$"))


async def capture(url: str, email: str, password: str, out: Path, chromium: str) -> list[Path]:
    saved: list[Path] = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox"]
        )
        page = await browser.new_page(viewport={"width": 1280, "height": 860})
        await _log_in(page, url, email, password)
        project_link = page.get_by_role("link", name="Demo project")
        project_url = url + (await project_link.get_attribute("href") or "")
        for name, path, tab in PAGES:
            target = f"{project_url}?tab={tab}" if tab else f"{url}{path}"
            await page.goto(target)
            await page.wait_for_load_state("networkidle")
            await page.wait_for_timeout(800)  # let HTMX fragments and SSE swaps land
            file = out / f"{name}.png"
            await page.screenshot(path=str(file), full_page=True)
            saved.append(file)
        await browser.close()
    return saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8420")
    parser.add_argument("--data-dir", default=".arona", type=Path)
    parser.add_argument("--email", default="admin@demo.arona.local")
    parser.add_argument("--out", default=Path("docs/img"), type=Path)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    password = json.loads((args.data_dir / "demo.json").read_text())["admin_password"]
    args.out.mkdir(parents=True, exist_ok=True)
    for file in asyncio.run(capture(args.url, args.email, password, args.out, args.chromium)):
        print(file)


if __name__ == "__main__":
    main()
