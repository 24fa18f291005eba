"""The layer rules of shared/DESIGN.md, read off the source: each package imports only
the layers below it, the lower floors import no web framework, and the surfaces that
serve calls (gateway, runtime, video, rpc, console) never import one another; what two
of them share lives in ``app/domain/calls`` or a service."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app"

MAY_IMPORT: dict[str, set[str]] = {
    "lib": set(),
    "db": {"lib"},
    "routing": {"lib"},
    "domain": {"lib", "db", "routing"},
    "server": {"lib", "db", "routing", "domain"},
    "cli": {"lib", "db", "routing", "domain", "server", "agent", "fakes"},
    "agent": {"lib"},
    "fakes": {"lib"},
    "__main__": {"cli"},
}
"""Which of ``app``'s packages each may import (besides itself)."""

FRAMEWORKS = {"litestar", "advanced_alchemy", "sqlalchemy", "jinja2", "uvicorn", "asyncpg"}
NO_FRAMEWORK = {"lib", "routing", "agent"}
"""Floors that stay plain Python: no web framework, ORM or database driver."""

SURFACES = {"gateway", "runtime", "rpc", "console"}
"""Areas that only serve a protocol; ``video`` also serves ``/v1/video/generations``
but owns the job service that rpc and the console use, so it is checked as an importer
and may be imported."""


def imports_of(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def modules() -> list[Path]:
    return sorted(APP.rglob("*.py"))


def package_of(path: Path) -> str:
    parts = path.relative_to(APP).parts
    package = parts[0] if len(parts) > 1 else path.stem
    return "__main__" if package in ("__init__", "__main__") else package


def layer_violations() -> list[str]:
    """One entry per module and package it should not import; a module outside every
    layer counts once, as misplaced."""
    found = set()
    for path in modules():
        layer = package_of(path)
        relative = path.relative_to(APP.parent)
        if layer not in MAY_IMPORT:
            found.add(f"{relative} is outside every layer")
            continue
        for name in imports_of(path):
            target = name.split(".")[1] if name.startswith("app.") else None
            if target and target != layer and target not in MAY_IMPORT[layer]:
                found.add(f"{relative} imports app.{target}")
            elif layer in NO_FRAMEWORK and name.split(".")[0] in FRAMEWORKS:
                found.add(f"{relative} imports {name.split('.')[0]}")
    return sorted(found)


def surface_violations() -> list[str]:
    found = set()
    for path in modules():
        parts = path.relative_to(APP).parts
        if parts[0] != "domain" or len(parts) < 3 or parts[1] not in SURFACES | {"video"}:
            continue
        for name in imports_of(path):
            pieces = [*name.split("."), ""][:3]
            if pieces[:2] == ["app", "domain"] and pieces[2] in SURFACES - {parts[1]}:
                found.add(f"{path.relative_to(APP.parent)} imports app.domain.{pieces[2]}")
    return sorted(found)


def test_each_package_imports_only_the_layers_below_it() -> None:
    assert layer_violations() == []


def test_surfaces_never_import_each_other() -> None:
    assert surface_violations() == []
