"""The runtime catalog and the profile resolver, served from memory.

``ProfileCatalog`` is a per-process resource (``resources.profile_catalog``, the
``profile_catalog`` dependency). For each project it caches one ``CatalogEntry``: the
project's settings (read from the database once, on the first request) and the
catalog built from them and the ``ProfileTable``. A hit costs no database query:

- a change of the table (``ProfileTable.version``) rebuilds the entry from the cached
  settings, without the database;
- a change of a project's settings drops its entry (``invalidate_project``), locally
  at once and on the other replicas through ``ProfileSync``; deleting a profile or a
  (re)subscription drops every entry (``invalidate_all``).

What the runtime chat calls::

    profile = await profile_catalog.resolve(project_id, requested)   # -> Profile
    allowed = await profile_catalog.is_enabled_for(project_id, profile_id)

Extension point: the catalog is built in ``ProfileCatalog._build`` from the profile
table and the entries of an extra source (``attach_source``), read with the settings
on a miss and appended after the profiles. Project custom LLMs (``custom:<name>``,
``app.domain.custom_llms``) are that source; their changes call
``invalidate_project`` (locally and from their own sync events) like settings do.
Extra entries are shown only: ``resolve``, ``is_enabled_for`` and the default pick
profiles alone (a ``custom:<name>`` call is served from the custom LLM directory).

Database down: the safety nets (``ProfileSync.load_all``, the custom LLM sync's
reload) only mark entries stale (``mark_all_stale``); a stale entry whose re-read
fails is served as it is and read again after ``STALE_RETRY_SECONDS``. A project
dropped by a change or never read raises the loader's error (a 503
``database_unavailable`` in the app).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from uuid import UUID

from app.domain.profiles.schemas import LlmCatalog, LlmOut
from app.domain.project_cache import ProjectCache
from app.domain.records import copied
from app.lib.errors import BadRequestError, NotFoundError
from app.lib.replicated_cache import ReplicatedCache
from app.routing.profiles import Profile, ProfileTable

# Entries kept at most; past that the oldest is dropped (and re-read when next asked).
DEFAULT_MAX_PROJECTS = 10_000
REQUESTED_PARAM = "modelProfileId"


@dataclass(frozen=True, slots=True)
class ProjectModels:
    """A project's stored choice. The defaults (no settings row) mean: every globally
    enabled profile, the first of them by id as default."""

    default_profile_id: str | None = None
    enabled_profile_ids: frozenset[str] | None = None
    """``None``: every globally enabled profile, including ones created later."""

    def allows(self, profile: Profile) -> bool:
        return profile.enabled and (
            self.enabled_profile_ids is None or profile.id in self.enabled_profile_ids
        )


SettingsLoader = Callable[[UUID], Awaitable[ProjectModels]]
ExtraSource = Callable[[UUID], Awaitable[Sequence[LlmOut]]]
"""More catalog entries of a project, shown after its profiles (its custom LLMs)."""


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    settings: ProjectModels
    table_version: int
    catalog: LlmCatalog
    enabled_ids: frozenset[str]
    extra: tuple[LlmOut, ...] = ()
    """The extra source's entries, kept to rebuild without reading them again."""


