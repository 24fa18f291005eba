"""Project custom LLMs for the routing side, served from memory.

API for the gateway and the runtime chat (``custom:<name>``)
============================================================

One directory per process: ``resources.custom_llms.directory`` (the DI name of the
bundle is ``custom_llms``; see ``app.domain.custom_llms.setup``)::

    from app.domain.custom_llms.directory import CustomTarget, parse_llm_id

    name = parse_llm_id(model)          # "custom:bob" -> "bob"; else None
    target = await directory.target(project_id, name)   # CustomTarget | None
    if target is None or not target.enabled:
        ...                              # 404 model_not_found (a disabled one too)
    backend = OpenAICompatibleBackend(target.backend_spec(), resources.custom_llms.http)

- ``async target(project_id: UUID, name: str) -> CustomTarget | None``: everything a
  call needs: ``base_url``, ``model`` (the upstream's model name), ``auth_scheme``,
  ``api_key`` (decrypted; None for ``none``), ``max_input_tokens``,
  ``max_output_tokens``, ``enabled``, ``provider``, and ``backend_spec()`` /
  ``auth_headers()`` built from them. None when the project has no such custom LLM
  (another project's included). Disabled ones are returned with ``enabled=False``.
  Raises ``AronaError``\\s when the key cannot be had: ``secret_not_found`` (404),
  ``secret_unreadable`` (500), ``custom_llm_key_unreadable`` (500).
- ``async listing(project_id: UUID) -> list[CustomListing]``: the enabled ones, by
  name (``llm_id``, ``name``, ``provider``, ``model``, token limits,
  ``context_window_tokens``), for catalogs and ``/v1/models``.
- Call the upstream through ``resources.custom_llms.http`` (the SSRF-guarded pool,
  ``app.lib.http.GuardedUpstreamHttp``), never the platform pool: the guard is at
  connection time, so a base URL whose DNS now points inside is refused on every
  call. Single target, no failover; retry only on network errors (DESIGN.md step 2).

Cost: the first call for a project reads all its custom LLMs in one query; the first
call of each one opens its key (a secret: one primary-key query; a stored key: a
decryption). After that, no database query until an invalidation. Concurrent misses
share one read. At most ``max_projects`` projects are kept (the oldest is dropped).

Invalidation (``CustomLlmSync``): a write drops the project here and in the catalog,
locally at once and on other replicas over ``custom_llms.changed``; a
``secrets.changed`` event (rotation, deletion) drops the project's cached entry, so
its next call reveals the new value, on every replica. A read that started before
an invalidation is never cached.

Database down: the safety nets (resubscription, the periodic reload) only mark
entries stale (``mark_all_stale``); a stale project whose re-read fails is served as
it is, opened keys included, and read again after ``STALE_RETRY_SECONDS``. A project
dropped by a change or never read raises the loader's error (a 503
``database_unavailable`` in the app), as does a key not opened yet.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from uuid import UUID

from app.domain.custom_llms.names import LLM_ID_PREFIX
from app.domain.custom_llms.stored import StoredLlm
from app.domain.custom_llms.templates import context_window_tokens
from app.domain.project_cache import ProjectCache
from app.domain.records import copied
from app.lib.keyed_cache import KeyedCache
from app.lib.replicated_cache import ReplicatedCache
from app.routing.backends.openai import auth_headers
from app.routing.types import BackendSpec

DEFAULT_MAX_PROJECTS = 10_000

ProjectLoader = Callable[[UUID], Awaitable[Sequence[StoredLlm]]]
SecretReveal = Callable[[UUID, UUID], Awaitable[str]]
"""``(project_id, secret_id) -> plaintext`` (``SecretResolver.reveal``)."""
KeyOpener = Callable[[StoredLlm], str]
"""A stored key's plaintext (``stored.open_key`` with the vault)."""


def parse_llm_id(model: str) -> str | None:
    """The custom LLM name in a model id (``custom:bob`` -> ``bob``), or None."""
    if model.startswith(LLM_ID_PREFIX):
        return model[len(LLM_ID_PREFIX) :] or None
    return None


