"""The login page's ``next``: a path on this site or nothing."""

from __future__ import annotations

import pytest

from app.domain.web.return_to import safe_next


@pytest.mark.parametrize(
    "target",
    ["/projects", "/projects/1/tabs/keys?limit=5", "/admin/prices#list", "/"],
)
def test_paths_on_this_site_are_kept(target: str) -> None:
    assert safe_next(target) == target


@pytest.mark.parametrize(
    "target",
    [
        None,
        "",
        "projects",
        "//evil.example",
        "///evil.example",
        "/\\evil.example",
        "https://evil.example/",
        "javascript:alert(1)",
        "/\t/evil.example",
        "/\n/evil.example",
        "/ spaced",
        "/" + "a" * 2001,
    ],
)
def test_anything_else_is_refused(target: str | None) -> None:
    assert safe_next(target) is None