class ProfileCatalog(ProjectCache[CatalogEntry]):
    """Every project's settings are dropped at once (``invalidate_all``) when a
    profile is deleted or an extra source attached."""

    def __init__(
        self,
        table: ProfileTable,
        loader: SettingsLoader,
        *,
        max_projects: int = DEFAULT_MAX_PROJECTS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._table = table
        self._loader = loader
        self._clock = clock
        """Stamps ``refreshedAt`` (staleness runs on the monotonic clock)."""
        self._entries: ReplicatedCache[UUID, CatalogEntry] = ReplicatedCache(
            self._read, "project model settings", max_entries=max_projects
        )
        self._extra: ExtraSource | None = None

    def attach_source(self, source: ExtraSource) -> None:
        """Append ``source``'s entries to every project's catalog from now on."""
        self._extra = source
        self.invalidate_all()

    # ------------------------------------------------------------------ reading

    async def catalog(self, project_id: UUID) -> LlmCatalog:
        """What ``GET /api/runtime/llms`` answers for the project."""
        return (await self._entry(project_id)).catalog

    def names_of(self, llm_id: str) -> tuple[str, ...]:
        """The names a catalog entry answers to for a key's allowed models: its id,
        and a profile's base model (a custom LLM's id alone)."""
        profile = self._table.get(llm_id)
        return (llm_id,) if profile is None else (llm_id, profile.base_model)

    async def resolve(self, project_id: UUID, requested: str | None) -> Profile:
        """The profile a runtime request of ``project_id`` will use.

        ``requested`` is the request's ``modelProfileId``; ``None`` means the project's
        default. Raises ``NotFoundError`` ``profile_not_found`` (404) for an unknown id,
        ``BadRequestError`` ``profile_disabled`` (400) for one disabled on the platform
        or for the project, ``BadRequestError`` ``no_default_profile`` (400) when
        nothing was requested and the project has no enabled profile. No database
        query once the project's settings are cached.
        """
        entry = await self._entry(project_id)
        if requested is None:
            chosen = entry.catalog.default_llm_id
            if chosen is None:
                raise BadRequestError(
                    "no model profile is enabled for this project, so there is no default",
                    code="no_default_profile",
                    param=REQUESTED_PARAM,
                )
            requested = chosen
        profile = self._table.get(requested)
        if profile is None:
            raise NotFoundError(
                f"no model profile {requested!r} exists",
                code="profile_not_found",
                param=REQUESTED_PARAM,
            )
        if requested not in entry.enabled_ids:
            where = "on the platform" if not profile.enabled else "for this project"
            raise BadRequestError(
                f"model profile {requested!r} is disabled {where}",
                code="profile_disabled",
                param=REQUESTED_PARAM,
            )
        return profile

    async def is_enabled_for(self, project_id: UUID, profile_id: str) -> bool:
        """Whether ``profile_id`` exists and is enabled globally and for the project."""
        return profile_id in (await self._entry(project_id)).enabled_ids

    # ---------------------------------------------------------------- internals

    async def _entry(self, project_id: UUID) -> CatalogEntry:
        entry = await self._entries.get(project_id)
        if entry.table_version != self._table.version:
            # Profiles changed since: rebuild from the cached settings (no database).
            fresh = self._build(project_id, entry.settings, entry.extra)
            self._entries.replace(project_id, entry, fresh)
            entry = fresh
        return entry

    async def _read(self, project_id: UUID) -> CatalogEntry:
        settings = await self._loader(project_id)
        extra = tuple(await self._extra(project_id)) if self._extra is not None else ()
        return self._build(project_id, settings, extra)

    def _build(
        self, project_id: UUID, settings: ProjectModels, extra: tuple[LlmOut, ...] = ()
    ) -> CatalogEntry:
        """The project's catalog: every profile by id, ``enabled`` where both the
        platform and the project allow it, then the ``extra`` entries (custom LLMs)."""
        version = self._table.version
        llms: list[LlmOut] = []
        enabled: list[str] = []
        for profile in self._table:
            allowed = settings.allows(profile)
            if allowed:
                enabled.append(profile.id)
            llms.append(copied(LlmOut, profile, enabled=allowed, tags=sorted(profile.tags)))
        llms.extend(extra)
        enabled_ids = frozenset(enabled)
        default = settings.default_profile_id
        if default not in enabled_ids:
            default = enabled[0] if enabled else None
        catalog = LlmCatalog(
            project_id=project_id,
            default_llm_id=default,
            llms=llms,
            refreshed_at=int(self._clock() * 1000),
        )
        return CatalogEntry(
            settings=settings,
            table_version=version,
            catalog=catalog,
            enabled_ids=enabled_ids,
            extra=extra,
        )