@dataclass(frozen=True, slots=True)
class CustomTarget(StoredLlm):
    """One custom LLM, ready to call: the stored one with its key opened. Its
    ``api_key`` is plaintext: never log it."""

    api_key: str | None = field(repr=False)

    @property
    def context_window_tokens(self) -> int:
        return context_window_tokens(self.max_input_tokens, self.max_output_tokens)

    def auth_headers(self) -> dict[str, str]:
        """The header carrying the key, as the OpenAI-compatible adapter sends it."""
        return auth_headers(self.auth_scheme, self.api_key)

    def backend_spec(self) -> BackendSpec:
        """For ``OpenAICompatibleBackend(spec, resources.custom_llms.http)``; the
        backend name is the model id, ``custom:<name>``."""
        return BackendSpec(
            name=self.llm_id,
            kind="external",
            url=self.base_url,
            api_key=self.api_key,
            models=(self.model,),
            auth_scheme=self.auth_scheme,
        )


@dataclass(frozen=True, slots=True)
class CustomListing:
    """An enabled custom LLM as catalogs show it (no key, no URL)."""

    llm_id: str
    name: str
    provider: str
    model: str
    max_input_tokens: int
    max_output_tokens: int

    @property
    def context_window_tokens(self) -> int:
        return context_window_tokens(self.max_input_tokens, self.max_output_tokens)


class _Project:
    """One project's cached custom LLMs; replaced, never edited, on invalidation
    (except ``targets``, filled as keys are opened)."""

    __slots__ = ("listing", "rows", "targets")

    def __init__(
        self,
        rows: Sequence[StoredLlm],
        open_target: Callable[[StoredLlm], Awaitable[CustomTarget]],
    ) -> None:
        self.rows = by_name = {row.name: row for row in rows}
        self.listing = [
            copied(CustomListing, row) for row in sorted(rows, key=lambda r: r.name) if row.enabled
        ]
        # Each key is opened on its first call, once for concurrent calls; a failure is
        # not kept. An entry dropped meanwhile (a rotation) is no longer read: caching
        # into it is harmless, and the next call opens the key again from the new entry.
        # (The loader holds the rows, not ``self``: no reference cycle per project.)
        self.targets: KeyedCache[str, CustomTarget] = KeyedCache(
            lambda name: open_target(by_name[name])
        )


class CustomLlmDirectory(ProjectCache[_Project]):
    """A project's entry is dropped when its custom LLMs, or a secret they use,
    change."""

    def __init__(
        self,
        loader: ProjectLoader,
        *,
        reveal: SecretReveal,
        open_key: KeyOpener,
        max_projects: int = DEFAULT_MAX_PROJECTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reveal = reveal
        self._open_key = open_key

        async def read(project_id: UUID) -> _Project:
            return _Project(await loader(project_id), self._target)

        self._entries: ReplicatedCache[UUID, _Project] = ReplicatedCache(
            read, "custom LLMs", max_entries=max_projects, clock=clock
        )

    # ------------------------------------------------------------------ reading

    async def target(self, project_id: UUID, name: str) -> CustomTarget | None:
        entry = await self._entries.get(project_id)
        if name not in entry.rows:
            return None
        return await entry.targets.get(name)

    async def listing(self, project_id: UUID) -> list[CustomListing]:
        return list((await self._entries.get(project_id)).listing)

    async def open(self, llm: StoredLlm) -> CustomTarget:
        """A target for a row just read from the database, key opened, not cached
        (the test endpoint: fresh even before this replica hears of a change)."""
        return await self._target(llm)

    # ---------------------------------------------------------------- internals

    async def _target(self, row: StoredLlm) -> CustomTarget:
        key: str | None = None
        if row.auth_scheme != "none":
            if row.secret_id is not None:
                key = await self._reveal(row.project_id, row.secret_id)
            elif row.api_key_encrypted is not None:
                key = self._open_key(row)
        return copied(CustomTarget, row, api_key=key)
