"""How custom LLMs are named: the ``custom:<name>`` model id, free-name suggestions
for a conflict, and the errors that carry them."""

from __future__ import annotations

import re
from collections.abc import Collection

from app.domain.custom_llms.schemas import MAX_NAME_LENGTH, NAME_PATTERN
from app.lib.errors import ConflictError, NotFoundError

_NAME = re.compile(NAME_PATTERN)
SUGGESTIONS = 3
LLM_ID_PREFIX = "custom:"


def llm_id(name: str) -> str:
    """The model id a custom LLM is called by: ``custom:<name>``."""
    return LLM_ID_PREFIX + name


def custom_llm_not_found() -> NotFoundError:
    return NotFoundError("custom LLM not found", code="custom_llm_not_found")


def suggest_names(
    base: str, slug: str, taken: Collection[str], count: int = SUGGESTIONS
) -> list[str]:
    """Free alternatives to ``base``: ``base-2`` (the lowest free number),
    ``base-<project slug>``, ``base-personal``, then further numbers; each a valid
    name, none in ``taken``."""
    found: list[str] = []

    def fit(suffix: str) -> str:
        stem = base[: MAX_NAME_LENGTH - len(suffix)].rstrip("._-")
        return stem + suffix

    def offer(candidate: str) -> bool:
        if candidate in taken or candidate in found or not _NAME.match(candidate):
            return False
        found.append(candidate)
        return True

    n = 2
    while not offer(fit(f"-{n}")):
        n += 1
    for word in (slug, "personal"):
        k = 1
        while not offer(fit(f"-{word}" if k == 1 else f"-{word}-{k}")) and k < 20:
            k += 1
    while len(found) < count:
        n += 1
        offer(fit(f"-{n}"))
    return found[:count]


def name_taken(name: str, suggestions: list[str], used_by: str | None = None) -> ConflictError:
    """The 409 of a name in use: by a custom LLM of the project, or (``used_by``, such
    as "a model profile") by the platform. The same code either way, with free names."""
    listed = ", ".join(suggestions)
    situation = (
        f"this project already has a custom LLM named {name!r}"
        if used_by is None
        else f"{name!r} is already the name of {used_by}"
    )
    return ConflictError(
        f"{situation}; free names: {listed}",
        code="custom_llm_exists",
        param="name",
        extra={"suggestions": suggestions},
    )
