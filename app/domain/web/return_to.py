"""Where the login page sends a visitor back to, and which targets it accepts.

A session can expire while a form is open; the form's post then answers with the
login page. Coming back to the URL that was posted to would be a 405 (most are
POST-only), so the way back is the page the form was on: HTMX names it in
``HX-Current-URL``, a plain form post in ``Referer`` (same-origin only, under our
``Referrer-Policy``).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from litestar import Request

DEFAULT_PAGE = "/projects"
_MAX_LENGTH = 2000


def safe_next(target: str | None) -> str | None:
    """``target`` when it is a path on this site, else None.

    Only a single leading '/': ``//evil.com`` is another host, and browsers read
    ``/\\evil.com`` the same way; no scheme, host, control characters or spaces (an
    open redirect would turn the login page into a phishing aid).
    """
    if not target or len(target) > _MAX_LENGTH or not target.startswith("/"):
        return None
    if target.startswith("//") or "\\" in target:
        return None
    if any(ord(char) < 0x21 or ord(char) == 0x7F for char in target):
        return None
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return None
    return target


def _same_site_path(request: Request[Any, Any, Any], url: str | None) -> str | None:
    """The path and query of ``url`` when it is on this site's host."""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.netloc != request.headers.get("host", ""):
        return None
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    return safe_next(path)


def page_to_return_to(request: Request[Any, Any, Any]) -> str:
    """The GET page to show again after logging in (see the module's note)."""
    if request.headers.get("hx-request") == "true":
        # A fragment's own URL (a tab's rows, a form's post) is not a page.
        shown = _same_site_path(request, request.headers.get("hx-current-url"))
        return shown or DEFAULT_PAGE
    if request.method in ("GET", "HEAD"):
        query = request.url.query
        return safe_next(request.url.path + (f"?{query}" if query else "")) or DEFAULT_PAGE
    return _same_site_path(request, request.headers.get("referer")) or DEFAULT_PAGE
