"""Seed vLLM backends from a JSON file at start-up (``config/vllm-backends.json``).

The file lists vLLM servers an operator wants registered without calling the admin
API::

    {"backends": [
        {"name": "vllm-a", "url": "http://10.0.0.11:8000", "models": ["llama-3.1-8b"],
         "tags": ["general"], "api_key": "...", "max_concurrency": 64,
         "overwrite": false}
    ]}

Every entry is registered as ``type: "vllm"`` (``"type"`` may be given, but only as
``"vllm"``) through the admin API's own schema and checks (``BackendRegistration``,
``validate_registration``), so a bad entry stops start-up with a message naming the
file, the entry's index and its name. Seeding is idempotent: a backend of that name
that already exists is kept as it is (an admin may have changed it since) unless the
entry says ``"overwrite": true``, and an overwrite that changes nothing writes nothing.

Which file: ``settings.vllm_backends_file`` (``ARONA_VLLM_BACKENDS_FILE``) when set,
and then it must exist; otherwise ``config/vllm-backends.json`` relative to the
working directory, silently skipped when absent. Seeding writes the database only;
it runs before the routing registry loads, which picks the rows up, and the names it
changed are then announced to running replicas like an admin API write. Replicas
starting at once may seed the same file together: a name inserted by two of them
at the same time ends as one row, without an error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import structlog
from advanced_alchemy.extensions.litestar import SQLAlchemyAsyncConfig

from app.domain.backends.schemas import (
    BackendRegistration,
    ValidRegistration,
    validate_registration,
)
from app.domain.backends.services import BackendConfigService, stored_as
from app.lib.errors import BadRequestError
from app.lib.settings import Settings
from app.lib.vault import Vault

DEFAULT_FILE = Path("config") / "vllm-backends.json"
SEEDED_KIND = "vllm"
MAX_ENTRIES = 1000
logger = structlog.get_logger()


class SeedingError(Exception):
    """The seed file is unusable: start-up stops; the message names the file and entry."""


@dataclass(frozen=True, slots=True)
class SeedEntry:
    registration: ValidRegistration
    overwrite: bool = False


@dataclass(slots=True)
class SeedReport:
    path: Path | None
    created: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    """Existing backends left alone (no ``overwrite``, or already equal)."""

    @property
    def changed(self) -> list[str]:
        return [*self.created, *self.replaced]


class _SeedFile(msgspec.Struct, forbid_unknown_fields=True):
    backends: list[dict[str, Any]]


def seed_file(settings: Settings) -> Path | None:
    """The file to seed from, or None when there is none (and none was asked for)."""
    path = settings.vllm_backends_file
    if path is None:
        return DEFAULT_FILE if DEFAULT_FILE.is_file() else None
    if not path.exists():
        raise SeedingError(
            f"ARONA_VLLM_BACKENDS_FILE is {str(path)!r}, which does not exist "
            f"(looked for {path.absolute()})"
        )
    if not path.is_file():
        raise SeedingError(f"ARONA_VLLM_BACKENDS_FILE is {str(path)!r}, which is not a file")
    return path


def load_seed_file(path: Path) -> list[SeedEntry]:
    """Parse and check every entry; raises ``SeedingError`` on the first problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SeedingError(f"{path}: cannot read the vLLM backends file: {exc}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SeedingError(f"{path}: not valid JSON: {exc}") from None
    try:
        parsed = msgspec.convert(document, _SeedFile)
    except msgspec.ValidationError as exc:
        raise SeedingError(
            f'{path}: expected {{"backends": [...]}} (a list of vLLM backends): {exc}'
        ) from None
    if len(parsed.backends) > MAX_ENTRIES:
        raise SeedingError(f"{path}: at most {MAX_ENTRIES} backends may be listed")
    entries: list[SeedEntry] = []
    seen: dict[str, int] = {}
    for index, raw in enumerate(parsed.backends):
        entry = parse_entry(raw, f"{path}: {_label(raw, index)}")
        name = entry.registration.name
        if name in seen:
            raise SeedingError(
                f"{path}: {_label(raw, index)}: the name is also used by backends[{seen[name]}]"
            )
        seen[name] = index
        entries.append(entry)
    return entries


def parse_entry(raw: dict[str, Any], where: str) -> SeedEntry:
    """One entry, checked like ``POST /api/admin/backends`` with ``type: "vllm"``."""
    fields = dict(raw)
    overwrite = fields.pop("overwrite", False)
    if not isinstance(overwrite, bool):
        raise SeedingError(f"{where}: overwrite must be true or false")
    kind = fields.pop("type", SEEDED_KIND)
    if not isinstance(kind, str) or kind.strip().lower() != SEEDED_KIND:
        shown = f", got {kind!r}" if isinstance(kind, str) and len(kind) <= 32 else ""
        raise SeedingError(
            f'{where}: type must be "vllm" (this file registers vLLM servers only){shown}'
        )
    try:
        data = msgspec.convert({**fields, "type": SEEDED_KIND}, BackendRegistration)
        registration = validate_registration(data)
    except msgspec.ValidationError as exc:
        # msgspec names the field (``$.url``) and never quotes the value (a key).
        raise SeedingError(f"{where}: {exc}") from None
    except BadRequestError as exc:
        field_name = f" (field {exc.param})" if exc.param else ""
        raise SeedingError(f"{where}: {exc.message}{field_name}") from None
    return SeedEntry(registration=registration, overwrite=overwrite)


def _label(raw: Any, index: int) -> str:
    name = raw.get("name") if isinstance(raw, dict) else None
    if isinstance(name, str) and 0 < len(name) <= 100:
        return f"backends[{index}] ({name!r})"
    return f"backends[{index}]"


async def seed_vllm_backends(
    settings: Settings, db_config: SQLAlchemyAsyncConfig, vault: Vault
) -> SeedReport:
    """Register the file's backends in the database (start-up, before routing loads)."""
    path = seed_file(settings)
    report = SeedReport(path)
    if path is None:
        return report
    for entry in load_seed_file(path):
        await _seed_one(entry, db_config, vault, report)
    logger.info(
        "vLLM backends seeded",
        file=str(path),
        created=report.created,
        replaced=report.replaced,
        kept=report.kept,
    )
    return report


async def _seed_one(
    entry: SeedEntry, db_config: SQLAlchemyAsyncConfig, vault: Vault, report: SeedReport
) -> None:
    registration = entry.registration
    name = registration.name
    async with BackendConfigService.new(config=db_config) as service:
        if not entry.overwrite:
            created = await service.create_if_absent(registration, vault)
            (report.kept if created is None else report.created).append(name)
            return
        row = await service.get_by_name(name)
        if row is not None and stored_as(row, registration, vault):
            report.kept.append(name)
            return
        await service.register(registration, vault)
        (report.created if row is None else report.replaced).append(name)
