"""Model name matching: ``name`` matches ``name:latest``; an explicit tag only itself."""

from __future__ import annotations

LATEST = ":latest"


def canonical(name: str) -> str:
    """The key under which a model name is indexed: ``x:latest`` and ``x`` are one model."""
    return name[: -len(LATEST)] if name.endswith(LATEST) else name
