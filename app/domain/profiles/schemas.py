"""Bodies of the model-profile admin API, the project model settings and the runtime
catalog (camelCase on the wire)."""

from __future__ import annotations

import datetime
import re
from typing import Annotated
from uuid import UUID

import msgspec

from app.domain.bodies import Camel, Strict, Tokens
from app.lib.errors import BadRequestError
from app.routing.types import ScoreKind

# Public, url-safe ids (``llm``, ``llm-smart``): they appear in paths and request bodies.
PROFILE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# ``$`` also matches before a trailing newline; stored ids are checked in full.
_PROFILE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_TAGS = 50
MAX_CHAIN = 20
MAX_ENABLED = 1000
MAX_SLOW_THRESHOLD_MS = 3_600_000

ProfileId = Annotated[str, msgspec.Meta(pattern=PROFILE_ID_PATTERN, max_length=64)]
# At least one visible character: stored stripped.
Text200 = Annotated[str, msgspec.Meta(min_length=1, max_length=200, pattern=r"\S")]
Tag = Annotated[str, msgspec.Meta(min_length=1, max_length=100, pattern=r"\S")]
Tags = Annotated[list[Tag], msgspec.Meta(max_length=MAX_TAGS)]
SlowThresholdMs = Annotated[int, msgspec.Meta(gt=0, le=MAX_SLOW_THRESHOLD_MS)]
Chain = Annotated[list[ProfileId], msgspec.Meta(max_length=MAX_CHAIN)]
EnabledIds = Annotated[list[ProfileId], msgspec.Meta(max_length=MAX_ENABLED)]


# ------------------------------------------------------------------ admin API


class ProfileCreate(Strict):
    id: ProfileId
    name: Text200
    base_model: Text200
    tags: Tags = []
    supports_tools: bool = False
    supports_images: bool = False
    context_window_tokens: Tokens = 8192
    max_output_tokens: Tokens = 2048
    enabled: bool = True
    fallback_profile_id: ProfileId | None = None
    slow_threshold_ms: SlowThresholdMs | None = None
    failover_chain: Chain = []
    routing_score: ScoreKind | None = None
    """``capacity`` or ``seed``; None: the platform default (``ARONA_ROUTING_SCORE``)."""


class ProfileUpdate(Strict):
    """A partial update: absent fields keep their value, ``null`` clears an optional one."""

    name: Text200 | msgspec.UnsetType = msgspec.UNSET
    base_model: Text200 | msgspec.UnsetType = msgspec.UNSET
    tags: Tags | msgspec.UnsetType = msgspec.UNSET
    supports_tools: bool | msgspec.UnsetType = msgspec.UNSET
    supports_images: bool | msgspec.UnsetType = msgspec.UNSET
    context_window_tokens: Tokens | msgspec.UnsetType = msgspec.UNSET
    max_output_tokens: Tokens | msgspec.UnsetType = msgspec.UNSET
    enabled: bool | msgspec.UnsetType = msgspec.UNSET
    fallback_profile_id: ProfileId | msgspec.UnsetType | None = msgspec.UNSET
    slow_threshold_ms: SlowThresholdMs | msgspec.UnsetType | None = msgspec.UNSET
    failover_chain: Chain | msgspec.UnsetType = msgspec.UNSET
    routing_score: ScoreKind | msgspec.UnsetType | None = msgspec.UNSET


class ProfileOut(Camel):
    id: str
    name: str
    base_model: str
    tags: list[str]
    supports_tools: bool
    supports_images: bool
    context_window_tokens: int
    max_output_tokens: int
    enabled: bool
    fallback_profile_id: str | None
    slow_threshold_ms: int | None
    failover_chain: list[str]
    routing_score: ScoreKind | None
    created_at: datetime.datetime
    updated_at: datetime.datetime


# ----------------------------------------------------------- runtime catalog


class LlmOut(Camel):
    """One entry of the runtime catalog."""

    id: str
    name: str
    enabled: bool
    supports_tools: bool
    supports_images: bool
    context_window_tokens: int
    max_output_tokens: int
    tags: list[str]


class LlmCatalog(Camel):
    """``GET /api/runtime/llms``: exactly these keys."""

    project_id: UUID
    default_llm_id: str | None
    llms: list[LlmOut]
    refreshed_at: int
    """Epoch milliseconds at which this replica built the cached entry."""


# ----------------------------------------------------- project model settings


class ProjectModelsIn(Strict):
    """``PUT /api/projects/{projectId}/models``: replaces both settings (absent = null)."""

    default_profile_id: ProfileId | None = None
    enabled_profile_ids: EnabledIds | None = None
    """``null``: every globally enabled profile, including ones created later."""


class ProjectModelsOut(Camel):
    default_profile_id: str | None
    enabled_profile_ids: list[str] | None
    catalog: LlmCatalog
    """What ``GET /api/runtime/llms`` answers for this project."""


# ------------------------------------------------------------------ checks


def check_profile_id(value: str, param: str) -> str:
    if not _PROFILE_ID.fullmatch(value):
        raise BadRequestError(
            f"`{param}` must be 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
            code="invalid_profile_id",
            param=param,
        )
    return value


def normalize_tags(tags: list[str]) -> list[str]:
    """Trimmed, de-duplicated and sorted: tags are a set (matched as a subset)."""
    return sorted({tag.strip() for tag in tags})


def unique_ids(ids: list[str], param: str) -> list[str]:
    """``ids`` checked in full; a repeated id is refused (order matters in a chain)."""
    seen: set[str] = set()
    for value in ids:
        check_profile_id(value, param)
        if value in seen:
            raise BadRequestError(
                f"`{param}` names {value!r} more than once", code="duplicate_profile", param=param
            )
        seen.add(value)
    return list(ids)
