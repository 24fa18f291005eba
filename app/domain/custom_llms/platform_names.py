"""Names the platform already uses, which a project's custom LLM may not take.

A custom LLM is called as ``custom:<name>``, but its bare name is what people see and
type (the console, the runtime catalog, ``llmId``): a name that is also a platform
backend, a model alias or a model profile id would say one thing and mean another.
Those are compared case-insensitively (custom LLM names are lower case; the others
may not be). Read from the database, the source of truth: a name taken on any
replica a moment ago is taken here too.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from app.db.models import BackendConfig, ModelAlias, ModelProfile

PLATFORM_NAMES: tuple[tuple[str, InstrumentedAttribute[str]], ...] = (
    ("a platform backend", BackendConfig.name),
    ("a model alias", ModelAlias.alias),
    ("a model profile", ModelProfile.id),
)
"""What may hold a name, and the column holding it; the first listed is named when
several do."""


async def platform_uses(session: AsyncSession, names: Collection[str]) -> dict[str, str]:
    """Which of ``names`` (lower case) the platform uses: name -> what uses it."""
    wanted = sorted(set(names))
    found: dict[str, str] = {}
    if not wanted:
        return found
    for what, column in reversed(PLATFORM_NAMES):
        lowered = func.lower(column)
        for used in await session.scalars(select(lowered).where(lowered.in_(wanted))):
            found[used] = what
    return found
